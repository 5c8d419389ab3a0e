//! The HTTP API of sessiondb (the contract is the project's API document; `/openapi.json`
//! describes it).
//!
//! [`serve`] runs the API on a listener until a shutdown future resolves, then stops accepting,
//! ends change-feed streams and lets in-flight requests finish. Writes are durable before they
//! are acknowledged, so nothing acknowledged is lost by stopping.
//!
//! # Layout
//! - [`App`]: the store, configuration, metrics and shutdown signal every handler shares.
//! - `routes/*`: one module per resource; `compat` holds the reference example's routes.
//! - [`extract`]: extractors whose rejections are JSON errors; [`wire`]: JSON forms.
//! - [`error::ApiError`]: every error answer.
//! - `connections`: an accepted connection (TLS, HTTP/1.1 or HTTP/2, when it is closed);
//!   [`cors`]: the web pages of other origins that may call the API.
//!
//! Store calls run on the runtime's worker threads (the embedded backend's reads are short and
//! synchronous); binaries should give the runtime more workers than cores.
#![forbid(unsafe_code)]

mod connections;
pub mod cors;
pub mod error;
pub mod extract;
pub mod metrics;
mod routes;
mod tls;
pub mod wire;

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::header::CONNECTION;
use axum::http::{HeaderValue, Version};
use axum::middleware::{self, Next};
use axum::response::Response;
use http_body::Body as _;
use hyper_util::server::graceful::GracefulShutdown;
use sessiondb::{Db, Options, Session, Store};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::Instrument;

use connections::Connections;
pub use error::ApiError;
pub use metrics::{BackendMetrics, Metrics};
pub use tls::Tls;

/// Request limits; exceeding one is a 4xx answer and stores nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Largest request body (413 `payload_too_large`).
    pub max_body_bytes: usize,
    /// Largest single message (compact JSON), state value or compaction summary (413
    /// `payload_too_large`).
    pub max_message_bytes: usize,
    /// Most messages a session holds (409 `quota_exceeded`).
    pub max_messages_per_session: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_body_bytes: 64 * 1024 * 1024,
            max_message_bytes: 50_000_000,
            max_messages_per_session: 10_000,
        }
    }
}

#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Bearer key → namespace. Empty: anonymous requests act in namespace `""`.
    pub api_keys: HashMap<String, String>,
    pub limits: Limits,
    /// How long a connection may take to send a request's head, counted from when it opens or
    /// its last answer ends; then it is closed. So a kept connection idle that long goes (on
    /// HTTP/2: one with no request open), and so does a client too slow to send a request
    /// (which would otherwise hold its connection for ever); a TLS handshake or HTTP/2 preface
    /// has the same time. A request whose head arrived in time is never cut: bodies, long
    /// answers and the change feed's streams take as long as they take.
    pub request_head_timeout: Duration,
    /// How long a request's body may send nothing (after its head, or between its bytes); then
    /// the request is answered 408 `request_timeout` and its connection closed. A body that
    /// keeps coming, however slowly, is never cut.
    pub request_body_timeout: Duration,
    /// The origins (`https://app.example.com`, as a browser sends them; [`cors::ANY_ORIGIN`]
    /// for every one) whose web pages may call the API: their preflights are answered and
    /// every answer to them carries `Access-Control-Allow-Origin`. Empty: none, and no answer
    /// carries a CORS header.
    pub cors_origins: Vec<String>,
}

impl ServerConfig {
    pub const DEFAULT_REQUEST_HEAD_TIMEOUT: Duration = Duration::from_secs(60);
    pub const DEFAULT_REQUEST_BODY_TIMEOUT: Duration = Duration::from_secs(60);
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            api_keys: HashMap::new(),
            limits: Limits::default(),
            request_head_timeout: Self::DEFAULT_REQUEST_HEAD_TIMEOUT,
            request_body_timeout: Self::DEFAULT_REQUEST_BODY_TIMEOUT,
            cors_origins: Vec::new(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    #[error(
        "refusing to listen on {addr} without API keys: anonymous access is only allowed on a \
         loopback address (configure keys, or pass the insecure flag to allow it)"
    )]
    AnonymousOnPublicAddress { addr: SocketAddr },
    #[error("the TLS certificate or key is not usable: {reason}")]
    Tls { reason: String },
}

/// Anonymous access (no keys) is only allowed on loopback unless `insecure` is set.
pub fn check_bind(
    addr: SocketAddr,
    config: &ServerConfig,
    insecure: bool,
) -> Result<(), ServerError> {
    if config.api_keys.is_empty() && !addr.ip().is_loopback() && !insecure {
        return Err(ServerError::AnonymousOnPublicAddress { addr });
    }
    Ok(())
}

