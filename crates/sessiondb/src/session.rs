//! The per-session handle.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use futures::stream::{self, BoxStream, Stream, StreamExt, TryStreamExt};
use serde_json::Value;
use sessiondb_core::attachments;
use sessiondb_core::message::{validate_text, validate_time};
use sessiondb_core::overlay::{
    Endpoints, PathSpan, is_hidden, may_be_hidden, overlay_spans, summary_message_id,
};
use sessiondb_core::plan::{Batcher, content_windows};
use sessiondb_core::{
    Compaction, MAX_PATH_ROWS, Message, MessageId, Parent, PathRuns, PlanRow, PreparedMessage,
    RangeTotals, RowStat, SearchFilter, SearchHit, SessionKey, SessionStats, Source, Store,
    StoreError, StoredMessage, UpdateOutcome, ValidationError, ValidationErrorKind,
    WINDOW_MAX_BYTES, WINDOW_MAX_ROWS, WriteCondition, WriteOp, WriteOutcome, WriteRequest,
    Written, search,
};

use crate::compact::{SessionCaches, WriteSettings};
use crate::{Error, Options};

#[derive(Debug, Clone, Default)]
pub struct AppendOptions {
    pub parent: Parent,
    pub source: Source,
    /// What must hold of the session for the write to happen, checked atomically with it:
    /// [`WriteCondition::Leaf`] (the session exists with this active leaf),
    /// [`WriteCondition::Version`] (it exists at this version: nothing changed it since a read
    /// of that version) or [`WriteCondition::Absent`]. When it does not hold, the write fails
    /// with [`Error::Store`] holding [`crate::StoreError::NoSession`],
    /// [`crate::StoreError::LeafMoved`], [`crate::StoreError::VersionMoved`] or
    /// [`crate::StoreError::SessionExists`], and nothing is written.
    pub condition: Option<WriteCondition>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppendResult {
    /// True when this call stored the message.
    pub inserted: bool,
    /// True when the message was a synthetic `compaction_…` overlay echoed back by a client:
    /// such messages are never stored and `message` is the input as it would have been stored.
    pub refused: bool,
    /// The stored message (the earlier one when the id already existed).
    pub message: StoredMessage,
    /// The session's version once the write committed (`None` for a refused overlay alone,
    /// which writes nothing).
    pub version: Option<i64>,
}

/// Fields of a message to replace; see [`Session::patch_message`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MessagePatch {
    pub role: Option<Value>,
    pub parts: Option<Value>,
    pub content: Option<Value>,
    pub metadata: Option<Value>,
}

impl MessagePatch {
    /// Each field's name in a message with its change.
    fn fields(&self) -> [(&'static str, Option<&Value>); 4] {
        [
            ("role", self.role.as_ref()),
            ("parts", self.parts.as_ref()),
            ("content", self.content.as_ref()),
            ("metadata", self.metadata.as_ref()),
        ]
    }
}

/// How often [`Session::patch_message`] reads and writes before it gives up on a message that
/// changes under it every time. Each failed attempt saw another write of the message land
/// within its own read and write, so a patch fails only after that many other writes of the
/// message while it tried (four patchers at once, each making its patches one after another,
/// meet a handful).
pub const PATCH_ATTEMPTS: usize = 64;

#[derive(Debug, Clone)]
pub struct ImportOptions {
    /// Stored as given, not validated (history may arrive out of order).
    pub parent_id: Option<String>,
    /// Epoch milliseconds, from 0 to 8,640,000,000,000,000 (JavaScript's date range).
    pub created_at: i64,
}

#[derive(Debug, Clone, Default)]
pub struct HistoryOptions {
    /// Read the path ending here instead of the active leaf.
    pub leaf: Option<String>,
    /// Walk from the leaf towards the root, reading only what the consumer takes.
    pub newest_first: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecentHistory {
    /// The longest suffix of the path (root side dropped) whose bytes fit the budget; always at
    /// least the leaf.
    pub messages: Vec<StoredMessage>,
    /// True when rows of the path were left out (by the budget or the path cap).
    pub truncated: bool,
    /// Stored bytes of the whole (capped) path.
    pub total_bytes: u64,
}

/// A handle on one session. Cheap to clone; holds no data of its own.
#[derive(Debug)]
pub struct Session<S> {
    pub(crate) store: Arc<S>,
    pub(crate) options: Arc<Options>,
    pub(crate) caches: Arc<SessionCaches>,
    key: SessionKey,
    /// Reads return attachment pointers instead of the media.
    pointers: bool,
}

impl<S> Clone for Session<S> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            options: self.options.clone(),
            caches: self.caches.clone(),
            key: self.key.clone(),
            pointers: self.pointers,
        }
    }
}

pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// An imported row keeps its parent's id even while that row is missing (it is adopted when the
/// parent arrives), so the id is stored: like every stored id, without control characters
/// (empty still means a root).
pub(crate) fn check_named_parent(field: &str, parent: &str) -> Result<(), ValidationError> {
    if parent.contains(char::is_control) {
        return Err(ValidationError::new(
            field,
            ValidationErrorKind::ControlCharacter,
        ));
    }
    Ok(())
}

/// A time-ordered unique id with a prefix.
pub(crate) fn unique_id(prefix: &str) -> String {
    format!("{prefix}{}", uuid::Uuid::now_v7().simple())
}

fn generate_id() -> String {
    unique_id("msg_")
}

/// Newest-first reads take 4 rows (a look at the tip), then 46 more (the usual recent window of
/// 50), then 256 at a time: a consumer that stops at either mark has read nothing it did not
/// take, and one that stops elsewhere at most a window more.
fn walk_window(windows_read: usize) -> usize {
    match windows_read {
        0 => 4,
        1 => 46,
        _ => 256,
    }
}

