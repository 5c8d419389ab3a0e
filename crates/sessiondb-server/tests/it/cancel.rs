//! NDJSON history is pulled as the client reads: a client that goes away stops the reads, and a
//! read that fails midway ends the response unfinished.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use sessiondb::{Db, SqliteStore, Store};
use sessiondb_core::{
    Compaction, FeedFilter, PathPlan, PathRows, PathRuns, PathSuffix, RangeTotals, SearchFilter,
    SearchHit, SessionInfo, SessionKey, SessionQuery, SessionStats, StoreError, StoredMessage,
    Subscription, WriteRequest, Written,
};
use sessiondb_server::{App, Metrics, ServerConfig};

/// The SQLite store, counting the content windows read; forward windows from number
/// `failing_from` on fail.
struct CountingStore {
    inner: SqliteStore,
    windows: Arc<AtomicUsize>,
    failing_from: usize,
}

impl Store for CountingStore {
    fn write(
        &self,
        request: WriteRequest,
    ) -> impl Future<Output = Result<Written, StoreError>> + Send {
        self.inner.write(request)
    }
    fn write_together(
        &self,
        requests: Vec<WriteRequest>,
    ) -> impl Future<Output = Result<Vec<Written>, StoreError>> + Send {
        self.inner.write_together(requests)
    }
    fn message(
        &self,
        key: &SessionKey,
        id: &str,
    ) -> impl Future<Output = Result<Option<StoredMessage>, StoreError>> + Send {
        self.inner.message(key, id)
    }
    fn children(
        &self,
        key: &SessionKey,
        id: &str,
    ) -> impl Future<Output = Result<Vec<StoredMessage>, StoreError>> + Send {
        self.inner.children(key, id)
    }
    fn roots(
        &self,
        key: &SessionKey,
    ) -> impl Future<Output = Result<Vec<StoredMessage>, StoreError>> + Send {
        self.inner.roots(key)
    }
    fn stats(
        &self,
        key: &SessionKey,
    ) -> impl Future<Output = Result<SessionStats, StoreError>> + Send {
        self.inner.stats(key)
    }
    fn path(
        &self,
        key: &SessionKey,
        leaf: Option<&str>,
    ) -> impl Future<Output = Result<PathRows, StoreError>> + Send {
        self.inner.path(key, leaf)
    }
    fn path_runs(
        &self,
        key: &SessionKey,
        leaf: Option<&str>,
        locate: &[String],
    ) -> impl Future<Output = Result<PathRuns, StoreError>> + Send {
        self.inner.path_runs(key, leaf, locate)
    }
    fn range_totals(
        &self,
        key: &SessionKey,
        ranges: &[(i64, i64)],
    ) -> impl Future<Output = Result<Vec<RangeTotals>, StoreError>> + Send {
        self.inner.range_totals(key, ranges)
    }
    fn path_plan(
        &self,
        key: &SessionKey,
        leaf: Option<&str>,
    ) -> impl Future<Output = Result<PathPlan, StoreError>> + Send {
        self.inner.path_plan(key, leaf)
    }
    fn fetch_range(
        &self,
        key: &SessionKey,
        from: i64,
        last: i64,
        max_rows: usize,
        max_bytes: u64,
    ) -> impl Future<Output = Result<Vec<StoredMessage>, StoreError>> + Send {
        let failing = self.windows.fetch_add(1, Ordering::SeqCst) >= self.failing_from;
        let read = self.inner.fetch_range(key, from, last, max_rows, max_bytes);
        async move {
            if failing {
                return Err(StoreError::Backend("injected read failure".into()));
            }
            read.await
        }
    }
    fn fetch_range_newest(
        &self,
        key: &SessionKey,
        first: i64,
        last: i64,
        max_rows: usize,
    ) -> impl Future<Output = Result<Vec<StoredMessage>, StoreError>> + Send {
        self.windows.fetch_add(1, Ordering::SeqCst);
        self.inner.fetch_range_newest(key, first, last, max_rows)
    }
    fn path_suffix(
        &self,
        key: &SessionKey,
        leaf: Option<&str>,
        max_bytes: u64,
    ) -> impl Future<Output = Result<PathSuffix, StoreError>> + Send {
        self.inner.path_suffix(key, leaf, max_bytes)
    }
    fn fetch(
        &self,
        key: &SessionKey,
        seqs: &[i64],
    ) -> impl Future<Output = Result<Vec<StoredMessage>, StoreError>> + Send {
        self.windows.fetch_add(1, Ordering::SeqCst);
        self.inner.fetch(key, seqs)
    }
    fn ancestors(
        &self,
        key: &SessionKey,
        from: &str,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<StoredMessage>, StoreError>> + Send {
        self.inner.ancestors(key, from, limit)
    }
    fn search(
        &self,
        key: &SessionKey,
        words: &[String],
        filter: &SearchFilter,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<SearchHit>, StoreError>> + Send {
        self.inner.search(key, words, filter, limit)
    }
    fn session(
        &self,
        key: &SessionKey,
    ) -> impl Future<Output = Result<Option<SessionInfo>, StoreError>> + Send {
        self.inner.session(key)
    }
    fn list_sessions(
        &self,
        namespace: &str,
        query: &SessionQuery,
    ) -> impl Future<Output = Result<Vec<SessionInfo>, StoreError>> + Send {
        self.inner.list_sessions(namespace, query)
    }
    fn compactions(
        &self,
        key: &SessionKey,
    ) -> impl Future<Output = Result<Vec<Compaction>, StoreError>> + Send {
        self.inner.compactions(key)
    }
    fn state(
        &self,
        key: &SessionKey,
        name: &str,
    ) -> impl Future<Output = Result<Option<String>, StoreError>> + Send {
        self.inner.state(key, name)
    }
    fn state_entries(
        &self,
        key: &SessionKey,
    ) -> impl Future<Output = Result<Vec<(String, String)>, StoreError>> + Send {
        self.inner.state_entries(key)
    }
    fn context_blocks(
        &self,
        key: &SessionKey,
    ) -> impl Future<Output = Result<Vec<sessiondb_core::ScopedBlock>, StoreError>> + Send {
        self.inner.context_blocks(key)
    }
    fn context_entry_keys(
        &self,
        key: &SessionKey,
        label: &str,
    ) -> impl Future<Output = Result<Vec<(String, Option<String>)>, StoreError>> + Send {
        self.inner.context_entry_keys(key, label)
    }
    fn context_entries(
        &self,
        key: &SessionKey,
        label: &str,
        after: Option<&str>,
        rows: Option<usize>,
    ) -> impl Future<Output = Result<Vec<sessiondb_core::ScopedEntry>, StoreError>> + Send {
        self.inner.context_entries(key, label, after, rows)
    }
    fn context_entry(
        &self,
        key: &SessionKey,
        label: &str,
        entry_key: &str,
    ) -> impl Future<Output = Result<Option<sessiondb_core::ContextEntry>, StoreError>> + Send {
        self.inner.context_entry(key, label, entry_key)
    }
    fn search_context(
        &self,
        key: &SessionKey,
        label: &str,
        words: &[String],
        limit: usize,
    ) -> impl Future<Output = Result<Vec<(String, String)>, StoreError>> + Send {
        self.inner.search_context(key, label, words, limit)
    }
    fn prompt(
        &self,
        key: &SessionKey,
    ) -> impl Future<Output = Result<Option<sessiondb_core::FrozenPrompt>, StoreError>> + Send {
        self.inner.prompt(key)
    }
    fn search_namespace(
        &self,
        namespace: &str,
        user_id: Option<&str>,
        words: &[String],
        filter: &SearchFilter,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<SearchHit>, StoreError>> + Send {
        self.inner
            .search_namespace(namespace, user_id, words, filter, limit)
    }
    fn attachment_sizes(
        &self,
        namespace: &str,
        hashes: &[String],
    ) -> impl Future<Output = Result<Vec<(String, u64)>, StoreError>> + Send {
        self.inner.attachment_sizes(namespace, hashes)
    }
    fn attachments(
        &self,
        namespace: &str,
        hashes: &[String],
    ) -> impl Future<Output = Result<Vec<sessiondb_core::attachments::Payload>, StoreError>> + Send
    {
        self.inner.attachments(namespace, hashes)
    }
    fn announce(&self, key: &SessionKey, change: sessiondb::Change) {
        self.inner.announce(key, change)
    }
    fn subscribe(&self, filter: FeedFilter) -> Subscription {
        self.inner.subscribe(filter)
    }
    fn subscribe_after(
        &self,
        filter: FeedFilter,
        position: u64,
    ) -> impl Future<Output = Option<Subscription>> + Send {
        self.inner.subscribe_after(filter, position)
    }
    fn feed_epoch(&self) -> u64 {
        self.inner.feed_epoch()
    }

    fn halted(&self) -> Option<StoreError> {
        self.inner.halted()
    }
}

/// Serves `db` on a loopback port until the test ends; returns the base URL.
async fn serve(db: Db<CountingStore>) -> String {
    let app = App::new(db, ServerConfig::default(), Metrics::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(sessiondb_server::serve(
        listener,
        app,
        std::future::pending(),
    ));
    base
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_stops_the_history_reads() {
    let dir = tempfile::tempdir().unwrap();
    let windows = Arc::new(AtomicUsize::new(0));
    let store = CountingStore {
        inner: SqliteStore::open(dir.path()).unwrap(),
        windows: windows.clone(),
        failing_from: usize::MAX,
    };
    let db = Db::new(store);
    // 10,000 messages of 4 KB: 200 windows of 50, ~40 MB of NDJSON, far more than socket buffers.
    sessiondb_testkit::fill(&db.session("big").unwrap(), 10_000, 4000).await;
    let base = serve(db).await;

    let response = reqwest::get(format!("{base}/v1/sessions/big/history"))
        .await
        .unwrap();
    let mut body = response.bytes_stream();
    let first = body.next().await.unwrap().unwrap();
    assert!(first.starts_with(b"{\"id\":\"m0\""));
    drop(body);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after_cancel = windows.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        windows.load(Ordering::SeqCst),
        after_cancel,
        "reads stopped"
    );
    assert!(
        after_cancel < 100,
        "read {after_cancel} of 200 windows for a client that left early"
    );

    // A client that reads everything gets every window.
    windows.store(0, Ordering::SeqCst);
    let all = reqwest::get(format!("{base}/v1/sessions/big/history"))
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(all.iter().filter(|b| **b == b'\n').count(), 10_000);
    assert_eq!(windows.load(Ordering::SeqCst), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_that_fails_midway_ends_the_history_unfinished() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::new(CountingStore {
        inner: SqliteStore::open(dir.path()).unwrap(),
        windows: Arc::new(AtomicUsize::new(0)),
        failing_from: 20,
    });
    // 2,000 messages of 4 KB: 40 windows of 50, of which the 21st fails, after ~4 MB were sent.
    sessiondb_testkit::fill(&db.session("big").unwrap(), 2_000, 4000).await;
    let base = serve(db).await;

    let response = reqwest::get(format!("{base}/v1/sessions/big/history"))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.bytes_stream();
    let mut lines = 0;
    let failure = loop {
        match body.next().await {
            Some(Ok(chunk)) => lines += chunk.iter().filter(|b| **b == b'\n').count(),
            Some(Err(e)) => break e,
            None => panic!("the body ended as if complete after {lines} lines"),
        }
    };
    assert!(failure.is_body() || failure.is_decode(), "{failure}");
    assert!(lines < 2_000 - 50, "{lines} lines arrived");
}
