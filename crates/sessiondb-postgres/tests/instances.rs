//! Two stores (as two server instances would hold) on one database.

use sessiondb::{AppendOptions, Db, Message, Options, SessionPatch, StoreError};
use sessiondb_postgres::cluster::TempCluster;
use sessiondb_postgres::{BacklogLimits, PgConfig, PgStore};

fn instance(url: &str) -> Db<PgStore> {
    let mut options = Options::default();
    options.compaction.keep_recent_tokens = 1;
    Db::with_options(
        PgStore::connect_blocking(url, PgConfig::default()).unwrap(),
        options,
    )
}

async fn say(db: &Db<PgStore>, id: &str) {
    db.session("s")
        .unwrap()
        .append(
            Message::text("user", format!("turn {id} of a conversation")).with_id(id),
            AppendOptions::default(),
        )
        .await
        .unwrap();
}

/// A setting changed through one instance governs the next write through another, which had
/// already written to the session (and so read its settings) before.
#[test]
fn settings_changed_on_one_instance_apply_on_another() {
    let cluster = TempCluster::start()
        .unwrap_or_else(|e| panic!("cannot start PostgreSQL for the tests: {e}"));
    let (a, b) = (instance(&cluster.url()), instance(&cluster.url()));
    futures::executor::block_on(async {
        for i in 0..10 {
            say(&b, &format!("m{i}")).await;
        }
        let patch = SessionPatch {
            settings: Some(
                serde_json::json!({"compactAfter": 10})
                    .as_object()
                    .unwrap()
                    .clone(),
            ),
            ..SessionPatch::default()
        };
        a.session("s").unwrap().patch(patch).await.unwrap();
        say(&b, "m10").await;
        let compactions = b.session("s").unwrap().compactions().await.unwrap();
        assert_eq!(
            compactions.len(),
            1,
            "instance b compacted past the threshold set through a"
        );
    });
}

/// While the database is down, calls fail as `Unavailable` (not as a backend fault) and name
/// the reason; once it is back the same store writes and reads again, with nothing lost.
#[test]
fn a_database_outage_is_unavailable_and_passes() {
    let cluster = TempCluster::start()
        .unwrap_or_else(|e| panic!("cannot start PostgreSQL for the tests: {e}"));
    let db = instance(&cluster.url());
    futures::executor::block_on(async {
        say(&db, "before").await;
        cluster.halt().unwrap();
        let session = db.session("s").unwrap();
        let unavailable = |e: sessiondb::Error| match e {
            sessiondb::Error::Store(StoreError::Unavailable(reason)) => reason,
            other => panic!("expected Unavailable, got {other:?}"),
        };
        let write = session
            .append(Message::text("user", "lost"), AppendOptions::default())
            .await
            .unwrap_err();
        let reason = unavailable(write);
        assert!(
            reason.contains("Connection refused") || reason.contains("closed"),
            "{reason}"
        );
        unavailable(session.message("before").await.unwrap_err());

        cluster.resume().unwrap();
        say(&db, "after").await;
        let ids: Vec<String> = session
            .full_history(Default::default())
            .await
            .unwrap()
            .into_iter()
            .map(|m| m.id.to_string())
            .collect();
        assert_eq!(ids, ["before", "after"]);
    });
}

