//! Applying one [`WriteRequest`] inside its transaction.
//!
//! The transaction first takes the session's advisory lock, so writes to one session — from
//! any instance — apply one at a time (seq allocation, the active leaf and the path aggregates
//! stay exact; an idempotent retry finds the id under the lock), while other sessions write in
//! parallel. Nothing is written until an op succeeds; an error rolls the whole request back.

use std::collections::{HashMap, HashSet};

use deadpool_postgres::GenericClient;
use sessiondb_core::chunk::split_slices;
use sessiondb_core::plan::splice_rewires;
use sessiondb_core::session_row::{PathGrowth, SessionRow};
use sessiondb_core::{
    Change, MAX_PATH_DEPTH, MAX_PATH_ROWS, MAX_SLICE_BYTES, MessageId, Parent, PreparedMessage,
    SessionAction, SessionKey, SessionPatch, SessionRecord, StoreError, StoredMessage,
    UpdateOutcome, WriteOp, WriteOutcome, WriteRequest,
};

use crate::queries::{self, Location, PathTotals};
use crate::sql::{Result, backend_error, exec, get, lookup, row, rows};
use crate::{attachments, context, feed, registry};

// Statements of the two pipelines of a request (see [`commit`]), named so they can be prepared
// before a pipeline is sent.
const LOAD_SESSION: &str =
    "SELECT created_at, updated_at, last_message_at, next_seq, leaf_id, leaf_seq,
                    path_len, path_tokens, path_bytes, path_capped, path_head_seq,
                    stored_messages, path_dense
               FROM sessions WHERE namespace = $1 AND id = $2";

const LOCK_SESSION: &str = "SELECT pg_advisory_xact_lock(hashtextextended($1 || chr(31) || $2, 0))";

const INSERT_ROWS: &str =
    "INSERT INTO messages (namespace, session_id, seq, id, parent_id, parent_seq, role,
             content, content_chunks, bytes, token_estimate, content_hash, created_at,
             updated_at, search_text)
         SELECT $1, $2, * FROM unnest($3::BIGINT[], $4::TEXT[], $5::TEXT[], $6::BIGINT[],
             $7::TEXT[], $8::TEXT[], $9::INTEGER[], $10::BIGINT[], $11::BIGINT[],
             $12::BYTEA[], $13::BIGINT[], $14::BIGINT[], $15::TEXT[])";

const LOAD_KNOWN: &str = "SELECT id, seq, parent_id, parent_seq FROM messages
              WHERE namespace = $1 AND session_id = $2 AND (id = ANY($3) OR parent_id = ANY($3))";

const SAVE_SESSION_UPDATE: &str =
    "UPDATE sessions SET created_at = $3, updated_at = $4, last_message_at = $5,
                    next_seq = $6, leaf_id = $7, leaf_seq = $8, path_len = $9, path_tokens = $10,
                    path_bytes = $11, path_capped = $12, path_head_seq = $13,
                    stored_messages = $14, path_dense = $15
              WHERE namespace = $1 AND id = $2";

const SAVE_SESSION_INSERT: &str =
    "INSERT INTO sessions (namespace, id, created_at, updated_at, last_message_at,
                 next_seq, leaf_id, leaf_seq, path_len, path_tokens, path_bytes, path_capped,
                 path_head_seq, stored_messages, path_dense)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)";

