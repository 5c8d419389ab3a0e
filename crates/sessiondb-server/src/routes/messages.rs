//! `/v1/sessions/{sid}/messages…`: writes and reads of single messages and pages.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use sessiondb::{
    AppendOptions, AppendResult, Message, MessagePatch, PageRequest, Parent, Source, Store,
    WriteCondition,
};

use crate::error::ApiError;
use crate::extract::{ConversationHeader, JsonBody, MessageParams, Params, QueryParams, Tenant};
use crate::routes::sessions::descending;
use crate::wire::{self, Fields, json_response, value_response};
use crate::{App, CONVERSATION_ID};

/// `?parent=` semantics: absent ⇒ the active leaf; empty ⇒ a new root; else that message.
pub(crate) fn parent_of(parent: Option<String>) -> Parent {
    match parent {
        None => Parent::ActiveLeaf,
        Some(p) if p.is_empty() => Parent::Root,
        Some(p) => Parent::Id(p),
    }
}

/// `?ifLeaf=` semantics: absent ⇒ no condition; empty ⇒ the session has no message; else the
/// session's active leaf must be that message.
pub(crate) fn if_leaf_of(if_leaf: Option<String>) -> Option<Option<String>> {
    if_leaf.map(|leaf| Some(leaf).filter(|leaf| !leaf.is_empty()))
}

/// An append of a client under `?ifLeaf=` or `?ifVersion=` (a session version: nothing changed
/// the session since a read at it), at most one of them.
fn client(
    parent: Parent,
    if_leaf: Option<String>,
    if_version: Option<i64>,
) -> Result<AppendOptions, ApiError> {
    let condition = match (if_leaf_of(if_leaf), if_version) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "`ifLeaf` and `ifVersion` do not go together (a version holds the leaf)",
            ));
        }
        (Some(leaf), None) => Some(WriteCondition::Leaf(leaf)),
        (None, Some(version)) => Some(WriteCondition::Version(version)),
        (None, None) => None,
    };
    Ok(AppendOptions {
        parent,
        source: Source::Client,
        condition,
    })
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct AppendQuery {
    parent: Option<String>,
    if_leaf: Option<String>,
    if_version: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct BatchQuery {
    if_leaf: Option<String>,
    if_version: Option<i64>,
}

/// The query of the routes that take only the leaf condition (an import).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct IfLeafQuery {
    pub(crate) if_leaf: Option<String>,
}

pub(crate) async fn append<S: Store>(
    State(app): State<Arc<App<S>>>,
    Tenant(ns): Tenant,
    Params(sid): Params<String>,
    ConversationHeader(header): ConversationHeader,
    QueryParams(q): QueryParams<AppendQuery>,
    body: JsonBody,
) -> Result<Response, ApiError> {
    if let Some(named) = header.filter(|named| *named != sid) {
        return Err(ApiError::invalid(format!(
            "the `{CONVERSATION_ID}` header names `{named}` but the path names `{sid}`"
        )));
    }
    append_to(&app, &ns, &sid, q, body).await
}

/// `POST /v1/messages`: an append to the conversation the `sessiondb-conversation-id` header
/// names.
pub(crate) async fn append_by_header<S: Store>(
    State(app): State<Arc<App<S>>>,
    Tenant(ns): Tenant,
    ConversationHeader(header): ConversationHeader,
    QueryParams(q): QueryParams<AppendQuery>,
    body: JsonBody,
) -> Result<Response, ApiError> {
    let Some(sid) = header else {
        return Err(ApiError::invalid(format!(
            "the `{CONVERSATION_ID}` header is required"
        )));
    };
    append_to(&app, &ns, &sid, q, body).await
}

async fn append_to<S: Store>(
    app: &App<S>,
    ns: &str,
    sid: &str,
    q: AppendQuery,
    body: JsonBody,
) -> Result<Response, ApiError> {
    let message = Message::from_value(body.value)?;
    let session = app.session(ns, sid)?;
    let options = client(parent_of(q.parent), q.if_leaf, q.if_version)?;
    let result = session.append(message, options).await?;
    Ok(appended(app, &result))
}

