//! A real server on a real socket (127.0.0.1:0) over a real SQLite file, and a client for it.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use reqwest::{Method, StatusCode};
use serde_json::Value;
use sessiondb::{Db, Options, SqliteStore};
use sessiondb_server::{App, Metrics, ServerConfig};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub struct Server {
    pub base: String,
    pub client: reqwest::Client,
    pub app: Arc<App<SqliteStore>>,
    /// Sent as `Authorization: Bearer …` when set.
    pub key: Option<String>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<std::io::Result<()>>>,
    /// The store's data directory.
    pub dir: tempfile::TempDir,
}

pub async fn start() -> Server {
    start_with(ServerConfig::default()).await
}

pub async fn start_with(config: ServerConfig) -> Server {
    start_with_options(config, Options::default()).await
}

/// A server whose store runs with `options` (e.g. another summarizer).
pub async fn start_with_options(config: ServerConfig, options: Options) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path()).unwrap();
    let stats = store.write_stats();
    let metrics = Metrics::with_backend(Box::new(move |out: &mut String| {
        out.push_str(&format!(
            "sessiondb_commits_total {}\n",
            stats.commits.load(std::sync::atomic::Ordering::Relaxed)
        ));
    }));
    let app = App::new(Db::with_options(store, options), config, metrics);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(sessiondb_server::serve(listener, app.clone(), async move {
        let _ = stopped.await;
    }));
    Server {
        base,
        client: reqwest::Client::new(),
        app,
        key: None,
        stop: Some(stop),
        task: Some(task),
        dir,
    }
}

/// A JSON answer: status, headers and the body (parsed when it is JSON, else a string).
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: reqwest::header::HeaderMap,
    pub text: String,
    pub json: Value,
}

impl Answer {
    /// The error code of a JSON error answer.
    pub fn code(&self) -> &str {
        self.json["error"]["code"].as_str().unwrap_or("<none>")
    }

    pub fn lines(&self) -> Vec<Value> {
        self.text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    pub fn ids(&self) -> Vec<String> {
        let items = match &self.json {
            Value::Array(items) => items.clone(),
            Value::Object(o) if o.contains_key("items") => o["items"].as_array().unwrap().clone(),
            _ => self.lines(),
        };
        items
            .iter()
            .map(|m| m["id"].as_str().unwrap().to_owned())
            .collect()
    }
}

impl Server {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        let builder = self.client.request(method, self.url(path));
        match &self.key {
            Some(key) => builder.bearer_auth(key),
            None => builder,
        }
    }

    pub async fn send(&self, builder: reqwest::RequestBuilder) -> Answer {
        let response = builder.send().await.unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let text = response.text().await.unwrap();
        let json = serde_json::from_str(&text).unwrap_or(Value::String(text.clone()));
        Answer {
            status,
            headers,
            text,
            json,
        }
    }

    pub async fn call(&self, method: Method, path: &str, body: Option<Value>) -> Answer {
        let mut builder = self.request(method, path);
        if let Some(body) = body {
            builder = builder.json(&body);
        }
        self.send(builder).await
    }

    pub async fn get(&self, path: &str) -> Answer {
        self.call(Method::GET, path, None).await
    }

    pub async fn post(&self, path: &str, body: Value) -> Answer {
        self.call(Method::POST, path, Some(body)).await
    }

    pub async fn put(&self, path: &str, body: Value) -> Answer {
        self.call(Method::PUT, path, Some(body)).await
    }

    pub async fn patch(&self, path: &str, body: Value) -> Answer {
        self.call(Method::PATCH, path, Some(body)).await
    }

    pub async fn delete(&self, path: &str) -> Answer {
        self.call(Method::DELETE, path, None).await
    }

    /// Appends a text message `id` to session `sid` (under the active leaf).
    pub async fn say(&self, sid: &str, id: &str, text: &str) -> Answer {
        let answer = self
            .post(
                &format!("/v1/sessions/{sid}/messages"),
                serde_json::json!({"id": id, "role": "user", "parts": [{"type": "text", "text": text}]}),
            )
            .await;
        assert!(answer.status.is_success(), "{answer:?}");
        answer
    }

    /// Stops accepting, drains, and waits for the server task to end.
    pub async fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            tokio::time::timeout(Duration::from_secs(10), task)
                .await
                .expect("graceful shutdown finishes")
                .unwrap()
                .unwrap();
        }
    }
}

/// One server-sent event.
#[derive(Debug, Clone, PartialEq)]
pub struct Sse {
    pub event: String,
    pub id: Option<String>,
    pub data: Value,
}

/// Reads server-sent events from a streaming response.
pub struct SseReader {
    // reqwest and axum share the `bytes` crate's type.
    body: futures::stream::BoxStream<'static, reqwest::Result<axum::body::Bytes>>,
    buffer: String,
}

