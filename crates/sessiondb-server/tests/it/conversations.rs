//! The conversation API over HTTP: the conversation-id header, converted history, state
//! validation and typed limit errors.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use sessiondb_server::{Limits, ServerConfig};

use crate::common::{start, start_with};

const HEADER: &str = "sessiondb-conversation-id";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_conversation_id_header_names_the_conversation_and_is_echoed() {
    let server = start().await;
    let message = json!({"role": "user", "content": "hi"});
    let by_header = server
        .send(
            server
                .request(Method::POST, "/v1/messages")
                .header(HEADER, "conv-1")
                .json(&message),
        )
        .await;
    assert_eq!(by_header.status, StatusCode::CREATED, "{by_header:?}");
    assert_eq!(by_header.headers[HEADER], "conv-1");
    assert!(by_header.headers.contains_key("x-request-id"));
    let id = by_header.json["message"]["id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("msg_"));
    assert_eq!(server.get("/v1/sessions/conv-1/messages").await.ids(), [id]);

    // Without the header there is no conversation to append to.
    let missing = server.post("/v1/messages", message.clone()).await;
    assert_eq!(
        (missing.status, missing.code()),
        (StatusCode::BAD_REQUEST, "invalid_request")
    );
    // On the session route the header must agree with the path.
    let disagreeing = server
        .send(
            server
                .request(Method::POST, "/v1/sessions/conv-1/messages")
                .header(HEADER, "conv-2")
                .json(&message),
        )
        .await;
    assert_eq!(disagreeing.status, StatusCode::BAD_REQUEST);
    let agreeing = server
        .send(
            server
                .request(Method::POST, "/v1/sessions/conv-1/messages")
                .header(HEADER, "conv-1")
                .json(&message),
        )
        .await;
    assert_eq!(agreeing.status, StatusCode::CREATED);
    assert_eq!(agreeing.headers[HEADER], "conv-1");
    let too_long = server
        .send(
            server
                .request(Method::POST, "/v1/messages")
                .header(HEADER, "x".repeat(257))
                .json(&message),
        )
        .await;
    assert_eq!(too_long.status, StatusCode::BAD_REQUEST);
    // Errors name the header the client sent, not the session id it stands for.
    assert!(
        too_long.json["error"]["message"]
            .as_str()
            .unwrap()
            .contains(HEADER),
        "{too_long:?}"
    );
    // A UTF-8 id reaches the session its percent-encoded path names; other bytes are refused.
    let utf8 = server
        .send(
            server
                .request(Method::POST, "/v1/messages")
                .header(
                    HEADER,
                    reqwest::header::HeaderValue::from_bytes("café".as_bytes()).unwrap(),
                )
                .json(&message),
        )
        .await;
    assert_eq!(utf8.status, StatusCode::CREATED, "{utf8:?}");
    assert_eq!(utf8.headers[HEADER].as_bytes(), "café".as_bytes());
    assert_eq!(
        server
            .get("/v1/sessions/caf%C3%A9/messages")
            .await
            .ids()
            .len(),
        1
    );
    let latin1 = server
        .send(
            server
                .request(Method::POST, "/v1/messages")
                .header(
                    HEADER,
                    reqwest::header::HeaderValue::from_bytes(b"caf\xe9").unwrap(),
                )
                .json(&message),
        )
        .await;
    assert_eq!(latin1.status, StatusCode::BAD_REQUEST);
    assert!(
        latin1.json["error"]["message"]
            .as_str()
            .unwrap()
            .contains("UTF-8")
    );
    // Any route echoes the header.
    let read = server
        .send(
            server
                .request(Method::GET, "/v1/sessions/conv-1")
                .header(HEADER, "conv-1"),
        )
        .await;
    assert_eq!(read.headers[HEADER], "conv-1");
    assert_eq!(read.json["messageCount"], 2);
    assert!(server.get("/v1/sessions/conv-2").await.status == StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_converts_to_model_formats() {
    let server = start().await;
    let messages = json!([
        {"id": "s", "role": "system", "content": "Be brief."},
        {"id": "u", "role": "user", "content": "2+2?"},
        {"id": "a", "role": "assistant", "parts": [
            {"type": "tool-add", "toolCallId": "t1", "state": "output-available", "input": {"a": 2, "b": 2}, "output": 4},
            {"type": "text", "text": "4"}
        ]}
    ]);
    let batch = server
        .post(
            "/v1/sessions/c/messages/batch",
            json!({"messages": messages}),
        )
        .await;
    assert_eq!(batch.status, StatusCode::CREATED);

    let openai = server.get("/v1/sessions/c/history?format=openai").await;
    assert_eq!(openai.status, StatusCode::OK);
    assert_eq!(
        openai.json,
        json!([
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "t1", "type": "function", "function": {"name": "add", "arguments": "{\"a\":2,\"b\":2}"}}
            ]},
            {"role": "tool", "tool_call_id": "t1", "content": "4"},
            {"role": "assistant", "content": "4"}
        ])
    );
    let responses = server
        .get("/v1/sessions/c/history?format=openai-responses")
        .await;
    let kinds: Vec<&str> = responses
        .json
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["type"].as_str().or(i["role"].as_str()).unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "system",
            "user",
            "function_call",
            "function_call_output",
            "assistant"
        ]
    );
    let anthropic = server.get("/v1/sessions/c/history?format=anthropic").await;
    assert_eq!(anthropic.json["system"], "Be brief.");
    let roles: Vec<&str> = anthropic.json["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["user", "assistant", "user", "assistant"]);

    // Overlays apply: a compaction summary stands in for the rows it covers.
    server
        .post(
            "/v1/sessions/c/compactions",
            json!({"summary": "Asked for a sum.", "fromMessageId": "u", "toMessageId": "a"}),
        )
        .await;
    let compacted = server.get("/v1/sessions/c/history?format=openai").await;
    assert_eq!(
        compacted.json,
        json!([
            {"role": "system", "content": "Be brief."},
            {"role": "assistant", "content": "Asked for a sum."}
        ])
    );

    for bad in [
        "/v1/sessions/c/history?format=xml",
        "/v1/sessions/c/history?format=openai&order=newest",
        "/v1/sessions/c/history?format=anthropic&maxBytes=100",
    ] {
        let answer = server.get(bad).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{bad}");
    }
    let unknown = server.get("/v1/sessions/none/history?format=openai").await;
    assert_eq!(
        (unknown.status, unknown.json.clone()),
        (StatusCode::OK, json!([]))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_refuses_what_is_not_json_and_limits_have_their_kinds() {
    let config = ServerConfig {
        limits: Limits {
            max_message_bytes: 1_000,
            max_messages_per_session: 2,
            ..Default::default()
        },
        ..Default::default()
    };
    let server = start_with(config).await;
    for body in [
        "NaN",
        "Infinity",
        "-Infinity",
        "{\"a\": NaN}",
        "undefined",
        "function(){}",
    ] {
        let answer = server
            .send(
                server
                    .request(Method::PUT, "/v1/sessions/c/state/k")
                    .header("content-type", "application/json")
                    .body(body),
            )
            .await;
        assert_eq!(
            (answer.status, answer.code()),
            (StatusCode::BAD_REQUEST, "invalid_request"),
            "{body}"
        );
    }
    assert_eq!(server.get("/v1/sessions/c/state").await.json, json!({}));
    let big = server
        .put("/v1/sessions/c/state/k", Value::String("x".repeat(1_000)))
        .await;
    assert_eq!(
        (big.status, big.code()),
        (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large")
    );
    let long_key = server
        .put(
            &format!("/v1/sessions/c/state/{}", "k".repeat(257)),
            json!(1),
        )
        .await;
    assert_eq!(long_key.status, StatusCode::BAD_REQUEST);

    for text in ["one", "two"] {
        let ok = server
            .post(
                "/v1/sessions/c/messages",
                json!({"role": "user", "content": text}),
            )
            .await;
        assert_eq!(ok.status, StatusCode::CREATED);
    }
    let over = server
        .post(
            "/v1/sessions/c/messages",
            json!({"role": "user", "content": "three"}),
        )
        .await;
    assert_eq!(
        (over.status, over.code()),
        (StatusCode::CONFLICT, "quota_exceeded")
    );
    let limit = server.get("/v1/sessions/c/messages?limit=101").await;
    assert_eq!(
        (limit.status, limit.code()),
        (StatusCode::BAD_REQUEST, "invalid_request")
    );
    let both = server.get("/v1/sessions/c/messages?after=a&before=b").await;
    assert_eq!(both.status, StatusCode::BAD_REQUEST);
    assert_eq!(server.get("/v1/sessions/c").await.json["messageCount"], 2);
}
