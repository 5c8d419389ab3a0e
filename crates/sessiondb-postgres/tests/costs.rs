//! The stated costs on PostgreSQL, counted by the server itself (`pg_stat_statements`): an
//! append runs as many statements, for as many rows, and touches about as many buffers in a
//! long session as in a short one; so does a read of the last 50, a search and an update of an
//! earlier message on a branched path; and a page of the session listing costs the same among
//! few sessions as among many.

use futures::StreamExt;
use std::sync::atomic::{AtomicUsize, Ordering};

use sessiondb::{
    AppendOptions, Db, HistoryOptions, Message, PageRequest, Parent, Session, SessionListing,
    SessionSort, Source,
};
use sessiondb_postgres::cluster::TempCluster;
use sessiondb_postgres::{PgConfig, PgStore};

/// Statements run, rows they returned or changed, shared buffers they hit or read.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct Spent {
    calls: i64,
    rows: i64,
    buffers: i64,
}

/// Statements the change feed's machinery runs on its own schedule (catching up, trimming),
/// whichever operation is being measured.
fn on_the_feeds_schedule(query: &str) -> bool {
    query.starts_with("SELECT position, namespace")
        || query.starts_with("DELETE FROM feed")
        || query.starts_with("SELECT epoch, position")
        || query.starts_with("LISTEN")
        || query.contains("pg_stat_statements")
}

/// What `operation` made the server do: the cheapest of three runs, since a run may also pay
/// for upkeep that happens to fall into it (a page pruned, a catalog entry read again).
async fn measure<F: Future<Output = ()>>(
    client: &tokio_postgres::Client,
    operation: impl Fn() -> F,
) -> Spent {
    let mut cheapest: Option<Spent> = None;
    for _ in 0..3 {
        let spent = measure_once(client, operation()).await;
        if cheapest.is_none_or(|c| spent.buffers < c.buffers) {
            cheapest = Some(spent);
        }
    }
    cheapest.unwrap()
}

async fn measure_once<F: Future<Output = ()>>(
    client: &tokio_postgres::Client,
    operation: F,
) -> Spent {
    client
        .execute("SELECT pg_stat_statements_reset()", &[])
        .await
        .unwrap();
    operation.await;
    let rows = client
        .query(
            "SELECT query, calls, rows, shared_blks_hit + shared_blks_read
               FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database
                                                      WHERE datname = current_database())",
            &[],
        )
        .await
        .unwrap();
    let mut spent = Spent::default();
    for row in rows.iter().filter(|r| !on_the_feeds_schedule(r.get(0))) {
        spent.calls += row.get::<_, i64>(1);
        spent.rows += row.get::<_, i64>(2);
        spent.buffers += row.get::<_, i64>(3);
    }
    spent
}

/// As many statements, returning or changing as many rows; buffers within a quarter and a few
/// pages (a longer session's index entries sit on other pages, a level deeper here and there;
/// a cost that grew with the session would be many times larger).
fn assert_alike(short: Spent, long: Spent, what: &str) {
    let counts = |s: Spent| (s.calls, s.rows);
    assert_eq!(counts(short), counts(long), "{what}: {short:?} vs {long:?}");
    let (a, b) = (short.buffers as f64, long.buffers as f64);
    assert!(
        a.max(b) <= 1.25 * a.min(b) + 8.0,
        "{what}: {short:?} vs {long:?}"
    );
}

/// Runs `operation` on a short and a long session and asserts the two cost alike; returns what
/// it cost on the long one.
async fn costs_alike<F: Future<Output = ()>>(
    client: &tokio_postgres::Client,
    [short, long]: [&Session<PgStore>; 2],
    what: &str,
    operation: impl Fn(&Session<PgStore>) -> F,
) -> Spent {
    // Each pooled connection's first statements after the statistics changed read the catalogs
    // again: warm them all first.
    for _ in 0..4 {
        operation(short).await;
        operation(long).await;
    }
    let on_short = measure(client, || operation(short)).await;
    let on_long = measure(client, || operation(long)).await;
    assert_alike(on_short, on_long, what);
    on_long
}

async fn fill(session: &Session<PgStore>, len: usize) {
    for start in (0..len).step_by(500) {
        let batch = (start..(start + 500).min(len))
            .map(|n| Message::text("user", format!("message {n} about the weather")))
            .collect();
        session
            .append_all(batch, AppendOptions::default())
            .await
            .unwrap();
    }
    let needle = Message::text("assistant", "the needle");
    session
        .append(needle, AppendOptions::default())
        .await
        .unwrap();
}

fn metered_cluster() -> TempCluster {
    TempCluster::start_with(&[("shared_preload_libraries", "pg_stat_statements")])
        .unwrap_or_else(|e| panic!("cannot start PostgreSQL for the tests: {e}"))
}

