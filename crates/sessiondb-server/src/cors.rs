//! Cross-origin requests from the web pages of the origins the server is configured to allow
//! ([`ServerConfig::cors_origins`](crate::ServerConfig::cors_origins), as a reload last put them
//! in force: [`App::in_force`]): a browser's preflight is
//! answered here, before routing, and every answer to an allowed origin says so. Requests
//! without an `Origin` header, or from an origin not allowed, are served as before and carry no
//! CORS header (so a browser keeps the answer from the page).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header::{
    ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS, ACCESS_CONTROL_ALLOW_ORIGIN,
    ACCESS_CONTROL_EXPOSE_HEADERS, ACCESS_CONTROL_MAX_AGE, ACCESS_CONTROL_REQUEST_METHOD, ORIGIN,
    VARY,
};
use axum::http::{HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sessiondb::Store;

use crate::App;

/// The origin that may be given to an allowed origin's page: `*` allows every origin.
pub const ANY_ORIGIN: &str = "*";

/// What a page may send besides the headers every request may carry.
const ALLOWED_HEADERS: &str = "authorization, content-type, if-none-match, last-event-id, \
                               x-request-id, sessiondb-conversation-id";
const ALLOWED_METHODS: &str = "GET, POST, PUT, PATCH, DELETE";
/// What a page may read of an answer besides the headers every answer shows.
const EXPOSED_HEADERS: &str = "x-request-id, sessiondb-conversation-id, x-sessiondb-truncated, \
                               x-sessiondb-total-bytes, x-sessiondb-version, etag, retry-after";
/// How long a browser may keep a preflight's answer, in seconds.
const PREFLIGHT_MAX_AGE: &str = "600";

/// Whether `origin` (as a browser sends it: `scheme://host[:port]`) is one the configuration
/// lists; `*` there allows any.
fn allowed(origins: &[String], origin: &HeaderValue) -> bool {
    origins
        .iter()
        .any(|allowed| allowed == ANY_ORIGIN || allowed.as_bytes() == origin.as_bytes())
}

pub(crate) async fn cors<S: Store>(
    State(app): State<Arc<App<S>>>,
    req: Request,
    next: Next,
) -> Response {
    let origin = match req.headers().get(ORIGIN) {
        Some(origin) if allowed(&app.in_force().cors_origins, origin) => origin.clone(),
        _ => return next.run(req).await,
    };
    let preflight = req.method() == Method::OPTIONS
        && req.headers().contains_key(ACCESS_CONTROL_REQUEST_METHOD);
    let mut response = if preflight {
        let mut answer = StatusCode::NO_CONTENT.into_response();
        let headers = answer.headers_mut();
        headers.insert(
            ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static(ALLOWED_METHODS),
        );
        headers.insert(
            ACCESS_CONTROL_ALLOW_HEADERS,
            HeaderValue::from_static(ALLOWED_HEADERS),
        );
        headers.insert(
            ACCESS_CONTROL_MAX_AGE,
            HeaderValue::from_static(PREFLIGHT_MAX_AGE),
        );
        answer
    } else {
        let mut answer = next.run(req).await;
        answer.headers_mut().insert(
            ACCESS_CONTROL_EXPOSE_HEADERS,
            HeaderValue::from_static(EXPOSED_HEADERS),
        );
        answer
    };
    let headers = response.headers_mut();
    headers.insert(ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    // The answer depends on the origin, so caches keep one per origin.
    headers.append(VARY, HeaderValue::from_static("origin"));
    response
}
