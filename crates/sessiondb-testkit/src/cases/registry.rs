//! The session registry, listings, compaction overlays, state and namespace search.

use serde_json::json;
use sessiondb::{
    AppendOptions, BlockKind, BlockSpec, Db, Error, FeedFilter, HistoryOptions, Message,
    PageRequest, Parent, SessionListing, SessionPatch, SessionRecord, SessionSort, Store, Usage,
    ValidationErrorKind,
};

use crate::*;

fn object(value: serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
    value.as_object().cloned().unwrap()
}

pub async fn sessions_are_created_patched_and_deleted<S: Store>(db: Db<S>) {
    let mut sub = db.subscribe(FeedFilter::All);
    let record = SessionRecord {
        name: Some("first".into()),
        user_id: Some("u1".into()),
        metadata: object(json!({"a": 1, "b": 2})),
        ..Default::default()
    };
    let info = db
        .create_session("", Some("s".into()), record.clone())
        .await
        .unwrap();
    assert_eq!(
        (info.id.as_str(), info.record.name.as_deref()),
        ("s", Some("first"))
    );
    assert_eq!(info.stats.message_count, 0);
    assert!(matches!(
        db.create_session("", Some("s".into()), record).await,
        Err(Error::SessionExists { id }) if id == "s"
    ));
    let generated = db
        .create_session("", None, SessionRecord::default())
        .await
        .unwrap();
    assert!(generated.id.starts_with("ses_"));

    let s = db_session(&db, "s");
    chain(&s, &["m1", "m2"]).await;
    s.set_state("k", &json!({"x": [1, 2]})).await.unwrap();
    s.add_compaction("sum".into(), "m1".into(), "m2".into())
        .await
        .unwrap();
    let patched = s
        .patch(SessionPatch {
            name: Some("renamed".into()),
            metadata: Some(object(json!({"b": null, "c": 3}))),
            usage: Some(Usage {
                input_tokens: 10,
                output_tokens: 5,
                cost: 0.25,
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(patched.record.name.as_deref(), Some("renamed"));
    assert_eq!(
        serde_json::Value::Object(patched.record.metadata.clone()),
        json!({"a": 1, "c": 3})
    );
    assert_eq!(
        (patched.record.input_tokens, patched.record.output_tokens),
        (10, 5)
    );
    assert_eq!(patched.stats.message_count, 2);
    assert_eq!(patched.stats.leaf_id.as_deref(), Some("m2"));
    assert!(patched.last_message_at.is_some());
    assert_eq!(
        patched.record.user_id.as_deref(),
        Some("u1"),
        "unpatched fields stay"
    );

    assert!(s.delete_session().await.unwrap());
    assert!(s.info().await.unwrap().is_none());
    assert!(s.message("m1").await.unwrap().is_none());
    assert!(s.state("k").await.unwrap().is_none());
    assert!(s.compactions().await.unwrap().is_empty());
    assert!(!s.delete_session().await.unwrap());
    let missing = db_session(&db, "never");
    assert!(
        missing
            .patch(SessionPatch::default())
            .await
            .unwrap()
            .is_none()
    );
    assert!(missing.info().await.unwrap().is_none());

    let names = event_names(&drain(&mut sub));
    assert_eq!(
        names,
        [
            "session",
            "session",
            "append",
            "append",
            "compaction",
            "session",
            "session"
        ]
    );
}

/// The ids of the first page of the anonymous namespace's sessions, sorted.
async fn first_page_ids<S: Store>(db: &Db<S>) -> Vec<String> {
    let page = db
        .list_sessions("", &SessionListing::default())
        .await
        .unwrap();
    let mut ids: Vec<String> = page.items.into_iter().map(|i| i.id).collect();
    ids.sort_unstable();
    ids
}

/// Nothing is left of `session` that held a record, message `m1`, state `k` and a compaction.
async fn assert_deleted<S: Store>(session: &Session<S>) {
    assert!(session.info().await.unwrap().is_none());
    assert!(session.message("m1").await.unwrap().is_none());
    assert!(session.state("k").await.unwrap().is_none());
    assert!(session.compactions().await.unwrap().is_empty());
}

/// More idle sessions than one page of deletes, with everything a session holds; the newest
/// writes come after the cutoff and stay, as does another namespace.
pub async fn sessions_last_written_before_a_time_are_deleted<S: Store>(db: Db<S>) {
    let ids: Vec<String> = (0..130).map(|i| format!("old{i:03}")).collect();
    for id in &ids {
        chain(&db_session(&db, id), &["m1", "m2"]).await;
    }
    let busy = db_session(&db, "old000");
    busy.set_state("k", &json!(1)).await.unwrap();
    let idle = db_session(&db, "old001");
    idle.set_state("k", &json!(1)).await.unwrap();
    idle.add_compaction("sum".into(), "m1".into(), "m2".into())
        .await
        .unwrap();
    let elsewhere = db.session_in("other", "old").unwrap();
    chain(&elsewhere, &["m1"]).await;
    let last_idle = idle.info().await.unwrap().unwrap().updated_at;
    // Writes from here on are stamped after the cutoff.
    std::thread::sleep(std::time::Duration::from_millis(3));
    let cutoff = last_idle + 1;
    chain(&db_session(&db, "fresh"), &["m1"]).await;
    chain(&busy, &["m3"]).await;

    let mut sub = db.subscribe(FeedFilter::All);
    let deleted = db.delete_sessions_updated_before("", cutoff).await.unwrap();
    assert_eq!(deleted, 129);
    let names = event_names(&drain(&mut sub));
    assert_eq!(names, vec!["session"; 129]);
    assert_eq!(first_page_ids(&db).await, ["fresh", "old000"]);
    assert_deleted(&idle).await;
    assert_eq!(history_ids(&busy, None).await, ["m1", "m2", "m3"]);
    assert_eq!(busy.state("k").await.unwrap(), Some(json!(1)));
    assert_eq!(history_ids(&elsewhere, None).await, ["m1"]);
    assert_eq!(
        db.delete_sessions_updated_before("", cutoff).await.unwrap(),
        0
    );
}

/// Erasing a user deletes every session created for them, more than one page of deletes, with
/// everything a session holds (whatever their settings say); other users' sessions, sessions
/// without a user and the same user in another namespace stay.
pub async fn a_users_sessions_are_deleted_and_no_one_elses<S: Store>(db: Db<S>) {
    let create = async |namespace: &str, id: &str, user: Option<&str>| {
        let record = SessionRecord {
            user_id: user.map(str::to_owned),
            ..Default::default()
        };
        db.create_session(namespace, Some(id.to_owned()), record)
            .await
            .unwrap();
        let session = db.session_in(namespace, id).unwrap();
        chain(&session, &["m1", "m2"]).await;
        session
    };
    let mut erased = Vec::new();
    for i in 0..130 {
        erased.push(create("", &format!("u1-{i:03}"), Some("u1")).await);
    }
    let held = &erased[7];
    held.set_state("k", &json!(1)).await.unwrap();
    held.add_compaction("sum".into(), "m1".into(), "m2".into())
        .await
        .unwrap();
    held.patch(SessionPatch {
        settings: Some(object(json!({"keepWhenIdle": true}))),
        ..Default::default()
    })
    .await
    .unwrap();
    let other_user = create("", "u2-000", Some("u2")).await;
    let no_user = create("", "anonymous", None).await;
    let elsewhere = create("other", "u1-000", Some("u1")).await;

    let mut sub = db.subscribe(FeedFilter::All);
    assert_eq!(db.delete_user_sessions("", "u1").await.unwrap(), 130);
    assert_eq!(event_names(&drain(&mut sub)), vec!["session"; 130]);
    assert_eq!(first_page_ids(&db).await, ["anonymous", "u2-000"]);
    assert_deleted(held).await;
    let hits = db.search_all("", None, "message", 100).await.unwrap();
    let mut found: Vec<&str> = hits.iter().map(|h| h.session_id.as_str()).collect();
    found.sort_unstable();
    assert_eq!(found, ["anonymous", "anonymous", "u2-000", "u2-000"]);
    for kept in [&other_user, &no_user, &elsewhere] {
        assert_eq!(history_ids(kept, None).await, ["m1", "m2"]);
    }
    assert_eq!(db.delete_user_sessions("", "u1").await.unwrap(), 0);
    assert_eq!(db.delete_user_sessions("", "nobody").await.unwrap(), 0);
}

/// Sessions whose settings say `keepWhenIdle: true` outlive idle deletion, also more than a
/// page of them ahead of idle ones (the sweep pages past them); taking the setting back is a
/// write, which makes the session fresh again, and it goes once it is idle after that.
pub async fn sessions_kept_when_idle_outlive_idle_deletion<S: Store>(db: Db<S>) {
    let keep = || SessionPatch {
        settings: Some(object(json!({"keepWhenIdle": true}))),
        ..Default::default()
    };
    for i in 0..120 {
        let kept = db_session(&db, &format!("kept{i:03}"));
        chain(&kept, &["m1"]).await;
        kept.patch(keep()).await.unwrap();
    }
    chain(&db_session(&db, "idle"), &["m1"]).await;
    let refused = db_session(&db, "kept000")
        .patch(SessionPatch {
            settings: Some(object(json!({"keepWhenIdle": "yes"}))),
            ..Default::default()
        })
        .await
        .unwrap_err();
    match refused {
        Error::Invalid(e) => assert_eq!(e.field, "settings.keepWhenIdle"),
        other => panic!("{other:?}"),
    }
    // Every write so far is at or before the idle session's; later ones come after the cutoff.
    let cutoff = db_session(&db, "idle")
        .info()
        .await
        .unwrap()
        .unwrap()
        .updated_at
        + 1;
    std::thread::sleep(std::time::Duration::from_millis(3));
    assert_eq!(
        db.delete_sessions_updated_before("", cutoff).await.unwrap(),
        1
    );
    let left = |limit| SessionListing {
        page: PageRequest {
            limit: Some(limit),
            ..Default::default()
        },
        ..Default::default()
    };
    assert_eq!(
        db.list_sessions("", &left(100)).await.unwrap().items.len(),
        100
    );
    assert!(db_session(&db, "idle").info().await.unwrap().is_none());
    assert!(db_session(&db, "kept119").info().await.unwrap().is_some());

    let unkept = db_session(&db, "kept007");
    let unkeep = SessionPatch {
        settings: Some(object(json!({"keepWhenIdle": null}))),
        ..Default::default()
    };
    unkept.patch(unkeep).await.unwrap();
    assert_eq!(
        db.delete_sessions_updated_before("", cutoff).await.unwrap(),
        0,
        "taking the setting back was a write after the cutoff"
    );
    let later = unkept.info().await.unwrap().unwrap().updated_at + 1;
    std::thread::sleep(std::time::Duration::from_millis(3));
    assert_eq!(
        db.delete_sessions_updated_before("", later).await.unwrap(),
        1
    );
    assert!(unkept.info().await.unwrap().is_none());
    assert!(db_session(&db, "kept008").info().await.unwrap().is_some());
}

/// A sweeper starts each sweep after the idle sessions the sweep before found kept, so they are
/// not listed again, while sessions that became idle since go; a session stamped before them
/// (by a clock running behind) goes at the tenth sweep, which starts from the oldest again.
pub async fn sweeps_start_after_the_sessions_kept_when_idle<S: Store>(db: Db<S>) {
    use sessiondb::{IdleSweep, IdleSweeper};
    use sessiondb_core::{WriteOp, WriteRequest};
    let keep = SessionPatch {
        settings: Some(object(json!({"keepWhenIdle": true}))),
        ..Default::default()
    };
    for i in 0..150 {
        let kept = db_session(&db, &format!("kept{i:03}"));
        chain(&kept, &["m1"]).await;
        kept.patch(keep.clone()).await.unwrap();
    }
    let written = |id: &'static str| {
        let session = db_session(&db, id);
        async move { session.info().await.unwrap().unwrap().updated_at }
    };
    chain(&db_session(&db, "idle"), &["m1"]).await;
    let cutoff = written("idle").await + 1;
    std::thread::sleep(std::time::Duration::from_millis(3));
    let mut sweeper = IdleSweeper::default();
    let mut sweep = async |cutoff| {
        db.sweep_idle_sessions("", cutoff, &mut sweeper)
            .await
            .unwrap()
    };
    assert_eq!(
        sweep(cutoff).await,
        IdleSweep {
            deleted: 1,
            kept: 150
        }
    );

    chain(&db_session(&db, "later"), &["m1"]).await;
    let behind = WriteRequest {
        key: db_session(&db, "behind").key().clone(),
        now_ms: written("kept000").await - 1,
        ops: vec![WriteOp::CreateSession {
            record: SessionRecord::default(),
            created_at: None,
        }],
        max_messages: None,
        condition: None,
    };
    db.store().write(behind).await.unwrap();
    let cutoff = written("later").await + 1;
    std::thread::sleep(std::time::Duration::from_millis(3));
    assert_eq!(
        sweep(cutoff).await,
        IdleSweep {
            deleted: 1,
            kept: 0
        }
    );
    assert!(db_session(&db, "later").info().await.unwrap().is_none());
    for _ in 2..10 {
        assert_eq!(sweep(cutoff).await, IdleSweep::default());
    }
    assert!(db_session(&db, "behind").info().await.unwrap().is_some());
    assert_eq!(
        sweep(cutoff).await,
        IdleSweep {
            deleted: 1,
            kept: 150
        }
    );
    assert!(db_session(&db, "behind").info().await.unwrap().is_none());
    assert!(db_session(&db, "kept149").info().await.unwrap().is_some());
}

/// The writer checks the time again: a session written at or after the cutoff (after whoever
/// chose it listed it) stays, and the request writes nothing.
pub async fn a_conditional_delete_keeps_a_session_written_since<S: Store>(db: Db<S>) {
    use sessiondb_core::{WriteOp, WriteOutcome, WriteRequest, Written};
    let session = db_session(&db, "s");
    chain(&session, &["m1"]).await;
    let info_before = session.info().await.unwrap().unwrap();
    let written = info_before.updated_at;
    let mut sub = db.subscribe(FeedFilter::All);
    let delete = |before: i64| WriteRequest {
        key: session.key().clone(),
        now_ms: written + 10,
        ops: vec![WriteOp::DeleteSession {
            updated_before: Some(before),
        }],
        max_messages: None,
        condition: None,
    };
    let kept = db.store().write(delete(written)).await.unwrap();
    assert_eq!(kept.outcomes, [WriteOutcome::Existed(false)]);
    assert_eq!(
        kept.version,
        Some(info_before.stats.version),
        "nothing moved it"
    );
    let info = session.info().await.unwrap().unwrap();
    assert_eq!(info.updated_at, written, "a kept session is not touched");
    assert_eq!(history_ids(&session, None).await, ["m1"]);
    assert!(drain(&mut sub).is_empty());
    let missing = WriteRequest {
        key: db_session(&db, "never").key().clone(),
        ..delete(written + 1)
    };
    assert_eq!(
        db.store().write(missing).await.unwrap(),
        Written {
            outcomes: vec![WriteOutcome::Existed(false)],
            version: None
        }
    );
    assert!(db_session(&db, "never").info().await.unwrap().is_none());
    let gone = db.store().write(delete(written + 1)).await.unwrap();
    assert_eq!(gone.outcomes, [WriteOutcome::Existed(true)]);
    assert_eq!(gone.version, None, "no session is left");
    assert!(session.info().await.unwrap().is_none());
    assert_eq!(event_names(&drain(&mut sub)), ["session"]);
}

pub async fn appending_creates_a_session_with_an_empty_record<S: Store>(db: Db<S>) {
    let s = db_session(&db, "implicit");
    chain(&s, &["a"]).await;
    let info = s.info().await.unwrap().unwrap();
    assert_eq!(info.record, SessionRecord::default());
    assert_eq!(info.stats.message_count, 1);
    assert!(info.created_at > 0 && info.updated_at >= info.created_at);
}

/// Counters are stored as signed 64-bit integers and the cost as a double: a report that
/// would overflow either leaves the counter at its largest value, never negative or infinite.
pub async fn usage_counters_saturate_instead_of_overflowing<S: Store>(db: Db<S>) {
    let s = db_session(&db, "busy");
    chain(&s, &["m1"]).await;
    let huge = SessionPatch {
        usage: Some(Usage {
            input_tokens: u64::MAX,
            output_tokens: i64::MAX as u64 - 1,
            cost: f64::MAX,
        }),
        ..Default::default()
    };
    s.patch(huge.clone()).await.unwrap();
    s.patch(huge).await.unwrap();
    let record = s.info().await.unwrap().unwrap().record;
    assert_eq!(
        (record.input_tokens, record.output_tokens),
        (i64::MAX as u64, i64::MAX as u64)
    );
    assert_eq!(record.cost, f64::MAX);
}

/// Patches of one session's record made at once each keep what they change: every metadata
/// key merged and every usage added, whichever patch commits first (each merges and adds to
/// the record as stored when it is written, not as read before).
pub async fn concurrent_patches_of_a_session_keep_every_change<S: Store>(db: Db<S>) {
    const TASKS: usize = 4;
    const ROUNDS: usize = 12;
    let s = db_session(&db, "busy");
    chain(&s, &["m1"]).await;
    let patcher = |task: usize| {
        let s = &s;
        async move {
            for round in 0..ROUNDS {
                let merged = SessionPatch {
                    metadata: Some(object(json!({ format!("k{task}_{round}"): round }))),
                    ..Default::default()
                };
                let used = SessionPatch {
                    usage: Some(Usage {
                        input_tokens: 1,
                        output_tokens: 2,
                        cost: 0.25,
                    }),
                    ..Default::default()
                };
                s.patch(merged).await.unwrap();
                s.patch(used).await.unwrap();
            }
        }
    };
    futures::future::join_all((0..TASKS).map(patcher)).await;

    let record = s.info().await.unwrap().unwrap().record;
    let patches = (TASKS * ROUNDS) as u64;
    assert_eq!(
        record.metadata.len(),
        TASKS * ROUNDS,
        "{:?}",
        record.metadata
    );
    for task in 0..TASKS {
        for round in 0..ROUNDS {
            assert_eq!(record.metadata[&format!("k{task}_{round}")], json!(round));
        }
    }
    assert_eq!(
        (record.input_tokens, record.output_tokens, record.cost),
        (patches, 2 * patches, 0.25 * patches as f64)
    );
}

/// U+0000 is valid JSON and Unicode, and PostgreSQL's `text` cannot hold it: message bodies
/// (stored as JSON, where it is an escape) keep it byte for byte and stay searchable, while
/// free text stored as it is (names, summaries, context text) refuses it with a typed error
/// that names the field, on every backend, storing nothing; and an id with one, which no
/// stored row can have, names nothing in every look-up.
pub async fn nul_characters_stay_in_messages_and_are_refused_in_free_text<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    let message = Message::from_value(json!({
        "id": "m1",
        "role": "user",
        "content": "alpha\u{0}beta",
        "metadata": {"k\u{0}": "v\u{0}"}
    }))
    .unwrap();
    s.append(message, AppendOptions::default()).await.unwrap();
    let stored = s.message("m1").await.unwrap().unwrap();
    let stored: serde_json::Value = serde_json::from_str(stored.json()).unwrap();
    assert_eq!(stored["content"], "alpha\u{0}beta");
    assert_eq!(stored["metadata"]["k\u{0}"], "v\u{0}");
    let hits = s.search("beta", 10).await.unwrap();
    assert_eq!(
        hits.iter().map(|h| h.id.as_str()).collect::<Vec<_>>(),
        ["m1"]
    );

    let nul_in = |field: &str, result: Result<_, Error>| match result {
        Err(Error::Invalid(e)) => {
            assert_eq!(
                (e.field.as_str(), &e.kind),
                (field, &ValidationErrorKind::NulCharacter)
            )
        }
        other => panic!("{field}: {:?}", other.map(|_| ())),
    };
    let named = SessionRecord {
        name: Some("a\u{0}b".into()),
        ..Default::default()
    };
    nul_in(
        "name",
        db.create_session("", Some("t".into()), named)
            .await
            .map(drop),
    );
    assert!(db_session(&db, "t").info().await.unwrap().is_none());
    let patch = SessionPatch {
        model: Some("m\u{0}".into()),
        ..Default::default()
    };
    nul_in("model", s.patch(patch).await.map(drop));
    assert_eq!(s.info().await.unwrap().unwrap().record.model, None);
    let summary = s.add_compaction("sum\u{0}".into(), "m1".into(), "m1".into());
    nul_in("summary", summary.await.map(drop));
    assert!(s.compactions().await.unwrap().is_empty());
    nul_in(
        "name",
        s.fork("m1", None, Some("f\u{0}".into())).await.map(drop),
    );
    // A new session's id is an identifier, refused under the name the caller gave it.
    let bad_id = |result: Result<(), Error>| {
        matches!(result, Err(Error::Invalid(e))
            if e.field == "id" && e.kind == ValidationErrorKind::ControlCharacter)
    };
    assert!(bad_id(
        s.fork("m1", Some("f\u{0}".into()), None).await.map(drop)
    ));
    let record = SessionRecord::default();
    let created = db.create_session("", Some("t\u{0}".into()), record).await;
    assert!(bad_id(created.map(drop)));
    let context = s.context();
    let block = BlockSpec {
        kind: BlockKind::Writable,
        description: Some("notes\u{0}".into()),
        max_tokens: None,
        content: String::new(),
    };
    nul_in(
        "description",
        context.define("notes", block).await.map(drop),
    );
    assert!(context.blocks().await.unwrap().is_empty());

    // A look-up with a NUL names nothing (no stored id holds one), on every backend.
    let ghost = "m\u{0}1";
    assert!(s.message(ghost).await.unwrap().is_none());
    assert!(s.branches(ghost).await.unwrap().is_empty());
    assert!(s.row_stats(Some(ghost)).await.unwrap().is_empty());
    let from_ghost = HistoryOptions {
        leaf: Some(ghost.into()),
        ..Default::default()
    };
    assert!(s.full_history(from_ghost).await.unwrap().is_empty());
    assert!(
        s.recent_history(1000, Some(ghost))
            .await
            .unwrap()
            .messages
            .is_empty()
    );
    assert!(s.state(ghost).await.unwrap().is_none());
    assert!(!s.delete_state(ghost).await.unwrap());
    assert_eq!(s.delete(&[ghost.to_owned()]).await.unwrap(), 0);
    let under_ghost = AppendOptions {
        parent: Parent::Id(ghost.into()),
        ..Default::default()
    };
    let orphan = Message::text("user", "x").with_id("m2");
    s.append(orphan, under_ghost).await.unwrap();
    assert_eq!(
        s.message("m2").await.unwrap().unwrap().parent_id,
        None,
        "unknown ⇒ root"
    );
    let by_ghost_user = SessionListing {
        user_id: Some("u\u{0}".into()),
        ..Default::default()
    };
    assert!(
        db.list_sessions("", &by_ghost_user)
            .await
            .unwrap()
            .items
            .is_empty()
    );
    assert!(
        db.search_all("", Some("u\u{0}"), "beta", 10)
            .await
            .unwrap()
            .is_empty()
    );
    let after_ghost = PageRequest {
        after: Some(ghost.into()),
        ..Default::default()
    };
    assert!(matches!(
        s.list_messages(&after_ghost).await,
        Err(Error::Invalid(_))
    ));
    let forged: String = b"1:s\0".iter().map(|b| format!("{b:02x}")).collect();
    let after_forged = SessionListing {
        page: PageRequest {
            after: Some(forged),
            ..Default::default()
        },
        ..Default::default()
    };
    assert!(matches!(
        db.list_sessions("", &after_forged).await,
        Err(Error::Invalid(_))
    ));
}

pub async fn listings_page_both_ways_with_cursors<S: Store>(db: Db<S>) {
    for (i, id) in ["a", "b", "c", "d", "e"].iter().enumerate() {
        let record = SessionRecord {
            user_id: Some(if i % 2 == 0 { "even" } else { "odd" }.into()),
            ..Default::default()
        };
        db.create_session("", Some(id.to_string()), record)
            .await
            .unwrap();
    }
    db.create_session("other", Some("z".into()), SessionRecord::default())
        .await
        .unwrap();
    let listing =
        |after: Option<String>, before: Option<String>, descending: bool| SessionListing {
            page: PageRequest {
                limit: Some(2),
                descending,
                after,
                before,
            },
            sort: SessionSort::CreatedAt,
            user_id: None,
        };
    let mut seen = Vec::new();
    let mut cursor = None;
    let mut pages = 0;
    loop {
        let page = db
            .list_sessions("", &listing(cursor, None, false))
            .await
            .unwrap();
        pages += 1;
        assert_eq!(page.previous_cursor.is_some(), pages > 1);
        seen.extend(page.items.iter().map(|i| i.id.clone()));
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    // Creation times may tie within a millisecond; ids break ties, so the order is by id here.
    assert_eq!(seen, ["a", "b", "c", "d", "e"]);
    assert_eq!(pages, 3);

    let newest = db
        .list_sessions("", &listing(None, None, true))
        .await
        .unwrap();
    assert_eq!(ids_of(&newest.items), ["e", "d"]);
    let older = db
        .list_sessions("", &listing(newest.next_cursor.clone(), None, true))
        .await
        .unwrap();
    assert_eq!(ids_of(&older.items), ["c", "b"]);
    let back = db
        .list_sessions("", &listing(None, older.previous_cursor.clone(), true))
        .await
        .unwrap();
    assert_eq!(ids_of(&back.items), ["e", "d"]);
    assert!(back.previous_cursor.is_none());
    assert_eq!(back.next_cursor, newest.next_cursor);

    let mut odd = listing(None, None, false);
    odd.user_id = Some("odd".into());
    assert_eq!(
        ids_of(&db.list_sessions("", &odd).await.unwrap().items),
        ["b", "d"]
    );

    let mut bad = listing(Some("garbage".into()), None, false);
    assert!(matches!(
        db.list_sessions("", &bad).await,
        Err(Error::Invalid(_))
    ));
    bad.page.after = None;
    bad.page.limit = Some(0);
    assert!(matches!(
        db.list_sessions("", &bad).await,
        Err(Error::Invalid(_))
    ));
    bad.page.limit = Some(101);
    assert!(matches!(
        db.list_sessions("", &bad).await,
        Err(Error::Invalid(_))
    ));
}

fn ids_of(items: &[sessiondb::SessionInfo]) -> Vec<&str> {
    items.iter().map(|i| i.id.as_str()).collect()
}

pub async fn message_lists_page_over_the_active_path<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    chain(&s, &["a", "b", "c", "d", "e"]).await;
    s.append(text("x", "user", "off path"), under("a"))
        .await
        .unwrap();
    s.append(text("f", "user", "tip"), under("e"))
        .await
        .unwrap();
    let page = |after: Option<&str>, before: Option<&str>, descending: bool| PageRequest {
        limit: Some(2),
        descending,
        after: after.map(str::to_owned),
        before: before.map(str::to_owned),
    };
    let first = s.list_messages(&page(None, None, false)).await.unwrap();
    assert_eq!(ids(&first.items), ["a", "b"]);
    assert_eq!(first.next_cursor.as_deref(), Some("b"));
    let second = s
        .list_messages(&page(Some("b"), None, false))
        .await
        .unwrap();
    assert_eq!(ids(&second.items), ["c", "d"]);
    assert_eq!(second.previous_cursor.as_deref(), Some("c"));
    let last = s
        .list_messages(&page(Some("d"), None, false))
        .await
        .unwrap();
    assert_eq!(ids(&last.items), ["e", "f"]);
    assert!(last.next_cursor.is_none());
    let back = s
        .list_messages(&page(None, Some("c"), false))
        .await
        .unwrap();
    assert_eq!(ids(&back.items), ["a", "b"]);
    assert!(back.previous_cursor.is_none());
    let desc = s.list_messages(&page(None, None, true)).await.unwrap();
    assert_eq!(ids(&desc.items), ["f", "e"]);
    assert!(
        s.list_messages(&page(Some("x"), None, false))
            .await
            .is_err(),
        "off the path"
    );
    assert!(
        s.list_messages(&page(Some("a"), Some("b"), false))
            .await
            .is_err()
    );
    let empty = db_session(&db, "none")
        .list_messages(&page(None, None, false))
        .await
        .unwrap();
    assert!(empty.items.is_empty() && empty.next_cursor.is_none());
}

pub async fn compaction_overlays_apply_on_path_reads_only<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    chain(&s, &["a", "b", "c", "d", "e"]).await;
    let before = s.info().await.unwrap().unwrap().stats.token_estimate;
    let c = s
        .add_compaction("the summary".into(), "b".into(), "d".into())
        .await
        .unwrap();
    // Ends on another branch never apply.
    s.append(text("y", "user", "side"), under("a"))
        .await
        .unwrap();
    s.add_compaction("ignored".into(), "b".into(), "y".into())
        .await
        .unwrap();
    s.append(text("f", "user", "back on main"), under("e"))
        .await
        .unwrap();

    let summary_id = format!("compaction_{}", c.id);
    let history = s.full_history(HistoryOptions::default()).await.unwrap();
    assert_eq!(ids(&history), ["a", summary_id.as_str(), "e", "f"]);
    assert_eq!(history[1].role, "assistant");
    assert_eq!(
        history[1].to_value()["parts"],
        json!([{"type": "text", "text": "the summary"}])
    );
    assert_eq!(
        newest_first_ids(&s, None).await,
        ["f", "e", summary_id.as_str(), "a"]
    );
    let recent = s.recent_history(1, None).await.unwrap();
    assert_eq!(ids(&recent.messages), ["f"]);
    assert!(recent.truncated);
    let all = s.recent_history(u64::MAX, None).await.unwrap();
    assert_eq!(ids(&all.messages), ids(&history));

    // Raw reads are untouched.
    assert!(s.message("c").await.unwrap().is_some());
    assert_eq!(ids(&s.branches("b").await.unwrap()), ["c"]);
    assert_eq!(s.row_stats(None).await.unwrap().len(), 6);
    let overlaid = s.info().await.unwrap().unwrap().stats.token_estimate;
    assert!(
        overlaid < before + 20,
        "summary replaces three rows: {overlaid} vs {before}"
    );
    let listed = s.compactions().await.unwrap();
    assert_eq!(listed.len(), 2);
    assert_eq!(listed[0], c);
}

pub async fn stored_echoes_of_own_summaries_are_hidden<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    chain(&s, &["a", "b"]).await;
    let c = s
        .add_compaction("sum".into(), "a".into(), "a".into())
        .await
        .unwrap();
    let echo = format!("compaction_{}", c.id);
    s.import(text(&echo, "assistant", "echo"), imported(Some("b"), 5))
        .await
        .unwrap();
    s.import(text("after", "user", "child"), imported(Some(&echo), 6))
        .await
        .unwrap();
    s.import(
        text("compaction_foreign", "assistant", "kept"),
        imported(Some("after"), 7),
    )
    .await
    .unwrap();
    assert_eq!(
        history_ids(&s, None).await,
        [echo.as_str(), "b", "after", "compaction_foreign"]
    );
    assert_eq!(
        s.row_stats(None)
            .await
            .unwrap()
            .iter()
            .map(|r| r.id.as_str())
            .collect::<Vec<_>>(),
        ["a", "b", "after", "compaction_foreign"]
    );
    assert_eq!(ids(&s.branches("b").await.unwrap()), ["after"]);
    // Newest first is the exact reverse; the recent window and search skip the echo too.
    let mut reversed = history_ids(&s, None).await;
    reversed.reverse();
    assert_eq!(newest_first_ids(&s, None).await, reversed);
    let recent = s.recent_history(1 << 20, None).await.unwrap();
    assert_eq!(
        ids(&recent.messages),
        [echo.as_str(), "b", "after", "compaction_foreign"]
    );
    let hits = s.search("echo", 10).await.unwrap();
    assert!(hits.iter().all(|h| h.id != echo), "{hits:?}");
    let only_echo = db_session(&db, "t");
    chain(&only_echo, &["a"]).await;
    let c2 = only_echo
        .add_compaction("x".into(), "zz".into(), "zz".into())
        .await
        .unwrap();
    only_echo
        .import(
            text(&format!("compaction_{}", c2.id), "assistant", "echo"),
            imported(Some("a"), 9),
        )
        .await
        .unwrap();
    assert_eq!(only_echo.latest_leaf().await.unwrap().unwrap().id, "a");
}

