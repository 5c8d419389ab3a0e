//! Applying one [`WriteRequest`] inside the writer's transaction: what each op does is core's
//! [`write_rules`]; this module loads and saves the session row and gives the rules their reads
//! and writes in SQL ([`WriteTx`]). Everything here runs on the writer thread inside a
//! transaction or savepoint that an error rolls back, so it leaves nothing behind.

use std::future::Future;
use std::task::{Context, Poll, Waker};

use rusqlite::{Connection, OptionalExtension, params};
use sessiondb_core::chunk::split_slices;
use sessiondb_core::context::{BlockDef, WriteMode};
use sessiondb_core::session_row::SessionRow;
use sessiondb_core::store::{ContextEntry, FrozenPrompt, PathRuns};
use sessiondb_core::write_rules::{self, CurrentRow, Location, NewRow, WriteTx};
use sessiondb_core::{
    Change, Compaction, MAX_SLICE_BYTES, PreparedMessage, SessionKey, SessionRecord, StoreError,
    StoredMessage, WriteRequest, Written,
};

use crate::queries::{self, PathTotals, SessionRange};
use crate::{attachments, backend_error, context, registry};

type Result<T> = std::result::Result<T, StoreError>;

/// The longest `messages` row that keeps its text: about a quarter of a 4 KiB page, so rows pack
/// four and more to a page. (Schema 12 chose the bound when `messages` was an index B-tree, which
/// spills a row past 1,002 bytes into an overflow page of its own; the rowid table of schema 13
/// would keep rows up to 4,061 bytes, but rows of 1-4 KB would then mostly take a page each,
/// where their texts' 950-byte slices share pages.)
const MAX_ROW_ON_PAGE: usize = 1002;
/// What a `messages` row's columns other than its texts typically take with the record header
/// (its integers, the content hash); a row the estimate lets through that is longer after all
/// takes an overflow page, as every row did before schema 12.
const ROW_FIXED_BYTES: usize = 100;
/// Continuation slices of a text of a few KB kept off its row: four of them with their keys
/// (namespace, session and message id of usual lengths) fit a 4 KiB `message_chunks` page, so
/// such a text leaves at most part of a page unused. 1,900-byte slices (two to a page) left
/// messages of ~3 KB a page each: 2,000 of them took 9.0 MB, against 7.1 MB with these.
const OFF_PAGE_SLICE_BYTES: usize = 950;
/// Longer texts go off the row in slices of up to [`MAX_SLICE_BYTES`]: SQLite fills their
/// overflow pages whole, so only the last page of one is partly unused, and a text of a few
/// hundred KB is not hundreds of rows to read.
const OFF_PAGE_SMALL_SLICES_UP_TO: usize = 16 * 1024;

/// Runs one statement with a parameter list.
fn exec(conn: &Connection, sql: &str, params: &[&dyn rusqlite::ToSql]) -> Result<usize> {
    conn.prepare_cached(sql)
        .and_then(|mut stmt| stmt.execute(params))
        .map_err(backend_error)
}

/// Loads the session row with the session's number, or an absent row (above its namespace's
/// deletion floor) with the number a new session gets (one above the highest; numbers of
/// deleted sessions may come back, their rows having gone with them).
fn load_session(conn: &Connection, key: &SessionKey, now: i64) -> Result<(SessionRow, i64)> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT created_at, updated_at, last_message_at, next_seq, leaf_id, leaf_seq,
                    path_len, path_tokens, path_bytes, path_capped, path_head_seq,
                    stored_messages, path_epoch, path_dense, number, version
               FROM sessions WHERE namespace = ?1 AND id = ?2",
        )
        .map_err(backend_error)?;
    let row = stmt
        .query_row(params![key.namespace, key.session_id], |r| {
            let row = SessionRow {
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
                version: r.get(15)?,
                totals_stale: false,
                record: None,
            };
            Ok((row, r.get(14)?))
        })
        .optional()
        .map_err(backend_error)?;
    if let Some(found) = row {
        return Ok(found);
    }
    let (number, deleted_version): (i64, i64) = conn
        .prepare_cached(
            "SELECT coalesce(max(number), 0) + 1,
                    coalesce((SELECT version FROM deleted_versions WHERE namespace = ?1), 0)
               FROM sessions",
        )
        .and_then(|mut stmt| stmt.query_row([&key.namespace], |r| Ok((r.get(0)?, r.get(1)?))))
        .map_err(backend_error)?;
    if number > MAX_SESSION_NUMBER {
        return Err(StoreError::StorageFull(format!(
            "the store holds sessions numbered up to {MAX_SESSION_NUMBER}, the most it can"
        )));
    }
    Ok((SessionRow::absent(now, deleted_version), number))
}

