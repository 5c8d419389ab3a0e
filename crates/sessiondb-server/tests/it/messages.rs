//! `/v1/sessions/{sid}/messages…`.

use reqwest::StatusCode;
use serde_json::json;

use crate::common::{Answer, start};

fn text(id: &str, body: &str) -> serde_json::Value {
    json!({"id": id, "role": "user", "parts": [{"type": "text", "text": body}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn append_get_put_patch_and_delete() {
    let server = start().await;
    let first = server
        .post("/v1/sessions/s/messages", text("a", "one"))
        .await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(first.json["inserted"], true);
    assert!(first.json["message"]["createdAt"].as_i64().is_some());
    let again = server
        .post("/v1/sessions/s/messages", text("a", "other"))
        .await;
    assert_eq!(
        (again.status, &again.json["inserted"]),
        (StatusCode::OK, &json!(false))
    );
    assert_eq!(again.json["message"]["parts"][0]["text"], "one");
    // Content-shape messages and generated ids.
    let generated = server
        .post(
            "/v1/sessions/s/messages",
            json!({"role": "assistant", "content": "two"}),
        )
        .await;
    let gid = generated.json["message"]["id"].as_str().unwrap().to_owned();
    assert!(gid.starts_with("msg_"));
    // ?parent=a branches; ?parent= starts a root; an unknown parent makes a root too.
    server
        .post("/v1/sessions/s/messages?parent=a", text("b", "branch"))
        .await;
    assert_eq!(
        server.get("/v1/sessions/s/branches/a").await.ids(),
        [gid.as_str(), "b"]
    );
    server
        .post("/v1/sessions/s/messages?parent=", text("r", "root"))
        .await;
    assert_eq!(server.get("/v1/sessions/s/history").await.ids(), ["r"]);

    let got = server.get("/v1/sessions/s/messages/a").await;
    assert_eq!(
        (got.status, got.json["id"].as_str()),
        (StatusCode::OK, Some("a"))
    );
    let missing = server.get("/v1/sessions/s/messages/zzz").await;
    assert_eq!(
        (missing.status, missing.code()),
        (StatusCode::NOT_FOUND, "not_found")
    );

    let put = server
        .put("/v1/sessions/s/messages/a", text("a", "replaced"))
        .await;
    assert_eq!(put.status, StatusCode::OK);
    assert_eq!(put.json["parts"][0]["text"], "replaced");
    assert!(put.json["updatedAt"].as_i64().is_some());
    let no_id = server
        .put(
            "/v1/sessions/s/messages/a",
            json!({"role": "user", "content": "no id"}),
        )
        .await;
    assert_eq!(no_id.json["content"], "no id");
    assert!(
        no_id.text.starts_with(r#"{"id":"a","role":"user""#),
        "the path's id comes first, as a generated one does: {}",
        no_id.text
    );
    let mismatch = server
        .put("/v1/sessions/s/messages/a", text("other", "x"))
        .await;
    assert_eq!(mismatch.status, StatusCode::BAD_REQUEST);
    let put_missing = server
        .put("/v1/sessions/s/messages/new", text("new", "x"))
        .await;
    assert_eq!(put_missing.status, StatusCode::NOT_FOUND);
    let upsert = server
        .put("/v1/sessions/s/messages/new?upsert=true", text("new", "x"))
        .await;
    assert_eq!(upsert.status, StatusCode::OK);
    assert_eq!(
        server.get("/v1/sessions/s/messages/new").await.status,
        StatusCode::OK
    );

    let patched = server
        .patch(
            "/v1/sessions/s/messages/new",
            json!({"metadata": {"k": 1}, "role": "assistant"}),
        )
        .await;
    assert_eq!(patched.status, StatusCode::OK, "{patched:?}");
    assert_eq!(patched.json["role"], "assistant");
    assert_eq!(patched.json["metadata"], json!({"k": 1}));
    assert_eq!(
        patched.json["parts"][0]["text"], "x",
        "fields not given stay"
    );
    let bad_patch = server
        .patch("/v1/sessions/s/messages/new", json!({"role": null}))
        .await;
    assert_eq!(bad_patch.status, StatusCode::BAD_REQUEST);
    let unknown_patch = server
        .patch("/v1/sessions/s/messages/new", json!({"parentId": "a"}))
        .await;
    assert_eq!(unknown_patch.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        server
            .patch("/v1/sessions/s/messages/zzz", json!({"content": "x"}))
            .await
            .status,
        StatusCode::NOT_FOUND
    );

    // Deleting `a` re-attaches its children to its (missing) parent: they become roots.
    assert_eq!(
        server.delete("/v1/sessions/s/messages/a").await.status,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        server.delete("/v1/sessions/s/messages/a").await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        server
            .get(&format!("/v1/sessions/s/messages/{gid}"))
            .await
            .json["id"],
        gid
    );
    let bulk = server
        .post(
            "/v1/sessions/s/messages/delete",
            json!({"ids": ["b", "r", "nope"]}),
        )
        .await;
    assert_eq!(
        (bulk.status, &bulk.json),
        (StatusCode::OK, &json!({"deleted": 2}))
    );
    assert_eq!(
        server
            .post("/v1/sessions/s/messages/delete", json!({"ids": "b"}))
            .await
            .status,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        server.delete("/v1/sessions/s/messages").await.status,
        StatusCode::NO_CONTENT
    );
    assert!(server.get("/v1/sessions/s/history").await.text.is_empty());
    assert_eq!(
        server.get("/v1/sessions/s").await.status,
        StatusCode::OK,
        "clear keeps the session"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_chain_atomically() {
    let server = start().await;
    server.say("s", "root", "root").await;
    let batch = server
        .post(
            "/v1/sessions/s/messages/batch",
            json!({"messages": [text("b1", "1"), text("b2", "2")], "parentId": "root"}),
        )
        .await;
    assert_eq!(batch.status, StatusCode::CREATED);
    assert_eq!(batch.json["messages"][1]["id"], "b2");
    assert_eq!(
        server.get("/v1/sessions/s/history").await.ids(),
        ["root", "b1", "b2"]
    );
    let invalid = server
        .post(
            "/v1/sessions/s/messages/batch",
            json!({"messages": [text("c1", "ok"), {"id": "c2"}]}),
        )
        .await;
    assert_eq!(invalid.status, StatusCode::BAD_REQUEST);
    assert!(
        invalid.json["error"]["message"]
            .as_str()
            .unwrap()
            .contains("messages[1]")
    );
    assert_eq!(
        server.get("/v1/sessions/s/messages/c1").await.status,
        StatusCode::NOT_FOUND
    );
    let roots = server
        .post(
            "/v1/sessions/s/messages/batch",
            json!({"messages": [text("n1", "x")], "parentId": null}),
        )
        .await;
    assert_eq!(roots.status, StatusCode::CREATED);
    assert_eq!(server.get("/v1/sessions/s/history").await.ids(), ["n1"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_pages_walk_the_active_path() {
    let server = start().await;
    for i in 0..5 {
        server.say("s", &format!("m{i}"), "x").await;
    }
    let page = server.get("/v1/sessions/s/messages?limit=2").await;
    assert_eq!(page.ids(), ["m0", "m1"]);
    assert_eq!(page.json["nextCursor"], "m1");
    assert!(page.json.get("previousCursor").is_none());
    let next = server.get("/v1/sessions/s/messages?limit=2&after=m1").await;
    assert_eq!(next.ids(), ["m2", "m3"]);
    assert_eq!(next.json["previousCursor"], "m2");
    let back = server
        .get("/v1/sessions/s/messages?limit=2&before=m2")
        .await;
    assert_eq!(back.ids(), ["m0", "m1"]);
    let desc = server
        .get("/v1/sessions/s/messages?order=desc&limit=3")
        .await;
    assert_eq!(desc.ids(), ["m4", "m3", "m2"]);
    let default = server.get("/v1/sessions/s/messages").await;
    assert_eq!(default.ids().len(), 5);
    assert!(default.json.get("nextCursor").is_none());
    let unknown = server.get("/v1/sessions/none/messages").await;
    assert_eq!(
        (unknown.status, &unknown.json),
        (StatusCode::OK, &json!({"items": []}))
    );
    for bad in [
        "after=m1&before=m3",
        "limit=0",
        "limit=101",
        "after=ghost",
        "order=up",
    ] {
        let answer = server.get(&format!("/v1/sessions/s/messages?{bad}")).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{bad}");
    }
}

/// `?ifLeaf=` conditions an append, a batch or an import on the session's active leaf: 404
/// without the session, 409 once another write moved the leaf, and nothing is written then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_conditioned_on_the_leaf() {
    let server = start().await;
    let missing = server
        .post("/v1/sessions/s/messages?ifLeaf=", text("a", "hi"))
        .await;
    assert_eq!(
        (missing.status, missing.code()),
        (StatusCode::NOT_FOUND, "not_found")
    );
    assert_eq!(
        server.get("/v1/sessions/s").await.status,
        StatusCode::NOT_FOUND
    );
    server.post("/v1/sessions", json!({"id": "s"})).await;
    let first = server
        .post("/v1/sessions/s/messages?ifLeaf=", text("a", "hi"))
        .await;
    assert_eq!(first.status, StatusCode::CREATED);
    let second = server
        .post("/v1/sessions/s/messages?ifLeaf=a", text("b", "yo"))
        .await;
    assert_eq!(second.status, StatusCode::CREATED);

    let stale = server
        .post("/v1/sessions/s/messages?ifLeaf=a", text("c", "late"))
        .await;
    assert_eq!(
        (stale.status, stale.code()),
        (StatusCode::CONFLICT, "conflict")
    );
    assert_eq!(
        stale.json["error"]["message"],
        "the session's active leaf is `b`, not `a`"
    );
    let batch = json!({"messages": [text("c", "q"), text("d", "r")]});
    let refused = server
        .post("/v1/sessions/s/messages/batch?ifLeaf=", batch.clone())
        .await;
    assert_eq!(refused.status, StatusCode::CONFLICT);
    let import = |query: &'static str| {
        server.send(
            server
                .request(
                    reqwest::Method::POST,
                    &format!("/v1/sessions/s/import{query}"),
                )
                .header("content-type", "application/x-ndjson")
                .body("{\"state\":{\"key\":\"k\",\"value\":1}}\n"),
        )
    };
    assert_eq!(import("?ifLeaf=a").await.status, StatusCode::CONFLICT);
    assert_eq!(
        server.get("/v1/sessions/s/state").await.json,
        json!({}),
        "nothing of a refused write is stored"
    );
    assert_eq!(server.get("/v1/sessions/s").await.json["messageCount"], 2);

    let landed = server
        .post("/v1/sessions/s/messages/batch?ifLeaf=b", batch)
        .await;
    assert_eq!(landed.status, StatusCode::CREATED);
    let imported = import("?ifLeaf=d").await;
    assert_eq!(imported.status, StatusCode::OK);
    assert_eq!(
        server.get("/v1/sessions/s/state").await.json,
        json!({"k": 1})
    );
    assert_eq!(
        imported.headers["x-sessiondb-version"].to_str().unwrap(),
        server.get("/v1/sessions/s").await.json["version"].to_string(),
        "the version the import left"
    );
    let unknown = server
        .post("/v1/sessions/s/messages?ifleaf=d", text("e", "x"))
        .await;
    assert_eq!(unknown.status, StatusCode::BAD_REQUEST, "names are exact");
}

/// `POST /v1/import` writes several sessions' parts at once: all of them, or (on a refusal in
/// any part) none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn imports_into_several_sessions_land_together() {
    let server = start().await;
    let import = |body: &str| {
        server.send(
            server
                .request(reqwest::Method::POST, "/v1/import")
                .header("content-type", "application/x-ndjson")
                .body(body.to_owned()),
        )
    };
    server
        .post("/v1/sessions/a/messages", text("x", "hi"))
        .await;
    let body = [
        r#"{"into": {"sessionId": "a", "ifLeaf": "x"}}"#,
        r#"{"message": {"id": "y", "role": "assistant", "content": "yo"}, "parentId": "x"}"#,
        r#"{"state": {"key": "k", "value": 1}}"#,
        "",
        r#"{"into": {"sessionId": "b"}}"#,
        r#"{"session": {"userId": "ann"}}"#,
        r#"{"state": {"key": "total", "value": 2}}"#,
    ]
    .join("\n");
    let landed = import(&body).await;
    assert_eq!(landed.status, StatusCode::OK, "{:?}", landed.json);
    let server = &server;
    let version_of = |id: &str| {
        let path = format!("/v1/sessions/{id}");
        async move { server.get(&path).await.json["version"].clone() }
    };
    assert_eq!(
        landed.json,
        json!({"imported": 3, "skipped": 0, "parts": [
            {"sessionId": "a", "imported": 2, "skipped": 0, "version": version_of("a").await},
            {"sessionId": "b", "imported": 1, "skipped": 0, "version": version_of("b").await}]}),
        "each part with the version it left"
    );

    // At a version: while the session is still at it, and not once it moved.
    let at = |version: &serde_json::Value| {
        format!(
            "{{\"into\": {{\"sessionId\": \"a\", \"ifVersion\": {version}}}}}\n\
             {{\"state\": {{\"key\": \"v\", \"value\": {version}}}}}\n"
        )
    };
    let read = version_of("a").await;
    let written = import(&at(&read)).await;
    assert_eq!(written.status, StatusCode::OK, "{:?}", written.json);
    let now = &written.json["parts"][0]["version"];
    assert!(now.as_i64() > read.as_i64(), "{now} after {read}");
    let stale = import(&at(&read)).await;
    assert_eq!(stale.code(), "conflict");
    assert_eq!(
        server.get("/v1/sessions/a/state").await.json["v"],
        read,
        "a refused part writes nothing"
    );
    assert_eq!(server.get("/v1/sessions/a").await.json["leafId"], "y");
    assert_eq!(server.get("/v1/sessions/b").await.json["userId"], "ann");
    assert_eq!(
        server.get("/v1/sessions/b/state").await.json,
        json!({"total": 2})
    );

    // The first part would do, the second is refused: nothing lands.
    let first = r#"{"into": {"sessionId": "b"}}
{"state": {"key": "total", "value": 3}}"#;
    for (second, status, code) in [
        (
            r#"{"into": {"sessionId": "a", "ifLeaf": "x"}}"#,
            StatusCode::CONFLICT,
            "conflict",
        ),
        (
            r#"{"into": {"sessionId": "c", "ifLeaf": null}}"#,
            StatusCode::NOT_FOUND,
            "not_found",
        ),
        (
            r#"{"into": {"sessionId": "a", "ifAbsent": true}}"#,
            StatusCode::CONFLICT,
            "conflict",
        ),
        (
            r#"{"into": {"sessionId": "a"}}
{"state": {"key": "", "value": 1}}"#,
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
    ] {
        let refused = import(&format!("{first}\n{second}\n")).await;
        assert_eq!((refused.status, refused.code()), (status, code), "{second}");
        // A refusal names the part; a bad line, the line of the body.
        let message = refused.json["error"]["message"]
            .as_str()
            .unwrap_or_default();
        let place = match code {
            "invalid_request" => "invalid `parts[1].lines[3].state.key`",
            _ => "parts[1] (session `",
        };
        assert!(message.starts_with(place), "{message}");
        assert_eq!(
            server.get("/v1/sessions/b/state").await.json,
            json!({"total": 2})
        );
    }
    assert_eq!(
        server.get("/v1/sessions/c").await.status,
        StatusCode::NOT_FOUND
    );
    // `ifAbsent` creates a session with its first contents, or nothing when it exists.
    let created = import(
        r#"{"into": {"sessionId": "c", "ifAbsent": true}}
{"session": {"name": "new"}}
{"state": {"key": "k", "value": 1}}"#,
    )
    .await;
    assert_eq!(created.status, StatusCode::OK);
    assert_eq!(server.get("/v1/sessions/c").await.json["name"], "new");
    let again = import(
        r#"{"into": {"sessionId": "c", "ifAbsent": true}}
{"state": {"key": "k", "value": 2}}"#,
    )
    .await;
    assert_eq!(
        (again.status, again.json["error"]["message"].as_str()),
        (
            StatusCode::CONFLICT,
            Some("parts[0] (session `c`): the session already exists")
        )
    );
    assert_eq!(
        server.get("/v1/sessions/c/state").await.json,
        json!({"k": 1})
    );
    for (bad, field) in [
        (r#"{"state": {"key": "k", "value": 1}}"#, "lines[0]"),
        (r#"{"into": {"ifLeaf": "x"}}"#, "lines[0].into.sessionId"),
        (
            r#"{"into": {"sessionId": "a", "ifLeaf": 3}}"#,
            "lines[0].into.ifLeaf",
        ),
        (
            r#"{"into": {"sessionId": "a", "ifLeaf": "x", "ifAbsent": true}}"#,
            "lines[0].into",
        ),
        (
            r#"{"into": {"sessionId": "a", "ifLeaf": "x", "ifVersion": 1}}"#,
            "lines[0].into",
        ),
        (
            r#"{"into": {"sessionId": "a", "ifVersion": -1}}"#,
            "lines[0].into.ifVersion",
        ),
        (
            r#"{"into": {"sessionId": "a", "ifAbsent": 1}}"#,
            "lines[0].into.ifAbsent",
        ),
        (
            "{\"into\": {\"sessionId\": \"a\"}}\nnot json",
            "parts[0].lines[1]",
        ),
        (
            "{\"into\": {\"sessionId\": \"a\"}}\n{\"state\": {\"key\": \"\", \"value\": 1}}",
            "parts[0].lines[1].state.key",
        ),
        (
            "{\"into\": {\"sessionId\": \"a\"}}\n{\"entry\": {\"label\": \"nope\", \"key\": \"k\", \"content\": \"c\"}}",
            "parts[0].lines[1].entry.label",
        ),
    ] {
        let refused = import(bad).await;
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{bad}");
        let message = refused.json["error"]["message"].as_str().unwrap();
        let named = format!("invalid `{field}`");
        assert!(message.starts_with(&named), "{message} should name {field}");
    }
}

/// A session's version: in the session, after each append (`x-sessiondb-version`), as the
/// history's entity tag (`If-None-Match` naming it: `304` with no body, in every form of the
/// history), and as a write condition (`?ifVersion=`: 404 without the session, 409 once
/// anything changed it, nothing written then).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_tag_history_and_condition_writes() {
    let server = start().await;
    let history = |query: &'static str, tag: Option<String>| {
        let mut request = server.request(
            reqwest::Method::GET,
            &format!("/v1/sessions/s/history{query}"),
        );
        if let Some(tag) = tag {
            request = request.header("if-none-match", tag);
        }
        server.send(request)
    };
    let version_of = |answer: &Answer| -> i64 {
        answer.headers["x-sessiondb-version"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap()
    };
    let missing = server
        .post("/v1/sessions/s/messages?ifVersion=1", text("a", "hi"))
        .await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    let unknown = history("", Some("*".into())).await;
    assert_eq!(unknown.status, StatusCode::OK, "no session matches nothing");
    assert!(!unknown.headers.contains_key("etag"));

    let first = server
        .post("/v1/sessions/s/messages", text("a", "hi"))
        .await;
    let v1 = version_of(&first);
    assert_eq!(server.get("/v1/sessions/s").await.json["version"], v1);
    let read = history("", None).await;
    assert_eq!(read.headers["etag"], format!("\"{v1}\"").as_str());
    assert_eq!(read.ids(), ["a"]);
    for (query, tag) in [
        ("", format!("\"{v1}\"")),
        ("", format!("W/\"{v1}\"")),
        ("", format!("\"0\", \"{v1}\"")),
        ("", "*".into()),
        ("?order=newest", format!("\"{v1}\"")),
        ("?maxBytes=10", format!("\"{v1}\"")),
        ("?format=openai", format!("\"{v1}\"")),
    ] {
        let held = history(query, Some(tag.clone())).await;
        assert_eq!(held.status, StatusCode::NOT_MODIFIED, "{query} {tag}");
        assert_eq!(held.text, "");
        assert_eq!(held.headers["etag"], format!("\"{v1}\"").as_str());
    }
    let other = history("?format=anthropic", Some("\"1\"".into())).await;
    assert_eq!(other.status, StatusCode::OK);
    assert_eq!(other.headers["etag"], format!("\"{v1}\"").as_str());

    let batch = json!({"messages": [text("b", "yo"), text("c", "more")]});
    let landed = server
        .post(
            &format!("/v1/sessions/s/messages/batch?ifVersion={v1}"),
            batch,
        )
        .await;
    assert_eq!(landed.status, StatusCode::CREATED);
    let v2 = version_of(&landed);
    assert!(v2 > v1);
    let changed = history("", Some(format!("\"{v1}\""))).await;
    assert_eq!(changed.status, StatusCode::OK);
    assert_eq!(changed.ids(), ["a", "b", "c"]);
    assert_eq!(changed.headers["etag"], format!("\"{v2}\"").as_str());

    // An edit moves no leaf but moves the version: a writer at the older one is refused.
    server
        .patch("/v1/sessions/s/messages/b", json!({"content": "edited"}))
        .await;
    let stale = server
        .post(
            &format!("/v1/sessions/s/messages?ifVersion={v2}"),
            text("d", "late"),
        )
        .await;
    assert_eq!(
        (stale.status, stale.code()),
        (StatusCode::CONFLICT, "conflict")
    );
    assert_eq!(server.get("/v1/sessions/s").await.json["messageCount"], 3);
    assert_eq!(
        history("", Some(format!("\"{v2}\""))).await.status,
        StatusCode::OK
    );

    for bad in ["ifVersion=x", "ifVersion=1&ifLeaf=c"] {
        let refused = server
            .post(&format!("/v1/sessions/s/messages?{bad}"), text("e", "x"))
            .await;
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{bad}");
    }
}
