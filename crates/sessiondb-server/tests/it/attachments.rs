//! Attachments over HTTP: media comes back inline by default, as pointers on request, and
//! pointers are fetched from `/v1/attachments/{sha256}` within the key's namespace.

use std::collections::HashMap;

use reqwest::StatusCode;
use serde_json::json;
use sessiondb_server::ServerConfig;

use crate::common::{start, start_with};

fn png() -> (Vec<u8>, String) {
    let bytes = sessiondb_testkit::cases::attachments::bytes(120_000, 9);
    let encoded = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, &bytes);
    (bytes, format!("data:image/png;base64,{encoded}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn media_reads_inline_or_as_pointers_and_is_fetched_by_hash() {
    let server = start().await;
    let (bytes, url) = png();
    let message = json!({"id": "pic", "role": "user", "parts": [
        {"type": "text", "text": "look"},
        {"type": "file", "mediaType": "image/png", "url": url}]});
    let appended = server.post("/v1/sessions/s/messages", message).await;
    assert_eq!(appended.status, StatusCode::CREATED);
    assert_eq!(
        appended.json["message"]["parts"][1]["url"], url,
        "the answer is inline"
    );

    let inline = server.get("/v1/sessions/s/messages/pic").await;
    assert!(inline.json["parts"][1]["url"] == url);
    let pointer = server
        .get("/v1/sessions/s/messages/pic?attachments=pointer")
        .await;
    let link = pointer.json["parts"][1]["url"].as_str().unwrap().to_owned();
    let hash = link.strip_prefix("attachment:sha256:").unwrap();
    assert_eq!(hash.len(), 64);
    assert!(pointer.text.len() < 1_000);
    for path in [
        "/v1/sessions/s/history?attachments=pointer",
        "/v1/sessions/s/messages?attachments=pointer",
    ] {
        let answer = server.get(path).await;
        assert!(
            answer.text.contains(&link) && !answer.text.contains("base64"),
            "{path}"
        );
    }
    assert!(
        server
            .get("/v1/sessions/s/history")
            .await
            .text
            .contains(&url)
    );

    let fetched = server
        .send(server.request(reqwest::Method::GET, &format!("/v1/attachments/{hash}")))
        .await;
    assert_eq!(fetched.status, StatusCode::OK);
    assert_eq!(fetched.headers["content-type"], "image/png");
    let raw = server
        .request(reqwest::Method::GET, &format!("/v1/attachments/{hash}"))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert!(raw.as_ref() == bytes.as_slice());

    assert_eq!(
        server
            .get(&format!("/v1/attachments/{}", "0".repeat(64)))
            .await
            .status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        server.get("/v1/attachments/nothex").await.status,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        server
            .get("/v1/sessions/s/history?attachments=maybe")
            .await
            .status,
        StatusCode::BAD_REQUEST
    );
    // Deleting the message collects the payload.
    server.delete("/v1/sessions/s/messages/pic").await;
    assert_eq!(
        server.get(&format!("/v1/attachments/{hash}")).await.status,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attachments_never_cross_namespaces() {
    let config = ServerConfig {
        api_keys: HashMap::from([("ka".into(), "a".into()), ("kb".into(), "b".into())]),
        ..Default::default()
    };
    let mut server = start_with(config).await;
    let (_, url) = png();
    server.key = Some("ka".into());
    server
        .post(
            "/v1/sessions/s/messages",
            json!({"id": "pic", "role": "user", "parts": [{"type": "file", "mediaType": "image/png", "url": url}]}),
        )
        .await;
    let pointer = server
        .get("/v1/sessions/s/messages/pic?attachments=pointer")
        .await;
    let link = pointer.json["parts"][0]["url"].as_str().unwrap().to_owned();
    let hash = link.strip_prefix("attachment:sha256:").unwrap().to_owned();
    assert_eq!(
        server.get(&format!("/v1/attachments/{hash}")).await.status,
        StatusCode::OK
    );
    server.key = Some("kb".into());
    assert_eq!(
        server.get(&format!("/v1/attachments/{hash}")).await.status,
        StatusCode::NOT_FOUND
    );
}
