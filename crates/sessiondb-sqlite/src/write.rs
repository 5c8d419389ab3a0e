//! Applying one [`WriteRequest`] inside the writer's transaction. Everything here runs on the
//! writer thread inside a transaction or savepoint that an error rolls back, so it leaves nothing
//! behind.

use std::collections::HashMap;

use rusqlite::{Connection, OptionalExtension, params};
use sessiondb_core::chunk::split_slices;
use sessiondb_core::plan::splice_rewires;
use sessiondb_core::session_row::{PathGrowth, SessionRow};
use sessiondb_core::{
    Change, MAX_PATH_DEPTH, MAX_SLICE_BYTES, MessageId, Parent, PreparedMessage, SessionAction,
    SessionKey, SessionPatch, SessionRecord, StoreError, StoredMessage, UpdateOutcome, WriteOp,
    WriteOutcome, WriteRequest,
};

use crate::queries::{self, PathTotals};
use crate::{attachments, backend_error, context, registry};

type Result<T> = std::result::Result<T, StoreError>;

/// Runs one statement with a parameter list.
fn exec(conn: &Connection, sql: &str, params: &[&dyn rusqlite::ToSql]) -> Result<usize> {
    conn.prepare_cached(sql)
        .and_then(|mut stmt| stmt.execute(params))
        .map_err(backend_error)
}

/// Loads the session row, or an absent one.
fn load_session(conn: &Connection, key: &SessionKey, now: i64) -> Result<SessionRow> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT created_at, updated_at, last_message_at, next_seq, leaf_id, leaf_seq,
                    path_len, path_tokens, path_bytes, path_capped, path_head_seq,
                    stored_messages, path_epoch, path_dense
               FROM sessions WHERE namespace = ?1 AND id = ?2",
        )
        .map_err(backend_error)?;
    let row = stmt
        .query_row(params![key.namespace, key.session_id], |r| {
            Ok(SessionRow {
                stored: true,
                dirty: false,
                created_at: r.get(0)?,
                updated_at: r.get(1)?,
                last_message_at: r.get(2)?,
                next_seq: r.get(3)?,
                leaf_id: r.get(4)?,
                leaf_seq: r.get(5)?,
                path: PathTotals {
                    len: r.get::<_, i64>(6)? as u64,
                    tokens: r.get::<_, i64>(7)? as u64,
                    bytes: r.get::<_, i64>(8)? as u64,
                    capped: r.get(9)?,
                    head_seq: r.get(10)?,
                    dense: r.get(13)?,
                },
                stored_messages: r.get::<_, i64>(11)? as u64,
                path_epoch: r.get(12)?,
                totals_stale: false,
                record: None,
            })
        })
        .optional()
        .map_err(backend_error)?;
    Ok(row.unwrap_or_else(|| SessionRow::absent(now)))
}

/// Saves a changed session row, first recomputing stale path aggregates.
fn save_session(conn: &Connection, key: &SessionKey, session: &mut SessionRow) -> Result<()> {
    if !session.dirty {
        return Ok(());
    }
    if session.totals_stale {
        session.path = match session.leaf_seq {
            Some(leaf) => queries::path_totals(conn, key, leaf)?,
            None => PathTotals::EMPTY,
        };
    }
    // An existing row is updated in place: REPLACE would delete and re-insert it. created_at
    // never changes and is not assigned: SQLite rewrites the entries of every index over an
    // assigned column (here `sessions_by_created`), whether its value changed or not.
    let sql = if session.stored {
        "UPDATE sessions SET updated_at = ?4, last_message_at = ?5,
                next_seq = ?6, leaf_id = ?7, leaf_seq = ?8, path_len = ?9, path_tokens = ?10,
                path_bytes = ?11, path_capped = ?12, path_head_seq = ?13,
                stored_messages = ?14, path_epoch = ?15, path_dense = ?16
          WHERE namespace = ?1 AND id = ?2"
    } else {
        "INSERT INTO sessions (namespace, id, created_at, updated_at, last_message_at,
             next_seq, leaf_id, leaf_seq, path_len, path_tokens, path_bytes, path_capped,
             path_head_seq, stored_messages, path_epoch, path_dense)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)"
    };
    exec(
        conn,
        sql,
        params![
            key.namespace,
            key.session_id,
            session.created_at,
            session.updated_at,
            session.last_message_at,
            session.next_seq,
            session.leaf_id,
            session.leaf_seq,
            session.path.len as i64,
            session.path.tokens as i64,
            session.path.bytes as i64,
            session.path.capped,
            session.path.head_seq,
            session.stored_messages as i64,
            session.path_epoch,
            session.path.dense,
        ],
    )?;
    session.stored = true;
    Ok(())
}

