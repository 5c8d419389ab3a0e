//! Updates, upserts, imports, deletes and clears.

use futures::TryStreamExt;
use serde_json::json;
use sessiondb::{
    AppendOptions, Compaction, Db, Error, FeedFilter, FeedItem, HistoryOptions, ImportLine,
    ImportPart, Message, SessionPatch, Source, Store, StoreError, ValidationErrorKind,
    WriteCondition,
};

use crate::*;

pub async fn update_replaces_body_and_keeps_position<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    chain(&s, &["a", "b", "c"]).await;
    let before = s.message("b").await.unwrap().unwrap();
    let updated = s
        .update(text("b", "assistant", "rewritten"), Source::Server)
        .await
        .unwrap()
        .unwrap();
    assert!(updated.json().contains("rewritten"));
    assert_eq!(
        (updated.seq, updated.created_at),
        (before.seq, before.created_at)
    );
    assert_eq!(updated.parent_id.as_deref(), Some("a"));
    assert!(updated.updated_at.is_some());
    assert_eq!(s.message("b").await.unwrap().unwrap(), updated);
    assert_eq!(history_ids(&s, None).await, ["a", "b", "c"]);
}

pub async fn update_of_unknown_id_creates_nothing<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    chain(&s, &["a"]).await;
    assert_eq!(
        s.update(text("nope", "user", "x"), Source::Server)
            .await
            .unwrap(),
        None
    );
    assert!(s.message("nope").await.unwrap().is_none());
    assert_eq!(s.stats().await.unwrap().stored_messages, 1);
}

pub async fn identical_update_writes_and_emits_nothing<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    chain(&s, &["a"]).await;
    let stored = s.message("a").await.unwrap().unwrap();
    let mut sub = db.subscribe(FeedFilter::All);
    let same = s
        .update(stored.to_message(), Source::Server)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(same, stored);
    assert_eq!(s.message("a").await.unwrap().unwrap().updated_at, None);
    assert!(drain(&mut sub).is_empty());
}

pub async fn update_needs_an_id<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    let err = s
        .update(Message::text("user", "x"), Source::Server)
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::Invalid(e) if e.field == "id" && e.kind == ValidationErrorKind::Missing)
    );
}

pub async fn update_can_change_the_role<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    chain(&s, &["a"]).await;
    s.update(text("a", "system", "message a"), Source::Server)
        .await
        .unwrap();
    let rows = s.row_stats(None).await.unwrap();
    assert_eq!(rows[0].role, "system");
    assert_eq!(s.message("a").await.unwrap().unwrap().role, "system");
}

pub async fn upsert_appends_when_missing_and_updates_when_present<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    chain(&s, &["a"]).await;
    let r = s
        .upsert(text("b", "user", "new"), AppendOptions::default())
        .await
        .unwrap();
    assert!(r.inserted);
    assert_eq!(r.message.parent_id.as_deref(), Some("a"));
    let r = s
        .upsert(text("a", "user", "edited"), under("b"))
        .await
        .unwrap();
    assert!(!r.inserted);
    assert!(r.message.json().contains("edited"));
    assert_eq!(
        r.message.parent_id, None,
        "an upsert that updates never moves the message"
    );
    assert_eq!(history_ids(&s, None).await, ["a", "b"]);
}

pub async fn import_is_verbatim_with_explicit_parent_and_time<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    let m1 = Message::from_value(json!({"id": "i1", "role": "user", "content": "old",
        "parts": [{"type": "text", "text": "t", "providerMetadata": {"openai": {"itemId": "x"}}}]}))
    .unwrap();
    let first = s.import(m1, imported(None, 1000)).await.unwrap().unwrap();
    assert_eq!(first.created_at, 1000);
    assert!(first.json().contains("itemId"), "imports are not sanitised");
    let second = s
        .import(text("i2", "assistant", "reply"), imported(Some("i1"), 2000))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((first.seq, second.seq), (1, 2));
    assert_eq!(s.latest_leaf().await.unwrap().unwrap().id, "i2");
    assert_eq!(history_ids(&s, None).await, ["i1", "i2"]);
    assert_eq!(second.parent_id.as_deref(), Some("i1"));

    // A time no JSON client reads exactly, or before 1970, is refused and stores nothing.
    let out_of_range = |err: &Error, field: &str| {
        matches!(err, Error::Invalid(e) if e.field == field
            && matches!(e.kind, ValidationErrorKind::OutOfRange { min: 0, max: 8_640_000_000_000_000 }))
    };
    for time in [-1, 8_640_000_000_000_001, i64::MAX] {
        let err = s
            .import(text("i3", "user", "late"), imported(None, time))
            .await
            .unwrap_err();
        assert!(out_of_range(&err, "createdAt"), "{err}");
    }
    let lines = vec![
        ImportLine::Message {
            message: text("i4", "user", "kept out"),
            parent_id: None,
            created_at: Some(7),
            updated_at: None,
            replace: false,
        },
        ImportLine::Compaction(Compaction {
            id: "c".into(),
            summary: "s".into(),
            from_message_id: "i1".into(),
            to_message_id: "i2".into(),
            created_at: 1 << 62,
        }),
    ];
    let err = s.import_lines(lines).await.unwrap_err();
    assert!(out_of_range(&err, "lines[1].compaction.createdAt"), "{err}");
    assert_eq!(history_ids(&s, None).await, ["i1", "i2"], "nothing stored");
    assert!(s.compactions().await.unwrap().is_empty());
}