impl SseReader {
    pub async fn open(server: &Server, path: &str, last_event_id: Option<&str>) -> Self {
        let mut builder = server.request(Method::GET, path);
        if let Some(id) = last_event_id {
            builder = builder.header("last-event-id", id);
        }
        let response = builder.send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            response.headers()["content-type"].to_str().unwrap(),
            "text/event-stream"
        );
        Self {
            body: response.bytes_stream().boxed(),
            buffer: String::new(),
        }
    }

    /// The next event (comments and keep-alives skipped); `None` when the stream ended.
    pub async fn next(&mut self) -> Option<Sse> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let (mut event, mut id, mut data) = (String::from("message"), None, String::new());
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("event:") {
                        event = v.trim().to_owned();
                    } else if let Some(v) = line.strip_prefix("id:") {
                        id = Some(v.trim().to_owned());
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.trim_start());
                    }
                }
                if data.is_empty() {
                    continue;
                }
                return Some(Sse {
                    event,
                    id,
                    data: serde_json::from_str(&data).unwrap(),
                });
            }
            let chunk = tokio::time::timeout(Duration::from_secs(10), self.body.next())
                .await
                .expect("an event within 10 s")?;
            self.buffer
                .push_str(std::str::from_utf8(&chunk.ok()?).unwrap());
        }
    }

    pub async fn take(&mut self, n: usize) -> Vec<Sse> {
        let mut events = Vec::new();
        for _ in 0..n {
            events.push(self.next().await.expect("stream ended early"));
        }
        events
    }
}

/// An HTTP/2 client connection (hyper's): each request is a stream of its own, and clones of
/// the connection send concurrently.
#[derive(Clone)]
pub struct Http2 {
    sender: hyper::client::conn::http2::SendRequest<String>,
    closed: Arc<tokio::sync::Mutex<Option<JoinHandle<hyper::Result<()>>>>>,
}

impl Http2 {
    /// HTTP/2 over `io`, a connection whose first bytes are to be the client's preface (clear
    /// text with prior knowledge, or TLS that chose `h2`).
    pub async fn over<I>(io: I) -> Self
    where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (sender, connection) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(io),
        )
        .await
        .unwrap();
        Self {
            sender,
            closed: Arc::new(tokio::sync::Mutex::new(Some(tokio::spawn(connection)))),
        }
    }

    /// Clear-text HTTP/2 to `server`, with prior knowledge.
    pub async fn connect(server: &Server) -> Self {
        let address = server.base.trim_start_matches("http://");
        Self::over(tokio::net::TcpStream::connect(address).await.unwrap()).await
    }

    /// Sends a request and returns its answer's head, the body still streaming.
    pub async fn open(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> hyper::Response<hyper::body::Incoming> {
        let mut request = hyper::Request::builder()
            .method(method)
            .uri(format!("http://localhost{path}"));
        if body.is_some() {
            request = request.header("content-type", "application/json");
        }
        let request = request
            .body(body.map(|b| b.to_string()).unwrap_or_default())
            .unwrap();
        let mut sender = self.sender.clone();
        sender.ready().await.unwrap();
        sender.send_request(request).await.unwrap()
    }

    /// Sends a request and reads its whole answer.
    pub async fn call(&self, method: Method, path: &str, body: Option<Value>) -> Answer {
        let response = self.open(method, path, body).await;
        assert_eq!(response.version(), hyper::Version::HTTP_2);
        let (head, mut body) = response.into_parts();
        let mut bytes = Vec::new();
        while let Some(chunk) = next_data(&mut body).await {
            bytes.extend_from_slice(&chunk);
        }
        let text = String::from_utf8(bytes).unwrap();
        Answer {
            status: head.status,
            headers: head.headers,
            json: serde_json::from_str(&text).unwrap_or(Value::Null),
            text,
        }
    }

    /// Whether the server closed the connection within `within`.
    pub async fn closed_within(&self, within: Duration) -> bool {
        let mut closed = self.closed.lock().await;
        let Some(task) = closed.as_mut() else {
            return true;
        };
        if tokio::time::timeout(within, task).await.is_err() {
            return false;
        }
        *closed = None;
        true
    }
}

/// The next data of a streaming body; `None` at its end (trailers and errors end it too).
pub async fn next_data(body: &mut hyper::body::Incoming) -> Option<axum::body::Bytes> {
    use hyper::body::Body as _;
    loop {
        let frame = std::future::poll_fn(|cx| std::pin::Pin::new(&mut *body).poll_frame(cx))
            .await?
            .ok()?;
        if let Ok(data) = frame.into_data() {
            return Some(data);
        }
    }
}
