//! The writer connection: its set-up, the group commits of queued requests (each request applied
//! by `write.rs`), writes of several sessions as one, and the full-text index's builds and
//! catch-ups. Runs only while its leader holds the writer.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rusqlite::{Connection, OpenFlags, TransactionBehavior};
use sessiondb_core::{Change, SessionKey, StoreError, WriteRequest, Written};

use crate::cache::RowCache;
use crate::durability::{Answer, Committed, Durability};
use crate::readers::open_reader;
use crate::write::{self, WriteContext};
use crate::{
    Reply, Synchronous, WriteJob, WriteStats, backend_error, metered, queries, schema, store_error,
};

/// A writer connection (`synchronous` applies to migrations; commits then run `NORMAL`, see
/// [`WriterSetup`]).
pub(crate) fn open_writer(
    path: &Path,
    synchronous: Synchronous,
    flags: OpenFlags,
) -> Result<Connection, StoreError> {
    let conn = Connection::open_with_flags_and_vfs(path, flags, schema::VFS)
        .map(metered)
        .map_err(backend_error)?;
    schema::configure(&conn, synchronous, false)?;
    Ok(conn)
}

/// How the writer connection is set up: the one that ran the migrations, one opened by the
/// first write, and a fresh one after an index build all commit as the write queue needs and
/// keep the store's size limit.
#[derive(Clone)]
pub(crate) struct WriterSetup {
    pub(crate) path: PathBuf,
    /// `max_page_count` for [`crate::SqliteConfig::max_database_bytes`].
    pub(crate) max_pages: Option<i64>,
}

impl WriterSetup {
    fn configure(&self, conn: &Connection) -> Result<(), StoreError> {
        // Commits no longer fsync inside SQLite: the write queue syncs the WAL itself, outside
        // the writer, so the next group applies while this one reaches the disk (see
        // `Durability`). Acknowledgements still wait for that sync in `Full` mode.
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(backend_error)?;
        if let Some(pages) = self.max_pages {
            conn.pragma_update(None, "max_page_count", pages)
                .map_err(backend_error)?;
        }
        Ok(())
    }

    /// A writer connection to the store's file, which exists by now: should it have gone, this
    /// fails instead of creating an empty database in its place.
    fn open(&self) -> Result<Connection, StoreError> {
        let flags = OpenFlags::default().difference(OpenFlags::SQLITE_OPEN_CREATE);
        let conn = open_writer(&self.path, Synchronous::Normal, flags)?;
        self.configure(&conn)?;
        Ok(conn)
    }
}

/// The writer connection once it is set up ([`WriterSlot`]); `Writer<()>` is everything else
/// of it, ready before.
pub(crate) struct Writer<C = Connection> {
    pub(crate) conn: C,
    pub(crate) setup: WriterSetup,
    pub(crate) search_index: Arc<AtomicBool>,
    pub(crate) stats: Arc<WriteStats>,
    pub(crate) rows: Arc<RowCache>,
    /// Change events committed since the search backlog was last measured: at least the rows
    /// added to `message_search` since then (each comes with one), so the backlog is only
    /// measured once this passes [`SEARCH_BACKLOG_ROWS`].
    pub(crate) changes_since_backlog: usize,
}

type Applied = Result<(Written, Vec<Change>), StoreError>;

/// The writer, its connection set up by the first write that needs it.
pub(crate) enum WriterSlot {
    Unopened(Writer<()>),
    Open(Writer),
}

impl WriterSlot {
    /// `conn`: a connection that just ran the migrations, set up for writing now.
    pub(crate) fn new(conn: Option<Connection>, writer: Writer<()>) -> Result<Self, StoreError> {
        Ok(match conn {
            Some(conn) => {
                writer.setup.configure(&conn)?;
                Self::Open(writer.with(conn))
            }
            None => Self::Unopened(writer),
        })
    }

    /// The writer, setting up its connection first if no write has yet.
    pub(crate) fn open(&mut self) -> Result<&mut Writer, StoreError> {
        if let Self::Unopened(unopened) = self {
            let conn = unopened.setup.open()?;
            *self = Self::Open(unopened.with(conn));
        }
        match self {
            Self::Open(writer) => Ok(writer),
            Self::Unopened(_) => unreachable!("set up just above"),
        }
    }
}