/// How a path read is cut into store reads.
#[derive(Debug, Clone, Copy)]
enum Windows {
    /// Bounded memory: forward windows of at most 50 rows and 4 MiB, newest-first ones that
    /// grow as in [`walk_window`].
    Streamed,
    /// The whole path is kept anyway ([`Session::full_history`]): no row limit, so a stretch
    /// of ordinary messages is one read; the 4 MiB bound stays, so messages with media are
    /// still resolved a few megabytes at a time.
    Whole,
}

impl Windows {
    /// Row and byte limits of one forward read.
    fn forward(self) -> (usize, u64) {
        match self {
            Windows::Streamed => (WINDOW_MAX_ROWS, WINDOW_MAX_BYTES),
            Windows::Whole => (MAX_PATH_ROWS, WINDOW_MAX_BYTES),
        }
    }

    /// Rows of the next newest-first read after `windows_read` of them.
    fn newest(self, windows_read: usize) -> usize {
        match self {
            Windows::Streamed => walk_window(windows_read),
            Windows::Whole => MAX_PATH_ROWS,
        }
    }
}

impl<S: Store> Session<S> {
    pub(crate) fn new(
        store: Arc<S>,
        options: Arc<Options>,
        caches: Arc<SessionCaches>,
        key: SessionKey,
    ) -> Self {
        Self {
            store,
            options,
            caches,
            key,
            pointers: false,
        }
    }

    /// A handle on another session of the same namespace, with the same options.
    pub(crate) fn sibling(&self, id: &str) -> Result<Session<S>, Error> {
        Ok(Session::new(
            self.store.clone(),
            self.options.clone(),
            self.caches.clone(),
            SessionKey::new(self.key.namespace.clone(), id)?,
        ))
    }

    /// The same session whose reads return media as `attachment:sha256:<hex>` pointers (fetch
    /// them lazily) instead of inline base64.
    pub fn with_attachment_pointers(&self) -> Self {
        Self {
            pointers: true,
            ..self.clone()
        }
    }

    /// Puts media back in place of pointers, with one store read for the whole batch. A pointer
    /// the store does not hold stays as it is.
    pub(crate) async fn resolved(
        &self,
        mut messages: Vec<StoredMessage>,
    ) -> Result<Vec<StoredMessage>, Error> {
        self.resolve_in_place(messages.iter_mut()).await?;
        Ok(messages)
    }

