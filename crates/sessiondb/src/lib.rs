//! sessiondb: a durable session store for AI agents.
//!
//! A session (conversation) is a tree of messages: appends extend the active branch, an explicit
//! parent starts a new branch, and reads walk one path from the root to a leaf. History streams in
//! bounded windows however long the session is; full-text search, O(1) session statistics and a
//! change feed come with every backend.
//!
//! ```
//! # futures::executor::block_on(async {
//! use futures::StreamExt;
//! use sessiondb::{AppendOptions, Db, Message, Parent};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let db = Db::open(dir.path())?; // an SQLite file in that directory
//! let chat = db.session("chat-1")?;
//!
//! chat.append(Message::text("user", "What is a B-tree?").with_id("q1"), AppendOptions::default()).await?;
//! chat.append(Message::text("assistant", "A balanced search tree.").with_id("a1"), AppendOptions::default()).await?;
//! // Regenerate the answer: a sibling of a1 becomes the active branch.
//! let retry = AppendOptions { parent: Parent::Id("q1".into()), ..Default::default() };
//! chat.append(Message::text("assistant", "A self-balancing tree with wide nodes.").with_id("a2"), retry).await?;
//!
//! let ids: Vec<_> = chat.full_history(Default::default()).await?.into_iter().map(|m| m.id.clone()).collect();
//! assert_eq!(ids, ["q1", "a2"]);
//! assert_eq!(chat.branches("q1").await?.len(), 2);
//! assert_eq!(chat.search("balanced", 10).await?[0].id, "a1");
//!
//! let mut newest_first = chat.history(sessiondb::HistoryOptions { newest_first: true, ..Default::default() });
//! assert_eq!(newest_first.next().await.unwrap()?.id, "a2");
//! # Ok::<(), sessiondb::Error>(())
//! # }).unwrap();
//! ```
//!
//! # Layout
//! - [`Db`] opens a store and hands out [`Session`] handles; [`Session`] holds every per-session
//!   operation (writes prepare messages with the core, then call the backend once).
//! - [`Session::context`] gives a session's [`Context`]: blocks (with namespace templates from
//!   [`Db::context_templates`] and application [`Provider`]s), the frozen system prompt, and
//!   the AI tools with their executor.
//! - [`Conversations`] is the flat conversation API over sessions (pages, metadata, per-user
//!   listings, [`State`], limits, the summary convention); [`convert`] turns stored messages into
//!   OpenAI and Anthropic request formats.
//! - The [`Store`] trait and all message types come from `sessiondb-core`; the SQLite backend
//!   (feature `sqlite`, on by default) from `sessiondb-sqlite`.
#![forbid(unsafe_code)]

mod compact;
mod context;
mod conversations;
mod manager;
mod page;
mod registry;
mod session;
mod tokenizers;
mod transfer;

use std::sync::Arc;

pub use sessiondb_core::compaction::CompactOptions;
pub use sessiondb_core::convert;
pub use sessiondb_core::message::validate_id;
pub use sessiondb_core::snippet::{DEFAULT_SNIPPET_WORDS, Highlighter, MAX_SNIPPET_WORDS};
pub use sessiondb_core::tokens::{HeuristicCounter, TokenCounter};
pub use sessiondb_core::{
    Change, ChangeEvent, CompactionPhase, CompactionStatus, FeedFilter, FeedItem, MAX_PATH_ROWS,
    Message, MessageId, Parent, PathRows, PathRuns, RowStat, SearchFilter, SearchHit, SessionKey,
    SessionStats, Source, Store, StoreError, StoredFields, StoredMessage, Subscription,
    ValidationError, ValidationErrorKind, WriteCondition,
};
#[cfg(feature = "sqlite")]
pub use sessiondb_sqlite::{
    BATCH_BUCKETS, DATABASE_FILE, SqliteConfig, SqliteStore, StorageProbe, StorageUse, Synchronous,
    Vacuumed, WriteStats,
};

pub use compact::{ExtractiveSummarizer, SummarizeError, Summarizer, SummaryRequest};
pub use context::{
    BlockSpec, Context, CustomBlock, Provider, ProviderResult, ReadonlyProvider, SearchProvider,
    SkillProvider, WritableProvider,
};
pub use conversations::{
    CONVERSATION_ROLES, Conversation, ConversationLimits, Conversations, NewMessage, PromptContext,
    SUMMARY_PREFIX, State,
};
pub use manager::SPLIT_PREFIX;
pub use page::{DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE, Page, PageRequest};
pub use registry::{IdleSweep, IdleSweeper, SessionListing};
pub use session::{
    AppendOptions, AppendResult, HistoryOptions, ImportOptions, MessagePatch, PATCH_ATTEMPTS,
    RecentHistory, Session,
};
pub use sessiondb_core::context::{
    BlockKind, BlockView, ContextError, SECTION_RULE, ToolDefinition,
};
pub use sessiondb_core::{
    Compaction, SessionAction, SessionInfo, SessionPatch, SessionRecord, SessionSort, Usage,
};
pub use sessiondb_core::{ContextEntry, FrozenPrompt};
pub use tokenizers::Encoding;
#[cfg(feature = "tiktoken")]
pub use tokenizers::TiktokenCounter;
pub use transfer::{
    ImportLine, ImportLines, ImportPart, ImportSummary, TEMPLATES_LINE, block_line, entry_line,
    parse_import, parse_import_line, parse_import_parts,
};