pub async fn import_of_existing_id_is_ignored<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    let mut sub = db.subscribe(FeedFilter::All);
    let opts = imported(None, 5);
    assert!(
        s.import(text("i", "user", "first"), opts.clone())
            .await
            .unwrap()
            .is_some()
    );
    assert!(
        s.import(text("i", "user", "second"), opts)
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        s.message("i")
            .await
            .unwrap()
            .unwrap()
            .json()
            .contains("first")
    );
    assert_eq!(event_names(&drain(&mut sub)), ["import"]);
}

/// An import line with `replace` rewrites the stored message of its id as an update does
/// (parent, seq and createdAt stay; an unchanged body writes nothing and counts as skipped), and
/// imports a message the session lacks as any line does. A refused import replaces nothing.
pub async fn import_may_replace_a_stored_message<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    chain(&s, &["a", "b"]).await;
    let before = s.message("a").await.unwrap().unwrap();
    let mut sub = db.subscribe(FeedFilter::All);
    let replacing = |message: Message, parent: &str| ImportLine::Message {
        message,
        parent_id: Some(parent.to_owned()),
        created_at: Some(5),
        updated_at: None,
        replace: true,
    };
    let summary = s
        .import_lines(vec![
            replacing(text("a", "user", "a again"), "b"),
            replacing(text("b", "assistant", "message b"), "a"),
            replacing(text("c", "user", "new c"), "b"),
        ])
        .await
        .unwrap();
    assert_eq!((summary.imported, summary.skipped), (2, 1));
    assert_eq!(event_names(&drain(&mut sub)), ["update", "import"]);
    let after = s.message("a").await.unwrap().unwrap();
    assert!(after.json().contains("a again"), "{}", after.json());
    assert_eq!(
        (after.seq, &after.parent_id, after.created_at),
        (before.seq, &before.parent_id, before.created_at),
        "the stored message keeps its place and time"
    );
    assert_eq!(history_ids(&s, None).await, ["a", "b", "c"]);
    assert_eq!(s.message("c").await.unwrap().unwrap().created_at, 5);

    // A refusal later in the same write (two lines that would loop) leaves the replaced
    // message as it was.
    let refused = s
        .import_lines(vec![
            replacing(text("a", "user", "a once more"), "b"),
            replacing(text("p", "user", "p"), "q"),
            replacing(text("q", "user", "q"), "p"),
        ])
        .await;
    assert!(
        matches!(refused, Err(Error::Store(StoreError::ParentCycle { .. }))),
        "{refused:?}"
    );
    assert!(
        s.message("a")
            .await
            .unwrap()
            .unwrap()
            .json()
            .contains("a again")
    );
    assert!(drain(&mut sub).is_empty());
}

pub async fn import_under_a_missing_parent_keeps_the_link<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    s.import(text("child", "user", "c"), imported(Some("later"), 2))
        .await
        .unwrap();
    assert_eq!(history_ids(&s, None).await, ["child"]);
    s.import(text("later", "user", "p"), imported(None, 1))
        .await
        .unwrap();
    assert_eq!(history_ids(&s, Some("child")).await, ["later", "child"]);
}

