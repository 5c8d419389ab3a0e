//! The change feed across instances.
//!
//! A writing transaction takes its events' positions from the one `feed_counter` row as its last
//! statement, inserts one `feed` row per event and notifies [`CHANNEL`]; the counter row stays
//! locked until the commit, so positions become visible in order. Every instance publishes
//! events to its own subscribers strictly in position order from one place, [`FeedSync`]:
//! its own writes right after they commit (first reading any earlier positions it has not
//! published from the table), and other instances' writes when a notification — or, in case one
//! is lost, a periodic tick — makes it read the rows after the last position it published.
//!
//! Events that record no write (a compaction run's status, a failed auto-compaction) take no
//! position: the announcing instance delivers them to its own live subscribers at once and
//! sends them to the others on [`ANNOUNCE_CHANNEL`], which deliver them to theirs after the
//! writes the announcer had published before them.

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::GenericClient;
use serde_json::{Value, json};
use sessiondb_core::message::{MessageId, StoredRow, role_of};
use sessiondb_core::{
    Change, ChangeEvent, ChangeFeed, Compaction, CompactionPhase, CompactionStatus, FeedFilter,
    Parent, SessionAction, SessionKey, StoreError, StoredMessage,
};
use tokio::sync::{Mutex, mpsc, watch};

use crate::planner;
use crate::sql::{Param, Result, backend_error, exec, get, row, rows};

/// The notification channel: its payload is the last position a transaction wrote.
pub(crate) const CHANNEL: &str = "sessiondb_feed";

/// The channel of announcements; its payload is [`announcement`]'s.
pub(crate) const ANNOUNCE_CHANNEL: &str = "sessiondb_announce";

/// How often an instance looks for events it was not notified of.
pub(crate) const POLL_INTERVAL: Duration = Duration::from_millis(500);

/// How often an instance prunes the feed table.
const PRUNE_INTERVAL: Duration = Duration::from_secs(60);

/// Events kept in the table beyond the newest; older rows are pruned.
pub(crate) const TABLE_RETAIN: i64 = 100_000;

/// An event as stored: its kind, its small fields, and the message JSON it carries.
struct Encoded {
    kind: &'static str,
    meta: String,
    message: Option<String>,
}

fn message_meta(m: &StoredMessage) -> Value {
    json!({
        "id": m.id, "role": m.role, "parentId": m.parent_id, "seq": m.seq,
        "createdAt": m.created_at, "updatedAt": m.updated_at,
        "tokens": m.token_estimate, "bytes": m.bytes,
    })
}

fn compaction_meta(c: &Compaction) -> Value {
    json!({
        "id": c.id, "summary": c.summary, "from": c.from_message_id, "to": c.to_message_id,
        "createdAt": c.created_at,
    })
}

fn encode(change: &Change) -> Encoded {
    let (meta, message) = match change {
        Change::Append {
            message,
            parent,
            inserted,
        } => {
            let parent = match parent {
                Parent::ActiveLeaf => json!("leaf"),
                Parent::Root => json!("root"),
                Parent::Id(id) => json!({ "id": id }),
            };
            let meta =
                json!({"row": message_meta(message), "parent": parent, "inserted": inserted});
            (meta, Some(message))
        }
        Change::Update { message } => (json!({"row": message_meta(message)}), Some(message)),
        Change::Import { message, parent_id } => (
            json!({"row": message_meta(message), "parentId": parent_id}),
            Some(message),
        ),
        Change::Delete { message_ids } => (json!({ "ids": message_ids }), None),
        Change::Clear => (json!({}), None),
        Change::Compaction { compaction } | Change::Compact { compaction } => {
            (compaction_meta(compaction), None)
        }
        Change::Session { action } => (json!({"action": action.name()}), None),
        Change::Error { message } => (json!({ "message": message }), None),
        Change::Status { status } => (
            json!({
                "phase": status.phase.name(),
                "tokenEstimate": status.token_estimate,
                "tokenThreshold": status.token_threshold,
                "tokensBefore": status.compacted_tokens_before,
            }),
            None,
        ),
    };
    Encoded {
        kind: change.name(),
        meta: meta.to_string(),
        message: message.map(|m| m.json().to_owned()),
    }
}

/// An announcement as sent to other instances: the announcing instance, the last position it
/// had published (receivers publish up to there first), the session and the event.
pub(crate) fn announcement(instance: u64, after: u64, key: &SessionKey, change: &Change) -> String {
    let Encoded { kind, meta, .. } = encode(change);
    json!({
        "from": instance, "after": after, "namespace": key.namespace,
        "sessionId": key.session_id, "kind": kind, "meta": meta,
    })
    .to_string()
}

