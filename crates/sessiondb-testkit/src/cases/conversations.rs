//! The conversation API: flat pages, conversation metadata and the user index, state, limits
//! and the summary convention.

use serde_json::{Value, json};
use sessiondb::{
    AppendOptions, ConversationLimits, Conversations, Db, Error, NewMessage, Page, PageRequest,
    Store, StoredMessage, ValidationErrorKind,
};

use crate::*;

fn api<S: Store>(db: &Db<S>) -> Conversations<S> {
    db.conversations("", ConversationLimits::default()).unwrap()
}

fn said(role: &str, text: &str) -> NewMessage {
    NewMessage::new(role, text)
}

fn for_user(text: &str, user: &str) -> NewMessage {
    NewMessage {
        user_id: Some(user.to_owned()),
        ..said("user", text)
    }
}

fn page(limit: usize, descending: bool, after: Option<&str>, before: Option<&str>) -> PageRequest {
    PageRequest {
        limit: Some(limit),
        descending,
        after: after.map(str::to_owned),
        before: before.map(str::to_owned),
    }
}

fn object(value: Value) -> serde_json::Map<String, Value> {
    value.as_object().cloned().unwrap()
}

fn text_of(message: &StoredMessage) -> String {
    message.to_value()["content"].as_str().unwrap().to_owned()
}

