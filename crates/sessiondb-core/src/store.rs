//! The contract between the facade and a storage backend.
//!
//! The facade prepares every message with the core before calling a backend, so a backend only
//! persists prepared rows and fetches rows, atomically, with SQL that suits it. Semantic rules a
//! backend must follow (parent resolution, splicing, aggregates) are spelled out on each type and
//! checked by the conformance suite in `sessiondb-testkit`, which every backend runs unchanged.

use std::future::Future;

use crate::context::{BlockDef, ContextError, WriteMode};
use crate::feed::{FeedFilter, Subscription};
use crate::message::{PreparedMessage, StoredMessage, ValidationError, validate_id};
use crate::registry::{Compaction, SessionInfo, SessionPatch, SessionQuery, SessionRecord};

/// Which session a call is about. Every row carries both parts, and no call ever reads or writes
/// rows of another namespace.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionKey {
    pub namespace: String,
    pub session_id: String,
}

impl SessionKey {
    /// Validates both parts: the session id is 1..=256 characters; the namespace is empty (the
    /// embedded default) or 1..=256 characters.
    pub fn new(
        namespace: impl Into<String>,
        session_id: impl Into<String>,
    ) -> Result<Self, ValidationError> {
        let key = Self {
            namespace: namespace.into(),
            session_id: session_id.into(),
        };
        if !key.namespace.is_empty() {
            validate_id("namespace", &key.namespace)?;
        }
        validate_id("sessionId", &key.session_id)?;
        Ok(key)
    }

    /// The namespace's template scope: context blocks (and their entries) defined here apply to
    /// every session of the namespace. Its session id is empty, which no session can have; only
    /// context operations take it.
    pub fn templates(namespace: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            session_id: String::new(),
        }
    }

    pub fn is_templates(&self) -> bool {
        self.session_id.is_empty()
    }
}

/// Where an appended message attaches.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Parent {
    /// Under the session's active leaf (a new root when the session is empty).
    #[default]
    ActiveLeaf,
    /// As a new root.
    Root,
    /// Under this message if it exists in the same session; otherwise (unknown id, another
    /// session's id, empty string) as a new root.
    Id(String),
}

/// One mutation. A [`WriteRequest`] applies its ops in order, all or nothing.
#[derive(Debug, Clone)]
pub enum WriteOp {
    /// Inserts unless a message with this id exists (then returns it, `inserted: false`, and
    /// writes nothing). The new row gets the next seq and becomes the active leaf.
    Append {
        message: PreparedMessage,
        parent: Parent,
    },
    /// Rewrites an existing message's body unless its content hash is unchanged. Never changes
    /// parent, seq or createdAt.
    Update {
        message: PreparedMessage,
    },
    /// Update when the id exists, append otherwise.
    Upsert {
        message: PreparedMessage,
        parent: Parent,
    },
    /// Verbatim historical write with an explicit (unvalidated) parent and timestamp. Refused
    /// with [`StoreError::ParentCycle`] when the parent chain would loop back to this id. A
    /// written row becomes the active leaf. When the id exists, nothing is written, or with
    /// `replace` the stored message's body is rewritten as [`WriteOp::Update`] does (parent,
    /// seq and createdAt stay; the outcome is then [`WriteOutcome::Updated`]).
    Import {
        message: PreparedMessage,
        parent_id: Option<String>,
        created_at: i64,
        /// Kept from the exported message, if it had been updated.
        updated_at: Option<i64>,
        replace: bool,
    },
    /// Deletes the existing ids among these; each surviving child of a deleted row moves to its
    /// nearest surviving ancestor.
    Delete {
        ids: Vec<String>,
    },
    /// Deletes every message of the session; the session itself stays.
    Clear,
    /// Registers the session with this record unless it exists (then writes nothing), created
    /// at `created_at` when given (an imported session keeps its time), else now.
    CreateSession {
        record: SessionRecord,
        created_at: Option<i64>,
    },
    /// Applies the patch to an existing session's record; writes nothing when it does not exist.
    PatchSession {
        patch: SessionPatch,
    },
    /// Removes the session with its messages, compactions and state. With `updated_before`
    /// (epoch milliseconds), only a session last written before then: one written since (after
    /// the caller chose it, say) stays, and nothing is written.
    DeleteSession {
        updated_before: Option<i64>,
    },
    /// Stores a compaction overlay (its ends need not exist: then it never applies).
    AddCompaction {
        compaction: Compaction,
        /// Published as `compact` (a summarizer's overlay) instead of `compaction`.
        by_compact: bool,
    },
    /// Sets a state key to a JSON text.
    PutState {
        name: String,
        value: String,
    },
    DeleteState {
        name: String,
    },
    /// Defines a context block in the request's scope (the session, or the namespace's templates
    /// for [`SessionKey::templates`]), replacing a block of that label there. A new label goes
    /// after the scope's other blocks; a replaced one keeps its place.
    PutBlock {
        block: BlockDef,
    },
    /// Writes a text block's content with [`crate::context::written_content`], reading the
    /// current content in the same transaction. A session writing a block only its namespace
    /// template defines gets its own copy of that template. Fails with [`StoreError::Context`]
    /// (unknown label, readonly or keyed block, over `maxTokens`) and then writes nothing.
    WriteBlock {
        label: String,
        text: String,
        mode: WriteMode,
    },
    /// Removes the scope's block of this label with its entries (a template of the same label
    /// then shows again).
    DeleteBlock {
        label: String,
    },
    /// Stores an entry of a skill or search block visible in the scope (its own or its
    /// template's), replacing the scope's entry of that key. Fails with [`StoreError::Context`]
    /// when the block is missing or holds no entries.
    PutEntry {
        label: String,
        entry: ContextEntry,
    },
    /// Removes the scope's own entry of this key from a block (a template's entry of the same
    /// key then shows again); `Existed(false)` when the scope holds none.
    DeleteEntry {
        label: String,
        key: String,
    },
    /// Stores the session's frozen system prompt: always when `replace`, otherwise only when none
    /// is stored (the stored one wins, so concurrent first freezes agree).
    FreezePrompt {
        prompt: String,
        replace: bool,
    },
}

