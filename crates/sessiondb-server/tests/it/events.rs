//! The change feed over server-sent events.

use serde_json::{Value, json};

use crate::common::{SseReader, start};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_events_arrive_in_order_and_resume_from_last_event_id() {
    let server = start().await;
    let mut feed = SseReader::open(&server, "/v1/sessions/s/events", None).await;
    let mut all = SseReader::open(&server, "/v1/events", None).await;
    server.say("s", "a", "one").await;
    server.say("other", "x", "elsewhere").await;
    server
        .put(
            "/v1/sessions/s/messages/a",
            json!({"role": "user", "content": "changed"}),
        )
        .await;
    server.say("s", "b", "two").await;
    server.delete("/v1/sessions/s/messages/b").await;
    server.delete("/v1/sessions/s/messages").await;

    let events = feed.take(5).await;
    let names: Vec<&str> = events.iter().map(|e| e.event.as_str()).collect();
    assert_eq!(names, ["append", "update", "append", "delete", "clear"]);
    assert_eq!(events[0].data["sessionId"], "s");
    assert_eq!(events[0].data["message"]["id"], "a");
    assert_eq!(events[0].data["inserted"], true);
    assert_eq!(events[1].data["message"]["content"], "changed");
    assert_eq!(events[3].data["messageIds"], json!(["b"]));
    assert_eq!(events[4].data, json!({"sessionId": "s"}));
    let ids: Vec<String> = events.iter().map(|e| e.id.clone().unwrap()).collect();
    let position = |id: &str| id.split_once('-').unwrap().1.parse::<u64>().unwrap();
    assert!(ids.windows(2).all(|w| position(&w[0]) < position(&w[1])));

    let namespace: Vec<String> = all
        .take(6)
        .await
        .iter()
        .map(|e| e.data["sessionId"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(namespace, ["s", "other", "s", "s", "s", "s"]);

    // Reconnecting after the second event replays the rest, then continues live.
    drop(feed);
    let mut resumed = SseReader::open(&server, "/v1/sessions/s/events", Some(&ids[1])).await;
    server.say("s", "c", "three").await;
    let replay = resumed.take(4).await;
    let names: Vec<&str> = replay.iter().map(|e| e.event.as_str()).collect();
    assert_eq!(names, ["append", "delete", "clear", "append"]);
    assert_eq!(replay[0].id.as_deref(), Some(ids[2].as_str()));
    assert_eq!(replay[3].data["message"]["id"], "c");

    // A position from another process (or too old) cannot be resumed: the stream says so.
    let mut foreign = SseReader::open(&server, "/v1/sessions/s/events", Some("1-1")).await;
    assert_eq!(foreign.next().await.unwrap().event, "reset");
    // So can an id this server never wrote: the client believes it has a position.
    for garbage in ["garbage", "7", "-", "x-1"] {
        let mut reader = SseReader::open(&server, "/v1/sessions/s/events", Some(garbage)).await;
        let reset = reader.next().await.unwrap();
        assert_eq!(reset.event, "reset", "{garbage}");
        assert_eq!(
            reset.data["reason"],
            "`Last-Event-ID` is not an event id of this server"
        );
    }
    // A blank one names no position: the stream starts live, as without the header.
    let mut fresh = SseReader::open(&server, "/v1/sessions/s/events", Some(" ")).await;
    server.say("s", "d", "four").await;
    let first = fresh.next().await.unwrap();
    assert_eq!(
        (first.event.as_str(), &first.data["message"]["id"]),
        ("append", &json!("d"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_compaction_and_import_events() {
    let server = start().await;
    let mut all = SseReader::open(&server, "/v1/events", None).await;
    server.post("/v1/sessions", json!({"id": "s"})).await;
    server.patch("/v1/sessions/s", json!({"name": "n"})).await;
    server.say("s", "a", "x").await;
    server
        .post(
            "/v1/sessions/s/compactions",
            json!({"summary": "x", "fromMessageId": "a", "toMessageId": "a"}),
        )
        .await;
    server
        .send(server.request(reqwest::Method::POST, "/v1/sessions/s/import").body(
            "{\"message\": {\"id\": \"i\", \"role\": \"user\", \"content\": \"x\"}, \"parentId\": \"a\"}\n",
        ))
        .await;
    server.delete("/v1/sessions/s").await;
    let events = all.take(6).await;
    let names: Vec<&str> = events.iter().map(|e| e.event.as_str()).collect();
    assert_eq!(
        names,
        [
            "session",
            "session",
            "append",
            "compaction",
            "import",
            "session"
        ]
    );
    assert_eq!(events[0].data["action"], "created");
    assert_eq!(events[1].data["action"], "updated");
    assert_eq!(events[3].data["compaction"]["summary"], "x");
    assert_eq!(events[4].data["parentId"], "a");
    assert_eq!(events[5].data["action"], "deleted");
}

/// An append's event says where the message is stored (`storedParentId`) beside the parent as
/// the request gave it (`parentId`, absent when it followed the active leaf), so a follower can
/// place every message: after the leaf, under a named parent, as a root, under an unknown
/// parent (a root), and again for an id already stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn append_events_name_the_parent_each_message_is_stored_under() {
    let server = start().await;
    let mut feed = SseReader::open(&server, "/v1/sessions/s/events", None).await;
    let said = |id: &str| json!({"id": id, "role": "user", "content": id});
    server.say("s", "a", "first").await;
    server.say("s", "b", "after the leaf").await;
    server
        .post("/v1/sessions/s/messages?parent=a", said("c"))
        .await;
    server
        .post("/v1/sessions/s/messages?parent=", said("d"))
        .await;
    server
        .post("/v1/sessions/s/messages?parent=nowhere", said("e"))
        .await;
    server
        .post("/v1/sessions/s/messages?parent=e", said("b"))
        .await;
    // (id, parentId as given or None when absent, storedParentId, inserted)
    let placed: Vec<(Value, Option<Value>, Value, Value)> = feed
        .take(6)
        .await
        .into_iter()
        .map(|e| {
            let d = e.data;
            let given = d.get("parentId").cloned();
            (
                d["message"]["id"].clone(),
                given,
                d["storedParentId"].clone(),
                d["inserted"].clone(),
            )
        })
        .collect();
    let root = Value::Null;
    assert_eq!(
        placed,
        [
            (json!("a"), None, root.clone(), json!(true)),
            (json!("b"), None, json!("a"), json!(true)),
            (json!("c"), Some(json!("a")), json!("a"), json!(true)),
            (json!("d"), Some(Value::Null), root.clone(), json!(true)),
            (json!("e"), Some(json!("nowhere")), root, json!(true)),
            (json!("b"), Some(json!("e")), json!("a"), json!(false)),
        ]
    );
}
