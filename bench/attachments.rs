//! sessiondb attachments benchmark: 200 messages each carrying a 200 KB image, stored as
//! attachments (content-addressed, outside the message rows) and stored inline (the same JSON
//! with the media declared `text/plain`, which stays in the row). Reports append time, read
//! time of the whole history and database size for each, with distinct images and with one
//! image repeated in every message.
//!
//! `cargo run --release -p sessiondb-bench --bin sessiondb-attachments-bench`
#![forbid(unsafe_code)]

use std::path::Path;
use std::time::Instant;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use futures::executor::block_on;
use sessiondb::{AppendOptions, Db, HistoryOptions, Message, SqliteStore};

const MESSAGES: usize = 200;
const IMAGE_BYTES: usize = 200_000;

fn image(seed: u32) -> Vec<u8> {
    sessiondb_testkit::cases::attachments::bytes(IMAGE_BYTES, seed as u8)
}

fn message(i: usize, media_type: &str, encoded: &str) -> Message {
    Message::from_value(serde_json::json!({"id": format!("m{i}"), "role": "user", "parts": [
        {"type": "text", "text": format!("picture {i}")},
        {"type": "file", "mediaType": media_type, "url": format!("data:{media_type};base64,{encoded}")}
    ]}))
    .unwrap()
}

fn size_on_disk(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok()?.metadata().ok())
        .map(|m| m.len())
        .sum()
}

fn run(label: &str, media_type: &str, repeated: bool) {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::new(SqliteStore::open(dir.path()).unwrap());
    let s = db.session("s").unwrap();
    let shared = STANDARD.encode(image(1));
    let encoded: Vec<String> = (0..MESSAGES)
        .map(|i| {
            if repeated {
                shared.clone()
            } else {
                STANDARD.encode(image(i as u32 + 1))
            }
        })
        .collect();
    let started = Instant::now();
    for (i, e) in encoded.iter().enumerate() {
        block_on(s.append(message(i, media_type, e), AppendOptions::default())).unwrap();
    }
    let append_ms = started.elapsed().as_secs_f64() * 1000.0 / MESSAGES as f64;
    let mut reads: Vec<f64> = (0..5)
        .map(|_| {
            let started = Instant::now();
            let history = block_on(s.full_history(HistoryOptions::default())).unwrap();
            assert_eq!(history.len(), MESSAGES);
            started.elapsed().as_secs_f64() * 1000.0
        })
        .collect();
    reads.sort_by(f64::total_cmp);
    let pointers = s.with_attachment_pointers();
    let started = Instant::now();
    let history = block_on(pointers.full_history(HistoryOptions::default())).unwrap();
    let pointer_ms = started.elapsed().as_secs_f64() * 1000.0;
    let pointer_bytes: usize = history.iter().map(|m| m.json().len()).sum();
    // Sessions hold the store: all of them go, so the store closes and checkpoints its WAL.
    drop((pointers, s, db));
    println!(
        "{label:<44} append {append_ms:>6.2} ms   read all {:>7.1} ms   pointer-form read {pointer_ms:>6.1} ms ({:.0} KB)   on disk {:>6.1} MB",
        reads[2],
        pointer_bytes as f64 / 1024.0,
        size_on_disk(dir.path()) as f64 / 1_048_576.0
    );
}

fn main() {
    println!(
        "--- sessiondb attachments: {MESSAGES} messages with a {IMAGE_BYTES}-byte image each (SQLite file, synchronous=FULL)"
    );
    run("distinct images, as attachments", "image/png", false);
    run("distinct images, inline in the rows", "text/plain", false);
    run("one image repeated, as attachments", "image/png", true);
    run("one image repeated, inline in the rows", "text/plain", true);
}
