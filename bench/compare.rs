//! sessiondb's side of the peer comparison (`bench/compare/run.py`): the shared workload through
//! the library or through the HTTP server, printed as one JSON object per line.
//!
//! `sessiondb-compare lib|http N` — N messages of ~200 characters appended one at a time
//! (durable: `synchronous=FULL`), then the reads, search, branch, compaction, a cold reopen and
//! concurrent appenders. Texts come from `texts.rs`, which every driver implements alike.
//!
//! `sessiondb-compare floor N` — the least a SQLite commit costs on this machine without fsync:
//! bare statements on the same SQLite build, no store around them (see [`floor`]).
#![forbid(unsafe_code)]

mod texts;

use std::future::Future;
use std::sync::atomic::Ordering;
use std::time::Instant;
use texts::{NEEDLE, Texts};

use futures::StreamExt;
use serde_json::{Value, json};
use sessiondb::{
    AppendOptions, Db, HistoryOptions, Message, Parent, SqliteConfig, SqliteStore, Synchronous,
};
use sessiondb_server::{App, Limits, Metrics, ServerConfig};

const LAST_READS: usize = 200;
const WHOLE_READS: usize = 5;
const SEARCHES: usize = 50;
const BRANCHES: usize = 20;
const REOPENS: usize = 3;
/// Appends shared by the writers of a concurrency level.
const CONCURRENT_APPENDS: usize = 4000;

fn message(i: usize, text: &str) -> Value {
    let role = if i.is_multiple_of(2) {
        "user"
    } else {
        "assistant"
    };
    json!({"id": format!("m{i}"), "role": role, "parts": [{"type": "text", "text": text}]})
}

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

fn emit(op: &str, ms: f64) {
    println!("{}", json!({"op": op, "ms": ms}));
}

/// Turns `perf record --control fifo:…` on or off when `PERF_CONTROL` names its fifo, so a
/// profile of `PROFILE=branch` holds the branch appends alone.
fn profiler(command: &str) {
    if let Ok(fifo) = std::env::var("PERF_CONTROL") {
        std::fs::write(fifo, format!("{command}\n")).unwrap();
    }
}

async fn time<T>(f: impl Future<Output = T>) -> (f64, T) {
    let started = Instant::now();
    let value = f.await;
    (started.elapsed().as_secs_f64() * 1000.0, value)
}

async fn timed_median<T, F: Future<Output = T>>(times: usize, mut f: impl FnMut() -> F) -> f64 {
    let mut samples = Vec::with_capacity(times);
    for _ in 0..times {
        samples.push(time(f()).await.0);
    }
    median(samples)
}

fn dir_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok()?.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum()
}

/// `SYNC=normal` runs without the commit fsync (to compare with stores that never fsync).
fn synchronous() -> Synchronous {
    match std::env::var("SYNC").as_deref() {
        Ok("normal") => Synchronous::Normal,
        _ => Synchronous::Full,
    }
}

fn durability() -> &'static str {
    match synchronous() {
        Synchronous::Full => {
            "SQLite WAL, synchronous=FULL: acknowledged after the fsync (concurrent commits share one)"
        }
        Synchronous::Normal => {
            "SQLite WAL, synchronous=NORMAL: no fsync (survives a crash, not power loss)"
        }
    }
}

fn open(dir: &std::path::Path) -> Db<SqliteStore> {
    let config = SqliteConfig {
        synchronous: synchronous(),
        ..SqliteConfig::default()
    };
    Db::new(SqliteStore::open_with(dir, config).unwrap())
}

/// Nanoseconds each thread of this process has run, summed by thread name (Linux's
/// `/proc/self/task/*/schedstat`; empty elsewhere), to tell where a round's CPU went.
fn cpu_by_thread() -> std::collections::BTreeMap<String, u64> {
    let mut by_name = std::collections::BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return by_name;
    };
    for task in tasks.filter_map(Result::ok).map(|t| t.path()) {
        let read = |file: &str| std::fs::read_to_string(task.join(file)).unwrap_or_default();
        let nanos = read("schedstat")
            .split_whitespace()
            .next()
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0);
        *by_name.entry(read("comm").trim().to_owned()).or_insert(0) += nanos;
    }
    by_name
}