/// The settings a running server can be given again (on SIGHUP): what rotates or grows while
/// it serves. The rest of [`ServerConfig`] shapes what requests are using and holds as the
/// server started.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reloadable {
    /// As [`ServerConfig::api_keys`].
    pub api_keys: HashMap<String, String>,
    /// As [`ServerConfig::cors_origins`].
    pub cors_origins: Vec<String>,
}

impl From<&ServerConfig> for Reloadable {
    fn from(config: &ServerConfig) -> Self {
        Self {
            api_keys: config.api_keys.clone(),
            cors_origins: config.cors_origins.clone(),
        }
    }
}

/// What every handler shares.
#[derive(Debug)]
pub struct App<S> {
    pub db: Db<S>,
    /// As the server started: [`App::in_force`] has the keys and CORS origins in force.
    pub config: ServerConfig,
    pub metrics: Metrics,
    /// Replaced whole by [`App::put_in_force`], so a request sees one reload or the next.
    in_force: RwLock<Arc<Reloadable>>,
    shutdown: watch::Sender<bool>,
}

impl<S: Store> App<S> {
    /// The server's state; the message limits are applied to `db`'s options.
    pub fn new(db: Db<S>, config: ServerConfig, metrics: Metrics) -> Arc<Self> {
        let options = Options {
            max_messages_per_session: Some(config.limits.max_messages_per_session),
            max_message_bytes: Some(config.limits.max_message_bytes as u64),
            ..db.options().clone()
        };
        Arc::new(Self {
            db: db.reconfigured(options),
            in_force: RwLock::new(Arc::new(Reloadable::from(&config))),
            config,
            metrics,
            shutdown: watch::channel(false).0,
        })
    }

    /// The API keys (bearer key → namespace; none: anonymous requests in `""`) and CORS
    /// origins in force.
    pub fn in_force(&self) -> Arc<Reloadable> {
        self.in_force
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Puts `settings` in force for every request from now on (requests already authenticated
    /// finish in their namespace), as a key rotation does. Whether the keys may serve the
    /// address at all ([`check_bind`]) is the caller's to check first.
    pub fn put_in_force(&self, settings: Reloadable) {
        *self.in_force.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(settings);
    }

    pub(crate) fn session(&self, namespace: &str, id: &str) -> Result<Session<S>, ApiError> {
        Ok(self.db.session_in(namespace, id)?)
    }

    /// A session whose reads follow `?attachments=`: `inline` (the default) puts media back,
    /// `pointer` leaves `attachment:sha256:<hex>` pointers for `GET /v1/attachments/{hash}`.
    pub(crate) fn reading(
        &self,
        namespace: &str,
        id: &str,
        attachments: Option<&str>,
    ) -> Result<Session<S>, ApiError> {
        let session = self.session(namespace, id)?;
        match attachments {
            None | Some("inline") => Ok(session),
            Some("pointer") => Ok(session.with_attachment_pointers()),
            Some(other) => Err(ApiError::invalid(format!(
                "`attachments` must be `inline` or `pointer`, not `{other}`"
            ))),
        }
    }

    pub(crate) fn shutting_down(&self) -> watch::Receiver<bool> {
        self.shutdown.subscribe()
    }

    pub(crate) fn is_shutting_down(&self) -> bool {
        *self.shutdown.borrow()
    }

    /// Ends change-feed streams and makes `/readyz` fail; [`serve`] calls it on shutdown.
    pub fn begin_shutdown(&self) {
        self.shutdown.send_replace(true);
    }
}

/// Every route, with request ids, logging, metrics, CORS and the body limit.
pub fn router<S: Store>(app: Arc<App<S>>) -> Router {
    routes::routes::<S>()
        .layer(middleware::from_fn_with_state(
            app.clone(),
            extract::refuse_declared_too_large::<S>,
        ))
        .layer(middleware::from_fn_with_state(app.clone(), cors::cors::<S>))
        .layer(middleware::from_fn_with_state(app.clone(), observe::<S>))
        .layer(DefaultBodyLimit::max(app.config.limits.max_body_bytes))
        .with_state(app)
}

/// Serves HTTP/1.1 and, to clients that send its preface first, HTTP/2 until `shutdown`
/// resolves, then drains: stops accepting, ends change-feed streams and waits for in-flight
/// requests. A connection that sends no request within [`ServerConfig::request_head_timeout`]
/// is closed.
pub async fn serve<S: Store>(
    listener: TcpListener,
    app: Arc<App<S>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_over(listener, None, app, shutdown).await
}

/// [`serve`] over TLS: each connection completes its handshake with the certificate `tls` holds
/// when it is accepted, within the request-head timeout, before its first request; a client
/// that asks for `h2` by ALPN gets HTTP/2.
pub async fn serve_tls<S: Store>(
    listener: TcpListener,
    tls: Tls,
    app: Arc<App<S>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_over(listener, Some(tls), app, shutdown).await
}

async fn serve_over<S: Store>(
    listener: TcpListener,
    tls: Option<Tls>,
    app: Arc<App<S>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let serving = Connections::new(router(app.clone()), app.config.request_head_timeout);
    let draining = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            stream = accept(&listener) => stream,
            () = &mut shutdown => break,
        };
        // Without TCP_NODELAY, a streamed answer's last small write waits for the client to
        // acknowledge the one before, which a kept connection's delayed ACK holds for ~40 ms.
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!("TCP_NODELAY on an accepted connection: {error}");
        }
        // Taken before the task starts, so a shutdown that begins meanwhile reaches it.
        let watcher = draining.watcher();
        let stopping = app.shutting_down();
        let (app, serving) = (app.clone(), serving.clone());
        let tls = tls.as_ref().map(Tls::current);
        tokio::spawn(async move {
            let _open = app.metrics.connection_opened();
            serving.serve(stream, tls, watcher, stopping).await;
        });
    }
    drop(listener);
    tracing::info!("shutting down: finishing in-flight requests");
    app.begin_shutdown();
    draining.shutdown().await;
    Ok(())
}

