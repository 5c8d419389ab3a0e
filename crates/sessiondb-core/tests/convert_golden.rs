//! Golden tests of the converters: each `golden/<name>.input.json` conversation is converted to
//! every format and compared with `golden/<name>.<format>.json`. Run with `SESSIONDB_BLESS=1` to
//! rewrite the expected files after an intended change, then review the diff.
//!
//! Besides the exact output, every result is checked for the invariants the converters promise:
//! no tool result is dropped, and each result follows the call it answers.

use std::collections::HashSet;
use std::path::PathBuf;

use serde_json::Value;
use sessiondb_core::convert::{to_anthropic, to_openai_chat, to_openai_responses};

const CONVERSATIONS: [(&str, usize); 2] = [("parts", 5), ("content", 3)];

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

fn load(name: &str) -> Value {
    let path = golden_dir().join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    serde_json::from_str(&text).unwrap()
}

fn check_golden(name: &str, format: &str, actual: &Value) {
    let file = format!("{name}.{format}.json");
    if std::env::var_os("SESSIONDB_BLESS").is_some() {
        let text = serde_json::to_string_pretty(actual).unwrap() + "\n";
        std::fs::write(golden_dir().join(&file), text).unwrap();
    }
    assert_eq!(
        actual,
        &load(&file),
        "{file} differs; run with SESSIONDB_BLESS=1 and review the diff if the change is intended"
    );
}

fn input(name: &str) -> Vec<Value> {
    load(&format!("{name}.input.json"))
        .as_array()
        .unwrap()
        .clone()
}

/// Every tool message answers a call of the assistant message before its run of tool messages.
fn check_openai_chat_pairing(messages: &[Value]) -> usize {
    let mut open: HashSet<String> = HashSet::new();
    let mut results = 0;
    for m in messages {
        match m["role"].as_str().unwrap() {
            "tool" => {
                let id = m["tool_call_id"].as_str().unwrap();
                assert!(open.remove(id), "tool result {id} has no preceding call");
                results += 1;
            }
            "assistant" => {
                open = m["tool_calls"]
                    .as_array()
                    .map(|calls| {
                        calls
                            .iter()
                            .map(|c| c["id"].as_str().unwrap().to_owned())
                            .collect()
                    })
                    .unwrap_or_default();
                if let Some(calls) = m["tool_calls"].as_array() {
                    for c in calls {
                        let arguments = c["function"]["arguments"].as_str().unwrap();
                        serde_json::from_str::<Value>(arguments).expect("arguments are JSON text");
                    }
                }
            }
            _ => open.clear(),
        }
    }
    results
}

fn check_responses_pairing(items: &[Value]) -> usize {
    let mut calls: HashSet<String> = HashSet::new();
    let mut results = 0;
    for item in items {
        match item["type"].as_str() {
            Some("function_call") => {
                calls.insert(item["call_id"].as_str().unwrap().to_owned());
            }
            Some("function_call_output") => {
                let id = item["call_id"].as_str().unwrap();
                assert!(calls.contains(id), "output {id} before its call");
                results += 1;
            }
            _ => assert!(item["role"].is_string(), "{item}"),
        }
    }
    results
}

/// Roles alternate; each `tool_result` sits in the user message right after the assistant
/// message holding its `tool_use`, ahead of any other block.
fn check_anthropic_pairing(messages: &[Value]) -> usize {
    let mut results = 0;
    let mut previous_uses: HashSet<String> = HashSet::new();
    let mut previous_role = "";
    for m in messages {
        let role = m["role"].as_str().unwrap();
        assert_ne!(role, previous_role, "roles must alternate");
        previous_role = role;
        let blocks = m["content"].as_array().unwrap();
        assert!(!blocks.is_empty());
        let mut uses = HashSet::new();
        let mut seen_other = false;
        for b in blocks {
            match b["type"].as_str().unwrap() {
                "tool_result" => {
                    assert_eq!(role, "user");
                    assert!(!seen_other, "tool results lead the user message");
                    let id = b["tool_use_id"].as_str().unwrap();
                    assert!(
                        previous_uses.contains(id),
                        "result {id} does not follow its call"
                    );
                    results += 1;
                }
                "tool_use" => {
                    assert_eq!(role, "assistant");
                    assert!(b["input"].is_object());
                    uses.insert(b["id"].as_str().unwrap().to_owned());
                }
                "text" => {
                    assert!(!b["text"].as_str().unwrap().is_empty());
                    seen_other = true;
                }
                _ => seen_other = true,
            }
        }
        previous_uses = uses;
    }
    results
}

#[test]
fn openai_chat_golden() {
    for (name, results) in CONVERSATIONS {
        let out = to_openai_chat(&input(name));
        assert_eq!(check_openai_chat_pairing(&out), results, "{name}");
        check_golden(name, "openai", &Value::Array(out));
    }
}

#[test]
fn openai_responses_golden() {
    for (name, results) in CONVERSATIONS {
        let out = to_openai_responses(&input(name));
        assert_eq!(check_responses_pairing(&out), results, "{name}");
        check_golden(name, "openai-responses", &Value::Array(out));
    }
}

#[test]
fn anthropic_golden() {
    for (name, results) in CONVERSATIONS {
        let out = to_anthropic(&input(name));
        assert_eq!(check_anthropic_pairing(&out.messages), results, "{name}");
        check_golden(name, "anthropic", &out.to_value());
    }
}

#[test]
fn both_shapes_of_the_same_exchange_convert_alike() {
    let parts = serde_json::json!([
        {"id": "u", "role": "user", "parts": [{"type": "text", "text": "2+2?"}]},
        {"id": "a", "role": "assistant", "parts": [
            {"type": "tool-add", "toolCallId": "t1", "state": "output-available", "input": {"a": 2, "b": 2}, "output": 4},
            {"type": "text", "text": "4"}
        ]}
    ]);
    let content = serde_json::json!([
        {"id": "u", "role": "user", "content": "2+2?"},
        {"id": "a", "role": "assistant", "content": null, "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "add", "arguments": "{\"a\":2,\"b\":2}"}}
        ]},
        {"id": "r", "role": "tool", "tool_call_id": "t1", "content": "4"},
        {"id": "b", "role": "assistant", "content": "4"}
    ]);
    let (parts, content) = (
        parts.as_array().unwrap().clone(),
        content.as_array().unwrap().clone(),
    );
    assert_eq!(to_openai_chat(&parts), to_openai_chat(&content));
    assert_eq!(to_openai_responses(&parts), to_openai_responses(&content));
    assert_eq!(to_anthropic(&parts), to_anthropic(&content));
}
