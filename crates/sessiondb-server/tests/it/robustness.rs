//! Random bytes and random JSON sent to every write route get only 2xx/4xx answers, and the
//! server keeps serving; random path segments and query values on every route get 2xx or a
//! typed JSON error.

use reqwest::{Method, StatusCode};
use serde_json::json;
use sessiondb_testkit::http_fuzz::{Rng, SEGMENTS, VALUES, documented_routes, is_typed_error};

use crate::common::start;

const WRITE_ROUTES: [(Method, &str); 24] = [
    (Method::POST, "/v1/sessions"),
    (Method::PATCH, "/v1/sessions/s"),
    (Method::POST, "/v1/sessions/s/messages"),
    (Method::POST, "/v1/sessions/s/messages?parent="),
    (Method::POST, "/v1/sessions/s/messages?parent=m1"),
    (Method::POST, "/v1/sessions/s/messages/batch"),
    (Method::PUT, "/v1/sessions/s/messages/m1"),
    (Method::PUT, "/v1/sessions/s/messages/m1?upsert=true"),
    (Method::PATCH, "/v1/sessions/s/messages/m1"),
    (Method::POST, "/v1/sessions/s/messages/delete"),
    (Method::POST, "/v1/sessions/s/import"),
    (Method::POST, "/v1/sessions/s/compactions"),
    (Method::PUT, "/v1/sessions/s/state/k"),
    (Method::PUT, "/v1/sessions/s/context/memory"),
    (Method::POST, "/v1/sessions/s/context/memory/append"),
    (Method::PUT, "/v1/sessions/s/context/kb/entries/k"),
    (Method::PUT, "/v1/context/memory"),
    (Method::POST, "/v1/context/memory/append"),
    (Method::PUT, "/v1/context/kb/entries/k"),
    (Method::POST, "/v1/sessions/s/prompt/refresh"),
    (Method::POST, "/v1/sessions/s/tools/set_context"),
    (Method::POST, "/agents/session-object/s/messages"),
    (Method::POST, "/agents/session-object/s/compactions"),
    (Method::PUT, "/agents/session-object/s/whatever"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_input_never_gets_a_5xx() {
    let server = start().await;
    server.say("s", "m1", "seed").await;
    let mut rng = Rng(0x5E55_10DB);
    let rounds: usize = std::env::var("ROBUSTNESS_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    for round in 0..rounds {
        for (method, path) in &WRITE_ROUTES {
            let body = if round % 3 == 0 {
                rng.bytes()
            } else {
                rng.value(0).to_string().into_bytes()
            };
            let mut request = server.request(method.clone(), path).body(body.clone());
            if round % 2 == 0 {
                request = request.header("content-type", "application/json");
            }
            let answer = server.send(request).await;
            *statuses.entry(answer.status.as_u16()).or_default() += 1;
            assert!(
                !answer.status.is_server_error(),
                "{method} {path} answered {} to {:?}: {}",
                answer.status,
                String::from_utf8_lossy(&body),
                answer.text
            );
        }
    }
    // Some random input was valid: the generator reaches the success paths too.
    assert!(statuses.keys().any(|s| *s < 300), "{statuses:?}");
    assert_eq!(server.get("/healthz").await.status, StatusCode::OK);
    server.say("s", "after", "still serving").await;
}

/// Random path segments and query values (ids with NUL, 300 characters, astral characters,
/// `compaction_` ids, empty ones) on every documented route answer 2xx, or a 4xx with a typed
/// JSON error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_paths_and_queries_get_typed_errors() {
    let server = start().await;
    server.say("s", "m1", "seed").await;
    let routes = documented_routes(&server.get("/openapi.json").await.json);
    assert!(routes.len() > 40, "{routes:?}");
    let mut rng = Rng(0xF022_0123);
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    for round in 0..20 {
        for route in &routes {
            let target = rng.target(route, &SEGMENTS, &VALUES);
            let method = Method::from_bytes(route.method.as_bytes()).unwrap();
            let mut request = server.request(method, &target);
            if route.takes_body() {
                let body = if round % 4 == 0 {
                    json!({})
                } else {
                    rng.value(0)
                };
                request = request
                    .header("content-type", "application/json")
                    .body(body.to_string());
            }
            let answer = server.send(request).await;
            *statuses.entry(answer.status.as_u16()).or_default() += 1;
            assert!(
                !answer.status.is_server_error(),
                "{} {target} answered {}: {}",
                route.method,
                answer.status,
                answer.text
            );
            assert!(
                !answer.status.is_client_error() || is_typed_error(&answer.json),
                "{} {target} answered {} without a typed error: {}",
                route.method,
                answer.status,
                answer.text
            );
        }
    }
    assert!(statuses.keys().any(|s| *s < 300), "{statuses:?}");
    assert!(statuses.keys().any(|s| *s >= 400), "{statuses:?}");
    assert_eq!(server.get("/healthz").await.status, StatusCode::OK);
}