impl Writer<()> {
    fn with(&self, conn: Connection) -> Writer {
        Writer {
            conn,
            setup: self.setup.clone(),
            search_index: self.search_index.clone(),
            stats: self.stats.clone(),
            rows: self.rows.clone(),
            changes_since_backlog: self.changes_since_backlog,
        }
    }
}

/// Runs `BEGIN IMMEDIATE`, `COMMIT`, a savepoint's statement and the like through the
/// connection's statement cache: parsing them anew for every append was a measurable share of
/// its cost.
fn transaction_control(conn: &Connection, sql: &str) -> Result<(), rusqlite::Error> {
    conn.prepare_cached(sql)
        .and_then(|mut s| s.execute([]).map(drop))
}

/// Why nothing of a transaction that failed was committed: a full disk that one of its requests
/// met (SQLite may then roll the transaction back itself), else the transaction's own error.
fn failed_transaction(applied: &[Applied], error: &rusqlite::Error) -> StoreError {
    let full = applied.iter().find_map(|r| match r {
        Err(StoreError::StorageFull(reason)) => Some(reason.clone()),
        _ => None,
    });
    match full {
        Some(reason) => StoreError::StorageFull(reason),
        None => store_error(error),
    }
}

/// Answers every job of `batch` with `error` (the writer could not be set up): nothing of them
/// was written.
pub(crate) fn refuse(batch: Vec<WriteJob>, error: &StoreError) {
    let refused = || StoreError::Backend(format!("setting up the writer: {error}"));
    for job in batch {
        match job {
            WriteJob::Write(_, reply) => drop(reply.send(Err(refused()))),
            WriteJob::WriteTogether(_, reply) => drop(reply.send(Err(refused()))),
            WriteJob::EnsureSearchIndex(reply) => drop(reply.send(Err(refused()))),
        }
    }
}

impl Writer {
    /// Commits runs of write requests as groups; an index build commits on its own.
    /// Commits the batch; its groups wait in `durability` for [`Durability::flush`].
    pub(crate) fn process(&mut self, batch: Vec<WriteJob>, durability: &Durability) {
        let started = std::time::Instant::now();
        self.process_jobs(batch, durability);
        self.stats
            .busy_nanos
            .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }

    fn process_jobs(&mut self, batch: Vec<WriteJob>, durability: &Durability) {
        let mut writes = Vec::with_capacity(batch.len());
        for job in batch {
            match job {
                WriteJob::Write(request, reply) => match durability.halted() {
                    // Not applied: it could never be acknowledged.
                    Some(halted) => drop(reply.send(Err(halted))),
                    None => writes.push((request, reply)),
                },
                WriteJob::WriteTogether(requests, reply) => {
                    // Its own transaction, after the requests queued before it.
                    self.commit_group(&mut writes, durability);
                    match durability.halted() {
                        Some(halted) => drop(reply.send(Err(halted))),
                        None => self.commit_together(requests, reply, durability),
                    }
                }
                WriteJob::EnsureSearchIndex(reply) => {
                    self.commit_group(&mut writes, durability);
                    // Derived data: an index lost to a power failure is rebuilt by the next
                    // search, so it needs no sync of its own.
                    let _ = reply.send(self.ensure_search_index());
                }
            }
        }
        self.commit_group(&mut writes, durability);
        self.bound_search_backlog();
    }

    /// Indexes the rows written since the last search once there are more than
    /// [`SEARCH_BACKLOG_ROWS`] of them, so that no search waits for an unbounded catch-up.
    /// Derived data: should it fail, the next search indexes the rows instead.
    fn bound_search_backlog(&mut self) {
        if self.changes_since_backlog <= SEARCH_BACKLOG_ROWS
            || !self.search_index.load(Ordering::Acquire)
        {
            return;
        }
        let backlog = queries::search_backlog(&self.conn).unwrap_or(0).max(0) as usize;
        if backlog > SEARCH_BACKLOG_ROWS {
            let _ = self.index_rows_since_last_search();
        } else {
            self.changes_since_backlog = backlog;
        }
    }