/// An import into several sessions lands whole or not at all: a later part's refusal (a
/// leaf condition, a missing session, a loop) leaves the earlier parts unwritten too.
pub async fn imports_together_land_all_or_none<S: Store>(db: Db<S>) {
    let (a, b) = (db_session(&db, "a"), db_session(&db, "b"));
    chain(&a, &["x"]).await;
    let message = |id: &str, parent: &str| ImportLine::Message {
        message: text(id, "user", id),
        parent_id: Some(parent.to_owned()),
        created_at: None,
        updated_at: None,
        replace: false,
    };
    let state = |key: &str, value: i64| ImportLine::State {
        key: key.into(),
        value: json!(value),
    };
    let part = |id: &str, if_leaf: Option<Option<&str>>, lines: Vec<ImportLine>| ImportPart {
        session_id: id.into(),
        lines: lines.into(),
        condition: if_leaf.map(|leaf| WriteCondition::Leaf(leaf.map(str::to_owned))),
    };
    let new = |id: &str, lines: Vec<ImportLine>| ImportPart {
        session_id: id.into(),
        lines: lines.into(),
        condition: Some(WriteCondition::Absent),
    };
    let mut sub = db.subscribe(FeedFilter::All);
    let summaries = db
        .import_together(
            "",
            vec![
                part("a", Some(Some("x")), vec![message("y", "x"), state("k", 1)]),
                part("b", None, vec![state("z", 2), message("n", "none")]),
                part("a", None, vec![message("y", "x"), message("w", "y")]),
            ],
        )
        .await
        .unwrap();
    let counts: Vec<_> = summaries.iter().map(|s| (s.imported, s.skipped)).collect();
    assert_eq!(counts, [(2, 0), (2, 0), (1, 1)]);
    assert_eq!(history_ids(&a, None).await, ["x", "y", "w"]);
    assert_eq!(history_ids(&b, None).await, ["n"]);
    assert_eq!(a.state("k").await.unwrap(), Some(json!(1)));
    assert_eq!(b.state("z").await.unwrap(), Some(json!(2)));
    let mut sessions: Vec<String> = drain(&mut sub)
        .into_iter()
        .filter_map(|item| match item {
            FeedItem::Event(e) => Some(e.key.session_id.clone()),
            FeedItem::Lagged { .. } => None,
        })
        .collect();
    sessions.dedup();
    assert_eq!(sessions, ["a", "b", "a"], "events in the parts' order");

    // Each refusal comes from the last part, names it and leaves the first one unwritten.
    let refusals = [
        part("a", Some(Some("x")), vec![state("z", 9)]),
        part("missing", Some(None), vec![state("z", 9)]),
        new("a", vec![state("z", 9)]),
        part("b", None, vec![message("p", "q"), message("q", "p")]),
    ];
    for refused in refusals {
        let refused_session = refused.session_id.clone();
        let written = db
            .import_together(
                "",
                vec![
                    part("b", None, vec![state("z", 9), message("m", "m0")]),
                    refused,
                ],
            )
            .await;
        let Err(Error::InPart {
            part: 1,
            session_id,
            error,
        }) = &written
        else {
            panic!("the second part's refusal, got {written:?}");
        };
        assert_eq!(session_id, &refused_session);
        assert!(
            matches!(
                **error,
                Error::Store(
                    StoreError::LeafMoved { .. }
                        | StoreError::NoSession
                        | StoreError::SessionExists
                        | StoreError::ParentCycle { .. }
                )
            ),
            "{error:?}"
        );
        assert_eq!(b.state("z").await.unwrap(), Some(json!(2)));
        assert!(b.message("m").await.unwrap().is_none());
        assert!(
            drain(&mut sub).is_empty(),
            "a refused write publishes nothing"
        );
    }
    assert!(
        db.session("missing")
            .unwrap()
            .info()
            .await
            .unwrap()
            .is_none()
    );
    // A part's bad line names the part; nothing is written.
    let bad = db
        .import_together(
            "",
            vec![
                part("b", None, vec![state("z", 9)]),
                part("b", None, vec![state("", 1)]),
            ],
        )
        .await;
    assert!(
        matches!(&bad, Err(Error::Invalid(e)) if e.field == "parts[1].lines[0].state.key"),
        "{bad:?}"
    );
    assert_eq!(b.state("z").await.unwrap(), Some(json!(2)));
    assert!(db.import_together("", Vec::new()).await.unwrap().is_empty());
    // A part on a session that must not exist yet creates it with its first contents.
    db.import_together(
        "",
        vec![new("c", vec![state("z", 1), message("c1", "none")])],
    )
    .await
    .unwrap();
    assert_eq!(history_ids(&db_session(&db, "c"), None).await, ["c1"]);
    // A lone part (written as an ordinary write) is named in its refusal too.
    let again = db
        .import_together("", vec![new("c", vec![state("z", 2)])])
        .await;
    assert!(
        matches!(&again, Err(Error::InPart { part: 0, session_id, error })
            if session_id == "c" && matches!(**error, Error::Store(StoreError::SessionExists))),
        "{again:?}"
    );
}

/// Every refusal of an import line names it as the document numbers it (0-based, blank lines
/// counted), whichever check refuses it: parsing or planning the write.
pub async fn import_errors_name_the_documents_lines<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    fn field_of<T: std::fmt::Debug>(result: Result<T, Error>) -> String {
        match result {
            Err(Error::Invalid(e)) => e.field,
            other => panic!("expected a refusal: {other:?}"),
        }
    }
    let message = r#"{"message": {"id": "m", "role": "user", "content": "hi"}}"#;
    let refusals = [
        (r#"{"state": {"key": "", "value": 1}}"#, "state.key"),
        (
            r#"{"compaction": {"id": "c", "summary": "a\u0000", "fromMessageId": "m", "toMessageId": "m", "createdAt": 1}}"#,
            "compaction.summary",
        ),
        (
            r#"{"entry": {"label": "nowhere", "key": "k", "content": "x"}}"#,
            "entry.label",
        ),
        (
            r#"{"block": {"label": "b", "kind": "skill", "content": "x"}}"#,
            "block.content",
        ),
        (
            r#"{"message": {"role": "user", "content": 5}}"#,
            "message.content",
        ),
    ];
    for (line, field) in refusals {
        let document = format!("{message}\n\n{line}\n");
        let err = match sessiondb::parse_import(&document) {
            Ok(lines) => field_of(s.import_lines(lines).await),
            Err(e) => e.field,
        };
        assert_eq!(err, format!("lines[2].{field}"), "{line}");
        let parts = format!("{{\"into\": {{\"sessionId\": \"t\"}}}}\n{document}");
        let err = match sessiondb::parse_import_parts(&parts) {
            Ok(parts) => field_of(db.import_together("", parts).await),
            Err(e) => e.field,
        };
        assert_eq!(err, format!("parts[0].lines[3].{field}"), "{line}");
    }
    assert!(s.info().await.unwrap().is_none(), "nothing written");
    assert!(db_session(&db, "t").info().await.unwrap().is_none());
}