/// The highest session number: keys (`number << 32 | seq`) stay positive 64-bit integers.
const MAX_SESSION_NUMBER: i64 = i32::MAX as i64;

/// Saves a changed session row, first recomputing stale path aggregates. `loaded_times` are its
/// `updated_at` and `last_message_at` as loaded.
fn save_session(
    conn: &Connection,
    rows: &SessionRange<'_>,
    session: &mut SessionRow,
    loaded_times: (i64, Option<i64>),
) -> Result<()> {
    if !session.dirty {
        return Ok(());
    }
    let key = rows.key;
    if session.totals_stale {
        session.path = match session.leaf_seq {
            Some(leaf) => queries::path_totals(conn, rows, leaf)?,
            None => PathTotals::EMPTY,
        };
    }
    // An existing row is updated in place: REPLACE would delete and re-insert it. created_at
    // never changes and is not assigned, and neither are the times when they did not change:
    // SQLite rewrites the entries of every index over an assigned column (`sessions_by_created`,
    // the listings by update and by last message), whether its value changed or not.
    let times_changed = (session.updated_at, session.last_message_at) != loaded_times;
    macro_rules! update_sessions {
        ($times:literal) => {
            concat!(
                "UPDATE sessions SET ",
                $times,
                "next_seq = ?6, leaf_id = ?7, leaf_seq = ?8, path_len = ?9, path_tokens = ?10,
                 path_bytes = ?11, path_capped = ?12, path_head_seq = ?13,
                 stored_messages = ?14, path_epoch = ?15, path_dense = ?16, version = ?17
                 WHERE namespace = ?1 AND id = ?2"
            )
        };
    }
    let sql = if session.stored && times_changed {
        update_sessions!("updated_at = ?4, last_message_at = ?5, ")
    } else if session.stored {
        update_sessions!("")
    } else {
        "INSERT INTO sessions (namespace, id, created_at, updated_at, last_message_at,
             next_seq, leaf_id, leaf_seq, path_len, path_tokens, path_bytes, path_capped,
             path_head_seq, stored_messages, path_epoch, path_dense, version, number)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17,
                 ?18)"
    };
    let values = params![
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
        session.version,
        rows.number(),
    ];
    // An update leaves the session's number as it is (`?18`, for a new row only).
    let used = if session.stored { 17 } else { 18 };
    exec(conn, sql, &values[..used])?;
    session.stored = true;
    Ok(())
}

/// What the writer knows about the search index while applying a request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WriteContext {
    pub search_index: bool,
}

/// Applies all ops of `request`; returns what it wrote and the change events to publish once
/// the transaction commits.
pub(crate) fn apply(
    conn: &Connection,
    ctx: WriteContext,
    request: &WriteRequest,
) -> Result<(Written, Vec<Change>)> {
    let key = &request.key;
    let (mut session, number) = load_session(conn, key, request.now_ms)?;
    let loaded_times = (session.updated_at, session.last_message_at);
    let rows = SessionRange::numbered(key, number);
    let mut tx = SqliteTx { conn, ctx, rows };
    let applied = poll_ready(write_rules::apply_request(&mut tx, request, &mut session))?;
    save_session(conn, &rows, &mut session, loaded_times)?;
    if let Some(record) = &session.record {
        registry::save_record(conn, key, record)?;
    }
    Ok(applied)
}

/// Runs a future that never waits: every SQLite call in it returns before the next starts.
fn poll_ready<T>(future: impl Future<Output = T>) -> T {
    let mut future = std::pin::pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(value) => value,
        Poll::Pending => unreachable!("a SQLite write waited"),
    }
}

/// The writer's transaction, as the shared write rules use it, for one request's session.
struct SqliteTx<'a> {
    conn: &'a Connection,
    ctx: WriteContext,
    rows: SessionRange<'a>,
}