    /// Applies the queued requests in one transaction. A request that fails must leave nothing
    /// behind while the others commit; savepoints guarantee that, but every page a savepoint
    /// touches is first copied to its journal (a sixth of the writer's time at 32 appenders).
    /// Failures are rare, so the group runs without them first and, only when a request of a
    /// group fails, runs again from scratch with each request in its own savepoint.
    fn commit_group(
        &mut self,
        writes: &mut Vec<(WriteRequest, Reply<Written>)>,
        durability: &Durability,
    ) {
        if writes.is_empty() {
            return;
        }
        let ctx = WriteContext {
            search_index: self.search_index.load(Ordering::Acquire),
        };
        let mut results: Vec<Applied> = Vec::with_capacity(writes.len());
        let conn = &self.conn;
        let run = |sql: &str| transaction_control(conn, sql);
        let committed = (|| -> Result<(), rusqlite::Error> {
            run("BEGIN IMMEDIATE")?;
            for (request, _) in writes.iter() {
                let applied = write::apply(conn, ctx, request);
                let failed = applied.is_err();
                results.push(applied);
                if failed {
                    break;
                }
            }
            if results.iter().all(Result::is_ok) {
                return run("COMMIT");
            }
            run("ROLLBACK")?;
            // A lone request's transaction was its unit: its error is its result.
            if writes.len() == 1 {
                return Ok(());
            }
            results.clear();
            run("BEGIN IMMEDIATE")?;
            for (request, _) in writes.iter() {
                run("SAVEPOINT request")?;
                let applied = write::apply(conn, ctx, request);
                if applied.is_err() {
                    run("ROLLBACK TO request")?;
                }
                run("RELEASE request")?;
                results.push(applied);
            }
            run("COMMIT")
        })();
        if committed.is_err() && !conn.is_autocommit() {
            let _ = run("ROLLBACK");
        }
        if committed.is_ok() && results.iter().any(Result::is_ok) {
            self.stats.record_commit(writes.len());
        }
        if let Err(e) = committed {
            // Nothing of this group is committed: every caller learns it, none sees an event.
            results = writes
                .iter()
                .map(|_| Err(failed_transaction(&results, &e)))
                .collect();
        }
        // The changes move into the feed; only the outcomes go back to the callers.
        let mut events = Vec::new();
        let replies: Vec<_> = writes
            .drain(..)
            .zip(results)
            .map(|((request, reply), result)| {
                let written = result.map(|(written, changes)| {
                    // Before the acknowledgement: a caller that heard back reads no stale row.
                    self.rows.committed(&request.key, &written.outcomes);
                    events.extend(changes.into_iter().map(|c| (request.key.clone(), c)));
                    written
                });
                Answer::One(reply, written)
            })
            .collect();
        self.changes_since_backlog += events.len();
        durability.push(Committed { events, replies });
    }

    /// Applies `requests` in one transaction of their own and commits it; at the first
    /// request's error everything rolls back and that error is the answer.
    fn commit_together(
        &mut self,
        requests: Vec<WriteRequest>,
        reply: Reply<Vec<Written>>,
        durability: &Durability,
    ) {
        let ctx = WriteContext {
            search_index: self.search_index.load(Ordering::Acquire),
        };
        let conn = &self.conn;
        let run = |sql: &str| transaction_control(conn, sql);
        let mut applied: Vec<Applied> = Vec::with_capacity(requests.len());
        let committed = (|| -> Result<(), rusqlite::Error> {
            run("BEGIN IMMEDIATE")?;
            for request in &requests {
                applied.push(write::apply(conn, ctx, request));
                if applied.last().is_some_and(Result::is_err) {
                    // A full disk may have rolled the transaction back already.
                    return match conn.is_autocommit() {
                        true => Ok(()),
                        false => run("ROLLBACK"),
                    };
                }
            }
            run("COMMIT")
        })();
        if committed.is_err() && !conn.is_autocommit() {
            let _ = run("ROLLBACK");
        }
        let mut events = Vec::new();
        let outcome = match committed {
            Err(e) => Err(failed_transaction(&applied, &e)),
            Ok(()) if applied.last().is_some_and(Result::is_err) => {
                let error = applied.pop().and_then(Result::err);
                Err(StoreError::InRequest {
                    index: applied.len(),
                    error: Box::new(error.expect("the failed request")),
                })
            }
            Ok(()) => {
                self.stats.record_commit(requests.len());
                let written = requests.iter().zip(applied).map(|(request, applied)| {
                    let (written, changes) = applied.expect("every request applied");
                    self.rows.committed(&request.key, &written.outcomes);
                    events.extend(changes.into_iter().map(|c| (request.key.clone(), c)));
                    written
                });
                Ok(written.collect())
            }
        };
        self.changes_since_backlog += events.len();
        let replies = vec![Answer::Together(reply, outcome)];
        durability.push(Committed { events, replies });
    }