async fn library(n: usize, writers: &[usize]) {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path());
    let profiled_writers = match std::env::var("PROFILE").as_deref() {
        Ok("append") => Some(1),
        Ok("concurrent8") => Some(8),
        Ok("concurrent") => Some(32),
        _ => None,
    };
    if let Some(writers) = profiled_writers {
        // Each round also reports how busy the writer was and what it spent per append (stderr),
        // which tells a writer-bound round from one that waits on syncs and wake-ups.
        let stats = db.store().write_stats();
        let counters = || {
            [&stats.busy_nanos, &stats.commits, &stats.requests]
                .map(|counter| counter.load(Ordering::Relaxed) as f64)
        };
        for _ in 0..10 {
            let cpu_before = cpu_by_thread();
            let (before, started) = (counters(), Instant::now());
            emit("appends", concurrent_library(&db, writers).await);
            let wall = started.elapsed().as_nanos() as f64;
            let after = counters();
            let [busy, commits, requests] = [0, 1, 2].map(|i| after[i] - before[i]);
            eprintln!(
                "writer busy {:.0}% of the round, {:.1} appends per commit, {:.1} µs per append",
                busy / wall * 100.0,
                requests / commits,
                busy / requests / 1000.0
            );
            let spent: Vec<String> = cpu_by_thread()
                .into_iter()
                .map(|(thread, nanos)| {
                    let before = cpu_before.get(&thread).copied().unwrap_or(0);
                    let micros = nanos.saturating_sub(before) as f64 / requests / 1000.0;
                    format!("{thread} {micros:.1}")
                })
                .collect();
            eprintln!("  CPU µs per append by thread: {}", spent.join(", "));
        }
        return;
    }
    let chat = db.session("bench").unwrap();
    let mut texts = Texts::new(n);
    let mut appends = Vec::with_capacity(n);
    for i in 0..n {
        let m = Message::from_value(message(i, &texts.next(i))).unwrap();
        appends.push(time(chat.append(m, AppendOptions::default())).await.0);
    }
    emit("append", median(appends));
    let newest = || HistoryOptions {
        newest_first: true,
        ..Default::default()
    };
    let last50 = || async {
        let page: Vec<_> = chat.history(newest()).take(50).collect().await;
        assert_eq!(page.len(), 50);
    };
    emit("last50", timed_median(LAST_READS, last50).await);
    let whole = || async {
        let all = chat.full_history(HistoryOptions::default()).await.unwrap();
        assert!(all.len() >= n / 8);
    };
    emit("whole", timed_median(WHOLE_READS, whole).await);
    // `PROFILE=last50|whole|search_first|branch|reopen|append|concurrent8|concurrent` repeats one operation for a profiler (`perf record -g`).
    match std::env::var("PROFILE").as_deref() {
        Ok("last50") => drop(timed_median(20_000, last50).await),
        Ok("whole") => drop(timed_median(300, whole).await),
        Ok("search_first") => {
            drop((chat, db));
            for _ in 0..20 {
                emit("search_first", first_search_of_a_copy(dir.path()).await);
            }
            return;
        }
        _ => {}
    }
    let (first, hits) = time(chat.search(NEEDLE, 10)).await;
    assert_eq!(hits.unwrap().len(), 1);
    emit("search_first", first);
    emit(
        "search",
        timed_median(SEARCHES, || chat.search(NEEDLE, 10)).await,
    );
    let mut branches = Vec::new();
    let profiled_branches = match std::env::var("PROFILE").as_deref() {
        Ok("branch") => 3000,
        _ => 0,
    };
    profiler("enable");
    for k in 0..BRANCHES + profiled_branches {
        let parent = Parent::Id(format!("m{}", n / 4 + k % BRANCHES));
        let fork = Message::text("user", "forked question").with_id(format!("fork{k}"));
        let options = AppendOptions {
            parent,
            ..Default::default()
        };
        branches.push(time(chat.append(fork, options)).await.0);
    }
    profiler("disable");
    branches.truncate(BRANCHES);
    emit("branch", median(branches));
    emit("branch_read", timed_median(WHOLE_READS, whole).await);
    let overlay = chat.add_compaction(
        "summary of the early turns".into(),
        "m1".into(),
        format!("m{}", n / 8),
    );
    emit("compact", time(overlay).await.0);
    emit("compact_read", timed_median(WHOLE_READS, whole).await);
    drop((chat, db));
    let mut reopens = Vec::new();
    let times = if std::env::var("PROFILE").as_deref() == Ok("reopen") {
        300
    } else {
        REOPENS
    };
    for _ in 0..times {
        // Closing (which checkpoints the WAL) is left out, as it is for the peers.
        let (ms, db) = time(async {
            let db = open(dir.path());
            let chat = db.session("bench").unwrap();
            let page: Vec<_> = chat.history(newest()).take(50).collect().await;
            assert_eq!(page.len(), 50);
            db
        })
        .await;
        reopens.push(ms);
        drop(db);
    }
    emit("reopen_last50", median(reopens));
    report_size(dir);
    // Concurrent writers get a store of their own, so the size above is the conversation's.
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path());
    for w in writers {
        emit(&format!("concurrent{w}"), concurrent_library(&db, *w).await);
    }
}

