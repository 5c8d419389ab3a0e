//! Applying one [`WriteRequest`] inside the writer's transaction. Every function here runs on the
//! writer thread, inside a savepoint, so an error leaves nothing behind.

use std::collections::HashMap;

use rusqlite::{Connection, OptionalExtension, params};
use sessiondb_core::chunk::split_slices;
use sessiondb_core::message::StoredRow;
use sessiondb_core::plan::splice_rewires;
use sessiondb_core::{
    Change, MAX_PATH_DEPTH, MAX_PATH_ROWS, MAX_SLICE_BYTES, ParentSpec, PreparedMessage,
    SessionKey, StoreError, StoredMessage, UpdateOutcome, WriteOp, WriteOutcome, WriteRequest,
};

use crate::{backend_error, queries};

type Result<T> = std::result::Result<T, StoreError>;

/// The session row, loaded once per request and saved once at its end.
#[derive(Debug)]
struct SessionRow {
    stored: bool,
    dirty: bool,
    created_at: i64,
    updated_at: i64,
    last_message_at: Option<i64>,
    next_seq: i64,
    leaf_id: Option<String>,
    path_len: u64,
    path_tokens: u64,
    path_bytes: u64,
    stored_messages: u64,
    /// The path aggregates no longer describe the active leaf; recomputed once before saving.
    totals_stale: bool,
}

impl SessionRow {
    fn load(conn: &Connection, key: &SessionKey, now: i64) -> Result<Self> {
        let mut stmt = conn
            .prepare_cached(
                "SELECT created_at, updated_at, last_message_at, next_seq, leaf_id,
                        path_len, path_tokens, path_bytes, stored_messages
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
                    path_len: r.get::<_, i64>(5)? as u64,
                    path_tokens: r.get::<_, i64>(6)? as u64,
                    path_bytes: r.get::<_, i64>(7)? as u64,
                    stored_messages: r.get::<_, i64>(8)? as u64,
                    totals_stale: false,
                })
            })
            .optional()
            .map_err(backend_error)?;
        Ok(row.unwrap_or(SessionRow {
            stored: false,
            dirty: false,
            created_at: now,
            updated_at: now,
            last_message_at: None,
            next_seq: 1,
            leaf_id: None,
            path_len: 0,
            path_tokens: 0,
            path_bytes: 0,
            stored_messages: 0,
            totals_stale: false,
        }))
    }

    /// Records a new row that became the active leaf under `parent_id`.
    fn add_leaf(&mut self, message: &PreparedMessage, parent_id: Option<&str>, now: i64) {
        let extends_active_path = parent_id == self.leaf_id.as_deref();
        if extends_active_path && !self.totals_stale && (self.path_len as usize) < MAX_PATH_ROWS {
            self.path_len += 1;
            self.path_tokens += message.token_estimate;
            self.path_bytes += message.bytes();
        } else {
            self.totals_stale = true;
        }
        self.leaf_id = Some(message.id.clone());
        self.next_seq += 1;
        self.stored_messages += 1;
        self.touch(now);
    }

    fn touch(&mut self, now: i64) {
        self.dirty = true;
        self.updated_at = self.updated_at.max(now);
    }

    fn save(&mut self, conn: &Connection, key: &SessionKey) -> Result<()> {
        if !self.dirty {
            return Ok(());
        }
        if self.totals_stale {
            (self.path_len, self.path_tokens, self.path_bytes) = match &self.leaf_id {
                Some(leaf) => queries::path_totals(conn, key, leaf)?,
                None => (0, 0, 0),
            };
        }
        conn.prepare_cached(
            "INSERT OR REPLACE INTO sessions (namespace, id, created_at, updated_at,
                 last_message_at, next_seq, leaf_id, path_len, path_tokens, path_bytes,
                 stored_messages)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
        )
        .and_then(|mut stmt| {
            stmt.execute(params![
                key.namespace,
                key.session_id,
                self.created_at,
                self.updated_at,
                self.last_message_at,
                self.next_seq,
                self.leaf_id,
                self.path_len as i64,
                self.path_tokens as i64,
                self.path_bytes as i64,
                self.stored_messages as i64,
            ])
        })
        .map_err(backend_error)?;
        self.stored = true;
        Ok(())
    }
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
        session: SessionRow::load(conn, &request.key, request.now_ms)?,
        changes: Vec::with_capacity(request.ops.len()),
    };
    let mut outcomes = Vec::with_capacity(request.ops.len());
    for op in &request.ops {
        outcomes.push(match op {
            WriteOp::Append { message, parent } => tx.append(message, parent)?,
            WriteOp::Update { message } => WriteOutcome::Updated(tx.update(message)?),
            WriteOp::Upsert { message, parent } => {
                if queries::exists(conn, tx.key, &message.id)? {
                    WriteOutcome::Updated(tx.update(message)?)
                } else {
                    tx.append(message, parent)?
                }
            }
            WriteOp::Import {
                message,
                parent_id,
                created_at,
            } => tx.import(message, parent_id.as_deref(), *created_at)?,
            WriteOp::Delete { ids } => tx.delete(ids)?,
            WriteOp::Clear => tx.clear()?,
        });
    }
    tx.session.save(conn, tx.key)?;
    Ok((outcomes, tx.changes))
}

