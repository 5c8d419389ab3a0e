//! Appends, parents, branches and identity.

use futures::StreamExt;
use serde_json::json;
use sessiondb::{AppendOptions, AppendResult, Db, Error, HistoryOptions, Message, Source, Store};

use crate::*;

pub async fn appends_chain_in_order<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    let first = s
        .append(text("m1", "user", "one"), AppendOptions::default())
        .await
        .unwrap();
    assert!(first.inserted);
    chain(&s, &["m2", "m3"]).await;
    assert_eq!(history_ids(&s, None).await, ["m1", "m2", "m3"]);
    assert_eq!(s.latest_leaf().await.unwrap().unwrap().id, "m3");
    assert_eq!(s.row_stats(None).await.unwrap().len(), 3);
    let streamed: Vec<_> = s
        .history(HistoryOptions::default())
        .map(|m| m.unwrap())
        .collect()
        .await;
    assert_eq!(
        streamed,
        s.full_history(HistoryOptions::default()).await.unwrap()
    );
}

pub async fn reappend_keeps_first_content<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    s.append(text("m1", "user", "First"), AppendOptions::default())
        .await
        .unwrap();
    let again = s
        .append(text("m1", "user", "Duplicate"), AppendOptions::default())
        .await
        .unwrap();
    assert!(!again.inserted);
    assert!(again.message.json().contains("First"));
    assert_eq!(s.stats().await.unwrap().stored_messages, 1);
    assert_eq!(history_ids(&s, None).await, ["m1"]);
}

pub async fn explicit_parent_starts_a_branch<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    chain(&s, &["a", "b1"]).await;
    s.append(text("b2", "assistant", "retry"), under("a"))
        .await
        .unwrap();
    assert_eq!(ids(&s.branches("a").await.unwrap()), ["b1", "b2"]);
    assert_eq!(history_ids(&s, None).await, ["a", "b2"]);
    assert_eq!(history_ids(&s, Some("b1")).await, ["a", "b1"]);
}

pub async fn root_parent_starts_a_new_tree<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    chain(&s, &["r1", "c1"]).await;
    s.append(text("r2", "user", "fresh"), root()).await.unwrap();
    assert_eq!(history_ids(&s, None).await, ["r2"]);
    assert_eq!(s.message("r2").await.unwrap().unwrap().parent_id, None);
}

pub async fn unknown_or_empty_parent_makes_a_root<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    chain(&s, &["a"]).await;
    s.append(text("r3", "user", "x"), under("missing"))
        .await
        .unwrap();
    assert_eq!(history_ids(&s, None).await, ["r3"]);
    s.append(text("r4", "user", "x"), under("")).await.unwrap();
    assert_eq!(history_ids(&s, None).await, ["r4"]);
}

pub async fn parent_from_another_session_makes_a_root<S: Store>(db: Db<S>) {
    let other = db_session(&db, "other");
    chain(&other, &["foreign"]).await;
    let s = db_session(&db, "s");
    chain(&s, &["a"]).await;
    s.append(text("b", "user", "x"), under("foreign"))
        .await
        .unwrap();
    assert_eq!(s.message("b").await.unwrap().unwrap().parent_id, None);
}

pub async fn generated_ids_are_unique_and_prefixed<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    let a = s
        .append(Message::text("user", "a"), AppendOptions::default())
        .await
        .unwrap();
    let b = s
        .append(Message::text("user", "a"), AppendOptions::default())
        .await
        .unwrap();
    assert!(a.message.id.starts_with("msg_"), "{}", a.message.id);
    assert_ne!(a.message.id, b.message.id);
    assert!(b.inserted);
    assert_eq!(
        history_ids(&s, None).await,
        [a.message.id.clone(), b.message.id.clone()]
    );
}