/// Loads the session row, or an absent one.
async fn load_session<C: GenericClient>(c: &C, key: &SessionKey, now: i64) -> Result<SessionRow> {
    let found = row(c, LOAD_SESSION, &[&key.namespace, &key.session_id]).await?;
    let Some(r) = found else {
        return Ok(SessionRow::absent(now));
    };
    Ok(SessionRow {
        stored: true,
        dirty: false,
        created_at: get(&r, 0)?,
        updated_at: get(&r, 1)?,
        last_message_at: get(&r, 2)?,
        next_seq: get(&r, 3)?,
        leaf_id: get(&r, 4)?,
        leaf_seq: get(&r, 5)?,
        path: PathTotals {
            len: get::<i64>(&r, 6)? as u64,
            tokens: get::<i64>(&r, 7)? as u64,
            bytes: get::<i64>(&r, 8)? as u64,
            capped: get(&r, 9)?,
            head_seq: get(&r, 10)?,
            dense: get(&r, 12)?,
        },
        stored_messages: get::<i64>(&r, 11)? as u64,
        // Rows keep no path totals here, so nothing compares epochs.
        path_epoch: 0,
        totals_stale: false,
        record: None,
    })
}

/// Recomputes stale path aggregates (every row of the request must be sent first).
async fn settle_totals<C: GenericClient>(
    c: &C,
    key: &SessionKey,
    session: &mut SessionRow,
) -> Result<()> {
    if session.dirty && session.totals_stale {
        session.path = match session.leaf_seq {
            Some(leaf) => queries::path_totals(c, key, leaf).await?,
            None => PathTotals::EMPTY,
        };
        session.totals_stale = false;
    }
    Ok(())
}

async fn save_session<C: GenericClient>(
    c: &C,
    key: &SessionKey,
    session: &SessionRow,
) -> Result<()> {
    if !session.dirty {
        return Ok(());
    }
    let sql = if session.stored {
        SAVE_SESSION_UPDATE
    } else {
        SAVE_SESSION_INSERT
    };
    let (len, tokens, bytes) = (
        session.path.len as i64,
        session.path.tokens as i64,
        session.path.bytes as i64,
    );
    let stored_messages = session.stored_messages as i64;
    exec(
        c,
        sql,
        &[
            &key.namespace,
            &key.session_id,
            &session.created_at,
            &session.updated_at,
            &session.last_message_at,
            &session.next_seq,
            &session.leaf_id,
            &session.leaf_seq,
            &len,
            &tokens,
            &bytes,
            &session.path.capped,
            &session.path.head_seq,
            &stored_messages,
            &session.path.dense,
        ],
    )
    .await?;
    Ok(())
}

/// Serialises the writers of one session (or template scope) until the transaction ends, on
/// every instance; it works before the session's row exists.
pub(crate) async fn lock_session<C: GenericClient>(c: &C, key: &SessionKey) -> Result<()> {
    exec(c, LOCK_SESSION, &[&key.namespace, &key.session_id]).await?;
    Ok(())
}

/// A committed request: its outcomes, and its change events with the feed position of the first.
pub(crate) struct Committed {
    pub outcomes: Vec<WriteOutcome>,
    pub changes: Vec<Change>,
    pub first_position: Option<u64>,
}