    /// Brings the full-text index up to date: creates and back-fills it on first use, and
    /// otherwise indexes the `message_search` rows above the mark in one statement (one FTS5
    /// flush for all the messages written since the last search).
    fn ensure_search_index(&mut self) -> Result<(), StoreError> {
        if self.search_index.load(Ordering::Acquire) {
            self.index_rows_since_last_search()
        } else {
            self.build_search_index()
        }
    }

    fn index_rows_since_last_search(&mut self) -> Result<(), StoreError> {
        self.changes_since_backlog = 0;
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(backend_error)?;
        let indexed = tx
            .execute(
                concat!(
                    "INSERT INTO message_fts (rowid, text)
                     SELECT rowid, pending_text FROM message_search WHERE rowid > ",
                    schema::search_indexed_mark!()
                ),
                [],
            )
            .map_err(backend_error)?;
        if indexed > 0 {
            tx.execute(
                concat!(
                    "UPDATE message_search SET pending_text = NULL WHERE rowid > ",
                    schema::search_indexed_mark!()
                ),
                [],
            )
            .map_err(backend_error)?;
            tx.execute(SET_SEARCH_INDEXED_MARK, [])
                .map_err(backend_error)?;
        }
        tx.commit().map_err(backend_error)
    }

    fn build_search_index(&mut self) -> Result<(), StoreError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(backend_error)?;
        tx.execute_batch(schema::SEARCH_TABLES)
            .map_err(backend_error)?;
        // Reading the messages and decoding their texts runs on a thread of its own, alongside
        // the inserts: its connection sees the last commit, which is what this transaction
        // started from (the writer is the only one, and it has not changed `messages` here).
        let reader = open_reader(&self.setup.path, Synchronous::Normal)?;
        std::thread::scope(|scope| {
            let (texts, received) = std::sync::mpsc::sync_channel(SEARCH_TEXT_BATCHES_IN_FLIGHT);
            let extraction = scope.spawn(move || search_texts_of_messages(&reader, &texts));
            let mut insert = tx
                .prepare(
                    "INSERT INTO message_search (namespace, session_id, message_id, role)
                     VALUES (?1, ?2, ?3, ?4)",
                )
                .map_err(backend_error)?;
            // Indexing each row as it arrives overlaps the tokenizing with the extraction; a
            // 'rebuild' after the back-fill would read every text again and overlap nothing.
            let mut index = tx
                .prepare("INSERT INTO message_fts (rowid, text) VALUES (?1, ?2)")
                .map_err(backend_error)?;
            // Ends after the extraction's last batch, or when it failed (its error is below).
            for batch in received {
                for [namespace, session_id, id, role, text] in batch.rows() {
                    insert
                        .execute([namespace, session_id, id, role])
                        .map_err(backend_error)?;
                    index
                        .execute(rusqlite::params![tx.last_insert_rowid(), text])
                        .map_err(backend_error)?;
                }
            }
            extraction
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })?;
        tx.execute_batch(schema::SEARCH_KEY_INDEX)
            .map_err(backend_error)?;
        tx.execute_batch(schema::SEARCH_TRIGGERS)
            .map_err(backend_error)?;
        tx.execute(
            "INSERT OR REPLACE INTO store_meta (key, value) VALUES ('search_index', '1')",
            [],
        )
        .map_err(backend_error)?;
        tx.execute(SET_SEARCH_INDEXED_MARK, [])
            .map_err(backend_error)?;
        tx.commit().map_err(backend_error)?;
        self.search_index.store(true, Ordering::Release);
        // The back-fill grew FTS5's pending-terms hash to the terms of a whole flush, and a
        // connection keeps it: every later commit that writes the index (the searches'
        // catch-ups) would walk all its slots twice. A fresh connection starts small; should it
        // fail to open, the old one still works.
        if let Ok(conn) = self.setup.open() {
            self.conn = conn;
        }
        Ok(())
    }
}

