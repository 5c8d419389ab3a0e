//! The reference example's curl walkthrough, unchanged, against the compatibility routes.

use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::common::start;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reference_walkthrough_passes_unchanged() {
    let server = start().await;
    let base = "/agents/session-object/demo";
    let m1 = json!({"id": "m1", "role": "user", "parts": [{"type": "text", "text": "hello"}]});
    let m2 = json!({"id": "m2", "role": "assistant", "parts": [{"type": "text", "text": "hi"}]});

    let a = server.post(&format!("{base}/messages"), m1).await;
    assert_eq!(a.status, StatusCode::CREATED);
    assert_eq!(a.json["inserted"], true);
    assert_eq!(a.json["message"]["id"], "m1");
    let b = server
        .post(&format!("{base}/messages?parent=m1"), m2.clone())
        .await;
    assert_eq!(b.status, StatusCode::CREATED);
    let again = server.post(&format!("{base}/messages?parent=m1"), m2).await;
    assert_eq!(again.status, StatusCode::OK);
    assert_eq!(again.json["inserted"], false);

    let history = server.get(&format!("{base}/history")).await;
    assert_eq!(history.status, StatusCode::OK);
    assert_eq!(history.headers["content-type"], "application/x-ndjson");
    assert_eq!(history.ids(), ["m1", "m2"]);
    assert_eq!(history.text.lines().count(), 2);
    assert_eq!(
        server.get(&format!("{base}/history?leaf=m2")).await.ids(),
        ["m1", "m2"]
    );
    assert_eq!(
        server.get(&format!("{base}/history?leaf=m1")).await.ids(),
        ["m1"]
    );
    assert_eq!(
        server.get(&format!("{base}/branches/m1")).await.ids(),
        ["m2"]
    );

    let compaction = server
        .post(
            &format!("{base}/compactions"),
            json!({"summary": "greeting exchanged", "fromMessageId": "m1", "toMessageId": "m2"}),
        )
        .await;
    assert_eq!(compaction.status, StatusCode::CREATED);
    for field in ["id", "summary", "fromMessageId", "toMessageId", "createdAt"] {
        assert!(compaction.json.get(field).is_some(), "{field}");
    }
    let overlaid = server.get(&format!("{base}/history")).await.lines();
    assert_eq!(overlaid.len(), 1);
    assert!(
        overlaid[0]["id"]
            .as_str()
            .unwrap()
            .starts_with("compaction_")
    );
    assert_eq!(overlaid[0]["role"], "assistant");
    assert_eq!(overlaid[0]["parts"][0]["text"], "greeting exchanged");

    let m1 = server.get(&format!("{base}/messages/m1")).await;
    assert_eq!(
        (m1.status, m1.json["id"].as_str()),
        (StatusCode::OK, Some("m1"))
    );
    let unknown = server.get(&format!("{base}/messages/nope")).await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    assert_eq!(unknown.text, "Not found");

    let hits = server.get(&format!("{base}/search?q=hello")).await;
    assert_eq!(hits.status, StatusCode::OK);
    assert_eq!(
        hits.json,
        json!([{"id": "m1", "role": "user", "content": "hello"}])
    );

    let cleared = server.delete(&format!("{base}/messages")).await;
    assert_eq!(cleared.status, StatusCode::NO_CONTENT);
    assert!(cleared.text.is_empty());
    let fallback = server.get(base).await;
    assert_eq!(
        fallback.json,
        json!({"name": "demo", "messages": 0, "leaf": null})
    );
    let deeper = server
        .call(Method::PUT, &format!("{base}/anything/else"), None)
        .await;
    assert_eq!(
        deeper.json,
        json!({"name": "demo", "messages": 0, "leaf": null})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compat_routes_answer_the_reference_errors() {
    let server = start().await;
    let base = "/agents/session-object/demo";
    for bad in [
        json!({"role": "user", "parts": []}),
        json!({"id": "x", "role": "user"}),
        json!({"id": "x", "role": "user", "parts": [{"text": "no type"}]}),
        json!({"id": "x", "role": "user", "parts": [null]}),
        json!(null),
        json!("text"),
    ] {
        let answer = server.post(&format!("{base}/messages"), bad).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST);
        assert_eq!(answer.text, "Invalid SessionMessage");
    }
    let malformed = server
        .send(
            server
                .request(Method::POST, &format!("{base}/messages"))
                .body("{not json"),
        )
        .await;
    assert_eq!(
        (malformed.status, malformed.text.as_str()),
        (StatusCode::BAD_REQUEST, "Invalid SessionMessage")
    );
    let compaction = server
        .post(&format!("{base}/compactions"), json!({"summary": 1}))
        .await;
    assert_eq!(
        (compaction.status, compaction.text.as_str()),
        (StatusCode::BAD_REQUEST, "Invalid compaction")
    );
    // `parent=` (empty) starts a new root.
    server
        .post(
            &format!("{base}/messages"),
            json!({"id": "a", "role": "user", "parts": []}),
        )
        .await;
    let root = server
        .post(
            &format!("{base}/messages?parent="),
            json!({"id": "b", "role": "user", "parts": []}),
        )
        .await;
    assert_eq!(root.json["message"].get("parentId"), None);
    assert_eq!(server.get(&format!("{base}/history")).await.ids(), ["b"]);
    let summary = server.get(base).await;
    assert_eq!(
        summary.json,
        json!({"name": "demo", "messages": 1, "leaf": "b"})
    );
}
