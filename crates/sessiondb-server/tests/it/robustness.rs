//! Random bytes and random JSON sent to every write route get only 2xx/4xx answers, and the
//! server keeps serving; random path segments and query values on every route get 2xx or a
//! typed JSON error.

use reqwest::{Method, StatusCode};
use serde_json::{Map, Value, json};

use crate::common::start;

/// A small deterministic generator (xorshift64*), so a failure reproduces from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn string(&mut self) -> String {
        const PIECES: [&str; 12] = [
            "",
            "a",
            "m1",
            "user",
            "assistant",
            "text",
            "compaction_x",
            "é",
            "\u{0}",
            "😀",
            "\"quoted\"",
            "*",
        ];
        match self.below(4) {
            0 => PIECES[self.below(PIECES.len() as u64) as usize].to_owned(),
            1 => "x".repeat(self.below(300) as usize),
            _ => (0..self.below(12))
                .map(|_| char::from_u32(self.below(0x2_0000) as u32).unwrap_or('?'))
                .collect(),
        }
    }

    fn value(&mut self, depth: u32) -> Value {
        const KEYS: [&str; 18] = [
            "id",
            "role",
            "parts",
            "content",
            "metadata",
            "type",
            "text",
            "messages",
            "parentId",
            "ids",
            "summary",
            "fromMessageId",
            "toMessageId",
            "name",
            "settings",
            "userId",
            "compactAfter",
            "model",
        ];
        let kind = if depth >= 4 {
            self.below(5)
        } else {
            self.below(8)
        };
        match kind {
            0 => Value::Null,
            1 => Value::Bool(self.below(2) == 0),
            2 => match self.below(4) {
                0 => json!(self.next() as i64),
                1 => json!(-(self.below(1000) as i64)),
                2 => json!(self.below(1000) as f64 / 7.0),
                _ => serde_json::from_str("123456789012345678901234567890").unwrap(),
            },
            3 | 4 => Value::String(self.string()),
            5 => Value::Array((0..self.below(4)).map(|_| self.value(depth + 1)).collect()),
            _ => {
                let mut map = Map::new();
                for _ in 0..self.below(6) {
                    let key = if self.below(4) == 0 {
                        self.string()
                    } else {
                        KEYS[self.below(KEYS.len() as u64) as usize].to_owned()
                    };
                    map.insert(key, self.value(depth + 1));
                }
                Value::Object(map)
            }
        }
    }

    fn bytes(&mut self) -> Vec<u8> {
        (0..self.below(200)).map(|_| self.next() as u8).collect()
    }
}

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

/// The routes of the OpenAPI document the server serves: method, path template and the query
/// parameters each reads. Change feeds (streams that stay open) and the compatibility routes
/// (plain-text errors, as the reference's example answers) are left out.
async fn documented_routes(server: &crate::common::Server) -> Vec<(Method, String, Vec<String>)> {
    let document = server.get("/openapi.json").await.json;
    let mut routes = Vec::new();
    for (path, operations) in document["paths"].as_object().unwrap() {
        if path.ends_with("/events") || path.starts_with("/agents/") {
            continue;
        }
        for (method, operation) in operations.as_object().unwrap() {
            let method = match method.as_str() {
                "get" => Method::GET,
                "post" => Method::POST,
                "put" => Method::PUT,
                "patch" => Method::PATCH,
                "delete" => Method::DELETE,
                _ => continue, // path-level `parameters`
            };
            let query = operation["parameters"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|p| p["in"] == "query")
                .map(|p| p["name"].as_str().unwrap().to_owned())
                .collect();
            routes.push((method, path.clone(), query));
        }
    }
    routes
}

/// Percent-encodes everything but ASCII letters and digits, so any string is one path segment
/// or query value.
fn encoded(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Random path segments and query values (ids with NUL, 300 characters, astral characters,
/// `compaction_` ids, empty ones) on every documented route answer 2xx, or a 4xx with a typed
/// JSON error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_paths_and_queries_get_typed_errors() {
    const SEGMENTS: [&str; 6] = ["s", "m1", "memory", "kb", "k", "set_context"];
    const VALUES: [&str; 10] = [
        "1",
        "0",
        "-1",
        "99999999999999999999",
        "desc",
        "asc",
        "m1",
        "updated",
        "openai",
        "true",
    ];
    let server = start().await;
    server.say("s", "m1", "seed").await;
    let routes = documented_routes(&server).await;
    assert!(routes.len() > 40, "{routes:?}");
    let mut rng = Rng(0xF022_0123);
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    for round in 0..20 {
        for (method, template, query) in &routes {
            let mut path = String::new();
            for piece in template.split('{') {
                // Every piece but the first starts with a parameter's name and its `}`.
                let literal = match piece.split_once('}') {
                    Some((_, literal)) => {
                        let segment = match rng.below(3) {
                            0 => rng.string(),
                            _ => SEGMENTS[rng.below(SEGMENTS.len() as u64) as usize].to_owned(),
                        };
                        path.push_str(&encoded(&segment));
                        literal
                    }
                    None => piece,
                };
                path.push_str(literal);
            }
            let mut params = Vec::new();
            for name in query.iter() {
                if rng.below(2) == 0 {
                    continue;
                }
                let value = match rng.below(3) {
                    0 => rng.string(),
                    _ => VALUES[rng.below(VALUES.len() as u64) as usize].to_owned(),
                };
                params.push(format!("{name}={}", encoded(&value)));
            }
            if !params.is_empty() {
                path = format!("{path}?{}", params.join("&"));
            }
            let mut request = server.request(method.clone(), &path);
            if [Method::POST, Method::PUT, Method::PATCH].contains(method) {
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
                "{method} {path} answered {}: {}",
                answer.status,
                answer.text
            );
            if answer.status.is_client_error() {
                let error = &answer.json["error"];
                assert!(
                    error["code"].is_string() && error["message"].is_string(),
                    "{method} {path} answered {} without a typed error: {}",
                    answer.status,
                    answer.text
                );
            }
        }
    }
    assert!(statuses.keys().any(|s| *s < 300), "{statuses:?}");
    assert!(statuses.keys().any(|s| *s >= 400), "{statuses:?}");
    assert_eq!(server.get("/healthz").await.status, StatusCode::OK);
}
