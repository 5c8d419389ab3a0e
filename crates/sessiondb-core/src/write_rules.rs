//! What each [`WriteOp`] does, written once for every backend: idempotent appends, parent
//! resolution, refusing loops, imports, updates (an unchanged one writes nothing), deletes that
//! splice children onto the nearest surviving ancestor, clears, and which ops touch the session
//! and publish which change. A backend implements [`WriteTx`], the reads and writes of its
//! tables inside the request's transaction, and runs [`apply_request`] there.
//!
//! The rules are `async` so that a backend with a network round trip per statement can await
//! it; a backend whose calls return at once (SQLite) can poll the future once.

use std::collections::HashMap;
use std::future::Future;

use crate::context::{BlockDef, WriteMode};
use crate::plan::{PathTotals, splice_rewires};
use crate::session_row::{PathGrowth, SessionRow};
use crate::store::{ContextEntry, FrozenPrompt, PathRuns, WriteCondition};
use crate::{
    Change, Compaction, MAX_PATH_DEPTH, MessageId, Parent, PreparedMessage, SessionAction,
    SessionKey, SessionRecord, StoreError, StoredMessage, UpdateOutcome, WriteOp, WriteOutcome,
    WriteRequest, Written,
};

/// Where a stored row sits: its seq, its parent's id, and the parent's seq when the parent
/// exists.
pub type Location = (i64, Option<String>, Option<i64>);

/// A parent link as stored: the parent's id and, when the parent exists, its seq.
type ParentLink = (String, Option<i64>);

type Result<T> = std::result::Result<T, StoreError>;

/// A row an append or import adds, with seq `session.next_seq`.
#[derive(Debug, Clone, Copy)]
pub struct NewRow<'a> {
    pub message: &'a PreparedMessage,
    /// What reads will return: the row's text is exactly its JSON.
    pub stored: &'a StoredMessage,
    pub parent_seq: Option<i64>,
    /// Rows already name this id as their (missing) parent: they are attached to it.
    pub orphans: bool,
}

/// The stored row an update replaces.
#[derive(Debug, Clone)]
pub struct CurrentRow {
    pub seq: i64,
    pub parent_id: Option<String>,
    pub content_hash: Vec<u8>,
    /// Continuation slices of its text.
    pub content_chunks: i64,
    pub created_at: i64,
    pub updated_at: Option<i64>,
    pub token_estimate: u64,
    pub bytes: u64,
}