/// A keyed entry of a skill or search block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContextEntry {
    pub key: String,
    pub content: String,
    pub description: Option<String>,
}

/// A context block as a backend returns it: from the namespace's templates or the session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScopedBlock {
    pub template: bool,
    pub block: BlockDef,
}

/// An entry of a keyed block as a backend returns it: from the namespace's templates or the
/// session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScopedEntry {
    pub template: bool,
    pub entry: ContextEntry,
}

/// A session's frozen system prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrozenPrompt {
    /// May be empty: an empty prompt is a value, distinct from none.
    pub prompt: String,
    pub frozen_at: i64,
}

#[derive(Debug, Clone)]
pub struct WriteRequest {
    pub key: SessionKey,
    /// Epoch milliseconds stamped as createdAt / updatedAt by this request.
    pub now_ms: i64,
    pub ops: Vec<WriteOp>,
    /// Most messages the session may hold (on all branches); an insert beyond it fails the
    /// whole request with [`StoreError::QuotaExceeded`].
    pub max_messages: Option<u64>,
    /// What must hold of the session for the request to apply, checked in the transaction that
    /// writes, before any op.
    pub condition: Option<WriteCondition>,
}

/// A precondition of a [`WriteRequest`] on its session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteCondition {
    /// The session exists ([`StoreError::NoSession`]) and its active leaf is this one (`None`:
    /// it has no message; else [`StoreError::LeafMoved`]): optimistic concurrency for writers
    /// that read a session and then extend it.
    Leaf(Option<String>),
    /// The session exists ([`StoreError::NoSession`]) at this version
    /// ([`SessionStats::version`]; else [`StoreError::VersionMoved`]): nothing changed it since
    /// a read of that version, for writers that keep what they read.
    Version(i64),
    /// The session does not exist yet ([`StoreError::SessionExists`]): a request that creates a
    /// session with its first contents.
    Absent,
    /// The session holds this message exactly as a read returned it: its text, times and place
    /// (else [`StoreError::MessageChanged`]). For a read, change and write of one message, such
    /// as a patch of some of its fields, which must not undo a write that came in between; the
    /// rest of the session may have moved.
    Message(StoredMessage),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpdateOutcome {
    Missing,
    Unchanged(StoredMessage),
    Changed(StoredMessage),
}

/// What one [`WriteRequest`] did: an outcome per op, in the ops' order, and the session's
/// version once it committed (`None` when no session is left: a delete, the template scope).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    pub outcomes: Vec<WriteOutcome>,
    pub version: Option<i64>,
}

