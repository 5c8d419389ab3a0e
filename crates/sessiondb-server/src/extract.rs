//! Request extractors whose every rejection is an [`ApiError`]: the tenant from the bearer key,
//! JSON and NDJSON bodies, path parameters and query strings.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request, State};
use axum::http::header::{AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, EXPECT};
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde::de::DeserializeOwned;
use serde_json::Value;
use sessiondb::Store;

use crate::App;
use crate::error::ApiError;

/// The namespace a request acts in: the one its bearer key maps to, or `""` when the server
/// runs without keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant(pub String);

impl<S: Store> FromRequestParts<Arc<App<S>>> for Tenant {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        app: &Arc<App<S>>,
    ) -> Result<Self, Self::Rejection> {
        let in_force = app.in_force();
        let keys = &in_force.api_keys;
        if keys.is_empty() {
            return Ok(Tenant(String::new()));
        }
        let header = parts.headers.get(AUTHORIZATION).ok_or_else(|| {
            ApiError::unauthorized("an `Authorization: Bearer <key>` header is required")
        })?;
        // The scheme is case-insensitive (RFC 9110 §11.1).
        let key = header
            .to_str()
            .ok()
            .and_then(|h| h.trim().split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, key)| key.trim())
            .ok_or_else(|| {
                ApiError::unauthorized("the Authorization header must be `Bearer <key>`")
            })?;
        keys.get(key)
            .map(|namespace| Tenant(namespace.clone()))
            .ok_or_else(|| ApiError::unauthorized("unknown API key"))
    }
}

/// The conversation a `sessiondb-conversation-id` header names, validated like a path id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConversationHeader(pub Option<String>);

impl<S: Send + Sync> FromRequestParts<S> for ConversationHeader {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let Some(value) = parts.headers.get(crate::CONVERSATION_ID) else {
            return Ok(ConversationHeader(None));
        };
        // UTF-8, so the header reaches every session a percent-encoded path segment does.
        let id = std::str::from_utf8(value.as_bytes()).map_err(|_| {
            ApiError::invalid(format!("`{}` must be UTF-8", crate::CONVERSATION_ID))
        })?;
        // Checked as the session id it stands for (1..=256 characters), named as the header.
        sessiondb::SessionKey::new("", id).map_err(|mut e| {
            e.field = crate::CONVERSATION_ID.to_owned();
            e
        })?;
        Ok(ConversationHeader(Some(id.to_owned())))
    }
}

fn body_too_large() -> ApiError {
    ApiError::too_large("the request body exceeds the configured limit")
}

/// How long a refused body that is still coming is read and dropped (see
/// [`refuse_declared_too_large`]).
const DRAIN_REFUSED_BODY: Duration = Duration::from_secs(5);

/// Refuses a request whose declared length is over the body limit before any of its body is
/// read: a client that asked first (`Expect: 100-continue`) never sends it. From one that did
/// not ask, what it sends is read and dropped for a while (the connection closes after the
/// answer all the same): closed at once, with the body unread, the connection would reset, and
/// a client still sending would meet the reset before it read the answer.
pub(crate) async fn refuse_declared_too_large<S: Store>(
    State(app): State<Arc<App<S>>>,
    req: Request,
    next: Next,
) -> Response {
    let declared = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|length| length.to_str().ok()?.parse::<u64>().ok());
    match declared {
        Some(length) if length > app.config.limits.max_body_bytes as u64 => {
            // Reading a body that waits for `100 Continue` would ask for it.
            let asked = req
                .headers()
                .get(EXPECT)
                .is_some_and(|expect| expect.as_bytes().eq_ignore_ascii_case(b"100-continue"));
            if !asked {
                let mut body = req.into_body().into_data_stream();
                tokio::spawn(tokio::time::timeout(DRAIN_REFUSED_BODY, async move {
                    while let Some(Ok(_)) = body.next().await {}
                }));
            }
            body_too_large().into_response()
        }
        _ => next.run(req).await,
    }
}

/// Reads the body, mapping an exceeded size limit to 413, a stalled body to 408 and anything
/// else to 400.
async fn body_bytes<S: Send + Sync>(req: Request, state: &S) -> Result<Bytes, ApiError> {
    Bytes::from_request(req, state).await.map_err(|rejection| {
        if rejection.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
            body_too_large()
        } else if let Some(stalled) = stalled(&rejection) {
            ApiError::request_timeout(stalled.to_string())
        } else {
            ApiError::invalid(format!("could not read the request body: {rejection}"))
        }
    })
}

fn stalled<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a BodyStalled> {
    let mut next = Some(error);
    while let Some(error) = next {
        if let Some(stalled) = error.downcast_ref::<BodyStalled>() {
            return Some(stalled);
        }
        next = error.source();
    }
    None
}

