//! sessiondb's PostgreSQL backend, for several stateless server instances on one shared
//! database.
//!
//! - **Schema**: numbered migrations under an advisory lock (instances starting together migrate
//!   once); every primary key leads with `(namespace, session_id)`, so tables distribute by
//!   session. Message content is chunked by the core exactly as on SQLite.
//! - **Writes**: one transaction per request on a pooled connection. It takes the session's
//!   advisory lock first (writers of one session queue there, on every instance; other sessions
//!   proceed in parallel), applies the ops, records the events in the shared feed as its last
//!   statement, and commits with `synchronous_commit = on`: a write is acknowledged only once
//!   PostgreSQL made it durable. A deadlock or serialisation failure retries the request.
//! - **Reads**: single statements on a pooled connection (a message comes whole, with its
//!   continuation slices, from one statement); reads of several statements that must agree (a
//!   path and its rows, an attachment and its chunks) run in one repeatable-read snapshot.
//! - **Change feed**: see the `feed` module: positions are shared by all instances, so a subscriber on any
//!   instance sees every write in commit order and can resume (`Last-Event-ID`) on another.
//! - **Runtime**: the store's futures run on the tokio runtime current when it connected, or on
//!   a runtime of its own when connected outside one, so they can be awaited from any executor.
#![forbid(unsafe_code)]

mod attachments;
mod check;
pub mod cluster;
mod context;
mod feed;
mod planner;
mod queries;
mod registry;
mod schema;
mod sql;
mod write;

pub use feed::BacklogLimits;
pub use schema::{SCHEMA_VERSION, migrate};

use std::future::Future;
use std::sync::Arc;

use deadpool_postgres::Pool;
use sessiondb_core::attachments::Payload;
use sessiondb_core::{
    Change, ChangeFeed, Compaction, ContextEntry, FeedFilter, FrozenPrompt, PathPlan, PathRows,
    PathRuns, PathSuffix, RangeTotals, ScopedBlock, ScopedEntry, SearchFilter, SearchHit,
    SessionInfo, SessionKey, SessionQuery, SessionStats, Store, StoreError, StoredMessage,
    Subscription, WriteRequest, Written,
};
use tokio::runtime::{Handle, Runtime};

use crate::feed::FeedSync;
use crate::sql::{backend_error, describe, looked_up, lookup};

/// Errors of this backend.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PgError {
    /// The driver's error with its causes, each said once.
    #[error("postgres: {0}")]
    Postgres(String),
    /// The pool's error with its causes.
    #[error("connection pool: {0}")]
    Pool(String),
    #[error("bad connection string: {0}")]
    Config(String),
    /// A migration failed (and was rolled back): its number and the database's reason, say a
    /// role that may not create the extension it needs.
    #[error("migrating the database to schema {version}: {reason}")]
    Migration { version: i64, reason: String },
    #[error("the database schema version {found} is newer than this build supports ({supported})")]
    SchemaTooNew { found: i64, supported: i64 },
    #[error("cannot start the store's runtime: {0}")]
    Runtime(#[from] std::io::Error),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<PgError> for StoreError {
    fn from(e: PgError) -> Self {
        match e {
            PgError::SchemaTooNew { found, supported } => {
                StoreError::SchemaTooNew { found, supported }
            }
            PgError::Store(e) => e,
            other => StoreError::Backend(other.to_string()),
        }
    }
}

impl From<tokio_postgres::Error> for PgError {
    fn from(e: tokio_postgres::Error) -> Self {
        PgError::Postgres(describe(&e))
    }
}

impl From<deadpool_postgres::PoolError> for PgError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        PgError::Pool(describe(&e))
    }
}

/// A connection the pool could not hand out: unavailable when the server is unreachable (or the
/// wait timed out), else a backend failure (a refused login, a missing database).
fn pool_error(e: deadpool_postgres::PoolError) -> StoreError {
    use deadpool_postgres::PoolError;
    let unavailable = match &e {
        PoolError::Timeout(_) | PoolError::Closed => true,
        PoolError::Backend(cause) => sql::unreachable(cause),
        _ => false,
    };
    let message = format!("connection pool: {}", describe(&e));
    if unavailable {
        StoreError::Unavailable(message)
    } else {
        StoreError::Backend(message)
    }
}