pub async fn compaction_ids_are_never_stored<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    chain(&s, &["m1"]).await;
    let mut sub = db.subscribe(sessiondb::FeedFilter::All);
    let overlay = text("compaction_abc", "assistant", "summary");
    let r = s
        .append(overlay.clone(), AppendOptions::default())
        .await
        .unwrap();
    assert!(!r.inserted && r.refused);
    assert_eq!(r.message.id, "compaction_abc");
    let r = s
        .upsert(overlay.clone(), AppendOptions::default())
        .await
        .unwrap();
    assert!(!r.inserted && r.refused);
    assert_eq!(s.update(overlay, Source::Server).await.unwrap(), None);
    assert!(s.message("compaction_abc").await.unwrap().is_none());
    assert!(drain(&mut sub).is_empty());
    chain(&s, &["m2"]).await;
    assert_eq!(
        s.message("m2").await.unwrap().unwrap().parent_id.as_deref(),
        Some("m1")
    );
}

pub async fn append_result_matches_later_reads<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    let appended = s
        .append(
            Message::from_value(json!({"id": "m", "role": "user",
                "parts": [{"type": "text", "text": "hi", "extra": {"k": [1, 2.5, null]}}],
                "metadata": {"a": "b"}, "custom": true}))
            .unwrap(),
            AppendOptions::default(),
        )
        .await
        .unwrap()
        .message;
    assert_eq!(s.message("m").await.unwrap().unwrap(), appended);
    assert_eq!(
        s.full_history(HistoryOptions::default()).await.unwrap(),
        std::slice::from_ref(&appended)
    );
    assert_eq!(
        appended.body(),
        r#"{"id":"m","role":"user","parts":[{"type":"text","text":"hi","extra":{"k":[1,2.5,null]}}],"metadata":{"a":"b"},"custom":true}"#
    );
}

pub async fn created_at_is_stamped_by_the_store<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    let m = Message::from_value(json!({"id": "m", "role": "user", "content": "x", "createdAt": 5}))
        .unwrap();
    let stored = s.append(m, AppendOptions::default()).await.unwrap().message;
    assert!(stored.created_at > 1_600_000_000_000);
    assert_eq!(stored.to_value()["createdAt"], json!(stored.created_at));
    assert_eq!(
        stored
            .to_value()
            .as_object()
            .unwrap()
            .keys()
            .filter(|k| *k == "createdAt")
            .count(),
        1
    );
    assert_eq!(stored.updated_at, None);
}

pub async fn same_id_in_two_sessions_is_independent<S: Store>(db: Db<S>) {
    let a = db_session(&db, "a");
    let b = db_session(&db, "b");
    a.append(text("m", "user", "in a"), AppendOptions::default())
        .await
        .unwrap();
    b.append(text("m", "user", "in b"), AppendOptions::default())
        .await
        .unwrap();
    a.update(text("m", "user", "changed a"), Source::Server)
        .await
        .unwrap();
    assert!(
        b.message("m")
            .await
            .unwrap()
            .unwrap()
            .json()
            .contains("in b")
    );
    assert_eq!(b.delete(&["m".into()]).await.unwrap(), 1);
    assert!(
        a.message("m")
            .await
            .unwrap()
            .unwrap()
            .json()
            .contains("changed a")
    );
    assert!(b.message("m").await.unwrap().is_none());
}

pub async fn namespaces_never_see_each_other<S: Store>(db: Db<S>) {
    let t1 = db.session_in("tenant-1", "chat").unwrap();
    let t2 = db.session_in("tenant-2", "chat").unwrap();
    t1.append(text("m", "user", "secret alpha"), AppendOptions::default())
        .await
        .unwrap();
    assert!(t2.message("m").await.unwrap().is_none());
    assert!(history_ids(&t2, None).await.is_empty());
    assert!(t2.search("alpha", 10).await.unwrap().is_empty());
    assert_eq!(t2.stats().await.unwrap().message_count, 0);
    assert_eq!(t2.delete(&["m".into()]).await.unwrap(), 0);
    t2.clear().await.unwrap();
    assert_eq!(history_ids(&t1, None).await, ["m"]);
    let sub_parent = t2.append(text("x", "user", "y"), under("m")).await.unwrap();
    assert_eq!(sub_parent.message.parent_id, None);
}