/// An [`announcement`] received.
struct Announced {
    from: u64,
    after: u64,
    key: SessionKey,
    change: Change,
}

fn parse_announcement(payload: &str) -> Result<Announced> {
    let v: Value = serde_json::from_str(payload).map_err(|e| corrupt(&e.to_string()))?;
    let number = |field| v[field].as_u64().ok_or_else(|| corrupt(field));
    Ok(Announced {
        from: number("from")?,
        after: number("after")?,
        key: SessionKey {
            namespace: text(&v, "namespace")?,
            session_id: text(&v, "sessionId")?,
        },
        change: decode(&text(&v, "kind")?, &text(&v, "meta")?, None)?,
    })
}

/// This instance's announcements on their way to the others, sent in order by a task of their
/// own. Best effort, as the announcements are: one the database cannot take (unreachable, or a
/// payload over PostgreSQL's 8,000 bytes) reaches this instance's subscribers only.
#[derive(Debug)]
pub(crate) struct Announcer {
    /// How many announcements were queued, and the queue (numbered as they were).
    queue: std::sync::Mutex<(u64, mpsc::UnboundedSender<(u64, String)>)>,
    /// The number of the last announcement sent (or given up on).
    sent: watch::Receiver<u64>,
}

impl Announcer {
    /// Starts the task that sends announcements on `pool`'s connections until the store is
    /// dropped.
    pub fn start(pool: deadpool_postgres::Pool, runtime: &tokio::runtime::Handle) -> Self {
        let (queue, mut queued) = mpsc::unbounded_channel::<(u64, String)>();
        let (sending, sent) = watch::channel(0);
        runtime.spawn(async move {
            while let Some((number, payload)) = queued.recv().await {
                if let Ok(client) = pool.get().await {
                    let notify = "SELECT pg_notify($1, $2)";
                    let _ = exec(&client, notify, &[&ANNOUNCE_CHANNEL, &payload]).await;
                }
                sending.send_replace(number);
            }
        });
        Self {
            queue: std::sync::Mutex::new((0, queue)),
            sent,
        }
    }

    pub fn announce(&self, payload: String) {
        let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        queue.0 += 1;
        let number = queue.0;
        let _ = queue.1.send((number, payload));
    }

    /// Returns once every announcement queued before the call has been sent (or given up on),
    /// so what this instance writes next reaches the others after them: PostgreSQL delivers
    /// notifications in commit order, and [`follow`] handles them in the order it hears them.
    pub async fn flushed(&self) {
        let queued = self.queue.lock().unwrap_or_else(|p| p.into_inner()).0;
        if *self.sent.borrow() >= queued {
            return;
        }
        let mut sent = self.sent.clone();
        // Err: the sending task is gone with the store, and nothing will be sent any more.
        let _ = sent.wait_for(|&number| number >= queued).await;
    }
}

fn corrupt(what: &str) -> StoreError {
    StoreError::Corrupt(format!("feed event: {what}"))
}

fn text(v: &Value, field: &str) -> Result<String> {
    v[field]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| corrupt(field))
}

fn int(v: &Value, field: &str) -> Result<i64> {
    v[field].as_i64().ok_or_else(|| corrupt(field))
}

fn decode_message(meta: &Value, json: Option<String>) -> Result<StoredMessage> {
    let r = &meta["row"];
    let row = StoredRow {
        id: text(r, "id")?.into(),
        role: role_of(&text(r, "role")?),
        parent_id: r["parentId"].as_str().map(MessageId::from),
        seq: int(r, "seq")?,
        created_at: int(r, "createdAt")?,
        updated_at: r["updatedAt"].as_i64(),
        token_estimate: int(r, "tokens")? as u64,
    };
    let json = json.ok_or_else(|| corrupt("message"))?;
    Ok(StoredMessage::from_stored(
        row,
        json,
        int(r, "bytes")? as u64,
    ))
}

