//! sessiondb benchmark: the peer workload of bench/README.md on the embedded SQLite store.
//!
//! `cargo run --release -p sessiondb-bench [-- N]` prints one line per operation (label, mean ms
//! per op), with sessiondb's extra figures (concurrent appenders, appends with the search index);
//! `bench/compare/run.py` measures the peers beside it. Durable mode (`synchronous=FULL`, one fsync per commit) unless `SYNC=normal`.
#![forbid(unsafe_code)]

mod texts;

use std::time::{Duration, Instant};
use texts::{NEEDLE, Texts};

use futures::StreamExt;
use futures::executor::block_on;
use sessiondb::{
    AppendOptions, Db, HistoryOptions, Message, Parent, SqliteConfig, SqliteStore, Synchronous,
};

fn report(label: &str, total_ms: f64, n: usize) {
    let extra = if n > 1 {
        format!("  (x{n}, total {:.2}s)", total_ms / 1000.0)
    } else {
        String::new()
    };
    println!("{label:<48} {:>10.3} ms{extra}", total_ms / n as f64);
}

fn message(i: usize, text: String) -> Message {
    let role = if i % 2 == 1 { "assistant" } else { "user" };
    Message::text(role, text).with_id(format!("m{i}"))
}

fn config() -> SqliteConfig {
    let synchronous = match std::env::var("SYNC").as_deref() {
        Ok("normal") => Synchronous::Normal,
        _ => Synchronous::Full,
    };
    let defaults = SqliteConfig::default();
    // `ROW_CACHE_MIB=0` measures every read from the database.
    let row_cache_bytes = std::env::var("ROW_CACHE_MIB")
        .ok()
        .and_then(|mib| mib.parse::<usize>().ok())
        .map_or(defaults.row_cache_bytes, |mib| mib << 20);
    SqliteConfig {
        synchronous,
        row_cache_bytes,
        ..defaults
    }
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10_000);
    let dir = tempfile::tempdir().unwrap();
    let db = Db::new(SqliteStore::open_with(dir.path(), config()).unwrap());
    let s = db.session("bench").unwrap();
    println!(
        "--- sessiondb (SQLite file, synchronous={:?}) N={n}",
        config().synchronous
    );
    let mut texts = Texts::new(n);

    block_on(async {
        let t0 = Instant::now();
        for i in 0..n {
            s.append(message(i, texts.next(i)), AppendOptions::default())
                .await
                .unwrap();
        }
        report("append one-by-one (per msg)", ms(t0), n);

        let t0 = Instant::now();
        let mut last = Vec::new();
        for _ in 0..200 {
            let newest = HistoryOptions {
                leaf: None,
                newest_first: true,
            };
            last = s
                .history(newest)
                .take(50)
                .map(|m| m.unwrap())
                .collect::<Vec<_>>()
                .await;
        }
        assert_eq!(last[0].id, format!("m{}", n - 1));
        report("history(newest_first) take 50", ms(t0), 200);

        let t0 = Instant::now();
        for _ in 0..200 {
            let recent = s.recent_history(50 * 400, None).await.unwrap();
            assert!(!recent.messages.is_empty());
        }
        report("recent_history(20 KB budget)", ms(t0), 200);

        // The first read comes from the database and fills the row cache; the next ones are
        // answered from it (the median of five).
        let mut reads = Vec::new();
        for _ in 0..6 {
            let t0 = Instant::now();
            let all = s.full_history(HistoryOptions::default()).await.unwrap();
            assert_eq!(all.len(), n.min(sessiondb::MAX_PATH_ROWS));
            drop(all);
            reads.push(ms(t0));
        }
        report("full_history() whole path, first read", reads[0], 1);
        reads[1..].sort_by(f64::total_cmp);
        report("full_history() whole path, again (median)", reads[3], 1);
        let t0 = Instant::now();
        for _ in 0..5 {
            assert_eq!(
                s.row_stats(None).await.unwrap().len(),
                n.min(sessiondb::MAX_PATH_ROWS)
            );
        }
        report("row_stats() whole path (no content)", ms(t0), 5);

        let t0 = Instant::now();
        let hits = s.search(NEEDLE, 10).await.unwrap();
        report("search() first call (builds FTS index)", ms(t0), 1);
        let t0 = Instant::now();
        for _ in 0..200 {
            assert_eq!(s.search(NEEDLE, 10).await.unwrap().len(), hits.len());
        }
        report("search() warm", ms(t0), 200);
        println!("   hits: {}", hits.len());
        // What snippets add to a search that finds many: 20 hits of two common words, then
        // the same with each hit's snippet (as the HTTP API answers).
        let (common, limit) = ("gamma delta", 20);
        let t0 = Instant::now();
        for _ in 0..200 {
            assert_eq!(s.search(common, limit).await.unwrap().len(), limit);
        }
        report("search() of 2 common words, 20 hits", ms(t0), 200);
        let highlighter = sessiondb::Highlighter::new(common);
        let t0 = Instant::now();
        for _ in 0..200 {
            for hit in s.search(common, limit).await.unwrap() {
                let snippet = highlighter.snippet(&hit.content, sessiondb::DEFAULT_SNIPPET_WORDS);
                assert!(snippet.len() >= 3);
            }
        }
        report("  the same with each hit's snippet", ms(t0), 200);

        let t0 = Instant::now();
        let fork = AppendOptions {
            parent: Parent::Id(format!("m{}", n >> 2)),
            ..Default::default()
        };
        s.append(
            Message::text("user", "forked question").with_id("fork1"),
            fork,
        )
        .await
        .unwrap();
        report(
            &format!("branch: append with parent=m{}", n >> 2),
            ms(t0),
            1,
        );
        let t0 = Instant::now();
        let branch = s.full_history(HistoryOptions::default()).await.unwrap();
        report("full_history() on new branch", ms(t0), 1);
        println!("   branch length: {}", branch.len());
        let t0 = Instant::now();
        for _ in 0..200 {
            let newest = HistoryOptions {
                leaf: None,
                newest_first: true,
            };
            let last: Vec<_> = s.history(newest).take(50).collect().await;
            assert_eq!(last.len(), 50);
        }
        report("history(newest_first) take 50 on the branch", ms(t0), 200);
        let t0 = Instant::now();
        for k in 0..100 {
            let at = AppendOptions {
                parent: Parent::Id(format!("m{}", (k * 97) % n)),
                ..Default::default()
            };
            s.append(
                Message::text("user", "another fork").with_id(format!("fork-{k}")),
                at,
            )
            .await
            .unwrap();
        }
        report("branch appends at spread-out points (mean)", ms(t0), 100);
        let t0 = Instant::now();
        for k in 0..100 {
            let text = format!("tail append {k} after the index exists");
            s.append(Message::text("user", text), AppendOptions::default())
                .await
                .unwrap();
        }
        report("append with the search index (mean)", ms(t0), 100);
    });
    drop(s);
    let size = std::fs::metadata(db.store().database_path())
        .map(|m| m.len())
        .unwrap_or(0);
    drop(db);
    println!(
        "   db file size: {:.1} MB (before WAL checkpoint)",
        size as f64 / 1e6
    );

    concurrency();
}

