//! sessiondb conversation-API benchmark: page reads at the end of a 10,000-message conversation
//! and conversation listings across 100,000 conversations (10,000 users with 10 each), on the
//! embedded SQLite store.
//!
//! `cargo run --release -p sessiondb-bench --bin sessiondb-conversations-bench [-- CONVERSATIONS]`
//! prints the median and p99 of each read, timed one call at a time.
#![forbid(unsafe_code)]

use std::time::Instant;

use sessiondb::{
    AppendOptions, ConversationLimits, Conversations, Db, Message, NewMessage, PageRequest,
    SqliteStore,
};

const MESSAGES: usize = 10_000;
const USERS: usize = 10_000;
const RUNS: usize = 2_000;

fn text(i: usize) -> String {
    format!("message {i} {}", "lorem ipsum dolor sit amet ".repeat(7))
}

/// Median and p99 of `RUNS` timed calls, in milliseconds.
async fn measure<F, Fut>(label: &str, mut call: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    for _ in 0..RUNS / 10 {
        call().await;
    }
    let mut times: Vec<f64> = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let started = Instant::now();
        call().await;
        times.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    times.sort_by(f64::total_cmp);
    let median = times[RUNS / 2];
    let p99 = times[RUNS * 99 / 100];
    let verdict = if median <= 1.0 { "≤ 1 ms" } else { "> 1 ms" };
    println!("{label:<64} median {median:>7.3} ms   p99 {p99:>7.3} ms   {verdict}");
}

fn page(limit: usize, descending: bool, after: Option<String>) -> PageRequest {
    PageRequest {
        limit: Some(limit),
        descending,
        after,
        before: None,
    }
}

async fn fill_long(api: &Conversations<SqliteStore>) -> Vec<String> {
    let session = api.session("long").unwrap();
    for start in (0..MESSAGES).step_by(1_000) {
        let batch = (start..start + 1_000)
            .map(|i| {
                let role = if i % 2 == 0 { "user" } else { "assistant" };
                Message::new(role)
                    .with_content(text(i).into())
                    .with_id(format!("m{i}"))
            })
            .collect();
        session
            .append_all(batch, AppendOptions::default())
            .await
            .unwrap();
    }
    (0..MESSAGES).map(|i| format!("m{i}")).collect()
}

/// `count` conversations of one message each, 32 appends in flight so commits group.
async fn fill_many(api: &Conversations<SqliteStore>, count: usize) {
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    let workers = 32;
    for w in 0..workers {
        let api = api.clone();
        tasks.spawn(async move {
            for i in (w..count).step_by(workers) {
                let message = NewMessage {
                    user_id: Some(format!("user-{}", i % USERS)),
                    ..NewMessage::new("user", text(i))
                };
                api.append_message(&format!("conv-{i:06}"), message)
                    .await
                    .unwrap();
            }
        });
    }
    tasks.join_all().await;
    println!(
        "created {count} conversations in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    let conversations: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(100_000);
    let dir = tempfile::tempdir().unwrap();
    let db = Db::new(SqliteStore::open(dir.path()).unwrap());
    let api = db.conversations("", ConversationLimits::default()).unwrap();
    println!("--- sessiondb conversation API (SQLite file)");
    let ids = fill_long(&api).await;
    fill_many(&api, conversations).await;

    measure(
        "get_messages(limit=50, desc) from the end of 10,000",
        || async {
            let p = api
                .get_messages("long", &page(50, true, None))
                .await
                .unwrap();
            assert_eq!(p.items.len(), 50);
        },
    )
    .await;
    let before_last_50 = ids[MESSAGES - 51].clone();
    measure(
        "get_messages(limit=50, asc, after=m9949): the last 50 by cursor",
        || async {
            let request = page(50, false, Some(before_last_50.clone()));
            let p = api.get_messages("long", &request).await.unwrap();
            assert_eq!(p.items.len(), 50);
        },
    )
    .await;
    let middle = ids[MESSAGES / 2].clone();
    measure(
        "get_messages(limit=50, desc, after=m5000): mid-conversation",
        || async {
            let request = page(50, true, Some(middle.clone()));
            let p = api.get_messages("long", &request).await.unwrap();
            assert_eq!(p.items.len(), 50);
        },
    )
    .await;
    measure(
        &format!("list_conversations(limit=20) across {conversations}"),
        || async {
            let p = api
                .list_conversations(&page(20, true, None), None)
                .await
                .unwrap();
            assert_eq!(p.items.len(), 20);
        },
    )
    .await;
    // A cursor half-way down the listing.
    let mut cursor = None;
    for _ in 0..conversations / 2 / 100 {
        cursor = api
            .list_conversations(&page(100, true, cursor), None)
            .await
            .unwrap()
            .next_cursor;
    }
    measure(
        "list_conversations(limit=20) half-way down, by cursor",
        || async {
            let p = api
                .list_conversations(&page(20, true, cursor.clone()), None)
                .await
                .unwrap();
            assert_eq!(p.items.len(), 20);
        },
    )
    .await;
    measure(
        &format!("list_conversations(limit=20, userId) among {USERS} users"),
        || async {
            let p = api
                .list_conversations(&page(20, true, None), Some("user-4321"))
                .await
                .unwrap();
            assert!(!p.items.is_empty());
        },
    )
    .await;
}
