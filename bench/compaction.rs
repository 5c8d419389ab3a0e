//! sessiondb auto-compaction benchmark: does the check after each append cost more in a long
//! session than in a short one? Appends to sessions of 100 and 10,000 messages, without a
//! threshold, with `compactAfter` set (checked on every append, never exceeded) and with
//! `compactAfter` on a session that already has a compaction (the overlaid estimate), durably.
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

/// Median and p99 of single appends, in milliseconds.
fn appends(session: &Session<SqliteStore>) -> (f64, f64) {
    let mut times: Vec<f64> = (0..APPENDS)
        .map(|i| {
            let message = Message::text("user", format!("appended {i} {}", "x ".repeat(80)));
            let started = Instant::now();
            block_on(session.append(message, AppendOptions::default())).unwrap();
            started.elapsed().as_secs_f64() * 1000.0
        })
        .collect();
    times.sort_by(f64::total_cmp);
    (times[APPENDS / 2], times[APPENDS * 99 / 100])
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::new(SqliteStore::open(dir.path()).unwrap());
    println!(
        "--- sessiondb auto-compaction check (SQLite file, synchronous=FULL), {APPENDS} appends each"
    );
    let never = json!({"compactAfter": 1_000_000_000_000u64});
    for (label, threshold, compacted) in [
        ("no compactAfter", false, false),
        ("compactAfter set, never exceeded", true, false),
        ("compactAfter set, session has a compaction", true, true),
    ] {
        let mut medians = Vec::new();
        for size in [100, 10_000] {
            let session = db.session(&format!("{label}-{size}")).unwrap();
            fill(&session, size);
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
            let (median, p99) = appends(&session);
            println!("{label:<44} {size:>6} messages: median {median:.3} ms, p99 {p99:.3} ms");
            medians.push(median);
        }
        println!("{label:<44} 10,000 / 100 = {:.2}×", medians[1] / medians[0]);
    }
}