/// Runs `request` as one transaction on `c` and commits it. On an error the transaction is left
/// open (or aborted) for the caller to roll back.
///
/// Statements that do not depend on each other's answers are pipelined: `BEGIN`, the session
/// lock, the session row and the rows the messages name go out together, and so do the new
/// rows, the session row, the feed events and `COMMIT`. A lone append costs two round trips.
pub(crate) async fn commit<C: GenericClient>(c: &C, request: &WriteRequest) -> Result<Committed> {
    let key = &request.key;
    let named = Known::named_ids(&request.ops);
    // A pipeline is only in order if each statement goes out on its first poll: prepared ones do
    // (a connection prepares each statement once, here).
    prepare(c, &[LOCK_SESSION, LOAD_SESSION, LOAD_KNOWN]).await?;
    let (begun, locked, session, known) = tokio::join!(
        biased;
        c.batch_execute("BEGIN"),
        lock_session(c, key),
        load_session(c, key, request.now_ms),
        async {
            if named.is_empty() {
                Ok(None)
            } else {
                Known::load(c, key, named).await.map(Some)
            }
        },
    );
    begun.map_err(backend_error)?;
    locked?;
    let mut tx = RequestTx {
        c,
        key,
        now: request.now_ms,
        max_messages: request.max_messages,
        session: session?,
        changes: Vec::with_capacity(request.ops.len()),
        known: known?,
        pending: PendingRows::default(),
    };
    let mut outcomes = Vec::with_capacity(request.ops.len());
    for op in &request.ops {
        outcomes.push(tx.apply(op).await?);
    }
    if tx.session.totals_stale {
        tx.flush().await?;
        settle_totals(c, key, &mut tx.session).await?;
    }
    let rows = std::mem::take(&mut tx.pending);
    let changes = tx.changes;
    let session = tx.session;
    prepare(
        c,
        &[
            INSERT_ROWS,
            SAVE_SESSION_UPDATE,
            SAVE_SESSION_INSERT,
            registry::SAVE_RECORD,
            feed::RECORD,
        ],
    )
    .await?;
    // The feed's counter row is taken last: it stays locked until the commit.
    let (inserted, saved, record_saved, recorded, committed) = tokio::join!(
        biased;
        insert_rows(c, key, rows),
        save_session(c, key, &session),
        async {
            match &session.record {
                Some(record) => registry::save_record(c, key, record).await,
                None => Ok(()),
            }
        },
        async {
            match changes.is_empty() {
                true => Ok(None),
                false => feed::record(c, key, &changes).await.map(Some),
            }
        },
        c.batch_execute("COMMIT"),
    );
    // The first failure is the cause; the statements after it only found the transaction
    // aborted (and COMMIT then rolls back).
    inserted?;
    saved?;
    record_saved?;
    let first_position = recorded?;
    committed.map_err(backend_error)?;
    Ok(Committed {
        outcomes,
        changes,
        first_position,
    })
}

/// A parent link as stored: the parent's id and, when the parent exists, its seq.
type ParentLink = (String, Option<i64>);

/// One request in flight: its session row and the changes it has made so far.
struct RequestTx<'a, C> {
    c: &'a C,
    key: &'a SessionKey,
    now: i64,
    max_messages: Option<u64>,
    session: SessionRow,
    changes: Vec<Change>,
    /// Rows a multi-op request's messages name, read up front (see [`Known`]).
    known: Option<Known>,
    /// Inserted rows not yet sent: a batch of appends costs one statement, not one each.
    pending: PendingRows,
}

/// New message rows, column by column, sent by [`RequestTx::flush`] as one `INSERT … unnest`.
/// Anything that reads messages flushes first, so reads inside a request see its own rows.
#[derive(Debug, Default)]
struct PendingRows {
    seq: Vec<i64>,
    id: Vec<String>,
    parent_id: Vec<Option<String>>,
    parent_seq: Vec<Option<i64>>,
    role: Vec<String>,
    content: Vec<String>,
    content_chunks: Vec<i32>,
    bytes: Vec<i64>,
    token_estimate: Vec<i64>,
    content_hash: Vec<Vec<u8>>,
    created_at: Vec<i64>,
    updated_at: Vec<Option<i64>>,
    search_text: Vec<String>,
    /// Content bytes held.
    held: usize,
}

/// Prepares `statements` on this connection (a no-op for those it prepared before).
async fn prepare<C: GenericClient>(c: &C, statements: &[&str]) -> Result<()> {
    for sql in statements {
        c.prepare_cached(sql).await.map_err(backend_error)?;
    }
    Ok(())
}

/// Inserts new message rows with one statement.
async fn insert_rows<C: GenericClient>(c: &C, key: &SessionKey, rows: PendingRows) -> Result<()> {
    if rows.seq.is_empty() {
        return Ok(());
    }
    exec(
        c,
        INSERT_ROWS,
        &[
            &key.namespace,
            &key.session_id,
            &rows.seq,
            &rows.id,
            &rows.parent_id,
            &rows.parent_seq,
            &rows.role,
            &rows.content,
            &rows.content_chunks,
            &rows.bytes,
            &rows.token_estimate,
            &rows.content_hash,
            &rows.created_at,
            &rows.updated_at,
            &rows.search_text,
        ],
    )
    .await?;
    Ok(())
}