/// Rows per batch the extraction of an index build sends, and how many batches it may run
/// ahead of the inserts.
const SEARCH_TEXT_BATCH: usize = 256;
const SEARCH_TEXT_BATCHES_IN_FLIGHT: usize = 4;

/// `message_search` rows (namespace, session id, message id, role, text) packed into one
/// string: one allocation crosses threads per batch, not five per row (the allocator's arenas
/// contend when one thread frees many small blocks another allocated).
#[derive(Default)]
struct SearchTextBatch {
    fields: String,
    /// Where each row's five fields end in `fields`.
    ends: Vec<[usize; 5]>,
}

impl SearchTextBatch {
    fn push(&mut self, fields: [&str; 5]) {
        self.ends.push(fields.map(|field| {
            self.fields.push_str(field);
            self.fields.len()
        }));
    }

    fn rows(&self) -> impl Iterator<Item = [&str; 5]> {
        let mut start = 0;
        self.ends.iter().map(move |ends| {
            ends.map(|end| {
                let field = &self.fields[start..end];
                start = end;
                field
            })
        })
    }
}

/// Sends the indexed text of every stored message with any, in batches; stops early when the
/// receiver is gone (its inserts failed).
fn search_texts_of_messages(
    conn: &Connection,
    texts: &std::sync::mpsc::SyncSender<SearchTextBatch>,
) -> Result<(), StoreError> {
    let mut rows = conn
        .prepare(
            "SELECT s.namespace, s.id, m.id, m.role, m.content, m.content_chunks
               FROM sessions s INDEXED BY sessions_by_number CROSS JOIN messages m
                 ON m.k BETWEEN s.number << 32 AND (s.number << 32) + ?1",
        )
        .map_err(backend_error)?;
    let mut cursor = rows.query([queries::MAX_SEQ]).map_err(backend_error)?;
    let mut batch = SearchTextBatch::default();
    while let Some(row) = cursor.next().map_err(backend_error)? {
        let key = SessionKey {
            namespace: row.get(0).map_err(backend_error)?,
            session_id: row.get(1).map_err(backend_error)?,
        };
        let id: String = row.get(2).map_err(backend_error)?;
        let text = queries::indexed_text(
            conn,
            &key,
            &id,
            row.get(4).map_err(backend_error)?,
            row.get(5).map_err(backend_error)?,
        )?;
        if text.is_empty() {
            continue;
        }
        let role: String = row.get(3).map_err(backend_error)?;
        batch.push([&key.namespace, &key.session_id, &id, &role, &text]);
        if batch.ends.len() == SEARCH_TEXT_BATCH && texts.send(std::mem::take(&mut batch)).is_err()
        {
            return Ok(());
        }
    }
    // A send fails only when the inserts failed, and their error is the one reported.
    let _ = texts.send(batch);
    Ok(())
}

/// Rows written since the last search past which the writer indexes them itself (about 1 ms
/// for 1,000 short messages here, once per 1,000 appends), so a search waits for at most that.
pub const SEARCH_BACKLOG_ROWS: usize = 1_000;

/// Records that `message_fts` holds every `message_search` row there is.
const SET_SEARCH_INDEXED_MARK: &str = "INSERT OR REPLACE INTO store_meta (key, value)
     VALUES ('search_indexed', (SELECT coalesce(max(rowid), 0) FROM message_search))";
