//! sessiondb's embedded backend: one SQLite file in WAL mode.
//!
//! # Threads
//! - **One writer connection, led by whoever finds it free** (and set up by the first write when
//!   the store opened with its schema current, so a process that only reads sets up one
//!   connection). A write request joins a queue; a
//!   caller that finds the writer free becomes the leader: it takes every queued request (up to
//!   `max_batch`), applies them in one transaction and commits once. With more requests waiting
//!   it hands the group to the flush thread and the writer to the relay thread, which leads on
//!   while work is waiting; otherwise it lets the writer go and flushes itself. A flush syncs the
//!   WAL once for every group committed meanwhile, then publishes the change events in commit
//!   order and answers each caller (see `durability.rs`). A leader that finds fewer than four
//!   requests queued while a sync is in flight first waits for that sync, so what queues
//!   meanwhile commits as one group (it could not be durable sooner). Callers that find a leader
//!   at work just wait for their answer. An uncontended write thus never changes threads,
//!   contended writes share commits and syncs, and no caller leads more than one group.
//!   A request that fails fails alone: its group is rolled back and applied again with each
//!   request in its own savepoint.
//! - **Reads run on the caller's thread** with a `query_only` connection checked out of a small
//!   pool, concurrently with the writer (WAL readers see the last committed state). A read future
//!   completes on its first poll: a thread hop per read costs more than most reads do here.
//!   Async servers that read large paths should call from a blocking-friendly thread.
//! - **A flush thread** syncs groups handed off by a busy leader, so the writer never waits for
//!   the disk while work is queued.
//! - **A relay thread** leads the writer once a caller hands it over.
//!
//! No async runtime is needed: a waiting writer's future resolves through a oneshot channel.
//!
//! # Durability
//! `Synchronous::Full` by default: a write is acknowledged (and its events published) only after
//! the WAL holding its commit was synced to disk, so it survives power loss. The sync is ours,
//! not SQLite's (the writer connection runs `synchronous=NORMAL`, which still syncs around
//! checkpoints), so it can overlap the next group's work; readers may see a committed group a
//! moment before it is acknowledged. `Synchronous::Normal` acknowledges at commit: an
//! acknowledged write then survives a process crash but may be lost on power loss or an OS
//! crash. A failed sync halts writes until the store is reopened (`StoreError::Halted`): the
//! groups it covered are refused, and later writes are refused without being applied.
#![forbid(unsafe_code)]

mod attachments;
mod cache;
mod check;
mod context;
#[cfg(test)]
mod costs;
mod durability;
mod queries;
mod registry;
mod schema;
mod write;

pub use schema::SCHEMA_VERSION;

use std::collections::VecDeque;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, TryLockError};
use std::thread::JoinHandle;

use futures::FutureExt;
use futures::channel::oneshot;
use rusqlite::{Connection, OpenFlags, TransactionBehavior};
use sessiondb_core::attachments::Payload;
use sessiondb_core::{
    Change, ChangeFeed, Compaction, ContextEntry, FeedFilter, FrozenPrompt, PathPlan, PathRows,
    PathRuns, PathSuffix, RangeTotals, ScopedBlock, ScopedEntry, SearchFilter, SearchHit,
    SessionInfo, SessionKey, SessionQuery, SessionStats, Store, StoreError, StoredMessage,
    Subscription, WriteOutcome, WriteRequest,
};

use crate::cache::RowCache;
use crate::durability::{Answer, Committed, Durability};
use crate::queries::SessionRange;
use crate::write::WriteContext;

/// Builds the schema of release `version` (at most [`SCHEMA_VERSION`]) in a new database, with
/// the migrations that produced it: upgrade tests fill it as an older release would have.
#[doc(hidden)]
pub fn create_schema_version(conn: &mut Connection, version: i64) -> Result<(), StoreError> {
    if !(0..=SCHEMA_VERSION).contains(&version) {
        return Err(StoreError::SchemaTooNew {
            found: version,
            supported: SCHEMA_VERSION,
        });
    }
    schema::migrate_to(conn, version)
}

/// File name of the database inside the data directory.
pub const DATABASE_FILE: &str = "sessiondb.sqlite3";
/// File held under an exclusive lock while a store has the directory open.
pub const LOCK_FILE: &str = "sessiondb.lock";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Synchronous {
    /// fsync on every commit: acknowledged writes survive power loss.
    #[default]
    Full,
    /// No fsync on commit: acknowledged writes survive a process crash, not power loss.
    Normal,
}

/// Counters of the writer since the store opened.
#[derive(Debug, Default)]
pub struct WriteStats {
    /// Transactions committed (each one fsync in `Full` mode).
    pub commits: AtomicU64,
    /// Write requests applied; `requests / commits` is the mean group-commit batch size.
    pub requests: AtomicU64,
    /// Commits by how many requests they held: bucket `i` counts batches of at most `2^i`
    /// requests (and more than `2^(i-1)`); the last bucket takes everything larger.
    pub batch_sizes: [AtomicU64; BATCH_BUCKETS],
    /// Nanoseconds the writer spent committing (its utilisation over a time window).
    pub busy_nanos: AtomicU64,
}

/// Buckets of [`WriteStats::batch_sizes`]: 1, 2, 4, … 256, and larger.
pub const BATCH_BUCKETS: usize = 10;

impl WriteStats {
    fn record_commit(&self, requests: usize) {
        self.commits.fetch_add(1, Ordering::Relaxed);
        self.requests.fetch_add(requests as u64, Ordering::Relaxed);
        let bucket =
            (requests.max(1).next_power_of_two().trailing_zeros() as usize).min(BATCH_BUCKETS - 1);
        self.batch_sizes[bucket].fetch_add(1, Ordering::Relaxed);
    }
}

