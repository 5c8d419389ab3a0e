//! sessiondb HTTP benchmark: appends per second and latency with 1, 16 and 64 concurrent
//! keep-alive clients on loopback (durable mode: `synchronous=FULL`), and the time to stream a
//! 10,000-message history as NDJSON.
//!
//! `cargo run --release -p sessiondb-bench --bin sessiondb-http-bench [-- SECONDS]`
//!
//! `TLS=1` serves HTTPS (every client then pays a handshake once, and encryption on every
//! request); the history stream is then left out (its client speaks plain HTTP only).
//! `H2=1` has the clients share one HTTP/2 connection, each request a stream of its own (with
//! prior knowledge in clear text, by ALPN over TLS), instead of one HTTP/1.1 connection each.
//!
//! The server runs in this process on its own runtime, configured as `sessiondb serve`
//! configures it; clients use a separate runtime and one connection each.
#![forbid(unsafe_code)]

mod load;

use std::time::{Duration, Instant};

use load::{Load, clients, http2_clients, percentile, serve_over, server_runtime};

use sessiondb::{Db, SqliteConfig, SqliteStore, Synchronous};

fn main() {
    let seconds: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(5);
    // `SYNC=normal` measures without the per-commit fsync, to see what durability costs.
    let synchronous = match std::env::var("SYNC").as_deref() {
        Ok("normal") => Synchronous::Normal,
        _ => Synchronous::Full,
    };
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open_with(
        dir.path(),
        SqliteConfig {
            synchronous,
            ..SqliteConfig::default()
        },
    )
    .unwrap();
    let stats = store.write_stats();
    let server = server_runtime();
    let tls = std::env::var("TLS").is_ok_and(|v| v == "1");
    let base = serve_over(&server, Db::new(store), tls);

    let client_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let http2 = std::env::var("H2").is_ok_and(|v| v == "1");
    let scheme = if tls { "HTTPS" } else { "HTTP" };
    let connections = if http2 {
        "HTTP/2, one connection for all clients"
    } else {
        "HTTP/1.1, a connection per client"
    };
    println!(
        "--- sessiondb {scheme} ({connections}; loopback, synchronous={synchronous:?}, {seconds} s per level)"
    );
    let start = |concurrency, deadline, load| {
        let base = base.clone();
        async move {
            if http2 {
                http2_clients(&base, concurrency, deadline, load).await
            } else {
                clients(&base, concurrency, deadline, load)
            }
        }
    };
    client_runtime.block_on(async {
        for concurrency in [1usize, 16, 64] {
            let commits_before = stats.commits.load(std::sync::atomic::Ordering::Relaxed);
            let busy_before = stats.busy_nanos.load(std::sync::atomic::Ordering::Relaxed);
            let deadline = Instant::now() + Duration::from_secs(seconds);
            let tasks = start(concurrency, deadline, Load::Appends).await;
            let started = Instant::now();
            let mut latencies = Vec::new();
            for task in tasks {
                latencies.extend(task.await.unwrap());
            }
            let elapsed = started.elapsed().as_secs_f64();
            latencies.sort();
            let commits = stats.commits.load(std::sync::atomic::Ordering::Relaxed) - commits_before;
            let busy = (stats.busy_nanos.load(std::sync::atomic::Ordering::Relaxed) - busy_before) as f64 / 1e9;
            println!(
                "appends, {concurrency:>2} clients: {:>8.0} appends/s  p50 {:.3} ms  p99 {:.3} ms  p99.9 {:.3} ms  max {:.1} ms  ({} appends, {:.1} per commit, writer busy {:.0}%)",
                latencies.len() as f64 / elapsed,
                percentile(&latencies, 0.5),
                percentile(&latencies, 0.99),
                percentile(&latencies, 0.999),
                percentile(&latencies, 1.0),
                latencies.len(),
                latencies.len() as f64 / commits.max(1) as f64,
                busy / elapsed * 100.0,
            );
        }

        let deadline = Instant::now() + Duration::from_secs(seconds);
        let started = Instant::now();
        let mut probes = 0;
        for task in start(64, deadline, Load::Health).await {
            probes += task.await.unwrap().len();
        }
        println!(
            "HTTP ceiling, 64 clients on GET /healthz: {:>8.0} requests/s",
            probes as f64 / started.elapsed().as_secs_f64()
        );

        if tls {
            return;
        }
        let client = reqwest::Client::new();
        let history = format!("{base}/v1/sessions/long/history");
        load::fill_long(&base).await;
        let mut times = Vec::new();
        for _ in 0..20 {
            let started = Instant::now();
            let body = client.get(&history).send().await.unwrap().bytes().await.unwrap();
            times.push(started.elapsed());
            assert_eq!(body.iter().filter(|b| **b == b'\n').count(), 10_000);
        }
        times.sort();
        println!(
            "stream 10,000-message history (NDJSON): median {:.2} ms, best {:.2} ms",
            percentile(&times, 0.5),
            times[0].as_secs_f64() * 1000.0
        );
    });
}