/// What the writer knows about the search index while applying a request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WriteContext {
    pub search_index: bool,
}

/// Applies all ops of `request`; returns their outcomes and the change events to publish once
/// the transaction commits.
pub(crate) fn apply(
    conn: &Connection,
    ctx: WriteContext,
    request: &WriteRequest,
) -> Result<(Vec<WriteOutcome>, Vec<Change>)> {
    let mut tx = RequestTx {
        conn,
        ctx,
        key: &request.key,
        now: request.now_ms,
        max_messages: request.max_messages,
        session: load_session(conn, &request.key, request.now_ms)?,
        changes: Vec::with_capacity(request.ops.len()),
    };
    let mut outcomes = Vec::with_capacity(request.ops.len());
    for op in &request.ops {
        outcomes.push(match op {
            WriteOp::Append { message, parent } => tx.append(message, parent)?,
            WriteOp::Update { message } => WriteOutcome::Updated(tx.update(message)?),
            WriteOp::Upsert { message, parent } => {
                if queries::locate(conn, tx.key, &message.id)?.is_some() {
                    WriteOutcome::Updated(tx.update(message)?)
                } else {
                    tx.append(message, parent)?
                }
            }
            WriteOp::Import {
                message,
                parent_id,
                created_at,
                updated_at,
            } => tx.import(message, parent_id.as_deref(), *created_at, *updated_at)?,
            WriteOp::Delete { ids } => tx.delete(ids)?,
            WriteOp::Clear => tx.clear()?,
            WriteOp::CreateSession { record } => tx.create_session(record),
            WriteOp::PatchSession { patch } => tx.patch_session(patch)?,
            WriteOp::DeleteSession => tx.delete_session()?,
            WriteOp::AddCompaction {
                compaction,
                by_compact,
            } => {
                registry::add_compaction(conn, tx.key, compaction)?;
                tx.session.touch(tx.now);
                let compaction = compaction.clone();
                tx.changes.push(if *by_compact {
                    Change::Compact { compaction }
                } else {
                    Change::Compaction { compaction }
                });
                WriteOutcome::CompactionAdded
            }
            WriteOp::PutState { name, value } => {
                registry::put_state(conn, tx.key, name, value)?;
                tx.session.touch(tx.now);
                WriteOutcome::StatePut
            }
            WriteOp::DeleteState { name } => {
                WriteOutcome::Existed(registry::delete_state(conn, tx.key, name)?)
            }
            WriteOp::PutBlock { block } => {
                context::put_block(conn, tx.key, block)?;
                tx.touch_scope();
                WriteOutcome::BlockWritten(block.clone())
            }
            WriteOp::WriteBlock { label, text, mode } => {
                let block = context::write_block(conn, tx.key, label, text, *mode)?;
                tx.touch_scope();
                WriteOutcome::BlockWritten(block)
            }
            WriteOp::DeleteBlock { label } => {
                WriteOutcome::Existed(context::delete_block(conn, tx.key, label)?)
            }
            WriteOp::PutEntry { label, entry } => {
                context::put_entry(conn, tx.key, label, entry)?;
                tx.touch_scope();
                WriteOutcome::EntryPut
            }
            WriteOp::FreezePrompt { prompt, replace } => WriteOutcome::Prompt(
                context::freeze_prompt(conn, tx.key, prompt, tx.now, *replace)?,
            ),
        });
    }
    save_session(conn, tx.key, &mut tx.session)?;
    if let Some(record) = &tx.session.record {
        registry::save_record(conn, tx.key, record)?;
    }
    Ok((outcomes, tx.changes))
}

/// A parent link as stored: the parent's id and, when the parent exists, its seq.
type ParentLink = (String, Option<i64>);

/// One request in flight: its session row and the changes it has made so far.
struct RequestTx<'a> {
    conn: &'a Connection,
    ctx: WriteContext,
    key: &'a SessionKey,
    now: i64,
    max_messages: Option<u64>,
    session: SessionRow,
    changes: Vec<Change>,
}