    /// [`Session::resolved`] for messages held elsewhere (e.g. in append results), unmoved.
    async fn resolve_in_place<'m>(
        &self,
        messages: impl Iterator<Item = &'m mut StoredMessage>,
    ) -> Result<(), Error> {
        if self.pointers {
            return Ok(());
        }
        let mut pointing: Vec<&mut StoredMessage> =
            messages.filter(|m| m.may_hold_pointers()).collect();
        let mut hashes: Vec<String> = Vec::new();
        for hash in pointing
            .iter()
            .flat_map(|m| attachments::pointers_in(m.json()))
        {
            if !hashes.contains(&hash) {
                hashes.push(hash);
            }
        }
        if hashes.is_empty() {
            return Ok(());
        }
        let payloads = self.store.attachments(&self.key.namespace, &hashes).await?;
        let encoded: Vec<attachments::Encoded> =
            payloads.iter().map(attachments::Encoded::new).collect();
        for message in &mut pointing {
            let json = attachments::resolve(message.json(), &encoded);
            message.set_json(json);
        }
        Ok(())
    }

    pub(crate) async fn resolved_one(
        &self,
        message: Option<StoredMessage>,
    ) -> Result<Option<StoredMessage>, Error> {
        match message {
            Some(m) => Ok(Some(self.resolved_message(m).await?)),
            None => Ok(None),
        }
    }

    pub(crate) async fn resolved_message(
        &self,
        mut message: StoredMessage,
    ) -> Result<StoredMessage, Error> {
        self.resolve_in_place(std::iter::once(&mut message)).await?;
        Ok(message)
    }

    pub fn key(&self) -> &SessionKey {
        &self.key
    }

    pub fn id(&self) -> &str {
        &self.key.session_id
    }

    /// Sanitises and prepares a message for a write; generates an id when it has none.
    pub(crate) async fn prepare(
        &self,
        mut message: Message,
        source: Source,
        settings: &WriteSettings,
    ) -> Result<PreparedMessage, Error> {
        message.sanitize(source, &self.options.reserved_metadata_keys);
        self.prepare_verbatim(message, settings).await
    }

    /// Prepares a historical message as it is (store-owned fields dropped, an id generated when
    /// it has none).
    pub(crate) async fn prepare_verbatim(
        &self,
        mut message: Message,
        settings: &WriteSettings,
    ) -> Result<PreparedMessage, Error> {
        let fresh_id = message.id().is_none();
        message.ensure_id(generate_id);
        message.drop_store_owned_fields();
        let mut prepared = message.prepare(self.counter_of(settings));
        prepared.fresh_id = fresh_id;
        let unmeasured: Vec<String> = prepared
            .unmeasured_references()
            .iter()
            .map(|r| r.hash.clone())
            .collect();
        if !unmeasured.is_empty() {
            let sizes = self
                .store
                .attachment_sizes(&self.key.namespace, &unmeasured)
                .await?;
            prepared.charge_existing(&sizes);
        }
        self.check_size("message", prepared.bytes())?;
        Ok(prepared)
    }

    /// Refuses free text stored as it is (see [`validate_text`]) or larger than
    /// [`Options::max_message_bytes`].
    pub(crate) fn check_text(&self, field: &str, text: &str) -> Result<(), ValidationError> {
        validate_text(field, text)?;
        self.check_size(field, text.len() as u64)
    }

    /// Refuses a value larger than [`Options::max_message_bytes`].
    pub(crate) fn check_size(&self, field: &str, bytes: u64) -> Result<(), ValidationError> {
        match self.options.max_message_bytes {
            Some(max) if bytes > max => Err(ValidationError::new(
                field,
                ValidationErrorKind::TooLarge { bytes, max },
            )),
            _ => Ok(()),
        }
    }

    /// The request that applies `ops` to this session now, under its message quota.
    pub(crate) fn request(&self, ops: Vec<WriteOp>) -> WriteRequest {
        WriteRequest {
            key: self.key.clone(),
            now_ms: now_ms(),
            ops,
            max_messages: self.options.max_messages_per_session,
            condition: None,
        }
    }

    pub(crate) async fn write(&self, ops: Vec<WriteOp>) -> Result<Vec<WriteOutcome>, Error> {
        Ok(self.write_if(ops, None).await?.outcomes)
    }

    /// [`Session::write`] under `condition`, with the session's version after it.
    pub(crate) async fn write_if(
        &self,
        ops: Vec<WriteOp>,
        condition: Option<WriteCondition>,
    ) -> Result<Written, Error> {
        // Writes that can change the settings, the overlays or the path under the active leaf
        // make the session's memos stale. Appends and updates keep them: they are the hot path,
        // and the auto-compaction memo follows appends itself.
        let stale = ops.iter().any(|op| {
            !matches!(
                op,
                WriteOp::Append { .. }
                    | WriteOp::Update { .. }
                    | WriteOp::Upsert { .. }
                    | WriteOp::PutState { .. }
                    | WriteOp::DeleteState { .. }
                    | WriteOp::PutBlock { .. }
                    | WriteOp::WriteBlock { .. }
                    | WriteOp::DeleteBlock { .. }
                    | WriteOp::PutEntry { .. }
                    | WriteOp::DeleteEntry { .. }
                    | WriteOp::FreezePrompt { .. }
            )
        });
        let request = WriteRequest {
            condition,
            ..self.request(ops)
        };
        let written = self.store.write(request).await;
        if stale {
            self.caches.forget(&self.key);
        }
        Ok(written?)
    }

    pub(crate) async fn write_one(&self, op: WriteOp) -> Result<WriteOutcome, Error> {
        Ok(self.write_one_if(op, None).await?.0)
    }

    /// One op under `condition`: its outcome and the session's version after it.
    async fn write_one_if(
        &self,
        op: WriteOp,
        condition: Option<WriteCondition>,
    ) -> Result<(WriteOutcome, Option<i64>), Error> {
        let mut written = self.write_if(vec![op], condition).await?;
        let outcome = written.outcomes.pop().expect("one outcome per op");
        Ok((outcome, written.version))
    }

    /// The form a refused overlay would have had; never stored.
    fn unstored(prepared: &PreparedMessage) -> StoredMessage {
        prepared.stored(0, None, now_ms(), None)
    }

    /// Appends a message. Idempotent by id: when the id exists, nothing is written and the stored
    /// message comes back with `inserted: false`.
    pub async fn append(
        &self,
        message: Message,
        options: AppendOptions,
    ) -> Result<AppendResult, Error> {
        let refused = message.is_compaction_overlay();
        let settings = self.write_settings().await?;
        let prepared = self.prepare(message, options.source, &settings).await?;
        if refused {
            return Ok(AppendResult {
                inserted: false,
                refused,
                message: Self::unstored(&prepared),
                version: None,
            });
        }
        let op = WriteOp::Append {
            message: prepared,
            parent: options.parent,
        };
        let (outcome, version) = self.write_one_if(op, options.condition).await?;
        let mut result = append_result(outcome, version);
        if result.inserted {
            self.after_insert(&settings, &result.message).await;
        }
        result.message = self.resolved_message(result.message).await?;
        Ok(result)
    }

    /// Appends `messages` atomically, each under the previous one (also when that one already
    /// existed); the first goes under `options.parent`. All or nothing.
    pub async fn append_all(
        &self,
        messages: Vec<Message>,
        options: AppendOptions,
    ) -> Result<Vec<AppendResult>, Error> {
        let mut parent = options.parent;
        let mut ops = Vec::with_capacity(messages.len());
        let mut slots = Vec::with_capacity(messages.len());
        let settings = self.write_settings().await?;
        for message in messages {
            let refused = message.is_compaction_overlay();
            let prepared = self.prepare(message, options.source, &settings).await?;
            if refused {
                slots.push(Err(Self::unstored(&prepared)));
                continue;
            }
            slots.push(Ok(()));
            // Named by id rather than as the active leaf: a message that already exists is
            // returned where it is and leaves the leaf alone, and the next one still goes under it.
            let under = std::mem::replace(&mut parent, Parent::Id(prepared.id.to_string()));
            ops.push(WriteOp::Append {
                message: prepared,
                parent: under,
            });
        }
        let written = self.write_if(ops, options.condition).await?;
        let version = written.version;
        let mut outcomes = written.outcomes.into_iter();
        let mut results: Vec<AppendResult> = slots
            .into_iter()
            .map(|slot| match slot {
                Ok(()) => append_result(outcomes.next().expect("one outcome per op"), version),
                Err(message) => AppendResult {
                    inserted: false,
                    refused: true,
                    message,
                    version,
                },
            })
            .collect();
        if let Some(last) = results.iter().rev().find(|r| r.inserted) {
            self.after_insert(&settings, &last.message).await;
        }
        self.resolve_in_place(results.iter_mut().map(|r| &mut r.message))
            .await?;
        Ok(results)
    }

    /// Updates the message when its id exists, appends it otherwise.
    pub async fn upsert(
        &self,
        message: Message,
        options: AppendOptions,
    ) -> Result<AppendResult, Error> {
        if message.is_compaction_overlay() {
            return self.append(message, options).await;
        }
        let settings = self.write_settings().await?;
        let op = WriteOp::Upsert {
            message: self.prepare(message, options.source, &settings).await?,
            parent: options.parent,
        };
        let (outcome, version) = self.write_one_if(op, options.condition).await?;
        let mut result = match outcome {
            WriteOutcome::Updated(
                UpdateOutcome::Changed(message) | UpdateOutcome::Unchanged(message),
            ) => AppendResult {
                inserted: false,
                refused: false,
                message,
                version,
            },
            other => append_result(other, version),
        };
        result.message = self.resolved_message(result.message).await?;
        Ok(result)
    }

    /// Replaces the body of an existing message (parent, seq and createdAt stay). Returns `None`
    /// when no message has this id. An unchanged body writes nothing and emits no event.
    pub async fn update(
        &self,
        message: Message,
        source: Source,
    ) -> Result<Option<StoredMessage>, Error> {
        if message.id().is_none() {
            return Err(ValidationError::new("id", ValidationErrorKind::Missing).into());
        }
        let settings = self.write_settings().await?;
        self.update_if(message, source, &settings, None).await
    }

    /// [`Session::update`] of a message with an id, under `condition`.
    async fn update_if(
        &self,
        message: Message,
        source: Source,
        settings: &WriteSettings,
        condition: Option<WriteCondition>,
    ) -> Result<Option<StoredMessage>, Error> {
        if message.is_compaction_overlay() {
            return Ok(None);
        }
        let op = WriteOp::Update {
            message: self.prepare(message, source, settings).await?,
        };
        match self.write_one_if(op, condition).await?.0 {
            WriteOutcome::Updated(UpdateOutcome::Changed(m) | UpdateOutcome::Unchanged(m)) => {
                Ok(Some(self.resolved_message(m).await?))
            }
            _ => Ok(None),
        }
    }

    /// Replaces the given fields of a stored message (each whole: `metadata` is replaced, not
    /// merged); a `null` removes an optional field. Returns `None` when no message has this id;
    /// the result is validated like any write. The patch applies to the message as stored when
    /// it is written: a write of the message between this call's read and its write makes it
    /// read and patch again (up to [`PATCH_ATTEMPTS`] times, then
    /// [`crate::StoreError::MessageChanged`]), so concurrent patches of different fields all
    /// stay.
    pub async fn patch_message(
        &self,
        id: &str,
        patch: MessagePatch,
        source: Source,
    ) -> Result<Option<StoredMessage>, Error> {
        let settings = self.write_settings().await?;
        let mut attempts = 0;
        loop {
            // Patched in pointer form: media stays where it is stored instead of being put back
            // and taken out again.
            let Some(current) = self.store.message(&self.key, id).await? else {
                return Ok(None);
            };
            let mut fields = current.to_message().into_value();
            if let Value::Object(map) = &mut fields {
                for (field, change) in patch.fields() {
                    match change {
                        None => {}
                        Some(Value::Null) => {
                            map.shift_remove(field);
                        }
                        Some(value) => {
                            map.insert(field.to_owned(), value.clone());
                        }
                    }
                }
            }
            let patched = Message::from_value(fields)?;
            let condition = Some(WriteCondition::Message(current));
            attempts += 1;
            match self.update_if(patched, source, &settings, condition).await {
                Err(Error::Store(StoreError::MessageChanged { .. }))
                    if attempts < PATCH_ATTEMPTS => {}
                result => return result,
            }
        }
    }

    /// Writes a historical message verbatim (no sanitising) with an explicit parent and time.
    /// Returns `None` when the id already exists (nothing is written).
    pub async fn import(
        &self,
        message: Message,
        options: ImportOptions,
    ) -> Result<Option<StoredMessage>, Error> {
        if let Some(parent) = &options.parent_id {
            check_named_parent("parentId", parent)?;
        }
        validate_time("createdAt", options.created_at)?;
        let settings = self.write_settings().await?;
        let op = WriteOp::Import {
            message: self.prepare_verbatim(message, &settings).await?,
            parent_id: options.parent_id,
            created_at: options.created_at,
            updated_at: None,
            replace: false,
        };
        match self.write_one(op).await? {
            WriteOutcome::Imported(stored) => self.resolved_one(stored).await,
            _ => Ok(None),
        }
    }

    /// Deletes messages; children of a deleted message move to its nearest surviving ancestor.
    /// Returns how many existed.
    pub async fn delete(&self, ids: &[String]) -> Result<usize, Error> {
        match self
            .write_one(WriteOp::Delete { ids: ids.to_vec() })
            .await?
        {
            WriteOutcome::Deleted { count } => Ok(count),
            _ => Ok(0),
        }
    }

    /// Deletes every message of the session.
    pub async fn clear(&self) -> Result<(), Error> {
        self.write_one(WriteOp::Clear).await?;
        Ok(())
    }

    pub async fn message(&self, id: &str) -> Result<Option<StoredMessage>, Error> {
        let message = self.store.message(&self.key, id).await?;
        self.resolved_one(message).await
    }

    /// The active leaf: the newest message written (walking up past stored echoes of this
    /// session's compaction summaries, which reads hide).
    pub async fn latest_leaf(&self) -> Result<Option<StoredMessage>, Error> {
        let Some(leaf) = self.store.stats(&self.key).await?.leaf_id else {
            return Ok(None);
        };
        if !may_be_hidden(&leaf) {
            return self.message(&leaf).await;
        }
        let compactions = self.store.compactions(&self.key).await?;
        if !is_hidden(&leaf, &compactions) {
            return self.message(&leaf).await;
        }
        let walk = self
            .store
            .ancestors(&self.key, &leaf, MAX_PATH_ROWS)
            .await?;
        let shown = walk.into_iter().find(|m| !is_hidden(&m.id, &compactions));
        self.resolved_one(shown).await
    }

    /// Children of `id`, oldest first. A hidden echo of a compaction summary is replaced by its
    /// own children.
    pub async fn branches(&self, id: &str) -> Result<Vec<StoredMessage>, Error> {
        let children = self.store.children(&self.key, id).await?;
        if !children.iter().any(|m| may_be_hidden(&m.id)) {
            return self.resolved(children).await;
        }
        let compactions = self.store.compactions(&self.key).await?;
        let mut shown = Vec::with_capacity(children.len());
        let mut pending: VecDeque<StoredMessage> = children.into();
        while let Some(child) = pending.pop_front() {
            if is_hidden(&child.id, &compactions) {
                for grandchild in self
                    .store
                    .children(&self.key, &child.id)
                    .await?
                    .into_iter()
                    .rev()
                {
                    pending.push_front(grandchild);
                }
            } else {
                shown.push(child);
            }
        }
        self.resolved(shown).await
    }

    /// Messages without a parent in this session, oldest first: the tops of its trees.
    pub async fn roots(&self) -> Result<Vec<StoredMessage>, Error> {
        let roots = self.store.roots(&self.key).await?;
        self.resolved(roots).await
    }

    /// O(1) numbers of the active path.
    pub async fn stats(&self) -> Result<SessionStats, Error> {
        Ok(self.store.stats(&self.key).await?)
    }

    /// Rows on the path ending at `leaf` (the active leaf when `None`), capped.
    pub async fn path_length(&self, leaf: Option<&str>) -> Result<usize, Error> {
        match leaf {
            None => Ok(self.stats().await?.message_count as usize),
            Some(_) => Ok(self.row_stats(leaf).await?.len()),
        }
    }

    /// Per-row numbers of the path, root first, without loading content (hidden echoes of
    /// compaction summaries left out).
    pub async fn row_stats(&self, leaf: Option<&str>) -> Result<Vec<RowStat>, Error> {
        let mut rows = self.store.path(&self.key, leaf).await?.rows;
        self.drop_hidden(&mut rows, |r| &r.id).await?;
        Ok(rows)
    }

    /// The synthetic message of each compaction, in the compactions' order, created when the
    /// compaction was (so two reads of a session at one version read the same).
    async fn summaries(&self, compactions: &[Compaction]) -> Result<Vec<StoredMessage>, Error> {
        // Without compactions there is nothing to count, so no tokenizer is loaded.
        if compactions.is_empty() {
            return Ok(Vec::new());
        }
        let counter = self.counter().await?;
        Ok(compactions
            .iter()
            .map(|c| {
                Message::text("assistant", c.summary.clone())
                    .with_id(summary_message_id(c))
                    .prepare(counter.as_ref())
                    .stored(0, None, c.created_at, None)
            })
            .collect())
    }

    /// The path as a history read shows it, planned on its runs of consecutive seqs and on where
    /// the compactions' endpoints (and their hidden echoes) sit on them, so no row is read to
    /// plan.
    async fn plan_on_runs(&self, leaf: Option<&str>) -> Result<RunPlan, Error> {
        let compactions = self.store.compactions(&self.key).await?;
        let locate: Vec<String> = compactions
            .iter()
            .flat_map(|c| {
                [
                    c.from_message_id.clone(),
                    c.to_message_id.clone(),
                    summary_message_id(c),
                ]
            })
            .collect();
        let runs = self.store.path_runs(&self.key, leaf, &locate).await?;
        let at = |i: usize| runs.located[i].and_then(|seq| runs.position(seq));
        let ends: Vec<Endpoints> = (0..compactions.len())
            .map(|c| Endpoints {
                from: at(3 * c),
                to: at(3 * c + 1),
            })
            .collect();
        let hidden: Vec<usize> = (0..compactions.len())
            .filter_map(|c| at(3 * c + 2))
            .collect();
        let spans = overlay_spans(runs.len(), &ends, &hidden);
        Ok(RunPlan {
            runs,
            spans,
            summaries: self.summaries(&compactions).await?,
        })
    }

    /// The token estimate of the path ending at `leaf` (the active one when `None`) with
    /// compaction summaries in place of the rows they cover; `None` when no overlay exists (the
    /// O(1) aggregate is exact then). Callers ask only for sessions whose stats report
    /// compactions.
    pub(crate) async fn overlaid_token_estimate(
        &self,
        leaf: Option<&str>,
    ) -> Result<Option<u64>, Error> {
        let plan = self.plan_on_runs(leaf).await?;
        if plan.summaries.is_empty() {
            return Ok(None);
        }
        let pieces = plan.pieces();
        let sizes = piece_sizes(self.store.as_ref(), &self.key, &pieces).await?;
        Ok(Some(sizes.iter().map(|size| size.tokens).sum()))
    }

    /// The path root → leaf (or leaf → root) as a stream. Forward reads fetch content in windows
    /// of at most 50 rows and 4 MiB; newest-first reads follow parent links and read only what is
    /// consumed. Memory is bounded by one window, not by the session.
    pub fn history(
        &self,
        options: HistoryOptions,
    ) -> impl Stream<Item = Result<StoredMessage, Error>> + Send + 'static {
        one_by_one(self.history_windows(options, Windows::Streamed))
    }

    /// [`Session::history`] with the session's version when the read began
    /// ([`SessionStats::version`]; 0 when the session does not exist). The stream reads the
    /// path as it is at that version or a later one: while the session stays at the version,
    /// what was read then is what a read would return.
    pub async fn versioned_history(
        &self,
        options: HistoryOptions,
    ) -> Result<
        (
            i64,
            impl Stream<Item = Result<StoredMessage, Error>> + Send + 'static,
        ),
        Error,
    > {
        let stats = self.store.stats(&self.key).await?;
        let version = stats.version;
        let messages = one_by_one(self.windows_from(stats, options, Windows::Streamed));
        Ok((version, messages))
    }

    /// The path as the store reads it, window by window, attachments resolved, planned on the
    /// session's `stats` as read before.
    fn windows_from(
        &self,
        stats: SessionStats,
        options: HistoryOptions,
        windows: Windows,
    ) -> impl Stream<Item = Result<Vec<StoredMessage>, Error>> + Send + 'static {
        let planned = self.clone().windows_after(stats, options, windows);
        self.resolved_windows(stream::once(planned))
    }

    /// The path as the store reads it, window by window, attachments resolved.
    fn history_windows(
        &self,
        options: HistoryOptions,
        windows: Windows,
    ) -> impl Stream<Item = Result<Vec<StoredMessage>, Error>> + Send + 'static {
        let session = self.clone();
        self.resolved_windows(stream::once(async move {
            let stats = session.store.stats(&session.key).await?;
            session.windows_after(stats, options, windows).await
        }))
    }

    /// The windows of a planned read, with their attachments resolved.
    fn resolved_windows<W>(
        &self,
        planned: impl Stream<Item = Result<W, Error>> + Send + 'static,
    ) -> impl Stream<Item = Result<Vec<StoredMessage>, Error>> + Send + 'static
    where
        W: Stream<Item = Result<Vec<StoredMessage>, Error>> + Send + 'static,
    {
        let resolver = self.clone();
        planned.try_flatten().and_then(move |batch| {
            let resolver = resolver.clone();
            async move { resolver.resolved(batch).await }
        })
    }

    /// How to read the path `options` ask for, given the session's `stats`: one O(1) read
    /// decides how to go. A linear active path is a seq range; a branched one is walked up
    /// lazily when read newest first; anything else (a branched path read forward, any path of
    /// a compacted session) is read along its runs.
    async fn windows_after(
        self,
        stats: SessionStats,
        options: HistoryOptions,
        windows: Windows,
    ) -> Result<BoxStream<'static, Result<Vec<StoredMessage>, Error>>, Error> {
        let (store, key) = (self.store.clone(), self.key.clone());
        if !stats.has_compactions {
            let active = options.leaf.is_none() || options.leaf == stats.leaf_id;
            match (active, stats.linear_range) {
                (true, Some((first, last))) if options.newest_first => {
                    return Ok(range_down(store, key, first, last, windows).boxed());
                }
                (true, Some((first, last))) => {
                    return Ok(range_up(store, key, first, last, windows).boxed());
                }
                _ if options.newest_first => {
                    let leaf = options.leaf.or(stats.leaf_id);
                    return Ok(self.walk_up(leaf, windows).boxed());
                }
                _ => {}
            }
        }
        let planned = self.plan_on_runs(options.leaf.as_deref()).await?;
        Ok(planned.read(store, key, options.newest_first, windows))
    }

    /// Walks from `leaf` towards the root in growing windows.
    fn walk_up(
        &self,
        leaf: Option<String>,
        windows: Windows,
    ) -> impl Stream<Item = Result<Vec<StoredMessage>, Error>> + Send + 'static {
        struct Walk<S> {
            store: Arc<S>,
            key: SessionKey,
            next: Option<MessageId>,
            remaining: usize,
            windows: usize,
        }
        let walk = Walk {
            store: self.store.clone(),
            key: self.key.clone(),
            next: leaf.map(MessageId::from),
            remaining: MAX_PATH_ROWS,
            windows: 0,
        };
        stream::try_unfold(walk, move |mut walk| async move {
            let Some(from) = walk.next.take() else {
                return Ok(None);
            };
            if walk.remaining == 0 {
                return Ok(None);
            }
            let limit = windows.newest(walk.windows).min(walk.remaining);
            let batch = walk.store.ancestors(&walk.key, &from, limit).await?;
            if batch.is_empty() {
                return Ok(None);
            }
            walk.remaining -= batch.len();
            walk.next = batch.last().and_then(|m| m.parent_id.clone());
            walk.windows += 1;
            Ok::<_, Error>(Some((batch, walk)))
        })
    }

    /// History grouped into batches of at most `batch_size` messages and about `max_bytes`
    /// bytes of JSON (a larger message is a batch of its own).
    pub fn history_batches(
        &self,
        options: HistoryOptions,
        batch_size: usize,
        max_bytes: u64,
    ) -> impl Stream<Item = Result<Vec<StoredMessage>, Error>> + Send + 'static {
        let messages = self
            .history(options)
            .map(Some)
            .chain(stream::once(async { None }));
        messages
            .scan(Batcher::new(batch_size, max_bytes), |batcher, item| {
                let out: Vec<Result<Vec<StoredMessage>, Error>> = match item {
                    Some(Ok(message)) => {
                        let bytes = message.json().len() as u64;
                        batcher.push(message, bytes).into_iter().map(Ok).collect()
                    }
                    Some(Err(e)) => vec![Err(e)],
                    None => batcher.take().into_iter().map(Ok).collect(),
                };
                futures::future::ready(Some(stream::iter(out)))
            })
            .flatten()
    }

    /// The whole path in memory.
    pub async fn full_history(&self, options: HistoryOptions) -> Result<Vec<StoredMessage>, Error> {
        all_of(self.history_windows(options, Windows::Whole)).await
    }

    /// [`Session::full_history`] in two steps: the session's version when the read began (as
    /// [`Session::versioned_history`] reports it), then the read itself, which a caller that
    /// holds the path at that version need not run.
    pub async fn versioned_full_history(
        &self,
        options: HistoryOptions,
    ) -> Result<
        (
            i64,
            impl Future<Output = Result<Vec<StoredMessage>, Error>> + Send + 'static,
        ),
        Error,
    > {
        let stats = self.store.stats(&self.key).await?;
        let version = stats.version;
        Ok((
            version,
            all_of(self.windows_from(stats, options, Windows::Whole)),
        ))
    }

    /// The most recent messages whose stored bytes (media counted at base64 size) fit
    /// `max_bytes` (always at least the leaf).
    pub async fn recent_history(
        &self,
        max_bytes: u64,
        leaf: Option<&str>,
    ) -> Result<RecentHistory, Error> {
        let mut recent = self.recent_stored(max_bytes, leaf).await?;
        recent.messages = self.resolved(recent.messages).await?;
        Ok(recent)
    }

    async fn recent_stored(
        &self,
        max_bytes: u64,
        leaf: Option<&str>,
    ) -> Result<RecentHistory, Error> {
        let suffix = self.store.path_suffix(&self.key, leaf, max_bytes).await?;
        if suffix.overlaid {
            let plan = self.plan_on_runs(leaf).await?;
            return plan
                .recent(self.store.clone(), self.key.clone(), max_bytes)
                .await;
        }
        let batches: Vec<Vec<StoredMessage>> =
            fetch_windows(self.store.clone(), self.key.clone(), suffix.rows)
                .try_collect()
                .await?;
        Ok(RecentHistory {
            messages: batches.into_iter().flatten().collect(),
            truncated: suffix.truncated,
            total_bytes: suffix.total_bytes,
        })
    }

    /// Full-text search over this session's messages, best match first. The query is plain
    /// words: no character in it is search syntax.
    pub async fn search(&self, query: &str, limit: usize) -> Result<Vec<SearchHit>, Error> {
        self.search_filtered(query, &SearchFilter::default(), limit)
            .await
    }

    /// [`Session::search`] keeping only the matches `filter` keeps (one role's, a time range's).
    pub async fn search_filtered(
        &self,
        query: &str,
        filter: &SearchFilter,
        limit: usize,
    ) -> Result<Vec<SearchHit>, Error> {
        let words = search::query_words(query);
        let mut hits = self.store.search(&self.key, &words, filter, limit).await?;
        self.drop_hidden(&mut hits, |h| &h.id).await?;
        Ok(hits)
    }

    /// Removes stored echoes of this session's compaction summaries. Reads the compactions only
    /// when an item could be one, so sessions without such ids pay nothing.
    pub(crate) async fn drop_hidden<T>(
        &self,
        items: &mut Vec<T>,
        id: impl Fn(&T) -> &str,
    ) -> Result<(), Error> {
        if items.iter().any(|item| may_be_hidden(id(item))) {
            let compactions = self.store.compactions(&self.key).await?;
            items.retain(|item| !is_hidden(id(item), &compactions));
        }
        Ok(())
    }
}