#[derive(Debug, Clone)]
pub struct SqliteConfig {
    pub synchronous: Synchronous,
    /// Most read connections open at once; further readers wait for one.
    pub readers: usize,
    /// Most write requests committed together.
    pub max_batch: usize,
    /// Undelivered change events a subscriber may hold before it lags.
    pub feed_buffer: usize,
    /// Newest change events kept for subscribers that resume from a position.
    pub feed_retain: usize,
    /// Memory for decoded rows of recently read or written sessions, so that reading a hot
    /// conversation again skips the database (0 turns the cache off).
    pub row_cache_bytes: usize,
    /// Largest size of the database file (SQLite's `max_page_count`, never below its size at
    /// open); a write that needs more fails with `StoreError::StorageFull`, as on a full disk.
    /// `None`: no limit but the disk's.
    pub max_database_bytes: Option<u64>,
}

impl Default for SqliteConfig {
    fn default() -> Self {
        Self {
            synchronous: Synchronous::Full,
            readers: 4,
            max_batch: 256,
            feed_buffer: 1024,
            feed_retain: 4096,
            row_cache_bytes: 32 << 20,
            max_database_bytes: None,
        }
    }
}

pub(crate) fn backend_error(e: rusqlite::Error) -> StoreError {
    store_error(&e)
}

fn store_error(e: &rusqlite::Error) -> StoreError {
    match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::DiskFull) => StoreError::StorageFull(e.to_string()),
        _ => StoreError::Backend(e.to_string()),
    }
}

pub(crate) type Reply<T> = oneshot::Sender<Result<T, StoreError>>;

enum WriteJob {
    Write(WriteRequest, Reply<Vec<WriteOutcome>>),
    /// Requests committed together or not at all ([`Store::write_together`]).
    WriteTogether(Vec<WriteRequest>, Reply<Vec<Vec<WriteOutcome>>>),
    EnsureSearchIndex(Reply<()>),
}

/// The SQLite store. Share it behind an `Arc`; dropping it closes the database and releases the
/// directory lock (every acknowledged write is already committed).
#[derive(Debug)]
pub struct SqliteStore {
    writers: Arc<WriteQueue>,
    /// Leads the writer when a caller hands it over; stopped and joined on drop.
    relay: Option<JoinHandle<()>>,
    readers: Arc<ReaderPool>,
    feed: ChangeFeed,
    search_index: Arc<AtomicBool>,
    write_stats: Arc<WriteStats>,
    rows: Arc<RowCache>,
    path: PathBuf,
    /// The WAL beside the database file.
    wal: PathBuf,
    /// [`SqliteConfig::max_database_bytes`] in whole pages.
    limit_bytes: Option<u64>,
    // Declared last: fields drop in order, so the directory lock is released only after every
    // connection above is closed.
    _lock: File,
}