impl WriteTx for SqliteTx<'_> {
    async fn id_status(&mut self, id: &str) -> Result<(bool, bool)> {
        queries::id_status(self.conn, &self.rows, id)
    }

    async fn message(&mut self, id: &str) -> Result<Option<StoredMessage>> {
        queries::message(self.conn, &self.rows, id)
    }

    async fn locate(&mut self, id: &str) -> Result<Option<Location>> {
        queries::locate(self.conn, &self.rows, id)
    }

    async fn row_size(&mut self, seq: i64) -> Result<Option<(String, u64, u64)>> {
        queries::row_size(self.conn, &self.rows, seq)
    }

    async fn path_runs(&mut self, leaf: i64) -> Result<PathRuns> {
        Ok(queries::runs_from(self.conn, &self.rows, Some(leaf))?.finish(Vec::new()))
    }

    async fn child_links(&mut self, id: &str) -> Result<Vec<(String, i64)>> {
        queries::child_links(self.conn, &self.rows, id)
    }

    async fn newest(&mut self) -> Result<Option<(String, i64)>> {
        queries::newest(self.conn, &self.rows)
    }

    async fn insert(
        &mut self,
        session: &SessionRow,
        row: NewRow<'_>,
    ) -> Result<Option<PathTotals>> {
        let NewRow {
            message,
            stored,
            parent_seq,
            orphans,
        } = row;
        let seq = stored.seq;
        let (tokens, bytes) = (message.token_estimate, message.bytes());
        let totals = match parent_seq {
            None => Some(PathTotals::lone_root(seq, tokens, bytes)),
            Some(parent) => self.path_totals_to(session, parent)?.map(|t| PathTotals {
                len: t.len + 1,
                tokens: t.tokens + tokens,
                bytes: t.bytes + bytes,
                ..PathTotals::default()
            }),
        };
        let (on_row, slices) =
            self.placed_text(message, stored.parent_id.as_deref(), stored.json());
        if seq > queries::MAX_SEQ {
            // Seqs count every row a session was ever given; the key keeps 32 bits for them.
            return Err(StoreError::QuotaExceeded {
                limit: queries::MAX_SEQ as u64 + 1,
            });
        }
        exec(
            self.conn,
            "INSERT INTO messages (k, id, parent_id, parent_seq, role, content, content_chunks,
                 bytes, token_estimate, content_hash, created_at, path_len, path_tokens,
                 path_bytes, path_epoch, updated_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)",
            params![
                self.rows.k(seq),
                message.id,
                stored.parent_id.as_deref(),
                parent_seq,
                message.role,
                on_row,
                slices.len() as i64,
                message.bytes() as i64,
                message.token_estimate as i64,
                &message.content_hash.0[..],
                stored.created_at,
                totals.map(|t| t.len as i64),
                totals.map(|t| t.tokens as i64),
                totals.map(|t| t.bytes as i64),
                totals.map(|_| session.path_epoch),
                stored.updated_at,
            ],
        )?;
        self.write_chunks(&message.id, &slices)?;
        if orphans {
            exec(
                self.conn,
                "UPDATE messages INDEXED BY messages_by_parent SET parent_seq = ?4
                  WHERE parent_id = ?3 AND k BETWEEN ?1 AND ?2 AND parent_seq IS NULL",
                params![self.rows.first, self.rows.last(), message.id, seq],
            )?;
        }
        if !message.references.is_empty() {
            attachments::put(self.conn, &self.key().namespace, &message.payloads)?;
            attachments::add_refs(self.conn, self.key(), &message.id, &message.references)?;
        }
        if self.ctx.search_index && !message.search_text.is_empty() {
            self.index(&message.id, &message.role, &message.search_text)?;
        }
        Ok(totals)
    }

    async fn current(&mut self, id: &str) -> Result<Option<CurrentRow>> {
        self.conn
            .prepare_cached(concat!(
                "SELECT seq, parent_id, content_hash, content_chunks, created_at, updated_at,
                        token_estimate, bytes
                   FROM messages INDEXED BY messages_by_id WHERE ",
                queries::by_id!()
            ))
            .and_then(|mut stmt| {
                stmt.query_row(params![self.rows.first, self.rows.last(), id], |r| {
                    Ok(CurrentRow {
                        seq: r.get(0)?,
                        parent_id: r.get(1)?,
                        content_hash: r.get(2)?,
                        content_chunks: r.get(3)?,
                        created_at: r.get(4)?,
                        updated_at: r.get(5)?,
                        token_estimate: r.get::<_, i64>(6)? as u64,
                        bytes: r.get::<_, i64>(7)? as u64,
                    })
                })
                .optional()
            })
            .map_err(backend_error)
    }

    async fn rewrite(
        &mut self,
        session: &mut SessionRow,
        current: &CurrentRow,
        message: &PreparedMessage,
        stored: &StoredMessage,
    ) -> Result<()> {
        let (on_row, slices) =
            self.placed_text(message, current.parent_id.as_deref(), stored.json());
        let chunks = slices.len() as i64;
        exec(
            self.conn,
            "UPDATE messages SET role = ?2, content = ?3, content_chunks = ?4, bytes = ?5,
                    token_estimate = ?6, content_hash = ?7, updated_at = ?8
              WHERE k = ?1",
            params![
                self.rows.k(current.seq),
                message.role,
                on_row,
                chunks,
                message.bytes() as i64,
                message.token_estimate as i64,
                &message.content_hash.0[..],
                stored.updated_at,
            ],
        )?;
        if current.content_chunks > chunks {
            exec(
                self.conn,
                "DELETE FROM message_chunks
                  WHERE namespace = ?1 AND session_id = ?2 AND id = ?3 AND idx > ?4",
                params![
                    self.key().namespace,
                    self.key().session_id,
                    message.id,
                    chunks
                ],
            )?;
        }
        self.write_chunks(&message.id, &slices)?;
        attachments::put(self.conn, &self.key().namespace, &message.payloads)?;
        attachments::replace_refs(self.conn, self.key(), &message.id, &message.references)?;
        if self.ctx.search_index {
            self.reindex(message)?;
        }
        if queries::has_children(self.conn, &self.rows, &message.id)? {
            // Every path through this row changes: stored totals below it are stale.
            session.path_epoch += 1;
        } else {
            exec(
                self.conn,
                "UPDATE messages SET path_tokens = path_tokens + ?2, path_bytes = path_bytes + ?3
                  WHERE k = ?1",
                params![
                    self.rows.k(current.seq),
                    message.token_estimate as i64 - current.token_estimate as i64,
                    message.bytes() as i64 - current.bytes as i64,
                ],
            )?;
        }
        Ok(())
    }

    async fn reparent(
        &mut self,
        child_seq: i64,
        parent_id: Option<&str>,
        parent_seq: Option<i64>,
    ) -> Result<()> {
        exec(
            self.conn,
            "UPDATE messages SET parent_id = ?2, parent_seq = ?3 WHERE k = ?1",
            params![self.rows.k(child_seq), parent_id, parent_seq],
        )?;
        Ok(())
    }

    async fn delete_rows(&mut self, rows: &[(String, i64)]) -> Result<()> {
        let ids: Vec<&str> = rows.iter().map(|(id, _)| id.as_str()).collect();
        attachments::drop_message_refs(self.conn, self.key(), &ids)?;
        for (id, seq) in rows {
            exec(
                self.conn,
                "DELETE FROM messages WHERE k = ?1",
                params![self.rows.k(*seq)],
            )?;
            exec(
                self.conn,
                "DELETE FROM message_chunks WHERE namespace = ?1 AND session_id = ?2 AND id = ?3",
                params![self.key().namespace, self.key().session_id, id],
            )?;
            self.unindex(id)?;
        }
        Ok(())
    }

    async fn clear(&mut self) -> Result<()> {
        attachments::drop_session_refs(self.conn, self.key())?;
        registry::delete_messages(self.conn, &self.rows, self.ctx.search_index)
    }

    async fn delete_session(&mut self, last_version: Option<i64>) -> Result<()> {
        attachments::drop_session_refs(self.conn, self.key())?;
        context::delete_session(self.conn, self.key())?;
        registry::delete_session_rows(self.conn, &self.rows, self.ctx.search_index)?;
        if let Some(version) = last_version {
            exec(
                self.conn,
                "INSERT INTO deleted_versions (namespace, version) VALUES (?1, ?2)
                 ON CONFLICT (namespace) DO UPDATE SET version = max(version, excluded.version)",
                &[&self.key().namespace, &version],
            )?;
        }
        Ok(())
    }

    async fn record(&mut self) -> Result<Option<SessionRecord>> {
        registry::record(self.conn, self.key())
    }

    async fn add_compaction(&mut self, compaction: &Compaction) -> Result<()> {
        registry::add_compaction(self.conn, self.key(), compaction)
    }

    async fn put_state(&mut self, name: &str, value: &str) -> Result<()> {
        registry::put_state(self.conn, self.key(), name, value)
    }

    async fn delete_state(&mut self, name: &str) -> Result<bool> {
        registry::delete_state(self.conn, self.key(), name)
    }

    async fn put_block(&mut self, block: &BlockDef) -> Result<()> {
        context::put_block(self.conn, self.key(), block)
    }

    async fn write_block(&mut self, label: &str, text: &str, mode: WriteMode) -> Result<BlockDef> {
        context::write_block(self.conn, self.key(), label, text, mode)
    }

    async fn delete_block(&mut self, label: &str) -> Result<bool> {
        context::delete_block(self.conn, self.key(), label)
    }

    async fn put_entry(&mut self, label: &str, entry: &ContextEntry) -> Result<()> {
        context::put_entry(self.conn, self.key(), label, entry)
    }

    async fn delete_entry(&mut self, label: &str, entry_key: &str) -> Result<bool> {
        context::delete_entry(self.conn, self.key(), label, entry_key)
    }

    async fn freeze_prompt(
        &mut self,
        prompt: &str,
        now: i64,
        replace: bool,
    ) -> Result<FrozenPrompt> {
        context::freeze_prompt(self.conn, self.key(), prompt, now, replace)
    }
}

