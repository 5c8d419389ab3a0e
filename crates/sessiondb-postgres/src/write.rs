//! Applying one [`WriteRequest`] inside its transaction: what each op does is core's
//! [`write_rules`]; this module loads and saves the session row and gives the rules their reads
//! and writes in SQL ([`WriteTx`]), buffering new rows so a batch inserts them in one statement.
//!
//! The transaction first takes the session's advisory lock, so writes to one session — from
//! any instance — apply one at a time (seq allocation, the active leaf and the path aggregates
//! stay exact; an idempotent retry finds the id under the lock), while other sessions write in
//! parallel. Nothing is written until an op succeeds; an error rolls the whole request back.

use std::collections::{HashMap, HashSet};

use deadpool_postgres::GenericClient;
use sessiondb_core::chunk::split_slices;
use sessiondb_core::context::{BlockDef, WriteMode};
use sessiondb_core::session_row::SessionRow;
use sessiondb_core::store::{ContextEntry, FrozenPrompt, PathRuns};
use sessiondb_core::write_rules::{self, CurrentRow, NewRow, WriteTx};
use sessiondb_core::{
    Change, Compaction, MAX_PATH_ROWS, MAX_SLICE_BYTES, Parent, PreparedMessage, SessionKey,
    SessionRecord, StoreError, StoredMessage, WriteOp, WriteRequest, Written,
};

use crate::queries::{self, Location, PathTotals};
use crate::sql::{Result, backend_error, exec, get, lookup, row, rows};
use crate::{attachments, context, feed, registry};

// Statements of the two pipelines of a request (see [`commit`]), named so they can be prepared
// before a pipeline is sent.
const LOAD_SESSION: &str =
    "SELECT created_at, updated_at, last_message_at, next_seq, leaf_id, leaf_seq,
                    path_len, path_tokens, path_bytes, path_capped, path_head_seq,
                    stored_messages, path_dense, version
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
                    stored_messages = $14, path_dense = $15, version = $16
              WHERE namespace = $1 AND id = $2";

const SAVE_SESSION_INSERT: &str =
    "INSERT INTO sessions (namespace, id, created_at, updated_at, last_message_at,
                 next_seq, leaf_id, leaf_seq, path_len, path_tokens, path_bytes, path_capped,
                 path_head_seq, stored_messages, path_dense, version)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)";