#[derive(Debug, Clone)]
pub struct PgConfig {
    /// Most connections open at once (the listening connection comes on top).
    pub max_connections: usize,
    /// Undelivered change events a subscriber may hold before it lags.
    pub feed_buffer: usize,
    /// Newest change events kept in memory for subscribers that resume from a position.
    pub feed_retain: usize,
    /// What a subscriber resuming from a position older than those may be sent from the feed
    /// table: one that missed more of what it follows starts over.
    pub resume_backlog: BacklogLimits,
}

impl Default for PgConfig {
    fn default() -> Self {
        Self {
            max_connections: 16,
            feed_buffer: 1024,
            feed_retain: 4096,
            resume_backlog: BacklogLimits::default(),
        }
    }
}

/// How many times a request that lost a deadlock or a serialisation conflict is re-applied.
const WRITE_ATTEMPTS: usize = 5;

/// The PostgreSQL store. Cheap to clone; the pool, feed and runtime are shared.
#[derive(Debug, Clone)]
pub struct PgStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    pool: Pool,
    sync: Arc<FeedSync>,
    epoch: u64,
    /// Tells this store's announcements apart from other instances' (random per store).
    instance: u64,
    /// This store's announcements, in order, for other instances.
    announcer: feed::Announcer,
    resume_backlog: BacklogLimits,
    runtime: Handle,
    follower: tokio::task::JoinHandle<()>,
    bulk_analyze: planner::BulkAnalyze,
    /// Set when the store runs its own runtime (it was connected outside one).
    owned_runtime: std::sync::Mutex<Option<Runtime>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.follower.abort();
        let owned = self
            .owned_runtime
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(runtime) = owned {
            runtime.shutdown_background();
        }
    }
}