pub async fn state_is_json_per_session<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    let other = db.session_in("ns2", "s").unwrap();
    s.set_state("b", &json!(1.5)).await.unwrap();
    s.set_state("a", &json!({"nested": [true, null, "x"]}))
        .await
        .unwrap();
    s.set_state("a", &json!("replaced")).await.unwrap();
    assert_eq!(s.state("a").await.unwrap(), Some(json!("replaced")));
    assert_eq!(other.state("a").await.unwrap(), None);
    assert_eq!(
        s.state_entries().await.unwrap(),
        [("a".into(), json!("replaced")), ("b".into(), json!(1.5))]
    );
    assert!(s.delete_state("a").await.unwrap());
    assert!(!s.delete_state("a").await.unwrap());
    assert!(s.set_state("", &json!(1)).await.is_err());
    assert!(s.set_state(&"k".repeat(257), &json!(1)).await.is_err());
    assert!(
        s.info().await.unwrap().is_some(),
        "state creates the session"
    );
}

pub async fn namespace_search_spans_sessions_but_not_namespaces<S: Store>(db: Db<S>) {
    let record = |user: &str| SessionRecord {
        user_id: Some(user.into()),
        ..Default::default()
    };
    db.create_session("", Some("s1".into()), record("u1"))
        .await
        .unwrap();
    db.create_session("", Some("s2".into()), record("u2"))
        .await
        .unwrap();
    for (session, id) in [("s1", "m1"), ("s2", "m2")] {
        db_session(&db, session)
            .append(text(id, "user", "walrus facts"), AppendOptions::default())
            .await
            .unwrap();
    }
    db.session_in("elsewhere", "s1")
        .unwrap()
        .append(text("m3", "user", "walrus facts"), AppendOptions::default())
        .await
        .unwrap();
    let mut hits: Vec<(String, String)> = db
        .search_all("", None, "walrus", 10)
        .await
        .unwrap()
        .into_iter()
        .map(|h| (h.session_id, h.id))
        .collect();
    hits.sort();
    assert_eq!(
        hits,
        [("s1".into(), "m1".into()), ("s2".into(), "m2".into())]
    );
    let only_u2 = db.search_all("", Some("u2"), "walrus", 10).await.unwrap();
    assert_eq!(only_u2.len(), 1);
    assert_eq!(only_u2[0].id, "m2");
    assert!(
        db.search_all("", None, "\"* OR", 10)
            .await
            .unwrap()
            .is_empty()
    );
}

