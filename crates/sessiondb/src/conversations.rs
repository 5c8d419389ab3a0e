//! The conversation API: a flat, paginated view of sessions for applications that do not need
//! branches, with conversation metadata, per-conversation JSON state, hard limits and the
//! summary convention.
//!
//! A conversation is a session; its messages are the session's active path, so everything
//! written here is visible to the tree API and the other way round. Every call enforces the
//! [`ConversationLimits`]: an id over 256 characters, content over the byte limit or a page size
//! outside 1..=100 is an [`Error::Invalid`], a message past the per-conversation limit is an
//! [`Error::QuotaExceeded`], and a refused write stores nothing.

use serde_json::Value;
use sessiondb_core::message::{JsonMap, validate_id};
use sessiondb_core::{
    MAX_ID_CHARS, Message, Parent, SessionInfo, SessionPatch, SessionRecord, SessionSort, Store,
    StoredMessage, ValidationError, ValidationErrorKind, WriteOp, WriteOutcome,
};

use crate::page::{MAX_PAGE_SIZE, Page, PageRequest};
use crate::registry::SessionListing;
use crate::session::{HistoryOptions, MessagePatch, Session};
use crate::{Db, Error, Options, Source};

/// Roles a conversation message may have.
pub const CONVERSATION_ROLES: [&str; 4] = ["user", "assistant", "system", "tool"];

/// Text put before a conversation summary when it opens a model prompt.
pub const SUMMARY_PREFIX: &str = "Summary of the earlier conversation:\n";

/// Hard limits of the conversation API (the defaults are the reference's). Ids and pages can
/// only be limited below the bounds every API keeps (256 characters, 100 items).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConversationLimits {
    /// Longest conversation id, in characters (at most 256).
    pub max_id_chars: usize,
    /// Largest message body, serialised as compact JSON (also state values).
    pub max_content_bytes: u64,
    /// Most messages a conversation holds.
    pub max_messages: u64,
    /// Largest page of messages or conversations (at most 100).
    pub max_page_size: usize,
}

impl Default for ConversationLimits {
    fn default() -> Self {
        Self {
            max_id_chars: MAX_ID_CHARS,
            max_content_bytes: 50_000_000,
            max_messages: 10_000,
            max_page_size: MAX_PAGE_SIZE,
        }
    }
}

/// A message to append.
#[derive(Debug, Clone, PartialEq)]
pub struct NewMessage {
    /// One of [`CONVERSATION_ROLES`].
    pub role: String,
    /// A string, an array or an object.
    pub content: Value,
    pub metadata: Option<JsonMap>,
    /// Records the conversation in this user's index.
    pub user_id: Option<String>,
    /// Makes a retried append idempotent; a `msg_…` id is generated when absent.
    pub id: Option<String>,
}

impl NewMessage {
    pub fn new(role: impl Into<String>, content: impl Into<Value>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            metadata: None,
            user_id: None,
            id: None,
        }
    }
}

/// A conversation as the API reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct Conversation {
    pub id: String,
    pub created_at: i64,
    /// The newest message's time; the creation time while there is none (listings sort by it).
    pub last_message_at: i64,
    /// Messages on the active path.
    pub message_count: u64,
    pub metadata: JsonMap,
    pub user_id: Option<String>,
}

impl From<SessionInfo> for Conversation {
    fn from(info: SessionInfo) -> Self {
        Self {
            last_message_at: SessionSort::LastMessageAt.value_of(&info),
            id: info.id,
            created_at: info.created_at,
            message_count: info.stats.message_count,
            metadata: info.record.metadata,
            user_id: info.record.user_id,
        }
    }
}

/// What a model needs to continue a conversation that keeps a summary in its metadata
/// (`summary`, and `summarizedUntil` = the last message id the summary covers).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PromptContext {
    pub summary: Option<String>,
    /// Messages after `summarizedUntil`, oldest first; every message of the active path when
    /// there is no summary or its `summarizedUntil` is not on the path (then nothing is lost,
    /// at the price of repeating what the summary covers).
    pub messages: Vec<StoredMessage>,
}