/// Connects to `url` once and brings its schema to [`SCHEMA_VERSION`]; returns the version found
/// and the version now.
pub async fn migrate_database(url: &str) -> Result<(i64, i64), PgError> {
    let (mut client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    let driver = tokio::spawn(connection);
    let found = migrate(&mut client).await;
    drop(client);
    let _ = driver.await;
    Ok((found?, SCHEMA_VERSION))
}

/// Connects to `url` once and checks the store's own invariants (every message has its session,
/// parent links, each session's counts and leaf, attachments) in one read-only snapshot, as
/// the embedded store's check does after SQLite's page check (PostgreSQL's own pages and
/// indexes are `amcheck`'s). Every problem in words; none for a sound store. Migrates nothing
/// (a schema newer than this build's is refused); scans every table, beside any servers.
pub async fn check_database(url: &str) -> Result<Vec<String>, PgError> {
    let (_, pool) = pool_of(url, 1)?;
    let mut client = pool.get().await?;
    let tx = client
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await?;
    schema::found_version(&*tx).await?;
    Ok(check::problems(&tx).await?)
}

/// The connection settings of `url` and a pool of at most `max_size` connections to it.
fn pool_of(url: &str, max_size: usize) -> Result<(tokio_postgres::Config, Pool), PgError> {
    let config: tokio_postgres::Config = url
        .parse()
        .map_err(|e: tokio_postgres::Error| PgError::Config(describe(&e)))?;
    let manager = deadpool_postgres::Manager::new(config.clone(), tokio_postgres::NoTls);
    let pool = Pool::builder(manager)
        .max_size(max_size.max(1))
        .build()
        .map_err(|e| PgError::Config(describe(&e)))?;
    Ok((config, pool))
}

impl PgStore {
    /// Connects to `url` (`postgres://user@host:port/db`) with at most `max_connections`
    /// connections and applies the migrations this database lacks.
    pub async fn connect(url: &str, max_connections: usize) -> Result<Self, PgError> {
        Self::connect_with(
            url,
            PgConfig {
                max_connections,
                ..PgConfig::default()
            },
        )
        .await
    }

    pub async fn connect_with(url: &str, config: PgConfig) -> Result<Self, PgError> {
        Self::start(url, config, Handle::current()).await
    }

    /// Connects from outside any tokio runtime (a CLI, a test on another executor): the store
    /// runs a small runtime of its own, shut down when the last clone is dropped.
    pub fn connect_blocking(url: &str, config: PgConfig) -> Result<Self, PgError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("sessiondb-postgres")
            .enable_all()
            .build()?;
        let handle = runtime.handle().clone();
        let started = handle.block_on(Self::start(url, config, handle.clone()));
        let store = match started {
            Ok(store) => store,
            Err(e) => {
                runtime.shutdown_background();
                return Err(e);
            }
        };
        *store
            .inner
            .owned_runtime
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(runtime);
        Ok(store)
    }

    async fn start(url: &str, config: PgConfig, runtime: Handle) -> Result<Self, PgError> {
        let (pg_config, pool) = pool_of(url, config.max_connections)?;
        let mut client = pool.get().await?;
        migrate(&mut client).await?;
        let (epoch, position) = feed::counter(&client).await?;
        // The feed starts holding the newest events the table keeps, as an instance that had
        // been running would: a subscriber whose instance went away (or a whole fleet
        // restarted by a deploy) resumes here instead of starting over.
        let held = config.feed_retain.min(feed::TABLE_RETAIN as usize) as u64;
        let feed = ChangeFeed::new(config.feed_buffer, config.feed_retain, epoch);
        let sync = FeedSync::new(feed.starting_after(position.saturating_sub(held)));
        sync.catch_up(&client).await?;
        drop(client);
        let instance = std::hash::BuildHasher::hash_one(&std::hash::RandomState::new(), epoch);
        let follower = runtime.spawn(feed::follow(
            pg_config,
            pool.clone(),
            sync.clone(),
            instance,
        ));
        let announcer = feed::Announcer::start(pool.clone(), &runtime);
        Ok(Self {
            inner: Arc::new(Inner {
                pool,
                sync,
                epoch,
                instance,
                announcer,
                resume_backlog: config.resume_backlog,
                runtime,
                follower,
                bulk_analyze: planner::BulkAnalyze::default(),
                owned_runtime: std::sync::Mutex::new(None),
            }),
        })
    }

    /// The schema version recorded in the database.
    pub async fn schema_version(&self) -> Result<i64, PgError> {
        let client = self.inner.pool.get().await?;
        Ok(client
            .query_one("SELECT max(version) FROM sessiondb_schema", &[])
            .await?
            .get(0))
    }

    /// Runs `work` on the store's runtime (where its connections live); the returned future can
    /// be awaited from any executor. Work already started finishes even if the caller goes away.
    fn run<T, F>(
        &self,
        work: impl FnOnce(Arc<Inner>) -> F,
    ) -> impl Future<Output = Result<T, StoreError>> + Send + 'static
    where
        T: Send + 'static,
        F: Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        let task = self.inner.runtime.spawn(work(self.inner.clone()));
        async move {
            task.await
                .map_err(|e| StoreError::Backend(format!("store task failed: {e}")))?
        }
    }

    /// Runs a read on one pooled connection.
    fn read<T, F>(
        &self,
        work: impl FnOnce(deadpool_postgres::Object) -> F + Send + 'static,
    ) -> impl Future<Output = Result<T, StoreError>> + Send + 'static
    where
        T: Send + 'static,
        F: Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        self.run(|inner| async move { work(inner.pool.get().await.map_err(pool_error)?).await })
    }

    /// Runs a read of several statements in one repeatable-read snapshot.
    fn read_snapshot<T, W>(
        &self,
        work: W,
    ) -> impl Future<Output = Result<T, StoreError>> + Send + 'static
    where
        T: Send + 'static,
        W: for<'t> FnOnce(
                &'t deadpool_postgres::Transaction<'t>,
            ) -> futures::future::BoxFuture<'t, Result<T, StoreError>>
            + Send
            + 'static,
    {
        self.read(|mut client| async move {
            let tx = client
                .build_transaction()
                .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
                .read_only(true)
                .start()
                .await
                .map_err(backend_error)?;
            let result = work(&tx).await;
            tx.commit().await.map_err(backend_error)?;
            result
        })
    }
}

impl Inner {
    /// Applies `requests` in one transaction (a lone request through the pipelined
    /// [`write::commit`]), retrying lost deadlocks; publishes their events once committed.
    async fn write(&self, requests: &[WriteRequest]) -> Result<Vec<Written>, StoreError> {
        self.announcer.flushed().await;
        let client = self.pool.get().await.map_err(pool_error)?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let committed = match requests {
                [request] => write::commit(&client, request).await.map(|c| vec![c]),
                requests => write::commit_together(&client, requests).await,
            };
            match committed {
                Ok(committed) => {
                    // One transaction's feed positions are consecutive from its first event.
                    let first = committed.iter().find_map(|c| c.first_position);
                    let mut events = Vec::new();
                    let mut written = Vec::with_capacity(committed.len());
                    for (request, committed) in requests.iter().zip(committed) {
                        let key = &request.key;
                        events.extend(committed.changes.into_iter().map(|c| (key.clone(), c)));
                        written.push(committed.written);
                    }
                    if let Some(first) = first {
                        // Committed: a failure to publish here must not fail the write; the
                        // follower publishes the events from the table instead.
                        let _ = self.sync.publish_committed(&client, first, events).await;
                    }
                    for written in &written {
                        self.bulk_analyze.after(&client, &written.outcomes).await;
                    }
                    return Ok(written);
                }
                Err(e) => {
                    // Nothing of the requests stays; a connection that cannot even roll back is
                    // not reused.
                    if client.batch_execute("ROLLBACK").await.is_err() {
                        let _ = deadpool_postgres::Object::take(client);
                        return Err(e);
                    }
                    if attempt < WRITE_ATTEMPTS && is_conflict(e.cause()) {
                        continue;
                    }
                    return Err(e);
                }
            }
        }
    }
}