pub async fn conversation_messages_round_trip<S: Store>(db: Db<S>) {
    let c = api(&db);
    assert!(c.get_conversation("chat").await.unwrap().is_none());
    let unknown = c
        .get_messages("chat", &PageRequest::default())
        .await
        .unwrap();
    assert!(unknown.items.is_empty() && unknown.next_cursor.is_none());

    let first = c
        .append_message(
            "chat",
            NewMessage {
                metadata: Some(object(json!({"lang": "en", "score": 1}))),
                ..said("user", "hello")
            },
        )
        .await
        .unwrap();
    assert!(first.id.starts_with("msg_"), "{}", first.id);
    let array = c
        .append_message("chat", NewMessage::new("assistant", json!(["a", "b"])))
        .await
        .unwrap();
    let object_content = c
        .append_message("chat", NewMessage::new("tool", json!({"result": 42})))
        .await
        .unwrap();
    let system = c
        .append_message("chat", said("system", "be brief"))
        .await
        .unwrap();

    let all = c
        .get_messages("chat", &PageRequest::default())
        .await
        .unwrap();
    assert_eq!(
        ids(&all.items),
        [&first.id, &array.id, &object_content.id, &system.id].map(|id| id.to_string())
    );
    assert_eq!(all.items[1].to_value()["content"], json!(["a", "b"]));
    assert_eq!(all.items[2].to_value()["content"], json!({"result": 42}));

    // Content alone: metadata stays. Metadata alone: replaced whole, not merged.
    let updated = c
        .update_message("chat", &first.id, Some(json!("hello there")), None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(text_of(&updated), "hello there");
    assert_eq!(
        updated.to_value()["metadata"],
        json!({"lang": "en", "score": 1})
    );
    assert!(updated.updated_at.is_some());
    assert_eq!(updated.created_at, first.created_at);
    let updated = c
        .update_message("chat", &first.id, None, Some(object(json!({"score": 2}))))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(updated.to_value()["metadata"], json!({"score": 2}));
    assert_eq!(text_of(&updated), "hello there");
    assert!(
        c.update_message("chat", "msg_missing", Some(json!("x")), None)
            .await
            .unwrap()
            .is_none()
    );

    assert!(c.delete_message("chat", &array.id).await.unwrap());
    assert!(!c.delete_message("chat", &array.id).await.unwrap());
    let info = c.get_conversation("chat").await.unwrap().unwrap();
    assert_eq!(info.message_count, 3);
    assert!(info.last_message_at >= info.created_at);

    c.update_conversation("chat", object(json!({"title": "greetings"})))
        .await
        .unwrap();
    c.state("chat").unwrap().set("k", &json!(1)).await.unwrap();
    c.clear_messages("chat").await.unwrap();
    let info = c.get_conversation("chat").await.unwrap().unwrap();
    assert_eq!(info.message_count, 0);
    assert_eq!(Value::Object(info.metadata), json!({"title": "greetings"}));
    assert_eq!(
        c.state("chat").unwrap().get("k").await.unwrap(),
        Some(json!(1))
    );
}

pub async fn conversation_roles_and_content_are_validated<S: Store>(db: Db<S>) {
    let c = api(&db);
    let invalid_field = |r: Result<StoredMessage, Error>| match r {
        Err(Error::Invalid(e)) => e.field,
        other => panic!("expected a validation error, got {other:?}"),
    };
    assert_eq!(
        invalid_field(c.append_message("chat", said("robot", "hi")).await),
        "role"
    );
    assert_eq!(
        invalid_field(
            c.append_message("chat", NewMessage::new("user", json!(3)))
                .await
        ),
        "content"
    );
    assert_eq!(
        invalid_field(
            c.append_message("chat", NewMessage::new("user", Value::Null))
                .await
        ),
        "content"
    );
    assert!(
        c.get_conversation("chat").await.unwrap().is_none(),
        "nothing stored"
    );
}

/// Cursor pages both ways while another task appends: every page continues exactly where the
/// previous one ended, with no gap and no repeat.
pub async fn conversation_pages_have_no_gaps_while_appending<S: Store>(db: Db<S>) {
    let c = api(&db);
    for i in 0..45 {
        c.append_message("chat", said("user", &format!("m{i}")))
            .await
            .unwrap();
    }
    // The appender runs on its own thread while both readers page with small pauses, so
    // appends land between page reads.
    let done = std::sync::atomic::AtomicBool::new(false);
    let pause = || std::thread::sleep(std::time::Duration::from_millis(1));
    let (up, down) = std::thread::scope(|scope| {
        scope.spawn(|| {
            futures::executor::block_on(async {
                for i in 45..105 {
                    c.append_message("chat", said("user", &format!("m{i}")))
                        .await
                        .unwrap();
                    pause();
                }
            });
            done.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        // Oldest first, continuing from the last message seen until the appender is done.
        let ascending = scope.spawn(|| {
            futures::executor::block_on(async {
                let mut seen: Vec<StoredMessage> = Vec::new();
                loop {
                    let finished = done.load(std::sync::atomic::Ordering::SeqCst);
                    let cursor = seen.last().map(|m| m.id.as_str());
                    let p = c
                        .get_messages("chat", &page(4, false, cursor, None))
                        .await
                        .unwrap();
                    if p.items.is_empty() && finished {
                        break seen.iter().map(text_of).collect::<Vec<_>>();
                    }
                    seen.extend(p.items);
                    pause();
                }
            })
        });
        // Newest first from whatever is newest at the start, down to the first message.
        let descending = scope.spawn(|| {
            futures::executor::block_on(async {
                let mut seen: Vec<String> = Vec::new();
                let mut cursor: Option<String> = None;
                loop {
                    let p = c
                        .get_messages("chat", &page(3, true, cursor.as_deref(), None))
                        .await
                        .unwrap();
                    seen.extend(p.items.iter().map(text_of));
                    pause();
                    match p.next_cursor {
                        Some(next) => cursor = Some(next),
                        None => break seen,
                    }
                }
            })
        });
        (ascending.join().unwrap(), descending.join().unwrap())
    });
    let expected: Vec<String> = (0..105).map(|i| format!("m{i}")).collect();
    assert_eq!(up, expected);
    let mut down_reversed = down.clone();
    down_reversed.reverse();
    assert!(
        down.len() >= 45 && down_reversed[..] == expected[..down.len()],
        "{down:?}"
    );

    // Backwards with `before` cursors, in both orders, back to the first page.
    for descending in [false, true] {
        let mut p: Page<StoredMessage> = c
            .get_messages("chat", &page(10, descending, None, None))
            .await
            .unwrap();
        while let Some(next) = p.next_cursor.clone() {
            p = c
                .get_messages("chat", &page(10, descending, Some(&next), None))
                .await
                .unwrap();
        }
        let mut back: Vec<String> = p.items.iter().map(text_of).collect();
        while let Some(previous) = p.previous_cursor.clone() {
            p = c
                .get_messages("chat", &page(10, descending, None, Some(&previous)))
                .await
                .unwrap();
            let mut items: Vec<String> = p.items.iter().map(text_of).collect();
            items.append(&mut back);
            back = items;
        }
        let mut want = expected.clone();
        if descending {
            want.reverse();
        }
        assert_eq!(back, want, "descending: {descending}");
    }
}

pub async fn conversations_list_by_user_from_thousands<S: Store>(db: Db<S>) {
    let c = api(&db);
    let users = 2_000;
    let appends = (0..users).map(|u| {
        let c = c.clone();
        async move {
            c.append_message(&format!("c{u}"), for_user("hi", &format!("u{u}")))
                .await
                .unwrap();
        }
    });
    futures::future::join_all(appends).await;
    // One user with 45 conversations, written oldest first.
    for i in 0..45 {
        c.append_message(&format!("many-{i:02}"), for_user("hi", "heavy"))
            .await
            .unwrap();
    }
    let one = c
        .list_conversations(&PageRequest::default(), Some("u1234"))
        .await
        .unwrap();
    assert_eq!(one.items.len(), 1);
    assert_eq!(one.items[0].id, "c1234");
    assert_eq!(one.items[0].user_id.as_deref(), Some("u1234"));

    let mut seen = Vec::new();
    let mut cursor = None;
    loop {
        let request = PageRequest {
            limit: Some(20),
            descending: true,
            after: cursor,
            before: None,
        };
        let p = c.list_conversations(&request, Some("heavy")).await.unwrap();
        assert!(
            p.items
                .iter()
                .all(|i| i.user_id.as_deref() == Some("heavy"))
        );
        seen.extend(p.items.iter().map(|i| (i.last_message_at, i.id.clone())));
        cursor = p.next_cursor;
        if cursor.is_none() {
            break;
        }
    }
    let mut sorted = seen.clone();
    sorted.sort_by(|a, b| b.cmp(a));
    assert_eq!(seen, sorted, "newest last message first");
    assert_eq!(seen.len(), 45);
    let all = c
        .list_conversations(&page(100, true, None, None), None)
        .await
        .unwrap();
    assert_eq!(all.items.len(), 100);
    assert!(
        c.list_conversations(&PageRequest::default(), Some("nobody"))
            .await
            .unwrap()
            .items
            .is_empty()
    );

    // Deleting a conversation removes it from its user's index.
    assert!(c.delete_conversation("c1234").await.unwrap());
    assert!(
        c.list_conversations(&PageRequest::default(), Some("u1234"))
            .await
            .unwrap()
            .items
            .is_empty()
    );
}

pub async fn a_conversation_belongs_to_one_user<S: Store>(db: Db<S>) {
    let c = api(&db);
    c.append_message("chat", for_user("hi", "alice"))
        .await
        .unwrap();
    c.append_message("chat", said("assistant", "hello"))
        .await
        .unwrap();
    c.append_message("chat", for_user("again", "alice"))
        .await
        .unwrap();
    let refused = c.append_message("chat", for_user("mine now", "bob")).await;
    assert!(matches!(refused, Err(Error::Invalid(e)) if e.field == "userId"));
    assert_eq!(
        c.get_conversation("chat")
            .await
            .unwrap()
            .unwrap()
            .message_count,
        3
    );

    // A conversation created without a user is recorded on the first append that names one.
    c.append_message("open", said("user", "anonymous"))
        .await
        .unwrap();
    c.append_message("open", for_user("claimed", "bob"))
        .await
        .unwrap();
    let bobs = c
        .list_conversations(&PageRequest::default(), Some("bob"))
        .await
        .unwrap();
    assert_eq!(
        bobs.items.iter().map(|i| i.id.as_str()).collect::<Vec<_>>(),
        ["open"]
    );
}

pub async fn conversation_metadata_merges_shallowly<S: Store>(db: Db<S>) {
    let c = api(&db);
    assert!(
        c.update_conversation("none", object(json!({"a": 1})))
            .await
            .unwrap()
            .is_none()
    );
    c.append_message("chat", said("user", "hi")).await.unwrap();
    let merged = c
        .update_conversation("chat", object(json!({"a": 1, "b": {"x": 1}, "c": 3})))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        Value::Object(merged),
        json!({"a": 1, "b": {"x": 1}, "c": 3})
    );
    let merged = c
        .update_conversation("chat", object(json!({"a": 2, "b": {"y": 2}, "c": null})))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(Value::Object(merged), json!({"a": 2, "b": {"y": 2}}));
    let info = c.get_conversation("chat").await.unwrap().unwrap();
    assert_eq!(Value::Object(info.metadata), json!({"a": 2, "b": {"y": 2}}));

    c.state("chat")
        .unwrap()
        .set("k", &json!("v"))
        .await
        .unwrap();
    assert!(c.delete_conversation("chat").await.unwrap());
    assert!(c.get_conversation("chat").await.unwrap().is_none());
    assert!(c.state("chat").unwrap().list().await.unwrap().is_empty());
    assert!(
        c.get_messages("chat", &PageRequest::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    assert!(!c.delete_conversation("chat").await.unwrap());
}

pub async fn state_takes_json_values_only<S: Store>(db: Db<S>) {
    let c = api(&db);
    let state = c.state("chat").unwrap();
    for value in [
        json!(null),
        json!("text"),
        json!(true),
        json!(1.5),
        json!(-7),
        json!({"nested": [1, {"a": null}]}),
        json!([]),
    ] {
        state.set("k", &value).await.unwrap();
        assert_eq!(state.get("k").await.unwrap(), Some(value));
    }
    state.delete("k").await.unwrap();
    for text in [
        "NaN",
        "Infinity",
        "-Infinity",
        "{\"a\": NaN}",
        "[1, Infinity]",
        "undefined",
        "function () {}",
        "",
        "1 2",
        "{\"a\": 1",
    ] {
        let refused = state.set_json("k", text).await;
        assert!(
            matches!(&refused, Err(Error::Invalid(e)) if matches!(e.kind, ValidationErrorKind::NotJson { .. })),
            "{text}: {refused:?}"
        );
    }
    // A `Value` cannot even hold a non-finite number.
    assert!(serde_json::Number::from_f64(f64::NAN).is_none());
    assert!(serde_json::Number::from_f64(f64::INFINITY).is_none());
    assert!(state.list().await.unwrap().is_empty(), "nothing stored");
    assert_eq!(
        state.set_json("k", " {\"ok\": [1, 2.5]} ").await.unwrap(),
        json!({"ok": [1, 2.5]})
    );
    for key in ["", &"k".repeat(257)] {
        assert!(matches!(
            state.set(key, &json!(1)).await,
            Err(Error::Invalid(_))
        ));
    }
    state.set(&"k".repeat(256), &json!(1)).await.unwrap();
    let other = c.state("other").unwrap();
    assert!(
        other.get("k").await.unwrap().is_none(),
        "isolated per conversation"
    );
}

pub async fn limits_are_typed_and_write_nothing<S: Store>(db: Db<S>) {
    let limits = ConversationLimits {
        max_id_chars: 8,
        max_content_bytes: 1_000,
        max_messages: 5,
        max_page_size: 10,
    };
    let c = db.conversations("", limits).unwrap();
    let invalid = |r: Result<StoredMessage, Error>| matches!(r, Err(Error::Invalid(_)));
    for wrong in [
        ConversationLimits {
            max_id_chars: 257,
            ..limits
        },
        ConversationLimits {
            max_page_size: 101,
            ..limits
        },
        ConversationLimits {
            max_page_size: 0,
            ..limits
        },
    ] {
        assert!(matches!(
            db.conversations("", wrong),
            Err(Error::Invalid(_))
        ));
    }
    assert!(invalid(
        c.append_message("nine-char", said("user", "hi")).await
    ));
    assert!(matches!(
        c.get_messages("chat", &page(11, false, None, None)).await,
        Err(Error::Invalid(_))
    ));

    assert!(c.session(&"x".repeat(257)).is_err());
    assert!(invalid(
        c.append_message(&"x".repeat(257), said("user", "hi")).await
    ));
    let big = c
        .append_message("chat", said("user", &"x".repeat(1_000)))
        .await;
    assert!(
        matches!(&big, Err(Error::Invalid(e)) if matches!(e.kind, ValidationErrorKind::TooLarge { max: 1_000, .. })),
        "{big:?}"
    );
    assert!(
        c.get_conversation("chat").await.unwrap().is_none(),
        "nothing stored"
    );
    let big_state = c
        .state("chat")
        .unwrap()
        .set("k", &json!("x".repeat(1_000)))
        .await;
    assert!(matches!(big_state, Err(Error::Invalid(_))));

    for i in 0..5 {
        c.append_message("chat", said("user", &format!("m{i}")))
            .await
            .unwrap();
    }
    let over = c.append_message("chat", said("user", "one too many")).await;
    assert!(
        matches!(over, Err(Error::QuotaExceeded { limit: 5 })),
        "{over:?}"
    );
    let grown = c
        .update_message(
            "chat",
            &c.get_messages("chat", &PageRequest::default())
                .await
                .unwrap()
                .items[0]
                .id,
            Some(json!("y".repeat(1_000))),
            None,
        )
        .await;
    assert!(matches!(grown, Err(Error::Invalid(_))), "{grown:?}");
    let texts: Vec<String> = c
        .get_messages("chat", &PageRequest::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(text_of)
        .collect();
    assert_eq!(texts, ["m0", "m1", "m2", "m3", "m4"], "nothing changed");

    for limit in [0, 101] {
        let request = PageRequest {
            limit: Some(limit),
            ..Default::default()
        };
        assert!(matches!(
            c.get_messages("chat", &request).await,
            Err(Error::Invalid(_))
        ));
        assert!(matches!(
            c.list_conversations(&request, None).await,
            Err(Error::Invalid(_))
        ));
    }
    let both = page(10, false, Some("a"), Some("b"));
    assert!(matches!(
        c.get_messages("chat", &both).await,
        Err(Error::Invalid(_))
    ));
}

pub async fn conversations_hold_ten_thousand_messages_by_default<S: Store>(db: Db<S>) {
    let c = api(&db);
    let session = c.session("long").unwrap();
    fill(&session, 9_999, 8).await;
    let last = c
        .append_message("long", said("user", "the last one"))
        .await
        .unwrap();
    let over = c.append_message("long", said("user", "one too many")).await;
    assert!(
        matches!(over, Err(Error::QuotaExceeded { limit: 10_000 })),
        "{over:?}"
    );
    let batch = session
        .append_all(vec![text("b1", "user", "x")], AppendOptions::default())
        .await;
    assert!(matches!(batch, Err(Error::QuotaExceeded { limit: 10_000 })));
    assert_eq!(
        c.get_conversation("long")
            .await
            .unwrap()
            .unwrap()
            .message_count,
        10_000
    );
    let newest = c
        .get_messages("long", &page(50, true, None, None))
        .await
        .unwrap();
    assert_eq!(newest.items.len(), 50);
    assert_eq!(newest.items[0].id, last.id);
    assert_eq!(newest.items[1].id, "m9998");
}

pub async fn prompt_context_follows_the_summary_convention<S: Store>(db: Db<S>) {
    let c = api(&db);
    let mut sent = Vec::new();
    for i in 0..6 {
        sent.push(
            c.append_message("chat", said("user", &format!("m{i}")))
                .await
                .unwrap()
                .id
                .clone(),
        );
    }
    let context = c.prompt_context("chat").await.unwrap();
    assert_eq!((context.summary, context.messages.len()), (None, 6));

    c.update_conversation(
        "chat",
        object(json!({"summary": "talked about m0..m3", "summarizedUntil": sent[3]})),
    )
    .await
    .unwrap();
    let context = c.prompt_context("chat").await.unwrap();
    assert_eq!(context.summary.as_deref(), Some("talked about m0..m3"));
    assert_eq!(
        context.messages.iter().map(text_of).collect::<Vec<_>>(),
        ["m4", "m5"]
    );
    let model = context.model_messages();
    assert_eq!(model.len(), 3);
    assert_eq!(model[0]["role"], "system");
    assert!(
        model[0]["content"]
            .as_str()
            .unwrap()
            .ends_with("talked about m0..m3")
    );

    // The covered message is gone: every message comes, so nothing is lost.
    c.delete_message("chat", &sent[3]).await.unwrap();
    let context = c.prompt_context("chat").await.unwrap();
    assert_eq!(context.messages.len(), 5);
    assert!(c.prompt_context("none").await.unwrap().messages.is_empty());
}