/// A path planned on its runs (see [`Session::plan_on_runs`]).
struct RunPlan {
    runs: PathRuns,
    /// Root first.
    spans: Vec<PathSpan>,
    /// The synthetic message of each compaction, by the compaction's index.
    summaries: Vec<StoredMessage>,
}

impl RunPlan {
    /// The path as it is shown, root first: stretches of consecutive rows and summaries.
    fn pieces(self) -> Vec<Piece> {
        let mut pieces: Vec<Piece> = Vec::new();
        for span in self.spans {
            match span {
                PathSpan::Rows { first, last } => pieces.extend(
                    self.runs
                        .seq_ranges(first, last)
                        .into_iter()
                        .map(|(a, b)| Piece::Rows(a, b)),
                ),
                PathSpan::Summary { compaction, .. } => {
                    pieces.push(Piece::Summary(self.summaries[compaction].clone()));
                }
            }
        }
        pieces
    }

    /// The path in either direction: each stretch of shown rows with range reads, each summary
    /// as it is. Nothing is read before the consumer asks for it.
    fn read<S: Store>(
        self,
        store: Arc<S>,
        key: SessionKey,
        newest_first: bool,
        windows: Windows,
    ) -> BoxStream<'static, Result<Vec<StoredMessage>, Error>> {
        let mut pieces = self.pieces();
        if newest_first {
            pieces.reverse();
        }
        read_pieces(store, key, pieces, newest_first, windows)
    }

    /// The longest suffix of the shown path that fits `max_bytes` (at least its last item), and
    /// the bytes of the whole shown path. Sizes come from [`Store::range_totals`], so only the
    /// rows of the suffix are read, newest first within the stretch where the budget runs out.
    async fn recent<S: Store>(
        self,
        store: Arc<S>,
        key: SessionKey,
        max_bytes: u64,
    ) -> Result<RecentHistory, Error> {
        let capped = self.runs.capped;
        let mut pieces = self.pieces();
        let sizes = piece_sizes(store.as_ref(), &key, &pieces).await?;
        let total_bytes = sizes.iter().map(|size| size.bytes).sum();
        let (mut used, mut first) = (0u64, pieces.len());
        while first > 0 && used + sizes[first - 1].bytes <= max_bytes {
            used += sizes[first - 1].bytes;
            first -= 1;
        }
        // The piece where the budget runs out gives the items from its end that still fit; the
        // path's last item is shown whatever its size.
        let mut truncated = capped || first > 1;
        let mut partial = Vec::new();
        if first > 0 {
            let is_last = first == pieces.len();
            match &pieces[first - 1] {
                Piece::Rows(a, b) => {
                    let mut newest =
                        range_down(store.clone(), key.clone(), *a, *b, Windows::Streamed).boxed();
                    'fill: while let Some(batch) = newest.try_next().await? {
                        for message in batch {
                            let forced = is_last && partial.is_empty();
                            if !forced && used + message.bytes > max_bytes {
                                truncated = true;
                                break 'fill;
                            }
                            used += message.bytes;
                            partial.push(message);
                        }
                    }
                    partial.reverse();
                }
                Piece::Summary(summary) if is_last => partial.push(summary.clone()),
                Piece::Summary(_) => truncated = true,
            }
        }
        let rest = pieces.split_off(first);
        let whole: Vec<Vec<StoredMessage>> = read_pieces(store, key, rest, false, Windows::Whole)
            .try_collect()
            .await?;
        partial.extend(whole.into_iter().flatten());
        Ok(RecentHistory {
            messages: partial,
            truncated,
            total_bytes,
        })
    }
}