fn ms(t0: Instant) -> f64 {
    t0.elapsed().as_secs_f64() * 1000.0
}

/// Appends/s with 1, 8 and 32 concurrent appenders, durable: each on its own session (many
/// agents), then all on one session (one busy conversation); with the latency of single appends.
/// Then 8 and 32 appenders on their own sessions without a pause for three seconds, where the
/// latency's tail shows.
fn concurrency() {
    for shared_session in [false, true] {
        let mut single = 0.0;
        for appenders in [1usize, 8, 32] {
            let target = if shared_session {
                "one shared session"
            } else {
                "own sessions"
            };
            let run = appenders_run(appenders, shared_session, Until::Appends(4000));
            if appenders == 1 {
                single = run.rate;
            }
            println!(
                "appends/s with {appenders:>2} concurrent appenders ({target}) {:>10.0} /s  ({:.1}x one appender, {})",
                run.rate,
                run.rate / single,
                run.summary()
            );
        }
    }
    for appenders in [8usize, 32] {
        let run = appenders_run(appenders, false, Until::Elapsed(Duration::from_secs(3)));
        println!(
            "3 s of non-stop appends, {appenders:>2} appenders (own sessions) {:>10.0} /s  ({})",
            run.rate,
            run.summary()
        );
    }
}

/// When each appender of [`appenders_run`] stops.
#[derive(Clone, Copy)]
enum Until {
    /// This many appends spread over the appenders.
    Appends(usize),
    /// Once this much time has passed since the start.
    Elapsed(Duration),
}

struct AppendersRun {
    rate: f64,
    /// Latency of every append in ms, ascending.
    latencies: Vec<f64>,
    appends_per_commit: f64,
}

impl AppendersRun {
    fn summary(&self) -> String {
        let at = |q: f64| self.latencies[((self.latencies.len() - 1) as f64 * q) as usize];
        format!(
            "{:.1} appends per commit; latency ms p50 {:.2}, p99 {:.2}, p99.9 {:.2}, max {:.1}",
            self.appends_per_commit,
            at(0.5),
            at(0.99),
            at(0.999),
            at(1.0)
        )
    }
}

/// Durable appends from `appenders` threads in a new store, each on its own session or all on
/// one.
fn appenders_run(appenders: usize, shared_session: bool, until: Until) -> AppendersRun {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::new(SqliteStore::open_with(dir.path(), config()).unwrap());
    let t0 = Instant::now();
    let threads: Vec<_> = (0..appenders)
        .map(|a| {
            let name = if shared_session {
                "shared".to_owned()
            } else {
                format!("agent-{a}")
            };
            let s = db.session(&name).unwrap();
            std::thread::spawn(move || {
                // Another stream of texts per appender, without the needle.
                let mut texts = Texts {
                    seed: 42 + a as u64,
                    n: usize::MAX,
                };
                let more = |i: usize| match until {
                    Until::Appends(total) => i < total / appenders,
                    Until::Elapsed(limit) => t0.elapsed() < limit,
                };
                let mut latencies = Vec::new();
                for i in (0..).take_while(|&i| more(i)) {
                    let message = Message::text("user", texts.next(i)).with_id(format!("a{a}-{i}"));
                    let started = Instant::now();
                    block_on(s.append(message, AppendOptions::default())).unwrap();
                    latencies.push(started.elapsed().as_secs_f64() * 1000.0);
                }
                latencies
            })
        })
        .collect();
    let mut latencies: Vec<f64> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    let rate = latencies.len() as f64 / t0.elapsed().as_secs_f64();
    latencies.sort_by(f64::total_cmp);
    let stats = db.store().write_stats();
    let commits = stats.commits.load(std::sync::atomic::Ordering::Relaxed);
    let requests = stats.requests.load(std::sync::atomic::Ordering::Relaxed);
    AppendersRun {
        rate,
        latencies,
        appends_per_commit: requests as f64 / commits.max(1) as f64,
    }
}
