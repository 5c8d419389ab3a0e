//! Pages of the configured origins may call the API from a browser: preflights are answered
//! before routing and answers name the origin; other origins, and a server with none
//! configured, get no CORS header.

use reqwest::{Method, StatusCode};
use serde_json::json;
use sessiondb_server::ServerConfig;

use crate::common::{start, start_with};

const PAGE: &str = "http://localhost:5173";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_of_allowed_origins_may_call_the_api() {
    let server = start_with(ServerConfig {
        cors_origins: vec![PAGE.to_owned()],
        ..Default::default()
    })
    .await;

    // The browser's preflight for a JSON POST with a bearer key.
    let preflight = server
        .send(
            server
                .request(Method::OPTIONS, "/v1/sessions/s/messages")
                .header("origin", PAGE)
                .header("access-control-request-method", "POST")
                .header(
                    "access-control-request-headers",
                    "authorization, content-type",
                ),
        )
        .await;
    assert_eq!(preflight.status, StatusCode::NO_CONTENT, "{preflight:?}");
    let headers = &preflight.headers;
    assert_eq!(headers["access-control-allow-origin"], PAGE);
    assert!(
        headers["access-control-allow-methods"]
            .to_str()
            .unwrap()
            .contains("POST")
    );
    let allowed = headers["access-control-allow-headers"].to_str().unwrap();
    assert!(allowed.contains("authorization") && allowed.contains("content-type"));
    assert!(headers.contains_key("access-control-max-age"));

    let appended = server
        .send(
            server
                .request(Method::POST, "/v1/sessions/s/messages")
                .header("origin", PAGE)
                .json(&json!({"role": "user", "content": "from a page"})),
        )
        .await;
    assert_eq!(appended.status, StatusCode::CREATED);
    assert_eq!(appended.headers["access-control-allow-origin"], PAGE);
    assert!(
        appended.headers["access-control-expose-headers"]
            .to_str()
            .unwrap()
            .contains("x-request-id")
    );
    assert_eq!(appended.headers["vary"], "origin");
    // An error answer carries them too, so the page can read why.
    let missing = server
        .send(
            server
                .request(Method::GET, "/v1/sessions/nope")
                .header("origin", PAGE),
        )
        .await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert_eq!(missing.headers["access-control-allow-origin"], PAGE);

    // Another origin's page gets nothing that lets its browser show it the answer, and its
    // preflight is an unknown route's 404.
    let other = server
        .send(
            server
                .request(Method::GET, "/v1/sessions/s")
                .header("origin", "https://elsewhere.example"),
        )
        .await;
    assert_eq!(other.status, StatusCode::OK);
    assert!(!other.headers.contains_key("access-control-allow-origin"));
    let other_preflight = server
        .send(
            server
                .request(Method::OPTIONS, "/v1/sessions/s/messages")
                .header("origin", "https://elsewhere.example")
                .header("access-control-request-method", "POST"),
        )
        .await;
    assert_eq!(other_preflight.status, StatusCode::NOT_FOUND);
    assert!(
        !other_preflight
            .headers
            .contains_key("access-control-allow-origin")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_origin_when_configured_and_none_by_default() {
    let open = start_with(ServerConfig {
        cors_origins: vec![sessiondb_server::cors::ANY_ORIGIN.to_owned()],
        ..Default::default()
    })
    .await;
    let answer = open
        .send(
            open.request(Method::GET, "/healthz")
                .header("origin", "https://any.example"),
        )
        .await;
    assert_eq!(
        answer.headers["access-control-allow-origin"],
        "https://any.example"
    );

    let closed = start().await;
    let answer = closed
        .send(
            closed
                .request(Method::GET, "/healthz")
                .header("origin", PAGE),
        )
        .await;
    assert_eq!(answer.status, StatusCode::OK);
    assert!(!answer.headers.contains_key("access-control-allow-origin"));
}