impl SqliteStore {
    /// Opens (creating if needed) the store in directory `dir` with default settings.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::open_with(dir, SqliteConfig::default())
    }

    pub fn open_with(dir: impl AsRef<Path>, config: SqliteConfig) -> Result<Self, StoreError> {
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir).map_err(|e| {
            // `create_dir_all` reports a file in the way as "File exists".
            if dir.exists() && !dir.is_dir() {
                StoreError::Backend(format!("{}: not a directory", dir.display()))
            } else {
                io_error(dir, e)
            }
        })?;
        let lock_path = dir.join(LOCK_FILE);
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| io_error(&lock_path, e))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(StoreError::Locked {
                    path: dir.display().to_string(),
                });
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io_error(&lock_path, e)),
        }
        let path = dir.join(DATABASE_FILE);
        // Setting up a connection is most of a cold open (each parses the schema). A store
        // whose schema is current is read through its first reader here and gets its writer at
        // the first write, so a process that only reads sets up one connection; a new or older
        // store is created or migrated by the writer first.
        let first_reader = match path.exists() {
            true => Some(open_reader(&path, config.synchronous)?),
            false => None,
        };
        let current = match &first_reader {
            Some(reader) => schema::version(reader)? == schema::SCHEMA_VERSION,
            None => false,
        };
        let migrated = match current {
            true => None,
            false => {
                let mut writer = open_writer(&path, config.synchronous, OpenFlags::default())?;
                schema::migrate(&mut writer)?;
                Some(writer)
            }
        };
        // One reader is open from the start, so a database that cannot be read fails at open.
        let first_reader = match first_reader {
            Some(reader) => reader,
            None => open_reader(&path, config.synchronous)?,
        };
        let (max_pages, limit_bytes) = match config.max_database_bytes {
            Some(bytes) => {
                let page_size: u32 = first_reader
                    .query_row("PRAGMA page_size", [], |r| r.get(0))
                    .map_err(backend_error)?;
                // 0 would read the limit instead of setting one.
                let pages =
                    i64::try_from(bytes / u64::from(page_size)).map_or(i64::MAX, |p| p.max(1));
                let limit = (pages as u64).saturating_mul(u64::from(page_size));
                (Some(pages), Some(limit))
            }
            None => (None, None),
        };
        let setup = WriterSetup {
            path: path.clone(),
            max_pages,
        };
        let search_ready = first_reader
            .query_row(
                "SELECT count(*) FROM store_meta WHERE key = 'search_index'",
                [],
                |r| r.get::<_, i64>(0),
            )
            .map_err(backend_error)?
            > 0;
        let search_index = Arc::new(AtomicBool::new(search_ready));
        let search_backlog = match search_ready {
            true => queries::search_backlog(&first_reader)?.max(0) as usize,
            false => 0,
        };
        // Positions restart with each open; the open time tells them apart.
        let epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let feed = ChangeFeed::new(config.feed_buffer, config.feed_retain, epoch);

        let readers = Arc::new(ReaderPool {
            path: path.clone(),
            synchronous: config.synchronous,
            max: config.readers.max(1),
            state: Mutex::new((vec![first_reader], 1)),
            returned: Condvar::new(),
        });
        let write_stats = Arc::new(WriteStats::default());
        let rows = Arc::new(RowCache::new(config.row_cache_bytes));
        let wal = dir.join(format!("{DATABASE_FILE}-wal"));
        let durability = Durability::start(
            wal.clone(),
            config.synchronous == Synchronous::Full,
            feed.clone(),
        )?;
        let writers = Arc::new(WriteQueue {
            jobs: Mutex::new(VecDeque::new()),
            writer: Mutex::new(WriterSlot::new(
                migrated,
                Writer {
                    conn: (),
                    setup,
                    search_index: search_index.clone(),
                    stats: write_stats.clone(),
                    rows: rows.clone(),
                    changes_since_backlog: search_backlog,
                },
            )?),
            durability,
            max_batch: config.max_batch.max(1),
            relay: Relay::default(),
        });
        let relay = {
            let queue = writers.clone();
            std::thread::Builder::new()
                .name("sessiondb-relay".into())
                .spawn(move || {
                    let _stops = StopsRelay(&queue.relay);
                    while queue.relay.wait_for_hand_over() {
                        queue.lead(Leader::Relay);
                    }
                })
                .map_err(|e| StoreError::Backend(format!("starting the relay thread: {e}")))?
        };
        Ok(Self {
            writers,
            relay: Some(relay),
            readers,
            feed,
            search_index,
            write_stats,
            rows,
            path,
            wal,
            limit_bytes,
            _lock: lock,
        })
    }

    /// A handle that reads how much room the database takes ([`StorageUse`]) whenever asked,
    /// valid while the store is open (for `/metrics`).
    pub fn storage_probe(&self) -> StorageProbe {
        StorageProbe {
            readers: self.readers.clone(),
            wal: self.wal.clone(),
            limit_bytes: self.limit_bytes,
        }
    }

    /// Commits and requests since the store opened (group-commit effectiveness).
    /// Group-commit counters; the handle stays valid (and counting) while the store is open.
    pub fn write_stats(&self) -> Arc<WriteStats> {
        self.write_stats.clone()
    }

    /// Path of the database file.
    pub fn database_path(&self) -> &Path {
        &self.path
    }

    /// Writes a copy of the whole store (every session with its messages, compactions, state
    /// and context, attachments, the search index) into directory `dir`, which is created if
    /// needed and must not hold a database yet; `dir` then opens as a store of its own. The
    /// copy is the snapshot of the moment it began: writes go on meanwhile and later ones are
    /// not in it. Runs on the calling thread (a large store takes a while) and returns the
    /// copy's path; the copy is synced before it gets its name, so a failed or interrupted
    /// backup leaves no database at the destination.
    pub fn backup(&self, dir: impl AsRef<Path>) -> Result<PathBuf, StoreError> {
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir).map_err(|e| io_error(dir, e))?;
        let target = dir.join(DATABASE_FILE);
        if target.exists() {
            return Err(StoreError::BackupDestinationExists {
                path: target.display().to_string(),
            });
        }
        let partial = dir.join(format!("{DATABASE_FILE}.partial"));
        let partial_name = partial.to_str().ok_or_else(|| {
            StoreError::Backend(format!("{}: not a UTF-8 path", partial.display()))
        })?;
        // Left by a backup that was interrupted: never a database anyone opens.
        let _ = std::fs::remove_file(&partial);
        let copied = (|| {
            let conn = open_reader(&self.path, Synchronous::Full)?;
            // A reader is query-only, which would refuse to write the copy.
            conn.pragma_update(None, "query_only", false)
                .map_err(backend_error)?;
            conn.execute("VACUUM INTO ?1", [partial_name])
                .map_err(backend_error)?;
            File::open(&partial)
                .and_then(|file| file.sync_all())
                .map_err(|e| io_error(&partial, e))?;
            std::fs::rename(&partial, &target).map_err(|e| io_error(&target, e))?;
            sync_directory(dir)
        })();
        if copied.is_err() {
            let _ = std::fs::remove_file(&partial);
        }
        copied.map(|()| target)
    }

    /// Checks the store: SQLite's integrity check of every page, then the invariants a damaged
    /// file or a hand edit could break (every message has its session, parent links name their
    /// rows, each session's message count, next seq and active leaf, every attachment reference
    /// has its payload and every payload its references and chunks). Returns the problems in
    /// words, none for a sound store. Read-only, in one snapshot beside writes; it reads
    /// everything, so a large store takes a while (on the calling thread).
    pub fn check(&self) -> Result<Vec<String>, StoreError> {
        in_snapshot(self.readers.lend()?.conn(), check::problems)
    }

    /// Rewrites the database file without its free pages (the room deleted sessions and
    /// messages, or an upgrade that rebuilt a table, left inside it; later writes reuse such
    /// pages, but the file never shrinks by itself): SQLite's `VACUUM`, then a checkpoint that
    /// copies the result into the file, synced, and empties the WAL. Returns the file's size
    /// before and after. Writes wait meanwhile (it holds the writer; queued ones go on
    /// afterwards); reads go on. Needs free disk space of about the database's size, and runs on
    /// the calling thread (a large store takes a while). A failure leaves the file as it was.
    pub fn vacuum(&self) -> Result<Vacuumed, StoreError> {
        let size = || {
            std::fs::metadata(&self.path)
                .map(|m| m.len())
                .map_err(|e| io_error(&self.path, e))
        };
        let bytes_before = size()?;
        let rewritten = (|| {
            let mut slot = lock(&self.writers.writer);
            if let Some(halted) = self.writers.durability.halted() {
                return Err(halted);
            }
            let writer = slot.open()?;
            writer.conn.execute_batch("VACUUM").map_err(backend_error)?;
            // The writer's `synchronous=NORMAL` syncs the WAL before a checkpoint copies it and
            // the file after: a power loss before this leaves the old file, after it the new.
            // A reader in an older snapshot holds the checkpoint back (busy): the rewrite is
            // committed all the same, and a later checkpoint copies it into the file.
            writer
                .conn
                .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
                .map_err(backend_error)
        })();
        // Writes queued while the vacuum held the writer.
        self.writers.lead(Leader::Caller);
        rewritten?;
        Ok(Vacuumed {
            bytes_before,
            bytes_after: size()?,
        })
    }

    fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> impl Future<Output = Result<T, StoreError>> + Send + 'static {
        let readers = self.readers.clone();
        async move { in_snapshot(readers.lend()?.conn(), f) }
    }

    /// A read of one session's message rows ([`SessionRange`]: the session's number is looked up
    /// in the read's snapshot).
    fn read_session<T: Send + 'static>(
        &self,
        key: &SessionKey,
        f: impl FnOnce(&Connection, &SessionRange<'_>) -> Result<T, StoreError> + Send + 'static,
    ) -> impl Future<Output = Result<T, StoreError>> + Send + 'static {
        let key = key.clone();
        self.read(move |c| f(c, &SessionRange::of(c, &key)?))
    }

    /// A read of message rows the row cache may answer (`cached`); otherwise `query` runs and
    /// its rows fill the cache. The generation is taken before the query's snapshot begins
    /// (`read` does nothing until awaited), so a write that commits in between keeps the rows
    /// out.
    fn read_rows(
        &self,
        key: &SessionKey,
        cached: impl FnOnce(&RowCache, &SessionKey) -> Option<Vec<StoredMessage>>,
        query: impl FnOnce(&Connection, &SessionRange<'_>) -> Result<Vec<StoredMessage>, StoreError>
        + Send
        + 'static,
    ) -> impl Future<Output = Result<Vec<StoredMessage>, StoreError>> + Send + 'static {
        if let Some(hit) = cached(&self.rows, key) {
            return futures::future::ready(Ok(hit)).left_future();
        }
        let (read, key, rows) = (
            self.read_session(key, query),
            key.clone(),
            self.rows.clone(),
        );
        async move {
            let generation = rows.generation();
            let found = read.await?;
            rows.fill(&key, generation, &found);
            Ok(found)
        }
        .right_future()
    }

    fn submit<T>(
        &self,
        make: impl FnOnce(Reply<T>) -> WriteJob + Send + 'static,
    ) -> impl Future<Output = Result<T, StoreError>> + Send + 'static
    where
        T: Send + 'static,
    {
        let writers = self.writers.clone();
        async move {
            let (tx, rx) = oneshot::channel();
            writers.submit(make(tx));
            drop(writers);
            rx.await.unwrap_or(Err(StoreError::Closed))
        }
    }

    /// Runs a full-text `query` against an index that holds every message committed before the
    /// call: the first search creates and back-fills the index; a search that finds messages
    /// written since the last one first has the writer index them (see
    /// `schema::SEARCH_TABLES`), then queries a fresh snapshot.
    async fn with_search_index<T, Q>(&self, mut query: Q) -> Result<T, StoreError>
    where
        T: Send + 'static,
        Q: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        if self.search_index.load(Ordering::Acquire) {
            // A snapshot with nothing left to index answers at once; otherwise the query comes
            // back unrun.
            let answered = self
                .read(move |c| match queries::search_backlog(c)? > 0 {
                    true => Ok(Err(query)),
                    false => query(c).map(Ok),
                })
                .await?;
            match answered {
                Ok(found) => return Ok(found),
                Err(unrun) => query = unrun,
            }
        }
        self.submit(WriteJob::EnsureSearchIndex).await?;
        self.read(query).await
    }

    /// Whether the full-text index exists yet.
    pub fn has_search_index(&self) -> bool {
        self.search_index.load(Ordering::Acquire)
    }
}

