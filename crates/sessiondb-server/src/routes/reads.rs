//! History (NDJSON), branches, row stats and search.

use std::sync::Arc;
use std::task::Poll;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use serde::Deserialize;
use serde_json::Value;
use sessiondb::convert::ModelFormat;
use sessiondb::{Highlighter, HistoryOptions, SearchFilter, SearchHit, Store, StoredMessage};

use crate::App;
use crate::error::ApiError;
use crate::extract::{MessageParams, Params, QueryParams, Tenant};
use crate::routes::messages::ReadQuery;
use crate::wire::{self, json_response, value_response};

pub(crate) const NDJSON: &str = "application/x-ndjson";

/// Lines ready at once go out as one chunk of up to about this many bytes (a longer line is a
/// chunk of its own). With chunks of 64 lines (~16 KB of short messages) a cached
/// 10,000-message history took 4.3–5.3 ms on loopback, with 256 KiB chunks 2.2–3.9 ms
/// (`sessiondb-http-bench`, median): the cost is per chunk, not per byte.
const CHUNK_BYTES: usize = 256 * 1024;

/// An NDJSON body pulled from `messages` as the client reads: nothing is read ahead of the
/// socket, and dropping the body (the client went away) drops the read. A chunk takes what the
/// stream has ready, so a history served from memory goes out in few chunks and one read from
/// disk goes out window by window.
pub(crate) fn ndjson_body<E: std::fmt::Display>(
    messages: impl Stream<Item = Result<StoredMessage, E>> + Send + 'static,
) -> Response {
    let mut messages = Box::pin(messages);
    let mut ended = false;
    let chunks = futures::stream::poll_fn(move |cx| {
        if ended {
            return Poll::Ready(None);
        }
        let mut text = String::new();
        let pending = loop {
            match messages.as_mut().poll_next(cx) {
                Poll::Ready(Some(Ok(message))) => {
                    text.push_str(message.json());
                    text.push('\n');
                    if text.len() >= CHUNK_BYTES {
                        break false;
                    }
                }
                Poll::Ready(Some(Err(e))) => {
                    // The response ends here, unfinished, so the client sees the failure.
                    ended = true;
                    return Poll::Ready(Some(Err(std::io::Error::other(e.to_string()))));
                }
                Poll::Ready(None) => {
                    ended = true;
                    break false;
                }
                Poll::Pending => break true,
            }
        };
        match (text.is_empty(), pending) {
            (true, true) => Poll::Pending,
            (true, false) => Poll::Ready(None),
            (false, _) => Poll::Ready(Some(Ok(Bytes::from(text)))),
        }
    });
    ([(CONTENT_TYPE, NDJSON)], Body::from_stream(chunks)).into_response()
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct HistoryQuery {
    leaf: Option<String>,
    order: Option<String>,
    max_bytes: Option<u64>,
    format: Option<String>,
    attachments: Option<String>,
}

/// The history answers carry the session's version as their entity tag, read before the path:
/// a request whose `If-None-Match` names it is answered `304` without reading the path (the
/// same URL at the same version reads the same).
pub(crate) async fn history<S: Store>(
    State(app): State<Arc<App<S>>>,
    Tenant(ns): Tenant,
    Params(sid): Params<String>,
    QueryParams(q): QueryParams<HistoryQuery>,
    request: HeaderMap,
) -> Result<Response, ApiError> {
    let newest_first = match q.order.as_deref() {
        None | Some("oldest") => false,
        Some("newest") => true,
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "`order` must be `oldest` or `newest`, not `{other}`"
            )));
        }
    };
    let session = app.reading(&ns, &sid, q.attachments.as_deref())?;
    if let Some(format) = model_format(q.format.as_deref())? {
        if newest_first || q.max_bytes.is_some() {
            return Err(ApiError::invalid(
                "a `format` other than ndjson converts the whole path oldest first; it takes \
                 no `order=newest` or `maxBytes` (a window could cut a tool call from its result)",
            ));
        }
        let options = HistoryOptions {
            leaf: q.leaf,
            newest_first: false,
        };
        let (version, read) = session.versioned_full_history(options).await?;
        if wire::unchanged_since(&request, version) {
            return Ok(wire::not_modified(version));
        }
        let messages: Vec<Value> = read.await?.iter().map(StoredMessage::to_value).collect();
        let converted = value_response(StatusCode::OK, &format.convert(&messages));
        return Ok(wire::tagged(converted, version));
    }
    let Some(max_bytes) = q.max_bytes else {
        let options = HistoryOptions {
            leaf: q.leaf,
            newest_first,
        };
        let (version, messages) = session.versioned_history(options).await?;
        if wire::unchanged_since(&request, version) {
            return Ok(wire::not_modified(version));
        }
        return Ok(wire::tagged(ndjson_body(messages), version));
    };
    let version = session.stats().await?.version;
    if wire::unchanged_since(&request, version) {
        return Ok(wire::not_modified(version));
    }
    let recent = session.recent_history(max_bytes, q.leaf.as_deref()).await?;
    let mut messages = recent.messages;
    if newest_first {
        messages.reverse();
    }
    let mut response = ndjson_body(futures::stream::iter(
        messages.into_iter().map(Ok::<_, ApiError>),
    ));
    let headers = response.headers_mut();
    headers.insert(
        "x-sessiondb-truncated",
        HeaderValue::from_static(if recent.truncated { "true" } else { "false" }),
    );
    headers.insert(
        "x-sessiondb-total-bytes",
        HeaderValue::from(recent.total_bytes),
    );
    Ok(wire::tagged(response, version))
}