fn decode(kind: &str, meta: &str, message: Option<String>) -> Result<Change> {
    let meta: Value = serde_json::from_str(meta).map_err(|e| corrupt(&e.to_string()))?;
    let compaction = |meta: &Value| -> Result<Compaction> {
        Ok(Compaction {
            id: text(meta, "id")?,
            summary: text(meta, "summary")?,
            from_message_id: text(meta, "from")?,
            to_message_id: text(meta, "to")?,
            created_at: int(meta, "createdAt")?,
        })
    };
    Ok(match kind {
        "append" => Change::Append {
            parent: match &meta["parent"] {
                Value::String(s) if s == "root" => Parent::Root,
                Value::Object(o) => Parent::Id(
                    o.get("id")
                        .and_then(Value::as_str)
                        .ok_or_else(|| corrupt("parent"))?
                        .to_owned(),
                ),
                _ => Parent::ActiveLeaf,
            },
            inserted: meta["inserted"]
                .as_bool()
                .ok_or_else(|| corrupt("inserted"))?,
            message: decode_message(&meta, message)?,
        },
        "update" => Change::Update {
            message: decode_message(&meta, message)?,
        },
        "import" => Change::Import {
            parent_id: meta["parentId"].as_str().map(str::to_owned),
            message: decode_message(&meta, message)?,
        },
        "delete" => Change::Delete {
            message_ids: meta["ids"]
                .as_array()
                .ok_or_else(|| corrupt("ids"))?
                .iter()
                .map(|id| id.as_str().map(str::to_owned).ok_or_else(|| corrupt("ids")))
                .collect::<Result<_>>()?,
        },
        "clear" => Change::Clear,
        "compaction" => Change::Compaction {
            compaction: compaction(&meta)?,
        },
        "compact" => Change::Compact {
            compaction: compaction(&meta)?,
        },
        "session" => Change::Session {
            action: match meta["action"].as_str() {
                Some("created") => SessionAction::Created,
                Some("updated") => SessionAction::Updated,
                Some("deleted") => SessionAction::Deleted,
                _ => return Err(corrupt("action")),
            },
        },
        "error" => Change::Error {
            message: text(&meta, "message")?,
        },
        "status" => Change::Status {
            status: CompactionStatus {
                phase: match meta["phase"].as_str() {
                    Some("compacting") => CompactionPhase::Compacting,
                    Some("idle") => CompactionPhase::Idle,
                    _ => return Err(corrupt("phase")),
                },
                token_estimate: meta["tokenEstimate"]
                    .as_u64()
                    .ok_or_else(|| corrupt("tokenEstimate"))?,
                token_threshold: meta["tokenThreshold"].as_u64(),
                compacted_tokens_before: meta["tokensBefore"].as_u64(),
            },
        },
        other => return Err(corrupt(&format!("unknown kind `{other}`"))),
    })
}

/// Takes positions for a transaction's events from the counter, stores the events and notifies
/// the other instances, as one statement (so it can be pipelined with `COMMIT`).
pub(crate) const RECORD: &str = "WITH counter AS (
         UPDATE feed_counter SET position = position + $3 RETURNING position
     ), stored AS (
         INSERT INTO feed (namespace, session_id, position, kind, meta, message)
         SELECT $1, $2, counter.position - $3 + e.ord, e.kind, e.meta, e.message
           FROM counter,
                unnest($4::TEXT[], $5::TEXT[], $6::TEXT[]) WITH ORDINALITY AS e(kind, meta, message, ord)
     )
     SELECT position, pg_notify($7, position::TEXT) FROM counter";

/// Records a transaction's events in the feed; returns the position of the first. Must be the
/// transaction's last statement but its commit: the counter row stays locked until then.
pub(crate) async fn record<C: GenericClient>(
    c: &C,
    key: &SessionKey,
    changes: &[Change],
) -> Result<u64> {
    let count = changes.len() as i64;
    let encoded: Vec<Encoded> = changes.iter().map(encode).collect();
    let kinds: Vec<&str> = encoded.iter().map(|e| e.kind).collect();
    let metas: Vec<&str> = encoded.iter().map(|e| e.meta.as_str()).collect();
    let messages: Vec<Option<&str>> = encoded.iter().map(|e| e.message.as_deref()).collect();
    let last: i64 = get(
        &row(
            c,
            RECORD,
            &[
                &key.namespace,
                &key.session_id,
                &count,
                &kinds,
                &metas,
                &messages,
                &CHANNEL,
            ],
        )
        .await?
        .ok_or_else(|| StoreError::Corrupt("the feed counter row is missing".into()))?,
        0,
    )?;
    Ok((last - count + 1) as u64)
}