/// Loads the session row, or an absent one above its namespace's deletion floor.
async fn load_session<C: GenericClient>(c: &C, key: &SessionKey, now: i64) -> Result<SessionRow> {
    let found = row(c, LOAD_SESSION, &[&key.namespace, &key.session_id]).await?;
    let Some(r) = found else {
        let floor = row(
            c,
            "SELECT version FROM deleted_versions WHERE namespace = $1",
            &[&key.namespace],
        )
        .await?;
        let deleted_version = floor.map(|r| get(&r, 0)).transpose()?.unwrap_or(0);
        return Ok(SessionRow::absent(now, deleted_version));
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
        version: get(&r, 13)?,
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
            &session.version,
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

/// A committed request: what it wrote, and its change events with the feed position of the first.
pub(crate) struct Committed {
    pub written: Written,
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
    apply(c, request, Bounds::Whole).await
}

/// Runs `requests` as one transaction on `c` and commits it; on an error the transaction is
/// left for the caller to roll back, as [`commit`] leaves it. Every session is locked first, in
/// key order, so two such writes over the same sessions wait for each other instead of
/// deadlocking.
pub(crate) async fn commit_together<C: GenericClient>(
    c: &C,
    requests: &[WriteRequest],
) -> Result<Vec<Committed>> {
    c.batch_execute("BEGIN").await.map_err(backend_error)?;
    let mut keys: Vec<&SessionKey> = requests.iter().map(|r| &r.key).collect();
    keys.sort();
    keys.dedup();
    for key in keys {
        lock_session(c, key).await?;
    }
    let mut committed = Vec::with_capacity(requests.len());
    for (i, request) in requests.iter().enumerate() {
        let bounds = match i + 1 == requests.len() {
            true => Bounds::Last,
            false => Bounds::Inside,
        };
        let applied = apply(c, request, bounds).await;
        committed.push(applied.map_err(|error| StoreError::InRequest {
            index: i,
            error: Box::new(error),
        })?);
    }
    Ok(committed)
}

/// Which ends of the transaction a request's statements carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bounds {
    /// `BEGIN` and `COMMIT`: the request is the transaction.
    Whole,
    /// Neither: the request is one of several, begun earlier.
    Inside,
    /// `COMMIT` only: the last of several.
    Last,
}

/// Applies `request` on `c` in the transaction `bounds` describe.
async fn apply<C: GenericClient>(
    c: &C,
    request: &WriteRequest,
    bounds: Bounds,
) -> Result<Committed> {
    let key = &request.key;
    let named = Known::named_ids(&request.ops);
    // A pipeline is only in order if each statement goes out on its first poll: prepared ones do
    // (a connection prepares each statement once, here).
    prepare(c, &[LOCK_SESSION, LOAD_SESSION, LOAD_KNOWN]).await?;
    let (begun, locked, session, known) = tokio::join!(
        biased;
        async {
            match bounds {
                Bounds::Whole => c.batch_execute("BEGIN").await,
                Bounds::Inside | Bounds::Last => Ok(()),
            }
        },
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
    let mut session = session?;
    let mut tx = PgTx {
        c,
        key,
        known: known?,
        pending: PendingRows::default(),
    };
    let (written, changes) = write_rules::apply_request(&mut tx, request, &mut session).await?;
    if session.totals_stale {
        tx.flush().await?;
        settle_totals(c, key, &mut session).await?;
    }
    let rows = tx.pending;
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
        async {
            match bounds {
                Bounds::Whole | Bounds::Last => c.batch_execute("COMMIT").await,
                Bounds::Inside => Ok(()),
            }
        },
    );
    // The first failure is the cause; the statements after it only found the transaction
    // aborted (and COMMIT then rolls back).
    inserted?;
    saved?;
    record_saved?;
    let first_position = recorded?;
    committed.map_err(backend_error)?;
    Ok(Committed {
        written,
        changes,
        first_position,
    })
}

/// The request's transaction, as the shared write rules use it.
struct PgTx<'a, C> {
    c: &'a C,
    key: &'a SessionKey,
    /// Rows a multi-op request's messages name, read up front (see [`Known`]).
    known: Option<Known>,
    /// Inserted rows not yet sent: a batch of appends costs one statement, not one each.
    pending: PendingRows,
}

/// New message rows, column by column, sent by [`PgTx::flush`] as one `INSERT … unnest`.
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