impl RequestTx<'_> {
    /// A context write registers (and touches) its session, as a state write does; the
    /// namespace's template scope has no session row.
    fn touch_scope(&mut self) {
        if !self.key.is_templates() {
            self.session.touch(self.now);
        }
    }

    fn create_session(&mut self, record: &SessionRecord) -> WriteOutcome {
        if self.session.exists() {
            return WriteOutcome::SessionCreated { created: false };
        }
        self.session.record = Some(record.clone());
        self.session.touch(self.now);
        self.changes.push(Change::Session {
            action: SessionAction::Created,
        });
        WriteOutcome::SessionCreated { created: true }
    }

    fn patch_session(&mut self, patch: &SessionPatch) -> Result<WriteOutcome> {
        if !self.session.exists() {
            return Ok(WriteOutcome::Existed(false));
        }
        if self.session.record.is_none() {
            self.session.record = Some(registry::record(self.conn, self.key)?.unwrap_or_default());
        }
        if let Some(record) = &mut self.session.record {
            patch.apply(record);
        }
        self.session.touch(self.now);
        self.changes.push(Change::Session {
            action: SessionAction::Updated,
        });
        Ok(WriteOutcome::Existed(true))
    }

    fn delete_session(&mut self) -> Result<WriteOutcome> {
        let existed = self.session.exists();
        attachments::drop_session_refs(self.conn, self.key)?;
        context::delete_session(self.conn, self.key)?;
        registry::delete_session_rows(self.conn, self.key, self.ctx.search_index)?;
        self.session = SessionRow::absent(self.now);
        if existed {
            self.changes.push(Change::Session {
                action: SessionAction::Deleted,
            });
        }
        Ok(WriteOutcome::Existed(existed))
    }

    /// Whether a row with the message's id exists, and whether rows name it as their parent.
    fn id_status(&self, message: &PreparedMessage) -> Result<(bool, bool)> {
        if message.fresh_id {
            return Ok((false, false));
        }
        queries::id_status(self.conn, self.key, &message.id)
    }

    fn append(&mut self, message: &PreparedMessage, parent: &Parent) -> Result<WriteOutcome> {
        let (exists, orphans) = self.id_status(message)?;
        if exists {
            let stored = queries::message(self.conn, self.key, &message.id)?
                .ok_or_else(|| StoreError::Corrupt(format!("message `{}` vanished", message.id)))?;
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
                queries::locate(self.conn, self.key, id)?.map(|(seq, _, _)| (id.clone(), Some(seq)))
            }
        };
        // A parent that would make the tree loop is treated like an unknown one: a new root.
        let link = match link {
            Some((p, _)) if orphans && self.reaches(&p, &message.id)? => None,
            other => other,
        };
        let stored = self.insert(message, link, orphans, self.now, None)?;
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

    fn update(&mut self, message: &PreparedMessage) -> Result<UpdateOutcome> {
        let current = self
            .conn
            .prepare_cached(
                "SELECT seq, parent_id, content_hash, content_chunks, created_at, updated_at,
                        token_estimate, bytes
                   FROM messages WHERE namespace = ?1 AND session_id = ?2 AND id = ?3",
            )
            .and_then(|mut stmt| {
                stmt.query_row(
                    params![self.key.namespace, self.key.session_id, message.id],
                    |r| {
                        Ok((
                            (r.get(0)?, r.get(1)?, r.get(4)?, r.get(5)?),
                            r.get::<_, Vec<u8>>(2)?,
                            r.get::<_, i64>(3)?,
                            r.get::<_, i64>(6)? as u64,
                            r.get::<_, i64>(7)? as u64,
                        ))
                    },
                )
                .optional()
            })
            .map_err(backend_error)?;
        let Some((position, hash, old_chunks, old_tokens, old_bytes)) = current else {
            return Ok(UpdateOutcome::Missing);
        };
        let (seq, parent_id, created_at, updated_at): (i64, Option<String>, i64, Option<i64>) =
            position;
        if hash == message.content_hash.0 {
            let parent_id = parent_id.map(MessageId::from);
            let unchanged = message.stored(seq, parent_id, created_at, updated_at);
            return Ok(UpdateOutcome::Unchanged(unchanged));
        }
        let stored = message.stored(
            seq,
            parent_id.map(MessageId::from),
            created_at,
            Some(self.now),
        );
        let slices = split_slices(stored.json(), MAX_SLICE_BYTES);
        let chunks = slices.len() as i64 - 1;
        exec(
            self.conn,
            "UPDATE messages SET role = ?4, content = ?5, content_chunks = ?6, bytes = ?7,
                    token_estimate = ?8, content_hash = ?9, updated_at = ?10
              WHERE namespace = ?1 AND session_id = ?2 AND seq = ?3",
            params![
                self.key.namespace,
                self.key.session_id,
                stored.seq,
                message.role,
                slices[0],
                chunks,
                message.bytes() as i64,
                message.token_estimate as i64,
                &message.content_hash.0[..],
                self.now,
            ],
        )?;
        if old_chunks > chunks {
            exec(
                self.conn,
                "DELETE FROM message_chunks
                  WHERE namespace = ?1 AND session_id = ?2 AND id = ?3 AND idx > ?4",
                params![self.key.namespace, self.key.session_id, message.id, chunks],
            )?;
        }
        self.write_chunks(&message.id, &slices)?;
        attachments::put(self.conn, &self.key.namespace, &message.payloads)?;
        attachments::replace_refs(self.conn, self.key, &message.id, &message.references)?;
        if self.ctx.search_index {
            self.reindex(message)?;
        }
        let (token_delta, byte_delta) = (
            message.token_estimate as i64 - old_tokens as i64,
            message.bytes() as i64 - old_bytes as i64,
        );
        if queries::has_children(self.conn, self.key, &message.id)? {
            // Every path through this row changes: stored totals below it are stale.
            self.session.path_epoch += 1;
        } else {
            exec(
                self.conn,
                "UPDATE messages SET path_tokens = path_tokens + ?4, path_bytes = path_bytes + ?5
                  WHERE namespace = ?1 AND session_id = ?2 AND seq = ?3",
                params![
                    self.key.namespace,
                    self.key.session_id,
                    stored.seq,
                    token_delta,
                    byte_delta
                ],
            )?;
        }
        self.session
            .row_changed(stored.seq, (token_delta, byte_delta), self.now);
        self.changes.push(Change::Update {
            message: stored.clone(),
        });
        Ok(UpdateOutcome::Changed(stored))
    }

    fn import(
        &mut self,
        message: &PreparedMessage,
        parent_id: Option<&str>,
        created_at: i64,
        updated_at: Option<i64>,
    ) -> Result<WriteOutcome> {
        let (exists, orphans) = self.id_status(message)?;
        if exists {
            return Ok(WriteOutcome::Imported(None));
        }
        let link = match parent_id {
            Some(p) if p == message.id || (orphans && self.reaches(p, &message.id)?) => {
                return Err(StoreError::ParentCycle {
                    id: message.id.clone(),
                    parent_id: p.to_owned(),
                });
            }
            Some(p) => Some((
                p.to_owned(),
                queries::locate(self.conn, self.key, p)?.map(|(seq, _, _)| seq),
            )),
            None => None,
        };
        let stored = self.insert(message, link, orphans, created_at, updated_at)?;
        self.session.last_message_at = self.session.last_message_at.max(Some(created_at));
        self.changes.push(Change::Import {
            message: stored.clone(),
            parent_id: parent_id.map(str::to_owned),
        });
        Ok(WriteOutcome::Imported(Some(stored)))
    }

    /// Whether following parent links from `from` meets `target`. Only rows whose parent is
    /// still missing can point at a new id, so callers ask only when such rows exist.
    fn reaches(&self, from: &str, target: &str) -> Result<bool> {
        let mut current = from.to_owned();
        // The tree is acyclic, so a walk to the root visits each stored row at most once.
        for _ in 0..=self.session.stored_messages {
            if current == target {
                return Ok(true);
            }
            match queries::locate(self.conn, self.key, &current)? {
                Some((_, Some(parent), _)) => current = parent,
                _ => return Ok(false),
            }
        }
        Ok(true)
    }

    fn delete(&mut self, ids: &[String]) -> Result<WriteOutcome> {
        let mut deleted: HashMap<String, Option<String>> = HashMap::new();
        let mut seq_of: HashMap<String, Option<i64>> = HashMap::new();
        let mut deleted_seqs = Vec::new();
        for id in ids {
            if deleted.contains_key(id) {
                continue;
            }
            if let Some((seq, parent_id, parent_seq)) = queries::locate(self.conn, self.key, id)? {
                if let Some(parent) = &parent_id {
                    seq_of.insert(parent.clone(), parent_seq);
                }
                deleted.insert(id.clone(), parent_id);
                deleted_seqs.push((id.clone(), seq));
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
        for id in deleted.keys() {
            for (child, seq) in queries::child_links(self.conn, self.key, id)? {
                children.push((child.clone(), id.clone()));
                child_seq.insert(child, seq);
            }
        }
        for (child, parent) in splice_rewires(&deleted, &children, MAX_PATH_DEPTH) {
            let parent_seq = parent
                .as_ref()
                .and_then(|p| seq_of.get(p).copied().flatten());
            exec(
                self.conn,
                "UPDATE messages SET parent_id = ?4, parent_seq = ?5
                  WHERE namespace = ?1 AND session_id = ?2 AND seq = ?3",
                params![
                    self.key.namespace,
                    self.key.session_id,
                    child_seq[&child],
                    parent,
                    parent_seq
                ],
            )?;
        }
        let deleted_ids: Vec<&str> = deleted_seqs.iter().map(|(id, _)| id.as_str()).collect();
        attachments::drop_message_refs(self.conn, self.key, &deleted_ids)?;
        for (id, seq) in &deleted_seqs {
            exec(
                self.conn,
                "DELETE FROM messages WHERE namespace = ?1 AND session_id = ?2 AND seq = ?3",
                params![self.key.namespace, self.key.session_id, seq],
            )?;
            exec(
                self.conn,
                "DELETE FROM message_chunks WHERE namespace = ?1 AND session_id = ?2 AND id = ?3",
                params![self.key.namespace, self.key.session_id, id],
            )?;
            self.unindex(id)?;
        }
        let leaf_deleted =
            (self.session.leaf_id.as_ref()).is_some_and(|leaf| deleted.contains_key(leaf));
        let newest = match leaf_deleted {
            true => Some(queries::newest(self.conn, self.key)?),
            false => None,
        };
        self.session.rows_deleted(deleted.len(), newest, self.now);
        Ok(WriteOutcome::Deleted {
            count: deleted.len(),
        })
    }

    fn clear(&mut self) -> Result<WriteOutcome> {
        attachments::drop_session_refs(self.conn, self.key)?;
        registry::delete_messages(self.conn, self.key, self.ctx.search_index)?;
        self.changes.push(Change::Clear);
        self.session.cleared(self.now);
        Ok(WriteOutcome::Cleared)
    }

    /// Inserts a new row with the next seq and makes it the active leaf. `orphans` says whether
    /// rows already name this id as their (missing) parent; they are attached to it.
    fn insert(
        &mut self,
        message: &PreparedMessage,
        parent: Option<ParentLink>,
        orphans: bool,
        created_at: i64,
        updated_at: Option<i64>,
    ) -> Result<StoredMessage> {
        self.session.check_quota(self.max_messages)?;
        let seq = self.session.next_seq;
        let (parent_id, parent_seq) = parent.map_or((None, None), |(id, seq)| (Some(id), seq));
        if orphans {
            // Adopted orphans (and everything below them) get a longer path.
            self.session.path_epoch += 1;
        }
        let totals = match parent_seq {
            Some(parent) => self.path_totals_to(parent)?,
            None => Some(PathTotals::default()),
        }
        .map(|t| PathTotals {
            len: t.len + 1,
            tokens: t.tokens + message.token_estimate,
            bytes: t.bytes + message.bytes(),
            capped: false,
            // A new root is the newest row and alone on its path.
            head_seq: parent_seq.is_none().then_some(seq),
            dense: parent_seq.is_none(),
        });
        // The stored text is exactly what reads return.
        let stored = message.stored(
            seq,
            parent_id.as_deref().map(MessageId::from),
            created_at,
            updated_at,
        );
        let slices = split_slices(stored.json(), MAX_SLICE_BYTES);
        exec(
            self.conn,
            "INSERT INTO messages (namespace, session_id, seq, id, parent_id, parent_seq, role,
                 content, content_chunks, bytes, token_estimate, content_hash, created_at,
                 path_len, path_tokens, path_bytes, path_epoch, updated_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17,
                     ?18)",
            params![
                self.key.namespace,
                self.key.session_id,
                seq,
                message.id,
                parent_id,
                parent_seq,
                message.role,
                slices[0],
                slices.len() as i64 - 1,
                message.bytes() as i64,
                message.token_estimate as i64,
                &message.content_hash.0[..],
                created_at,
                totals.map(|t| t.len as i64),
                totals.map(|t| t.tokens as i64),
                totals.map(|t| t.bytes as i64),
                totals.map(|_| self.session.path_epoch),
                updated_at,
            ],
        )?;
        self.write_chunks(&message.id, &slices)?;
        if orphans {
            exec(
                self.conn,
                "UPDATE messages INDEXED BY messages_by_parent SET parent_seq = ?4
                  WHERE namespace = ?1 AND session_id = ?2 AND parent_id = ?3
                    AND parent_seq IS NULL",
                params![self.key.namespace, self.key.session_id, message.id, seq],
            )?;
        }
        if !message.references.is_empty() {
            attachments::put(self.conn, &self.key.namespace, &message.payloads)?;
            attachments::add_refs(self.conn, self.key, &message.id, &message.references)?;
        }
        if self.ctx.search_index && !message.search_text.is_empty() {
            self.index(&message.id, &message.role, &message.search_text)?;
        }
        let size = (message.token_estimate, message.bytes());
        let grown = match self.session.extend_path(parent_seq, size) {
            PathGrowth::Extended => true,
            PathGrowth::Full => self.slide_path(size)?,
            PathGrowth::Elsewhere => false,
        };
        self.session
            .add_leaf(&message.id, grown, totals, created_at.max(self.now));
        Ok(stored)
    }

    /// A full (capped) path that grows at the leaf by a row of `size` loses its oldest row. O(1)
    /// on a linear path; returns false (recompute) when the head has several children and the
    /// one on the path is not known without a walk.
    fn slide_path(&mut self, size: (u64, u64)) -> Result<bool> {
        let Some(head) = self.session.path.head_seq else {
            return Ok(false);
        };
        let Some((head_id, tokens, bytes)) = queries::row_size(self.conn, self.key, head)? else {
            return Ok(false);
        };
        let [(_, next_head)] = queries::child_links(self.conn, self.key, &head_id)?[..] else {
            return Ok(false);
        };
        self.session.path.slide((tokens, bytes), next_head, size);
        Ok(true)
    }

    /// Totals of the whole path ending at `seq`: stored ones when still valid, else walked (and
    /// then only if the path is within the cap, so they are exact).
    fn path_totals_to(&self, seq: i64) -> Result<Option<PathTotals>> {
        let session = &self.session;
        if session.leaf_seq == Some(seq) && !session.totals_stale && !session.path.capped {
            return Ok(Some(session.path));
        }
        if let Some((totals, epoch)) = queries::stored_path_totals(self.conn, self.key, seq)?
            && epoch == self.session.path_epoch
        {
            return Ok(Some(totals));
        }
        let walked = queries::path_totals(self.conn, self.key, seq)?;
        Ok((!walked.capped).then_some(walked))
    }

    fn write_chunks(&self, id: &str, slices: &[&str]) -> Result<()> {
        for (idx, slice) in slices.iter().enumerate().skip(1) {
            exec(
                self.conn,
                "INSERT OR REPLACE INTO message_chunks (namespace, session_id, id, idx, content)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                params![
                    self.key.namespace,
                    self.key.session_id,
                    id,
                    idx as i64,
                    slice
                ],
            )?;
        }
        Ok(())
    }

    /// Adds a row for the next search to index: its rowid is above the mark and every other
    /// row's, even when the newest indexed rows were deleted (see `schema::SEARCH_TABLES`).
    fn index(&self, id: &str, role: &str, text: &str) -> Result<()> {
        exec(
            self.conn,
            concat!(
                "INSERT INTO message_search
                     (rowid, namespace, session_id, message_id, role, pending_text)
                 VALUES (max(coalesce((SELECT max(rowid) FROM message_search), 0), ",
                crate::schema::search_indexed_mark!(),
                ") + 1, ?1, ?2, ?3, ?4, ?5)"
            ),
            params![self.key.namespace, self.key.session_id, id, role, text],
        )?;
        Ok(())
    }

    fn unindex(&self, id: &str) -> Result<()> {
        if self.ctx.search_index {
            exec(
                self.conn,
                "DELETE FROM message_search
                  WHERE namespace = ?1 AND session_id = ?2 AND message_id = ?3",
                params![self.key.namespace, self.key.session_id, id],
            )?;
        }
        Ok(())
    }

    /// Replaces the index entry of a message whose content changed. (The index keeps no texts to
    /// compare with, and a changed message mostly has a changed text.)
    fn reindex(&self, message: &PreparedMessage) -> Result<()> {
        self.unindex(&message.id)?;
        if !message.search_text.is_empty() {
            self.index(&message.id, &message.role, &message.search_text)?;
        }
        Ok(())
    }
}
