//! sessiondb auto-compaction benchmark: does the check after each append cost more in a long
//! session than in a short one? Appends to sessions of 100 and 10,000 messages, without a
//! threshold, with `compactAfter` set (checked on every append, never exceeded) and with
//! `compactAfter` on a session that already has a compaction (the overlaid estimate), durably.
//! Then the reads that show a compacted session's overlaid size: `info` (its token estimate) and
//! `recent_history` (total bytes and the fitting suffix), at 100 and 10,000 messages.
//!
//! `cargo run --release -p sessiondb-bench --bin sessiondb-compaction-bench`
#![forbid(unsafe_code)]

use std::time::Instant;

use futures::executor::block_on;
use serde_json::json;
use sessiondb::{AppendOptions, Db, Message, Session, SessionPatch, SqliteStore};

const APPENDS: usize = 1_000;

fn fill(session: &Session<SqliteStore>, count: usize) {
    for start in (0..count).step_by(1_000) {
        let batch = (start..(start + 1_000).min(count))
            .map(|i| {
                Message::text("user", format!("message {i} {}", "lorem ipsum ".repeat(15)))
                    .with_id(format!("m{i}"))
            })
            .collect();
        block_on(session.append_all(batch, AppendOptions::default())).unwrap();
    }
}

/// Milliseconds of `calls` runs of `op(i, session)` on each session, sorted, per session. The
/// sessions take turns, so the machine's slow and fast phases hit them alike.
fn taking_turns<'a>(
    sessions: impl Iterator<Item = &'a Session<SqliteStore>> + Clone,
    calls: usize,
    op: impl Fn(usize, &Session<SqliteStore>),
) -> Vec<Vec<f64>> {
    let mut times: Vec<Vec<f64>> = vec![Vec::with_capacity(calls); sessions.clone().count()];
    for i in 0..calls {
        for (session, times) in sessions.clone().zip(&mut times) {
            let started = Instant::now();
            op(i, session);
            times.push(started.elapsed().as_secs_f64() * 1000.0);
        }
    }
    for t in &mut times {
        t.sort_by(f64::total_cmp);
    }
    times
}

/// Median and p99 of single appends to each session, in milliseconds.
fn appends(sessions: &[Session<SqliteStore>]) -> Vec<(f64, f64)> {
    taking_turns(sessions.iter(), APPENDS, |i, session| {
        let message = Message::text("user", format!("appended {i} {}", "x ".repeat(80)));
        block_on(session.append(message, AppendOptions::default())).unwrap();
    })
    .into_iter()
    .map(|t| (t[APPENDS / 2], t[APPENDS * 99 / 100]))
    .collect()
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::new(SqliteStore::open(dir.path()).unwrap());
    println!(
        "--- sessiondb auto-compaction check (SQLite file, synchronous=FULL), {APPENDS} appends each, taking turns"
    );
    let never = json!({"compactAfter": 1_000_000_000_000u64});
    for (label, threshold, compacted) in [
        ("no compactAfter", false, false),
        ("compactAfter set, never exceeded", true, false),
        ("compactAfter set, session has a compaction", true, true),
    ] {
        let sizes = [100, 10_000];
        let sessions: Vec<Session<SqliteStore>> = sizes
            .iter()
            .map(|size| {
                let session = db.session(&format!("{label}-{size}")).unwrap();
                fill(&session, *size);
                if compacted {
                    block_on(session.add_compaction("summary".into(), "m3".into(), "m50".into()))
                        .unwrap();
                }
                if threshold {
                    let patch = SessionPatch {
                        settings: Some(never.as_object().unwrap().clone()),
                        ..Default::default()
                    };
                    block_on(session.patch(patch)).unwrap();
                }
                session
            })
            .collect();
        let results = appends(&sessions);
        for (size, (median, p99)) in sizes.iter().zip(&results) {
            println!("{label:<44} {size:>6} messages: median {median:.3} ms, p99 {p99:.3} ms");
        }
        let medians: Vec<f64> = results.iter().map(|(median, _)| *median).collect();
        println!("{label:<44} 10,000 / 100 = {:.2}×", medians[1] / medians[0]);
    }
    compacted_reads(&db);
}

const READS: usize = 200;

/// Median milliseconds of `info` and of `recent_history(20 KB)` on compacted sessions of 100 and
/// 10,000 messages, the sessions taking turns.
fn compacted_reads(db: &Db<SqliteStore>) {
    println!("--- reads of a compacted session, {READS} each, taking turns");
    let sessions: Vec<(usize, Session<SqliteStore>)> = [100, 10_000]
        .into_iter()
        .map(|size| {
            let session = db.session(&format!("compacted-reads-{size}")).unwrap();
            fill(&session, size);
            block_on(session.add_compaction("summary".into(), "m3".into(), "m50".into())).unwrap();
            (size, session)
        })
        .collect();
    let time = |read: &dyn Fn(&Session<SqliteStore>)| -> Vec<f64> {
        taking_turns(sessions.iter().map(|(_, s)| s), READS, |_, s| read(s))
            .into_iter()
            .map(|t| t[READS / 2])
            .collect()
    };
    let info = time(&|s| drop(block_on(s.info()).unwrap().unwrap()));
    let recent = time(&|s| drop(block_on(s.recent_history(20_000, None)).unwrap()));
    for (label, medians) in [("info", info), ("recent_history(20 KB)", recent)] {
        for ((size, _), median) in sessions.iter().zip(&medians) {
            println!("{label:<44} {size:>6} messages: median {median:.3} ms");
        }
        println!("{label:<44} 10,000 / 100 = {:.2}×", medians[1] / medians[0]);
    }
}