/// Every error the facade returns.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The input was refused; nothing was written.
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    /// The backend failed; nothing of the failed request was written.
    #[error(transparent)]
    Store(StoreError),
    /// A session with this id already exists; nothing was written.
    #[error("session `{id}` already exists")]
    SessionExists { id: String },
    /// The write would take a session past its message limit; nothing was written.
    #[error("the session would exceed its limit of {limit} messages")]
    QuotaExceeded { limit: u64 },
    /// Compaction was asked for, but no summarizer is configured ([`Options::summarizer`]).
    #[error("no summarizer is configured, so nothing can be compacted")]
    NoSummarizer,
    /// A context block refused a write (unknown, readonly, keyed, over `maxTokens`); nothing
    /// was written.
    #[error(transparent)]
    Context(#[from] ContextError),
    /// The summarizer failed; nothing was written.
    #[error("compaction failed: {0}")]
    Summarize(SummarizeError),
    /// [`Db::import_together`]: the part at `part` (counting from 0) into `session_id` failed
    /// with `error`, so nothing of any part was written. (A part's invalid line is an
    /// [`Error::Invalid`] whose field starts `parts[i].`.)
    #[error("parts[{part}] (session `{session_id}`): {error}")]
    InPart {
        part: usize,
        session_id: String,
        error: Box<Error>,
    },
}

impl From<StoreError> for Error {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::QuotaExceeded { limit } => Error::QuotaExceeded { limit },
            StoreError::Context(e) => Error::Context(e),
            other => Error::Store(other),
        }
    }
}

/// Behaviour shared by every session of a [`Db`].
#[derive(Debug, Clone)]
pub struct Options {
    /// Metadata keys removed from client-sourced writes ([`Source::Client`]).
    pub reserved_metadata_keys: Vec<String>,
    /// Stamps each message's token estimate. The reference heuristic by default.
    pub token_counter: Arc<dyn TokenCounter>,
    /// Most messages a session may hold; a write that would store more fails with
    /// [`Error::QuotaExceeded`] and stores nothing. Unlimited when `None`.
    pub max_messages_per_session: Option<u64>,
    /// Largest message body (compact JSON), state value or compaction summary a write takes;
    /// a larger one fails validation ([`ValidationErrorKind::TooLarge`]). Unlimited when `None`.
    pub max_message_bytes: Option<u64>,
    /// Writes compaction summaries; [`ExtractiveSummarizer`] (no model) by default, `None`
    /// disables compaction ([`Error::NoSummarizer`]).
    pub summarizer: Option<Arc<dyn Summarizer>>,
    /// The compaction plan's head, recent-token budget and minimum tail (a session's
    /// `keepRecentTokens` setting overrides the budget).
    pub compaction: CompactOptions,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            reserved_metadata_keys: Vec::new(),
            token_counter: Arc::new(HeuristicCounter),
            max_messages_per_session: None,
            max_message_bytes: None,
            summarizer: Some(Arc::new(ExtractiveSummarizer)),
            compaction: CompactOptions::default(),
        }
    }
}

/// A store plus the options its sessions use. Cloning is cheap and shares the store.
#[derive(Debug)]
pub struct Db<S> {
    store: Arc<S>,
    options: Arc<Options>,
    caches: Arc<compact::SessionCaches>,
}

impl<S> Clone for Db<S> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            options: self.options.clone(),
            caches: self.caches.clone(),
        }
    }
}

#[cfg(feature = "sqlite")]
impl Db<SqliteStore> {
    /// Opens (creating if needed) the embedded store in directory `dir`.
    pub fn open(dir: impl AsRef<std::path::Path>) -> Result<Self, Error> {
        Ok(Self::new(SqliteStore::open(dir)?))
    }
}

impl<S: Store> Db<S> {
    pub fn new(store: S) -> Self {
        Self::with_options(store, Options::default())
    }

    pub fn with_options(store: S, options: Options) -> Self {
        Self {
            caches: Arc::new(compact::SessionCaches::new(store.shared())),
            store: Arc::new(store),
            options: Arc::new(options),
        }
    }

    /// The same store with other options (for example a different token counter).
    pub fn reconfigured(&self, options: Options) -> Self {
        Self {
            store: self.store.clone(),
            options: Arc::new(options),
            caches: self.caches.clone(),
        }
    }

    /// Auto-compactions that failed since this store was opened (the appends stood).
    pub fn compaction_failures(&self) -> u64 {
        self.caches.failures()
    }

    /// A handle on session `id` in the default (empty) namespace. Sessions need no creation: the
    /// first write creates one.
    pub fn session(&self, id: &str) -> Result<Session<S>, Error> {
        self.session_in("", id)
    }

    /// A handle on session `id` in `namespace`; nothing done through it sees other namespaces.
    pub fn session_in(&self, namespace: &str, id: &str) -> Result<Session<S>, Error> {
        Ok(Session::new(
            self.store.clone(),
            self.options.clone(),
            self.caches.clone(),
            SessionKey::new(namespace, id)?,
        ))
    }

    /// Change events after each durable write, in commit order.
    pub fn subscribe(&self, filter: FeedFilter) -> Subscription {
        self.store.subscribe(filter)
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    pub fn options(&self) -> &Options {
        &self.options
    }
}

/// The README's examples run as doctests, so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;
