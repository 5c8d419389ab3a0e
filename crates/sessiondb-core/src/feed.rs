//! Change events and their fan-out.
//!
//! A backend publishes one event per applied op after the transaction that holds it is durable,
//! from the single place that orders commits, so subscribers see events in commit order. Each
//! subscriber has a bounded buffer: publishing never blocks and never fails a write. When a
//! buffer is full the event is dropped for that subscriber, which then receives
//! [`FeedItem::Lagged`] with the number it missed: in order, before any later event, or as soon
//! as it has read everything buffered.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use futures::Stream;
use futures::channel::mpsc;

use crate::message::StoredMessage;
use crate::registry::Compaction;
use crate::store::{Parent, SessionKey};

/// What happened to a session's registry record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionAction {
    Created,
    Updated,
    Deleted,
}

impl SessionAction {
    pub fn name(self) -> &'static str {
        match self {
            SessionAction::Created => "created",
            SessionAction::Updated => "updated",
            SessionAction::Deleted => "deleted",
        }
    }
}

/// Where a compaction run stands: `Compacting` while its summary is being written (a model call
/// can take seconds), then `Idle`. Published around every run that asks a summarizer (the
/// reference's `cf_agent_session` status), so a client can show that one is under way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompactionPhase {
    Compacting,
    Idle,
}

impl CompactionPhase {
    pub fn name(self) -> &'static str {
        match self {
            CompactionPhase::Compacting => "compacting",
            CompactionPhase::Idle => "idle",
        }
    }
}

/// A session's token estimate as compaction judges it (the active or compacted path with
/// summaries in place of what they cover, plus the frozen system prompt) at a phase of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompactionStatus {
    pub phase: CompactionPhase,
    pub token_estimate: u64,
    /// The session's `compactAfter` setting.
    pub token_threshold: Option<u64>,
    /// On the `Idle` status that ends a run which stored a summary: the estimate before it.
    pub compacted_tokens_before: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Also published for an idempotent re-append (`inserted: false`), which writes nothing.
    Append {
        message: StoredMessage,
        parent: Parent,
        inserted: bool,
    },
    Update {
        message: StoredMessage,
    },
    /// The ids as the caller passed them.
    Delete {
        message_ids: Vec<String>,
    },
    Clear,
    Import {
        message: StoredMessage,
        parent_id: Option<String>,
    },
    /// Stored by `add_compaction`.
    Compaction {
        compaction: Compaction,
    },
    /// Stored by `compact` (its own overlay, from a summarizer).
    Compact {
        compaction: Compaction,
    },
    Session {
        action: SessionAction,
    },
    /// Something failed outside a write (a failed auto-compaction); nothing was written.
    Error {
        message: String,
    },
    /// A compaction run began or ended; nothing was written by the status itself.
    Status {
        status: CompactionStatus,
    },
}

