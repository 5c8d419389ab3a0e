//! sessiondb's two backends through the HTTP server, side by side: appends per second and the
//! latency of reading the last 50 messages of a 10,000-message session, with 1, 16 and 64
//! keep-alive clients. Both are durable: SQLite with `synchronous=FULL`, PostgreSQL with
//! `synchronous_commit = on` (a throw-away cluster this benchmark starts on the same disk).
//!
//! `cargo run --release -p sessiondb-bench --bin sessiondb-backends-bench [-- SECONDS]`
//!
//! Each server runs in this process on its own runtime, as `sessiondb serve` configures it; the
//! levels are interleaved (SQLite, PostgreSQL, next level) so machine noise hits both alike.
#![forbid(unsafe_code)]

mod load;

use std::time::{Duration, Instant};

use load::{Load, clients, percentile, serve, server_runtime};
use sessiondb::{Db, SqliteStore};
use sessiondb_postgres::cluster::TempCluster;
use sessiondb_postgres::{PgConfig, PgStore};

/// Requests per second, p50 and p99 in milliseconds.
async fn measure(base: &str, concurrency: usize, seconds: u64, load: Load) -> (f64, f64, f64) {
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let started = Instant::now();
    let mut latencies = Vec::new();
    for task in clients(base, concurrency, deadline, load) {
        latencies.extend(task.await.unwrap());
    }
    let elapsed = started.elapsed().as_secs_f64();
    latencies.sort();
    (
        latencies.len() as f64 / elapsed,
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
    )
}

fn main() {
    let seconds: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(5);
    let dir = tempfile::tempdir().unwrap();
    let sqlite_runtime = server_runtime();
    let sqlite = serve(
        &sqlite_runtime,
        Db::new(SqliteStore::open(dir.path()).unwrap()),
    );

    let cluster = TempCluster::start().expect("PostgreSQL for the benchmark");
    let pg_runtime = server_runtime();
    let store = pg_runtime
        .block_on(PgStore::connect_with(&cluster.url(), PgConfig::default()))
        .unwrap();
    let postgres = serve(&pg_runtime, Db::new(store));
    let backends = [("SQLite", sqlite), ("PostgreSQL", postgres)];

    let client_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!(
        "--- sessiondb HTTP on SQLite and PostgreSQL (loopback, durable, {seconds} s per level)"
    );
    client_runtime.block_on(async {
        for (_, base) in &backends {
            load::fill_long(base).await;
        }
        println!("| clients | backend | appends/s | append p50 / p99 (ms) | last-50 reads/s | last-50 p50 / p99 (ms) |");
        println!("| --- | --- | --- | --- | --- | --- |");
        for concurrency in [1usize, 16, 64] {
            for (name, base) in &backends {
                let (appends, a50, a99) = measure(base, concurrency, seconds, Load::Appends).await;
                let (reads, r50, r99) = measure(base, concurrency, seconds, Load::LastFifty).await;
                println!(
                    "| {concurrency} | {name} | {appends:.0} | {a50:.2} / {a99:.2} | {reads:.0} | {r50:.2} / {r99:.2} |"
                );
            }
        }
    });
    drop(pg_runtime);
    drop(cluster);
}