pub async fn resumed_subscriptions_replay_retained_events<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    let mut live = db.subscribe(FeedFilter::All);
    chain(&s, &["a", "b", "c"]).await;
    let positions: Vec<u64> = drain(&mut live)
        .into_iter()
        .filter_map(|i| match i {
            sessiondb::FeedItem::Event(e) => Some(e.position),
            _ => None,
        })
        .collect();
    let mut resumed = db
        .store()
        .subscribe_after(FeedFilter::Session(s.key().clone()), positions[0])
        .await
        .unwrap();
    let replayed = drain(&mut resumed);
    assert_eq!(event_names(&replayed), ["append", "append"]);
    assert!(
        db.store()
            .subscribe_after(FeedFilter::All, positions[2] + 10)
            .await
            .is_none()
    );
}

pub async fn export_reimports_into_an_equal_session<S: Store>(db: Db<S>) {
    use futures::TryStreamExt;
    let s = db_session(&db, "s");
    chain(&s, &["a", "b", "c"]).await;
    s.append(text("x", "assistant", "branch"), under("a"))
        .await
        .unwrap();
    s.update(text("b", "assistant", "edited"), sessiondb::Source::Server)
        .await
        .unwrap();
    s.add_compaction("sum".into(), "a".into(), "b".into())
        .await
        .unwrap();
    s.set_state("k", &json!({"v": 1})).await.unwrap();
    let lines: Vec<String> = s.export().try_collect().await.unwrap();
    assert_eq!(lines.len(), 1 + 4 + 1 + 1);
    assert!(
        lines[0].starts_with(r#"{"session":{"id":"s","#),
        "{}",
        lines[0]
    );
    let document = lines.concat();

    let copy = db_session(&db, "copy");
    let parsed = sessiondb::parse_import(&document).unwrap();
    let summary = copy.import_lines(parsed.clone()).await.unwrap();
    assert_eq!((summary.imported, summary.skipped), (6, 0));
    for id in ["a", "b", "c", "x"] {
        let (orig, new) = (
            s.message(id).await.unwrap().unwrap(),
            copy.message(id).await.unwrap().unwrap(),
        );
        assert_eq!(
            (orig.json(), &orig.parent_id),
            (new.json(), &new.parent_id),
            "{id}"
        );
    }
    assert_eq!(
        copy.compactions().await.unwrap(),
        s.compactions().await.unwrap()
    );
    assert_eq!(copy.state("k").await.unwrap(), Some(json!({"v": 1})));
    assert_eq!(history_ids(&copy, None).await, history_ids(&s, None).await);
    let again = copy.import_lines(parsed).await.unwrap();
    assert_eq!(
        (again.imported, again.skipped),
        (1, 5),
        "state is set again, the rest exists"
    );

    let bad = format!(
        "{}\n{{\"message\": {{\"id\": \"z\"}}}}\n",
        lines[1].trim_end()
    );
    let err = sessiondb::parse_import(&bad).unwrap_err();
    assert_eq!(err.field, "lines[1].message.role");
    assert!(sessiondb::parse_import("{\"other\": 1}").is_err());
    assert!(sessiondb::parse_import("[1]").is_err());
}

/// An export carries the session's record: a session the import creates gets it with the
/// original creation time (so a store moves session by session, users and settings included);
/// a session that exists keeps its own. A bad or second session line writes nothing.
pub async fn export_carries_the_session_record_to_a_new_session<S: Store>(db: Db<S>) {
    use futures::TryStreamExt;
    let record = SessionRecord {
        name: Some("Support".into()),
        parent_session_id: Some("earlier".into()),
        model: Some("m-1".into()),
        source: Some("web".into()),
        user_id: Some("u1".into()),
        metadata: object(json!({"plan": "pro", "tags": ["a"]})),
        settings: object(json!({"compactAfter": 5000})),
        ..Default::default()
    };
    let original = db
        .create_session("", Some("orig".into()), record.clone())
        .await
        .unwrap();
    let s = db_session(&db, "orig");
    let usage = Usage {
        input_tokens: 7,
        output_tokens: 9,
        cost: 0.25,
    };
    s.add_usage(usage).await.unwrap();
    let patch = SessionPatch {
        end_reason: Some("done".into()),
        ..Default::default()
    };
    s.patch(patch).await.unwrap();
    chain(&s, &["a", "b"]).await;
    let original = s
        .info()
        .await
        .unwrap()
        .map(|info| (info, original.created_at));
    let (original, created_at) = original.unwrap();
    let document: String = s
        .export()
        .try_collect::<Vec<String>>()
        .await
        .unwrap()
        .concat();
    // The copy is created later: only a kept creation time makes the two equal.
    std::thread::sleep(std::time::Duration::from_millis(5));

    let moved = db_session(&db, "moved");
    let summary = moved
        .import_lines(sessiondb::parse_import(&document).unwrap())
        .await
        .unwrap();
    assert_eq!((summary.imported, summary.skipped), (2, 0));
    let copy = moved.info().await.unwrap().unwrap();
    assert_eq!(copy.record, original.record);
    assert_eq!(copy.created_at, created_at);
    assert_eq!(copy.stats.message_count, 2);
    let listing = SessionListing {
        user_id: Some("u1".into()),
        ..Default::default()
    };
    let mut owned: Vec<String> = db
        .list_sessions("", &listing)
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|info| info.id)
        .collect();
    owned.sort();
    assert_eq!(owned, ["moved", "orig"]);

    let kept = db
        .create_session("", Some("kept".into()), SessionRecord::default())
        .await
        .unwrap();
    let existing = db_session(&db, "kept");
    existing
        .import_lines(sessiondb::parse_import(&document).unwrap())
        .await
        .unwrap();
    let after = existing.info().await.unwrap().unwrap();
    assert_eq!(
        (after.record, after.created_at, after.stats.message_count),
        (SessionRecord::default(), kept.created_at, 2)
    );

    let session_line = document.lines().next().unwrap();
    let twice = format!("{session_line}\n{session_line}\n");
    let bad_settings = session_line.replace("compactAfter", "compactLater");
    for (bad, field) in [
        (twice.as_str(), "lines[1]"),
        (
            bad_settings.as_str(),
            "lines[0].session.settings.compactLater",
        ),
    ] {
        let nothing = db_session(&db, "nothing");
        let err = nothing
            .import_lines(sessiondb::parse_import(bad).unwrap())
            .await
            .unwrap_err();
        match err {
            Error::Invalid(e) => assert_eq!(e.field, field),
            other => panic!("{other:?}"),
        }
        assert!(nothing.info().await.unwrap().is_none(), "{field}");
    }
    for (bad, field) in [
        (
            session_line.replace("\"cost\":0.25", "\"cost\":-1"),
            "lines[0].session.cost",
        ),
        (
            session_line.replace("\"inputTokens\":7", "\"inputTokens\":9223372036854775808"),
            "lines[0].session.inputTokens",
        ),
    ] {
        assert_eq!(sessiondb::parse_import(&bad).unwrap_err().field, field);
    }
}