/// A transaction PostgreSQL aborted to resolve a conflict with another: retrying it is safe.
fn is_conflict(e: &StoreError) -> bool {
    matches!(e, StoreError::Backend(text)
        if text.contains("deadlock detected") || text.contains("could not serialize access"))
}

/// A read of one connection, with its arguments moved in.
macro_rules! read {
    ($self:ident, |$c:ident| $body:expr) => {
        $self.read(move |$c| async move {
            let $c = &$c;
            $body.await
        })
    };
}

/// A read of several statements in one snapshot.
macro_rules! snapshot {
    ($self:ident, |$c:ident| $body:expr) => {
        $self.read_snapshot(move |$c| Box::pin(async move { $body.await }))
    };
}

impl Store for PgStore {
    fn write(
        &self,
        request: WriteRequest,
    ) -> impl Future<Output = Result<Written, StoreError>> + Send {
        self.run(|inner| async move {
            let mut written = inner.write(std::slice::from_ref(&request)).await?;
            Ok(written.pop().expect("one request, one answer"))
        })
    }

    fn write_together(
        &self,
        requests: Vec<WriteRequest>,
    ) -> impl Future<Output = Result<Vec<Written>, StoreError>> + Send {
        self.run(|inner| async move {
            match requests.is_empty() {
                true => Ok(Vec::new()),
                false => inner.write(&requests).await,
            }
        })
    }

    fn message(
        &self,
        key: &SessionKey,
        id: &str,
    ) -> impl Future<Output = Result<Option<StoredMessage>, StoreError>> + Send {
        let (key, id) = (key.clone(), lookup(id));
        read!(self, |c| queries::message(c, &key, &id))
    }

    fn children(
        &self,
        key: &SessionKey,
        id: &str,
    ) -> impl Future<Output = Result<Vec<StoredMessage>, StoreError>> + Send {
        let (key, id) = (key.clone(), lookup(id));
        read!(self, |c| queries::children(c, &key, &id))
    }

    fn roots(
        &self,
        key: &SessionKey,
    ) -> impl Future<Output = Result<Vec<StoredMessage>, StoreError>> + Send {
        let key = key.clone();
        read!(self, |c| queries::roots(c, &key))
    }

    fn stats(
        &self,
        key: &SessionKey,
    ) -> impl Future<Output = Result<SessionStats, StoreError>> + Send {
        let key = key.clone();
        read!(self, |c| queries::stats(c, &key))
    }

    fn path(
        &self,
        key: &SessionKey,
        leaf: Option<&str>,
    ) -> impl Future<Output = Result<PathRows, StoreError>> + Send {
        let (key, leaf) = (key.clone(), leaf.map(lookup));
        snapshot!(self, |c| queries::path(c, &key, leaf.as_deref()))
    }

    fn path_runs(
        &self,
        key: &SessionKey,
        leaf: Option<&str>,
        locate: &[String],
    ) -> impl Future<Output = Result<PathRuns, StoreError>> + Send {
        let ids: Vec<String> = locate.iter().map(|id| lookup(id)).collect();
        let (key, leaf) = (key.clone(), leaf.map(lookup));
        snapshot!(self, |c| queries::path_runs(c, &key, leaf.as_deref(), &ids))
    }

    fn range_totals(
        &self,
        key: &SessionKey,
        ranges: &[(i64, i64)],
    ) -> impl Future<Output = Result<Vec<RangeTotals>, StoreError>> + Send {
        let (key, ranges) = (key.clone(), ranges.to_vec());
        read!(self, |c| queries::range_totals(c, &key, &ranges))
    }

