//! A sessiondb server the command works against (`--url`, with `--api-key`): requests carry the
//! bearer key, path segments and query values are percent-encoded, and an answer that is not a
//! success becomes an error that names the request and quotes the server's `{"error"}` body.

use std::path::Path;

use anyhow::{Context, bail};
use reqwest::{Method, RequestBuilder, Response, StatusCode};
use serde_json::Value;

pub struct Remote {
    client: reqwest::Client,
    base: String,
    api_key: Option<String>,
}

impl Remote {
    /// `ca_cert` names PEM certificates trusted beside the system's for an https URL.
    pub fn new(url: &str, api_key: Option<&str>, ca_cert: Option<&Path>) -> anyhow::Result<Self> {
        let mut client = reqwest::Client::builder();
        if let Some(path) = ca_cert {
            let pem = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
            let certificates = reqwest::Certificate::from_pem_bundle(&pem)
                .ok()
                .filter(|certificates| !certificates.is_empty())
                .with_context(|| format!("{} holds no PEM certificate", path.display()))?;
            client = client.tls_certs_merge(certificates);
        }
        Ok(Self {
            client: client.build().context("setting up the HTTP client")?,
            base: url.trim_end_matches('/').to_owned(),
            api_key: api_key.map(str::to_owned),
        })
    }

    /// `path` (which starts with `/`) on the server.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// `/v1/sessions/{session}` followed by `rest`, on the server.
    pub fn session_url(&self, session: &str, rest: &str) -> String {
        self.url(&format!("/v1/sessions/{}{rest}", segment(session)))
    }

    pub fn request(&self, method: Method, url: &str) -> RequestBuilder {
        let builder = self.client.request(method, url);
        match &self.api_key {
            Some(key) => builder.bearer_auth(key),
            None => builder,
        }
    }

    /// Sends `builder`; an answer other than a success is an error.
    pub async fn send(&self, builder: RequestBuilder) -> anyhow::Result<Response> {
        let (what, response) = self.exchange(builder).await?;
        checked(what, response).await
    }

    /// As [`Remote::send`], but a 404 answer (what it names does not exist) is `None`.
    pub async fn send_if_found(&self, builder: RequestBuilder) -> anyhow::Result<Option<Response>> {
        let (what, response) = self.exchange(builder).await?;
        if response.status() == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        checked(what, response).await.map(Some)
    }

    /// The answer to `builder`, with the request's method and URL for errors.
    async fn exchange(&self, builder: RequestBuilder) -> anyhow::Result<(String, Response)> {
        let request = builder.build()?;
        let what = format!("{} {}", request.method(), request.url());
        let response = self
            .client
            .execute(request)
            .await
            .with_context(|| what.clone())?;
        Ok((what, response))
    }

    /// GETs `url` and parses the JSON answer.
    pub async fn get_json(&self, url: &str) -> anyhow::Result<Value> {
        let response = self.send(self.request(Method::GET, url)).await?;
        Ok(response.json().await?)
    }

    /// One page of a cursor listing: `url` (with its query) continued `after` a cursor, as its
    /// `items` and its `nextCursor`.
    pub async fn page(
        &self,
        url: &str,
        after: Option<&str>,
    ) -> anyhow::Result<(Vec<Value>, Option<String>)> {
        let url = match after {
            Some(cursor) => format!("{url}&after={}", segment(cursor)),
            None => url.to_owned(),
        };
        let mut page = self.get_json(&url).await?;
        let items = match page["items"].take() {
            Value::Array(items) => items,
            other => bail!("GET {url}: `items` is not a list: {other}"),
        };
        Ok((items, page["nextCursor"].as_str().map(str::to_owned)))
    }
}

/// `response` when it is a success, else an error naming the request (`what`) that quotes the
/// server's `{"error": {"code", "message"}}`.
async fn checked(what: String, response: Response) -> anyhow::Result<Response> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let body = response.text().await.unwrap_or_default();
    let reason = serde_json::from_str::<Value>(&body)
        .ok()
        .and_then(|error| {
            let error = error.get("error")?;
            Some(format!(
                "{} ({})",
                error.get("message")?.as_str()?,
                error.get("code")?.as_str()?
            ))
        })
        .unwrap_or(body);
    Err(Refused {
        what,
        status,
        reason,
    }
    .into())
}

/// An answer other than a success.
#[derive(Debug)]
pub struct Refused {
    /// The request's method and URL.
    what: String,
    pub status: StatusCode,
    /// The server's message and code, or its body when that is not a JSON error.
    reason: String,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Refused {
            what,
            status,
            reason,
        } = self;
        write!(f, "{what}: the server answered {status}: {reason}")
    }
}

impl std::error::Error for Refused {}

/// Percent-encodes one URL path segment (or query value).
pub fn segment(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