impl Change {
    /// The event name used on the wire.
    pub fn name(&self) -> &'static str {
        match self {
            Change::Append { .. } => "append",
            Change::Update { .. } => "update",
            Change::Delete { .. } => "delete",
            Change::Clear => "clear",
            Change::Import { .. } => "import",
            Change::Compaction { .. } => "compaction",
            Change::Compact { .. } => "compact",
            Change::Session { .. } => "session",
            Change::Error { .. } => "error",
            Change::Status { .. } => "status",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangeEvent {
    /// Position in this feed; strictly increasing in publish (= commit) order.
    pub position: u64,
    pub key: SessionKey,
    pub change: Change,
}

/// Which events a subscriber receives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FeedFilter {
    All,
    Namespace(String),
    Session(SessionKey),
}

impl FeedFilter {
    fn accepts(&self, key: &SessionKey) -> bool {
        match self {
            FeedFilter::All => true,
            FeedFilter::Namespace(ns) => &key.namespace == ns,
            FeedFilter::Session(k) => k == key,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FeedItem {
    Event(Arc<ChangeEvent>),
    /// This many events were dropped because the subscriber's buffer was full.
    Lagged {
        missed: u64,
    },
}

#[derive(Debug)]
struct Subscriber {
    filter: FeedFilter,
    sender: mpsc::Sender<FeedItem>,
    /// Events dropped and not yet reported; shared with the [`Subscription`].
    missed: Arc<AtomicU64>,
}

#[derive(Debug, Default)]
struct FeedState {
    /// Position of the last published event.
    position: u64,
    subscribers: Vec<Subscriber>,
    /// The newest published events, oldest first, for subscribers that resume.
    retained: VecDeque<Arc<ChangeEvent>>,
}

/// The publish side, owned by a backend.
#[derive(Debug, Clone)]
pub struct ChangeFeed {
    state: Arc<Mutex<FeedState>>,
    buffer: usize,
    retain: usize,
    epoch: u64,
}

impl ChangeFeed {
    /// `buffer` is how many undelivered events a subscriber may hold before it lags; the last
    /// `retain` events stay available to [`ChangeFeed::subscribe_after`]. `epoch` tells this
    /// feed's positions apart from another process's (positions restart at 1 with each feed).
    pub fn new(buffer: usize, retain: usize, epoch: u64) -> Self {
        Self {
            state: Arc::default(),
            buffer: buffer.max(1),
            retain,
            epoch,
        }
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    pub fn subscribe(&self, filter: FeedFilter) -> Subscription {
        let mut state = self.lock();
        let position = state.position;
        Self::attach_after(&mut state, filter, self.buffer, Vec::new(), position)
    }

    /// Subscribes and first delivers the retained events after `position` that the filter
    /// accepts. `None` when events after `position` were already evicted, or `position` was
    /// never published: then the subscriber cannot know what it missed.
    pub fn subscribe_after(&self, filter: FeedFilter, position: u64) -> Option<Subscription> {
        self.subscribe_with_backlog(filter, Vec::new(), position)
    }

    /// [`ChangeFeed::subscribe_after`] for a position older than the retained events, for a
    /// backend that keeps more of them elsewhere (its database): `backlog` holds the events
    /// after that position up to `through` that the filter accepts, oldest first, and the
    /// retained ones after `through` follow them. `None` when the retained events no longer
    /// reach back to `through`.
    pub fn subscribe_with_backlog(
        &self,
        filter: FeedFilter,
        backlog: Vec<ChangeEvent>,
        through: u64,
    ) -> Option<Subscription> {
        let mut state = self.lock();
        let oldest_kept = state
            .retained
            .front()
            .map_or(state.position + 1, |e| e.position);
        if through > state.position || through + 1 < oldest_kept {
            return None;
        }
        Some(Self::attach_after(
            &mut state,
            filter,
            self.buffer,
            backlog,
            through,
        ))
    }

    /// Attaches a subscriber that first receives `backlog`, then the retained events after
    /// `after` that its filter accepts, then everything published from now on.
    fn attach_after(
        state: &mut FeedState,
        filter: FeedFilter,
        buffer: usize,
        backlog: Vec<ChangeEvent>,
        after: u64,
    ) -> Subscription {
        let retained = state.retained.iter().filter(|e| e.position > after);
        let retained = retained.filter(|e| filter.accepts(&e.key)).cloned();
        let replay: Vec<_> = backlog.into_iter().map(Arc::new).chain(retained).collect();
        // Capacity covers the replay, so it never drops an event.
        let (mut sender, receiver) = mpsc::channel(buffer.max(replay.len()));
        for event in replay {
            let _ = sender.try_send(FeedItem::Event(event));
        }
        let missed = Arc::new(AtomicU64::new(0));
        state.subscribers.push(Subscriber {
            filter,
            sender,
            missed: missed.clone(),
        });
        Subscription { receiver, missed }
    }

    /// Publishes events in order, numbering them after the last position. Never blocks;
    /// subscribers that went away are dropped.
    pub fn publish(&self, events: impl IntoIterator<Item = (SessionKey, Change)>) {
        let mut state = self.lock();
        for (key, change) in events {
            let position = state.position + 1;
            self.deliver(&mut state, position, key, change, true);
        }
    }

    /// Publishes events that carry their own positions (a backend whose positions come from its
    /// database). Positions must increase; an event at or below the last published position was
    /// published already and is skipped.
    pub fn publish_numbered(&self, events: impl IntoIterator<Item = (u64, SessionKey, Change)>) {
        let mut state = self.lock();
        for (position, key, change) in events {
            if position > state.position {
                self.deliver(&mut state, position, key, change, true);
            }
        }
    }

    /// Delivers an event that records no write to live subscribers only: it takes no position
    /// of its own (it carries the last published one) and is not retained for resumption.
    pub fn notify(&self, key: SessionKey, change: Change) {
        let mut state = self.lock();
        let position = state.position;
        self.deliver(&mut state, position, key, change, false);
    }

    /// The last published position.
    pub fn position(&self) -> u64 {
        self.lock().position
    }

    /// Starts numbering after `position` (a feed whose positions continue a database's); only
    /// before anything is published.
    pub fn starting_after(self, position: u64) -> Self {
        {
            let mut state = self.lock();
            debug_assert!(state.position == 0 && state.retained.is_empty());
            state.position = position;
        }
        self
    }

    fn deliver(
        &self,
        state: &mut FeedState,
        position: u64,
        key: SessionKey,
        change: Change,
        retain: bool,
    ) {
        state.position = position;
        let event = Arc::new(ChangeEvent {
            position,
            key,
            change,
        });
        if retain && self.retain > 0 {
            if state.retained.len() == self.retain {
                state.retained.pop_front();
            }
            state.retained.push_back(event.clone());
        }
        state.subscribers.retain_mut(|sub| {
            if !sub.filter.accepts(&event.key) {
                return !sub.sender.is_closed();
            }
            let missed = sub.missed.swap(0, Ordering::AcqRel);
            if missed > 0 {
                match sub.sender.try_send(FeedItem::Lagged { missed }) {
                    Ok(()) => {}
                    Err(e) if e.is_disconnected() => return false,
                    Err(_) => {
                        sub.missed.fetch_add(missed + 1, Ordering::AcqRel);
                        return true;
                    }
                }
            }
            match sub.sender.try_send(FeedItem::Event(event.clone())) {
                Ok(()) => true,
                Err(e) if e.is_disconnected() => false,
                Err(_) => {
                    sub.missed.fetch_add(1, Ordering::AcqRel);
                    true
                }
            }
        });
    }

    /// Subscribers currently attached.
    pub fn subscriber_count(&self) -> usize {
        self.lock().subscribers.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FeedState> {
        // A panic while holding the lock leaves the state consistent (plain pushes and counters),
        // so a poisoned lock is still safe to use.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A stream of [`FeedItem`]s. Dropping it unsubscribes.
#[derive(Debug)]
pub struct Subscription {
    receiver: mpsc::Receiver<FeedItem>,
    missed: Arc<AtomicU64>,
}

impl Subscription {
    /// Takes an already delivered item (or a lag report) without waiting.
    pub fn try_next(&mut self) -> Option<FeedItem> {
        self.receiver.try_recv().ok().or_else(|| self.take_lag())
    }

    fn take_lag(&self) -> Option<FeedItem> {
        let missed = self.missed.swap(0, Ordering::AcqRel);
        (missed > 0).then_some(FeedItem::Lagged { missed })
    }
}

impl Stream for Subscription {
    type Item = FeedItem;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<FeedItem>> {
        match Pin::new(&mut self.receiver).poll_next(cx) {
            Poll::Ready(Some(item)) => Poll::Ready(Some(item)),
            // Everything buffered was read: report what was dropped meanwhile. Events are only
            // dropped while the buffer is full, so no wake-up is lost by checking here.
            other => match self.take_lag() {
                Some(lag) => Poll::Ready(Some(lag)),
                None => other,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> SessionKey {
        SessionKey::new("", s).unwrap()
    }

    #[test]
    fn full_buffer_reports_lag_and_never_blocks() {
        let feed = ChangeFeed::new(1, 0, 1);
        let mut sub = feed.subscribe(FeedFilter::All);
        for _ in 0..5 {
            feed.publish([(key("a"), Change::Clear)]);
        }
        // Capacity is buffer + one slot per sender.
        assert!(matches!(sub.try_next(), Some(FeedItem::Event(e)) if e.position == 1));
        assert!(matches!(sub.try_next(), Some(FeedItem::Event(e)) if e.position == 2));
        assert_eq!(sub.try_next(), Some(FeedItem::Lagged { missed: 3 }));
        assert_eq!(sub.try_next(), None);
        for _ in 0..3 {
            feed.publish([(key("a"), Change::Clear)]);
        }
        // A lag between deliveries is reported in order, before the later event.
        assert!(matches!(sub.try_next(), Some(FeedItem::Event(e)) if e.position == 6));
        assert!(matches!(sub.try_next(), Some(FeedItem::Event(e)) if e.position == 7));
        feed.publish([(key("a"), Change::Clear)]);
        assert_eq!(sub.try_next(), Some(FeedItem::Lagged { missed: 1 }));
        assert!(matches!(sub.try_next(), Some(FeedItem::Event(e)) if e.position == 9));
    }

    #[test]
    fn filters_and_dropped_subscribers() {
        let feed = ChangeFeed::new(8, 0, 1);
        let mut only_b = feed.subscribe(FeedFilter::Session(key("b")));
        let gone = feed.subscribe(FeedFilter::All);
        drop(gone);
        feed.publish([(key("a"), Change::Clear), (key("b"), Change::Clear)]);
        assert!(matches!(only_b.try_next(), Some(FeedItem::Event(e)) if e.key == key("b")));
        assert_eq!(only_b.try_next(), None);
        assert_eq!(feed.subscriber_count(), 1);
    }

    #[test]
    fn resumes_within_the_retained_window_only() {
        let feed = ChangeFeed::new(1, 3, 1);
        for s in ["a", "b", "a", "a"] {
            feed.publish([(key(s), Change::Clear)]);
        }
        // Positions 2..=4 are retained; resuming after 1 replays them (filtered), then goes live.
        let mut sub = feed
            .subscribe_after(FeedFilter::Session(key("a")), 1)
            .unwrap();
        feed.publish([(key("a"), Change::Clear)]);
        let positions: Vec<u64> = std::iter::from_fn(|| sub.try_next())
            .map(|item| match item {
                FeedItem::Event(e) => e.position,
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        assert_eq!(positions, [3, 4, 5]);
        assert!(
            feed.subscribe_after(FeedFilter::All, 0).is_none(),
            "1 and 2 are gone"
        );
        assert!(
            feed.subscribe_after(FeedFilter::All, 9).is_none(),
            "never published"
        );
        assert!(feed.subscribe_after(FeedFilter::All, 5).is_some());

        // What the backend read elsewhere comes first, then the retained events after it.
        let backlog = |positions: &[u64]| {
            let event = |position| ChangeEvent {
                position,
                key: key("a"),
                change: Change::Clear,
            };
            positions.iter().copied().map(event).collect::<Vec<_>>()
        };
        let mut sub = feed
            .subscribe_with_backlog(FeedFilter::All, backlog(&[1, 2, 3]), 3)
            .unwrap();
        let positions: Vec<u64> = std::iter::from_fn(|| sub.try_next())
            .map(|item| match item {
                FeedItem::Event(e) => e.position,
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        assert_eq!(positions, [1, 2, 3, 4, 5]);
        assert!(
            feed.subscribe_with_backlog(FeedFilter::All, backlog(&[1]), 1)
                .is_none(),
            "2 is no longer retained: the backlog would leave a gap"
        );
    }
}