/// A connection to the database at `url` that reads its statement statistics.
fn metering_client(runtime: &tokio::runtime::Runtime, url: &str) -> tokio_postgres::Client {
    runtime.block_on(async {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        client
            .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            .await
            .unwrap();
        client
    })
}

#[test]
fn appends_the_last_50_and_searches_cost_the_same_in_short_and_long_sessions() {
    let cluster = metered_cluster();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let client = metering_client(&runtime, &cluster.url());
    let db = Db::new(PgStore::connect_blocking(&cluster.url(), PgConfig::default()).unwrap());
    let (short, long) = (db.session("short").unwrap(), db.session("long").unwrap());
    runtime.block_on(async {
        fill(&short, 60).await;
        fill(&long, 9_000).await;
        // As autovacuum would: the planner's choices are those of a database it has statistics of.
        client.batch_execute("VACUUM ANALYZE").await.unwrap();
        let append = |session: &Session<PgStore>| {
            let session = session.clone();
            async move {
                for n in 0..5 {
                    let message = Message::text("user", format!("one more, number {n}"));
                    session
                        .append(message, AppendOptions::default())
                        .await
                        .unwrap();
                }
            }
        };
        let spent = costs_alike(&client, [&short, &long], "five appends", append).await;
        assert!(spent.calls <= 5 * 10, "five appends: {spent:?}");

        let last_50 = |session: &Session<PgStore>| {
            let session = session.clone();
            async move {
                let newest = HistoryOptions {
                    newest_first: true,
                    ..HistoryOptions::default()
                };
                let page: Vec<_> = session.history(newest).take(50).collect().await;
                assert_eq!(page.len(), 50);
            }
        };
        costs_alike(&client, [&short, &long], "the last 50", last_50).await;

        let search = |session: &Session<PgStore>| {
            let session = session.clone();
            async move {
                assert_eq!(session.search("needle", 20).await.unwrap().len(), 1);
            }
        };
        costs_alike(&client, [&short, &long], "a search", search).await;

        // An update of an earlier message while the active path has a branch point: whether the
        // row counts in the session's totals comes from the path's runs (one probe per branch
        // point), not from a walk of its rows.
        let mut edited = Vec::new();
        for session in [&short, &long] {
            let first_id = |options: HistoryOptions, n: usize| {
                let session = session.clone();
                async move {
                    let rows: Vec<_> = session.history(options).take(n + 1).collect().await;
                    rows[n].as_ref().unwrap().id.to_string()
                }
            };
            let newest = HistoryOptions {
                newest_first: true,
                ..HistoryOptions::default()
            };
            // The branch leaves the path nearly as long as the session.
            let branch = AppendOptions {
                parent: Parent::Id(first_id(newest, 10).await),
                ..AppendOptions::default()
            };
            let fork = Message::text("user", "a branch");
            session.append(fork, branch).await.unwrap();
            edited.push(first_id(HistoryOptions::default(), 10).await);
        }
        let edits = AtomicUsize::new(0);
        let update = |session: &Session<PgStore>| {
            let id = if session.id() == "short" {
                &edited[0]
            } else {
                &edited[1]
            };
            let text = format!("edit {}", edits.fetch_add(1, Ordering::Relaxed));
            let message = Message::text("user", text).with_id(id.as_str());
            let session = session.clone();
            async move {
                let updated = session.update(message, Source::Client).await.unwrap();
                assert!(updated.is_some());
            }
        };
        costs_alike(
            &client,
            [&short, &long],
            "an update on a branched path",
            update,
        )
        .await;
    });
}

#[test]
fn a_page_of_sessions_costs_the_same_among_few_and_many() {
    let cluster = metered_cluster();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let page_cost = |sessions: usize| {
        let url = cluster
            .create_database(&format!("sessions_{sessions}"), "template1")
            .unwrap();
        let client = metering_client(&runtime, &url);
        let db = Db::new(PgStore::connect_blocking(&url, PgConfig::default()).unwrap());
        runtime.block_on(async {
            for n in 0..sessions {
                let message = Message::text("user", format!("hello from {n}"));
                let session = db.session(&format!("s{n:05}")).unwrap();
                session
                    .append(message, AppendOptions::default())
                    .await
                    .unwrap();
            }
            client.batch_execute("VACUUM ANALYZE").await.unwrap();
            let listing = SessionListing {
                page: PageRequest {
                    limit: Some(20),
                    descending: true,
                    ..PageRequest::default()
                },
                sort: SessionSort::LastMessageAt,
                user_id: None,
            };
            let page = || async {
                let page = db.list_sessions("", &listing).await.unwrap();
                assert_eq!(page.items.len(), 20);
            };
            for _ in 0..8 {
                page().await;
            }
            measure(&client, page).await
        })
    };
    assert_alike(page_cost(30), page_cost(3_000), "a page of 20 sessions");
}