/// Pending content beyond which rows are sent without waiting for the request's end.
const MAX_PENDING_BYTES: usize = 8 << 20;

/// Where the rows a request's messages name sit (their own ids and the parents they name), and
/// which of those ids other rows name as their parent: read in one query before a request of
/// many ops, so a batch of n messages costs one look-up, not n. Kept up to date by inserts;
/// dropped by anything that moves or removes rows.
#[derive(Debug, Default)]
struct Known {
    /// The ids the query covered: for these, a missing entry in `rows` means no such row.
    covered: HashSet<String>,
    rows: HashMap<String, Location>,
    /// Ids (among `covered`) that some row names as its parent.
    named_parents: HashSet<String>,
}

impl Known {
    /// The ids a request's messages name that a look-up could find: their own (unless generated
    /// here, which no row can hold yet; an upsert looks its id up anyway) and their parents'.
    fn named_ids(ops: &[WriteOp]) -> HashSet<String> {
        let mut named = HashSet::new();
        for op in ops {
            match op {
                WriteOp::Append { message, parent } | WriteOp::Upsert { message, parent } => {
                    if !message.fresh_id || matches!(op, WriteOp::Upsert { .. }) {
                        named.insert(message.id.clone());
                    }
                    if let Parent::Id(id) = parent {
                        named.insert(id.clone());
                    }
                }
                WriteOp::Import {
                    message, parent_id, ..
                } => {
                    named.insert(message.id.clone());
                    named.extend(parent_id.clone());
                }
                _ => {}
            }
        }
        named
    }

    async fn load<C: GenericClient>(
        c: &C,
        key: &SessionKey,
        covered: HashSet<String>,
    ) -> Result<Self> {
        let ids: Vec<String> = covered.iter().map(|id| lookup(id)).collect();
        let found = rows(c, LOAD_KNOWN, &[&key.namespace, &key.session_id, &ids]).await?;
        let mut known = Known::default();
        for r in &found {
            let (id, parent_id): (String, Option<String>) = (get(r, 0)?, get(r, 2)?);
            if let Some(parent) = parent_id.as_ref().filter(|p| covered.contains(*p)) {
                known.named_parents.insert(parent.clone());
            }
            if covered.contains(&id) {
                known.rows.insert(id, (get(r, 1)?, parent_id, get(r, 3)?));
            }
        }
        known.covered = covered;
        Ok(known)
    }

    /// A row this request inserted; `orphans` when rows named it as their (missing) parent,
    /// which now point at it.
    fn inserted(&mut self, id: &str, location: Location, orphans: bool) {
        if orphans {
            for (_, parent, parent_seq) in self.rows.values_mut() {
                if parent.as_deref() == Some(id) {
                    *parent_seq = Some(location.0);
                }
            }
        }
        if let Some(parent) = &location.1 {
            self.named_parents.insert(parent.clone());
        }
        self.covered.insert(id.to_owned());
        self.rows.insert(id.to_owned(), location);
    }
}

