//! The model summarizers against mock OpenAI-compatible and Anthropic servers on loopback
//! (started by each test): success, HTTP 500, a timeout, garbage answers and a retried failure.
//! In every failure the session stays exactly as it was.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};
use sessiondb::{
    AppendOptions, Change, Db, Error, FeedFilter, FeedItem, HistoryOptions, Message, Options,
    SessionPatch, SqliteStore, SummarizeError, Summarizer,
};
use sessiondb_summarizers::{AnthropicSummarizer, ModelConfig, OpenAiSummarizer};

/// What the mock answers.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Behaviour {
    Answer,
    ServerError,
    Slow,
    Garbage,
    NoText,
    /// 500 on the first request, then answers.
    FailOnce,
}

#[derive(Debug)]
struct Mock {
    behaviour: Behaviour,
    requests: AtomicUsize,
    last_body: std::sync::Mutex<Option<(HeaderMap, Value)>>,
}

async fn answer(State(mock): State<Arc<Mock>>, headers: HeaderMap, body: String) -> Response {
    let n = mock.requests.fetch_add(1, Ordering::SeqCst);
    let parsed: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    *mock.last_body.lock().unwrap() = Some((headers, parsed));
    let ok = || {
        let body = json!({"choices": [{"message": {"role": "assistant", "content": "## Topic\nA model summary."}}]});
        (
            StatusCode::OK,
            [("content-type", "application/json")],
            body.to_string(),
        )
            .into_response()
    };
    match mock.behaviour {
        Behaviour::Answer => ok(),
        Behaviour::ServerError => (StatusCode::INTERNAL_SERVER_ERROR, "boom").into_response(),
        Behaviour::Slow => {
            tokio::time::sleep(Duration::from_secs(5)).await;
            ok()
        }
        Behaviour::Garbage => (StatusCode::OK, "<html>not json</html>").into_response(),
        Behaviour::NoText => (StatusCode::OK, json!({"choices": []}).to_string()).into_response(),
        Behaviour::FailOnce if n == 0 => {
            (StatusCode::INTERNAL_SERVER_ERROR, "warming up").into_response()
        }
        Behaviour::FailOnce => ok(),
    }
}

async fn anthropic_answer(
    State(mock): State<Arc<Mock>>,
    headers: HeaderMap,
    body: String,
) -> Response {
    mock.requests.fetch_add(1, Ordering::SeqCst);
    let parsed: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    *mock.last_body.lock().unwrap() = Some((headers, parsed));
    match mock.behaviour {
        Behaviour::Answer => (
            StatusCode::OK,
            json!({"content": [{"type": "text", "text": "## Topic\nAn Anthropic summary."}]})
                .to_string(),
        )
            .into_response(),
        _ => (StatusCode::OK, "{\"content\": 3}").into_response(),
    }
}

/// A mock model server; returns its base URL and its state.
async fn start_mock(behaviour: Behaviour) -> (String, Arc<Mock>) {
    let state = Arc::new(Mock {
        behaviour,
        requests: AtomicUsize::new(0),
        last_body: std::sync::Mutex::new(None),
    });
    let app = Router::new()
        .route("/v1/chat/completions", post(answer))
        .route("/v1/messages", post(anthropic_answer))
        .with_state(state.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (base, state)
}

fn config(base: &str) -> ModelConfig {
    ModelConfig {
        api_key: Some("sk-test".into()),
        timeout: Duration::from_millis(300),
        max_retries: 2,
        backoff: Duration::from_millis(10),
        ..ModelConfig::new(format!("{base}/v1"), "summary-model")
    }
}

/// A store whose sessions compact with `summarizer`, and a session of 12 short turns.
async fn session_with(
    summarizer: Arc<dyn Summarizer>,
) -> (
    tempfile::TempDir,
    Db<SqliteStore>,
    sessiondb::Session<SqliteStore>,
) {
    let dir = tempfile::tempdir().unwrap();
    let mut options = Options {
        summarizer: Some(summarizer),
        ..Options::default()
    };
    options.compaction.keep_recent_tokens = 1;
    let db = Db::with_options(SqliteStore::open(dir.path()).unwrap(), options);
    let session = db.session("chat").unwrap();
    for i in 0..12 {
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        session
            .append(
                Message::text(role, format!("turn {i} about invoices")).with_id(format!("m{i}")),
                AppendOptions::default(),
            )
            .await
            .unwrap();
    }
    (dir, db, session)
}

async fn history_ids(session: &sessiondb::Session<SqliteStore>) -> Vec<String> {
    session
        .full_history(HistoryOptions::default())
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.id.to_string())
        .collect()
}