pub async fn import_that_would_loop_is_refused<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    s.import(text("a", "user", "a"), imported(Some("b"), 1))
        .await
        .unwrap();
    let err = s
        .import(text("b", "user", "b"), imported(Some("a"), 2))
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::Store(StoreError::ParentCycle { .. })),
        "{err}"
    );
    assert!(s.message("b").await.unwrap().is_none());
    let self_parent = s
        .import(text("c", "user", "c"), imported(Some("c"), 3))
        .await;
    assert!(self_parent.is_err());
    assert_eq!(s.stats().await.unwrap().stored_messages, 1);
}

pub async fn delete_splices_children_onto_the_survivor<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    chain(&s, &["s1", "s2", "s3"]).await;
    assert_eq!(s.delete(&["s2".into()]).await.unwrap(), 1);
    assert_eq!(history_ids(&s, None).await, ["s1", "s3"]);
    s.delete(&["s3".into()]).await.unwrap();
    assert_eq!(history_ids(&s, None).await, ["s1"]);
    assert_eq!(s.latest_leaf().await.unwrap().unwrap().id, "s1");
}

pub async fn bulk_delete_rewires_the_boundary_child<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    chain(&s, &["root", "l1", "l2", "l3", "left-leaf"]).await;
    s.append(text("right", "user", "r"), under("root"))
        .await
        .unwrap();
    let n = s
        .delete(&["l1".into(), "l2".into(), "l3".into()])
        .await
        .unwrap();
    assert_eq!(n, 3);
    assert_eq!(
        history_ids(&s, Some("left-leaf")).await,
        ["root", "left-leaf"]
    );
    assert_eq!(history_ids(&s, Some("right")).await, ["root", "right"]);
    s.delete(&["root".into()]).await.unwrap();
    assert_eq!(history_ids(&s, Some("right")).await, ["right"]);
    assert_eq!(history_ids(&s, Some("left-leaf")).await, ["left-leaf"]);
}

pub async fn deleting_the_leaf_moves_it_to_the_newest_survivor<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    chain(&s, &["a", "b"]).await;
    s.append(text("c", "user", "other branch"), under("a"))
        .await
        .unwrap();
    s.delete(&["c".into()]).await.unwrap();
    assert_eq!(s.latest_leaf().await.unwrap().unwrap().id, "b");
    assert_eq!(history_ids(&s, None).await, ["a", "b"]);
    assert_eq!(s.stats().await.unwrap().message_count, 2);
}

pub async fn delete_of_unknown_or_repeated_ids_counts_what_existed<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    chain(&s, &["a", "b"]).await;
    let mut sub = db.subscribe(FeedFilter::All);
    assert_eq!(s.delete(&[]).await.unwrap(), 0);
    assert_eq!(s.delete(&["zz".into()]).await.unwrap(), 0);
    assert_eq!(
        s.delete(&["b".into(), "b".into(), "zz".into()])
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        event_names(&drain(&mut sub)),
        ["delete", "delete", "delete"]
    );
    assert_eq!(history_ids(&s, None).await, ["a"]);
}

pub async fn clear_empties_the_session_and_keeps_it_usable<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    chain(&s, &["a", "b"]).await;
    s.clear().await.unwrap();
    assert!(history_ids(&s, None).await.is_empty());
    assert!(s.latest_leaf().await.unwrap().is_none());
    assert!(s.message("a").await.unwrap().is_none());
    let stats = s.stats().await.unwrap();
    assert_eq!(
        (
            stats.message_count,
            stats.token_estimate,
            stats.stored_messages
        ),
        (0, 0, 0)
    );
    chain(&s, &["c"]).await;
    assert_eq!(s.message("c").await.unwrap().unwrap().parent_id, None);
    let other = db_session(&db, "other");
    other.clear().await.unwrap();
    assert!(history_ids(&other, None).await.is_empty());
}

