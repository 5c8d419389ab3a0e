//! Compaction and SessionManager routes over HTTP, and the end-to-end auto-compaction run.

use std::collections::HashSet;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use sessiondb::Options;
use sessiondb_server::ServerConfig;

use crate::common::{Server, SseReader, start, start_with_options};

fn words(prefix: &str, n: usize) -> String {
    (0..n)
        .map(|i| format!("{prefix}{}", i % 17))
        .collect::<Vec<_>>()
        .join(" ")
}

/// One turn: a question, a tool call, its result and the answer (chat-completions shape).
fn turn(i: usize) -> Value {
    json!([
        {"id": format!("u{i}"), "role": "user", "content": format!("question {i}: {}", words("about", 30))},
        {"id": format!("c{i}"), "role": "assistant", "content": "", "tool_calls": [
            {"id": format!("call{i}"), "type": "function",
             "function": {"name": "lookup", "arguments": format!("{{\"q\":\"topic {i}\"}}")}}
        ]},
        {"id": format!("r{i}"), "role": "tool", "tool_call_id": format!("call{i}"), "content": words("result", 60)},
        {"id": format!("a{i}"), "role": "assistant", "content": format!("answer {i}: {}", words("because", 30))}
    ])
}

/// In the model-facing history every tool message answers a call of the assistant message
/// just before its run of tool messages, and every call is answered.
fn assert_calls_paired(messages: &[Value]) {
    let mut open: HashSet<String> = HashSet::new();
    for m in messages {
        match m["role"].as_str().unwrap() {
            "tool" => {
                let id = m["tool_call_id"].as_str().unwrap();
                assert!(open.remove(id), "result {id} without its call");
            }
            role => {
                assert!(
                    open.is_empty(),
                    "calls {open:?} without results before a {role} message"
                );
                if let Some(calls) = m["tool_calls"].as_array() {
                    open = calls
                        .iter()
                        .map(|c| c["id"].as_str().unwrap().to_owned())
                        .collect();
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hundred_tool_turns_stay_under_the_threshold_and_lose_nothing() {
    let server = start().await;
    let threshold = 3_000u64;
    let created = server
        .post(
            "/v1/sessions",
            json!({"id": "agent", "settings": {"compactAfter": threshold, "keepRecentTokens": 1_000}}),
        )
        .await;
    assert_eq!(created.status, StatusCode::CREATED);
    // Every turn has the same shape; its tokens come from the first one's row stats.
    let mut turn_tokens = 0u64;
    let mut peak = 0u64;
    for i in 0..300 {
        let answer = server
            .post(
                "/v1/sessions/agent/messages/batch",
                json!({"messages": turn(i)}),
            )
            .await;
        assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
        if i == 0 {
            let rows = server.get("/v1/sessions/agent/rows").await.json;
            turn_tokens = rows
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["tokenEstimate"].as_u64().unwrap())
                .sum();
        }
        let after = server.get("/v1/sessions/agent").await.json["tokenEstimate"]
            .as_u64()
            .unwrap();
        peak = peak.max(after);
        assert!(
            after <= threshold + turn_tokens,
            "turn {i}: the model-facing history holds {after} tokens"
        );
    }
    let compactions = server.get("/v1/sessions/agent/compactions").await.json;
    assert!(compactions.as_array().unwrap().len() >= 10, "{compactions}");
    let info = server.get("/v1/sessions/agent").await.json;
    assert_eq!(
        info["messageCount"], 1_200,
        "the raw path keeps every message"
    );
    eprintln!(
        "300 turns: peak {peak} tokens, {} compactions, raw path {} messages",
        compactions.as_array().unwrap().len(),
        info["messageCount"]
    );

    // Every original message is still readable by id.
    for i in 0..300 {
        for id in [
            format!("u{i}"),
            format!("c{i}"),
            format!("r{i}"),
            format!("a{i}"),
        ] {
            let m = server
                .get(&format!("/v1/sessions/agent/messages/{id}"))
                .await;
            assert_eq!(m.status, StatusCode::OK, "{id}");
        }
    }
    // No tool call is separated from its result in what a model sees.
    let openai = server.get("/v1/sessions/agent/history?format=openai").await;
    let messages = openai.json.as_array().unwrap();
    assert!(
        messages.len() < 200,
        "compacted: {} messages",
        messages.len()
    );
    assert_calls_paired(messages);
    let last = &messages[messages.len() - 1];
    assert_eq!(
        last["content"].as_str().unwrap().split(':').next(),
        Some("answer 299")
    );
}

async fn chat(server: &Server, sid: &str, n: usize) {
    for i in 0..n {
        server
            .say(sid, &format!("m{i}"), &format!("message {i}"))
            .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compact_fork_split_and_usage_routes() {
    let server = start().await;
    chat(&server, "s", 4).await;
    let nothing = server
        .call(Method::POST, "/v1/sessions/s/compact", None)
        .await;
    assert_eq!(nothing.status, StatusCode::NO_CONTENT, "{nothing:?}");
    chat(&server, "long", 30).await;
    server
        .patch(
            "/v1/sessions/long",
            json!({"settings": {"keepRecentTokens": 10, "compactAfter": 100000}}),
        )
        .await;
    let mut feed = SseReader::open(&server, "/v1/sessions/long/events", None).await;
    let compacted = server
        .call(Method::POST, "/v1/sessions/long/compact", None)
        .await;
    assert_eq!(compacted.status, StatusCode::OK, "{compacted:?}");
    // The run is announced around the summary: `status` events carry no position of their own.
    let events = feed.take(3).await;
    let names: Vec<&str> = events.iter().map(|e| e.event.as_str()).collect();
    assert_eq!(names, ["status", "compact", "status"]);
    let before = events[0].data["tokenEstimate"].as_u64().unwrap();
    assert_eq!(events[0].data["phase"], "compacting");
    assert_eq!(events[0].data["tokenThreshold"], 100000);
    assert!(events[0].data.get("compacted").is_none());
    assert_eq!(events[2].data["phase"], "idle");
    assert_eq!(events[2].data["compacted"], json!({"tokensBefore": before}));
    assert!(events[2].data["tokenEstimate"].as_u64().unwrap() < before);
    assert_eq!(events[2].data["sessionId"], "long");
    assert_eq!(compacted.json["fromMessageId"], "m3");
    assert!(
        compacted.json["summary"]
            .as_str()
            .unwrap()
            .starts_with("## Topic")
    );
    let history = server.get("/v1/sessions/long/history").await.ids();
    assert!(history[3].starts_with("compaction_"));

    let fork = server
        .post(
            "/v1/sessions/s/fork",
            json!({"atMessageId": "m1", "id": "f", "name": "alt"}),
        )
        .await;
    assert_eq!(fork.status, StatusCode::CREATED, "{fork:?}");
    assert_eq!(
        (
            fork.json["id"].clone(),
            fork.json["parentSessionId"].clone(),
            fork.json["messageCount"].clone()
        ),
        (json!("f"), json!("s"), json!(2))
    );
    let again = server
        .post(
            "/v1/sessions/s/fork",
            json!({"atMessageId": "m1", "id": "f"}),
        )
        .await;
    assert_eq!(
        (again.status, again.code()),
        (StatusCode::CONFLICT, "conflict")
    );
    let missing = server
        .post("/v1/sessions/s/fork", json!({"atMessageId": "nope"}))
        .await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    let bad = server
        .post("/v1/sessions/s/fork", json!({"at": "m1"}))
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);

    let split = server
        .post("/v1/sessions/s/split", json!({"summary": "We said hello."}))
        .await;
    assert_eq!(split.status, StatusCode::CREATED, "{split:?}");
    assert_eq!(split.json["parentSessionId"], "s");
    assert_eq!(split.json["messageCount"], 1);
    assert_eq!(
        server.get("/v1/sessions/s").await.json["endReason"],
        "compaction"
    );

    let usage = server
        .post(
            "/v1/sessions/s/usage",
            json!({"inputTokens": 10, "outputTokens": 4, "cost": 0.5}),
        )
        .await;
    assert_eq!(usage.status, StatusCode::OK);
    let usage = server
        .post(
            "/v1/sessions/s/usage",
            json!({"inputTokens": 1, "outputTokens": 1, "cost": 0.25}),
        )
        .await;
    assert_eq!(
        (
            usage.json["inputTokens"].clone(),
            usage.json["outputTokens"].clone(),
            usage.json["cost"].clone()
        ),
        (json!(11), json!(5), json!(0.75))
    );
    let negative = server
        .post("/v1/sessions/s/usage", json!({"inputTokens": -1}))
        .await;
    assert_eq!(negative.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        server
            .post("/v1/sessions/none/usage", json!({"inputTokens": 1}))
            .await
            .status,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compact_without_a_summarizer_is_a_conflict() {
    let options = Options {
        summarizer: None,
        ..Options::default()
    };
    let server = start_with_options(ServerConfig::default(), options).await;
    chat(&server, "s", 12).await;
    let answer = server
        .call(Method::POST, "/v1/sessions/s/compact", None)
        .await;
    assert_eq!(
        (answer.status, answer.code()),
        (StatusCode::CONFLICT, "conflict")
    );
    assert_eq!(
        server.get("/v1/sessions/s/compactions").await.json,
        json!([])
    );
}