/// The crate's own tests count what every connection runs ([`costs`]); nothing else does.
#[cfg(test)]
fn metered(mut conn: Connection) -> Connection {
    costs::meter(&mut conn);
    conn
}

#[cfg(not(test))]
fn metered(conn: Connection) -> Connection {
    conn
}

/// A writer connection (`synchronous` applies to migrations; commits then run `NORMAL`, see
/// [`WriterSetup`]).
fn open_writer(
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

/// A read-only connection (`synchronous` only matters for the checkpoints it may run).
fn open_reader(path: &Path, synchronous: Synchronous) -> Result<Connection, StoreError> {
    let conn = Connection::open_with_flags_and_vfs(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        schema::VFS,
    )
    .map(metered)
    .map_err(backend_error)?;
    schema::configure(&conn, synchronous, true)?;
    Ok(conn)
}

/// Makes a rename in `dir` durable (a directory's entries are synced through the directory).
#[cfg(unix)]
fn sync_directory(dir: &Path) -> Result<(), StoreError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_error(dir, e))
}

#[cfg(not(unix))]
fn sync_directory(_: &Path) -> Result<(), StoreError> {
    Ok(())
}

fn io_error(path: &Path, e: std::io::Error) -> StoreError {
    StoreError::Backend(format!("{}: {e}", path.display()))
}

/// A checked-out reader, returned to its pool on drop (also when a read panics).
struct Checkout<'a> {
    pool: &'a ReaderPool,
    conn: Option<Connection>,
}

impl Checkout<'_> {
    fn conn(&self) -> &Connection {
        self.conn.as_ref().expect("held until drop")
    }
}

/// Runs `f` in one snapshot of `conn`: every query of `f` sees the same committed state (a path
/// and its totals, a message and its continuation slices).
fn in_snapshot<T>(
    conn: &Connection,
    f: impl FnOnce(&Connection) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    let run = |sql: &str| {
        conn.prepare_cached(sql)
            .and_then(|mut s| s.execute([]).map(drop))
            .map_err(backend_error)
    };
    run("BEGIN")?;
    let result = f(conn);
    run("COMMIT")?;
    result
}