pub async fn reserved_metadata_is_stripped_only_from_client_writes<S: Store>(db: Db<S>) {
    let db = db.reconfigured(sessiondb::Options {
        reserved_metadata_keys: vec!["billing".to_owned()],
        ..Default::default()
    });
    let s = db_session(&db, "s");
    let meta = |id: &str| {
        Message::from_value(json!({"id": id, "role": "user", "content": "x",
            "metadata": {"billing": 1, "keep": 2}}))
        .unwrap()
    };
    let client = AppendOptions {
        source: Source::Client,
        ..Default::default()
    };
    let a = s.append(meta("a"), client.clone()).await.unwrap().message;
    assert_eq!(a.to_value()["metadata"], json!({"keep": 2}));
    let b = s
        .append(meta("b"), AppendOptions::default())
        .await
        .unwrap()
        .message;
    assert_eq!(b.to_value()["metadata"], json!({"billing": 1, "keep": 2}));
    let b = s.update(meta("b"), Source::Client).await.unwrap().unwrap();
    assert_eq!(b.to_value()["metadata"], json!({"keep": 2}));
}

pub async fn provider_metadata_is_sanitised_on_append<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    let m = Message::from_value(json!({"id": "m", "role": "assistant", "parts": [
        {"type": "reasoning", "text": " "},
        {"type": "text", "text": "ok", "providerMetadata": {"openai": {"itemId": "i", "reasoningEncryptedContent": "e"}}}
    ]}))
    .unwrap();
    let stored = s.append(m, AppendOptions::default()).await.unwrap().message;
    assert_eq!(
        stored.to_value()["parts"],
        json!([{"type": "text", "text": "ok"}])
    );
}

pub async fn stats_track_every_kind_of_write<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    async fn check<S: Store>(s: &sessiondb::Session<S>) {
        let rows = s.row_stats(None).await.unwrap();
        let stats = s.stats().await.unwrap();
        assert_eq!(stats.message_count as usize, rows.len());
        assert_eq!(
            stats.token_estimate,
            rows.iter().map(|r| r.token_estimate).sum::<u64>()
        );
        assert_eq!(
            stats.content_bytes,
            rows.iter().map(|r| r.bytes).sum::<u64>()
        );
        assert_eq!(stats.leaf_id, rows.last().map(|r| r.id.clone()));
    }
    chain(&s, &["a", "b", "c"]).await;
    check(&s).await;
    s.update(text("c", "user", &"long ".repeat(100)), Source::Server)
        .await
        .unwrap();
    check(&s).await;
    s.update(text("a", "user", &"longer ".repeat(100)), Source::Server)
        .await
        .unwrap();
    check(&s).await;
    s.append(text("x", "user", "branch"), under("a"))
        .await
        .unwrap();
    check(&s).await;
    s.append(text("y", "user", "new root"), root())
        .await
        .unwrap();
    check(&s).await;
    s.delete(&["y".into()]).await.unwrap();
    check(&s).await;
    s.import(text("z", "user", "imp"), imported(Some("b"), 1))
        .await
        .unwrap();
    check(&s).await;
    assert_eq!(s.stats().await.unwrap().message_count, 3);
    s.clear().await.unwrap();
    check(&s).await;
}

pub async fn custom_token_counter_is_stamped<S: Store>(db: Db<S>) {
    #[derive(Debug)]
    struct Fixed;
    impl sessiondb::TokenCounter for Fixed {
        fn count_message(&self, _: &serde_json::Map<String, serde_json::Value>) -> u64 {
            1000
        }
    }
    let options = sessiondb::Options {
        token_counter: std::sync::Arc::new(Fixed),
        ..Default::default()
    };
    let db = db.reconfigured(options);
    let s = db_session(&db, "s");
    chain(&s, &["a", "b"]).await;
    assert_eq!(s.stats().await.unwrap().token_estimate, 2000);
    assert!(
        s.row_stats(None)
            .await
            .unwrap()
            .iter()
            .all(|r| r.token_estimate == 1000)
    );
}

pub async fn appends_can_never_close_a_loop_through_orphans<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    // `orphan` waits for a parent `p` that does not exist yet; appending `p` under the leaf
    // (`orphan` itself) would make p → orphan → p.
    s.import(text("orphan", "user", "o"), imported(Some("p"), 1))
        .await
        .unwrap();
    let p = s
        .append(text("p", "user", "p"), AppendOptions::default())
        .await
        .unwrap()
        .message;
    assert_eq!(
        p.parent_id, None,
        "a looping parent is treated like an unknown one"
    );
    assert_eq!(history_ids(&s, Some("orphan")).await, ["p", "orphan"]);
    assert_eq!(history_ids(&s, None).await, ["p"]);
}

