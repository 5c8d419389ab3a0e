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
mod queue;
mod readers;
mod registry;
mod schema;
mod write;
mod writer;

pub use schema::SCHEMA_VERSION;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use futures::FutureExt;
use futures::channel::oneshot;
use rusqlite::{Connection, OpenFlags};
use sessiondb_core::attachments::Payload;
use sessiondb_core::{
    Change, ChangeFeed, Compaction, ContextEntry, FeedFilter, FrozenPrompt, PathPlan, PathRows,
    PathRuns, PathSuffix, RangeTotals, ScopedBlock, ScopedEntry, SearchFilter, SearchHit,
    SessionInfo, SessionKey, SessionQuery, SessionStats, Store, StoreError, StoredMessage,
    Subscription, WriteRequest, Written,
};

use crate::cache::RowCache;
use crate::durability::Durability;
use crate::queries::SessionRange;
use crate::queue::{Leader, WriteQueue};
use crate::readers::{ReaderPool, in_snapshot, open_reader};
use crate::writer::{Writer, WriterSetup, WriterSlot, open_writer};

pub use writer::SEARCH_BACKLOG_ROWS;

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
    Write(WriteRequest, Reply<Written>),
    /// Requests committed together or not at all ([`Store::write_together`]).
    WriteTogether(Vec<WriteRequest>, Reply<Vec<Written>>),
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

        let readers = Arc::new(ReaderPool::new(
            path.clone(),
            config.synchronous,
            config.readers,
            first_reader,
        ));
        let write_stats = Arc::new(WriteStats::default());
        let rows = Arc::new(RowCache::new(config.row_cache_bytes));
        let wal = dir.join(format!("{DATABASE_FILE}-wal"));
        let durability = Durability::start(
            wal.clone(),
            config.synchronous == Synchronous::Full,
            feed.clone(),
        )?;
        let writer = Writer {
            conn: (),
            setup,
            search_index: search_index.clone(),
            stats: write_stats.clone(),
            rows: rows.clone(),
            changes_since_backlog: search_backlog,
        };
        let writers = Arc::new(WriteQueue::new(
            WriterSlot::new(migrated, writer)?,
            durability,
            config.max_batch,
        ));
        let relay = writers.start_relay()?;
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

impl Drop for SqliteStore {
    fn drop(&mut self) {
        self.writers.stop_relay();
        if let Some(relay) = self.relay.take() {
            let _ = relay.join();
        }
    }
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl Store for SqliteStore {
    fn write(
        &self,
        request: WriteRequest,
    ) -> impl Future<Output = Result<Written, StoreError>> + Send {
        self.submit(|reply| WriteJob::Write(request, reply))
    }

    /// Queues every request before leading, so they share commits (up to `max_batch` each)
    /// instead of one caller committing each as it submits it.
    fn write_all(
        &self,
        requests: Vec<WriteRequest>,
    ) -> impl Future<Output = Vec<Result<Written, StoreError>>> + Send {
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
    ) -> impl Future<Output = Result<Vec<Written>, StoreError>> + Send {
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