    /// A linear conversation's plan comes from one statement; a walk runs in a snapshot.
    fn path_plan(
        &self,
        key: &SessionKey,
        leaf: Option<&str>,
    ) -> impl Future<Output = Result<PathPlan, StoreError>> + Send {
        let (key, leaf) = (key.clone(), leaf.map(lookup));
        let (quick_key, quick_leaf) = (key.clone(), leaf.clone());
        let quick = read!(self, |c| queries::plan_without_walk(
            c,
            &quick_key,
            quick_leaf.as_deref()
        ));
        let store = self.clone();
        async move {
            match quick.await? {
                Some(plan) => Ok(plan),
                None => snapshot!(store, |c| queries::path_plan(c, &key, leaf.as_deref())).await,
            }
        }
    }

    fn fetch_range(
        &self,
        key: &SessionKey,
        from: i64,
        last: i64,
        max_rows: usize,
        max_bytes: u64,
    ) -> impl Future<Output = Result<Vec<StoredMessage>, StoreError>> + Send {
        let key = key.clone();
        read!(self, |c| queries::fetch_range(
            c, &key, from, last, max_rows, max_bytes
        ))
    }

    fn fetch_range_newest(
        &self,
        key: &SessionKey,
        first: i64,
        last: i64,
        max_rows: usize,
    ) -> impl Future<Output = Result<Vec<StoredMessage>, StoreError>> + Send {
        let key = key.clone();
        read!(self, |c| queries::fetch_range_newest(
            c, &key, first, last, max_rows
        ))
    }

    fn path_suffix(
        &self,
        key: &SessionKey,
        leaf: Option<&str>,
        max_bytes: u64,
    ) -> impl Future<Output = Result<PathSuffix, StoreError>> + Send {
        let (key, leaf) = (key.clone(), leaf.map(lookup));
        snapshot!(self, |c| queries::path_suffix(
            c,
            &key,
            leaf.as_deref(),
            max_bytes
        ))
    }

    fn fetch(
        &self,
        key: &SessionKey,
        seqs: &[i64],
    ) -> impl Future<Output = Result<Vec<StoredMessage>, StoreError>> + Send {
        let (key, seqs) = (key.clone(), seqs.to_vec());
        read!(self, |c| queries::fetch(c, &key, &seqs))
    }