impl PromptContext {
    /// The messages as JSON for the converters, led by the summary as a system message.
    pub fn model_messages(&self) -> Vec<Value> {
        let summary = self.summary.as_ref().map(
            |s| serde_json::json!({"role": "system", "content": format!("{SUMMARY_PREFIX}{s}")}),
        );
        summary
            .into_iter()
            .chain(self.messages.iter().map(StoredMessage::to_value))
            .collect()
    }
}

/// One conversation's JSON key/value state. Keys are 1..=256 characters; values are JSON
/// (a [`Value`] cannot hold NaN or infinities, and [`State::set_json`] refuses text that is not
/// one JSON value). Writes are durable like messages.
#[derive(Debug)]
pub struct State<S> {
    session: Session<S>,
}

impl<S> Clone for State<S> {
    fn clone(&self) -> Self {
        Self {
            session: self.session.clone(),
        }
    }
}

impl<S: Store> State<S> {
    /// The value, or `None` when the key is absent.
    pub async fn get(&self, key: &str) -> Result<Option<Value>, Error> {
        self.session.state(key).await
    }

    pub async fn set(&self, key: &str, value: &Value) -> Result<(), Error> {
        self.session.set_state(key, value).await
    }

    /// Sets a value given as JSON text; returns it parsed.
    pub async fn set_json(&self, key: &str, json: &str) -> Result<Value, Error> {
        self.session.set_state_json(key, json).await
    }

    /// Returns whether the key existed.
    pub async fn delete(&self, key: &str) -> Result<bool, Error> {
        self.session.delete_state(key).await
    }

    /// Every key with its value, by key.
    pub async fn list(&self) -> Result<Vec<(String, Value)>, Error> {
        self.session.state_entries().await
    }
}

/// The conversation API over one namespace of a store.
#[derive(Debug)]
pub struct Conversations<S> {
    db: Db<S>,
    namespace: String,
    limits: ConversationLimits,
}

impl<S> Clone for Conversations<S> {
    fn clone(&self) -> Self {
        Self {
            db: self.db.clone(),
            namespace: self.namespace.clone(),
            limits: self.limits,
        }
    }
}

impl<S: Store> Db<S> {
    /// The conversation API over `namespace`, enforcing `limits` on every call.
    pub fn conversations(
        &self,
        namespace: &str,
        limits: ConversationLimits,
    ) -> Result<Conversations<S>, Error> {
        if !namespace.is_empty() {
            validate_id("namespace", namespace)?;
        }
        let bounded = |field: &str, value: usize, max: usize| {
            if (1..=max).contains(&value) {
                Ok(())
            } else {
                Err(ValidationError::new(
                    field,
                    ValidationErrorKind::OutOfRange {
                        min: 1,
                        max: max as u64,
                    },
                ))
            }
        };
        bounded("maxIdChars", limits.max_id_chars, MAX_ID_CHARS)?;
        bounded("maxPageSize", limits.max_page_size, MAX_PAGE_SIZE)?;
        let options = Options {
            max_message_bytes: Some(limits.max_content_bytes),
            max_messages_per_session: Some(limits.max_messages),
            ..self.options().clone()
        };
        Ok(Conversations {
            db: self.reconfigured(options),
            namespace: namespace.to_owned(),
            limits,
        })
    }
}

impl<S: Store> Conversations<S> {
    /// The session behind a conversation, with this API's limits.
    pub fn session(&self, conversation_id: &str) -> Result<Session<S>, Error> {
        let max = self.limits.max_id_chars;
        if conversation_id.chars().count() > max {
            return Err(ValidationError::new(
                "conversationId",
                ValidationErrorKind::TooLong { max },
            )
            .into());
        }
        self.db.session_in(&self.namespace, conversation_id)
    }

