//! Health, readiness, metrics, the OpenAPI document, request ids and graceful shutdown.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;

use crate::common::{SseReader, start};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_readiness_metrics_and_request_ids() {
    let server = start().await;
    assert_eq!(server.get("/healthz").await.json["status"], "ok");
    assert_eq!(server.get("/readyz").await.status, StatusCode::OK);
    server.say("s", "a", "hello").await;
    server.get("/v1/sessions/s/history").await;
    let _feed = SseReader::open(&server, "/v1/sessions/s/events", None).await;

    let metrics = server.get("/metrics").await;
    assert!(
        metrics.headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain")
    );
    let text = metrics.text;
    for expected in [
        "sessiondb_http_requests_total{method=\"POST\",route=\"/v1/sessions/{sid}/messages\",status=\"201\"} 1",
        "sessiondb_http_request_duration_seconds_count{method=\"GET\",route=\"/v1/sessions/{sid}/history\"} 1",
        "sessiondb_appended_messages_total 1",
        "sessiondb_live_subscribers 1",
        "sessiondb_commits_total",
    ] {
        assert!(text.contains(expected), "missing `{expected}` in\n{text}");
    }
    let bytes_line = text
        .lines()
        .find(|l| l.starts_with("sessiondb_appended_bytes_total "))
        .unwrap();
    assert!(
        bytes_line
            .split(' ')
            .nth(1)
            .unwrap()
            .parse::<u64>()
            .unwrap()
            > 0
    );

    let answer = server
        .send(
            server
                .request(reqwest::Method::GET, "/healthz")
                .header("x-request-id", "abc-123"),
        )
        .await;
    assert_eq!(answer.headers["x-request-id"], "abc-123");
    let generated = server.get("/healthz").await;
    assert_eq!(generated.headers["x-request-id"].len(), 32);

    // Once shutdown begins, readiness fails so a load balancer stops sending work.
    server.app.begin_shutdown();
    let draining = server.get("/readyz").await;
    assert_eq!(draining.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(draining.code(), "unavailable");
    assert_eq!(server.get("/healthz").await.status, StatusCode::OK);
}

/// Once a sync of the write-ahead log fails (its file is gone when the store first syncs it),
/// writes answer 500 and readiness fails, so an orchestrator restarts the server; reads go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_sync_fails_writes_and_readiness() {
    let server = start().await;
    std::fs::remove_file(
        server
            .dir
            .path()
            .join(format!("{}-wal", sessiondb::DATABASE_FILE)),
    )
    .unwrap();
    for id in ["a", "b"] {
        let refused = server
            .post(
                "/v1/sessions/s/messages",
                serde_json::json!({"id": id, "role": "user", "content": "hello"}),
            )
            .await;
        assert_eq!(
            refused.status,
            StatusCode::INTERNAL_SERVER_ERROR,
            "{refused:?}"
        );
        assert_eq!(refused.code(), "internal");
        assert!(refused.text.contains("reopen"), "{refused:?}");
    }
    let ready = server.get("/readyz").await;
    assert_eq!(ready.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(ready.text.contains("stopped taking writes"), "{ready:?}");
    assert_eq!(
        server.get("/v1/sessions/s/messages/b").await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(server.get("/healthz").await.status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openapi_document_lists_every_route() {
    let server = start().await;
    let doc = server.get("/openapi.json").await;
    assert_eq!(doc.status, StatusCode::OK);
    let paths = doc.json["paths"].as_object().expect("paths");
    for path in [
        "/v1/sessions",
        "/v1/sessions/{sid}",
        "/v1/messages",
        "/v1/attachments/{hash}",
        "/v1/sessions/{sid}/messages",
        "/v1/sessions/{sid}/messages/batch",
        "/v1/sessions/{sid}/messages/delete",
        "/v1/sessions/{sid}/messages/{mid}",
        "/v1/sessions/{sid}/history",
        "/v1/sessions/{sid}/branches/{mid}",
        "/v1/sessions/{sid}/rows",
        "/v1/sessions/{sid}/search",
        "/v1/search",
        "/v1/sessions/{sid}/import",
        "/v1/sessions/{sid}/export",
        "/v1/sessions/{sid}/compactions",
        "/v1/sessions/{sid}/compact",
        "/v1/sessions/{sid}/fork",
        "/v1/sessions/{sid}/split",
        "/v1/sessions/{sid}/usage",
        "/v1/sessions/{sid}/state",
        "/v1/sessions/{sid}/state/{key}",
        "/v1/sessions/{sid}/context",
        "/v1/sessions/{sid}/context/{label}",
        "/v1/sessions/{sid}/context/{label}/append",
        "/v1/sessions/{sid}/context/{label}/entries",
        "/v1/sessions/{sid}/context/{label}/entries/{key}",
        "/v1/context",
        "/v1/context/{label}",
        "/v1/context/{label}/append",
        "/v1/context/{label}/entries",
        "/v1/context/{label}/entries/{key}",
        "/v1/sessions/{sid}/prompt",
        "/v1/sessions/{sid}/prompt/refresh",
        "/v1/sessions/{sid}/tools",
        "/v1/sessions/{sid}/tools/{name}",
        "/v1/sessions/{sid}/events",
        "/v1/events",
        "/healthz",
        "/readyz",
        "/metrics",
        "/openapi.json",
    ] {
        assert!(
            paths.contains_key(path),
            "{path} missing from /openapi.json"
        );
    }
    let error = &doc.json["components"]["schemas"]["Error"];
    assert!(error.is_object(), "the error schema is documented");
    assert!(matches!(doc.json["openapi"], Value::String(_)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_feeds_and_keeps_every_acknowledged_write() {
    let mut server = start().await;
    let mut feed = SseReader::open(&server, "/v1/sessions/s/events", None).await;
    // Concurrent writers; every acknowledged append must survive the shutdown that follows.
    let mut writers = Vec::new();
    for w in 0..8 {
        let (client, base) = (server.client.clone(), server.base.clone());
        writers.push(tokio::spawn(async move {
            let mut acknowledged = Vec::new();
            for i in 0..20 {
                let id = format!("w{w}-{i}");
                let body = serde_json::json!({"id": id, "role": "user", "content": "x"});
                match client
                    .post(format!("{base}/v1/sessions/s/messages"))
                    .json(&body)
                    .send()
                    .await
                {
                    Ok(r) if r.status() == StatusCode::CREATED => acknowledged.push(id),
                    _ => break,
                }
            }
            acknowledged
        }));
    }
    tokio::time::sleep(Duration::from_millis(30)).await;
    let store_handle = server.app.clone();
    server.stop().await;
    // The open feed does not hold up the shutdown: it ends after the events it carried.
    while let Some(event) = feed.next().await {
        assert_eq!(event.event, "append");
    }
    let mut acknowledged = Vec::new();
    for writer in writers {
        acknowledged.extend(writer.await.unwrap());
    }
    assert!(!acknowledged.is_empty());
    let session = store_handle.db.session("s").unwrap();
    for id in &acknowledged {
        assert!(
            session.message(id).await.unwrap().is_some(),
            "{id} was acknowledged"
        );
    }
}