/// A backend's reads and writes inside the transaction of one request, all in the request's
/// session (or template scope). Each call either completes or fails the whole request.
pub trait WriteTx {
    /// Called before each op: a backend that buffers new rows can send them first.
    fn before_op(&mut self, _op: &WriteOp) -> impl Future<Output = Result<()>> {
        async { Ok(()) }
    }
    /// Whether a row with this id exists, and whether rows name it as their parent.
    fn id_status(&mut self, id: &str) -> impl Future<Output = Result<(bool, bool)>>;
    fn message(&mut self, id: &str) -> impl Future<Output = Result<Option<StoredMessage>>>;
    fn locate(&mut self, id: &str) -> impl Future<Output = Result<Option<Location>>>;
    /// The id, tokens and bytes of the row at `seq`.
    fn row_size(&mut self, seq: i64) -> impl Future<Output = Result<Option<(String, u64, u64)>>>;
    /// The active (capped) path ending at the row `leaf` as runs of consecutive seqs
    /// ([`PathRuns`]; nothing located).
    fn path_runs(&mut self, leaf: i64) -> impl Future<Output = Result<PathRuns>>;
    /// The children of `id` (ids and seqs).
    fn child_links(&mut self, id: &str) -> impl Future<Output = Result<Vec<(String, i64)>>>;
    /// The newest row (id and seq).
    fn newest(&mut self) -> impl Future<Output = Result<Option<(String, i64)>>>;
    /// Stores a new row with its slices, media and index entries, and points the orphans it
    /// adopts at it. Returns the totals of the row's whole path when known (a backend that
    /// stores per-row path totals keeps them valid with `session.path_epoch`).
    fn insert(
        &mut self,
        session: &SessionRow,
        row: NewRow<'_>,
    ) -> impl Future<Output = Result<Option<PathTotals>>>;
    fn current(&mut self, id: &str) -> impl Future<Output = Result<Option<CurrentRow>>>;
    /// Rewrites a changed message in place (`stored` keeps its seq, parent and creation time).
    /// A backend that stores per-row path totals moves `session.path_epoch` when they go stale.
    fn rewrite(
        &mut self,
        session: &mut SessionRow,
        current: &CurrentRow,
        message: &PreparedMessage,
        stored: &StoredMessage,
    ) -> impl Future<Output = Result<()>>;
    fn reparent(
        &mut self,
        child_seq: i64,
        parent_id: Option<&str>,
        parent_seq: Option<i64>,
    ) -> impl Future<Output = Result<()>>;
    /// Deletes rows (ids and seqs) with their slices, media references and index entries.
    fn delete_rows(&mut self, rows: &[(String, i64)]) -> impl Future<Output = Result<()>>;
    /// Deletes every message row and what hangs off them.
    fn clear(&mut self) -> impl Future<Output = Result<()>>;
    /// Deletes the session: its row, messages, compactions, state and context. `last_version` is
    /// the deleted row's version (`None`: there was no row); the backend raises its namespace's
    /// deletion floor to it, which it hands to [`SessionRow::absent`] from then on.
    fn delete_session(&mut self, last_version: Option<i64>) -> impl Future<Output = Result<()>>;
    fn record(&mut self) -> impl Future<Output = Result<Option<SessionRecord>>>;
    fn add_compaction(&mut self, compaction: &Compaction) -> impl Future<Output = Result<()>>;
    fn put_state(&mut self, name: &str, value: &str) -> impl Future<Output = Result<()>>;
    fn delete_state(&mut self, name: &str) -> impl Future<Output = Result<bool>>;
    fn put_block(&mut self, block: &BlockDef) -> impl Future<Output = Result<()>>;
    fn write_block(
        &mut self,
        label: &str,
        text: &str,
        mode: WriteMode,
    ) -> impl Future<Output = Result<BlockDef>>;
    fn delete_block(&mut self, label: &str) -> impl Future<Output = Result<bool>>;
    fn put_entry(&mut self, label: &str, entry: &ContextEntry) -> impl Future<Output = Result<()>>;
    fn delete_entry(&mut self, label: &str, key: &str) -> impl Future<Output = Result<bool>>;
    fn freeze_prompt(
        &mut self,
        prompt: &str,
        now: i64,
        replace: bool,
    ) -> impl Future<Output = Result<FrozenPrompt>>;
}

/// Applies every op of `request` to `session` (its row as loaded) through `tx`. Returns what the
/// request wrote (the outcomes, and the session's version once it commits) and the changes to
/// publish once the transaction commits; the session row is left in `session` for the backend
/// to save (when `dirty`, with its record when `Some`, and with its next version).
pub async fn apply_request<T: WriteTx>(
    tx: &mut T,
    request: &WriteRequest,
    session: &mut SessionRow,
) -> Result<(Written, Vec<Change>)> {
    match &request.condition {
        None => {}
        Some(WriteCondition::Absent) if session.exists() => return Err(StoreError::SessionExists),
        Some(WriteCondition::Absent) => {}
        Some(WriteCondition::Leaf(_)) if !session.exists() => return Err(StoreError::NoSession),
        Some(WriteCondition::Leaf(expected)) if session.leaf_id != *expected => {
            return Err(StoreError::LeafMoved {
                expected: expected.clone(),
                found: session.leaf_id.clone(),
            });
        }
        Some(WriteCondition::Leaf(_)) => {}
        Some(WriteCondition::Version(_)) if !session.exists() => {
            return Err(StoreError::NoSession);
        }
        Some(WriteCondition::Version(expected)) if session.version != *expected => {
            return Err(StoreError::VersionMoved {
                expected: *expected,
                found: session.version,
            });
        }
        Some(WriteCondition::Version(_)) => {}
        Some(WriteCondition::Message(read))
            if tx.message(&read.id).await?.as_ref() != Some(read) =>
        {
            return Err(StoreError::MessageChanged {
                id: read.id.to_string(),
            });
        }
        Some(WriteCondition::Message(_)) => {}
    }
    let mut rules = Rules {
        tx,
        key: &request.key,
        now: request.now_ms,
        max_messages: request.max_messages,
        session,
        changes: Vec::with_capacity(request.ops.len()),
    };
    let mut outcomes = Vec::with_capacity(request.ops.len());
    for op in &request.ops {
        rules.tx.before_op(op).await?;
        outcomes.push(rules.apply(op).await?);
    }
    let changes = rules.changes;
    if session.dirty {
        session.version = session.next_version(request.now_ms);
    }
    let version = session.exists().then_some(session.version);
    Ok((Written { outcomes, version }, changes))
}