impl Drop for Checkout<'_> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            // A read that panicked left its snapshot open; the next one must start afresh.
            if !conn.is_autocommit() {
                let _ = conn.execute_batch("ROLLBACK");
            }
            self.pool.checkin(conn);
        }
    }
}

/// Read connections, opened on demand up to `max` and reused.
#[derive(Debug)]
struct ReaderPool {
    path: PathBuf,
    synchronous: Synchronous,
    max: usize,
    /// Idle connections and how many are open in all.
    state: Mutex<(Vec<Connection>, usize)>,
    returned: Condvar,
}

impl ReaderPool {
    /// A connection, back in the pool when the checkout drops.
    fn lend(&self) -> Result<Checkout<'_>, StoreError> {
        Ok(Checkout {
            pool: self,
            conn: Some(self.checkout()?),
        })
    }

    fn checkout(&self) -> Result<Connection, StoreError> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(conn) = state.0.pop() {
                return Ok(conn);
            }
            if state.1 < self.max {
                state.1 += 1;
                drop(state);
                return self.open().inspect_err(|_| {
                    self.state.lock().unwrap_or_else(|p| p.into_inner()).1 -= 1;
                });
            }
            state = self.returned.wait(state).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn checkin(&self, conn: Connection) {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .0
            .push(conn);
        self.returned.notify_one();
    }

    fn open(&self) -> Result<Connection, StoreError> {
        open_reader(&self.path, self.synchronous)
    }
}

/// How much room the database takes ([`StorageProbe::read`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StorageUse {
    /// The database's pages, free ones included: what [`SqliteConfig::max_database_bytes`]
    /// limits.
    pub database_bytes: u64,
    /// Free pages: later writes reuse them, [`SqliteStore::vacuum`] gives them back.
    pub free_bytes: u64,
    /// The WAL file beside the database (emptied as checkpoints copy it; not limited).
    pub wal_bytes: u64,
    /// [`SqliteConfig::max_database_bytes`] in whole pages, when set.
    pub limit_bytes: Option<u64>,
}

/// Reads [`StorageUse`] on a reader connection of its store ([`SqliteStore::storage_probe`]).
#[derive(Debug, Clone)]
pub struct StorageProbe {
    readers: Arc<ReaderPool>,
    wal: PathBuf,
    limit_bytes: Option<u64>,
}

impl StorageProbe {
    /// The numbers of the latest committed state. Runs on the calling thread (three PRAGMAs).
    pub fn read(&self) -> Result<StorageUse, StoreError> {
        let checkout = self.readers.lend()?;
        let conn = checkout.conn();
        let pragma = |name: &str| -> Result<u64, StoreError> {
            conn.query_row(&format!("PRAGMA {name}"), [], |r| r.get::<_, i64>(0))
                .map(|n| n.max(0) as u64)
                .map_err(backend_error)
        };
        let page_size = pragma("page_size")?;
        let wal_bytes = match std::fs::metadata(&self.wal) {
            Ok(metadata) => metadata.len(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => return Err(io_error(&self.wal, e)),
        };
        Ok(StorageUse {
            database_bytes: pragma("page_count")? * page_size,
            free_bytes: pragma("freelist_count")? * page_size,
            wal_bytes,
            limit_bytes: self.limit_bytes,
        })
    }
}

/// What [`SqliteStore::vacuum`] did to the database file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Vacuumed {
    pub bytes_before: u64,
    pub bytes_after: u64,
}

/// Queued write jobs and the one writer connection that commits them.
struct WriteQueue {
    jobs: Mutex<VecDeque<WriteJob>>,
    writer: Mutex<WriterSlot>,
    durability: Durability,
    max_batch: usize,
    relay: Relay,
}

impl std::fmt::Debug for WriteQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteQueue")
            .field("max_batch", &self.max_batch)
            .finish_non_exhaustive()
    }
}

impl WriteQueue {
    /// Queues `job`; leads the writer when it is free. Returns once `job` is committed (when
    /// leading) or handed to whoever leads.
    fn submit(&self, job: WriteJob) {
        self.submit_all([job]);
    }

    /// Queues `jobs` together, then leads as [`WriteQueue::submit`] does.
    fn submit_all(&self, jobs: impl IntoIterator<Item = WriteJob>) {
        lock(&self.jobs).extend(jobs);
        self.lead(Leader::Caller);
    }

    /// Commits queued jobs while the writer is free and work is waiting. A caller leads one
    /// batch (its own job is in it unless more than `max_batch` were queued ahead): with more
    /// work waiting it hands the writer to the relay thread and returns. Callers that led on
    /// instead served 20–45 batches in a row under steady load, and their own call returned
    /// 10–70 ms late.
    ///
    /// No job is ever stranded: a caller that fails to take the writer queued its job before
    /// trying, a leader looks at the queue again after letting the writer go and flushing, and
    /// a caller keeps leading once the relay has stopped.
    fn lead(&self, leader: Leader) {
        loop {
            let mut writer = match self.writer.try_lock() {
                Ok(writer) => writer,
                Err(TryLockError::WouldBlock) => return,
                // A panic mid-commit dropped its transaction, which rolled back: still usable.
                Err(TryLockError::Poisoned(p)) => p.into_inner(),
            };
            if lock(&self.jobs).len() < GROUP_WORTH_OVERLAPPING {
                self.durability.wait_for_flush();
            }
            let batch: Vec<WriteJob> = {
                let mut jobs = lock(&self.jobs);
                let n = jobs.len().min(self.max_batch);
                jobs.drain(..n).collect()
            };
            if !batch.is_empty() {
                match writer.open() {
                    Ok(writer) => writer.process(batch, &self.durability),
                    Err(e) => refuse(batch, &e),
                }
                if !lock(&self.jobs).is_empty() {
                    // More work is waiting: the flush thread syncs this group while the writer
                    // leads on.
                    self.durability.hand_off();
                    drop(writer);
                    if self.hands_over(leader) {
                        return;
                    }
                    continue;
                }
            }
            drop(writer);
            // Syncing outside the writer lets the next group apply meanwhile.
            self.durability.flush();
            if lock(&self.jobs).is_empty() || self.hands_over(leader) {
                return;
            }
        }
    }

