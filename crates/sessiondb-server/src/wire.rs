//! JSON forms of the API: responses built from store types, and typed readers for request
//! objects whose errors name the field; and the session versions answers carry.
//!
//! Stored messages are already JSON text; responses splice that text in rather than parsing it
//! back into a value.

use axum::http::header::{CONTENT_TYPE, ETAG, IF_NONE_MATCH};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};
use sessiondb::{Compaction, Highlighter, RowStat, SearchHit, SessionInfo, StoredMessage};

use crate::error::ApiError;

/// The header of a write's answer that holds the session's version after the write.
pub const VERSION_HEADER: &str = "x-sessiondb-version";

/// A session read's entity tag: the session's version, which moves with every change of it.
fn entity_tag(version: i64) -> String {
    format!("\"{version}\"")
}

/// Whether the request's `If-None-Match` names the session's read at `version` (weakly
/// compared, as the header asks; `*` names any existing session). Version 0 (a session that
/// does not exist, or one not written since versions began) matches nothing.
pub fn unchanged_since(request: &HeaderMap, version: i64) -> bool {
    if version == 0 {
        return false;
    }
    let tag = entity_tag(version);
    request.get_all(IF_NONE_MATCH).iter().any(|value| {
        value.to_str().is_ok_and(|list| {
            list.split(',')
                .map(str::trim)
                .any(|named| named == "*" || named.strip_prefix("W/").unwrap_or(named) == tag)
        })
    })
}

/// `304 Not Modified` for a read the client holds at `version`.
pub fn not_modified(version: i64) -> Response {
    (StatusCode::NOT_MODIFIED, [(ETAG, entity_tag(version))]).into_response()
}

/// Tags a session read's answer with the session's version (none at version 0).
pub fn tagged(mut response: Response, version: i64) -> Response {
    if version != 0 {
        let tag = HeaderValue::try_from(entity_tag(version)).expect("a quoted number");
        response.headers_mut().insert(ETAG, tag);
    }
    response
}

/// Adds the session's version after a write to the write's answer.
pub fn with_version(mut response: Response, version: Option<i64>) -> Response {
    if let Some(version) = version {
        response
            .headers_mut()
            .insert(VERSION_HEADER, HeaderValue::from(version));
    }
    response
}

/// A response with a JSON text body.
pub fn json_response(status: StatusCode, body: String) -> Response {
    (status, [(CONTENT_TYPE, "application/json")], body).into_response()
}

pub fn value_response(status: StatusCode, value: &Value) -> Response {
    json_response(status, value.to_string())
}

pub fn json_string(s: &str) -> String {
    Value::String(s.to_owned()).to_string()
}

/// `[m1, m2, …]` from stored messages.
pub fn message_array(messages: &[StoredMessage]) -> String {
    let mut out =
        String::with_capacity(messages.iter().map(|m| m.json().len() + 1).sum::<usize>() + 2);
    out.push('[');
    for (i, m) in messages.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(m.json());
    }
    out.push(']');
    out
}

pub fn append_result(inserted: bool, message: &StoredMessage) -> String {
    format!("{{\"inserted\":{inserted},\"message\":{}}}", message.json())
}

pub fn session(info: &SessionInfo) -> Value {
    let r = &info.record;
    json!({
        "id": info.id,
        "name": r.name,
        "parentSessionId": r.parent_session_id,
        "model": r.model,
        "source": r.source,
        "userId": r.user_id,
        "metadata": r.metadata,
        "settings": r.settings,
        "createdAt": info.created_at,
        "updatedAt": info.updated_at,
        "lastMessageAt": info.last_message_at,
        "endReason": r.end_reason,
        "inputTokens": r.input_tokens,
        "outputTokens": r.output_tokens,
        "cost": r.cost,
        "messageCount": info.stats.message_count,
        "leafId": info.stats.leaf_id,
        "tokenEstimate": info.stats.token_estimate,
        "contentBytes": info.stats.content_bytes,
        "version": info.stats.version,
    })
}

/// Search hits, each with the snippet of at most `snippet_words` words of its text.
pub fn search_hits(hits: &[SearchHit], highlighter: &Highlighter, snippet_words: usize) -> Value {
    hits.iter()
        .map(|h| {
            json!({"id": h.id, "role": h.role, "content": h.content,
                   "snippet": highlighter.snippet(&h.content, snippet_words),
                   "sessionId": h.session_id, "createdAt": h.created_at})
        })
        .collect()
}

pub fn row_stats(rows: &[RowStat]) -> Value {
    rows.iter()
        .map(|r| json!({"id": r.id, "role": r.role, "bytes": r.bytes, "tokenEstimate": r.token_estimate}))
        .collect()
}

pub fn compaction(c: &Compaction) -> Value {
    json!({"id": c.id, "summary": c.summary, "fromMessageId": c.from_message_id,
           "toMessageId": c.to_message_id, "createdAt": c.created_at})
}

/// A request object read field by field; [`Fields::finish`] refuses fields nobody asked for, so
/// a misspelt field is an error rather than silently ignored.
#[derive(Debug)]
pub struct Fields {
    map: Map<String, Value>,
    what: &'static str,
}

impl Fields {
    pub fn new(value: Value, what: &'static str) -> Result<Self, ApiError> {
        match value {
            Value::Object(map) => Ok(Self { map, what }),
            _ => Err(ApiError::invalid(format!(
                "the {what} must be a JSON object"
            ))),
        }
    }

    fn wrong(&self, field: &str, expected: &str) -> ApiError {
        ApiError::invalid(format!(
            "invalid `{field}` in the {}: must be {expected}",
            self.what
        ))
    }

    /// A string field; absent and `null` are `None`.
    pub fn opt_string(&mut self, field: &str) -> Result<Option<String>, ApiError> {
        match self.map.remove(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(self.wrong(field, "a string")),
        }
    }

    pub fn string(&mut self, field: &str) -> Result<String, ApiError> {
        self.opt_string(field)?
            .ok_or_else(|| ApiError::invalid(format!("`{field}` is required in the {}", self.what)))
    }

    /// An object field; absent and `null` are `None`.
    pub fn opt_object(&mut self, field: &str) -> Result<Option<Map<String, Value>>, ApiError> {
        match self.map.remove(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Object(m)) => Ok(Some(m)),
            Some(_) => Err(self.wrong(field, "an object")),
        }
    }

    pub fn opt_u64(&mut self, field: &str) -> Result<Option<u64>, ApiError> {
        match self.map.remove(field) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| self.wrong(field, "a non-negative integer")),
        }
    }

    pub fn opt_f64(&mut self, field: &str) -> Result<Option<f64>, ApiError> {
        match self.map.remove(field) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_f64()
                .filter(|f| f.is_finite() && *f >= 0.0)
                .map(Some)
                .ok_or_else(|| self.wrong(field, "a non-negative number")),
        }
    }

    /// Takes a field as it is (`None` when absent).
    pub fn take(&mut self, field: &str) -> Option<Value> {
        self.map.remove(field)
    }

    pub fn finish(self) -> Result<(), ApiError> {
        match self.map.keys().next() {
            None => Ok(()),
            Some(field) => Err(ApiError::invalid(format!(
                "unknown field `{field}` in the {}",
                self.what
            ))),
        }
    }
}
