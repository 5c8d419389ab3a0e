//! The change feed as server-sent events, per session and per namespace.
//!
//! Each event's `id` is `<feed epoch>-<position>`. A client that reconnects with `Last-Event-ID`
//! gets every kept event after that position first (on PostgreSQL also from the database's
//! feed table); when the position is older than what is kept, from another server process or
//! not an id at all, the stream starts with a
//! `reset` event (re-read what you need, then follow). A subscriber that falls behind gets a
//! `lagged` event with the number of events it missed.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::{StreamExt, stream};
use serde_json::json;
use sessiondb::{Change, ChangeEvent, FeedFilter, FeedItem, Parent, SessionKey, Store};

use crate::App;
use crate::error::ApiError;
use crate::extract::{Params, Tenant};
use crate::wire::{self, json_string};

pub(crate) async fn session<S: Store>(
    State(app): State<Arc<App<S>>>,
    Tenant(ns): Tenant,
    Params(sid): Params<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let key = SessionKey::new(ns, sid)?;
    Ok(subscribe(app, FeedFilter::Session(key), &headers).await)
}

pub(crate) async fn namespace<S: Store>(
    State(app): State<Arc<App<S>>>,
    Tenant(ns): Tenant,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    Ok(subscribe(app, FeedFilter::Namespace(ns), &headers).await)
}

/// The `Last-Event-ID` header: `None` when absent or blank (an event source whose last event
/// had no id sends none), `Some(None)` when it is not an id this server wrote
/// (`<epoch>-<position>`), which cannot be resumed any more than a stale one.
fn last_event_id(headers: &HeaderMap) -> Option<Option<(u64, u64)>> {
    let parse = |text: &str| {
        let (epoch, position) = text.split_once('-')?;
        Some((epoch.parse().ok()?, position.parse().ok()?))
    };
    let header = headers.get("last-event-id")?.as_bytes().trim_ascii();
    if header.is_empty() {
        return None;
    }
    Some(std::str::from_utf8(header).ok().and_then(parse))
}

/// Decrements the live-subscriber gauge when the stream is dropped.
struct LiveSubscriber<S: Store>(Arc<App<S>>);

impl<S: Store> Drop for LiveSubscriber<S> {
    fn drop(&mut self) {
        self.0
            .metrics
            .live_subscribers
            .fetch_sub(1, Ordering::Relaxed);
    }
}

/// Why a stream starts with a `reset` event.
const NOT_RETAINED: &str = "the requested position is no longer retained";
const NOT_AN_EVENT_ID: &str = "`Last-Event-ID` is not an event id of this server";

async fn subscribe<S: Store>(
    app: Arc<App<S>>,
    filter: FeedFilter,
    headers: &HeaderMap,
) -> Response {
    let store = app.db.store();
    let epoch = store.feed_epoch();
    let (subscription, reset) = match last_event_id(headers) {
        None => (store.subscribe(filter), None),
        Some(Some((e, position))) if e == epoch => {
            match store.subscribe_after(filter.clone(), position).await {
                Some(sub) => (sub, None),
                None => (store.subscribe(filter), Some(NOT_RETAINED)),
            }
        }
        Some(Some(_)) => (store.subscribe(filter), Some(NOT_RETAINED)),
        Some(None) => (store.subscribe(filter), Some(NOT_AN_EVENT_ID)),
    };
    app.metrics.live_subscribers.fetch_add(1, Ordering::Relaxed);
    let guard = LiveSubscriber(app.clone());
    let first = reset.map(|reason| {
        Event::default()
            .event("reset")
            .data(json!({ "reason": reason }).to_string())
    });
    let events = subscription.map(move |item| {
        let _alive = &guard;
        match item {
            FeedItem::Event(event) => to_sse(epoch, &event),
            FeedItem::Lagged { missed } => Event::default()
                .event("lagged")
                .data(json!({"missed": missed}).to_string()),
        }
    });
    // Ending the stream on shutdown keeps open feeds from holding up graceful shutdown.
    let mut stopping = app.shutting_down();
    let stop = async move {
        let _ = stopping.wait_for(|stopping| *stopping).await;
    };
    let stream = stream::iter(first)
        .chain(events)
        .map(Ok::<_, Infallible>)
        .take_until(stop);
    Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

/// The parent as the request gave it (none when it let the message follow the active leaf), as
/// the reference's event has it.
fn parent_field(parent: &Parent) -> String {
    match parent {
        Parent::ActiveLeaf => String::new(),
        Parent::Root => ",\"parentId\":null".to_owned(),
        Parent::Id(id) => format!(",\"parentId\":{}", json_string(id)),
    }
}

/// Where the message is stored: its parent's id, `null` for a root. What a follower needs to
/// place it, whatever the request said (an omitted, unknown or looping parent).
fn stored_parent_json(parent_id: Option<&str>) -> String {
    parent_id.map_or("null".to_owned(), json_string)
}

/// The event's JSON payload; messages are spliced in as stored.
fn payload(event: &ChangeEvent) -> String {
    let sid = json_string(&event.key.session_id);
    match &event.change {
        Change::Append {
            message,
            parent,
            inserted,
        } => format!(
            "{{\"sessionId\":{sid},\"message\":{}{},\"storedParentId\":{},\"inserted\":{inserted}}}",
            message.json(),
            parent_field(parent),
            stored_parent_json(message.parent_id.as_deref())
        ),
        Change::Update { message } => {
            format!("{{\"sessionId\":{sid},\"message\":{}}}", message.json())
        }
        Change::Delete { message_ids } => {
            json!({"sessionId": event.key.session_id, "messageIds": message_ids}).to_string()
        }
        Change::Clear => format!("{{\"sessionId\":{sid}}}"),
        Change::Import { message, parent_id } => format!(
            "{{\"sessionId\":{sid},\"message\":{},\"parentId\":{}}}",
            message.json(),
            stored_parent_json(parent_id.as_deref())
        ),
        Change::Compaction { compaction } | Change::Compact { compaction } => {
            json!({"sessionId": event.key.session_id, "compaction": wire::compaction(compaction)})
                .to_string()
        }
        Change::Error { message } => {
            json!({"sessionId": event.key.session_id, "error": message}).to_string()
        }
        Change::Status { status } => {
            let mut payload = json!({
                "sessionId": event.key.session_id,
                "phase": status.phase.name(),
                "tokenEstimate": status.token_estimate,
                "tokenThreshold": status.token_threshold,
            });
            if let Some(before) = status.compacted_tokens_before {
                payload["compacted"] = json!({ "tokensBefore": before });
            }
            payload.to_string()
        }
        Change::Session { action } => {
            json!({"sessionId": event.key.session_id, "action": action.name()}).to_string()
        }
    }
}

fn to_sse(epoch: u64, event: &ChangeEvent) -> Event {
    Event::default()
        .event(event.change.name())
        .id(format!("{epoch}-{}", event.position))
        .data(payload(event))
}