/// The next connection. Errors of one connection (reset before it was accepted) are passed
/// over; others, such as running out of file descriptors, are logged and retried a second
/// later rather than spun on.
async fn accept(listener: &TcpListener) -> tokio::net::TcpStream {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => return stream,
            Err(error) => {
                use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
                if !matches!(
                    error.kind(),
                    ConnectionAborted | ConnectionRefused | ConnectionReset
                ) {
                    tracing::error!("accepting a connection: {error}");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }
}

const REQUEST_ID: &str = "x-request-id";
/// Names the conversation a request is about (an alternative to the path); echoed back.
pub const CONVERSATION_ID: &str = "sessiondb-conversation-id";

/// Gives each request an id (the client's `x-request-id`, or a new one), logs it with its route,
/// status and latency, and counts it in the metrics. A `sessiondb-conversation-id` header is
/// echoed in the response.
async fn observe<S: Store>(State(app): State<Arc<App<S>>>, req: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = req.method().as_str().to_owned();
    let version = req.version();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", |m| m.as_str())
        .to_owned();
    let request_id = req
        .headers()
        .get(REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 128)
        .map_or_else(|| uuid::Uuid::now_v7().simple().to_string(), str::to_owned);
    let conversation = req.headers().get(CONVERSATION_ID).cloned();
    // An empty body (a GET's) cannot stall, and has nothing to read.
    let body_read = (!req.body().is_end_stream()).then(|| Arc::new(AtomicBool::new(false)));
    let req = match &body_read {
        None => req,
        Some(read) => {
            let (limit, read) = (app.config.request_body_timeout, read.clone());
            req.map(|body| Body::new(extract::StallLimited::new(body, limit, read)))
        }
    };
    let span = tracing::info_span!("request", id = %request_id, method = %method, route = %route);
    let mut response = next.run(req).instrument(span.clone()).await;
    // Answered before its body was read (over the size limit, unauthorized, an unknown route),
    // an HTTP/1 connection still holds the rest of the body, so hyper closes it after the
    // answer: saying so keeps a client from sending its next request on it.
    if version < Version::HTTP_2 && body_read.is_some_and(|read| !read.load(Ordering::Relaxed)) {
        response
            .headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
    }
    if let Some(value) = conversation {
        response.headers_mut().insert(CONVERSATION_ID, value);
    }
    if let Ok(value) = HeaderValue::from_str(&request_id) {
        response.headers_mut().insert(REQUEST_ID, value);
    }
    let status = response.status().as_u16();
    let elapsed = started.elapsed();
    app.metrics.record_request(&method, &route, status, elapsed);
    span.in_scope(|| {
        tracing::info!(
            status,
            micros = elapsed.as_micros() as u64,
            ?version,
            "answered"
        );
    });
    response
}