pub async fn message_quota_refuses_the_whole_request<S: Store>(db: Db<S>) {
    let db = db.reconfigured(sessiondb::Options {
        max_messages_per_session: Some(3),
        ..Default::default()
    });
    let s = db_session(&db, "s");
    chain(&s, &["a", "b"]).await;
    let batch = vec![text("c", "user", "c"), text("d", "user", "d")];
    let err = s
        .append_all(batch, AppendOptions::default())
        .await
        .unwrap_err();
    assert!(matches!(err, sessiondb::Error::QuotaExceeded { limit: 3 }));
    assert_eq!(
        history_ids(&s, None).await,
        ["a", "b"],
        "nothing of the batch stored"
    );
    chain(&s, &["c"]).await;
    assert!(
        s.append(text("d", "user", "d"), AppendOptions::default())
            .await
            .is_err()
    );
    // Re-appending an existing id stores nothing, so it is not refused.
    let again = s
        .append(text("c", "user", "c"), AppendOptions::default())
        .await
        .unwrap();
    assert!(!again.inserted);
    // Other sessions have their own count.
    chain(&db_session(&db, "t"), &["a"]).await;
}

/// Writes conditioned on the session's active leaf apply only while it is that leaf, checked
/// in the transaction that writes: of two writers that read the same leaf, one lands.
pub async fn writes_conditioned_on_the_leaf_apply_only_there<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    let expecting = |leaf: Option<&str>| AppendOptions {
        condition: Some(WriteCondition::Leaf(leaf.map(str::to_owned))),
        ..Default::default()
    };
    let refusal = |err: Error| match err {
        Error::Store(store) => store,
        other => panic!("{other:?}"),
    };
    // A session that does not exist has no leaf to match, and is not created.
    let missing = s.append(text("a", "user", "hi"), expecting(None)).await;
    assert!(matches!(
        refusal(missing.unwrap_err()),
        StoreError::NoSession
    ));
    assert!(s.info().await.unwrap().is_none());
    db.create_session("", Some("s".into()), Default::default())
        .await
        .unwrap();
    s.append(text("a", "user", "hi"), expecting(None))
        .await
        .unwrap();
    s.append(text("b", "assistant", "yo"), expecting(Some("a")))
        .await
        .unwrap();

    let mut sub = db.subscribe(FeedFilter::All);
    let stale = s
        .append(text("c", "user", "late"), expecting(Some("a")))
        .await;
    let moved = refusal(stale.unwrap_err());
    assert!(
        matches!(&moved, StoreError::LeafMoved { expected, found }
            if expected.as_deref() == Some("a") && found.as_deref() == Some("b")),
        "{moved:?}"
    );
    assert_eq!(
        moved.to_string(),
        "the session's active leaf is `b`, not `a`"
    );
    let batch = vec![text("c", "user", "q"), text("d", "assistant", "r")];
    let refused = s.append_all(batch.clone(), expecting(None)).await;
    assert!(matches!(
        refusal(refused.unwrap_err()),
        StoreError::LeafMoved { .. }
    ));
    let line = ImportLine::State {
        key: "k".into(),
        value: json!(1),
    };
    let refused = s
        .import_lines_if_leaf(vec![line.clone()], Some(Some("a".into())))
        .await;
    assert!(matches!(
        refusal(refused.unwrap_err()),
        StoreError::LeafMoved { .. }
    ));
    assert_eq!(history_ids(&s, None).await, ["a", "b"]);
    assert_eq!(s.state("k").await.unwrap(), None);
    assert!(
        drain(&mut sub).is_empty(),
        "a refused write publishes nothing"
    );

    s.append_all(batch, expecting(Some("b"))).await.unwrap();
    s.import_lines_if_leaf(vec![line], Some(Some("d".into())))
        .await
        .unwrap();
    assert_eq!(history_ids(&s, None).await, ["a", "b", "c", "d"]);
    assert_eq!(s.state("k").await.unwrap(), Some(json!(1)));

    // Writers racing from the same leaf: exactly one lands, however the store groups them.
    let start = std::sync::Arc::new(std::sync::Barrier::new(8));
    let racers: Vec<_> = (0..8)
        .map(|i| {
            let (s, start) = (s.clone(), start.clone());
            std::thread::spawn(move || {
                let reply = text(&format!("r{i}"), "assistant", "mine");
                start.wait();
                block_on(s.append(reply, expecting(Some("d"))))
            })
        })
        .collect();
    let mut landed = Vec::new();
    for racer in racers {
        match racer.join().unwrap() {
            Ok(appended) => landed.push(appended.message.id.to_string()),
            Err(err) => assert!(matches!(refusal(err), StoreError::LeafMoved { .. })),
        }
    }
    assert_eq!(landed.len(), 1, "{landed:?}");
    assert_eq!(
        history_ids(&s, None).await,
        ["a", "b", "c", "d", &landed[0]]
    );
}

