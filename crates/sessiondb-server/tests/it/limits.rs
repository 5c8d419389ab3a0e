//! Limits and bad input: every refusal is a 4xx JSON error and stores nothing.

use reqwest::{Method, StatusCode};
use serde_json::json;
use sessiondb_server::{Limits, ServerConfig};

use crate::common::{start, start_with};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configured_limits_refuse_and_store_nothing() {
    let config = ServerConfig {
        limits: Limits {
            max_body_bytes: 4096,
            max_message_bytes: 1024,
            max_messages_per_session: 3,
        },
        ..Default::default()
    };
    let server = start_with(config).await;
    let big = json!({"id": "big", "role": "user", "content": "x".repeat(2000)});
    let answer = server.post("/v1/sessions/s/messages", big).await;
    assert_eq!(
        (answer.status, answer.code()),
        (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large")
    );
    let huge = json!({"id": "huge", "role": "user", "content": "x".repeat(10_000)});
    let answer = server.post("/v1/sessions/s/messages", huge).await;
    assert_eq!(
        (answer.status, answer.code()),
        (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large")
    );
    let compat = server
        .post(
            "/agents/session-object/s/messages",
            json!({"id": "c", "role": "user", "parts": [], "pad": "x".repeat(10_000)}),
        )
        .await;
    assert_eq!(compat.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        server.get("/v1/sessions/s").await.status,
        StatusCode::NOT_FOUND
    );

    for i in 0..3 {
        server.say("s", &format!("m{i}"), "ok").await;
    }
    let over = server
        .post(
            "/v1/sessions/s/messages",
            json!({"id": "m3", "role": "user", "content": "x"}),
        )
        .await;
    assert_eq!(
        (over.status, over.code()),
        (StatusCode::CONFLICT, "quota_exceeded")
    );
    let batch = server
        .post("/v1/sessions/t/messages/batch", json!({"messages": [
            {"id": "1", "role": "user", "content": "x"}, {"id": "2", "role": "user", "content": "x"},
            {"id": "3", "role": "user", "content": "x"}, {"id": "4", "role": "user", "content": "x"}]}))
        .await;
    assert_eq!(batch.code(), "quota_exceeded");
    assert_eq!(
        server.get("/v1/sessions/t").await.status,
        StatusCode::NOT_FOUND,
        "nothing of the batch"
    );
    // Re-appending an existing id stores nothing and is still answered.
    let again = server
        .post(
            "/v1/sessions/s/messages",
            json!({"id": "m0", "role": "user", "content": "x"}),
        )
        .await;
    assert_eq!(again.status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_input_is_a_400_never_a_500() {
    let server = start().await;
    let raw = |body: Vec<u8>| {
        server
            .request(Method::POST, "/v1/sessions/s/messages")
            .header("content-type", "application/json")
            .body(body)
    };
    for body in [
        b"{not json".to_vec(),
        vec![0xff, 0xfe, b'{', b'}'],
        br#"{"id": "a", "role": "user", "content": "\ud800"}"#.to_vec(),
        br#"{"id": "a", "role": 5, "content": "x"}"#.to_vec(),
        br#"{"id": "a", "role": "user"}"#.to_vec(),
        br#"{"id": "", "role": "user", "content": "x"}"#.to_vec(),
        br#"[]"#.to_vec(),
        b"".to_vec(),
    ] {
        let answer = server.send(raw(body.clone())).await;
        assert_eq!(
            (answer.status, answer.code()),
            (StatusCode::BAD_REQUEST, "invalid_request"),
            "{}",
            String::from_utf8_lossy(&body)
        );
        assert!(answer.json["error"]["message"].is_string());
    }
    let long_id = format!("/v1/sessions/{}/messages", "s".repeat(257));
    let answer = server
        .post(&long_id, json!({"role": "user", "content": "x"}))
        .await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    let ok_id = format!("/v1/sessions/{}/messages", "é".repeat(256));
    assert_eq!(
        server
            .post(&ok_id, json!({"role": "user", "content": "x"}))
            .await
            .status,
        StatusCode::CREATED
    );
    // A message id in a path is checked as a session id is: 400, not a message not found.
    for mid in ["m".repeat(257), "a%01b".to_owned()] {
        for (method, path) in [
            (Method::GET, format!("/v1/sessions/s/messages/{mid}")),
            (Method::PATCH, format!("/v1/sessions/s/messages/{mid}")),
            (Method::DELETE, format!("/v1/sessions/s/messages/{mid}")),
            (
                Method::PUT,
                format!("/v1/sessions/s/messages/{mid}?upsert=true"),
            ),
            (Method::GET, format!("/v1/sessions/s/branches/{mid}")),
        ] {
            let request = server.request(method.clone(), &path);
            let answer = server
                .send(request.json(&json!({"role": "user", "content": "x"})))
                .await;
            assert_eq!(
                (answer.status, answer.code()),
                (StatusCode::BAD_REQUEST, "invalid_request"),
                "{method} {path}"
            );
        }
    }
    let bad_escape = server.get("/v1/sessions/%FF%FE/messages").await;
    assert_eq!(bad_escape.status, StatusCode::BAD_REQUEST);
    let form = server
        .send(
            server
                .request(Method::POST, "/v1/sessions/s/messages")
                .header("content-type", "application/x-www-form-urlencoded")
                .body("a=b"),
        )
        .await;
    assert_eq!(
        (form.status, form.code()),
        (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type")
    );
    let unknown = server.get("/v2/whatever").await;
    assert_eq!(
        (unknown.status, unknown.code()),
        (StatusCode::NOT_FOUND, "not_found")
    );
    let wrong_method = server
        .call(Method::PATCH, "/v1/sessions/s/history", None)
        .await;
    assert_eq!(
        (wrong_method.status, wrong_method.code()),
        (StatusCode::NOT_FOUND, "not_found")
    );
    assert_eq!(
        server.get("/v1/sessions/s/history").await.text,
        "",
        "nothing was stored"
    );
}
