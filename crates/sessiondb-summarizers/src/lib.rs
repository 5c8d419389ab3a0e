//! Model-backed [`Summarizer`]s for sessiondb's compaction.
//!
//! - [`OpenAiSummarizer`]: any OpenAI-compatible chat-completions endpoint (`{base}/chat/completions`,
//!   bearer key), e.g. `https://api.openai.com/v1` or a local model server.
//! - [`AnthropicSummarizer`]: the Anthropic Messages API (`{base}/v1/messages`, `x-api-key`).
//!
//! Each attempt has a timeout; timeouts, transport errors, HTTP 429 and 5xx are retried with
//! exponential backoff, other answers are final. Every failure is a [`SummarizeError`], which
//! compaction reports without writing anything: a model error never loses a message.
//! The futures need a tokio runtime.
#![forbid(unsafe_code)]

use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::{Value, json};
use sessiondb::{SummarizeError, Summarizer, SummaryRequest};

/// Where a model is and how patiently to ask it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelConfig {
    /// `https://api.openai.com/v1` style for OpenAI-compatible servers, `https://api.anthropic.com`
    /// for Anthropic.
    pub base_url: String,
    pub model: String,
    pub api_key: Option<String>,
    /// Per attempt.
    pub timeout: Duration,
    /// Attempts after the first, for retryable failures.
    pub max_retries: u32,
    /// Wait before the first retry; doubled for each further one.
    pub backoff: Duration,
}

impl ModelConfig {
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        Self {
            base_url: base_url.into(),
            model: model.into(),
            api_key: None,
            timeout: Duration::from_secs(60),
            max_retries: 2,
            backoff: Duration::from_millis(500),
        }
    }

    fn endpoint(&self, path: &str) -> String {
        format!("{}/{path}", self.base_url.trim_end_matches('/'))
    }
}

/// Output tokens a summary may use: twice the requested length, so a model that overshoots
/// the target is not cut off mid-sentence.
fn max_output_tokens(request: &SummaryRequest) -> u64 {
    (request.budget_tokens * 2).clamp(256, 16_384)
}

/// Why one attempt failed, and whether another may succeed.
struct Failure {
    error: SummarizeError,
    retryable: bool,
}

/// A model endpoint: its configuration and an HTTP client with its per-attempt timeout.
#[derive(Debug, Clone)]
struct ModelClient {
    config: ModelConfig,
    client: reqwest::Client,
}

impl ModelClient {
    fn new(config: ModelConfig) -> Self {
        let client = reqwest::Client::builder()
            .timeout(config.timeout)
            .build()
            .expect("an HTTP client without custom TLS settings always builds");
        Self { config, client }
    }

    /// A JSON POST to `path` under the base URL.
    fn post(&self, path: &str, body: &Value) -> reqwest::RequestBuilder {
        self.client.post(self.config.endpoint(path)).json(body)
    }
}

/// Sends `request`, retrying what may pass on a second try, and hands the JSON answer to
/// `read`.
async fn ask(
    config: &ModelConfig,
    request: reqwest::RequestBuilder,
    read: fn(&Value) -> Option<String>,
) -> Result<String, SummarizeError> {
    let mut attempt = 0;
    loop {
        let builder = request
            .try_clone()
            .expect("a JSON request body can be cloned");
        match attempt_once(config, builder, read).await {
            Ok(text) => return Ok(text),
            Err(failure) if failure.retryable && attempt < config.max_retries => {
                let wait = config.backoff * 2u32.pow(attempt);
                tracing::warn!(error = %failure.error, attempt, "summarizer attempt failed; retrying");
                tokio::time::sleep(wait).await;
                attempt += 1;
            }
            Err(failure) => return Err(failure.error),
        }
    }
}

async fn attempt_once(
    config: &ModelConfig,
    request: reqwest::RequestBuilder,
    read: fn(&Value) -> Option<String>,
) -> Result<String, Failure> {
    let transport = |e: reqwest::Error| {
        if e.is_timeout() {
            Failure {
                error: SummarizeError::Timeout {
                    seconds: config.timeout.as_secs(),
                },
                retryable: true,
            }
        } else {
            Failure {
                error: SummarizeError::Transport(e.to_string()),
                retryable: true,
            }
        }
    };
    let response = request.send().await.map_err(transport)?;
    let status = response.status();
    let body = response.text().await.map_err(transport)?;
    if !status.is_success() {
        return Err(Failure {
            retryable: status.as_u16() == 429 || status.is_server_error(),
            error: SummarizeError::Status {
                status: status.as_u16(),
                body: body.chars().take(500).collect(),
            },
        });
    }
    let value: Value = serde_json::from_str(&body).map_err(|e| Failure {
        error: SummarizeError::Malformed(format!("not JSON ({e})")),
        retryable: false,
    })?;
    read(&value).ok_or_else(|| Failure {
        error: SummarizeError::Malformed("no text in the answer".to_owned()),
        retryable: false,
    })
}

/// Summaries from an OpenAI-compatible chat-completions endpoint.
#[derive(Debug, Clone)]
pub struct OpenAiSummarizer(ModelClient);

impl OpenAiSummarizer {
    pub fn new(config: ModelConfig) -> Self {
        Self(ModelClient::new(config))
    }
}

/// `choices[0].message.content`.
fn openai_text(answer: &Value) -> Option<String> {
    answer
        .pointer("/choices/0/message/content")
        .and_then(Value::as_str)
        .map(str::to_owned)
}

impl Summarizer for OpenAiSummarizer {
    fn summarize<'a>(
        &'a self,
        request: &'a SummaryRequest,
    ) -> BoxFuture<'a, Result<String, SummarizeError>> {
        Box::pin(async move {
            let model = &self.0;
            let body = json!({
                "model": model.config.model,
                "messages": [{"role": "user", "content": request.prompt}],
                "max_tokens": max_output_tokens(request),
            });
            let mut builder = model.post("chat/completions", &body);
            if let Some(key) = &model.config.api_key {
                builder = builder.bearer_auth(key);
            }
            ask(&model.config, builder, openai_text).await
        })
    }
}

/// Summaries from the Anthropic Messages API.
#[derive(Debug, Clone)]
pub struct AnthropicSummarizer(ModelClient);

impl AnthropicSummarizer {
    pub fn new(config: ModelConfig) -> Self {
        Self(ModelClient::new(config))
    }
}

/// The `text` blocks of `content`, joined.
fn anthropic_text(answer: &Value) -> Option<String> {
    let blocks = answer.get("content")?.as_array()?;
    let texts: Vec<&str> = blocks
        .iter()
        .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
        .filter_map(|b| b.get("text").and_then(Value::as_str))
        .collect();
    (!texts.is_empty()).then(|| texts.join("\n"))
}

impl Summarizer for AnthropicSummarizer {
    fn summarize<'a>(
        &'a self,
        request: &'a SummaryRequest,
    ) -> BoxFuture<'a, Result<String, SummarizeError>> {
        Box::pin(async move {
            let model = &self.0;
            let body = json!({
                "model": model.config.model,
                "max_tokens": max_output_tokens(request),
                "messages": [{"role": "user", "content": request.prompt}],
            });
            let mut builder = model
                .post("v1/messages", &body)
                .header("anthropic-version", "2023-06-01");
            if let Some(key) = &model.config.api_key {
                builder = builder.header("x-api-key", key);
            }
            ask(&model.config, builder, anthropic_text).await
        })
    }
}