    /// Refuses a page larger than the configured maximum (the store checks 1..=100).
    fn check_page(&self, page: &PageRequest) -> Result<(), ValidationError> {
        match page.limit {
            Some(limit) if limit > self.limits.max_page_size => Err(ValidationError::new(
                "limit",
                ValidationErrorKind::OutOfRange {
                    min: 1,
                    max: self.limits.max_page_size as u64,
                },
            )),
            _ => Ok(()),
        }
    }

    /// Appends a message at the end of the conversation, creating the conversation on first
    /// use. With `user_id`, the conversation is recorded in that user's index; a conversation
    /// already recorded for another user refuses the append.
    pub async fn append_message(
        &self,
        conversation_id: &str,
        message: NewMessage,
    ) -> Result<StoredMessage, Error> {
        let session = self.session(conversation_id)?;
        if !CONVERSATION_ROLES.contains(&message.role.as_str()) {
            return Err(ValidationError::new(
                "role",
                ValidationErrorKind::WrongType {
                    expected: "one of user, assistant, system, tool",
                },
            )
            .into());
        }
        let mut built = Message::new(message.role).with_content(message.content);
        if let Some(metadata) = message.metadata {
            built = built.with_metadata(metadata);
        }
        if let Some(id) = message.id {
            built = built.with_id(id);
        }
        let built = Message::from_value(built.into_value())?;
        let mut ops = Vec::with_capacity(2);
        if let Some(user) = message.user_id {
            validate_id("userId", &user)?;
            ops.extend(self.claim_op(&session, user).await?);
        }
        let settings = session.write_settings().await?;
        ops.push(WriteOp::Append {
            message: session.prepare(built, Source::Server, &settings).await?,
            parent: Parent::ActiveLeaf,
        });
        match session.write(ops).await?.pop() {
            Some(WriteOutcome::Appended { message, inserted }) => {
                if inserted {
                    session.after_insert(&settings, &message).await;
                }
                session.resolved_message(message).await
            }
            other => unreachable!("append answered with {other:?}"),
        }
    }

    /// The write that records `user` as the conversation's owner, if one is needed.
    async fn claim_op(&self, session: &Session<S>, user: String) -> Result<Option<WriteOp>, Error> {
        let owner = self
            .db
            .store()
            .session(session.key())
            .await?
            .map(|info| info.record.user_id);
        Ok(match owner {
            None => Some(WriteOp::CreateSession {
                record: SessionRecord {
                    user_id: Some(user),
                    ..Default::default()
                },
                created_at: None,
            }),
            Some(None) => Some(WriteOp::PatchSession {
                patch: SessionPatch {
                    user_id: Some(user),
                    ..Default::default()
                },
            }),
            Some(Some(owner)) if owner == user => None,
            Some(Some(_)) => {
                return Err(ValidationError::new(
                    "userId",
                    ValidationErrorKind::WrongType {
                        expected: "the user the conversation belongs to",
                    },
                )
                .into());
            }
        })
    }

    /// A page of the conversation's messages (`limit` 1..=100, default 20; ascending unless
    /// `descending`; `after` / `before` are message ids and mutually exclusive). An unknown
    /// conversation is an empty page.
    pub async fn get_messages(
        &self,
        conversation_id: &str,
        page: &PageRequest,
    ) -> Result<Page<StoredMessage>, Error> {
        self.check_page(page)?;
        self.session(conversation_id)?.list_messages(page).await
    }

    /// Replaces a message's content and/or metadata (metadata whole, not merged) and stamps
    /// `updatedAt`. `None` when the message does not exist.
    pub async fn update_message(
        &self,
        conversation_id: &str,
        message_id: &str,
        content: Option<Value>,
        metadata: Option<JsonMap>,
    ) -> Result<Option<StoredMessage>, Error> {
        let patch = MessagePatch {
            content,
            metadata: metadata.map(Value::Object),
            ..Default::default()
        };
        self.session(conversation_id)?
            .patch_message(message_id, patch, Source::Server)
            .await
    }