/// A subscriber of an instance that went away resumes on another from its last position: from
/// the events the new instance loaded from the table as it started, and from older ones the
/// table still keeps.
#[test]
fn a_started_instance_resumes_subscribers_from_the_table() {
    use futures::StreamExt;
    use sessiondb::{FeedFilter, FeedItem, SessionKey, Store, Subscription};
    let cluster = TempCluster::start()
        .unwrap_or_else(|e| panic!("cannot start PostgreSQL for the tests: {e}"));
    let gone = instance(&cluster.url());
    let mut seen = gone.subscribe(FeedFilter::All);
    let positions: Vec<u64> = futures::executor::block_on(async {
        let mut positions = Vec::new();
        for i in 0..5 {
            say(&gone, &format!("m{i}")).await;
            match seen.next().await {
                Some(FeedItem::Event(event)) => positions.push(event.position),
                other => panic!("{other:?}"),
            }
        }
        positions
    });
    drop((seen, gone));

    let config = PgConfig {
        feed_retain: 3,
        ..PgConfig::default()
    };
    let started = PgStore::connect_blocking(&cluster.url(), config).unwrap();
    let replayed = |resumed: Option<Subscription>| -> Option<Vec<u64>> {
        let mut resumed = resumed?;
        let events = std::iter::from_fn(|| match resumed.try_next() {
            Some(FeedItem::Event(event)) => Some(event.position),
            _ => None,
        });
        Some(events.collect())
    };
    let resume = |filter, position| {
        replayed(futures::executor::block_on(
            started.subscribe_after(filter, position),
        ))
    };
    // Older than the 3 it holds: the rest comes from the table.
    assert_eq!(
        resume(FeedFilter::All, positions[0]).unwrap(),
        positions[1..]
    );
    let elsewhere = FeedFilter::Session(SessionKey::new("", "other").unwrap());
    assert_eq!(resume(elsewhere, positions[0]), Some(Vec::new()));
    // What the table may send one subscriber is bounded, in events and in bytes.
    for (events, bytes, resumes) in [(4, 1 << 20, true), (3, 1 << 20, false), (4, 100, false)] {
        let config = PgConfig {
            feed_retain: 3,
            resume_backlog: BacklogLimits { events, bytes },
            ..PgConfig::default()
        };
        let limited = PgStore::connect_blocking(&cluster.url(), config).unwrap();
        let resumed = limited.subscribe_after(FeedFilter::All, positions[0]);
        let resumed = futures::executor::block_on(resumed);
        assert_eq!(resumed.is_some(), resumes, "{events} events, {bytes} bytes");
    }

    // With the table emptied, what it loaded as it started still resumes; older is refused,
    // so the subscriber knows to start over.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let (client, connection) = tokio_postgres::connect(&cluster.url(), tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        client.batch_execute("DELETE FROM feed").await.unwrap();
    });
    assert_eq!(
        resume(FeedFilter::All, positions[1]).unwrap(),
        positions[2..]
    );
    assert_eq!(resume(FeedFilter::All, positions[0]), None);
}

/// A compaction run on one instance is announced to the subscribers of another too, after the
/// writes that came before it there and around the compaction it stored.
#[test]
fn compaction_status_reaches_every_instance_in_order() {
    use futures::StreamExt;
    use sessiondb::{Change, CompactionPhase, FeedFilter, FeedItem};
    let cluster = TempCluster::start()
        .unwrap_or_else(|e| panic!("cannot start PostgreSQL for the tests: {e}"));
    let (a, b) = (instance(&cluster.url()), instance(&cluster.url()));
    let (mut watching, mut own) = (b.subscribe(FeedFilter::All), a.subscribe(FeedFilter::All));
    let name = |change: &Change| match change {
        Change::Status { status } if status.phase == CompactionPhase::Compacting => "compacting",
        Change::Status { .. } => "idle",
        other => other.name(),
    };
    let timer = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    timer.block_on(async {
        for i in 0..8 {
            say(&a, &format!("m{i}")).await;
        }
        let stored = a.session("s").unwrap().compact(None).await.unwrap();
        assert!(stored.is_some());
        let mut seen = Vec::new();
        let deadline = std::time::Duration::from_secs(10);
        while !seen.ends_with(&["idle"]) {
            let next = tokio::time::timeout(deadline, watching.next()).await;
            let Ok(Some(FeedItem::Event(event))) = next else {
                panic!("after {seen:?}: {next:?}");
            };
            seen.push(name(&event.change));
        }
        let appends = ["append"; 8];
        let expected = [&appends[..], &["compacting", "compact", "idle"]].concat();
        assert_eq!(seen, expected);
        // The announcing instance's subscribers got each announcement once, though it hears
        // its own notifications too.
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let own: Vec<_> = std::iter::from_fn(|| match own.try_next() {
            Some(FeedItem::Event(event)) => Some(name(&event.change)),
            _ => None,
        })
        .collect();
        assert_eq!(own, expected);
    });
}

