//! Health, readiness, metrics, the OpenAPI document and the answer for unknown routes.

use std::sync::Arc;

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use sessiondb::{SessionKey, Store};

use crate::App;
use crate::error::ApiError;
use crate::wire::value_response;

pub(crate) async fn healthz() -> Response {
    value_response(StatusCode::OK, &json!({"status": "ok"}))
}

/// Ready while not shutting down, the store takes writes and it answers a read.
pub(crate) async fn readyz<S: Store>(State(app): State<Arc<App<S>>>) -> Result<Response, ApiError> {
    if app.is_shutting_down() {
        return Err(ApiError::unavailable("shutting down"));
    }
    if let Some(halted) = app.db.store().halted() {
        return Err(ApiError::unavailable(halted.to_string()));
    }
    let probe = SessionKey::new("", "readiness-probe")?;
    app.db
        .store()
        .stats(&probe)
        .await
        .map_err(|e| ApiError::unavailable(format!("the store is not answering: {e}")))?;
    Ok(value_response(StatusCode::OK, &json!({"status": "ready"})))
}

pub(crate) async fn metrics<S: Store>(State(app): State<Arc<App<S>>>) -> Response {
    let mut text = app.metrics.render();
    text.push_str(&format!(
        "# HELP sessiondb_compaction_failures_total Auto-compactions that failed (the appends stood).\n\
         # TYPE sessiondb_compaction_failures_total counter\n\
         sessiondb_compaction_failures_total {}\n",
        app.db.compaction_failures()
    ));
    ([(CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

pub(crate) const OPENAPI: &str = include_str!("../../openapi.json");

pub(crate) async fn openapi() -> Response {
    ([(CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

pub(crate) async fn not_found(method: Method, uri: Uri) -> ApiError {
    ApiError::not_found(format!("no route for {method} {}", uri.path()))
}