/// A session's version moves with every write that changes it, and only then; a write
/// conditioned on it applies only while nothing changed the session since, checked in the
/// transaction that writes; and a versioned history read reports the version it read at.
pub async fn versions_move_with_every_change_and_condition_writes<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    let version = || async { s.stats().await.unwrap().version };
    let at = |version: i64| AppendOptions {
        condition: Some(WriteCondition::Version(version)),
        ..Default::default()
    };
    let refusal = |err: Error| match err {
        Error::Store(store) => store,
        other => panic!("{other:?}"),
    };
    assert_eq!(version().await, 0, "a session that does not exist");
    let absent = s.append(text("a", "user", "hi"), at(0)).await;
    assert!(matches!(
        refusal(absent.unwrap_err()),
        StoreError::NoSession
    ));
    assert!(s.info().await.unwrap().is_none());

    let first = s
        .append(text("a", "user", "hi"), AppendOptions::default())
        .await
        .unwrap();
    let mut seen = first.version.expect("a written session has a version");
    assert_eq!(version().await, seen);
    assert_eq!(s.info().await.unwrap().unwrap().stats.version, seen);

    // Each change moves it past every version before; reads and writes that change nothing
    // leave it.
    fn moved(seen: &mut i64, now: i64, what: &str) {
        assert!(now > *seen, "{what}: {now} after {seen}");
        *seen = now;
    }
    let again = s
        .append(text("a", "user", "hi"), AppendOptions::default())
        .await
        .unwrap();
    assert!(!again.inserted);
    assert_eq!(again.version, Some(seen), "an append of an existing id");
    history_ids(&s, None).await;
    s.update(text("a", "user", "hi"), Source::Client)
        .await
        .unwrap();
    assert_eq!(version().await, seen, "an update that changes nothing");
    let reply = s
        .append_all(
            vec![text("b", "assistant", "yo"), text("c", "user", "more")],
            at(seen),
        )
        .await
        .unwrap();
    assert!(reply.iter().all(|r| r.version == reply[0].version));
    moved(&mut seen, reply[0].version.unwrap(), "a conditioned batch");
    s.update(text("b", "assistant", "yo!"), Source::Client)
        .await
        .unwrap();
    moved(&mut seen, version().await, "an update");
    s.add_compaction("summary".into(), "a".into(), "b".into())
        .await
        .unwrap();
    moved(&mut seen, version().await, "a compaction");
    s.patch(SessionPatch {
        name: Some("named".into()),
        ..Default::default()
    })
    .await
    .unwrap();
    moved(&mut seen, version().await, "a patch of the record");
    s.delete(&["c".to_owned()]).await.unwrap();
    moved(&mut seen, version().await, "a delete");

    // A write at a version the session has moved past writes nothing and publishes nothing.
    let mut sub = db.subscribe(FeedFilter::All);
    let stale = s.append(text("d", "user", "late"), at(seen - 1)).await;
    let refused = refusal(stale.unwrap_err());
    assert!(
        matches!(refused, StoreError::VersionMoved { expected, found }
            if expected == seen - 1 && found == seen),
        "{refused:?}"
    );
    assert!(s.message("d").await.unwrap().is_none());
    assert!(
        drain(&mut sub).is_empty(),
        "a refused write publishes nothing"
    );
    assert_eq!(version().await, seen);

    // A versioned read reports the version it read at, and the path as of it.
    let (read_at, messages) = s
        .versioned_history(HistoryOptions::default())
        .await
        .unwrap();
    let messages: Vec<_> = messages.try_collect().await.unwrap();
    assert_eq!(read_at, seen);
    let full = s.full_history(HistoryOptions::default()).await.unwrap();
    assert_eq!(messages, full, "summaries too are as created");
    assert!(
        messages[0].json().contains("summary"),
        "with the compaction's overlay"
    );

    s.clear().await.unwrap();
    moved(&mut seen, version().await, "a clear");
    // Deleted and created again, a session starts above every version it had.
    let last = seen;
    assert!(s.delete_session().await.unwrap());
    assert_eq!(version().await, 0);
    let reborn = s
        .append(text("a", "user", "again"), AppendOptions::default())
        .await
        .unwrap();
    assert!(reborn.version.unwrap() > last);
}