/// The model format a history `format` asks for; `None` for NDJSON.
fn model_format(format: Option<&str>) -> Result<Option<ModelFormat>, ApiError> {
    match format {
        None | Some("ndjson") => Ok(None),
        Some(name) => ModelFormat::parse(name).map(Some).ok_or_else(|| {
            ApiError::invalid(format!(
                "`format` must be one of ndjson, {}; not `{name}`",
                ModelFormat::NAMES
            ))
        }),
    }
}

pub(crate) async fn branches<S: Store>(
    State(app): State<Arc<App<S>>>,
    Tenant(ns): Tenant,
    MessageParams { sid, mid }: MessageParams,
    QueryParams(q): QueryParams<ReadQuery>,
) -> Result<Response, ApiError> {
    let children = app
        .reading(&ns, &sid, q.attachments.as_deref())?
        .branches(&mid)
        .await?;
    Ok(json_response(
        StatusCode::OK,
        wire::message_array(&children),
    ))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RowsQuery {
    leaf: Option<String>,
}

pub(crate) async fn rows<S: Store>(
    State(app): State<Arc<App<S>>>,
    Tenant(ns): Tenant,
    Params(sid): Params<String>,
    QueryParams(q): QueryParams<RowsQuery>,
) -> Result<Response, ApiError> {
    let rows = app.session(&ns, &sid)?.row_stats(q.leaf.as_deref()).await?;
    Ok(value_response(StatusCode::OK, &wire::row_stats(&rows)))
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct SearchQuery {
    q: Option<String>,
    limit: Option<usize>,
    user_id: Option<String>,
    role: Option<String>,
    since: Option<i64>,
    until: Option<i64>,
    /// `all` (the default) or `any` of the words.
    r#match: Option<String>,
    snippet_words: Option<usize>,
}

impl SearchQuery {
    fn text(&self) -> &str {
        self.q.as_deref().unwrap_or("")
    }

    /// What the search asks for, checked before anything is read: its page size (`?limit=`),
    /// its filter and the most words of each hit's snippet (`?snippetWords=`).
    fn checked(&self) -> Result<(usize, SearchFilter, usize), ApiError> {
        let limit = within(
            "limit",
            self.limit,
            sessiondb::DEFAULT_PAGE_SIZE,
            sessiondb::MAX_PAGE_SIZE,
        )?;
        let snippet_words = within(
            "snippetWords",
            self.snippet_words,
            sessiondb::DEFAULT_SNIPPET_WORDS,
            sessiondb::MAX_SNIPPET_WORDS,
        )?;
        Ok((limit, self.filter()?, snippet_words))
    }

    /// The hits as JSON, each with its snippet of at most `snippet_words` words.
    fn answer(&self, hits: &[SearchHit], snippet_words: usize) -> Response {
        let highlighter = Highlighter::new(self.text());
        value_response(
            StatusCode::OK,
            &wire::search_hits(hits, &highlighter, snippet_words),
        )
    }

    /// `?match=`, `?role=`, `?since=` and `?until=` (epoch milliseconds, `since` inclusive).
    fn filter(&self) -> Result<SearchFilter, ApiError> {
        let match_any = match self.r#match.as_deref() {
            None | Some("all") => false,
            Some("any") => true,
            Some(_) => return Err(ApiError::invalid("`match` must be `all` or `any`")),
        };
        let filter = SearchFilter {
            match_any,
            role: self.role.clone(),
            since_ms: self.since,
            until_ms: self.until,
        };
        match filter.problem() {
            Some(problem) => Err(ApiError::invalid(problem)),
            None => Ok(filter),
        }
    }
}

/// `value` (else `default`) when it is from 1 to `max`; else a 400 naming the parameter.
fn within(name: &str, value: Option<usize>, default: usize, max: usize) -> Result<usize, ApiError> {
    let value = value.unwrap_or(default);
    if (1..=max).contains(&value) {
        Ok(value)
    } else {
        Err(ApiError::invalid(format!(
            "`{name}` must be an integer from 1 to {max}"
        )))
    }
}

pub(crate) async fn search<S: Store>(
    State(app): State<Arc<App<S>>>,
    Tenant(ns): Tenant,
    Params(sid): Params<String>,
    QueryParams(q): QueryParams<SearchQuery>,
) -> Result<Response, ApiError> {
    if q.user_id.is_some() {
        return Err(ApiError::invalid("`userId` applies to /v1/search only"));
    }
    let (limit, filter, words) = q.checked()?;
    let hits = app
        .session(&ns, &sid)?
        .search_filtered(q.text(), &filter, limit)
        .await?;
    Ok(q.answer(&hits, words))
}

pub(crate) async fn search_all<S: Store>(
    State(app): State<Arc<App<S>>>,
    Tenant(ns): Tenant,
    QueryParams(q): QueryParams<SearchQuery>,
) -> Result<Response, ApiError> {
    let (limit, filter, words) = q.checked()?;
    let hits = app
        .db
        .search_all_filtered(&ns, q.user_id.as_deref(), q.text(), &filter, limit)
        .await?;
    Ok(q.answer(&hits, words))
}