/// Milliseconds of the first search (which builds the full-text index) in a copy of the closed
/// store in `dir`, so a profiler can see the build many times.
async fn first_search_of_a_copy(dir: &std::path::Path) -> f64 {
    let copy = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            std::fs::copy(&path, copy.path().join(path.file_name().unwrap())).unwrap();
        }
    }
    let db = open(copy.path());
    let chat = db.session("bench").unwrap();
    profiler("enable");
    let (ms, hits) = time(chat.search(NEEDLE, 10)).await;
    profiler("disable");
    assert_eq!(hits.unwrap().len(), 1);
    ms
}

/// Prints the data directory's size (the store is closed, so the WAL is checkpointed away);
/// `KEEP=1` keeps the directory for inspection.
fn report_size(dir: tempfile::TempDir) {
    println!(
        "{}",
        json!({"size_bytes": dir_bytes(dir.path()), "durability": durability()})
    );
    if std::env::var_os("KEEP").is_some() {
        eprintln!("kept {}", dir.keep().display());
    }
}

/// Milliseconds per append (wall time / appends) with `writers` tasks on their own sessions.
async fn concurrent_library(db: &Db<SqliteStore>, writers: usize) -> f64 {
    let per_writer = CONCURRENT_APPENDS / writers;
    let started = Instant::now();
    let tasks: Vec<_> = (0..writers)
        .map(|w| {
            let session = db.session(&format!("c{writers}-{w}")).unwrap();
            tokio::spawn(async move {
                for i in 0..per_writer {
                    let m = Message::text("user", format!("message {i} from writer {w}"));
                    session.append(m, AppendOptions::default()).await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    started.elapsed().as_secs_f64() * 1000.0 / (per_writer * writers) as f64
}

/// Medians of `n` commits of bare SQL on the SQLite build sessiondb uses, in WAL mode without
/// fsync (`synchronous=NORMAL`) and with the file locked for the process (as sessiondb's VFS
/// does): `floor_row` inserts one ~400-byte row into a rowid table, the cheapest commit there
/// is; `floor_session` inserts a row keyed by session and position and updates that session's
/// counter, the least a store of sessions writes per append (no id index, no listing, no
/// validation). A store that commits each append cannot go below these; Pi's append without
/// fsync is set against them.
fn floor(n: usize) {
    let dir = tempfile::tempdir().unwrap();
    let conn = rusqlite::Connection::open(dir.path().join("floor.db")).unwrap();
    conn.execute_batch(
        "PRAGMA journal_mode = WAL;
         PRAGMA synchronous = NORMAL;
         PRAGMA locking_mode = EXCLUSIVE;
         CREATE TABLE rows (body TEXT NOT NULL);
         CREATE TABLE messages (
             session TEXT NOT NULL, seq INTEGER NOT NULL, body TEXT NOT NULL,
             PRIMARY KEY (session, seq)
         ) WITHOUT ROWID;
         CREATE TABLE sessions (id TEXT PRIMARY KEY, next_seq INTEGER NOT NULL) WITHOUT ROWID;
         INSERT INTO sessions VALUES ('floor', 0);",
    )
    .unwrap();
    let body = "x".repeat(400);
    let run = |sql: &str, params: &[&dyn rusqlite::ToSql]| {
        conn.prepare_cached(sql).unwrap().execute(params).unwrap();
    };
    let commits = |commit: &dyn Fn(i64)| {
        median(
            (0..n as i64)
                .map(|i| {
                    let started = Instant::now();
                    commit(i);
                    started.elapsed().as_secs_f64() * 1000.0
                })
                .collect(),
        )
    };
    emit(
        "floor_row",
        commits(&|_| run("INSERT INTO rows (body) VALUES (?1)", &[&body])),
    );
    emit(
        "floor_session",
        commits(&|i| {
            run("BEGIN", &[]);
            run(
                "INSERT INTO messages VALUES ('floor', ?1, ?2)",
                &[&i, &body],
            );
            run(
                "UPDATE sessions SET next_seq = ?1 WHERE id = 'floor'",
                &[&(i + 1)],
            );
            run("COMMIT", &[]);
        }),
    );
    println!(
        "{}",
        json!({"size_bytes": dir_bytes(dir.path()), "durability": "SQLite WAL, synchronous=NORMAL: no fsync"})
    );
}

struct Server {
    base: String,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

async fn start_server(dir: &std::path::Path) -> Server {
    let config = ServerConfig {
        limits: Limits {
            max_messages_per_session: u64::MAX,
            ..Limits::default()
        },
        ..ServerConfig::default()
    };
    let app = App::new(open(dir), config, Metrics::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(sessiondb_server::serve(listener, app, async move {
        let _ = stopped.await;
    }));
    Server { base, stop, task }
}

async fn expect(response: reqwest::Response, status: u16) {
    assert_eq!(response.status().as_u16(), status);
    response.bytes().await.unwrap();
}

async fn http(n: usize, writers: &[usize]) {
    let dir = tempfile::tempdir().unwrap();
    let server = start_server(dir.path()).await;
    let base = server.base.clone();
    let client = reqwest::Client::new();
    let messages = format!("{base}/v1/sessions/bench/messages");
    let mut texts = Texts::new(n);
    let mut appends = Vec::with_capacity(n);
    for i in 0..n {
        let body = message(i, &texts.next(i));
        let request = client.post(&messages).json(&body).send();
        appends.push(
            time(async { expect(request.await.unwrap(), 201).await })
                .await
                .0,
        );
    }
    emit("append", median(appends));
    let last50 = || async {
        let page = client.get(format!("{messages}?limit=50&order=desc")).send();
        expect(page.await.unwrap(), 200).await
    };
    emit("last50", timed_median(LAST_READS, last50).await);
    let history = format!("{base}/v1/sessions/bench/history");
    let whole = || async { expect(client.get(&history).send().await.unwrap(), 200).await };
    emit("whole", timed_median(WHOLE_READS, whole).await);
    let search = || async {
        let hits = client
            .get(format!("{base}/v1/sessions/bench/search?q={NEEDLE}"))
            .send();
        expect(hits.await.unwrap(), 200).await
    };
    emit("search_first", time(search()).await.0);
    emit("search", timed_median(SEARCHES, search).await);
    let mut branches = Vec::new();
    for k in 0..BRANCHES {
        let url = format!("{messages}?parent=m{}", n / 4 + k);
        let body = json!({"id": format!("fork{k}"), "role": "user", "content": "forked question"});
        let request = client.post(&url).json(&body).send();
        branches.push(
            time(async { expect(request.await.unwrap(), 201).await })
                .await
                .0,
        );
    }
    emit("branch", median(branches));
    emit("branch_read", timed_median(WHOLE_READS, whole).await);
    let overlay = json!({"summary": "summary of the early turns", "fromMessageId": "m1",
                         "toMessageId": format!("m{}", n / 8)});
    let compact = client
        .post(format!("{base}/v1/sessions/bench/compactions"))
        .json(&overlay)
        .send();
    emit(
        "compact",
        time(async { expect(compact.await.unwrap(), 201).await })
            .await
            .0,
    );
    emit("compact_read", timed_median(WHOLE_READS, whole).await);
    drop(client);
    server.stop.send(()).unwrap();
    server.task.await.unwrap().unwrap();
    let mut reopens = Vec::new();
    for _ in 0..REOPENS {
        wait_until_closed(dir.path()).await;
        let (ms, server) = time(async {
            let server = start_server(dir.path()).await;
            let url = format!(
                "{}/v1/sessions/bench/messages?limit=50&order=desc",
                server.base
            );
            expect(reqwest::get(url).await.unwrap(), 200).await;
            server
        })
        .await;
        reopens.push(ms);
        server.stop.send(()).unwrap();
        server.task.await.unwrap().unwrap();
    }
    emit("reopen_last50", median(reopens));
    report_size(dir);
    let dir = tempfile::tempdir().unwrap();
    let server = start_server(dir.path()).await;
    for w in writers {
        emit(
            &format!("concurrent{w}"),
            concurrent_http(&server.base, *w).await,
        );
    }
    server.stop.send(()).unwrap();
    server.task.await.unwrap().unwrap();
}

/// Connection tasks of a stopped server may hold the store a moment longer: wait (untimed)
/// until it can be opened.
async fn wait_until_closed(dir: &std::path::Path) {
    while SqliteStore::open(dir).is_err() {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// Milliseconds per append with `writers` keep-alive clients on their own sessions.
async fn concurrent_http(base: &str, writers: usize) -> f64 {
    let per_writer = CONCURRENT_APPENDS / writers;
    let started = Instant::now();
    let tasks: Vec<_> = (0..writers)
        .map(|w| {
            let url = format!("{base}/v1/sessions/c{writers}-{w}/messages");
            tokio::spawn(async move {
                let client = reqwest::Client::new();
                for i in 0..per_writer {
                    let body =
                        json!({"role": "user", "content": format!("message {i} from writer {w}")});
                    expect(client.post(&url).json(&body).send().await.unwrap(), 201).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    started.elapsed().as_secs_f64() * 1000.0 / (per_writer * writers) as f64
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: sessiondb-compare lib|http|floor N [WRITERS,…]";
    let mode = args.get(1).expect(usage).clone();
    let n: usize = args.get(2).and_then(|a| a.parse().ok()).expect(usage);
    let writers: Vec<usize> = args
        .get(3)
        .map(|w| w.split(',').filter_map(|x| x.parse().ok()).collect())
        .unwrap_or_else(|| vec![8, 32]);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(std::thread::available_parallelism().map_or(4, |n| n.get() * 4))
        .enable_all()
        .build()
        .unwrap();
    let started = Instant::now();
    match mode.as_str() {
        "lib" => runtime.block_on(library(n, &writers)),
        "http" => runtime.block_on(http(n, &writers)),
        "floor" => floor(n),
        _ => panic!("{usage}"),
    }
    eprintln!(
        "sessiondb {mode} N={n}: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}