    fn ancestors(
        &self,
        key: &SessionKey,
        from: &str,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<StoredMessage>, StoreError>> + Send {
        let (key, from) = (key.clone(), lookup(from));
        snapshot!(self, |c| queries::ancestors(c, &key, &from, limit))
    }

    fn search(
        &self,
        key: &SessionKey,
        words: &[String],
        filter: &SearchFilter,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<SearchHit>, StoreError>> + Send {
        let (key, words, filter) = (key.clone(), words.to_vec(), looked_up(filter));
        read!(self, |c| async {
            if words.is_empty() || limit == 0 {
                return Ok(Vec::new());
            }
            queries::search(c, &key, &words, &filter, limit).await
        })
    }

    fn session(
        &self,
        key: &SessionKey,
    ) -> impl Future<Output = Result<Option<SessionInfo>, StoreError>> + Send {
        let key = key.clone();
        read!(self, |c| registry::session_info(c, &key))
    }

    fn list_sessions(
        &self,
        namespace: &str,
        query: &SessionQuery,
    ) -> impl Future<Output = Result<Vec<SessionInfo>, StoreError>> + Send {
        let mut query = query.clone();
        query.user_id = query.user_id.as_deref().map(lookup);
        if let Some(after) = &mut query.after {
            after.id = lookup(&after.id);
        }
        let namespace = namespace.to_owned();
        read!(self, |c| registry::list_sessions(c, &namespace, &query))
    }

    fn compactions(
        &self,
        key: &SessionKey,
    ) -> impl Future<Output = Result<Vec<Compaction>, StoreError>> + Send {
        let key = key.clone();
        read!(self, |c| registry::compactions(c, &key))
    }

    fn state(
        &self,
        key: &SessionKey,
        name: &str,
    ) -> impl Future<Output = Result<Option<String>, StoreError>> + Send {
        let (key, name) = (key.clone(), lookup(name));
        read!(self, |c| registry::state(c, &key, &name))
    }

    fn state_entries(
        &self,
        key: &SessionKey,
    ) -> impl Future<Output = Result<Vec<(String, String)>, StoreError>> + Send {
        let key = key.clone();
        read!(self, |c| registry::state_entries(c, &key))
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
            user_id.map(lookup),
            words.to_vec(),
            looked_up(filter),
        );
        read!(self, |c| async {
            if words.is_empty() || limit == 0 {
                return Ok(Vec::new());
            }
            registry::search_namespace(c, &namespace, user_id.as_deref(), &words, &filter, limit)
                .await
        })
    }

    fn attachment_sizes(
        &self,
        namespace: &str,
        hashes: &[String],
    ) -> impl Future<Output = Result<Vec<(String, u64)>, StoreError>> + Send {
        let (namespace, hashes) = (namespace.to_owned(), hashes.to_vec());
        read!(self, |c| attachments::sizes(c, &namespace, &hashes))
    }

    fn attachments(
        &self,
        namespace: &str,
        hashes: &[String],
    ) -> impl Future<Output = Result<Vec<Payload>, StoreError>> + Send {
        let (namespace, hashes) = (namespace.to_owned(), hashes.to_vec());
        snapshot!(self, |c| attachments::read(c, &namespace, &hashes))
    }

    fn context_blocks(
        &self,
        key: &SessionKey,
    ) -> impl Future<Output = Result<Vec<ScopedBlock>, StoreError>> + Send {
        let key = key.clone();
        read!(self, |c| context::blocks(c, &key))
    }

    fn context_entry_keys(
        &self,
        key: &SessionKey,
        label: &str,
    ) -> impl Future<Output = Result<Vec<(String, Option<String>)>, StoreError>> + Send {
        let (key, label) = (key.clone(), label.to_owned());
        read!(self, |c| context::entry_keys(c, &key, &label))
    }

    fn context_entries(
        &self,
        key: &SessionKey,
        label: &str,
        after: Option<&str>,
        rows: Option<usize>,
    ) -> impl Future<Output = Result<Vec<ScopedEntry>, StoreError>> + Send {
        let (key, label, after) = (key.clone(), label.to_owned(), after.map(str::to_owned));
        read!(self, |c| context::entries(
            c,
            &key,
            &label,
            after.as_deref(),
            rows
        ))
    }

    fn context_entry(
        &self,
        key: &SessionKey,
        label: &str,
        entry_key: &str,
    ) -> impl Future<Output = Result<Option<ContextEntry>, StoreError>> + Send {
        let (key, label, entry_key) = (key.clone(), label.to_owned(), entry_key.to_owned());
        read!(self, |c| context::entry(c, &key, &label, &entry_key))
    }

    fn search_context(
        &self,
        key: &SessionKey,
        label: &str,
        words: &[String],
        limit: usize,
    ) -> impl Future<Output = Result<Vec<(String, String)>, StoreError>> + Send {
        let (key, label, words) = (key.clone(), label.to_owned(), words.to_vec());
        read!(self, |c| context::search(c, &key, &label, &words, limit))
    }

    fn prompt(
        &self,
        key: &SessionKey,
    ) -> impl Future<Output = Result<Option<FrozenPrompt>, StoreError>> + Send {
        let key = key.clone();
        read!(self, |c| context::prompt(c, &key))
    }

    fn subscribe(&self, filter: FeedFilter) -> Subscription {
        self.inner.sync.feed.subscribe(filter)
    }

    /// Delivered to this instance's live subscribers at once and to other instances' through
    /// a notification: the event records no write, so it takes no feed position and cannot be
    /// resumed from.
    fn announce(&self, key: &SessionKey, change: Change) {
        let (inner, feed) = (&self.inner, &self.inner.sync.feed);
        let payload = feed::announcement(inner.instance, feed.position(), key, &change);
        feed.notify(key.clone(), change);
        inner.announcer.announce(payload);
    }

    /// Resumes from the events this instance holds in memory (every instance's), or from older
    /// ones the feed table still keeps, within [`PgConfig::resume_backlog`] of those the filter
    /// accepts, read in one snapshot.
    fn subscribe_after(
        &self,
        filter: FeedFilter,
        position: u64,
    ) -> impl Future<Output = Option<Subscription>> + Send {
        let feed = self.inner.sync.feed.clone();
        async move {
            if let Some(resumed) = feed.subscribe_after(filter.clone(), position) {
                return Some(resumed);
            }
            let through = feed.position();
            if position > through {
                return None; // never published
            }
            let (accepted, limits) = (filter.clone(), self.inner.resume_backlog);
            let backlog = self
                .read_snapshot(move |c| {
                    Box::pin(feed::backlog(c, accepted, position, through, limits))
                })
                .await;
            feed.subscribe_with_backlog(filter, backlog.ok()??, through)
        }
    }

    /// The same on every instance of one database, so a position read on one resumes on another.
    fn feed_epoch(&self) -> u64 {
        self.inner.epoch
    }

    /// Several instances write to one database.
    fn shared(&self) -> bool {
        true
    }
}