/// The result of one [`WriteOp`], in the same position as the op.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteOutcome {
    Appended {
        message: StoredMessage,
        inserted: bool,
    },
    Updated(UpdateOutcome),
    /// `None` when the id already existed and nothing was written.
    Imported(Option<StoredMessage>),
    Deleted {
        count: usize,
    },
    Cleared,
    /// `created` is false when the session existed already.
    SessionCreated {
        created: bool,
    },
    /// For session patches and deletes, and state deletes: whether the target existed.
    Existed(bool),
    CompactionAdded,
    StatePut,
    /// The block as the write left it (in the request's scope).
    BlockWritten(BlockDef),
    EntryPut,
    /// The prompt stored after the write (another one when a stored prompt won).
    Prompt(FrozenPrompt),
}

/// Per-row numbers of a path, read without loading content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowStat {
    pub id: String,
    /// The row's seq, which [`Store::fetch`] takes to read its content.
    pub seq: i64,
    pub role: String,
    pub bytes: u64,
    pub token_estimate: u64,
}

/// Where a path's rows are and how large, root first: all a forward read needs to plan its
/// content windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanRow {
    pub seq: i64,
    pub bytes: u64,
}

/// How to read a path forward.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathPlan {
    /// The path is exactly the session's rows with seqs `first..=last`, in seq order (a linear
    /// conversation): read it with [`Store::fetch_range`], no walk needed.
    Range { first: i64, last: i64 },
    /// The path's rows, root first; read them with [`Store::fetch`].
    Rows(Vec<PlanRow>),
    /// The session has compactions: the reader plans their overlays from the path's row stats
    /// ([`Store::path`], [`Store::compactions`]), so the backend computes no rows here.
    Overlaid,
}

/// A path root → leaf. `capped` is true when the walk stopped at [`crate::MAX_PATH_ROWS`] rows
/// while the oldest row read still had a parent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PathRows {
    pub rows: Vec<RowStat>,
    pub capped: bool,
}

/// A path as runs of consecutive seqs, root first (a linear conversation is one run; every
/// branch point on the path starts another), with the seqs of rows a reader asked to locate.
/// Enough to plan compaction overlays and to read the path with range reads, without loading
/// its rows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PathRuns {
    /// Inclusive seq ranges, root side first.
    pub runs: Vec<(i64, i64)>,
    /// As [`PathRows::capped`].
    pub capped: bool,
    /// The seq of each id asked for, in the order asked (`None`: no such row).
    pub located: Vec<Option<i64>>,
}

/// Token estimate and bytes summed over a stretch of rows ([`Store::range_totals`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RangeTotals {
    pub tokens: u64,
    pub bytes: u64,
}

impl PathRuns {
    /// Rows on the path.
    pub fn len(&self) -> usize {
        self.runs.iter().map(|&(a, b)| (b - a + 1) as usize).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// The path position (0 = root side) of the row with `seq`, if it is on the path.
    pub fn position(&self, seq: i64) -> Option<usize> {
        let mut before = 0;
        for &(first, last) in &self.runs {
            if (first..=last).contains(&seq) {
                return Some(before + (seq - first) as usize);
            }
            before += (last - first + 1) as usize;
        }
        None
    }

    /// The seq ranges holding path positions `first..=last`, root side first.
    pub fn seq_ranges(&self, first: usize, last: usize) -> Vec<(i64, i64)> {
        let mut ranges = Vec::new();
        let mut before = 0;
        for &(a, b) in &self.runs {
            let len = (b - a + 1) as usize;
            let (lo, hi) = (first.max(before), last.min(before + len - 1));
            if lo <= hi {
                ranges.push((a + (lo - before) as i64, a + (hi - before) as i64));
            }
            before += len;
        }
        ranges
    }
}

/// Collects a path's runs from its branch points, leaf side first: each step names the top seq
/// of a run, the detached row that heads it (the nearest row at or below the top that does not
/// continue the row before it) and that row's parent. Every row between a head and its top
/// continues the row before it, so the run is exactly `head..=top`; the path is capped at
/// [`crate::MAX_PATH_ROWS`] rows like a walk.
#[derive(Debug)]
pub struct RunsFromLeaf {
    runs: Vec<(i64, i64)>,
    room: i64,
    capped: bool,
}

impl Default for RunsFromLeaf {
    fn default() -> Self {
        Self {
            runs: Vec::new(),
            room: crate::MAX_PATH_ROWS as i64,
            capped: false,
        }
    }
}

impl RunsFromLeaf {
    /// Adds the run `head..=top`; returns the top of the next run (the head's parent), or
    /// `None` once the path is complete (a root, or the cap).
    pub fn push(&mut self, top: i64, head: i64, parent: Option<i64>) -> Option<i64> {
        let len = top - head + 1;
        if len >= self.room {
            self.runs.push((top - self.room + 1, top));
            self.capped = len > self.room || parent.is_some();
            self.room = 0;
            return None;
        }
        self.runs.push((head, top));
        self.room -= len;
        parent
    }