/// The token estimate and bytes of each piece: rows from the store's running totals, summaries
/// as they are.
async fn piece_sizes<S: Store>(
    store: &S,
    key: &SessionKey,
    pieces: &[Piece],
) -> Result<Vec<RangeTotals>, Error> {
    let ranges: Vec<(i64, i64)> = pieces
        .iter()
        .filter_map(|piece| match piece {
            Piece::Rows(first, last) => Some((*first, *last)),
            Piece::Summary(_) => None,
        })
        .collect();
    let mut rows = store.range_totals(key, &ranges).await?.into_iter();
    Ok(pieces
        .iter()
        .map(|piece| match piece {
            Piece::Rows(..) => rows.next().unwrap_or_default(),
            Piece::Summary(summary) => RangeTotals {
                tokens: summary.token_estimate,
                bytes: summary.bytes,
            },
        })
        .collect())
}

/// One stretch of a planned read.
enum Piece {
    /// Rows with the consecutive seqs `first..=last`, read with range reads.
    Rows(i64, i64),
    /// A compaction's summary, standing for the rows it covers.
    Summary(StoredMessage),
}

/// Reads `pieces` in the order given, each run of rows in windows in the read's direction.
fn read_pieces<S: Store>(
    store: Arc<S>,
    key: SessionKey,
    pieces: Vec<Piece>,
    newest_first: bool,
    windows: Windows,
) -> BoxStream<'static, Result<Vec<StoredMessage>, Error>> {
    stream::iter(pieces)
        .map(move |piece| match piece {
            Piece::Rows(first, last) if newest_first => {
                range_down(store.clone(), key.clone(), first, last, windows).boxed()
            }
            Piece::Rows(first, last) => {
                range_up(store.clone(), key.clone(), first, last, windows).boxed()
            }
            Piece::Summary(summary) => stream::once(async move { Ok(vec![summary]) }).boxed(),
        })
        .flatten()
        .boxed()
}

