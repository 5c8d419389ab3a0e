//! Change events and their fan-out.
//!
//! A backend publishes one event per applied op after the transaction that holds it is durable,
//! from the single place that orders commits, so subscribers see events in commit order. Each
//! subscriber has a bounded buffer: publishing never blocks and never fails a write. When a
//! buffer is full the event is dropped for that subscriber, which then receives
//! [`FeedItem::Lagged`] with the number it missed: in order, before any later event, or as soon
//! as it has read everything buffered.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use futures::Stream;
use futures::channel::mpsc;

use crate::message::StoredMessage;
use crate::store::{Parent, SessionKey};

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
    next_position: u64,
    subscribers: Vec<Subscriber>,
}

/// The publish side, owned by a backend.
#[derive(Debug, Clone)]
pub struct ChangeFeed {
    state: Arc<Mutex<FeedState>>,
    buffer: usize,
}

impl ChangeFeed {
    /// `buffer` is how many undelivered events a subscriber may hold before it lags.
    pub fn new(buffer: usize) -> Self {
        Self {
            state: Arc::default(),
            buffer: buffer.max(1),
        }
    }

    pub fn subscribe(&self, filter: FeedFilter) -> Subscription {
        let (sender, receiver) = mpsc::channel(self.buffer);
        let missed = Arc::new(AtomicU64::new(0));
        self.lock().subscribers.push(Subscriber {
            filter,
            sender,
            missed: missed.clone(),
        });
        Subscription { receiver, missed }
    }

    /// Publishes events in order. Never blocks; subscribers that went away are dropped.
    pub fn publish(&self, events: impl IntoIterator<Item = (SessionKey, Change)>) {
        let mut state = self.lock();
        for (key, change) in events {
            state.next_position += 1;
            let event = Arc::new(ChangeEvent {
                position: state.next_position,
                key,
                change,
            });
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
        let feed = ChangeFeed::new(1);
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
        let feed = ChangeFeed::new(8);
        let mut only_b = feed.subscribe(FeedFilter::Session(key("b")));
        let gone = feed.subscribe(FeedFilter::All);
        drop(gone);
        feed.publish([(key("a"), Change::Clear), (key("b"), Change::Clear)]);
        assert!(matches!(only_b.try_next(), Some(FeedItem::Event(e)) if e.key == key("b")));
        assert_eq!(only_b.try_next(), None);
        assert_eq!(feed.subscriber_count(), 1);
    }
}