    /// Returns whether the message existed.
    pub async fn delete_message(
        &self,
        conversation_id: &str,
        message_id: &str,
    ) -> Result<bool, Error> {
        let deleted = self
            .session(conversation_id)?
            .delete(&[message_id.to_owned()])
            .await?;
        Ok(deleted > 0)
    }

    /// Removes every message; the conversation, its metadata and state stay.
    pub async fn clear_messages(&self, conversation_id: &str) -> Result<(), Error> {
        self.session(conversation_id)?.clear().await
    }

    pub async fn get_conversation(
        &self,
        conversation_id: &str,
    ) -> Result<Option<Conversation>, Error> {
        let session = self.session(conversation_id)?;
        Ok(self
            .db
            .store()
            .session(session.key())
            .await?
            .map(Conversation::from))
    }

    /// A page of conversations by last message time (newest first unless the request says
    /// ascending), optionally only one user's, read from that user's index.
    pub async fn list_conversations(
        &self,
        page: &PageRequest,
        user_id: Option<&str>,
    ) -> Result<Page<Conversation>, Error> {
        self.check_page(page)?;
        let listing = SessionListing {
            page: page.clone(),
            sort: SessionSort::LastMessageAt,
            user_id: user_id.map(str::to_owned),
        };
        let sessions = self.db.list_sessions(&self.namespace, &listing).await?;
        Ok(Page {
            items: sessions.items.into_iter().map(Conversation::from).collect(),
            next_cursor: sessions.next_cursor,
            previous_cursor: sessions.previous_cursor,
        })
    }

    /// Shallow-merges `changes` into the metadata (a `null` value deletes its key) and returns
    /// the merged metadata; `None` when the conversation does not exist.
    pub async fn update_conversation(
        &self,
        conversation_id: &str,
        changes: JsonMap,
    ) -> Result<Option<JsonMap>, Error> {
        let patch = SessionPatch {
            metadata: Some(changes),
            ..Default::default()
        };
        let info = self.session(conversation_id)?.patch(patch).await?;
        Ok(info.map(|i| i.record.metadata))
    }

    /// Removes the conversation with its messages, metadata, state and index entries.
    /// Irreversible. Returns whether it existed.
    pub async fn delete_conversation(&self, conversation_id: &str) -> Result<bool, Error> {
        self.session(conversation_id)?.delete_session().await
    }

    /// The conversation's state.
    pub fn state(&self, conversation_id: &str) -> Result<State<S>, Error> {
        Ok(State {
            session: self.session(conversation_id)?,
        })
    }

    /// The summary convention: the metadata's `summary` and the messages after its
    /// `summarizedUntil`, read newest first so only those rows are read.
    pub async fn prompt_context(&self, conversation_id: &str) -> Result<PromptContext, Error> {
        use futures::TryStreamExt;

        let session = self.session(conversation_id)?;
        let Some(info) = self.db.store().session(session.key()).await? else {
            return Ok(PromptContext::default());
        };
        let text = |key: &str| {
            info.record
                .metadata
                .get(key)
                .and_then(Value::as_str)
                .map(str::to_owned)
        };
        let (summary, until) = (text("summary"), text("summarizedUntil"));
        let messages: Vec<StoredMessage> = match (&summary, &until) {
            (Some(_), Some(until)) => {
                let newest_first = HistoryOptions {
                    newest_first: true,
                    ..Default::default()
                };
                let mut walk = std::pin::pin!(session.history(newest_first));
                let mut after = Vec::new();
                while let Some(message) = walk.try_next().await? {
                    if message.id == *until {
                        break;
                    }
                    after.push(message);
                }
                after.reverse();
                after
            }
            _ => session.full_history(HistoryOptions::default()).await?,
        };
        Ok(PromptContext { summary, messages })
    }
}
