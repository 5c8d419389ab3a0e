//! Random input for the HTTP API, shared by the server's tests (on SQLite) and the command
//! line's (a server on PostgreSQL): a seeded generator of strings, JSON values and bytes, and
//! requests for every route of the OpenAPI document with random path segments and query values.
//! A failure reproduces from its seed.

use serde_json::{Map, Value, json};

/// A small deterministic generator (xorshift64*), so a failure reproduces from its seed.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    pub fn string(&mut self) -> String {
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

    pub fn value(&mut self, depth: u32) -> Value {
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
                0 => json!(self.next_u64() as i64),
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

    pub fn bytes(&mut self) -> Vec<u8> {
        (0..self.below(200))
            .map(|_| self.next_u64() as u8)
            .collect()
    }
}

/// A route of the OpenAPI document: its method (upper case), its path template (`{name}`
/// where a segment goes) and the query parameters it reads.
#[derive(Debug, Clone)]
pub struct Route {
    pub method: &'static str,
    pub template: String,
    pub query: Vec<String>,
}

impl Route {
    /// Whether requests of this method carry a body.
    pub fn takes_body(&self) -> bool {
        matches!(self.method, "POST" | "PUT" | "PATCH")
    }
}

/// The routes of an OpenAPI `document`, leaving out change feeds (streams that stay open) and
/// the compatibility routes (plain-text errors, as the reference's example answers).
pub fn documented_routes(document: &Value) -> Vec<Route> {
    let mut routes = Vec::new();
    let Some(paths) = document["paths"].as_object() else {
        return routes;
    };
    for (template, operations) in paths {
        if template.ends_with("/events") || template.starts_with("/agents/") {
            continue;
        }
        for (method, operation) in operations.as_object().into_iter().flatten() {
            let method = match method.as_str() {
                "get" => "GET",
                "post" => "POST",
                "put" => "PUT",
                "patch" => "PATCH",
                "delete" => "DELETE",
                _ => continue, // path-level `parameters`
            };
            let query = operation["parameters"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|p| p["in"] == "query")
                .filter_map(|p| p["name"].as_str().map(str::to_owned))
                .collect();
            routes.push(Route {
                method,
                template: template.clone(),
                query,
            });
        }
    }
    routes
}

/// Percent-encodes everything but ASCII letters and digits, so any string is one path segment
/// or query value.
pub fn encoded(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

impl Rng {
    /// A path and query for `route`: each segment a random string (ids with NUL, 300
    /// characters, astral characters, empty ones, …) or one of `segments`, each query
    /// parameter left out or a random string or one of `values`.
    pub fn target(&mut self, route: &Route, segments: &[&str], values: &[&str]) -> String {
        let mut target = String::new();
        for piece in route.template.split('{') {
            // Every piece but the first starts with a parameter's name and its `}`.
            let literal = match piece.split_once('}') {
                Some((_, literal)) => {
                    let segment = self.string_or(segments);
                    target.push_str(&encoded(&segment));
                    literal
                }
                None => piece,
            };
            target.push_str(literal);
        }
        let mut separator = '?';
        for name in &route.query {
            if self.below(2) == 0 {
                continue;
            }
            let value = self.string_or(values);
            target.push_str(&format!("{separator}{name}={}", encoded(&value)));
            separator = '&';
        }
        target
    }

    /// A random string one time in three, else one of `choices`.
    fn string_or(&mut self, choices: &[&str]) -> String {
        match self.below(3) {
            0 => self.string(),
            _ => choices[self.below(choices.len() as u64) as usize].to_owned(),
        }
    }
}

/// Whether `body` is the API's typed error, `{"error": {"code", "message"}}`.
pub fn is_typed_error(body: &Value) -> bool {
    body["error"]["code"].is_string() && body["error"]["message"].is_string()
}

/// Segments that name things a test's server holds (session `s` with message `m1`, blocks,
/// keys, a tool) and query values that parse, so random requests also reach the success paths.
pub const SEGMENTS: [&str; 6] = ["s", "m1", "memory", "kb", "k", "set_context"];
pub const VALUES: [&str; 10] = [
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_fill_every_segment_and_encode_what_they_put_in() {
        let document = json!({"paths": {
            "/v1/sessions/{sid}/messages/{mid}": {
                "parameters": [],
                "get": {"parameters": [{"in": "query", "name": "attachments"}]},
                "delete": {}
            },
            "/v1/sessions/{sid}/events": {"get": {}},
            "/agents/session-object/{name}/{rest}": {"get": {}}
        }});
        let routes = documented_routes(&document);
        assert_eq!(routes.len(), 2, "{routes:?}");
        let get = routes.iter().find(|r| r.method == "GET").unwrap();
        assert_eq!(get.query, ["attachments"]);
        let mut rng = Rng(7);
        for _ in 0..200 {
            let target = rng.target(get, &["s"], &["1"]);
            assert!(target.starts_with("/v1/sessions/"), "{target}");
            assert!(!target.contains('{') && !target.contains('}'), "{target}");
            let path = target.split('?').next().unwrap();
            assert_eq!(path.matches('/').count(), 5, "{target}");
            assert!(path.contains("/messages/"), "{target}");
        }
        assert_eq!(encoded("a b/é"), "a%20b%2F%C3%A9");
        assert!(is_typed_error(
            &json!({"error": {"code": "x", "message": "y"}})
        ));
        assert!(!is_typed_error(&json!({"error": "x"})));
    }
}