/// Publishes the feed to this instance's subscribers in position order.
#[derive(Debug)]
pub(crate) struct FeedSync {
    pub feed: ChangeFeed,
    /// Held while publishing, so one publisher at a time moves the feed forward.
    publishing: Mutex<()>,
}

impl FeedSync {
    pub fn new(feed: ChangeFeed) -> Arc<Self> {
        Arc::new(Self {
            feed,
            publishing: Mutex::new(()),
        })
    }

    /// Publishes a committed transaction's events, which took positions `first..`, after any
    /// earlier ones not yet published (every earlier position is committed: see [`record`]).
    pub async fn publish_committed<C: GenericClient>(
        &self,
        client: &C,
        first: u64,
        events: Vec<(SessionKey, Change)>,
    ) -> Result<()> {
        let _turn = self.publishing.lock().await;
        let last = first + events.len() as u64 - 1;
        if self.feed.position() >= last {
            return Ok(());
        }
        if self.feed.position() + 1 < first {
            self.read_until(client, Some(first)).await?;
        }
        self.feed.publish_numbered(
            (first..)
                .zip(events)
                .map(|(position, (key, change))| (position, key, change)),
        );
        Ok(())
    }

    /// Publishes every stored event after the last one published.
    pub async fn catch_up<C: GenericClient>(&self, client: &C) -> Result<()> {
        let _turn = self.publishing.lock().await;
        self.read_until(client, None).await
    }

    /// Publishes the stored events after the last one published, up to `position`.
    pub async fn catch_up_to<C: GenericClient>(&self, client: &C, position: u64) -> Result<()> {
        let _turn = self.publishing.lock().await;
        self.read_until(client, position.checked_add(1)).await
    }

    /// Reads and publishes stored events after the last published position, below `before`.
    async fn read_until<C: GenericClient>(&self, client: &C, before: Option<u64>) -> Result<()> {
        // A bound past what a position can be (an unreadable notification's) bounds nothing.
        let before = before
            .and_then(|b| i64::try_from(b).ok())
            .unwrap_or(i64::MAX);
        loop {
            let after = self.feed.position() as i64;
            let page = rows(
                client,
                "SELECT position, namespace, session_id, kind, meta, message FROM feed
                  WHERE position > $1 AND position < $2 ORDER BY position LIMIT 256",
                &[&after, &before],
            )
            .await?;
            let events = page.iter().map(event_of).collect::<Result<Vec<_>>>()?;
            let numbered = events.into_iter().map(|e| (e.position, e.key, e.change));
            self.feed.publish_numbered(numbered);
            if page.len() < 256 {
                return Ok(());
            }
        }
    }
}

/// A row of `feed` (`position, namespace, session_id, kind, meta, message`) as its event.
fn event_of(r: &tokio_postgres::Row) -> Result<ChangeEvent> {
    Ok(ChangeEvent {
        position: get::<i64>(r, 0)? as u64,
        key: SessionKey {
            namespace: get(r, 1)?,
            session_id: get(r, 2)?,
        },
        change: decode(get(r, 3)?, get(r, 4)?, get(r, 5)?)?,
    })
}

/// What a subscriber resuming from the feed table may be sent at once, of the events its filter
/// accepts: one that missed more starts over (a `reset`), as it would beyond the table. Each
/// such subscriber holds its own copy of them, unlike the events kept in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BacklogLimits {
    pub events: usize,
    /// Bytes of the events' messages.
    pub bytes: u64,
}

impl Default for BacklogLimits {
    fn default() -> Self {
        Self {
            events: 16_384,
            bytes: 64 << 20,
        }
    }
}

/// The events of `feed` after `$1` up to `$2` of namespace `$3` and session `$4` (`NULL`: any).
const BACKLOG_WHERE: &str = "position > $1 AND position <= $2
    AND ($3::text IS NULL OR namespace = $3) AND ($4::text IS NULL OR session_id = $4)";