    /// The path, root side first, with the seqs located beside it.
    pub fn finish(mut self, located: Vec<Option<i64>>) -> PathRuns {
        self.runs.reverse();
        PathRuns {
            runs: self.runs,
            capped: self.capped,
            located,
        }
    }
}

/// The newest rows of a path that fit a byte budget.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PathSuffix {
    /// Root side first; never empty for a non-empty path (the leaf always comes).
    pub rows: Vec<PlanRow>,
    /// True when older rows of the path were left out (by the budget or the path cap).
    pub truncated: bool,
    /// Stored bytes of the whole (capped) path.
    pub total_bytes: u64,
    /// The session has compactions: `rows` is left empty and the reader plans the overlaid
    /// suffix itself (as with [`PathPlan::Overlaid`]).
    pub overlaid: bool,
}

/// O(1) aggregates of a session's active path (as capped path reads see it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionStats {
    /// Rows on the active path.
    pub message_count: u64,
    pub leaf_id: Option<String>,
    pub token_estimate: u64,
    pub content_bytes: u64,
    /// Rows stored in the session, on every branch.
    pub stored_messages: u64,
    /// The session has compactions, so path reads must apply overlays.
    pub has_compactions: bool,
    /// `(first, last)` when the active path is exactly the session's rows with seqs
    /// `first..=last` (a linear conversation, as [`PathPlan::Range`]): newest-first reads of it
    /// are range reads, with no parent walk.
    pub linear_range: Option<(i64, i64)>,
    /// Moves with every change of the session's row, and so with every write to its messages,
    /// compactions and record ([`crate::session_row::SessionRow::next_version`]): a path read at one version
    /// reads the same while the session stays at it. 0 for a session that does not exist, or
    /// one stored before versions existed and not written since.
    pub version: i64,
}

/// Which messages a search's words match (all of the words, or any), and which of those count
/// besides: one role's, written in a time range. The default keeps every message holding all of
/// the words.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SearchFilter {
    /// Messages holding any of the words rather than all of them, best first by the index's
    /// ranking (which favours messages holding more of them, and rarer ones): a question in an
    /// agent's or a person's own words, most of whose words no message holds together.
    pub match_any: bool,
    /// Only messages of this role (`user`, `assistant`, …).
    pub role: Option<String>,
    /// Only messages created at or after this time (epoch milliseconds).
    pub since_ms: Option<i64>,
    /// Only messages created before this time (epoch milliseconds).
    pub until_ms: Option<i64>,
}