fn append_result(outcome: WriteOutcome, version: Option<i64>) -> AppendResult {
    match outcome {
        WriteOutcome::Appended { message, inserted } => AppendResult {
            inserted,
            refused: false,
            message,
            version,
        },
        other => unreachable!("append answered with {other:?}"),
    }
}

/// Every message of `windows`, in order.
async fn all_of(
    windows: impl Stream<Item = Result<Vec<StoredMessage>, Error>>,
) -> Result<Vec<StoredMessage>, Error> {
    let mut windows = std::pin::pin!(windows);
    let mut all = Vec::new();
    while let Some(batch) = windows.try_next().await? {
        if all.is_empty() {
            all = batch;
        } else {
            all.extend(batch);
        }
    }
    Ok(all)
}

/// The messages of `windows` one by one; boxed so the stream is `Unpin` (callers can use
/// `next()` without pinning it).
fn one_by_one(
    windows: impl Stream<Item = Result<Vec<StoredMessage>, Error>> + Send + 'static,
) -> BoxStream<'static, Result<StoredMessage, Error>> {
    windows
        .map_ok(|batch| stream::iter(batch.into_iter().map(Ok)))
        .try_flatten()
        .boxed()
}

/// Rows with seqs `first..=last` in seq order, window by window.
fn range_up<S: Store>(
    store: Arc<S>,
    key: SessionKey,
    first: i64,
    last: i64,
    windows: Windows,
) -> impl Stream<Item = Result<Vec<StoredMessage>, Error>> + Send + 'static {
    let (max_rows, max_bytes) = windows.forward();
    stream::try_unfold((store, key, first), move |(store, key, from)| async move {
        if from > last {
            return Ok(None);
        }
        let batch = store
            .fetch_range(&key, from, last, max_rows, max_bytes)
            .await?;
        let Some(next) = batch.last().map(|m| m.seq + 1) else {
            return Ok(None);
        };
        Ok::<_, Error>(Some((batch, (store, key, next))))
    })
}