impl<C: GenericClient> RequestTx<'_, C> {
    async fn locate(&mut self, id: &str) -> Result<Option<Location>> {
        if let Some(known) = self.known.as_ref().filter(|k| k.covered.contains(id)) {
            return Ok(known.rows.get(id).cloned());
        }
        self.flush().await?;
        queries::locate(self.c, self.key, id).await
    }

    /// Whether a row with the message's id exists, and whether rows name it as their parent.
    async fn id_status(&mut self, message: &PreparedMessage) -> Result<(bool, bool)> {
        if message.fresh_id {
            return Ok((false, false));
        }
        let id = message.id.as_str();
        if let Some(known) = self.known.as_ref().filter(|k| k.covered.contains(id)) {
            return Ok((
                known.rows.contains_key(id),
                known.named_parents.contains(id),
            ));
        }
        self.flush().await?;
        queries::id_status(self.c, self.key, id).await
    }

    /// Sends the pending rows.
    async fn flush(&mut self) -> Result<()> {
        insert_rows(self.c, self.key, std::mem::take(&mut self.pending)).await
    }

    async fn apply(&mut self, op: &WriteOp) -> Result<WriteOutcome> {
        let (c, key) = (self.c, self.key);
        if !matches!(
            op,
            WriteOp::Append { .. } | WriteOp::Import { .. } | WriteOp::Upsert { .. }
        ) {
            self.flush().await?;
        }
        if matches!(
            op,
            WriteOp::Delete { .. } | WriteOp::Clear | WriteOp::DeleteSession
        ) {
            self.known = None;
        }
        Ok(match op {
            WriteOp::Append { message, parent } => self.append(message, parent).await?,
            WriteOp::Update { message } => WriteOutcome::Updated(self.update(message).await?),
            WriteOp::Upsert { message, parent } => {
                if self.locate(&message.id).await?.is_some() {
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
            } => {
                self.import(message, parent_id.as_deref(), *created_at, *updated_at)
                    .await?
            }
            WriteOp::Delete { ids } => self.delete(ids).await?,
            WriteOp::Clear => self.clear().await?,
            WriteOp::CreateSession { record } => self.create_session(record),
            WriteOp::PatchSession { patch } => self.patch_session(patch).await?,
            WriteOp::DeleteSession => self.delete_session().await?,
            WriteOp::AddCompaction {
                compaction,
                by_compact,
            } => {
                registry::add_compaction(c, key, compaction).await?;
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
                registry::put_state(c, key, name, value).await?;
                self.session.touch(self.now);
                WriteOutcome::StatePut
            }
            WriteOp::DeleteState { name } => {
                WriteOutcome::Existed(registry::delete_state(c, key, name).await?)
            }
            WriteOp::PutBlock { block } => {
                context::put_block(c, key, block).await?;
                self.touch_scope();
                WriteOutcome::BlockWritten(block.clone())
            }
            WriteOp::WriteBlock { label, text, mode } => {
                let block = context::write_block(c, key, label, text, *mode).await?;
                self.touch_scope();
                WriteOutcome::BlockWritten(block)
            }
            WriteOp::DeleteBlock { label } => {
                WriteOutcome::Existed(context::delete_block(c, key, label).await?)
            }
            WriteOp::PutEntry { label, entry } => {
                context::put_entry(c, key, label, entry).await?;
                self.touch_scope();
                WriteOutcome::EntryPut
            }
            WriteOp::FreezePrompt { prompt, replace } => WriteOutcome::Prompt(
                context::freeze_prompt(c, key, prompt, self.now, *replace).await?,
            ),
        })
    }

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

    async fn patch_session(&mut self, patch: &SessionPatch) -> Result<WriteOutcome> {
        if !self.session.exists() {
            return Ok(WriteOutcome::Existed(false));
        }
        if self.session.record.is_none() {
            self.session.record = Some(
                registry::record(self.c, self.key)
                    .await?
                    .unwrap_or_default(),
            );
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

    async fn delete_session(&mut self) -> Result<WriteOutcome> {
        let existed = self.session.exists();
        attachments::drop_session_refs(self.c, self.key).await?;
        queries::delete_session_rows(self.c, self.key, context::DELETE_SESSION).await?;
        queries::delete_session_rows(
            self.c,
            self.key,
            &[
                "DELETE FROM messages WHERE namespace = $1 AND session_id = $2",
                "DELETE FROM message_chunks WHERE namespace = $1 AND session_id = $2",
                "DELETE FROM compactions WHERE namespace = $1 AND session_id = $2",
                "DELETE FROM session_state WHERE namespace = $1 AND session_id = $2",
                "DELETE FROM sessions WHERE namespace = $1 AND id = $2",
            ],
        )
        .await?;
        self.session = SessionRow::absent(self.now);
        if existed {
            self.changes.push(Change::Session {
                action: SessionAction::Deleted,
            });
        }
        Ok(WriteOutcome::Existed(existed))
    }

    async fn append(&mut self, message: &PreparedMessage, parent: &Parent) -> Result<WriteOutcome> {
        let (c, key) = (self.c, self.key);
        let (exists, orphans) = self.id_status(message).await?;
        if exists {
            self.flush().await?;
            let stored = queries::message(c, key, &message.id)
                .await?
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
            Parent::Id(id) => self
                .locate(id)
                .await?
                .map(|(seq, _, _)| (id.clone(), Some(seq))),
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
        self.flush().await?;
        let (c, key) = (self.c, self.key);
        let current = row(
            c,
            "SELECT seq, parent_id, content_hash, content_chunks, created_at, updated_at,
                    token_estimate, bytes
               FROM messages WHERE namespace = $1 AND session_id = $2 AND id = $3",
            &[&key.namespace, &key.session_id, &message.id],
        )
        .await?;
        let Some(r) = current else {
            return Ok(UpdateOutcome::Missing);
        };
        let (seq, parent_id, created_at, updated_at): (i64, Option<String>, i64, Option<i64>) =
            (get(&r, 0)?, get(&r, 1)?, get(&r, 4)?, get(&r, 5)?);
        if get::<&[u8]>(&r, 2)? == message.content_hash.0 {
            let parent_id = parent_id.map(MessageId::from);
            let unchanged = message.stored(seq, parent_id, created_at, updated_at);
            return Ok(UpdateOutcome::Unchanged(unchanged));
        }
        let old_chunks: i32 = get(&r, 3)?;
        let (old_tokens, old_bytes) = (get::<i64>(&r, 6)?, get::<i64>(&r, 7)?);
        let stored = message.stored(
            seq,
            parent_id.map(MessageId::from),
            created_at,
            Some(self.now),
        );
        let slices = split_slices(stored.json(), MAX_SLICE_BYTES);
        let chunks = slices.len() as i32 - 1;
        let (tokens, bytes) = (message.token_estimate as i64, message.bytes() as i64);
        exec(
            c,
            "UPDATE messages SET role = $4, content = $5, content_chunks = $6, bytes = $7,
                    token_estimate = $8, content_hash = $9, updated_at = $10, search_text = $11
              WHERE namespace = $1 AND session_id = $2 AND seq = $3",
            &[
                &key.namespace,
                &key.session_id,
                &seq,
                &message.role,
                &slices[0],
                &chunks,
                &bytes,
                &tokens,
                &&message.content_hash.0[..],
                &self.now,
                &message.search_text,
            ],
        )
        .await?;
        if old_chunks > chunks {
            exec(
                c,
                "DELETE FROM message_chunks
                  WHERE namespace = $1 AND session_id = $2 AND id = $3 AND idx > $4",
                &[&key.namespace, &key.session_id, &message.id, &chunks],
            )
            .await?;
        }
        self.write_chunks(&message.id, &slices).await?;
        attachments::put(c, &key.namespace, &message.payloads).await?;
        attachments::replace_refs(c, key, &message.id, &message.references).await?;
        let (token_delta, byte_delta) = (tokens - old_tokens, bytes - old_bytes);
        self.session
            .row_changed(seq, (token_delta, byte_delta), self.now);
        self.changes.push(Change::Update {
            message: stored.clone(),
        });
        Ok(UpdateOutcome::Changed(stored))
    }

    async fn import(
        &mut self,
        message: &PreparedMessage,
        parent_id: Option<&str>,
        created_at: i64,
        updated_at: Option<i64>,
    ) -> Result<WriteOutcome> {
        let (exists, orphans) = self.id_status(message).await?;
        if exists {
            return Ok(WriteOutcome::Imported(None));
        }
        let link = match parent_id {
            Some(p) if p == message.id || (orphans && self.reaches(p, &message.id).await?) => {
                return Err(StoreError::ParentCycle {
                    id: message.id.clone(),
                    parent_id: p.to_owned(),
                });
            }
            Some(p) => Some((p.to_owned(), self.locate(p).await?.map(|(seq, _, _)| seq))),
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
            match self.locate(&current).await? {
                Some((_, Some(parent), _)) => current = parent,
                _ => return Ok(false),
            }
        }
        Ok(true)
    }

    async fn delete(&mut self, ids: &[String]) -> Result<WriteOutcome> {
        let (c, key) = (self.c, self.key);
        let mut deleted: HashMap<String, Option<String>> = HashMap::new();
        let mut seq_of: HashMap<String, Option<i64>> = HashMap::new();
        let mut deleted_seqs = Vec::new();
        for id in ids {
            if deleted.contains_key(id) {
                continue;
            }
            if let Some((seq, parent_id, parent_seq)) = queries::locate(c, key, id).await? {
                if let Some(parent) = &parent_id {
                    seq_of.insert(parent.clone(), parent_seq);
                }
                deleted.insert(id.clone(), parent_id);
                deleted_seqs.push(seq);
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
            for (child, seq) in queries::child_links(c, key, id).await? {
                children.push((child.clone(), id.clone()));
                child_seq.insert(child, seq);
            }
        }
        for (child, parent) in splice_rewires(&deleted, &children, MAX_PATH_DEPTH) {
            let parent_seq = parent
                .as_ref()
                .and_then(|p| seq_of.get(p).copied().flatten());
            exec(
                c,
                "UPDATE messages SET parent_id = $4, parent_seq = $5
                  WHERE namespace = $1 AND session_id = $2 AND seq = $3",
                &[
                    &key.namespace,
                    &key.session_id,
                    &child_seq[&child],
                    &parent,
                    &parent_seq,
                ],
            )
            .await?;
        }
        let deleted_ids: Vec<String> = deleted.keys().cloned().collect();
        attachments::drop_message_refs(c, key, &deleted_ids).await?;
        exec(
            c,
            "DELETE FROM messages WHERE namespace = $1 AND session_id = $2 AND seq = ANY($3)",
            &[&key.namespace, &key.session_id, &deleted_seqs],
        )
        .await?;
        exec(
            c,
            "DELETE FROM message_chunks WHERE namespace = $1 AND session_id = $2 AND id = ANY($3)",
            &[&key.namespace, &key.session_id, &deleted_ids],
        )
        .await?;
        let leaf_deleted =
            (self.session.leaf_id.as_ref()).is_some_and(|leaf| deleted.contains_key(leaf));
        let newest = match leaf_deleted {
            true => Some(queries::newest(c, key).await?),
            false => None,
        };
        self.session.rows_deleted(deleted.len(), newest, self.now);
        Ok(WriteOutcome::Deleted {
            count: deleted.len(),
        })
    }

    async fn clear(&mut self) -> Result<WriteOutcome> {
        attachments::drop_session_refs(self.c, self.key).await?;
        queries::delete_session_rows(
            self.c,
            self.key,
            &[
                "DELETE FROM messages WHERE namespace = $1 AND session_id = $2",
                "DELETE FROM message_chunks WHERE namespace = $1 AND session_id = $2",
            ],
        )
        .await?;
        self.changes.push(Change::Clear);
        self.session.cleared(self.now);
        Ok(WriteOutcome::Cleared)
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
        let (c, key) = (self.c, self.key);
        self.session.check_quota(self.max_messages)?;
        let seq = self.session.next_seq;
        let (parent_id, parent_seq) = parent.map_or((None, None), |(id, seq)| (Some(id), seq));
        // The stored text is exactly what reads return.
        let stored = message.stored(
            seq,
            parent_id.as_deref().map(MessageId::from),
            created_at,
            updated_at,
        );
        let slices = split_slices(stored.json(), MAX_SLICE_BYTES);
        let chunks = slices.len() as i32 - 1;
        let (bytes, tokens) = (message.bytes() as i64, message.token_estimate as i64);
        let rows = &mut self.pending;
        rows.seq.push(seq);
        rows.id.push(message.id.clone());
        rows.parent_id.push(parent_id.clone());
        rows.parent_seq.push(parent_seq);
        rows.role.push(message.role.clone());
        rows.content.push(slices[0].to_owned());
        rows.content_chunks.push(chunks);
        rows.bytes.push(bytes);
        rows.token_estimate.push(tokens);
        rows.content_hash.push(message.content_hash.0.to_vec());
        rows.created_at.push(created_at);
        rows.updated_at.push(updated_at);
        rows.search_text.push(message.search_text.clone());
        rows.held += slices[0].len();
        self.write_chunks(&message.id, &slices).await?;
        if let Some(known) = &mut self.known {
            known.inserted(&message.id, (seq, parent_id.clone(), parent_seq), orphans);
        }
        // Rows naming this one as parent, and a capped path's head (looked up by slide_path),
        // must see it.
        if orphans
            || self.pending.held > MAX_PENDING_BYTES
            || self.session.path.len as usize >= MAX_PATH_ROWS
        {
            self.flush().await?;
        }
        if orphans {
            // Adopted orphans (and everything below them) get a longer path.
            exec(
                c,
                "UPDATE messages SET parent_seq = $4
                  WHERE namespace = $1 AND session_id = $2 AND parent_id = $3",
                &[&key.namespace, &key.session_id, &message.id, &seq],
            )
            .await?;
        }
        if !message.references.is_empty() {
            attachments::put(c, &key.namespace, &message.payloads).await?;
            attachments::add_refs(c, key, &message.id, &message.references).await?;
        }
        let size = (message.token_estimate, message.bytes());
        let grown = match self.session.extend_path(parent_seq, size) {
            PathGrowth::Extended => true,
            PathGrowth::Full => self.slide_path(size).await?,
            PathGrowth::Elsewhere => false,
        };
        // A new root is alone on its path; a branch's totals are walked once before saving.
        let totals = parent_seq
            .is_none()
            .then(|| PathTotals::lone_root(seq, size.0, size.1));
        self.session
            .add_leaf(&message.id, grown, totals, created_at.max(self.now));
        Ok(stored)
    }

    /// A full (capped) path that grows at the leaf by a row of `size` loses its oldest row.
    /// Returns false (recompute) when the head has several children.
    async fn slide_path(&mut self, size: (u64, u64)) -> Result<bool> {
        let (c, key) = (self.c, self.key);
        let Some(head) = self.session.path.head_seq else {
            return Ok(false);
        };
        let Some((head_id, tokens, bytes)) = queries::row_size(c, key, head).await? else {
            return Ok(false);
        };
        let [(_, next_head)] = queries::child_links(c, key, &head_id).await?[..] else {
            return Ok(false);
        };
        self.session.path.slide((tokens, bytes), next_head, size);
        Ok(true)
    }

    async fn write_chunks(&self, id: &str, slices: &[&str]) -> Result<()> {
        for (idx, slice) in slices.iter().enumerate().skip(1) {
            exec(
                self.c,
                "INSERT INTO message_chunks (namespace, session_id, id, idx, content)
                 VALUES ($1, $2, $3, $4, $5)
                 ON CONFLICT (namespace, session_id, id, idx) DO UPDATE SET content = excluded.content",
                &[
                    &self.key.namespace,
                    &self.key.session_id,
                    &id,
                    &(idx as i32),
                    slice,
                ],
            )
            .await?;
        }
        Ok(())
    }
}