/// The events after `position` up to `through` that `filter` accepts, oldest first, from the
/// table; `None` when the table no longer holds all of them, or they are more than `limits`.
/// Read in one snapshot, so pruning cannot take rows from between the statements.
pub(crate) async fn backlog<C: GenericClient>(
    c: &C,
    filter: FeedFilter,
    position: u64,
    through: u64,
    limits: BacklogLimits,
) -> Result<Option<Vec<ChangeEvent>>> {
    let oldest = row(c, "SELECT min(position) FROM feed", &[]).await?;
    let oldest: Option<i64> = oldest.as_ref().map(|r| get(r, 0)).transpose()?.flatten();
    let kept = oldest.map_or(position >= through, |oldest| oldest as u64 <= position + 1);
    if !kept {
        return Ok(None);
    }
    let (namespace, session_id) = match &filter {
        FeedFilter::All => (None, None),
        FeedFilter::Namespace(namespace) => (Some(namespace.as_str()), None),
        FeedFilter::Session(key) => (Some(key.namespace.as_str()), Some(key.session_id.as_str())),
    };
    let (after, through) = (position as i64, through as i64);
    let params: [Param<'_>; 4] = [&after, &through, &namespace, &session_id];
    let size = format!(
        "SELECT count(*), coalesce(sum(octet_length(message)), 0)::bigint FROM feed
          WHERE {BACKLOG_WHERE}"
    );
    let size = row(c, &size, &params).await?;
    let (events, bytes): (i64, i64) = match &size {
        Some(r) => (get(r, 0)?, get(r, 1)?),
        None => (0, 0),
    };
    if events as u64 > limits.events as u64 || bytes as u64 > limits.bytes {
        return Ok(None);
    }
    let select = format!(
        "SELECT position, namespace, session_id, kind, meta, message FROM feed
          WHERE {BACKLOG_WHERE} ORDER BY position"
    );
    let page = rows(c, &select, &params).await?;
    page.iter().map(event_of).collect::<Result<_>>().map(Some)
}

/// What the listening connection heard.
enum Heard {
    /// The last position a committed transaction took.
    Committed(u64),
    Announced(String),
}

/// Follows other instances' writes and announcements until the store is dropped: LISTENs on a
/// dedicated connection and catches up on every notification and every [`POLL_INTERVAL`];
/// delivers the announcements of instances other than `instance` after catching up to them.
pub(crate) async fn follow(
    config: tokio_postgres::Config,
    pool: deadpool_postgres::Pool,
    sync: Arc<FeedSync>,
    instance: u64,
) {
    let mut analyzed = false;
    let mut upkept = std::time::Instant::now();
    let mut pruned = std::time::Instant::now();
    loop {
        let (wake_tx, mut wake) = tokio::sync::mpsc::unbounded_channel::<Heard>();
        let listening = async {
            let (client, mut connection) = config
                .connect(tokio_postgres::NoTls)
                .await
                .map_err(backend_error)?;
            let driver = tokio::spawn(async move {
                let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
                while let Some(Ok(message)) = futures::StreamExt::next(&mut messages).await {
                    if let tokio_postgres::AsyncMessage::Notification(note) = message {
                        let heard = if note.channel() == ANNOUNCE_CHANNEL {
                            Heard::Announced(note.payload().to_owned())
                        } else {
                            Heard::Committed(note.payload().parse().unwrap_or(u64::MAX))
                        };
                        let _ = wake_tx.send(heard);
                    }
                }
            });
            client
                .batch_execute(&format!("LISTEN {CHANNEL}; LISTEN {ANNOUNCE_CHANNEL}"))
                .await
                .map_err(backend_error)?;
            Ok::<_, StoreError>((client, driver))
        }
        .await;
        let Ok((_listener, driver)) = listening else {
            tokio::time::sleep(POLL_INTERVAL).await;
            continue;
        };
        loop {
            let mut heard = Vec::new();
            match tokio::time::timeout(POLL_INTERVAL, wake.recv()).await {
                Ok(None) => break, // the listening connection closed: listen anew
                Ok(Some(first)) => {
                    heard.push(first);
                    while let Ok(more) = wake.try_recv() {
                        heard.push(more);
                    }
                }
                Err(_) => {}
            }
            let timed_out = heard.is_empty();
            let upkeep_due = upkept.elapsed() >= POLL_INTERVAL;
            // Each note as the position to publish through, then what to deliver. Notes are
            // handled in the order heard, which is the order their transactions committed, each
            // publishing no further than it names: so an announcement sent before a write
            // (`Announcer::flushed`) reaches subscribers before that write does. Only a poll,
            // for notifications lost, reads to the end. This instance's own writes are
            // published by their writers already.
            let notes: Vec<(u64, Option<Announced>)> = heard
                .into_iter()
                .filter_map(|note| match note {
                    Heard::Committed(position) => Some((position, None)),
                    Heard::Announced(payload) => match parse_announcement(&payload) {
                        Ok(a) if a.from != instance => Some((a.after, Some(a))),
                        _ => None,
                    },
                })
                .collect();
            let behind = notes
                .iter()
                .any(|(through, _)| *through > sync.feed.position());
            let client = match timed_out || upkeep_due || behind {
                true => pool.get().await.ok(),
                false => None,
            };
            if timed_out && let Some(client) = &client {
                let _ = sync.catch_up(client).await;
            }
            for (through, announced) in notes {
                if through > sync.feed.position()
                    && let Some(client) = &client
                {
                    let _ = sync.catch_up_to(client, through).await;
                }
                if let Some(a) = announced {
                    sync.feed.notify(a.key, a.change);
                }
            }
            if upkeep_due && let Some(client) = &client {
                upkept = std::time::Instant::now();
                if !analyzed {
                    analyzed = planner::analyze_if_missing(client).await.unwrap_or(false);
                }
                if pruned.elapsed() >= PRUNE_INTERVAL {
                    pruned = std::time::Instant::now();
                    let _ = prune(client).await;
                }
            }
        }
        driver.abort();
    }
}

/// Drops events older than the newest [`TABLE_RETAIN`].
async fn prune<C: GenericClient>(c: &C) -> Result<u64> {
    exec(
        c,
        "DELETE FROM feed WHERE position <= (SELECT position FROM feed_counter) - $1",
        &[&TABLE_RETAIN],
    )
    .await
}

/// The feed's epoch and last position, to start an instance's feed from.
pub(crate) async fn counter<C: GenericClient>(c: &C) -> Result<(u64, u64)> {
    let r = row(c, "SELECT epoch, position FROM feed_counter", &[])
        .await?
        .ok_or_else(|| StoreError::Corrupt("the feed counter row is missing".into()))?;
    Ok((get::<i64>(&r, 0)? as u64, get::<i64>(&r, 1)? as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_change_survives_the_table() {
        let row = StoredRow {
            id: "m1".into(),
            role: role_of("assistant"),
            parent_id: Some("m0".into()),
            seq: 7,
            created_at: 1_700_000_000_000,
            updated_at: Some(1_700_000_000_500),
            token_estimate: 12,
        };
        let message = StoredMessage::from_stored(row, r#"{"id":"m1","role":"assistant"}"#, 30);
        let compaction = Compaction {
            id: "compaction_1".into(),
            summary: "s \"quoted\"".into(),
            from_message_id: "a".into(),
            to_message_id: "b".into(),
            created_at: 5,
        };
        let changes = [
            Change::Append {
                message: message.clone(),
                parent: Parent::Id("m0".into()),
                inserted: true,
            },
            Change::Append {
                message: message.clone(),
                parent: Parent::Root,
                inserted: false,
            },
            Change::Append {
                message: message.clone(),
                parent: Parent::ActiveLeaf,
                inserted: true,
            },
            Change::Update {
                message: message.clone(),
            },
            Change::Import {
                message,
                parent_id: None,
            },
            Change::Delete {
                message_ids: vec!["x".into(), "y".into()],
            },
            Change::Clear,
            Change::Compaction {
                compaction: compaction.clone(),
            },
            Change::Compact { compaction },
            Change::Session {
                action: SessionAction::Deleted,
            },
            Change::Error {
                message: "failed".into(),
            },
            Change::Status {
                status: CompactionStatus {
                    phase: CompactionPhase::Idle,
                    token_estimate: 120,
                    token_threshold: Some(100),
                    compacted_tokens_before: Some(900),
                },
            },
            Change::Status {
                status: CompactionStatus {
                    phase: CompactionPhase::Compacting,
                    token_estimate: 900,
                    token_threshold: None,
                    compacted_tokens_before: None,
                },
            },
        ];
        let key = SessionKey {
            namespace: "ns".into(),
            session_id: "s \"1\"".into(),
        };
        for change in changes {
            let e = encode(&change);
            assert_eq!(e.kind, change.name());
            assert_eq!(decode(e.kind, &e.meta, e.message).unwrap(), change);
            // What announcements carry (events without a message) survives a notification.
            if matches!(change, Change::Error { .. } | Change::Status { .. }) {
                let heard = parse_announcement(&announcement(u64::MAX, 9, &key, &change));
                let heard = heard.unwrap();
                assert_eq!((heard.from, heard.after), (u64::MAX, 9));
                assert_eq!((heard.key, heard.change), (key.clone(), change));
            }
        }
        assert!(decode("append", "{}", None).is_err());
        assert!(decode("nonsense", "{}", None).is_err());
    }
}