/// Rows with seqs `first..=last` newest first, in growing windows.
fn range_down<S: Store>(
    store: Arc<S>,
    key: SessionKey,
    first: i64,
    last: i64,
    windows: Windows,
) -> impl Stream<Item = Result<Vec<StoredMessage>, Error>> + Send + 'static {
    stream::try_unfold(
        (store, key, last, 0),
        move |(store, key, last, windows_read)| async move {
            if last < first {
                return Ok(None);
            }
            let limit = windows.newest(windows_read);
            let batch = store.fetch_range_newest(&key, first, last, limit).await?;
            let Some(oldest) = batch.last().map(|m| m.seq) else {
                return Ok(None);
            };
            Ok::<_, Error>(Some((batch, (store, key, oldest - 1, windows_read + 1))))
        },
    )
}

/// Fetches the content of `rows` window by window; earlier windows are not retained.
fn fetch_windows<S: Store>(
    store: Arc<S>,
    key: SessionKey,
    rows: Vec<PlanRow>,
) -> impl Stream<Item = Result<Vec<StoredMessage>, Error>> + Send + 'static {
    let windows: VecDeque<Range<usize>> =
        content_windows(&rows, WINDOW_MAX_ROWS, WINDOW_MAX_BYTES).into();
    let seqs: Vec<i64> = rows.into_iter().map(|r| r.seq).collect();
    stream::try_unfold(
        (store, key, seqs, windows),
        |(store, key, seqs, mut windows)| async move {
            let Some(window) = windows.pop_front() else {
                return Ok(None);
            };
            let batch = store.fetch(&key, &seqs[window]).await?;
            Ok::<_, Error>(Some((batch, (store, key, seqs, windows))))
        },
    )
}