/// An announcement made before a write reaches another instance's subscribers before that
/// write, however quickly the write follows it: the write waits until the announcement is
/// sent, and followers handle notifications in the order they committed.
#[test]
fn announcements_reach_other_instances_before_the_writes_after_them() {
    use futures::StreamExt;
    use sessiondb::{Change, CompactionPhase, CompactionStatus, FeedFilter, FeedItem, Store};
    let cluster = TempCluster::start()
        .unwrap_or_else(|e| panic!("cannot start PostgreSQL for the tests: {e}"));
    let (a, b) = (instance(&cluster.url()), instance(&cluster.url()));
    let mut watching = b.subscribe(FeedFilter::All);
    let key = a.session("s").unwrap().key().clone();
    let status = Change::Status {
        status: CompactionStatus {
            phase: CompactionPhase::Compacting,
            token_estimate: 1,
            token_threshold: None,
            compacted_tokens_before: None,
        },
    };
    let timer = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    timer.block_on(async {
        // Once b has heard of a write, its follower is listening.
        say(&a, "first").await;
        let heard = tokio::time::timeout(std::time::Duration::from_secs(10), watching.next());
        assert!(matches!(heard.await, Ok(Some(FeedItem::Event(_)))));
        for i in 0..40 {
            a.store().announce(&key, status.clone());
            say(&a, &format!("m{i}")).await;
        }
        let mut seen = Vec::new();
        while seen.len() < 80 {
            let deadline = std::time::Duration::from_secs(10);
            let next = tokio::time::timeout(deadline, watching.next()).await;
            let Ok(Some(FeedItem::Event(event))) = next else {
                panic!("after {seen:?}: {next:?}");
            };
            seen.push(event.change.name());
        }
        let expected = ["status", "append"].repeat(40);
        assert_eq!(seen, expected);
    });
}

/// A skill loaded through one instance (its result stored, as the agent does) is loaded on
/// another that had read the session's skills before, and one unloaded there is unloaded here.
#[test]
fn skills_loaded_on_one_instance_are_loaded_on_another() {
    use sessiondb::{BlockKind, BlockSpec};
    let cluster = TempCluster::start()
        .unwrap_or_else(|e| panic!("cannot start PostgreSQL for the tests: {e}"));
    let (a, b) = (instance(&cluster.url()), instance(&cluster.url()));
    futures::executor::block_on(async {
        let on_a = a.session("s").unwrap().context();
        let skills = BlockSpec {
            kind: BlockKind::Skill,
            description: None,
            max_tokens: None,
            content: String::new(),
        };
        on_a.define("skills", skills).await.unwrap();
        on_a.put_entry("skills", "review", "Read the diff twice.", None)
            .await
            .unwrap();
        let on_b = b.session("s").unwrap().context();
        assert!(on_b.loaded_skills().await.unwrap().is_empty());

        let args = serde_json::json!({"label": "skills", "key": "review"});
        let output = on_a.execute("load_context", &args).await;
        assert_eq!(output, "Read the diff twice.");
        let part = serde_json::json!({"type": "tool-load_context", "toolCallId": "call-1",
                                      "state": "output-available", "input": args,
                                      "output": output});
        let stored = serde_json::json!({"id": "t1", "role": "assistant", "parts": [part]});
        let stored = Message::from_value(stored).unwrap();
        let session = a.session("s").unwrap();
        session
            .append(stored, AppendOptions::default())
            .await
            .unwrap();
        let loaded = on_b.loaded_skills().await.unwrap();
        assert_eq!(loaded.into_iter().collect::<Vec<_>>(), ["skills:review"]);

        let output = on_b.execute("unload_context", &args).await;
        assert!(output.starts_with("Unloaded \"review\""), "{output}");
        assert!(on_a.loaded_skills().await.unwrap().is_empty());
    });
}