/// One request in flight: its session row and the changes it has made so far.
struct Rules<'a, T> {
    tx: &'a mut T,
    key: &'a SessionKey,
    now: i64,
    max_messages: Option<u64>,
    session: &'a mut SessionRow,
    changes: Vec<Change>,
}

impl<T: WriteTx> Rules<'_, T> {
    async fn apply(&mut self, op: &WriteOp) -> Result<WriteOutcome> {
        Ok(match op {
            WriteOp::Append { message, parent } => self.append(message, parent).await?,
            WriteOp::Update { message } => WriteOutcome::Updated(self.update(message).await?),
            WriteOp::Upsert { message, parent } => {
                if self.tx.locate(&message.id).await?.is_some() {
                    WriteOutcome::Updated(self.update(message).await?)
                } else {
                    self.append(message, parent).await?
                }
            }
            WriteOp::Import {
                message,
                parent_id,
                created_at,
                updated_at,
                replace,
            } => {
                let (exists, orphans) = self.id_status(message).await?;
                match (exists, replace) {
                    (true, true) => WriteOutcome::Updated(self.update(message).await?),
                    (true, false) => WriteOutcome::Imported(None),
                    (false, _) => {
                        let parent_id = parent_id.as_deref();
                        self.import(message, parent_id, orphans, *created_at, *updated_at)
                            .await?
                    }
                }
            }
            WriteOp::Delete { ids } => self.delete(ids).await?,
            WriteOp::Clear => {
                self.tx.clear().await?;
                self.changes.push(Change::Clear);
                self.session.cleared(self.now);
                WriteOutcome::Cleared
            }
            WriteOp::CreateSession { record, created_at } => {
                self.create_session(record, *created_at)
            }
            WriteOp::PatchSession { patch } => {
                if !self.session.exists() {
                    return Ok(WriteOutcome::Existed(false));
                }
                if self.session.record.is_none() {
                    self.session.record = Some(self.tx.record().await?.unwrap_or_default());
                }
                if let Some(record) = &mut self.session.record {
                    patch.apply(record);
                }
                self.session.touch(self.now);
                self.changes.push(Change::Session {
                    action: SessionAction::Updated,
                });
                WriteOutcome::Existed(true)
            }
            WriteOp::DeleteSession { updated_before } => {
                let existed = self.session.exists();
                if updated_before
                    .is_some_and(|before| !existed || self.session.updated_at >= before)
                {
                    return Ok(WriteOutcome::Existed(false));
                }
                let last_version = self.session.version;
                self.tx
                    .delete_session(existed.then_some(last_version))
                    .await?;
                *self.session = SessionRow::absent(self.now, last_version);
                if existed {
                    self.changes.push(Change::Session {
                        action: SessionAction::Deleted,
                    });
                }
                WriteOutcome::Existed(existed)
            }
            WriteOp::AddCompaction {
                compaction,
                by_compact,
            } => {
                self.tx.add_compaction(compaction).await?;
                self.session.touch(self.now);
                let compaction = compaction.clone();
                self.changes.push(if *by_compact {
                    Change::Compact { compaction }
                } else {
                    Change::Compaction { compaction }
                });
                WriteOutcome::CompactionAdded
            }
            WriteOp::PutState { name, value } => {
                self.tx.put_state(name, value).await?;
                self.session.touch(self.now);
                WriteOutcome::StatePut
            }
            WriteOp::DeleteState { name } => {
                WriteOutcome::Existed(self.tx.delete_state(name).await?)
            }
            WriteOp::PutBlock { block } => {
                self.tx.put_block(block).await?;
                self.touch_scope();
                WriteOutcome::BlockWritten(block.clone())
            }
            WriteOp::WriteBlock { label, text, mode } => {
                let block = self.tx.write_block(label, text, *mode).await?;
                self.touch_scope();
                WriteOutcome::BlockWritten(block)
            }
            WriteOp::DeleteBlock { label } => {
                WriteOutcome::Existed(self.tx.delete_block(label).await?)
            }
            WriteOp::PutEntry { label, entry } => {
                self.tx.put_entry(label, entry).await?;
                self.touch_scope();
                WriteOutcome::EntryPut
            }
            WriteOp::DeleteEntry { label, key } => {
                WriteOutcome::Existed(self.tx.delete_entry(label, key).await?)
            }
            WriteOp::FreezePrompt { prompt, replace } => {
                WriteOutcome::Prompt(self.tx.freeze_prompt(prompt, self.now, *replace).await?)
            }
        })
    }

    /// A context write registers (and touches) its session, as a state write does; the
    /// namespace's template scope has no session row.
    fn touch_scope(&mut self) {
        if !self.key.is_templates() {
            self.session.touch(self.now);
        }
    }

    fn create_session(&mut self, record: &SessionRecord, created_at: Option<i64>) -> WriteOutcome {
        if self.session.exists() {
            return WriteOutcome::SessionCreated { created: false };
        }
        self.session.record = Some(record.clone());
        if let Some(created_at) = created_at {
            self.session.created_at = created_at;
        }
        self.session.touch(self.now);
        self.changes.push(Change::Session {
            action: SessionAction::Created,
        });
        WriteOutcome::SessionCreated { created: true }
    }

    /// Whether a row with the message's id exists, and whether rows name it as their parent.
    async fn id_status(&mut self, message: &PreparedMessage) -> Result<(bool, bool)> {
        if message.fresh_id {
            return Ok((false, false));
        }
        self.tx.id_status(&message.id).await
    }

    async fn append(&mut self, message: &PreparedMessage, parent: &Parent) -> Result<WriteOutcome> {
        let (exists, orphans) = self.id_status(message).await?;
        if exists {
            let stored =
                self.tx.message(&message.id).await?.ok_or_else(|| {
                    StoreError::Corrupt(format!("message `{}` vanished", message.id))
                })?;
            self.changes.push(Change::Append {
                message: stored.clone(),
                parent: parent.clone(),
                inserted: false,
            });
            return Ok(WriteOutcome::Appended {
                message: stored,
                inserted: false,
            });
        }
        let link: Option<ParentLink> = match parent {
            Parent::ActiveLeaf => self
                .session
                .leaf_id
                .clone()
                .map(|id| (id, self.session.leaf_seq)),
            Parent::Root => None,
            Parent::Id(id) if id.is_empty() => None,
            Parent::Id(id) => {
                (self.tx.locate(id).await?).map(|(seq, _, _)| (id.clone(), Some(seq)))
            }
        };
        // A parent that would make the tree loop is treated like an unknown one: a new root.
        let link = match link {
            Some((p, _)) if orphans && self.reaches(&p, &message.id).await? => None,
            other => other,
        };
        let stored = self.insert(message, link, orphans, self.now, None).await?;
        self.session.last_message_at = Some(self.now);
        self.changes.push(Change::Append {
            message: stored.clone(),
            parent: parent.clone(),
            inserted: true,
        });
        Ok(WriteOutcome::Appended {
            message: stored,
            inserted: true,
        })
    }

    async fn update(&mut self, message: &PreparedMessage) -> Result<UpdateOutcome> {
        let Some(current) = self.tx.current(&message.id).await? else {
            return Ok(UpdateOutcome::Missing);
        };
        let parent_id = current.parent_id.as_deref().map(MessageId::from);
        if current.content_hash == message.content_hash.0 {
            let unchanged = message.stored(
                current.seq,
                parent_id,
                current.created_at,
                current.updated_at,
            );
            return Ok(UpdateOutcome::Unchanged(unchanged));
        }
        let stored = message.stored(current.seq, parent_id, current.created_at, Some(self.now));
        self.tx
            .rewrite(self.session, &current, message, &stored)
            .await?;
        let growth = (
            message.token_estimate as i64 - current.token_estimate as i64,
            message.bytes() as i64 - current.bytes as i64,
        );
        let counted = match self.session.counts_row(current.seq) {
            Some(counted) => Some(counted),
            None => self.on_active_path(current.seq).await?,
        };
        self.session.row_changed(counted, growth, self.now);
        self.changes.push(Change::Update {
            message: stored.clone(),
        });
        Ok(UpdateOutcome::Changed(stored))
    }

    /// Imports a message whose id the session does not have (`orphans`: stored rows name that
    /// id as their parent, which has not arrived until now).
    async fn import(
        &mut self,
        message: &PreparedMessage,
        parent_id: Option<&str>,
        orphans: bool,
        created_at: i64,
        updated_at: Option<i64>,
    ) -> Result<WriteOutcome> {
        let link = match parent_id {
            Some(p) if p == message.id || (orphans && self.reaches(p, &message.id).await?) => {
                return Err(StoreError::ParentCycle {
                    id: message.id.clone(),
                    parent_id: p.to_owned(),
                });
            }
            Some(p) => Some((
                p.to_owned(),
                self.tx.locate(p).await?.map(|(seq, _, _)| seq),
            )),
            None => None,
        };
        let stored = self
            .insert(message, link, orphans, created_at, updated_at)
            .await?;
        self.session.last_message_at = self.session.last_message_at.max(Some(created_at));
        self.changes.push(Change::Import {
            message: stored.clone(),
            parent_id: parent_id.map(str::to_owned),
        });
        Ok(WriteOutcome::Imported(Some(stored)))
    }

    /// Whether following parent links from `from` meets `target`. Only rows whose parent is
    /// still missing can point at a new id, so callers ask only when such rows exist.
    async fn reaches(&mut self, from: &str, target: &str) -> Result<bool> {
        let mut current = from.to_owned();
        // The tree is acyclic, so a walk to the root visits each stored row at most once.
        for _ in 0..=self.session.stored_messages {
            if current == target {
                return Ok(true);
            }
            match self.tx.locate(&current).await? {
                Some((_, Some(parent), _)) => current = parent,
                _ => return Ok(false),
            }
        }
        Ok(true)
    }

    async fn delete(&mut self, ids: &[String]) -> Result<WriteOutcome> {
        let mut deleted: HashMap<String, Option<String>> = HashMap::new();
        let mut seq_of: HashMap<String, Option<i64>> = HashMap::new();
        let mut deleted_rows = Vec::new();
        for id in ids {
            if deleted.contains_key(id) {
                continue;
            }
            if let Some((seq, parent_id, parent_seq)) = self.tx.locate(id).await? {
                if let Some(parent) = &parent_id {
                    seq_of.insert(parent.clone(), parent_seq);
                }
                deleted.insert(id.clone(), parent_id);
                deleted_rows.push((id.clone(), seq));
            }
        }
        self.changes.push(Change::Delete {
            message_ids: ids.to_vec(),
        });
        if deleted.is_empty() {
            return Ok(WriteOutcome::Deleted { count: 0 });
        }
        let mut children = Vec::new();
        let mut child_seq = HashMap::new();
        for (id, _) in &deleted_rows {
            for (child, seq) in self.tx.child_links(id).await? {
                children.push((child.clone(), id.clone()));
                child_seq.insert(child, seq);
            }
        }
        for (child, parent) in splice_rewires(&deleted, &children, MAX_PATH_DEPTH) {
            let parent_seq = parent
                .as_ref()
                .and_then(|p| seq_of.get(p).copied().flatten());
            self.tx
                .reparent(child_seq[&child], parent.as_deref(), parent_seq)
                .await?;
        }
        self.tx.delete_rows(&deleted_rows).await?;
        let leaf_deleted = (self.session.leaf_id.as_ref()).is_some_and(|l| deleted.contains_key(l));
        let newest = match leaf_deleted {
            true => Some(self.tx.newest().await?),
            false => None,
        };
        self.session.rows_deleted(deleted.len(), newest, self.now);
        Ok(WriteOutcome::Deleted {
            count: deleted.len(),
        })
    }

    /// Inserts a new row with the next seq and makes it the active leaf. `orphans` says whether
    /// rows already name this id as their (missing) parent; they are attached to it.
    async fn insert(
        &mut self,
        message: &PreparedMessage,
        parent: Option<ParentLink>,
        orphans: bool,
        created_at: i64,
        updated_at: Option<i64>,
    ) -> Result<StoredMessage> {
        self.session.check_quota(self.max_messages)?;
        if orphans {
            // Adopted orphans (and everything below them) get a longer path.
            self.session.path_epoch += 1;
        }
        let (parent_id, parent_seq) = parent.map_or((None, None), |(id, seq)| (Some(id), seq));
        let stored = message.stored(
            self.session.next_seq,
            parent_id.as_deref().map(MessageId::from),
            created_at,
            updated_at,
        );
        let row = NewRow {
            message,
            stored: &stored,
            parent_seq,
            orphans,
        };
        let totals = self.tx.insert(self.session, row).await?;
        let size = (message.token_estimate, message.bytes());
        let grown = match self.session.extend_path(parent_seq, size) {
            PathGrowth::Extended => true,
            PathGrowth::Full => self.slide_path(size).await?,
            PathGrowth::Elsewhere => false,
        };
        self.session
            .add_leaf(&message.id, grown, totals, created_at.max(self.now));
        Ok(stored)
    }

    /// Whether the row at `seq` is on the active (capped) path, from the path's runs: one seek per
    /// branch point on it instead of a walk of its rows. `None` when the session's aggregates are
    /// stale anyway, or do not describe the path the runs find (then they are recomputed).
    async fn on_active_path(&mut self, seq: i64) -> Result<Option<bool>> {
        let Some(leaf) = self.session.leaf_seq.filter(|_| !self.session.totals_stale) else {
            return Ok(None);
        };
        let runs = self.tx.path_runs(leaf).await?;
        let agrees =
            runs.len() as u64 == self.session.path.len && runs.capped == self.session.path.capped;
        Ok(agrees.then(|| runs.position(seq).is_some()))
    }

    /// A full (capped) path that grows at the leaf by a row of `size` loses its oldest row. O(1)
    /// on a linear path; returns false (recompute) when the head has several children and the
    /// one on the path is not known without a walk.
    async fn slide_path(&mut self, size: (u64, u64)) -> Result<bool> {
        let Some(head) = self.session.path.head_seq else {
            return Ok(false);
        };
        let Some((head_id, tokens, bytes)) = self.tx.row_size(head).await? else {
            return Ok(false);
        };
        let [(_, next_head)] = self.tx.child_links(&head_id).await?[..] else {
            return Ok(false);
        };
        self.session.path.slide((tokens, bytes), next_head, size);
        Ok(true)
    }
}