async fn assert_intact(session: &sessiondb::Session<SqliteStore>) {
    let expected: Vec<String> = (0..12).map(|i| format!("m{i}")).collect();
    assert_eq!(history_ids(session).await, expected);
    assert!(session.compactions().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_summary_becomes_the_overlay() {
    let (base, mock) = start_mock(Behaviour::Answer).await;
    let (_dir, _db, session) = session_with(Arc::new(OpenAiSummarizer::new(config(&base)))).await;
    let compaction = session.compact(None).await.unwrap().unwrap();
    assert_eq!(compaction.summary, "## Topic\nA model summary.");
    assert_eq!(
        (
            compaction.from_message_id.as_str(),
            compaction.to_message_id.as_str()
        ),
        ("m3", "m9")
    );
    let ids = history_ids(&session).await;
    assert_eq!(ids.len(), 3 + 1 + 2, "{ids:?}");
    assert!(ids[3].starts_with("compaction_"));
    assert_eq!(mock.requests.load(Ordering::SeqCst), 1);
    let (headers, body) = mock.last_body.lock().unwrap().clone().unwrap();
    assert_eq!(headers["authorization"], "Bearer sk-test");
    assert_eq!(body["model"], "summary-model");
    let prompt = body["messages"][0]["content"].as_str().unwrap();
    assert!(prompt.contains("CONVERSATION TO SUMMARIZE:"));
    assert!(prompt.contains("turn 3 about invoices") && !prompt.contains("turn 11 about"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_error_is_retried_then_reported_and_nothing_changes() {
    let (base, mock) = start_mock(Behaviour::ServerError).await;
    let (_dir, _db, session) = session_with(Arc::new(OpenAiSummarizer::new(config(&base)))).await;
    let err = session.compact(None).await.unwrap_err();
    assert!(
        matches!(
            &err,
            Error::Summarize(SummarizeError::Status { status: 500, .. })
        ),
        "{err}"
    );
    assert_eq!(
        mock.requests.load(Ordering::SeqCst),
        3,
        "the first try and two retries"
    );
    assert_intact(&session).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_is_reported_and_nothing_changes() {
    let (base, _mock) = start_mock(Behaviour::Slow).await;
    let (_dir, _db, session) = session_with(Arc::new(OpenAiSummarizer::new(config(&base)))).await;
    let err = session.compact(None).await.unwrap_err();
    assert!(
        matches!(err, Error::Summarize(SummarizeError::Timeout { .. })),
        "{err}"
    );
    assert_intact(&session).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_answers_are_reported_without_retries_and_nothing_changes() {
    for behaviour in [Behaviour::Garbage, Behaviour::NoText] {
        let (base, mock) = start_mock(behaviour).await;
        let (_dir, _db, session) =
            session_with(Arc::new(OpenAiSummarizer::new(config(&base)))).await;
        let err = session.compact(None).await.unwrap_err();
        assert!(
            matches!(err, Error::Summarize(SummarizeError::Malformed(_))),
            "{err}"
        );
        assert_eq!(mock.requests.load(Ordering::SeqCst), 1);
        assert_intact(&session).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_passing_failure_is_retried() {
    let (base, mock) = start_mock(Behaviour::FailOnce).await;
    let (_dir, _db, session) = session_with(Arc::new(OpenAiSummarizer::new(config(&base)))).await;
    assert!(session.compact(None).await.unwrap().is_some());
    assert_eq!(mock.requests.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_auto_compaction_never_fails_the_append() {
    let (base, _mock) = start_mock(Behaviour::ServerError).await;
    let (_dir, db, session) = session_with(Arc::new(OpenAiSummarizer::new(config(&base)))).await;
    let mut settings = serde_json::Map::new();
    settings.insert("compactAfter".into(), json!(10));
    session
        .patch(SessionPatch {
            settings: Some(settings),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut feed = db.subscribe(FeedFilter::All);
    let appended = session
        .append(
            Message::text("user", "one more").with_id("m12"),
            AppendOptions::default(),
        )
        .await
        .unwrap();
    assert!(appended.inserted);
    assert_eq!(db.compaction_failures(), 1);
    assert_eq!(session.stats().await.unwrap().message_count, 13);
    assert!(session.compactions().await.unwrap().is_empty());
    let events: Vec<FeedItem> = std::iter::from_fn(|| feed.try_next()).collect();
    let error = events.iter().find_map(|item| match item {
        FeedItem::Event(e) => match &e.change {
            Change::Error { message } => Some(message.clone()),
            _ => None,
        },
        _ => None,
    });
    assert!(error.unwrap().contains("HTTP 500"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_anthropic_client_speaks_the_messages_api() {
    let (base, mock) = start_mock(Behaviour::Answer).await;
    let anthropic = ModelConfig {
        base_url: base.clone(),
        ..config(&base)
    };
    let (_dir, _db, session) =
        session_with(Arc::new(AnthropicSummarizer::new(anthropic.clone()))).await;
    let compaction = session.compact(None).await.unwrap().unwrap();
    assert_eq!(compaction.summary, "## Topic\nAn Anthropic summary.");
    let (headers, body) = mock.last_body.lock().unwrap().clone().unwrap();
    assert_eq!(headers["x-api-key"], "sk-test");
    assert_eq!(headers["anthropic-version"], "2023-06-01");
    assert!(body["max_tokens"].as_u64().unwrap() >= 256);

    let (base, _mock) = start_mock(Behaviour::Garbage).await;
    let broken = ModelConfig {
        base_url: base.clone(),
        ..config(&base)
    };
    let (_dir, _db, session) = session_with(Arc::new(AnthropicSummarizer::new(broken))).await;
    assert!(matches!(
        session.compact(None).await,
        Err(Error::Summarize(SummarizeError::Malformed(_)))
    ));
    assert_intact(&session).await;
}