    /// Whether `leader` stops here, work still waiting: a caller hands the writer to the relay
    /// (unless it has stopped); the relay leads on.
    fn hands_over(&self, leader: Leader) -> bool {
        leader == Leader::Caller && self.relay.take_over()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Leader {
    /// The thread of a write call: leads one batch, then hands over.
    Caller,
    /// The relay thread: leads while work is waiting.
    Relay,
}

/// Hand-overs of the writer from a caller to the relay thread.
#[derive(Default)]
struct Relay {
    state: Mutex<RelayState>,
    handed_over: Condvar,
}

#[derive(Default)]
struct RelayState {
    /// A caller handed the writer over and the relay has not taken it yet.
    pending: bool,
    stopped: bool,
}

impl Relay {
    /// Asks the relay thread to lead; false once it has stopped (the caller then leads on).
    fn take_over(&self) -> bool {
        let mut state = lock(&self.state);
        if state.stopped {
            return false;
        }
        state.pending = true;
        self.handed_over.notify_one();
        true
    }

    /// Waits for a hand-over; false once stopped with none left to take.
    fn wait_for_hand_over(&self) -> bool {
        let mut state = lock(&self.state);
        loop {
            if std::mem::take(&mut state.pending) {
                return true;
            }
            if state.stopped {
                return false;
            }
            state = self
                .handed_over
                .wait(state)
                .unwrap_or_else(|p| p.into_inner());
        }
    }

    fn stop(&self) {
        lock(&self.state).stopped = true;
        self.handed_over.notify_one();
    }
}

/// Stops the relay when its thread ends, also by a panic, so callers lead again.
struct StopsRelay<'a>(&'a Relay);

impl Drop for StopsRelay<'_> {
    fn drop(&mut self) {
        self.0.stop();
    }
}

impl Drop for SqliteStore {
    fn drop(&mut self) {
        self.writers.relay.stop();
        if let Some(relay) = self.relay.take() {
            let _ = relay.join();
        }
    }
}

/// Queued requests from which a leader commits at once, overlapping the sync in flight; with
/// fewer it waits for that sync and commits what queued meanwhile as one group.
const GROUP_WORTH_OVERLAPPING: usize = 4;

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// How the writer connection is set up: the one that ran the migrations, one opened by the
/// first write, and a fresh one after an index build all commit as the write queue needs and
/// keep the store's size limit.
#[derive(Clone)]
struct WriterSetup {
    path: PathBuf,
    /// `max_page_count` for [`SqliteConfig::max_database_bytes`].
    max_pages: Option<i64>,
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
struct Writer<C = Connection> {
    conn: C,
    setup: WriterSetup,
    search_index: Arc<AtomicBool>,
    stats: Arc<WriteStats>,
    rows: Arc<RowCache>,
    /// Change events committed since the search backlog was last measured: at least the rows
    /// added to `message_search` since then (each comes with one), so the backlog is only
    /// measured once this passes [`SEARCH_BACKLOG_ROWS`].
    changes_since_backlog: usize,
}

type Applied = Result<(Vec<WriteOutcome>, Vec<Change>), StoreError>;

/// The writer, its connection set up by the first write that needs it.
enum WriterSlot {
    Unopened(Writer<()>),
    Open(Writer),
}

impl WriterSlot {
    /// `conn`: a connection that just ran the migrations, set up for writing now.
    fn new(conn: Option<Connection>, writer: Writer<()>) -> Result<Self, StoreError> {
        Ok(match conn {
            Some(conn) => {
                writer.setup.configure(&conn)?;
                Self::Open(writer.with(conn))
            }
            None => Self::Unopened(writer),
        })
    }

