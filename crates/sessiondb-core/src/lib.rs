//! The pure core of sessiondb: everything that decides *what* a write stores and *how* a read is
//! planned, with no I/O, no clock, no randomness and no async runtime.
//!
//! # Layout
//! - [`message`]: the message model, validation, sanitising, the prepared (ready to store) form
//!   and the stored form returned by reads.
//! - [`attachments`]: media extraction to content-addressed payloads, pointers, read-back.
//! - [`chunk`]: splitting a message body into row-sized slices on character boundaries.
//! - [`tokens`]: the reference token heuristic and the [`tokens::TokenCounter`] seam.
//! - [`search`]: which text of a message is indexed, and how a user query becomes plain words.
//! - [`snippet`]: the part of a search hit's text around its matches, the matched words marked
//!   (stemmed as the embedded store's index stems them).
//! - [`plan`]: read planning (content windows, recent-history suffixes, history batches) and the
//!   splice computation for deletes.
//! - [`registry`]: session records and patches, compactions, state keys.
//! - [`session_row`]: the session row as a write request keeps it, and how its active leaf,
//!   counts and path aggregates follow each write.
//! - [`overlay`]: which rows a read shows once compaction overlays apply.
//! - [`compaction`]: compaction planning (span, tool-call alignment), the summary prompt and the
//!   extractive summary.
//! - [`context`]: context blocks, the system prompt's exact text, the generated AI tools and
//!   their results, loaded-skill tracking.
//! - [`convert`]: stored messages to OpenAI Chat Completions, OpenAI Responses and Anthropic
//!   Messages formats.
//! - [`write_rules`]: what each write op does (appends, imports, updates, deletes with
//!   splicing, clears, session and context ops), once for every backend, over [`write_rules::WriteTx`].
//! - [`feed`]: change events and the bounded, lag-reporting fan-out to subscribers.
//! - [`store`]: the [`store::Store`] trait every backend implements, with its request and outcome
//!   types. It lives here (not in the facade) so backends can implement it without depending on
//!   the facade, which depends on them.
#![forbid(unsafe_code)]

pub mod attachments;
pub mod check;
pub mod chunk;
pub mod compaction;
pub mod context;
pub mod convert;
pub mod feed;
pub mod message;
pub mod overlay;
pub mod plan;
mod porter;
pub mod registry;
pub mod search;
pub mod session_row;
pub mod snippet;
pub mod store;
pub mod tokens;
pub mod write_rules;

pub use feed::{
    Change, ChangeEvent, ChangeFeed, CompactionPhase, CompactionStatus, FeedFilter, FeedItem,
    SessionAction, Subscription,
};
pub use message::{
    ContentHash, Message, MessageId, PreparedMessage, Source, StoredFields, StoredMessage,
    ValidationError, ValidationErrorKind,
};
pub use registry::{
    Compaction, SessionCursor, SessionInfo, SessionPatch, SessionQuery, SessionRecord, SessionSort,
    Usage,
};
pub use store::{
    ContextEntry, FrozenPrompt, Parent, PathPlan, PathRows, PathRuns, PathSuffix, PlanRow,
    RangeTotals, RowStat, RunsFromLeaf, ScopedBlock, ScopedEntry, SearchFilter, SearchHit,
    SessionKey, SessionStats, Store, StoreError, UpdateOutcome, WriteCondition, WriteOp,
    WriteOutcome, WriteRequest, Written,
};

/// Maximum depth walked from a leaf towards the root; a path holds at most `MAX_PATH_DEPTH + 1`
/// rows (root at depth 0). Bounds every path read, however deep a tree grows.
pub const MAX_PATH_DEPTH: usize = 10_000;
/// Most rows a path read returns.
pub const MAX_PATH_ROWS: usize = MAX_PATH_DEPTH + 1;
/// UTF-8 bytes of a message body stored per row; larger bodies continue in chunk rows.
pub const MAX_SLICE_BYTES: usize = 1_572_864;
/// Forward history reads fetch content in windows of at most this many rows...
pub const WINDOW_MAX_ROWS: usize = 50;
/// ...and at most this many stored bytes (a single larger row stands alone).
pub const WINDOW_MAX_BYTES: u64 = 4 * 1024 * 1024;
/// Identifiers (session ids, message ids, namespaces) are at most this many characters.
pub const MAX_ID_CHARS: usize = 256;
/// Prefix of the synthetic messages that stand for compaction overlays; never stored by writes.
pub const COMPACTION_PREFIX: &str = "compaction_";