/// `{inserted, message}`: 201 when stored (and counted), 200 when the id existed; with the
/// session's version after the write.
pub(crate) fn appended<S: Store>(app: &App<S>, result: &AppendResult) -> Response {
    let status = if result.inserted {
        app.metrics.record_append(result.message.bytes);
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let body = wire::append_result(result.inserted, &result.message);
    wire::with_version(json_response(status, body), result.version)
}

pub(crate) async fn batch<S: Store>(
    State(app): State<Arc<App<S>>>,
    Tenant(ns): Tenant,
    Params(sid): Params<String>,
    QueryParams(q): QueryParams<BatchQuery>,
    body: JsonBody,
) -> Result<Response, ApiError> {
    let mut f = Fields::new(body.value, "batch")?;
    let parent = match f.take("parentId") {
        None => Parent::ActiveLeaf,
        Some(Value::Null) => Parent::Root,
        Some(Value::String(p)) => parent_of(Some(p)),
        Some(_) => return Err(ApiError::invalid("`parentId` must be a string or null")),
    };
    let Some(Value::Array(values)) = f.take("messages") else {
        return Err(ApiError::invalid("`messages` must be an array of messages"));
    };
    f.finish()?;
    let mut messages = Vec::with_capacity(values.len());
    for (i, value) in values.into_iter().enumerate() {
        messages.push(
            Message::from_value(value)
                .map_err(|e| ApiError::invalid(format!("messages[{i}]: {e}")))?,
        );
    }
    let session = app.session(&ns, &sid)?;
    let options = client(parent, q.if_leaf, q.if_version)?;
    let results = session.append_all(messages, options).await?;
    let version = results.first().and_then(|r| r.version);
    let stored: Vec<_> = results
        .into_iter()
        .map(|r| {
            if r.inserted {
                app.metrics.record_append(r.message.bytes);
            }
            r.message
        })
        .collect();
    let body = format!("{{\"messages\":{}}}", wire::message_array(&stored));
    Ok(wire::with_version(
        json_response(StatusCode::CREATED, body),
        version,
    ))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListQuery {
    limit: Option<usize>,
    order: Option<String>,
    after: Option<String>,
    before: Option<String>,
    attachments: Option<String>,
}

pub(crate) async fn list<S: Store>(
    State(app): State<Arc<App<S>>>,
    Tenant(ns): Tenant,
    Params(sid): Params<String>,
    QueryParams(q): QueryParams<ListQuery>,
) -> Result<Response, ApiError> {
    let request = PageRequest {
        limit: q.limit,
        descending: descending(q.order.as_deref(), false)?,
        after: q.after,
        before: q.before,
    };
    let page = app
        .reading(&ns, &sid, q.attachments.as_deref())?
        .list_messages(&request)
        .await?;
    let mut body = format!("{{\"items\":{}", wire::message_array(&page.items));
    if let Some(next) = page.next_cursor {
        body.push_str(&format!(",\"nextCursor\":{}", wire::json_string(&next)));
    }
    if let Some(previous) = page.previous_cursor {
        body.push_str(&format!(
            ",\"previousCursor\":{}",
            wire::json_string(&previous)
        ));
    }
    body.push('}');
    Ok(json_response(StatusCode::OK, body))
}

fn missing(mid: &str) -> ApiError {
    ApiError::not_found(format!("no message `{mid}` in this session"))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReadQuery {
    pub(crate) attachments: Option<String>,
}

pub(crate) async fn get<S: Store>(
    State(app): State<Arc<App<S>>>,
    Tenant(ns): Tenant,
    MessageParams { sid, mid }: MessageParams,
    QueryParams(q): QueryParams<ReadQuery>,
) -> Result<Response, ApiError> {
    let message = app
        .reading(&ns, &sid, q.attachments.as_deref())?
        .message(&mid)
        .await?
        .ok_or_else(|| missing(&mid))?;
    Ok(json_response(StatusCode::OK, message.into_json()))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PutQuery {
    upsert: Option<bool>,
}

/// The body's `id` must be absent or equal the path's; the path's id is used (first, where a
/// generated id goes too).
fn with_path_id(mut value: Value, mid: &str) -> Result<Value, ApiError> {
    if let Value::Object(map) = &mut value {
        match map.get("id") {
            None => {
                map.shift_insert(0, "id".into(), Value::String(mid.to_owned()));
            }
            Some(Value::String(id)) if id == mid => {}
            Some(_) => {
                return Err(ApiError::invalid(format!(
                    "the body's `id` must be absent or equal the path's `{mid}`"
                )));
            }
        }
    }
    Ok(value)
}

pub(crate) async fn put<S: Store>(
    State(app): State<Arc<App<S>>>,
    Tenant(ns): Tenant,
    MessageParams { sid, mid }: MessageParams,
    QueryParams(q): QueryParams<PutQuery>,
    body: JsonBody,
) -> Result<Response, ApiError> {
    let message = Message::from_value(with_path_id(body.value, &mid)?)?;
    let session = app.session(&ns, &sid)?;
    let stored = if q.upsert.unwrap_or(false) {
        let result = session
            .upsert(message, client(Parent::ActiveLeaf, None, None)?)
            .await?;
        if result.inserted {
            app.metrics.record_append(result.message.bytes);
        }
        result.message
    } else {
        session
            .update(message, Source::Client)
            .await?
            .ok_or_else(|| missing(&mid))?
    };
    Ok(json_response(StatusCode::OK, stored.into_json()))
}

pub(crate) async fn patch<S: Store>(
    State(app): State<Arc<App<S>>>,
    Tenant(ns): Tenant,
    MessageParams { sid, mid }: MessageParams,
    body: JsonBody,
) -> Result<Response, ApiError> {
    let mut f = Fields::new(body.value, "message patch")?;
    let patch = MessagePatch {
        role: f.take("role"),
        parts: f.take("parts"),
        content: f.take("content"),
        metadata: f.take("metadata"),
    };
    f.finish()?;
    let stored = app
        .session(&ns, &sid)?
        .patch_message(&mid, patch, Source::Client)
        .await?
        .ok_or_else(|| missing(&mid))?;
    Ok(json_response(StatusCode::OK, stored.into_json()))
}

pub(crate) async fn delete<S: Store>(
    State(app): State<Arc<App<S>>>,
    Tenant(ns): Tenant,
    MessageParams { sid, mid }: MessageParams,
) -> Result<Response, ApiError> {
    match app
        .session(&ns, &sid)?
        .delete(std::slice::from_ref(&mid))
        .await?
    {
        0 => Err(missing(&mid)),
        _ => Ok(StatusCode::NO_CONTENT.into_response()),
    }
}

pub(crate) async fn delete_many<S: Store>(
    State(app): State<Arc<App<S>>>,
    Tenant(ns): Tenant,
    Params(sid): Params<String>,
    body: JsonBody,
) -> Result<Response, ApiError> {
    let mut f = Fields::new(body.value, "delete request")?;
    let ids = match f.take("ids") {
        Some(Value::Array(ids)) => ids
            .into_iter()
            .map(|id| match id {
                Value::String(s) => Ok(s),
                _ => Err(ApiError::invalid("`ids` must hold strings")),
            })
            .collect::<Result<Vec<_>, _>>()?,
        _ => return Err(ApiError::invalid("`ids` must be an array of message ids")),
    };
    f.finish()?;
    let deleted = app.session(&ns, &sid)?.delete(&ids).await?;
    Ok(value_response(StatusCode::OK, &json!({"deleted": deleted})))
}

pub(crate) async fn clear<S: Store>(
    State(app): State<Arc<App<S>>>,
    Tenant(ns): Tenant,
    Params(sid): Params<String>,
) -> Result<Response, ApiError> {
    app.session(&ns, &sid)?.clear().await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