    /// The writer, setting up its connection first if no write has yet.
    fn open(&mut self) -> Result<&mut Writer, StoreError> {
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
fn refuse(batch: Vec<WriteJob>, error: &StoreError) {
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
    fn process(&mut self, batch: Vec<WriteJob>, durability: &Durability) {
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
        writes: &mut Vec<(WriteRequest, Reply<Vec<WriteOutcome>>)>,
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
                let outcomes = result.map(|(outcomes, changes)| {
                    // Before the acknowledgement: a caller that heard back reads no stale row.
                    self.rows.committed(&request.key, &outcomes);
                    events.extend(changes.into_iter().map(|c| (request.key.clone(), c)));
                    outcomes
                });
                Answer::One(reply, outcomes)
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
        reply: Reply<Vec<Vec<WriteOutcome>>>,
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
                let outcomes = requests.iter().zip(applied).map(|(request, applied)| {
                    let (outcomes, changes) = applied.expect("every request applied");
                    self.rows.committed(&request.key, &outcomes);
                    events.extend(changes.into_iter().map(|c| (request.key.clone(), c)));
                    outcomes
                });
                Ok(outcomes.collect())
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

impl Store for SqliteStore {
    fn write(
        &self,
        request: WriteRequest,
    ) -> impl Future<Output = Result<Vec<WriteOutcome>, StoreError>> + Send {
        self.submit(|reply| WriteJob::Write(request, reply))
    }

    /// Queues every request before leading, so they share commits (up to `max_batch` each)
    /// instead of one caller committing each as it submits it.
    fn write_all(
        &self,
        requests: Vec<WriteRequest>,
    ) -> impl Future<Output = Vec<Result<Vec<WriteOutcome>, StoreError>>> + Send {
        let writers = self.writers.clone();
        async move {
            let (jobs, replies): (Vec<_>, Vec<_>) = requests
                .into_iter()
                .map(|request| {
                    let (reply, answer) = oneshot::channel();
                    (WriteJob::Write(request, reply), answer)
                })
                .unzip();
            writers.submit_all(jobs);
            drop(writers);
            let mut outcomes = Vec::with_capacity(replies.len());
            for answer in replies {
                outcomes.push(answer.await.unwrap_or(Err(StoreError::Closed)));
            }
            outcomes
        }
    }

    fn write_together(
        &self,
        requests: Vec<WriteRequest>,
    ) -> impl Future<Output = Result<Vec<Vec<WriteOutcome>>, StoreError>> + Send {
        self.submit(|reply| WriteJob::WriteTogether(requests, reply))
    }

    fn message(
        &self,
        key: &SessionKey,
        id: &str,
    ) -> impl Future<Output = Result<Option<StoredMessage>, StoreError>> + Send {
        let id = id.to_owned();
        self.read_session(key, move |c, rows| queries::message(c, rows, &id))
    }

    fn children(
        &self,
        key: &SessionKey,
        id: &str,
    ) -> impl Future<Output = Result<Vec<StoredMessage>, StoreError>> + Send {
        let id = id.to_owned();
        self.read_session(key, move |c, rows| queries::children(c, rows, &id))
    }

    fn roots(
        &self,
        key: &SessionKey,
    ) -> impl Future<Output = Result<Vec<StoredMessage>, StoreError>> + Send {
        self.read_session(key, queries::roots)
    }

    fn stats(
        &self,
        key: &SessionKey,
    ) -> impl Future<Output = Result<SessionStats, StoreError>> + Send {
        let key = key.clone();
        self.read(move |c| queries::stats(c, &key))
    }

    fn path(
        &self,
        key: &SessionKey,
        leaf: Option<&str>,
    ) -> impl Future<Output = Result<PathRows, StoreError>> + Send {
        let leaf = leaf.map(str::to_owned);
        self.read_session(key, move |c, rows| {
            match queries::leaf_seq(c, rows, leaf.as_deref())? {
                Some(seq) => queries::path(c, rows, seq),
                None => Ok(PathRows::default()),
            }
        })
    }

    fn path_runs(
        &self,
        key: &SessionKey,
        leaf: Option<&str>,
        locate: &[String],
    ) -> impl Future<Output = Result<PathRuns, StoreError>> + Send {
        let (leaf, ids) = (leaf.map(str::to_owned), locate.to_vec());
        self.read_session(key, move |c, rows| {
            queries::path_runs(c, rows, leaf.as_deref(), &ids)
        })
    }

    fn range_totals(
        &self,
        key: &SessionKey,
        ranges: &[(i64, i64)],
    ) -> impl Future<Output = Result<Vec<RangeTotals>, StoreError>> + Send {
        let ranges = ranges.to_vec();
        self.read_session(key, move |c, rows| queries::range_totals(c, rows, &ranges))
    }

    fn path_plan(
        &self,
        key: &SessionKey,
        leaf: Option<&str>,
    ) -> impl Future<Output = Result<PathPlan, StoreError>> + Send {
        let leaf = leaf.map(str::to_owned);
        self.read_session(key, move |c, rows| {
            queries::path_plan(c, rows, leaf.as_deref())
        })
    }

    fn fetch_range(
        &self,
        key: &SessionKey,
        from: i64,
        last: i64,
        max_rows: usize,
        max_bytes: u64,
    ) -> impl Future<Output = Result<Vec<StoredMessage>, StoreError>> + Send {
        self.read_rows(
            key,
            move |rows, key| rows.range(key, from, last, max_rows, max_bytes),
            move |c, key| queries::fetch_range(c, key, from, last, max_rows, max_bytes),
        )
    }

    fn fetch_range_newest(
        &self,
        key: &SessionKey,
        first: i64,
        last: i64,
        max_rows: usize,
    ) -> impl Future<Output = Result<Vec<StoredMessage>, StoreError>> + Send {
        self.read_rows(
            key,
            move |rows, key| rows.range_newest(key, first, last, max_rows),
            move |c, key| queries::fetch_range_newest(c, key, first, last, max_rows),
        )
    }

    fn path_suffix(
        &self,
        key: &SessionKey,
        leaf: Option<&str>,
        max_bytes: u64,
    ) -> impl Future<Output = Result<PathSuffix, StoreError>> + Send {
        let leaf = leaf.map(str::to_owned);
        self.read_session(key, move |c, rows| {
            queries::path_suffix(c, rows, leaf.as_deref(), max_bytes)
        })
    }

    fn fetch(
        &self,
        key: &SessionKey,
        seqs: &[i64],
    ) -> impl Future<Output = Result<Vec<StoredMessage>, StoreError>> + Send {
        let seqs = seqs.to_vec();
        // Each stretch of consecutive seqs is a range the cache can answer (a walk up a branched
        // path asks for a few such stretches).
        let ranges: Vec<(i64, i64)> = seqs
            .chunk_by(|a, b| a.checked_add(1) == Some(*b))
            .map(|run| (run[0], run[run.len() - 1]))
            .collect();
        self.read_rows(
            key,
            move |rows, key| {
                let mut found = Vec::new();
                for (first, last) in ranges {
                    let n = (last - first + 1) as usize;
                    found.extend(rows.range(key, first, last, n, u64::MAX)?);
                }
                Some(found)
            },
            move |c, key| queries::fetch(c, key, &seqs),
        )
    }

    fn ancestors(
        &self,
        key: &SessionKey,
        from: &str,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<StoredMessage>, StoreError>> + Send {
        let (key, from) = (key.clone(), from.to_owned());
        async move {
            // The walk reads only parent links; the rows themselves (consecutive seqs, as long as
            // the path does not branch) usually come from the row cache.
            let walked = self
                .read_session(&key, move |c, rows| {
                    queries::ancestor_seqs(c, rows, &from, limit)
                })
                .await?;
            let mut messages = self.fetch(&key, &walked).await?;
            messages.reverse();
            Ok(messages)
        }
    }

    fn search(
        &self,
        key: &SessionKey,
        words: &[String],
        filter: &SearchFilter,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<SearchHit>, StoreError>> + Send {
        let (key, words, filter) = (key.clone(), words.to_vec(), filter.clone());
        self.with_search_index(move |c| {
            if words.is_empty() || limit == 0 {
                return Ok(Vec::new());
            }
            queries::search(c, &SessionRange::of(c, &key)?, &words, &filter, limit)
        })
    }

    fn session(
        &self,
        key: &SessionKey,
    ) -> impl Future<Output = Result<Option<SessionInfo>, StoreError>> + Send {
        let key = key.clone();
        self.read(move |c| registry::session_info(c, &key))
    }

    fn list_sessions(
        &self,
        namespace: &str,
        query: &SessionQuery,
    ) -> impl Future<Output = Result<Vec<SessionInfo>, StoreError>> + Send {
        let (namespace, query) = (namespace.to_owned(), query.clone());
        self.read(move |c| registry::list_sessions(c, &namespace, &query))
    }

    fn compactions(
        &self,
        key: &SessionKey,
    ) -> impl Future<Output = Result<Vec<Compaction>, StoreError>> + Send {
        let key = key.clone();
        self.read(move |c| registry::compactions(c, &key))
    }

    fn state(
        &self,
        key: &SessionKey,
        name: &str,
    ) -> impl Future<Output = Result<Option<String>, StoreError>> + Send {
        let (key, name) = (key.clone(), name.to_owned());
        self.read(move |c| registry::state(c, &key, &name))
    }

    fn context_blocks(
        &self,
        key: &SessionKey,
    ) -> impl Future<Output = Result<Vec<ScopedBlock>, StoreError>> + Send {
        let key = key.clone();
        self.read(move |c| context::blocks(c, &key))
    }

    fn context_entry_keys(
        &self,
        key: &SessionKey,
        label: &str,
    ) -> impl Future<Output = Result<Vec<(String, Option<String>)>, StoreError>> + Send {
        let (key, label) = (key.clone(), label.to_owned());
        self.read(move |c| context::entry_keys(c, &key, &label))
    }

    fn context_entries(
        &self,
        key: &SessionKey,
        label: &str,
        after: Option<&str>,
        rows: Option<usize>,
    ) -> impl Future<Output = Result<Vec<ScopedEntry>, StoreError>> + Send {
        let (key, label, after) = (key.clone(), label.to_owned(), after.map(str::to_owned));
        self.read(move |c| context::entries(c, &key, &label, after.as_deref(), rows))
    }

    fn context_entry(
        &self,
        key: &SessionKey,
        label: &str,
        entry_key: &str,
    ) -> impl Future<Output = Result<Option<ContextEntry>, StoreError>> + Send {
        let (key, label, entry_key) = (key.clone(), label.to_owned(), entry_key.to_owned());
        self.read(move |c| context::entry(c, &key, &label, &entry_key))
    }

    fn search_context(
        &self,
        key: &SessionKey,
        label: &str,
        words: &[String],
        limit: usize,
    ) -> impl Future<Output = Result<Vec<(String, String)>, StoreError>> + Send {
        let (key, label, words) = (key.clone(), label.to_owned(), words.to_vec());
        self.read(move |c| context::search(c, &key, &label, &words, limit))
    }

    fn prompt(
        &self,
        key: &SessionKey,
    ) -> impl Future<Output = Result<Option<FrozenPrompt>, StoreError>> + Send {
        let key = key.clone();
        self.read(move |c| context::prompt(c, &key))
    }

    fn state_entries(
        &self,
        key: &SessionKey,
    ) -> impl Future<Output = Result<Vec<(String, String)>, StoreError>> + Send {
        let key = key.clone();
        self.read(move |c| registry::state_entries(c, &key))
    }

    fn search_namespace(
        &self,
        namespace: &str,
        user_id: Option<&str>,
        words: &[String],
        filter: &SearchFilter,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<SearchHit>, StoreError>> + Send {
        let (namespace, user_id, words, filter) = (
            namespace.to_owned(),
            user_id.map(str::to_owned),
            words.to_vec(),
            filter.clone(),
        );
        self.with_search_index(move |c| {
            if words.is_empty() || limit == 0 {
                return Ok(Vec::new());
            }
            registry::search_namespace(c, &namespace, user_id.as_deref(), &words, &filter, limit)
        })
    }

    fn subscribe(&self, filter: FeedFilter) -> Subscription {
        self.feed.subscribe(filter)
    }

    fn subscribe_after(
        &self,
        filter: FeedFilter,
        position: u64,
    ) -> impl Future<Output = Option<Subscription>> + Send {
        std::future::ready(self.feed.subscribe_after(filter, position))
    }

    fn attachment_sizes(
        &self,
        namespace: &str,
        hashes: &[String],
    ) -> impl Future<Output = Result<Vec<(String, u64)>, StoreError>> + Send {
        let (namespace, hashes) = (namespace.to_owned(), hashes.to_vec());
        self.read(move |c| attachments::sizes(c, &namespace, &hashes))
    }

    fn attachments(
        &self,
        namespace: &str,
        hashes: &[String],
    ) -> impl Future<Output = Result<Vec<Payload>, StoreError>> + Send {
        let (namespace, hashes) = (namespace.to_owned(), hashes.to_vec());
        self.read(move |c| attachments::read(c, &namespace, &hashes))
    }

    fn announce(&self, key: &SessionKey, change: Change) {
        self.feed.publish([(key.clone(), change)]);
    }

    fn feed_epoch(&self) -> u64 {
        self.feed.epoch()
    }

    fn halted(&self) -> Option<StoreError> {
        self.writers.durability.halted()
    }
}
