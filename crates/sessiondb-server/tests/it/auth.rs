//! Bearer keys, anonymous access rules, and namespace isolation of every resource.

use std::collections::HashMap;

use reqwest::{Method, StatusCode};
use serde_json::json;
use sessiondb_server::{ServerConfig, check_bind};

use crate::common::{SseReader, start_with};

fn keyed() -> ServerConfig {
    ServerConfig {
        api_keys: HashMap::from([
            ("key-a".to_owned(), "tenant-a".to_owned()),
            ("key-b".to_owned(), "tenant-b".to_owned()),
        ]),
        ..Default::default()
    }
}

#[test]
fn anonymous_access_needs_loopback_or_the_insecure_flag() {
    let open = ServerConfig::default();
    assert!(check_bind("127.0.0.1:8787".parse().unwrap(), &open, false).is_ok());
    assert!(check_bind("[::1]:8787".parse().unwrap(), &open, false).is_ok());
    assert!(check_bind("0.0.0.0:8787".parse().unwrap(), &open, false).is_err());
    assert!(check_bind("0.0.0.0:8787".parse().unwrap(), &open, true).is_ok());
    assert!(check_bind("0.0.0.0:8787".parse().unwrap(), &keyed(), false).is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_need_a_known_key() {
    let mut server = start_with(keyed()).await;
    let none = server.get("/v1/sessions").await;
    assert_eq!(
        (none.status, none.code()),
        (StatusCode::UNAUTHORIZED, "unauthorized")
    );
    server.key = Some("wrong".into());
    assert_eq!(
        server.get("/v1/sessions").await.status,
        StatusCode::UNAUTHORIZED
    );
    let basic = server
        .send(
            server
                .client
                .get(server.url("/v1/sessions"))
                .header("authorization", "Basic a2V5LWE="),
        )
        .await;
    assert_eq!(basic.status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        server.get("/agents/session-object/x/history").await.status,
        StatusCode::UNAUTHORIZED
    );
    let lower = server
        .send(
            server
                .client
                .get(server.url("/v1/sessions"))
                .header("authorization", "bearer key-a"),
        )
        .await;
    assert_eq!(
        lower.status,
        StatusCode::OK,
        "the scheme is case-insensitive"
    );
    server.key = Some("key-a".into());
    assert_eq!(server.get("/v1/sessions").await.status, StatusCode::OK);
    assert_eq!(
        server.get("/healthz").await.status,
        StatusCode::OK,
        "health needs no key"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_never_sees_another() {
    let mut server = start_with(keyed()).await;
    server.key = Some("key-b".into());
    let mut b_feed = SseReader::open(&server, "/v1/events", None).await;
    let mut b_session_feed = SseReader::open(&server, "/v1/sessions/s/events", None).await;

    server.key = Some("key-a".into());
    server
        .post("/v1/sessions", json!({"id": "s", "userId": "u"}))
        .await;
    server.say("s", "m1", "secret walrus").await;
    server.put("/v1/sessions/s/state/k", json!("hidden")).await;
    server
        .put("/v1/sessions/s/context/kb", json!({"kind": "search"}))
        .await;
    server
        .put(
            "/v1/sessions/s/context/kb/entries/k",
            json!({"content": "walrus facts"}),
        )
        .await;
    server
        .put(
            "/v1/context/soul",
            json!({"kind": "readonly", "content": "a's soul"}),
        )
        .await;
    server.get("/v1/sessions/s/prompt").await;
    server
        .post(
            "/v1/sessions/s/compactions",
            json!({"summary": "x", "fromMessageId": "m1", "toMessageId": "m1"}),
        )
        .await;
    server.say("t", "m2", "marker").await;

    server.key = Some("key-b".into());
    for path in [
        "/v1/sessions/s",
        "/v1/sessions/s/messages/m1",
        "/v1/sessions/s/state/k",
        "/v1/sessions/s/export",
        "/v1/sessions/s/context/kb/entries/k",
    ] {
        assert_eq!(
            server.get(path).await.status,
            StatusCode::NOT_FOUND,
            "{path}"
        );
    }
    assert_eq!(server.get("/v1/sessions").await.json["items"], json!([]));
    assert_eq!(
        server.get("/v1/sessions/s/messages").await.json["items"],
        json!([])
    );
    assert!(server.get("/v1/sessions/s/history").await.text.is_empty());
    assert_eq!(server.get("/v1/sessions/s/rows").await.json, json!([]));
    assert_eq!(server.get("/v1/sessions/s/state").await.json, json!({}));
    assert_eq!(
        server.get("/v1/sessions/s/compactions").await.json,
        json!([])
    );
    assert_eq!(
        server.get("/v1/sessions/s/search?q=walrus").await.json,
        json!([])
    );
    assert_eq!(server.get("/v1/search?q=walrus").await.json, json!([]));
    assert_eq!(server.get("/v1/sessions/s/context").await.json, json!([]));
    assert_eq!(server.get("/v1/context").await.json, json!([]));
    assert_eq!(server.get("/v1/sessions/s/prompt").await.json["prompt"], "");
    let search = json!({"arguments": {"query": "walrus"}});
    let found = server
        .post("/v1/sessions/s/tools/session_search", search)
        .await;
    assert_eq!(found.json["output"], "No results found.");
    assert_eq!(
        server.get("/agents/session-object/s").await.json["messages"],
        0
    );
    assert_eq!(
        server.delete("/v1/sessions/s").await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        server
            .call(Method::PATCH, "/v1/sessions/s", Some(json!({"name": "x"})))
            .await
            .status,
        StatusCode::NOT_FOUND
    );
    // Writes in B create B's own session of the same id and leave A's alone.
    server.say("s", "m1", "b's own").await;
    // B's feeds saw only B's write.
    let b_event = b_feed.next().await.unwrap();
    assert_eq!(b_event.data["message"]["parts"][0]["text"], "b's own");
    assert_eq!(
        b_session_feed.next().await.unwrap().data["message"]["parts"][0]["text"],
        "b's own"
    );

    server.key = Some("key-a".into());
    let a = server.get("/v1/sessions/s/messages/m1").await;
    assert_eq!(a.json["parts"][0]["text"], "secret walrus");
    assert_eq!(server.get("/v1/search?q=walrus").await.ids(), ["m1"]);
}