impl SqliteTx<'_> {
    fn key(&self) -> &SessionKey {
        self.rows.key
    }

    /// Totals of the whole path ending at `seq`: stored ones when still valid, else walked (and
    /// then only if the path is within the cap, so they are exact). Walked totals are stored on
    /// the row with the current epoch, so the next branch under it (a regeneration) needs no
    /// walk.
    fn path_totals_to(&self, session: &SessionRow, seq: i64) -> Result<Option<PathTotals>> {
        if session.leaf_seq == Some(seq) && !session.totals_stale && !session.path.capped {
            return Ok(Some(session.path));
        }
        if let Some((totals, epoch)) = queries::stored_path_totals(self.conn, &self.rows, seq)?
            && epoch == session.path_epoch
        {
            return Ok(Some(totals));
        }
        let walked = queries::path_totals(self.conn, &self.rows, seq)?;
        if walked.capped {
            return Ok(None);
        }
        exec(
            self.conn,
            "UPDATE messages SET path_len = ?2, path_tokens = ?3, path_bytes = ?4, path_epoch = ?5
              WHERE k = ?1",
            params![
                self.rows.k(seq),
                walked.len as i64,
                walked.tokens as i64,
                walked.bytes as i64,
                session.path_epoch,
            ],
        )?;
        Ok(Some(walked))
    }

    /// Where a message's JSON is stored: on its `messages` row when the row fits on its page
    /// (the text, no continuation slices); else the row keeps no text and all of it goes to
    /// continuation slices in `message_chunks`, a rowid table, which keeps its rows on its pages
    /// side by side. Migration 12 moves older rows by the same bound (rows written before with
    /// continuation slices keep their layout: readers take both).
    fn placed_text<'j>(
        &self,
        message: &PreparedMessage,
        parent_id: Option<&str>,
        json: &'j str,
    ) -> (&'j str, Vec<&'j str>) {
        let row = json.len()
            + message.id.len()
            + parent_id.map_or(0, str::len)
            + message.role.len()
            + ROW_FIXED_BYTES;
        if row <= MAX_ROW_ON_PAGE {
            return (json, Vec::new());
        }
        let slice = if json.len() <= OFF_PAGE_SMALL_SLICES_UP_TO {
            OFF_PAGE_SLICE_BYTES
        } else {
            MAX_SLICE_BYTES
        };
        ("", split_slices(json, slice))
    }

    /// Writes continuation slices 1, 2, … of message `id`.
    fn write_chunks(&self, id: &str, slices: &[&str]) -> Result<()> {
        for (idx, slice) in (1..).zip(slices) {
            exec(
                self.conn,
                "INSERT OR REPLACE INTO message_chunks (namespace, session_id, id, idx, content)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                params![self.key().namespace, self.key().session_id, id, idx, slice],
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
            params![self.key().namespace, self.key().session_id, id, role, text],
        )?;
        Ok(())
    }

    fn unindex(&self, id: &str) -> Result<()> {
        if self.ctx.search_index {
            exec(
                self.conn,
                "DELETE FROM message_search
                  WHERE namespace = ?1 AND session_id = ?2 AND message_id = ?3",
                params![self.key().namespace, self.key().session_id, id],
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