/// What a request body fails with when its next bytes do not arrive within the body timeout.
#[derive(Debug, thiserror::Error)]
#[error("no part of the request body arrived for {0:?}; the request is dropped")]
struct BodyStalled(Duration);

/// A request body that fails with [`BodyStalled`] once it has waited `limit` for its next
/// bytes. A body that keeps coming, however slowly, is never cut; the timer runs only while the
/// body waits, so one that arrived with its head costs none. `read_to_end` is set once the body
/// has been read to its end.
pub(crate) struct StallLimited {
    body: Body,
    limit: Duration,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Whether `timer` counts from the start of the current wait.
    armed: bool,
    read_to_end: Arc<AtomicBool>,
}

impl StallLimited {
    pub(crate) fn new(body: Body, limit: Duration, read_to_end: Arc<AtomicBool>) -> Self {
        Self {
            body,
            limit,
            timer: None,
            armed: false,
            read_to_end,
        }
    }
}

impl http_body::Body for StallLimited {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.body).poll_frame(cx) {
            this.armed = false;
            if frame.is_none() || this.body.is_end_stream() {
                this.read_to_end.store(true, Ordering::Relaxed);
            }
            return Poll::Ready(frame);
        }
        let deadline = tokio::time::Instant::now() + this.limit;
        let timer = match &mut this.timer {
            Some(timer) if this.armed => timer,
            Some(timer) => {
                timer.as_mut().reset(deadline);
                timer
            }
            None => this
                .timer
                .insert(Box::pin(tokio::time::sleep_until(deadline))),
        };
        this.armed = true;
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(axum::Error::new(BodyStalled(this.limit))))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// Refuses a declared content type other than the accepted ones; a missing one is accepted.
fn check_content_type(req: &Request, accepted: &[&str]) -> Result<(), ApiError> {
    let Some(value) = req.headers().get(CONTENT_TYPE) else {
        return Ok(());
    };
    let essence = value
        .to_str()
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    if accepted.iter().any(|a| essence == *a) || essence.ends_with("+json") {
        Ok(())
    } else {
        Err(ApiError::unsupported_media_type(format!(
            "content type `{essence}` is not accepted here; send {}",
            accepted.join(" or ")
        )))
    }
}

/// A JSON request body, with its size in bytes.
#[derive(Debug)]
pub struct JsonBody {
    pub value: Value,
    pub len: usize,
}

impl<S: Send + Sync> FromRequest<S> for JsonBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        check_content_type(&req, &["application/json"])?;
        let bytes = body_bytes(req, state).await?;
        let value = serde_json::from_slice(&bytes)
            .map_err(|e| ApiError::invalid(format!("the body is not valid JSON: {e}")))?;
        Ok(JsonBody {
            value,
            len: bytes.len(),
        })
    }
}

/// An NDJSON request body as text.
#[derive(Debug)]
pub struct NdjsonBody(pub String);

impl<S: Send + Sync> FromRequest<S> for NdjsonBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        check_content_type(
            &req,
            &[
                "application/x-ndjson",
                "application/jsonl",
                "application/json",
                "text/plain",
            ],
        )?;
        let bytes = body_bytes(req, state).await?;
        String::from_utf8(bytes.to_vec())
            .map(NdjsonBody)
            .map_err(|_| ApiError::invalid("the body is not valid UTF-8"))
    }
}

/// A body of any type, as bytes.
#[derive(Debug)]
pub struct RawBody(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for RawBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        body_bytes(req, state).await.map(RawBody)
    }
}

/// Path parameters (percent-decoded).
#[derive(Debug)]
pub struct Params<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for Params<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Path::<T>::from_request_parts(parts, state)
            .await
            .map(|Path(t)| Params(t))
            .map_err(|e| ApiError::invalid(format!("bad path parameter: {}", e.body_text())))
    }
}

/// The `{sid}` and `{mid}` of a message's route. The message id is checked as the contract's
/// identifiers are (1..256 characters, no control character; the session's is checked where it
/// opens): one that breaks them is a 400, not a message that happens not to exist.
#[derive(Debug)]
pub struct MessageParams {
    pub sid: String,
    pub mid: String,
}

impl<S: Send + Sync> FromRequestParts<S> for MessageParams {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let Params((sid, mid)) =
            Params::<(String, String)>::from_request_parts(parts, state).await?;
        sessiondb::validate_id("messageId", &mid)?;
        Ok(MessageParams { sid, mid })
    }
}

/// A query string.
#[derive(Debug)]
pub struct QueryParams<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for QueryParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(t)| QueryParams(t))
            .map_err(|e| ApiError::invalid(format!("bad query string: {}", e.body_text())))
    }
}
