//! History, rows, search, compactions, state, import and export.

use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::common::start;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_in_both_orders_and_within_a_byte_budget() {
    let server = start().await;
    for i in 0..4 {
        server.say("s", &format!("m{i}"), &"x".repeat(100)).await;
    }
    server
        .post(
            "/v1/sessions/s/messages?parent=m1",
            json!({"id": "alt", "role": "user", "content": "alt"}),
        )
        .await;
    let history = server.get("/v1/sessions/s/history").await;
    assert_eq!(history.headers["content-type"], "application/x-ndjson");
    assert_eq!(history.ids(), ["m0", "m1", "alt"]);
    assert_eq!(
        server.get("/v1/sessions/s/history?leaf=m3").await.ids(),
        ["m0", "m1", "m2", "m3"]
    );
    assert_eq!(
        server
            .get("/v1/sessions/s/history?leaf=m3&order=newest")
            .await
            .ids(),
        ["m3", "m2", "m1", "m0"]
    );
    assert!(
        server
            .get("/v1/sessions/s/history?leaf=ghost")
            .await
            .text
            .is_empty()
    );

    let recent = server
        .get("/v1/sessions/s/history?leaf=m3&maxBytes=350")
        .await;
    assert_eq!(recent.ids(), ["m2", "m3"]);
    assert_eq!(recent.headers["x-sessiondb-truncated"], "true");
    let total: u64 = recent.headers["x-sessiondb-total-bytes"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(total > 400, "{total}");
    let all = server
        .get("/v1/sessions/s/history?maxBytes=100000&order=newest")
        .await;
    assert_eq!(all.ids(), ["alt", "m1", "m0"]);
    assert_eq!(all.headers["x-sessiondb-truncated"], "false");

    for bad in ["order=sideways", "maxBytes=-1", "format=xml", "nope=1"] {
        let answer = server.get(&format!("/v1/sessions/s/history?{bad}")).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{bad}");
    }

    let rows = server.get("/v1/sessions/s/rows?leaf=m3").await;
    assert_eq!(rows.ids(), ["m0", "m1", "m2", "m3"]);
    assert_eq!(rows.json[0]["role"], "user");
    assert!(rows.json[0]["bytes"].as_u64().unwrap() > 100);
    assert!(rows.json[0]["tokenEstimate"].as_u64().unwrap() > 0);
    assert!(
        rows.json[0].get("parts").is_none(),
        "no content in row stats"
    );
    assert_eq!(
        server.get("/v1/sessions/s/branches/m1").await.ids(),
        ["m2", "alt"]
    );
    assert_eq!(
        server.get("/v1/sessions/s/branches/ghost").await.json,
        json!([])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_within_a_session_and_across_the_namespace() {
    let server = start().await;
    server
        .post("/v1/sessions", json!({"id": "a", "userId": "u1"}))
        .await;
    server
        .post("/v1/sessions", json!({"id": "b", "userId": "u2"}))
        .await;
    server.say("a", "a1", "the quick brown fox").await;
    server.say("a", "a2", "lazy dogs sleeping").await;
    server.say("b", "b1", "foxes are quick").await;
    let hits = server.get("/v1/sessions/a/search?q=quick%20fox").await;
    assert_eq!(hits.ids(), ["a1"]);
    assert_eq!(hits.json[0]["sessionId"], "a");
    assert_eq!(hits.json[0]["content"], "the quick brown fox");
    assert_eq!(
        hits.json[0]["snippet"],
        json!(["the ", "quick", " brown ", "fox", ""])
    );
    assert!(hits.json[0]["createdAt"].as_i64().is_some());
    assert_eq!(
        server.get("/v1/sessions/a/search?q=sleep").await.ids(),
        ["a2"],
        "stemmed"
    );
    assert_eq!(
        server
            .get("/v1/sessions/a/search?q=%22*%20OR%20NEAR(")
            .await
            .json,
        json!([])
    );
    assert_eq!(server.get("/v1/sessions/a/search").await.json, json!([]));
    let mut across: Vec<String> = server.get("/v1/search?q=quick").await.ids();
    across.sort();
    assert_eq!(across, ["a1", "b1"]);
    assert_eq!(
        server.get("/v1/search?q=quick&userId=u2").await.ids(),
        ["b1"]
    );
    assert_eq!(
        server.get("/v1/search?q=quick&limit=1").await.ids().len(),
        1
    );
    assert_eq!(
        server.get("/v1/search?q=quick&limit=0").await.status,
        StatusCode::BAD_REQUEST
    );

    // Filters: one role, a time range (epoch ms, `since` inclusive, `until` exclusive), with
    // the next message in a millisecond of its own.
    tokio::time::sleep(std::time::Duration::from_millis(3)).await;
    let answer = server
        .post(
            "/v1/sessions/a/messages",
            json!({"id": "a3", "role": "assistant", "content": "a quick reply"}),
        )
        .await;
    let a3_at = answer.json["message"]["createdAt"].as_i64().unwrap();
    let searched = async |query: &str| {
        let mut ids = server
            .get(&format!("/v1/search?q=quick&{query}"))
            .await
            .ids();
        ids.sort();
        ids
    };
    assert_eq!(searched("role=assistant").await, ["a3"]);
    assert_eq!(searched("role=user&userId=u1").await, ["a1"]);
    assert_eq!(searched(&format!("since={a3_at}")).await, ["a3"]);
    assert_eq!(searched(&format!("until={a3_at}")).await, ["a1", "b1"]);
    let in_a = server
        .get(&format!(
            "/v1/sessions/a/search?q=quick&role=user&until={}",
            a3_at + 1
        ))
        .await;
    assert_eq!(in_a.ids(), ["a1"]);

    // Any of the words: every message holding one (ranked by the index: rare words weigh most).
    let any = server
        .get("/v1/sessions/a/search?q=lazy%20quick%20fox&match=any")
        .await;
    let hits = any.json.as_array().unwrap();
    let a1 = hits.iter().find(|h| h["id"] == "a1").unwrap();
    assert_eq!(
        a1["snippet"],
        json!(["the ", "quick", " brown ", "fox", ""])
    );
    let mut ids = any.ids();
    ids.sort();
    assert_eq!(ids, ["a1", "a2", "a3"]);
    let all = server
        .get("/v1/sessions/a/search?q=lazy%20quick%20fox&match=all")
        .await;
    assert_eq!(all.ids().len(), 0);

    // Snippets: the part of a long text around the matched words, `snippetWords` long.
    let long = format!(
        "{} quickness {}",
        "filler words ".repeat(20),
        "and more words ".repeat(20)
    );
    server.say("a", "a4", &long).await;
    let hit = server
        .get("/v1/sessions/a/search?q=quick&role=user&snippetWords=3")
        .await;
    assert_eq!(hit.ids(), ["a1", "a4"]);
    assert_eq!(hit.json[1]["content"], long);
    assert_eq!(
        hit.json[1]["snippet"],
        json!(["…words ", "quickness", " and…"])
    );
    let default_length = server.get("/v1/sessions/a/search?q=quick&role=user").await;
    let shown: String =
        serde_json::from_value::<Vec<String>>(default_length.json[1]["snippet"].clone())
            .unwrap()
            .concat();
    assert_eq!(
        shown.split_whitespace().count(),
        sessiondb::DEFAULT_SNIPPET_WORDS
    );

    for refused in [
        "role=".to_owned(),
        "since=soon".to_owned(),
        format!("since={a3_at}&until={a3_at}"),
        "snippetWords=0".to_owned(),
        "match=some".to_owned(),
        format!("snippetWords={}", sessiondb::MAX_SNIPPET_WORDS + 1),
    ] {
        let answer = server.get(&format!("/v1/search?q=quick&{refused}")).await;
        assert_eq!(
            (answer.status, answer.code()),
            (StatusCode::BAD_REQUEST, "invalid_request"),
            "{refused}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compactions_overlay_history_but_not_raw_reads() {
    let server = start().await;
    for id in ["a", "b", "c", "d"] {
        server.say("s", id, id).await;
    }
    let added = server
        .post(
            "/v1/sessions/s/compactions",
            json!({"summary": "b and c", "fromMessageId": "b", "toMessageId": "c"}),
        )
        .await;
    assert_eq!(added.status, StatusCode::CREATED);
    let summary_id = format!("compaction_{}", added.json["id"].as_str().unwrap());
    assert_eq!(
        server.get("/v1/sessions/s/history").await.ids(),
        ["a", summary_id.as_str(), "d"]
    );
    assert_eq!(
        server
            .get("/v1/sessions/s/history?order=newest")
            .await
            .ids(),
        ["d", summary_id.as_str(), "a"]
    );
    assert_eq!(
        server.get("/v1/sessions/s/messages/b").await.status,
        StatusCode::OK
    );
    assert_eq!(
        server.get("/v1/sessions/s/rows").await.ids(),
        ["a", "b", "c", "d"]
    );
    let list = server.get("/v1/sessions/s/compactions").await;
    assert_eq!(list.json.as_array().unwrap().len(), 1);
    assert_eq!(list.json[0]["summary"], "b and c");
    for bad in [
        json!({"summary": "x"}),
        json!({"summary": 1, "fromMessageId": "a", "toMessageId": "b"}),
        json!([]),
    ] {
        let answer = server.post("/v1/sessions/s/compactions", bad).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    }
    // A client echoing the summary back is not stored.
    let echo = server
        .post(
            "/v1/sessions/s/messages",
            json!({"id": summary_id, "role": "assistant", "parts": []}),
        )
        .await;
    assert_eq!(
        (echo.status, &echo.json["inserted"]),
        (StatusCode::OK, &json!(false))
    );
    assert_eq!(server.get("/v1/sessions/s").await.json["messageCount"], 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_keys_hold_any_json() {
    let server = start().await;
    let value = json!({"nested": [1, "two", null, true, 3.5]});
    let put = server.put("/v1/sessions/s/state/run", value.clone()).await;
    assert_eq!((put.status, &put.json), (StatusCode::OK, &value));
    assert_eq!(server.get("/v1/sessions/s/state/run").await.json, value);
    server.put("/v1/sessions/s/state/flag", json!(false)).await;
    assert_eq!(
        server.get("/v1/sessions/s/state").await.json,
        json!({"flag": false, "run": value})
    );
    assert_eq!(
        server.delete("/v1/sessions/s/state/run").await.status,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        server.get("/v1/sessions/s/state/run").await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        server.delete("/v1/sessions/s/state/run").await.status,
        StatusCode::NOT_FOUND
    );
    let not_json = server
        .send(
            server
                .request(Method::PUT, "/v1/sessions/s/state/x")
                .body("NaN"),
        )
        .await;
    assert_eq!(not_json.status, StatusCode::BAD_REQUEST);
    let long_key = format!("/v1/sessions/s/state/{}", "k".repeat(257));
    assert_eq!(
        server.put(&long_key, json!(1)).await.status,
        StatusCode::BAD_REQUEST
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_then_import_reproduces_the_session() {
    let server = start().await;
    server.say("s", "a", "first").await;
    server.say("s", "b", "second").await;
    server
        .post(
            "/v1/sessions/s/messages?parent=a",
            json!({"id": "c", "role": "assistant", "content": "branch"}),
        )
        .await;
    server
        .post(
            "/v1/sessions/s/compactions",
            json!({"summary": "sum", "fromMessageId": "a", "toMessageId": "b"}),
        )
        .await;
    server.put("/v1/sessions/s/state/k", json!([1, 2])).await;
    // The session's context goes along: two blocks and an entry.
    server
        .put(
            "/v1/sessions/s/context/memory",
            json!({"kind": "writable", "content": "likes tea"}),
        )
        .await;
    server
        .put("/v1/sessions/s/context/kb", json!({"kind": "search"}))
        .await;
    server
        .put(
            "/v1/sessions/s/context/kb/entries/door",
            json!({"content": "the blue door"}),
        )
        .await;
    let export = server.get("/v1/sessions/s/export").await;
    assert_eq!(export.status, StatusCode::OK);
    assert_eq!(export.headers["content-type"], "application/x-ndjson");
    assert_eq!(export.text.lines().count(), 9);
    assert!(export.text.starts_with(r#"{"session":{"id":"s","#));
    assert_eq!(
        server.get("/v1/sessions/none/export").await.status,
        StatusCode::NOT_FOUND
    );

    let import = server
        .send(
            server
                .request(Method::POST, "/v1/sessions/copy/import")
                .header("content-type", "application/x-ndjson")
                .body(export.text.clone()),
        )
        .await;
    assert_eq!(
        (import.status, &import.json),
        (StatusCode::OK, &json!({"imported": 8, "skipped": 0}))
    );
    let again = server
        .send(
            server
                .request(Method::POST, "/v1/sessions/copy/import")
                .body(export.text.clone()),
        )
        .await;
    assert_eq!(again.json, json!({"imported": 4, "skipped": 4}));
    let copy = server.get("/v1/sessions/copy/export").await;
    assert_eq!(
        copy.text.replacen(r#""id":"copy""#, r#""id":"s""#, 1),
        export.text,
        "an export re-imports byte for byte, the session's creation time included"
    );

    let plain = "{\"message\": {\"id\": \"p1\", \"role\": \"user\", \"content\": \"hi\"}, \"parentId\": null, \"createdAt\": 5}\n\
                 {\"message\": {\"id\": \"p2\", \"role\": \"assistant\", \"content\": \"yo\"}, \"parentId\": \"p1\", \"createdAt\": 6}\n";
    let imported = server
        .send(
            server
                .request(Method::POST, "/v1/sessions/plain/import")
                .body(plain),
        )
        .await;
    assert_eq!(imported.json, json!({"imported": 2, "skipped": 0}));
    let history = server.get("/v1/sessions/plain/history").await.lines();
    assert_eq!(history[1]["createdAt"], 6);

    let broken = format!("{plain}{{\"message\": {{\"id\": \"p3\"}}}}\n");
    let refused = server
        .send(
            server
                .request(Method::POST, "/v1/sessions/fresh/import")
                .body(broken),
        )
        .await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    assert!(
        refused.json["error"]["message"]
            .as_str()
            .unwrap()
            .contains("lines[2]")
    );
    assert_eq!(
        server.get("/v1/sessions/fresh").await.status,
        StatusCode::NOT_FOUND,
        "nothing stored"
    );
    // Times a JSON client cannot read exactly, or before 1970, are refused; a message's own
    // out-of-range time is ignored, as a non-numeric one is.
    for (line, field) in [
        (
            r#"{"message": {"id": "t", "role": "user", "content": "x"}, "createdAt": 4611686018427387904}"#,
            Some("lines[1].createdAt"),
        ),
        (
            r#"{"message": {"id": "t", "role": "user", "content": "x"}, "createdAt": -1}"#,
            Some("lines[1].createdAt"),
        ),
        (
            r#"{"compaction": {"id": "c", "summary": "s", "fromMessageId": "p1", "toMessageId": "p2", "createdAt": 8640000000000001}}"#,
            Some("lines[1].compaction.createdAt"),
        ),
        (
            r#"{"message": {"id": "t", "role": "user", "content": "x", "createdAt": 4611686018427387904, "updatedAt": -5}}"#,
            None,
        ),
    ] {
        let body = format!("{}\n{line}\n", plain.lines().next().unwrap());
        let answer = server
            .send(
                server
                    .request(Method::POST, "/v1/sessions/timed/import")
                    .body(body),
            )
            .await;
        match field {
            Some(field) => {
                assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{line}");
                let message = answer.json["error"]["message"].as_str().unwrap();
                assert!(
                    message.contains(field) && message.contains("8640000000000000"),
                    "{message}"
                );
                assert_eq!(
                    server.get("/v1/sessions/timed").await.status,
                    StatusCode::NOT_FOUND
                );
            }
            None => {
                assert_eq!(answer.status, StatusCode::OK, "{line}");
                let stored = server.get("/v1/sessions/timed/messages/t").await.json;
                let created = stored["createdAt"].as_i64().unwrap();
                assert!((1..=8_640_000_000_000_000).contains(&created), "{stored}");
                assert_eq!(stored.get("updatedAt"), None, "{stored}");
            }
        }
    }
    let cycle = "{\"message\": {\"id\": \"x\", \"role\": \"user\", \"content\": \"x\"}, \"parentId\": \"x\"}\n";
    let refused = server
        .send(
            server
                .request(Method::POST, "/v1/sessions/fresh/import")
                .body(cycle),
        )
        .await;
    assert_eq!(refused.status, StatusCode::CONFLICT);
}