impl SearchFilter {
    /// Why the filter is not one a caller can have meant (it would keep nothing): an empty
    /// role, or `since` not before `until`.
    pub fn problem(&self) -> Option<&'static str> {
        if self.role.as_deref() == Some("") {
            return Some("`role` must name a role, such as `user`");
        }
        match (self.since_ms, self.until_ms) {
            (Some(since), Some(until)) if since >= until => Some("`since` must be before `until`"),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SearchHit {
    pub id: String,
    pub role: String,
    /// The indexed text of the message.
    pub content: String,
    pub session_id: String,
    pub created_at: i64,
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    #[error("the database at {path} is already open in another process")]
    Locked { path: String },
    #[error("importing `{id}` under `{parent_id}` would make the parent chain a cycle")]
    ParentCycle { id: String, parent_id: String },
    #[error("the database schema version {found} is newer than this build supports ({supported})")]
    SchemaTooNew { found: i64, supported: i64 },
    #[error("the session would exceed its limit of {limit} messages")]
    QuotaExceeded { limit: u64 },
    /// A request conditioned on the session's leaf ([`WriteCondition::Leaf`]) found no such
    /// session.
    #[error("the session does not exist")]
    NoSession,
    /// A request conditioned on the session's absence ([`WriteCondition::Absent`]) found it.
    #[error("the session already exists")]
    SessionExists,
    /// A request conditioned on the session's leaf found another one; nothing was written.
    #[error("the session's active leaf is {}, not {}", leaf_name(.found), leaf_name(.expected))]
    LeafMoved {
        expected: Option<String>,
        found: Option<String>,
    },
    /// A request conditioned on the session's version found another one; nothing was written.
    #[error("the session is at version {found}, not {expected}: it changed since")]
    VersionMoved { expected: i64, found: i64 },
    /// A request conditioned on a message as read ([`WriteCondition::Message`]) found it changed
    /// or gone; nothing was written.
    #[error("message `{id}` changed since it was read")]
    MessageChanged { id: String },
    /// A context block refused a write.
    #[error(transparent)]
    Context(#[from] ContextError),
    #[error("the store is closed")]
    Closed,
    /// A backup's destination already holds a database; nothing was written there.
    #[error("{path} already holds a database; back up into a new or empty directory")]
    BackupDestinationExists { path: String },
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    #[error("storage failure: {0}")]
    Backend(String),
    /// The database cannot be reached just now (refused or lost connections, a server shutting
    /// down or out of connections). A retry may succeed once it is back. A write whose
    /// connection was lost while it committed may have been stored; retrying an append with the
    /// same id is safe (appends are idempotent by id).
    #[error("the database is unavailable: {0}")]
    Unavailable(String),
    /// The disk, or the size limit configured for the store, has no room for the write; nothing
    /// of it was stored. Reads go on, and writes succeed again once there is room.
    #[error("storage is full, nothing of the write was stored: {0}")]
    StorageFull(String),
    /// Syncing the write-ahead log failed. The writes it covered may not be on disk, and a later
    /// sync that succeeds would not prove they are (the OS may have dropped the pages it failed
    /// to write), so the store takes no more writes; reads go on. Reopening the store continues
    /// from what reached the disk.
    #[error(
        "the store stopped taking writes after the disk failed to sync ({0}); reopen it to continue from what reached the disk"
    )]
    Halted(String),
    /// [`Store::write_together`]: the request at `index` (counting from 0, in the order given)
    /// failed with `error`, so nothing of any request was written.
    #[error("request {index} of the write: {error}")]
    InRequest {
        index: usize,
        error: Box<StoreError>,
    },
}

impl StoreError {
    /// What went wrong, without the request [`StoreError::InRequest`] names.
    pub fn cause(&self) -> &StoreError {
        match self {
            StoreError::InRequest { error, .. } => error.cause(),
            other => other,
        }
    }
}

fn leaf_name(leaf: &Option<String>) -> String {
    leaf.as_ref()
        .map_or_else(|| "none (no message)".to_owned(), |id| format!("`{id}`"))
}

/// A storage backend. Every method is atomic; writes are durable when their future resolves and
/// their change events are published, in commit order, before that.
pub trait Store: Send + Sync + 'static {
    fn write(
        &self,
        request: WriteRequest,
    ) -> impl Future<Output = Result<Written, StoreError>> + Send;

    /// Several requests (of any sessions), each all or nothing on its own as [`Store::write`]
    /// makes it, answered in their order. A backend may commit them together; by default they
    /// run side by side.
    fn write_all(
        &self,
        requests: Vec<WriteRequest>,
    ) -> impl Future<Output = Vec<Result<Written, StoreError>>> + Send {
        futures::future::join_all(requests.into_iter().map(|request| self.write(request)))
    }

    /// Several requests (of one or more sessions) as one atomic write: every request applies
    /// and they commit together, or (on any request's error) nothing of any is written and
    /// that error is the answer, as [`StoreError::InRequest`] naming the request (an error of
    /// the commit itself names none). Outcomes and change events come in the requests' order.
    fn write_together(
        &self,
        requests: Vec<WriteRequest>,
    ) -> impl Future<Output = Result<Vec<Written>, StoreError>> + Send;

    fn message(
        &self,
        key: &SessionKey,
        id: &str,
    ) -> impl Future<Output = Result<Option<StoredMessage>, StoreError>> + Send;

    /// Children of `id`, oldest (lowest seq) first.
    fn children(
        &self,
        key: &SessionKey,
        id: &str,
    ) -> impl Future<Output = Result<Vec<StoredMessage>, StoreError>> + Send;

    /// Messages without a parent in this session (roots, and imports whose parent never
    /// arrived), oldest first.
    fn roots(
        &self,
        key: &SessionKey,
    ) -> impl Future<Output = Result<Vec<StoredMessage>, StoreError>> + Send;