/// A session deleted and created again starts above every version its earlier self had, also
/// within the same millisecond, in the same request, and when the clock that creates it is
/// behind the one that deleted it (another server instance's): the deletion leaves a floor.
pub async fn a_session_created_again_never_repeats_a_version<S: Store>(db: Db<S>) {
    use sessiondb_core::{WriteOp, WriteRequest};
    let key = db_session(&db, "s").key().clone();
    let write = |now_ms: i64, ops: Vec<WriteOp>| {
        db.store().write(WriteRequest {
            key: key.clone(),
            now_ms,
            ops,
            max_messages: None,
            condition: None,
        })
    };
    let state = |value: &str| WriteOp::PutState {
        name: "n".into(),
        value: value.into(),
    };
    let delete = || WriteOp::DeleteSession {
        updated_before: None,
    };
    // Ahead of the clock, so every version below comes from these requests' times.
    let since_epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    let now = since_epoch.unwrap().as_millis() as i64 + 60_000;
    let mut last = 0;
    for value in ["1", "2", "3"] {
        let version = write(now, vec![state(value)])
            .await
            .unwrap()
            .version
            .unwrap();
        assert!(version > last, "{version} after {last}");
        last = version;
    }
    assert_eq!(write(now, vec![delete()]).await.unwrap().version, None);

    let reborn = write(now, vec![state("again")]).await.unwrap();
    let reborn = reborn.version.unwrap();
    assert!(reborn > last, "same millisecond: {reborn} after {last}");
    last = reborn;

    write(now, vec![delete()]).await.unwrap();
    let behind = write(now - 30_000, vec![state("behind")]).await.unwrap();
    let behind = behind.version.unwrap();
    assert!(behind > last, "a clock 30 s behind: {behind} after {last}");
    last = behind;

    let in_one = write(now, vec![delete(), state("in one request")]).await;
    let in_one = in_one.unwrap().version.unwrap();
    assert!(in_one > last, "in one request: {in_one} after {last}");
    assert_eq!(db.store().stats(&key).await.unwrap().version, in_one);
}

/// A write conditioned on a message as read applies while the message is stored as it was read,
/// whatever else the session did, and writes and publishes nothing once it changed or went.
pub async fn writes_conditioned_on_a_message_apply_only_to_it_as_read<S: Store>(db: Db<S>) {
    use sessiondb::HeuristicCounter;
    use sessiondb_core::{WriteOp, WriteRequest};
    let s = db_session(&db, "s");
    chain(&s, &["m1"]).await;
    let read = || async { db.store().message(s.key(), "m1").await.unwrap().unwrap() };
    let update = |body: &str, read: StoredMessage| {
        let message = text("m1", "user", body).prepare(&HeuristicCounter);
        db.store().write(WriteRequest {
            key: s.key().clone(),
            now_ms: 1,
            ops: vec![WriteOp::Update { message }],
            max_messages: None,
            condition: Some(WriteCondition::Message(read)),
        })
    };
    let body = |message: Option<StoredMessage>| message.unwrap().json().to_owned();

    let first = read().await;
    chain(&s, &["m2"]).await;
    update("first edit", first.clone()).await.unwrap();
    assert!(
        body(s.message("m1").await.unwrap()).contains("first edit"),
        "others' writes leave it"
    );

    let mut sub = db.subscribe(FeedFilter::All);
    let stale = update("lost edit", first).await.unwrap_err();
    assert!(
        matches!(&stale, StoreError::MessageChanged { id } if id == "m1"),
        "{stale:?}"
    );
    assert!(
        drain(&mut sub).is_empty(),
        "a refused write publishes nothing"
    );
    assert!(body(s.message("m1").await.unwrap()).contains("first edit"));

    let fresh = read().await;
    s.update(text("m1", "user", "first edit"), Source::Server)
        .await
        .unwrap();
    update("second edit", fresh)
        .await
        .expect("an unchanged rewrite writes nothing");

    let gone = read().await;
    s.delete(&["m1".to_owned()]).await.unwrap();
    let refused = update("after the delete", gone).await.unwrap_err();
    assert!(
        matches!(refused, StoreError::MessageChanged { .. }),
        "{refused:?}"
    );
    assert!(s.message("m1").await.unwrap().is_none());
}

/// Patches of different fields of one message, made at once, all stay: each applies to the
/// message as stored when it is written, not as it was before another patch. (No patch can run
/// out of attempts here: it fails at most once per other patch, 36 of them.)
pub async fn concurrent_patches_of_one_message_keep_every_field<S: Store>(db: Db<S>) {
    use sessiondb::MessagePatch;
    let s = db_session(&db, "s");
    chain(&s, &["m1"]).await;
    const ROUNDS: usize = 12;
    let value = |field: &str, round: usize| match field {
        "role" => json!(format!("role{round}")),
        "content" => json!(format!("content {round}")),
        "metadata" => json!({ "round": round }),
        _ => json!([{ "type": "text", "text": format!("part {round}") }]),
    };
    let patcher = |field: &'static str| {
        let s = &s;
        async move {
            for round in 1..=ROUNDS {
                let mut patch = MessagePatch::default();
                let slot = match field {
                    "role" => &mut patch.role,
                    "content" => &mut patch.content,
                    "metadata" => &mut patch.metadata,
                    _ => &mut patch.parts,
                };
                *slot = Some(value(field, round));
                s.patch_message("m1", patch, Source::Server).await.unwrap();
            }
        }
    };
    let fields = ["role", "content", "metadata", "parts"];
    futures::future::join_all(fields.map(patcher)).await;

    let stored = s.message("m1").await.unwrap().unwrap();
    let stored: serde_json::Value = serde_json::from_str(stored.json()).unwrap();
    for field in fields {
        assert_eq!(stored[field], value(field, ROUNDS), "{field} in {stored}");
    }
}
