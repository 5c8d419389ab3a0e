//! The change feed: order, payloads, filters, lag.

use futures::StreamExt;
use sessiondb::{AppendOptions, Change, Db, FeedFilter, FeedItem, Parent, Source, Store};

use crate::*;

fn events(items: Vec<FeedItem>) -> Vec<std::sync::Arc<sessiondb::ChangeEvent>> {
    items
        .into_iter()
        .filter_map(|i| match i {
            FeedItem::Event(e) => Some(e),
            FeedItem::Lagged { .. } => None,
        })
        .collect()
}

pub async fn feed_reports_each_write_in_order<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    let mut sub = db.subscribe(FeedFilter::All);
    chain(&s, &["a"]).await;
    s.append(text("a", "user", "again"), AppendOptions::default())
        .await
        .unwrap();
    s.update(text("a", "user", "changed"), Source::Server)
        .await
        .unwrap();
    s.delete(&["a".into()]).await.unwrap();
    s.clear().await.unwrap();
    let got = events(drain(&mut sub));
    let names: Vec<_> = got.iter().map(|e| e.change.name()).collect();
    assert_eq!(names, ["append", "append", "update", "delete", "clear"]);
    assert!(matches!(
        &got[0].change,
        Change::Append { inserted: true, .. }
    ));
    assert!(
        matches!(&got[1].change, Change::Append { inserted: false, message, .. } if message.json().contains("message a"))
    );
    assert!(
        matches!(&got[2].change, Change::Update { message } if message.json().contains("changed"))
    );
    assert!(matches!(&got[3].change, Change::Delete { message_ids } if message_ids == &["a"]));
    assert!(got.windows(2).all(|w| w[0].position < w[1].position));
    assert!(got.iter().all(|e| e.key.session_id == "s"));
}

pub async fn feed_carries_parents_and_imports<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    let mut sub = db.subscribe(FeedFilter::All);
    chain(&s, &["a"]).await;
    s.append(
        text("b", "user", "x"),
        AppendOptions {
            parent: Parent::Id("a".into()),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    s.import(text("i", "user", "old"), imported(Some("a"), 3))
        .await
        .unwrap();
    // Following the active leaf (the import's row): the event's message names where it went.
    chain(&s, &["c"]).await;
    let got = events(drain(&mut sub));
    assert_eq!(
        got.iter().map(|e| e.change.name()).collect::<Vec<_>>(),
        ["append", "append", "import", "append"]
    );
    assert!(matches!(
        &got[0].change,
        Change::Append {
            parent: Parent::ActiveLeaf,
            ..
        }
    ));
    assert!(
        matches!(&got[1].change, Change::Append { parent: Parent::Id(p), message, .. } if p == "a" && message.parent_id.as_deref() == Some("a"))
    );
    assert!(
        matches!(&got[2].change, Change::Import { parent_id: Some(p), message } if p == "a" && message.created_at == 3)
    );
    assert!(
        matches!(&got[3].change, Change::Append { parent: Parent::ActiveLeaf, message, .. } if message.parent_id.as_deref() == Some("i")),
        "{:?}",
        got[3].change
    );
}

pub async fn feed_filters_by_session_and_namespace<S: Store>(db: Db<S>) {
    let a = db_session(&db, "a");
    let b = db_session(&db, "b");
    let t = db.session_in("tenant", "a").unwrap();
    let mut only_a = db.subscribe(FeedFilter::Session(a.key().clone()));
    let mut tenant = db.subscribe(FeedFilter::Namespace("tenant".into()));
    chain(&a, &["1"]).await;
    chain(&b, &["2"]).await;
    chain(&t, &["3"]).await;
    let a_events = events(drain(&mut only_a));
    assert_eq!(a_events.len(), 1);
    assert_eq!(a_events[0].key, *a.key());
    let t_events = events(drain(&mut tenant));
    assert_eq!(t_events.len(), 1);
    assert_eq!(t_events[0].key.namespace, "tenant");
}

pub async fn a_stalled_subscriber_never_blocks_writes<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    let mut stalled = db.subscribe(FeedFilter::All);
    let n = 3000;
    let messages = (0..n)
        .map(|i| text(&format!("m{i}"), "user", "x"))
        .collect();
    s.append_all(messages, AppendOptions::default())
        .await
        .unwrap();
    chain(&s, &["last"]).await;
    assert_eq!(s.stats().await.unwrap().message_count, n as u64 + 1);
    let items = drain(&mut stalled);
    let missed: u64 = items
        .iter()
        .map(|i| match i {
            FeedItem::Lagged { missed } => *missed,
            FeedItem::Event(_) => 0,
        })
        .sum();
    let delivered = events(items).len() as u64;
    assert!(missed > 0, "a full buffer must report lag");
    assert!(delivered + missed <= n as u64 + 1);
}

pub async fn failed_writes_publish_nothing<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    s.import(text("a", "user", "a"), imported(Some("b"), 1))
        .await
        .unwrap();
    let mut sub = db.subscribe(FeedFilter::All);
    assert!(
        s.import(text("b", "user", "b"), imported(Some("a"), 2))
            .await
            .is_err()
    );
    assert!(drain(&mut sub).is_empty());
}

pub async fn one_bad_write_does_not_fail_concurrent_ones<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    s.import(text("a", "user", "a"), imported(Some("b"), 1))
        .await
        .unwrap();
    let handles: Vec<_> = (0..16)
        .map(|i| {
            let s = s.clone();
            std::thread::spawn(move || {
                if i % 4 == 0 {
                    let bad = imported(Some("a"), 2);
                    block_on(s.import(text("b", "user", "b"), bad)).is_err()
                } else {
                    block_on(s.append(
                        text(&format!("ok{i}"), "user", "x"),
                        AppendOptions::default(),
                    ))
                    .is_ok()
                }
            })
        })
        .collect();
    assert!(handles.into_iter().all(|h| h.join().unwrap()));
    assert_eq!(s.stats().await.unwrap().stored_messages, 13);
}

pub async fn events_arrive_after_the_write_is_readable<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    let mut sub = db.subscribe(FeedFilter::Session(s.key().clone()));
    let writer = {
        let s = s.clone();
        std::thread::spawn(move || {
            for i in 0..20 {
                let id = format!("w{i}");
                block_on(s.append(text(&id, "user", &id), AppendOptions::default())).unwrap();
            }
        })
    };
    for _ in 0..20 {
        let Some(FeedItem::Event(event)) = sub.next().await else {
            panic!("the feed ended or lagged");
        };
        let Change::Append { message, .. } = &event.change else {
            panic!("unexpected {:?}", event.change);
        };
        // Published after the commit: whoever hears of a write can read it.
        assert!(s.message(&message.id).await.unwrap().is_some());
    }
    writer.join().unwrap();
}
