//! The reference example's routes, `/agents/session-object/{name}/…`, with `{name}` as the
//! session id. Routes are tried in the reference's order; anything else answers the session
//! summary `{name, messages, leaf}`. Bad input answers the reference's plain-text 400s (where
//! the reference would fail with a 500 on malformed JSON, this answers 400 too).

use std::sync::Arc;

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use sessiondb::{AppendOptions, HistoryOptions, Message, Source, Store};

use crate::App;
use crate::error::ApiError;
use crate::extract::{Params, QueryParams, RawBody, Tenant};
use crate::routes::messages::{appended, parent_of};
use crate::routes::reads::ndjson_body;
use crate::wire::{self, json_response, value_response};

/// The reference's text answers.
fn text(status: StatusCode, body: &'static str) -> Response {
    (status, [(CONTENT_TYPE, "text/plain;charset=UTF-8")], body).into_response()
}

/// `{id: string, role: string, parts: [{type: string, …}]}` and nothing less (§8.1).
fn parse_session_message(body: &[u8]) -> Option<Message> {
    let value: Value = serde_json::from_slice(body).ok()?;
    let map = value.as_object()?;
    let valid = map.get("id").is_some_and(Value::is_string)
        && map.get("role").is_some_and(Value::is_string)
        && map
            .get("parts")
            .and_then(Value::as_array)
            .is_some_and(|parts| {
                parts
                    .iter()
                    .all(|p| p.get("type").is_some_and(Value::is_string))
            });
    valid.then(|| Message::from_value(value).ok()).flatten()
}

fn parse_compaction(body: &[u8]) -> Option<(String, String, String)> {
    let value: Value = serde_json::from_slice(body).ok()?;
    let field = |name: &str| value.get(name)?.as_str().map(str::to_owned);
    Some((
        field("summary")?,
        field("fromMessageId")?,
        field("toMessageId")?,
    ))
}

pub(crate) async fn handle<S: Store>(
    State(app): State<Arc<App<S>>>,
    Tenant(ns): Tenant,
    Params(path): Params<Vec<(String, String)>>,
    QueryParams(query): QueryParams<Vec<(String, String)>>,
    method: Method,
    RawBody(body): RawBody,
) -> Result<Response, ApiError> {
    let param = |name: &str| path.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    let query_param = |name: &str| {
        query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let name = param("name").unwrap_or_default();
    let rest = param("rest").unwrap_or_default();
    let session = app.session(&ns, &name)?;
    let suffix = |prefix: &str| rest.strip_prefix(prefix).filter(|id| !id.is_empty());

    if method == Method::POST && rest == "messages" {
        let Some(message) = parse_session_message(&body) else {
            return Ok(text(StatusCode::BAD_REQUEST, "Invalid SessionMessage"));
        };
        let options = AppendOptions {
            parent: parent_of(query_param("parent")),
            source: Source::Client,
            ..AppendOptions::default()
        };
        let result = session.append(message, options).await?;
        return Ok(appended(&app, &result));
    }
    if method == Method::GET && rest == "history" {
        let options = HistoryOptions {
            leaf: query_param("leaf"),
            newest_first: false,
        };
        return Ok(ndjson_body(session.history(options)));
    }
    if method == Method::GET
        && let Some(id) = suffix("messages/")
    {
        return Ok(match session.message(id).await? {
            Some(message) => json_response(StatusCode::OK, message.into_json()),
            None => text(StatusCode::NOT_FOUND, "Not found"),
        });
    }
    if method == Method::GET
        && let Some(id) = suffix("branches/")
    {
        let children = session.branches(id).await?;
        return Ok(json_response(
            StatusCode::OK,
            wire::message_array(&children),
        ));
    }
    if method == Method::POST && rest == "compactions" {
        let Some((summary, from, to)) = parse_compaction(&body) else {
            return Ok(text(StatusCode::BAD_REQUEST, "Invalid compaction"));
        };
        let compaction = session.add_compaction(summary, from, to).await?;
        return Ok(value_response(
            StatusCode::CREATED,
            &wire::compaction(&compaction),
        ));
    }
    if method == Method::DELETE && rest == "messages" {
        session.clear().await?;
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    if method == Method::GET && rest == "search" {
        let query = query_param("q").unwrap_or_default();
        let hits = session.search(&query, 20).await?;
        let results: Vec<Value> = hits
            .iter()
            .map(|h| json!({"id": h.id, "role": h.role, "content": h.content}))
            .collect();
        return Ok(value_response(StatusCode::OK, &Value::Array(results)));
    }
    let rows = session.row_stats(None).await?;
    Ok(value_response(
        StatusCode::OK,
        &json!({"name": name, "messages": rows.len(), "leaf": rows.last().map(|r| r.id.clone())}),
    ))
}
