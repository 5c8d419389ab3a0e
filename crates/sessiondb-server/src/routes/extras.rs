//! Import/export, stored compactions and per-session state.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde_json::{Map, Value, json};
use sessiondb::Store;

use crate::App;
use crate::error::ApiError;
use crate::extract::{JsonBody, NdjsonBody, Params, QueryParams, Tenant};
use crate::routes::messages::{IfLeafQuery, if_leaf_of};
use crate::routes::reads::NDJSON;
use crate::wire::{self, Fields, value_response};

pub(crate) async fn import<S: Store>(
    State(app): State<Arc<App<S>>>,
    Tenant(ns): Tenant,
    Params(sid): Params<String>,
    QueryParams(q): QueryParams<IfLeafQuery>,
    NdjsonBody(text): NdjsonBody,
) -> Result<Response, ApiError> {
    let lines = sessiondb::parse_import(&text)?;
    let summary = app
        .session(&ns, &sid)?
        .import_lines_if_leaf(lines, if_leaf_of(q.if_leaf))
        .await?;
    Ok(wire::with_version(
        value_response(
            StatusCode::OK,
            &json!({"imported": summary.imported, "skipped": summary.skipped}),
        ),
        summary.version,
    ))
}

/// `POST /v1/import`: lines for several sessions, each session's part opened by an `into` line
/// (see [`sessiondb::parse_import_parts`]), written all together or not at all.
pub(crate) async fn import_together<S: Store>(
    State(app): State<Arc<App<S>>>,
    Tenant(ns): Tenant,
    NdjsonBody(text): NdjsonBody,
) -> Result<Response, ApiError> {
    let parts = sessiondb::parse_import_parts(&text)?;
    let ids: Vec<String> = parts.iter().map(|p| p.session_id.clone()).collect();
    let summaries = app.db.import_together(&ns, parts).await?;
    let (mut imported, mut skipped) = (0, 0);
    let parts: Vec<Value> = ids
        .into_iter()
        .zip(summaries)
        .map(|(id, summary)| {
            imported += summary.imported;
            skipped += summary.skipped;
            let mut part =
                json!({"sessionId": id, "imported": summary.imported, "skipped": summary.skipped});
            if let Some(version) = summary.version {
                part["version"] = json!(version);
            }
            part
        })
        .collect();
    Ok(value_response(
        StatusCode::OK,
        &json!({"imported": imported, "skipped": skipped, "parts": parts}),
    ))
}

pub(crate) async fn export<S: Store>(
    State(app): State<Arc<App<S>>>,
    Tenant(ns): Tenant,
    Params(sid): Params<String>,
) -> Result<Response, ApiError> {
    let session = app.session(&ns, &sid)?;
    if session.info().await?.is_none() {
        return Err(ApiError::not_found(format!("no session `{sid}`")));
    }
    let lines = session.export().map(|line| {
        line.map(Bytes::from)
            .map_err(|e| std::io::Error::other(e.to_string()))
    });
    Ok(([(CONTENT_TYPE, NDJSON)], Body::from_stream(lines)).into_response())
}

pub(crate) async fn add_compaction<S: Store>(
    State(app): State<Arc<App<S>>>,
    Tenant(ns): Tenant,
    Params(sid): Params<String>,
    body: JsonBody,
) -> Result<Response, ApiError> {
    let mut f = Fields::new(body.value, "compaction")?;
    let summary = f.string("summary")?;
    let from = f.string("fromMessageId")?;
    let to = f.string("toMessageId")?;
    f.finish()?;
    let compaction = app
        .session(&ns, &sid)?
        .add_compaction(summary, from, to)
        .await?;
    Ok(value_response(
        StatusCode::CREATED,
        &wire::compaction(&compaction),
    ))
}

pub(crate) async fn compactions<S: Store>(
    State(app): State<Arc<App<S>>>,
    Tenant(ns): Tenant,
    Params(sid): Params<String>,
) -> Result<Response, ApiError> {
    let list = app.session(&ns, &sid)?.compactions().await?;
    let items: Vec<Value> = list.iter().map(wire::compaction).collect();
    Ok(value_response(StatusCode::OK, &Value::Array(items)))
}

fn no_key(key: &str) -> ApiError {
    ApiError::not_found(format!("no state key `{key}` in this session"))
}

pub(crate) async fn state_get<S: Store>(
    State(app): State<Arc<App<S>>>,
    Tenant(ns): Tenant,
    Params((sid, key)): Params<(String, String)>,
) -> Result<Response, ApiError> {
    let value = app
        .session(&ns, &sid)?
        .state(&key)
        .await?
        .ok_or_else(|| no_key(&key))?;
    Ok(value_response(StatusCode::OK, &value))
}

pub(crate) async fn state_put<S: Store>(
    State(app): State<Arc<App<S>>>,
    Tenant(ns): Tenant,
    Params((sid, key)): Params<(String, String)>,
    body: JsonBody,
) -> Result<Response, ApiError> {
    app.session(&ns, &sid)?.set_state(&key, &body.value).await?;
    Ok(value_response(StatusCode::OK, &body.value))
}

pub(crate) async fn state_delete<S: Store>(
    State(app): State<Arc<App<S>>>,
    Tenant(ns): Tenant,
    Params((sid, key)): Params<(String, String)>,
) -> Result<Response, ApiError> {
    if app.session(&ns, &sid)?.delete_state(&key).await? {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(no_key(&key))
    }
}

pub(crate) async fn state_all<S: Store>(
    State(app): State<Arc<App<S>>>,
    Tenant(ns): Tenant,
    Params(sid): Params<String>,
) -> Result<Response, ApiError> {
    let entries = app.session(&ns, &sid)?.state_entries().await?;
    let map: Map<String, Value> = entries.into_iter().collect();
    Ok(value_response(StatusCode::OK, &Value::Object(map)))
}

/// `GET /v1/attachments/{sha256}`: a payload of the tenant's namespace with its media type.
pub(crate) async fn attachment<S: Store>(
    State(app): State<Arc<App<S>>>,
    Tenant(ns): Tenant,
    Params(hash): Params<String>,
) -> Result<Response, ApiError> {
    if hash.len() != 64 || !hash.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return Err(ApiError::invalid(
            "an attachment is named by the SHA-256 of its bytes: 64 lowercase hex digits",
        ));
    }
    let payload = app
        .db
        .store()
        .attachments(&ns, std::slice::from_ref(&hash))
        .await?
        .pop()
        .ok_or_else(|| ApiError::not_found(format!("no attachment {hash}")))?;
    let media_type = HeaderValue::from_str(&payload.media_type)
        .unwrap_or_else(|_| HeaderValue::from_static("application/octet-stream"));
    Ok(([(CONTENT_TYPE, media_type)], payload.bytes).into_response())
}