    fn stats(
        &self,
        key: &SessionKey,
    ) -> impl Future<Output = Result<SessionStats, StoreError>> + Send;

    /// Row stats of the path ending at `leaf` (the active leaf when `None`); empty when the leaf
    /// does not exist. At most [`crate::MAX_PATH_ROWS`] rows, the ones nearest the leaf.
    fn path(
        &self,
        key: &SessionKey,
        leaf: Option<&str>,
    ) -> impl Future<Output = Result<PathRows, StoreError>> + Send;

    /// The path ending at `leaf` (the active leaf when `None`) as runs of consecutive seqs,
    /// capped like [`Store::path`] (empty when the leaf does not exist), and the seqs of the
    /// rows with ids `locate`, read in one snapshot. Backends find the path's branch points
    /// without reading its rows (see [`RunsFromLeaf`]).
    fn path_runs(
        &self,
        key: &SessionKey,
        leaf: Option<&str>,
        locate: &[String],
    ) -> impl Future<Output = Result<PathRuns, StoreError>> + Send;

    /// The token estimates and bytes of the rows with seqs in each inclusive range, summed per
    /// range, in the order given; rows that do not exist count nothing. Each range lies within
    /// one run of a path (see [`PathRuns`]), so a backend that keeps running totals along paths
    /// can answer without reading the rows in between.
    fn range_totals(
        &self,
        key: &SessionKey,
        ranges: &[(i64, i64)],
    ) -> impl Future<Output = Result<Vec<RangeTotals>, StoreError>> + Send;

    /// How to read the path ending at `leaf` (the active leaf when `None`) forward, capped like
    /// [`Store::path`]; [`PathPlan::Overlaid`] whenever the session has compactions.
    fn path_plan(
        &self,
        key: &SessionKey,
        leaf: Option<&str>,
    ) -> impl Future<Output = Result<PathPlan, StoreError>> + Send;

    /// The next content window of a [`PathPlan::Range`]: rows with seqs `from..=last` in seq
    /// order, at most `max_rows` of them and no more than `max_bytes` stored bytes (a larger
    /// first row comes alone).
    fn fetch_range(
        &self,
        key: &SessionKey,
        from: i64,
        last: i64,
        max_rows: usize,
        max_bytes: u64,
    ) -> impl Future<Output = Result<Vec<StoredMessage>, StoreError>> + Send;

    /// Rows of a [`PathPlan::Range`] with seqs `first..=last`, newest (highest seq) first, at
    /// most `max_rows` of them.
    fn fetch_range_newest(
        &self,
        key: &SessionKey,
        first: i64,
        last: i64,
        max_rows: usize,
    ) -> impl Future<Output = Result<Vec<StoredMessage>, StoreError>> + Send;

    /// The longest suffix of the path ending at `leaf` (the active leaf when `None`) whose
    /// bytes fit `max_bytes`, at least the leaf. Reads only the rows it returns when the leaf is
    /// the active one (the total comes from the session's aggregates). Only reports
    /// [`PathSuffix::overlaid`] when the session has compactions.
    fn path_suffix(
        &self,
        key: &SessionKey,
        leaf: Option<&str>,
        max_bytes: u64,
    ) -> impl Future<Output = Result<PathSuffix, StoreError>> + Send;

    /// Full messages for the rows with these seqs, in the given order; missing rows are skipped.
    fn fetch(
        &self,
        key: &SessionKey,
        seqs: &[i64],
    ) -> impl Future<Output = Result<Vec<StoredMessage>, StoreError>> + Send;