/// One request in flight: its session row and the changes it has made so far.
struct RequestTx<'a> {
    conn: &'a Connection,
    ctx: WriteContext,
    key: &'a SessionKey,
    now: i64,
    session: SessionRow,
    changes: Vec<Change>,
}

impl RequestTx<'_> {
    fn append(&mut self, message: &PreparedMessage, parent: &ParentSpec) -> Result<WriteOutcome> {
        if let Some(stored) = queries::message(self.conn, self.key, &message.id)? {
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
        let parent_id = match parent {
            ParentSpec::ActiveLeaf => self.session.leaf_id.clone(),
            ParentSpec::Root => None,
            ParentSpec::Id(id) if !id.is_empty() && queries::exists(self.conn, self.key, id)? => Some(id.clone()),
            ParentSpec::Id(_) => None,
        };
        // A parent that would make the tree loop is treated like an unknown one: a new root.
        let parent_id = match parent_id {
            Some(p) if self.closes_cycle(&message.id, &p)? => None,
            other => other,
        };
        let stored = self.insert(message, parent_id, self.now)?;
        self.session.add_leaf(message, stored.parent_id.as_deref(), self.now);
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
        let mut stmt = self.conn
            .prepare_cached(
                "SELECT content_hash, content_chunks, seq, parent_id, created_at, updated_at,
                        token_estimate, bytes
                   FROM messages WHERE namespace = ?1 AND session_id = ?2 AND id = ?3",
            )
            .map_err(backend_error)?;
        let current = stmt
            .query_row(params![self.key.namespace, self.key.session_id, message.id], |r| {
                Ok((
                    r.get::<_, Vec<u8>>(0)?,
                    r.get::<_, i64>(1)?,
                    StoredRow {
                        id: message.id.clone(),
                        role: message.role.clone(),
                        seq: r.get(2)?,
                        parent_id: r.get(3)?,
                        created_at: r.get(4)?,
                        updated_at: r.get(5)?,
                        token_estimate: message.token_estimate,
                    },
                    r.get::<_, i64>(6)? as u64,
                    r.get::<_, i64>(7)? as u64,
                ))
            })
            .optional()
            .map_err(backend_error)?;
        let Some((hash, old_chunks, mut row, old_tokens, old_bytes)) = current else {
            return Ok(UpdateOutcome::Missing);
        };
        if hash == message.content_hash.0 {
            return Ok(UpdateOutcome::Unchanged(StoredMessage::from_row(row, &message.body)));
        }
        let slices = split_slices(&message.body, MAX_SLICE_BYTES);
        let chunks = slices.len() as i64 - 1;
        self.conn.prepare_cached(
            "UPDATE messages SET role = ?4, content = ?5, content_chunks = ?6, bytes = ?7,
                    token_estimate = ?8, content_hash = ?9, updated_at = ?10
              WHERE namespace = ?1 AND session_id = ?2 AND id = ?3",
        )
        .and_then(|mut s| {
            s.execute(params![
                self.key.namespace,
                self.key.session_id,
                message.id,
                message.role,
                slices[0],
                chunks,
                message.bytes() as i64,
                message.token_estimate as i64,
                &message.content_hash.0[..],
                self.now,
            ])
        })
        .map_err(backend_error)?;
        if old_chunks > chunks {
            self.conn.prepare_cached(
                "DELETE FROM message_chunks
                  WHERE namespace = ?1 AND session_id = ?2 AND id = ?3 AND idx > ?4",
            )
            .and_then(|mut s| s.execute(params![self.key.namespace, self.key.session_id, message.id, chunks]))
            .map_err(backend_error)?;
        }
        self.write_chunks(&message.id, &slices)?;
        if self.ctx.search_index {
            self.reindex(message)?;
        }
        if self.session.leaf_id.as_deref() == Some(message.id.as_str()) && !self.session.totals_stale {
            self.session.path_tokens = self.session.path_tokens + message.token_estimate - old_tokens;
            self.session.path_bytes = self.session.path_bytes + message.bytes() - old_bytes;
        } else {
            // The row may sit anywhere on (or off) the active path.
            self.session.totals_stale = true;
        }
        self.session.touch(self.now);
        row.updated_at = Some(self.now);
        let stored = StoredMessage::from_row(row, &message.body);
        self.changes.push(Change::Update {
            message: stored.clone(),
        });
        Ok(UpdateOutcome::Changed(stored))
    }

    fn import(&mut self, message: &PreparedMessage, parent_id: Option<&str>, created_at: i64) -> Result<WriteOutcome> {
        if queries::exists(self.conn, self.key, &message.id)? {
            return Ok(WriteOutcome::Imported(None));
        }
        if let Some(parent) = parent_id
            && self.closes_cycle(&message.id, parent)?
        {
            return Err(StoreError::ParentCycle {
                id: message.id.clone(),
                parent_id: parent.to_owned(),
            });
        }
        let stored = self.insert(message, parent_id.map(str::to_owned), created_at)?;
        self.session.add_leaf(message, parent_id, created_at);
        self.session.last_message_at = self.session.last_message_at.max(Some(created_at));
        self.changes.push(Change::Import {
            message: stored.clone(),
            parent_id: parent_id.map(str::to_owned),
        });
        Ok(WriteOutcome::Imported(Some(stored)))
    }

    /// True when `parent` as the parent of the new row `id` would close a loop. Only rows whose
    /// parent is still missing can lead back to a new id (imports keep unvalidated parents so
    /// history may arrive out of order), so without such rows this costs one index probe.
    fn closes_cycle(&self, id: &str, parent: &str) -> Result<bool> {
        if parent == id {
            return Ok(true);
        }
        if !queries::has_children(self.conn, self.key, id)? {
            return Ok(false);
        }
        let mut current = parent.to_owned();
        // The tree is acyclic, so a walk to the root visits each stored row at most once.
        for _ in 0..=self.session.stored_messages {
            if current == id {
                return Ok(true);
            }
            match queries::parent_of(self.conn, self.key, &current)? {
                Some(Some(next)) => current = next,
                _ => return Ok(false),
            }
        }
        Ok(true)
    }

    fn delete(&mut self, ids: &[String]) -> Result<WriteOutcome> {
        let mut deleted: HashMap<String, Option<String>> = HashMap::new();
        for id in ids {
            if deleted.contains_key(id) {
                continue;
            }
            if let Some(parent) = queries::parent_of(self.conn, self.key, id)? {
                deleted.insert(id.clone(), parent);
            }
        }
        self.changes.push(Change::Delete {
            message_ids: ids.to_vec(),
        });
        if deleted.is_empty() {
            return Ok(WriteOutcome::Deleted { count: 0 });
        }
        let mut children = Vec::new();
        for id in deleted.keys() {
            for child in queries::child_ids(self.conn, self.key, id)? {
                children.push((child, id.clone()));
            }
        }
        for (child, new_parent) in splice_rewires(&deleted, &children, MAX_PATH_DEPTH) {
            self.conn.prepare_cached(
                "UPDATE messages SET parent_id = ?4 WHERE namespace = ?1 AND session_id = ?2 AND id = ?3",
            )
            .and_then(|mut s| s.execute(params![self.key.namespace, self.key.session_id, child, new_parent]))
            .map_err(backend_error)?;
        }
        for id in deleted.keys() {
            for sql in [
                "DELETE FROM messages WHERE namespace = ?1 AND session_id = ?2 AND id = ?3",
                "DELETE FROM message_chunks WHERE namespace = ?1 AND session_id = ?2 AND id = ?3",
            ] {
                self.conn.prepare_cached(sql)
                    .and_then(|mut s| s.execute(params![self.key.namespace, self.key.session_id, id]))
                    .map_err(backend_error)?;
            }
            self.unindex(id)?;
        }
        self.session.stored_messages -= deleted.len() as u64;
        if self.session.leaf_id.as_ref().is_some_and(|leaf| deleted.contains_key(leaf)) {
            self.session.leaf_id = self.conn
                .prepare_cached(
                    "SELECT id FROM messages WHERE namespace = ?1 AND session_id = ?2
                      ORDER BY seq DESC LIMIT 1",
                )
                .and_then(|mut s| {
                    s.query_row(params![self.key.namespace, self.key.session_id], |r| r.get(0))
                        .optional()
                })
                .map_err(backend_error)?;
        }
        self.session.totals_stale = true;
        self.session.touch(self.now);
        Ok(WriteOutcome::Deleted {
            count: deleted.len(),
        })
    }

    fn clear(&mut self) -> Result<WriteOutcome> {
        for sql in [
            "DELETE FROM messages WHERE namespace = ?1 AND session_id = ?2",
            "DELETE FROM message_chunks WHERE namespace = ?1 AND session_id = ?2",
        ] {
            self.conn.prepare_cached(sql)
                .and_then(|mut s| s.execute(params![self.key.namespace, self.key.session_id]))
                .map_err(backend_error)?;
        }
        if self.ctx.search_index {
            self.conn.prepare_cached("DELETE FROM message_search WHERE namespace = ?1 AND session_id = ?2")
                .and_then(|mut s| s.execute(params![self.key.namespace, self.key.session_id]))
                .map_err(backend_error)?;
        }
        self.changes.push(Change::Clear);
        if !self.session.stored {
            return Ok(WriteOutcome::Cleared);
        }
        self.session.leaf_id = None;
        self.session.path_len = 0;
        self.session.path_tokens = 0;
        self.session.path_bytes = 0;
        self.session.stored_messages = 0;
        self.session.totals_stale = false;
        self.session.touch(self.now);
        Ok(WriteOutcome::Cleared)
    }

    fn insert(&self, message: &PreparedMessage, parent_id: Option<String>, created_at: i64) -> Result<StoredMessage> {
        let slices = split_slices(&message.body, MAX_SLICE_BYTES);
        self.conn.prepare_cached(
            "INSERT INTO messages (namespace, session_id, id, seq, parent_id, role, content,
                 content_chunks, bytes, token_estimate, content_hash, created_at, updated_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, NULL)",
        )
        .and_then(|mut s| {
            s.execute(params![
                self.key.namespace,
                self.key.session_id,
                message.id,
                self.session.next_seq,
                parent_id,
                message.role,
                slices[0],
                slices.len() as i64 - 1,
                message.bytes() as i64,
                message.token_estimate as i64,
                &message.content_hash.0[..],
                created_at,
            ])
        })
        .map_err(backend_error)?;
        self.write_chunks(&message.id, &slices)?;
        if self.ctx.search_index && !message.search_text.is_empty() {
            self.index(&message.id, &message.role, &message.search_text)?;
        }
        let row = StoredRow {
            id: message.id.clone(),
            role: message.role.clone(),
            parent_id,
            seq: self.session.next_seq,
            created_at,
            updated_at: None,
            token_estimate: message.token_estimate,
        };
        Ok(StoredMessage::from_row(row, &message.body))
    }

    fn write_chunks(&self, id: &str, slices: &[&str]) -> Result<()> {
        for (idx, slice) in slices.iter().enumerate().skip(1) {
            self.conn.prepare_cached(
                "INSERT OR REPLACE INTO message_chunks (namespace, session_id, id, idx, content)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
            )
            .and_then(|mut s| s.execute(params![self.key.namespace, self.key.session_id, id, idx as i64, slice]))
            .map_err(backend_error)?;
        }
        Ok(())
    }

    fn index(&self, id: &str, role: &str, text: &str) -> Result<()> {
        self.conn.prepare_cached(
            "INSERT INTO message_search (namespace, session_id, message_id, role, text)
             VALUES (?1, ?2, ?3, ?4, ?5)",
        )
        .and_then(|mut s| s.execute(params![self.key.namespace, self.key.session_id, id, role, text]))
        .map_err(backend_error)?;
        Ok(())
    }

    fn unindex(&self, id: &str) -> Result<()> {
        if !self.ctx.search_index {
            return Ok(());
        }
        self.conn.prepare_cached(
            "DELETE FROM message_search WHERE namespace = ?1 AND session_id = ?2 AND message_id = ?3",
        )
        .and_then(|mut s| s.execute(params![self.key.namespace, self.key.session_id, id]))
        .map_err(backend_error)?;
        Ok(())
    }

    /// Replaces a message's index entry, touching the index only when its text or role changed.
    fn reindex(&self, message: &PreparedMessage) -> Result<()> {
        let current: Option<(String, String)> = self.conn
            .prepare_cached(
                "SELECT role, text FROM message_search
                  WHERE namespace = ?1 AND session_id = ?2 AND message_id = ?3",
            )
            .and_then(|mut s| {
                s.query_row(params![self.key.namespace, self.key.session_id, message.id], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })
                .optional()
            })
            .map_err(backend_error)?;
        let wanted = (!message.search_text.is_empty())
            .then(|| (message.role.clone(), message.search_text.clone()));
        if current == wanted {
            return Ok(());
        }
        self.unindex(&message.id)?;
        if wanted.is_some() {
            self.index(&message.id, &message.role, &message.search_text)?;
        }
        Ok(())
    }
}
