//! The backend conformance suite of sessiondb.
//!
//! Every case is written once, as an `async fn(Db<S>)` generic over the [`Store`] trait, and
//! every backend instantiates all of them with [`conformance_tests!`]:
//!
//! ```text
//! sessiondb_testkit::conformance_tests!(|| {
//!     let dir = tempfile::tempdir().unwrap();
//!     (sessiondb::Db::new(SqliteStore::open(dir.path()).unwrap()), dir)
//! });
//! ```
//!
//! The factory returns a fresh, empty store plus a guard kept alive for the test's duration.
//! [`model`] holds the property test that drives random operation sequences against a plain
//! in-memory model of the tree.
#![forbid(unsafe_code)]

pub mod cases;
pub mod http_fuzz;
pub mod model;

use futures::StreamExt;
use sessiondb::{
    AppendOptions, Db, FeedItem, HistoryOptions, ImportOptions, Message, Parent, Session, Store,
    StoredMessage, Subscription,
};

pub use futures::executor::block_on;

/// Instantiates every conformance case as a `#[test]` for the store the factory opens.
#[macro_export]
macro_rules! conformance_tests {
    ($factory:expr) => {
        $crate::for_each_case!($crate::__conformance_test, $factory);
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_test {
    ($factory:expr; $($module:ident :: $name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                let (db, _guard) = ($factory)();
                $crate::block_on($crate::cases::$module::$name(db));
            }
        )*
    };
}

/// A text message with an id.
pub fn text(id: &str, role: &str, body: &str) -> Message {
    Message::text(role, body).with_id(id)
}

pub fn under(parent: &str) -> AppendOptions {
    AppendOptions {
        parent: Parent::Id(parent.to_owned()),
        ..Default::default()
    }
}

/// Import options: stored under `parent` (as given) at `created_at`.
pub fn imported(parent: Option<&str>, created_at: i64) -> ImportOptions {
    ImportOptions {
        parent_id: parent.map(str::to_owned),
        created_at,
    }
}

pub fn root() -> AppendOptions {
    AppendOptions {
        parent: Parent::Root,
        ..Default::default()
    }
}

/// Appends `(id, text)` pairs one after another under the active leaf.
pub async fn chain<S: Store>(session: &Session<S>, ids: &[&str]) {
    for (i, id) in ids.iter().enumerate() {
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        session
            .append(
                text(id, role, &format!("message {id}")),
                AppendOptions::default(),
            )
            .await
            .unwrap();
    }
}

/// The runs of consecutive seqs of a walked path (what [`Store::path_runs`] must return).
pub fn runs_of(rows: &[sessiondb::RowStat]) -> Vec<(i64, i64)> {
    let mut runs: Vec<(i64, i64)> = Vec::new();
    for seq in rows.iter().map(|r| r.seq) {
        match runs.last_mut() {
            Some((_, last)) if *last + 1 == seq => *last = seq,
            _ => runs.push((seq, seq)),
        }
    }
    runs
}

pub fn ids(messages: &[StoredMessage]) -> Vec<String> {
    messages.iter().map(|m| m.id.to_string()).collect()
}

pub async fn history_ids<S: Store>(session: &Session<S>, leaf: Option<&str>) -> Vec<String> {
    let options = HistoryOptions {
        leaf: leaf.map(str::to_owned),
        newest_first: false,
    };
    ids(&session.full_history(options).await.unwrap())
}

pub async fn newest_first_ids<S: Store>(session: &Session<S>, leaf: Option<&str>) -> Vec<String> {
    let options = HistoryOptions {
        leaf: leaf.map(str::to_owned),
        newest_first: true,
    };
    ids(&session.full_history(options).await.unwrap())
}

/// Everything already delivered to a subscription, as `(event name, session id)` pairs.
pub fn drain(sub: &mut Subscription) -> Vec<FeedItem> {
    std::iter::from_fn(|| sub.try_next()).collect()
}

pub fn event_names(items: &[FeedItem]) -> Vec<&'static str> {
    items
        .iter()
        .filter_map(|item| match item {
            FeedItem::Event(e) => Some(e.change.name()),
            FeedItem::Lagged { .. } => None,
        })
        .collect()
}

/// The first message of a stream, or `None`.
pub async fn first<S: Store>(
    session: &Session<S>,
    options: HistoryOptions,
) -> Option<StoredMessage> {
    let mut stream = std::pin::pin!(session.history(options));
    stream.next().await.map(|r| r.unwrap())
}

pub fn db_session<S: Store>(db: &Db<S>, id: &str) -> Session<S> {
    db.session(id).unwrap()
}

/// Appends `count` linear messages `m0, m1, …` of about `bytes` bytes each, in batches of 1,000.
pub async fn fill<S: Store>(session: &Session<S>, count: usize, bytes: usize) {
    fill_range(session, 0..count, bytes).await;
}

/// Appends linear messages `m{i}` for `i` in `range`, each `"{i:05} "` and `bytes` bytes of
/// padding: rows of one size below 100,000 have one token estimate too.
pub async fn fill_range<S: Store>(
    session: &Session<S>,
    range: std::ops::Range<usize>,
    bytes: usize,
) {
    let pad = "x".repeat(bytes);
    let ids: Vec<usize> = range.collect();
    for chunk in ids.chunks(1000) {
        let batch = chunk
            .iter()
            .map(|i| Message::text("user", format!("{i:05} {pad}")).with_id(format!("m{i}")))
            .collect();
        session
            .append_all(batch, AppendOptions::default())
            .await
            .unwrap();
    }
}

/// A store for a check to find sound: session `a` (a branch, a deleted message, a picture
/// stored as an attachment) and session `b` of namespace `ns` (an orphan waiting for its
/// parent). Broken as [`CHECK_PROBLEMS`] says, a check reports exactly those.
pub async fn fill_for_check<S: Store>(db: &Db<S>) {
    let a = db.session("a").unwrap();
    chain(&a, &["m1", "m2", "m3"]).await;
    a.append(text("x", "user", "branch"), under("m1"))
        .await
        .unwrap();
    a.delete(&["m2".to_owned()]).await.unwrap();
    let picture = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, [7u8; 2_000]);
    let picture = Message::from_value(serde_json::json!({"id": "p", "role": "user", "parts": [
        {"type": "file", "mediaType": "image/png", "url": format!("data:image/png;base64,{picture}")}]}))
    .unwrap();
    a.append(picture, AppendOptions::default()).await.unwrap();
    let b = db.session_in("ns", "b").unwrap();
    b.import(text("o", "user", "orphan"), imported(Some("later"), 1))
        .await
        .unwrap();
}

/// What a check reports of the store of [`fill_for_check`] after each backend's SQL, as a hand
/// edit could, adds one to `a`'s stored messages and sets its next seq to 2, points `b`'s leaf
/// at `gone`, makes the orphan `o` name itself as parent, deletes every attachment chunk and
/// inserts a message of session number (or id) that has no session.
pub const CHECK_PROBLEMS: [&str; 6] = [
    "1 messages belong to no session",
    "1 messages name a parent in their session without linking to it",
    "1 attachment payloads have no reference or not all their chunks",
    "session `a` counts 5 messages and holds 4",
    "session `a` would give seq 2 again (its highest is 5)",
    "session `b` of namespace `ns` has active leaf `gone` at seq Some(1), where no such message is",
];