pub async fn invalid_session_ids_are_refused<S: Store>(db: Db<S>) {
    assert!(matches!(db.session(""), Err(Error::Invalid(e)) if e.field == "sessionId"));
    assert!(matches!(
        db.session(&"x".repeat(257)),
        Err(Error::Invalid(_))
    ));
    assert!(db.session(&"é".repeat(256)).is_ok());
    assert!(
        matches!(db.session_in(&"n".repeat(300), "s"), Err(Error::Invalid(e)) if e.field == "namespace")
    );
}

pub async fn branch_append_becomes_the_active_leaf<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    chain(&s, &["a", "b", "c", "d"]).await;
    s.append(text("x", "user", "branch"), under("b"))
        .await
        .unwrap();
    assert_eq!(s.latest_leaf().await.unwrap().unwrap().id, "x");
    chain(&s, &["y"]).await;
    assert_eq!(history_ids(&s, None).await, ["a", "b", "x", "y"]);
    assert_eq!(history_ids(&s, Some("d")).await, ["a", "b", "c", "d"]);
}

pub async fn append_all_chains_atomically<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    chain(&s, &["a", "b"]).await;
    let batch = vec![
        text("c1", "user", "1"),
        text("c2", "assistant", "2"),
        text("b", "user", "dup"),
    ];
    let results = s.append_all(batch, under("a")).await.unwrap();
    assert_eq!(
        results.iter().map(|r| r.inserted).collect::<Vec<_>>(),
        [true, true, false]
    );
    assert_eq!(history_ids(&s, None).await, ["a", "c1", "c2"]);
    assert_eq!(
        s.message("c1").await.unwrap().unwrap().parent_id.as_deref(),
        Some("a")
    );
}

pub async fn append_all_chains_under_messages_that_already_exist<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    chain(&s, &["a", "b", "c"]).await;
    let batch = || {
        vec![
            text("a", "user", "again"),
            text("x", "assistant", "new"),
            text("y", "user", "new"),
        ]
    };
    let inserted =
        |results: Vec<AppendResult>| results.iter().map(|r| r.inserted).collect::<Vec<_>>();
    // `a` exists and stays where it is; what follows it in the batch goes under it, not under
    // the active leaf `c`.
    let results = s
        .append_all(batch(), AppendOptions::default())
        .await
        .unwrap();
    assert_eq!(inserted(results), [false, true, true]);
    assert_eq!(history_ids(&s, None).await, ["a", "x", "y"]);
    assert_eq!(history_ids(&s, Some("c")).await, ["a", "b", "c"]);
    // The same batch again (a client's retry) stores nothing and moves nothing.
    let results = s
        .append_all(batch(), AppendOptions::default())
        .await
        .unwrap();
    assert_eq!(inserted(results), [false, false, false]);
    assert_eq!(history_ids(&s, None).await, ["a", "x", "y"]);
    assert_eq!(s.branches("a").await.unwrap().len(), 2);
}

pub async fn seq_strictly_increases_and_is_never_reused<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    chain(&s, &["a", "b", "c"]).await;
    let c_seq = s.message("c").await.unwrap().unwrap().seq;
    s.delete(&["c".into()]).await.unwrap();
    chain(&s, &["d"]).await;
    assert!(s.message("d").await.unwrap().unwrap().seq > c_seq);
    s.clear().await.unwrap();
    chain(&s, &["e"]).await;
    assert!(s.message("e").await.unwrap().unwrap().seq > c_seq + 1);
}

pub async fn concurrent_appends_all_land<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    let writers: Vec<_> = (0..8)
        .map(|w| {
            let s = s.clone();
            std::thread::spawn(move || {
                for i in 0..25 {
                    let id = format!("w{w}-{i}");
                    block_on(s.append(text(&id, "user", &id), AppendOptions::default())).unwrap();
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    let history = s.full_history(HistoryOptions::default()).await.unwrap();
    assert_eq!(history.len(), 200);
    assert!(
        history
            .windows(2)
            .all(|p| p[0].seq < p[1].seq && p[1].parent_id.as_deref() == Some(&*p[0].id))
    );
    let stats = s.stats().await.unwrap();
    assert_eq!(stats.message_count, 200);
}
