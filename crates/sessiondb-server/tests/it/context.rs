//! Context blocks, the frozen prompt and the tools over HTTP, end to end.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::common::{Server, start};

/// The labels of the blocks a `GET …/context` lists, in its order.
async fn block_labels(server: &Server, path: &str) -> Vec<Value> {
    let listed = server.get(path).await.json;
    let blocks = listed.as_array().unwrap();
    blocks.iter().map(|b| b["label"].clone()).collect()
}

async fn tool(server: &Server, sid: &str, name: &str, arguments: Value) -> String {
    let answer = server
        .post(
            &format!("/v1/sessions/{sid}/tools/{name}"),
            json!({"arguments": arguments}),
        )
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{:?}", answer.json);
    answer.json["output"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn blocks_prompt_and_tools_end_to_end() {
    let server = start().await;
    let soul = server
        .put(
            "/v1/sessions/s/context/soul",
            json!({"kind": "readonly", "description": "Identity", "content": "Be brief."}),
        )
        .await;
    assert_eq!(soul.status, StatusCode::OK);
    assert_eq!(
        soul.json,
        json!({"label": "soul", "kind": "readonly", "description": "Identity",
                                 "maxTokens": null, "content": "Be brief.", "tokens": 3})
    );
    server
        .put(
            "/v1/sessions/s/context/memory",
            json!({"kind": "writable", "maxTokens": 20, "content": "likes tea"}),
        )
        .await;
    server
        .put(
            "/v1/sessions/s/context/skills",
            json!({"kind": "skill", "description": "Playbooks"}),
        )
        .await;
    server
        .put("/v1/sessions/s/context/kb", json!({"kind": "search"}))
        .await;
    let entry = server
        .put(
            "/v1/sessions/s/context/skills/entries/review",
            json!({"content": "Read the diff twice.", "description": "Code review"}),
        )
        .await;
    assert_eq!(entry.status, StatusCode::OK);
    server
        .put(
            "/v1/sessions/s/context/kb/entries/tides",
            json!({"content": "Tides follow the moon."}),
        )
        .await;
    let got = server
        .get("/v1/sessions/s/context/skills/entries/review")
        .await;
    assert_eq!(
        got.json,
        json!({"key": "review", "content": "Read the diff twice.", "description": "Code review"})
    );
    assert_eq!(
        server
            .get("/v1/sessions/s/context/skills/entries/nope")
            .await
            .status,
        StatusCode::NOT_FOUND
    );
    let labels = block_labels(&server, "/v1/sessions/s/context").await;
    assert_eq!(
        labels,
        [json!("soul"), json!("memory"), json!("skills"), json!("kb")]
    );

    // Freeze: the first GET renders and stores; later ones return the same.
    let frozen = server.get("/v1/sessions/s/prompt").await;
    assert_eq!(frozen.status, StatusCode::OK);
    let prompt = frozen.json["prompt"].as_str().unwrap().to_owned();
    assert!(
        prompt.contains("MEMORY [15% — 3/20 tokens] [writable]"),
        "{prompt}"
    );
    assert!(prompt.contains("SKILLS (Playbooks) [loadable]"), "{prompt}");
    assert!(prompt.contains("- review: Code review"), "{prompt}");
    assert!(prompt.contains("KB [searchable]"), "{prompt}");
    assert!(frozen.json["frozenAt"].as_i64().unwrap() > 0);

    // An append past maxTokens is an error string and leaves the block as it was.
    let over = tool(
        &server,
        "s",
        "set_context",
        json!({"label": "memory", "content": vec!["word"; 30].join(" "), "action": "append"}),
    )
    .await;
    assert!(
        over.starts_with("Error: Block \"memory\" exceeds maxTokens: "),
        "{over}"
    );
    let memory = server.get("/v1/sessions/s/context").await.json[1].clone();
    assert_eq!(memory["content"], "likes tea");
    let ok = tool(
        &server,
        "s",
        "set_context",
        json!({"label": "memory", "content": "lives in Lisbon", "action": "append"}),
    )
    .await;
    assert!(ok.starts_with("Written to memory. Usage: "), "{ok}");
    assert_eq!(
        server.get("/v1/sessions/s/prompt").await.json["prompt"],
        prompt.as_str()
    );

    // Skills load and unload; the unload rewrites the loading result in the history.
    assert_eq!(
        tool(
            &server,
            "s",
            "load_context",
            json!({"label": "skills", "key": "review"})
        )
        .await,
        "Read the diff twice."
    );
    let turn = json!({"id": "a1", "role": "assistant", "parts": [{"type": "tool-load_context",
        "toolCallId": "c1", "state": "output-available", "input": {"label": "skills", "key": "review"},
        "output": "Read the diff twice."}]});
    assert_eq!(
        server.post("/v1/sessions/s/messages", turn).await.status,
        StatusCode::CREATED
    );
    let tools = server.get("/v1/sessions/s/tools").await.json;
    let unload = tools
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "unload_context")
        .unwrap();
    assert!(
        unload["description"]
            .as_str()
            .unwrap()
            .ends_with("Currently loaded: skills:review.")
    );
    assert_eq!(
        tool(
            &server,
            "s",
            "unload_context",
            json!({"label": "skills", "key": "review"})
        )
        .await,
        "Unloaded \"review\" from skills. Context reclaimed."
    );
    let rewritten = server.get("/v1/sessions/s/messages/a1").await.json;
    assert_eq!(rewritten["parts"][0]["output"], "[skill unloaded: review]");
    assert_eq!(
        tool(
            &server,
            "s",
            "unload_context",
            json!({"label": "skills", "key": "review"})
        )
        .await,
        "Skill \"review\" is not currently loaded in \"skills\"."
    );

    // Search blocks answer from their entries.
    assert_eq!(
        tool(
            &server,
            "s",
            "search_context",
            json!({"label": "kb", "query": "moon"})
        )
        .await,
        "[tides]\nTides follow the moon."
    );
    assert_eq!(
        tool(
            &server,
            "s",
            "search_context",
            json!({"label": "kb", "query": "sun"})
        )
        .await,
        "No results found."
    );
    assert_eq!(
        tool(&server, "s", "session_search", json!({"query": "diff"})).await,
        "No results found."
    );

    // Refresh re-renders with the writes made since the freeze.
    let refreshed = server
        .post("/v1/sessions/s/prompt/refresh", json!({}))
        .await;
    assert_eq!(refreshed.status, StatusCode::OK);
    let new_prompt = refreshed.json["prompt"].as_str().unwrap();
    assert!(
        new_prompt.contains("likes tea\nlives in Lisbon"),
        "{new_prompt}"
    );
    assert_ne!(new_prompt, prompt);
    assert_eq!(
        server.get("/v1/sessions/s/prompt").await.json["prompt"],
        new_prompt
    );
}

#[tokio::test]
async fn tool_listings_come_in_three_formats() {
    let server = start().await;
    server
        .put("/v1/sessions/s/context/memory", json!({"kind": "writable"}))
        .await;
    let raw = server.get("/v1/sessions/s/tools").await.json;
    let names: Vec<&str> = raw
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["set_context", "session_search"]);
    assert_eq!(
        raw[0]["parameters"]["required"],
        json!(["label", "content"])
    );
    let openai = server.get("/v1/sessions/s/tools?format=openai").await.json;
    assert_eq!(openai[0]["type"], "function");
    assert_eq!(openai[0]["function"]["parameters"], raw[0]["parameters"]);
    let anthropic = server
        .get("/v1/sessions/s/tools?format=anthropic")
        .await
        .json;
    assert_eq!(anthropic[0]["input_schema"], raw[0]["parameters"]);
    assert_eq!(
        server.get("/v1/sessions/s/tools?format=xml").await.status,
        StatusCode::BAD_REQUEST
    );
    // Tool failures are outputs, not HTTP errors.
    assert!(
        tool(&server, "s", "nope", json!({}))
            .await
            .starts_with("Error: ")
    );
    assert!(
        tool(&server, "s", "set_context", json!("{broken"))
            .await
            .starts_with("Error: ")
    );
}