impl<C: GenericClient> PgTx<'_, C> {
    /// Sends the pending rows.
    async fn flush(&mut self) -> Result<()> {
        insert_rows(self.c, self.key, std::mem::take(&mut self.pending)).await
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

impl<C: GenericClient> WriteTx for PgTx<'_, C> {
    async fn before_op(&mut self, op: &WriteOp) -> Result<()> {
        if matches!(
            op,
            WriteOp::Delete { .. } | WriteOp::Clear | WriteOp::DeleteSession { .. }
        ) {
            self.known = None;
        }
        match op {
            WriteOp::Append { .. } | WriteOp::Import { .. } | WriteOp::Upsert { .. } => Ok(()),
            _ => self.flush().await,
        }
    }

    async fn id_status(&mut self, id: &str) -> Result<(bool, bool)> {
        if let Some(known) = self.known.as_ref().filter(|k| k.covered.contains(id)) {
            return Ok((
                known.rows.contains_key(id),
                known.named_parents.contains(id),
            ));
        }
        self.flush().await?;
        queries::id_status(self.c, self.key, id).await
    }

    async fn message(&mut self, id: &str) -> Result<Option<StoredMessage>> {
        self.flush().await?;
        queries::message(self.c, self.key, id).await
    }

    async fn locate(&mut self, id: &str) -> Result<Option<Location>> {
        if let Some(known) = self.known.as_ref().filter(|k| k.covered.contains(id)) {
            return Ok(known.rows.get(id).cloned());
        }
        self.flush().await?;
        queries::locate(self.c, self.key, id).await
    }

    async fn row_size(&mut self, seq: i64) -> Result<Option<(String, u64, u64)>> {
        self.flush().await?;
        queries::row_size(self.c, self.key, seq).await
    }

    async fn path_runs(&mut self, leaf: i64) -> Result<PathRuns> {
        self.flush().await?;
        Ok(queries::runs_from(self.c, self.key, Some(leaf))
            .await?
            .finish(Vec::new()))
    }

    async fn child_links(&mut self, id: &str) -> Result<Vec<(String, i64)>> {
        self.flush().await?;
        queries::child_links(self.c, self.key, id).await
    }

    async fn newest(&mut self) -> Result<Option<(String, i64)>> {
        self.flush().await?;
        queries::newest(self.c, self.key).await
    }

    async fn insert(
        &mut self,
        session: &SessionRow,
        row: NewRow<'_>,
    ) -> Result<Option<PathTotals>> {
        let (c, key) = (self.c, self.key);
        let NewRow {
            message,
            stored,
            parent_seq,
            orphans,
        } = row;
        let seq = stored.seq;
        let parent_id = stored.parent_id.as_deref().map(str::to_owned);
        let slices = split_slices(stored.json(), MAX_SLICE_BYTES);
        let rows = &mut self.pending;
        rows.seq.push(seq);
        rows.id.push(message.id.clone());
        rows.parent_id.push(parent_id.clone());
        rows.parent_seq.push(parent_seq);
        rows.role.push(message.role.clone());
        rows.content.push(slices[0].to_owned());
        rows.content_chunks.push(slices.len() as i32 - 1);
        rows.bytes.push(message.bytes() as i64);
        rows.token_estimate.push(message.token_estimate as i64);
        rows.content_hash.push(message.content_hash.0.to_vec());
        rows.created_at.push(stored.created_at);
        rows.updated_at.push(stored.updated_at);
        rows.search_text.push(message.search_text.clone());
        rows.held += slices[0].len();
        self.write_chunks(&message.id, &slices).await?;
        if let Some(known) = &mut self.known {
            known.inserted(&message.id, (seq, parent_id, parent_seq), orphans);
        }
        // Rows naming this one as parent must see it, and so must a capped path's head when it
        // slides.
        if orphans
            || self.pending.held > MAX_PENDING_BYTES
            || session.path.len as usize >= MAX_PATH_ROWS
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
        // A new root is alone on its path; a branch's totals are walked once before saving.
        let size = (message.token_estimate, message.bytes());
        Ok(parent_seq
            .is_none()
            .then(|| PathTotals::lone_root(seq, size.0, size.1)))
    }

    async fn current(&mut self, id: &str) -> Result<Option<CurrentRow>> {
        self.flush().await?;
        let found = row(
            self.c,
            "SELECT seq, parent_id, content_hash, content_chunks, created_at, updated_at,
                    token_estimate, bytes
               FROM messages WHERE namespace = $1 AND session_id = $2 AND id = $3",
            &[&self.key.namespace, &self.key.session_id, &id],
        )
        .await?;
        let Some(r) = found else {
            return Ok(None);
        };
        Ok(Some(CurrentRow {
            seq: get(&r, 0)?,
            parent_id: get(&r, 1)?,
            content_hash: get(&r, 2)?,
            content_chunks: get::<i32>(&r, 3)?.into(),
            created_at: get(&r, 4)?,
            updated_at: get(&r, 5)?,
            token_estimate: get::<i64>(&r, 6)? as u64,
            bytes: get::<i64>(&r, 7)? as u64,
        }))
    }

    async fn rewrite(
        &mut self,
        _session: &mut SessionRow,
        current: &CurrentRow,
        message: &PreparedMessage,
        stored: &StoredMessage,
    ) -> Result<()> {
        let (c, key) = (self.c, self.key);
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
                &current.seq,
                &message.role,
                &slices[0],
                &chunks,
                &bytes,
                &tokens,
                &&message.content_hash.0[..],
                &stored.updated_at,
                &message.search_text,
            ],
        )
        .await?;
        if current.content_chunks > chunks.into() {
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
        Ok(())
    }

    async fn reparent(
        &mut self,
        child_seq: i64,
        parent_id: Option<&str>,
        parent_seq: Option<i64>,
    ) -> Result<()> {
        exec(
            self.c,
            "UPDATE messages SET parent_id = $4, parent_seq = $5
              WHERE namespace = $1 AND session_id = $2 AND seq = $3",
            &[
                &self.key.namespace,
                &self.key.session_id,
                &child_seq,
                &parent_id,
                &parent_seq,
            ],
        )
        .await?;
        Ok(())
    }

    async fn delete_rows(&mut self, rows: &[(String, i64)]) -> Result<()> {
        let (c, key) = (self.c, self.key);
        let (ids, seqs): (Vec<String>, Vec<i64>) = rows.iter().cloned().unzip();
        attachments::drop_message_refs(c, key, &ids).await?;
        exec(
            c,
            "DELETE FROM messages WHERE namespace = $1 AND session_id = $2 AND seq = ANY($3)",
            &[&key.namespace, &key.session_id, &seqs],
        )
        .await?;
        exec(
            c,
            "DELETE FROM message_chunks WHERE namespace = $1 AND session_id = $2 AND id = ANY($3)",
            &[&key.namespace, &key.session_id, &ids],
        )
        .await?;
        Ok(())
    }

    async fn clear(&mut self) -> Result<()> {
        attachments::drop_session_refs(self.c, self.key).await?;
        queries::delete_session_rows(
            self.c,
            self.key,
            &[
                "DELETE FROM messages WHERE namespace = $1 AND session_id = $2",
                "DELETE FROM message_chunks WHERE namespace = $1 AND session_id = $2",
            ],
        )
        .await
    }

    async fn delete_session(&mut self, last_version: Option<i64>) -> Result<()> {
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
        if let Some(version) = last_version {
            // Deletions in one namespace wait here for each other's commits (one row); a
            // creation reads the floor after its session's lock, so after the deletion's commit.
            exec(
                self.c,
                "INSERT INTO deleted_versions (namespace, version) VALUES ($1, $2)
                 ON CONFLICT (namespace) DO UPDATE
                 SET version = GREATEST(deleted_versions.version, EXCLUDED.version)",
                &[&self.key.namespace, &version],
            )
            .await?;
        }
        Ok(())
    }

    async fn record(&mut self) -> Result<Option<SessionRecord>> {
        registry::record(self.c, self.key).await
    }

    async fn add_compaction(&mut self, compaction: &Compaction) -> Result<()> {
        registry::add_compaction(self.c, self.key, compaction).await
    }

    async fn put_state(&mut self, name: &str, value: &str) -> Result<()> {
        registry::put_state(self.c, self.key, name, value).await
    }

    async fn delete_state(&mut self, name: &str) -> Result<bool> {
        registry::delete_state(self.c, self.key, name).await
    }

    async fn put_block(&mut self, block: &BlockDef) -> Result<()> {
        context::put_block(self.c, self.key, block).await
    }

    async fn write_block(&mut self, label: &str, text: &str, mode: WriteMode) -> Result<BlockDef> {
        context::write_block(self.c, self.key, label, text, mode).await
    }

    async fn delete_block(&mut self, label: &str) -> Result<bool> {
        context::delete_block(self.c, self.key, label).await
    }

    async fn put_entry(&mut self, label: &str, entry: &ContextEntry) -> Result<()> {
        context::put_entry(self.c, self.key, label, entry).await
    }

    async fn delete_entry(&mut self, label: &str, entry_key: &str) -> Result<bool> {
        context::delete_entry(self.c, self.key, label, entry_key).await
    }

    async fn freeze_prompt(
        &mut self,
        prompt: &str,
        now: i64,
        replace: bool,
    ) -> Result<FrozenPrompt> {
        context::freeze_prompt(self.c, self.key, prompt, now, replace).await
    }
}