    /// `from` and then its ancestors, following parent links, at most `limit` messages.
    fn ancestors(
        &self,
        key: &SessionKey,
        from: &str,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<StoredMessage>, StoreError>> + Send;

    /// Messages of the session matching every word and `filter`, best first.
    fn search(
        &self,
        key: &SessionKey,
        words: &[String],
        filter: &SearchFilter,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<SearchHit>, StoreError>> + Send;

    /// The session's registry record and aggregates; `None` when it was never created.
    fn session(
        &self,
        key: &SessionKey,
    ) -> impl Future<Output = Result<Option<SessionInfo>, StoreError>> + Send;

    /// One page of a namespace's sessions, ordered by `(sort value, id)`.
    fn list_sessions(
        &self,
        namespace: &str,
        query: &SessionQuery,
    ) -> impl Future<Output = Result<Vec<SessionInfo>, StoreError>> + Send;

    /// The session's compactions in creation order.
    fn compactions(
        &self,
        key: &SessionKey,
    ) -> impl Future<Output = Result<Vec<Compaction>, StoreError>> + Send;

    /// One state value as JSON text.
    fn state(
        &self,
        key: &SessionKey,
        name: &str,
    ) -> impl Future<Output = Result<Option<String>, StoreError>> + Send;

    /// Every state key of the session with its JSON text, by key.
    fn state_entries(
        &self,
        key: &SessionKey,
    ) -> impl Future<Output = Result<Vec<(String, String)>, StoreError>> + Send;

    /// Messages anywhere in the namespace (optionally only sessions of `user_id`) matching every
    /// word and `filter`, best first.
    fn search_namespace(
        &self,
        namespace: &str,
        user_id: Option<&str>,
        words: &[String],
        filter: &SearchFilter,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<SearchHit>, StoreError>> + Send;

    /// Decoded sizes of the payloads `namespace` holds among `hashes` (absent ones left out).
    fn attachment_sizes(
        &self,
        namespace: &str,
        hashes: &[String],
    ) -> impl Future<Output = Result<Vec<(String, u64)>, StoreError>> + Send;

    /// The payloads `namespace` holds among `hashes` (absent ones left out), reassembled.
    fn attachments(
        &self,
        namespace: &str,
        hashes: &[String],
    ) -> impl Future<Output = Result<Vec<crate::attachments::Payload>, StoreError>> + Send;

    /// Context blocks of the namespace's templates (creation order), then the session's own
    /// (creation order); only the templates for [`SessionKey::templates`].
    fn context_blocks(
        &self,
        key: &SessionKey,
    ) -> impl Future<Output = Result<Vec<ScopedBlock>, StoreError>> + Send;

    /// Keys and descriptions of a block's entries, by key, the session's entry shadowing its
    /// template's of the same key.
    fn context_entry_keys(
        &self,
        key: &SessionKey,
        label: &str,
    ) -> impl Future<Output = Result<Vec<(String, Option<String>)>, StoreError>> + Send;

    /// A block's entries in both layers with keys after `after` (all when `None`), by key, the
    /// session's own before its template's of the same key (only the templates' for
    /// [`SessionKey::templates`]); at most `rows` of them when given. Keys compare as bytes.
    fn context_entries(
        &self,
        key: &SessionKey,
        label: &str,
        after: Option<&str>,
        rows: Option<usize>,
    ) -> impl Future<Output = Result<Vec<ScopedEntry>, StoreError>> + Send;

    /// One entry, the session's own before its template's.
    fn context_entry(
        &self,
        key: &SessionKey,
        label: &str,
        entry_key: &str,
    ) -> impl Future<Output = Result<Option<ContextEntry>, StoreError>> + Send;

    /// A block's entries matching every word, best first, as `(key, content)`; shadowed template
    /// entries never appear.
    fn search_context(
        &self,
        key: &SessionKey,
        label: &str,
        words: &[String],
        limit: usize,
    ) -> impl Future<Output = Result<Vec<(String, String)>, StoreError>> + Send;

    /// The session's frozen system prompt, if one is stored.
    fn prompt(
        &self,
        key: &SessionKey,
    ) -> impl Future<Output = Result<Option<FrozenPrompt>, StoreError>> + Send;

    fn subscribe(&self, filter: FeedFilter) -> Subscription;

    /// Publishes an event that records no write (such as [`crate::Change::Error`]) to the
    /// session's subscribers.
    fn announce(&self, key: &SessionKey, change: crate::Change);

    /// Subscribes with the events after `position` delivered first; `None` when some of them
    /// are no longer kept (the caller must resynchronise).
    fn subscribe_after(
        &self,
        filter: FeedFilter,
        position: u64,
    ) -> impl Future<Output = Option<Subscription>> + Send;

    /// Identifies this feed's position sequence: positions from another epoch (an earlier process)
    /// cannot be resumed.
    fn feed_epoch(&self) -> u64;

    /// True when other processes write to this store too (several server instances on one
    /// database): callers must then keep nothing derived from reads across requests.
    fn shared(&self) -> bool {
        false
    }

    /// Why the store takes no more writes, once it has stopped ([`StoreError::Halted`]).
    fn halted(&self) -> Option<StoreError> {
        None
    }
}