#[tokio::test]
async fn templates_errors_and_deletes() {
    let server = start().await;
    let template = server
        .put(
            "/v1/context/soul",
            json!({"kind": "readonly", "content": "Shared."}),
        )
        .await;
    assert_eq!(template.status, StatusCode::OK);
    server
        .put(
            "/v1/context/memory",
            json!({"kind": "writable", "maxTokens": 5}),
        )
        .await;
    server
        .put("/v1/context/faq", json!({"kind": "search"}))
        .await;
    assert_eq!(
        server
            .put(
                "/v1/context/faq/entries/hours",
                json!({"content": "Open at nine."})
            )
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(
        server
            .get("/v1/context")
            .await
            .json
            .as_array()
            .unwrap()
            .len(),
        3
    );
    // A keyed block's entries list by key, a session's own in place of its template's.
    server
        .put(
            "/v1/sessions/a/context/faq/entries/hours",
            json!({"content": "Open at ten.", "description": "a's hours"}),
        )
        .await;
    server
        .put(
            "/v1/context/faq/entries/address",
            json!({"content": "Main Street."}),
        )
        .await;
    let listed = server.get("/v1/sessions/a/context/faq/entries").await;
    assert_eq!(listed.status, StatusCode::OK);
    assert_eq!(
        listed.json,
        json!({"items": [{"key": "address", "content": "Main Street.", "description": null},
               {"key": "hours", "content": "Open at ten.", "description": "a's hours"}]})
    );
    // Pages go forward by key; the cursor is the last key of the page.
    let first = server
        .get("/v1/sessions/a/context/faq/entries?limit=1")
        .await;
    assert_eq!(
        (&first.json["items"][0]["key"], &first.json["nextCursor"]),
        (&json!("address"), &json!("address"))
    );
    let rest = server
        .get("/v1/sessions/a/context/faq/entries?limit=1&after=address")
        .await;
    assert_eq!(rest.json["items"], json!([listed.json["items"][1]]));
    assert_eq!(rest.json.get("nextCursor"), None);
    for bad in [
        "limit=0",
        "limit=101",
        "after=",
        "before=hours",
        "order=desc",
    ] {
        let refused = server
            .get(&format!("/v1/sessions/a/context/faq/entries?{bad}"))
            .await;
        assert_eq!(
            (refused.status, refused.code()),
            (StatusCode::BAD_REQUEST, "invalid_request"),
            "{bad}"
        );
    }
    assert_eq!(
        server.get("/v1/context/faq/entries").await.json["items"][1],
        json!({"key": "hours", "content": "Open at nine.", "description": null})
    );
    // Deleting the session's own entry shows its template's again.
    let path = "/v1/sessions/a/context/faq/entries/hours";
    assert_eq!(server.delete(path).await.status, StatusCode::NO_CONTENT);
    let gone = server.delete(path).await;
    assert_eq!(
        (gone.status, gone.code()),
        (StatusCode::NOT_FOUND, "not_found")
    );
    assert_eq!(server.get(path).await.json["content"], "Open at nine.");
    server
        .put(
            path,
            json!({"content": "Open at ten.", "description": "a's hours"}),
        )
        .await;
    let not_keyed = server.get("/v1/context/soul/entries").await;
    assert_eq!(
        (not_keyed.status, not_keyed.code()),
        (StatusCode::CONFLICT, "conflict")
    );
    let missing = server.get("/v1/sessions/a/context/nope/entries").await;
    assert_eq!(
        (missing.status, missing.code()),
        (StatusCode::NOT_FOUND, "not_found")
    );
    // Every session sees the templates; writes stay per session.
    let appended = server
        .post(
            "/v1/sessions/a/context/memory/append",
            json!({"content": "a"}),
        )
        .await;
    assert_eq!(appended.status, StatusCode::OK);
    assert_eq!(appended.json["content"], "a");
    assert_eq!(
        server.get("/v1/sessions/b/context").await.json[1]["content"],
        ""
    );
    assert_eq!(
        tool(
            &server,
            "b",
            "search_context",
            json!({"label": "faq", "query": "nine"})
        )
        .await,
        "[hours]\nOpen at nine."
    );
    // Errors: limits (400), readonly (409), unknown block (404), bad kinds and fields (400).
    let over = server
        .post(
            "/v1/sessions/a/context/memory/append",
            json!({"content": "one two three four five six"}),
        )
        .await;
    assert_eq!(
        (over.status, over.code()),
        (StatusCode::BAD_REQUEST, "invalid_request")
    );
    let readonly = server
        .post(
            "/v1/sessions/a/context/soul/append",
            json!({"content": "x"}),
        )
        .await;
    assert_eq!(
        (readonly.status, readonly.code()),
        (StatusCode::CONFLICT, "conflict")
    );
    assert_eq!(
        server
            .post(
                "/v1/sessions/a/context/nope/append",
                json!({"content": "x"})
            )
            .await
            .status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        server
            .put("/v1/sessions/a/context/x", json!({"kind": "magic"}))
            .await
            .status,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        server
            .put(
                "/v1/sessions/a/context/x",
                json!({"kind": "writable", "extra": 1})
            )
            .await
            .status,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        server
            .put(
                "/v1/sessions/a/context/x",
                json!({"kind": "writable", "maxTokens": 1, "content": "too long here"})
            )
            .await
            .status,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        server
            .put(
                "/v1/sessions/a/context/memory/entries/k",
                json!({"content": "x"})
            )
            .await
            .status,
        StatusCode::CONFLICT
    );
    let long = "l".repeat(257);
    assert_eq!(
        server
            .put(
                &format!("/v1/sessions/a/context/{long}"),
                json!({"kind": "writable"})
            )
            .await
            .status,
        StatusCode::BAD_REQUEST
    );
    // Deletes: the session's copy goes, the template shows again; absent blocks are 404.
    assert_eq!(
        server.delete("/v1/sessions/a/context/memory").await.status,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        server.get("/v1/sessions/a/context").await.json[1]["content"],
        ""
    );
    assert_eq!(
        server.delete("/v1/sessions/a/context/memory").await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        server.delete("/v1/context/memory").await.status,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        server
            .get("/v1/sessions/a/context")
            .await
            .json
            .as_array()
            .unwrap()
            .len(),
        2
    );
}

/// `POST /v1/context` takes a templates' part of a dump whole or not at all.
#[tokio::test]
async fn templates_import_whole_or_not_at_all() {
    let server = start().await;
    let import = |body: String| {
        server.send(
            server
                .request(Method::POST, "/v1/context")
                .header("content-type", "application/x-ndjson")
                .body(body),
        )
    };
    let part = [
        r#"{"templates":{}}"#,
        r#"{"block":{"label":"soul","kind":"readonly","content":"Be brief."}}"#,
        r#"{"block":{"label":"kb","kind":"search"}}"#,
        r#"{"entry":{"label":"kb","key":"door","content":"the blue door"}}"#,
    ]
    .map(|line| format!("{line}\n"))
    .concat();
    // A part that fails at its second line (an entry of a block nothing defines, a message, a
    // readonly block past its token limit) does not write its first.
    let first = r#"{"block":{"label":"memory","kind":"writable"}}"#;
    for (second, named) in [
        (
            r#"{"entry":{"label":"nowhere","key":"k","content":"x"}}"#,
            "lines[1].entry.label",
        ),
        (
            r#"{"message":{"id":"m","role":"user","content":"x"}}"#,
            "lines[1]",
        ),
        (
            r#"{"block":{"label":"tiny","kind":"readonly","maxTokens":1,"content":"far too many words"}}"#,
            "Block \"tiny\" exceeds maxTokens",
        ),
    ] {
        let refused = import(format!("{first}\n{second}\n")).await;
        assert_eq!(
            (refused.status, refused.code()),
            (StatusCode::BAD_REQUEST, "invalid_request"),
            "{second}: {:?}",
            refused.json
        );
        let message = refused.json["error"]["message"].as_str().unwrap();
        assert!(message.contains(named), "{message}");
        assert_eq!(server.get("/v1/context").await.json, json!([]), "{second}");
    }

    let imported = import(part.clone()).await;
    assert_eq!(
        (imported.status, &imported.json),
        (StatusCode::OK, &json!({"imported": 3, "skipped": 0}))
    );
    let labels = block_labels(&server, "/v1/context").await;
    assert_eq!(labels, [json!("soul"), json!("kb")]);
    assert_eq!(
        server
            .get("/v1/sessions/s/context/kb/entries/door")
            .await
            .json["content"],
        "the blue door"
    );
    // Importing again replaces each block and entry by name.
    assert_eq!(
        import(part).await.json,
        json!({"imported": 3, "skipped": 0})
    );
    assert_eq!(block_labels(&server, "/v1/context").await.len(), 2);
}
