//! `/v1/sessions`: create, list with cursors, get, patch, delete.

use reqwest::StatusCode;
use serde_json::json;

use crate::common::start;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_lifecycle() {
    let server = start().await;
    let created = server
        .post(
            "/v1/sessions",
            json!({"id": "s1", "name": "First", "model": "m", "source": "web", "userId": "u1",
                   "parentSessionId": "s0", "metadata": {"a": 1, "b": 2},
                   "settings": {"compactAfter": 1000}}),
        )
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    let s = &created.json;
    for (field, value) in [
        ("id", json!("s1")),
        ("name", json!("First")),
        ("model", json!("m")),
        ("source", json!("web")),
        ("userId", json!("u1")),
        ("parentSessionId", json!("s0")),
        ("metadata", json!({"a": 1, "b": 2})),
        ("settings", json!({"compactAfter": 1000})),
        ("endReason", json!(null)),
        ("inputTokens", json!(0)),
        ("outputTokens", json!(0)),
        ("messageCount", json!(0)),
        ("leafId", json!(null)),
        ("tokenEstimate", json!(0)),
        ("contentBytes", json!(0)),
        ("lastMessageAt", json!(null)),
    ] {
        assert_eq!(s[field], value, "{field}");
    }
    assert!(s["createdAt"].as_i64().unwrap() > 0 && s["cost"].is_number());

    let duplicate = server.post("/v1/sessions", json!({"id": "s1"})).await;
    assert_eq!(
        (duplicate.status, duplicate.code()),
        (StatusCode::CONFLICT, "conflict")
    );
    let generated = server.post("/v1/sessions", json!({})).await;
    assert!(generated.json["id"].as_str().unwrap().starts_with("ses_"));
    let unknown_field = server.post("/v1/sessions", json!({"nmae": "typo"})).await;
    assert_eq!(unknown_field.status, StatusCode::BAD_REQUEST);
    let bad_settings = server
        .post("/v1/sessions", json!({"settings": {"compactAfter": -5}}))
        .await;
    assert_eq!(bad_settings.status, StatusCode::BAD_REQUEST);

    server.say("s1", "m1", "hello").await;
    let fetched = server.get("/v1/sessions/s1").await;
    assert_eq!(fetched.json["messageCount"], 1);
    assert_eq!(fetched.json["leafId"], "m1");
    assert!(fetched.json["lastMessageAt"].as_i64().is_some());
    assert!(fetched.json["contentBytes"].as_u64().unwrap() > 0);

    let patched = server
        .patch(
            "/v1/sessions/s1",
            json!({"name": "Renamed", "metadata": {"b": null, "c": 3}, "settings": {"keepRecentTokens": 50}}),
        )
        .await;
    assert_eq!(patched.status, StatusCode::OK);
    assert_eq!(patched.json["name"], "Renamed");
    assert_eq!(patched.json["metadata"], json!({"a": 1, "c": 3}));
    assert_eq!(
        patched.json["settings"],
        json!({"compactAfter": 1000, "keepRecentTokens": 50})
    );
    assert_eq!(patched.json["model"], "m");
    let missing = server
        .patch("/v1/sessions/nope", json!({"name": "x"}))
        .await;
    assert_eq!(
        (missing.status, missing.code()),
        (StatusCode::NOT_FOUND, "not_found")
    );
    assert_eq!(
        server.get("/v1/sessions/nope").await.status,
        StatusCode::NOT_FOUND
    );

    server.put("/v1/sessions/s1/state/k", json!(1)).await;
    server
        .post(
            "/v1/sessions/s1/compactions",
            json!({"summary": "s", "fromMessageId": "m1", "toMessageId": "m1"}),
        )
        .await;
    assert_eq!(
        server.delete("/v1/sessions/s1").await.status,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        server.get("/v1/sessions/s1").await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        server.get("/v1/sessions/s1/messages/m1").await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        server.get("/v1/sessions/s1/state/k").await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        server.get("/v1/sessions/s1/compactions").await.json,
        json!([])
    );
    assert_eq!(
        server.delete("/v1/sessions/s1").await.status,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listings_page_with_cursors_and_filter_by_user() {
    let server = start().await;
    for i in 0..7 {
        let user = if i % 2 == 0 { "even" } else { "odd" };
        let answer = server
            .post(
                "/v1/sessions",
                json!({"id": format!("s{i}"), "userId": user}),
            )
            .await;
        assert_eq!(answer.status, StatusCode::CREATED);
    }
    let mut seen = Vec::new();
    let mut path = "/v1/sessions?limit=3&order=asc&sort=createdAt".to_owned();
    let mut pages = 0;
    loop {
        let page = server.get(&path).await;
        assert_eq!(page.status, StatusCode::OK, "{page:?}");
        pages += 1;
        seen.extend(page.ids());
        match page.json["nextCursor"].as_str() {
            Some(cursor) => {
                path = format!("/v1/sessions?limit=3&order=asc&sort=createdAt&after={cursor}")
            }
            None => break,
        }
    }
    assert_eq!(seen, ["s0", "s1", "s2", "s3", "s4", "s5", "s6"]);
    assert_eq!(pages, 3);

    let newest = server.get("/v1/sessions?limit=2&sort=createdAt").await;
    assert_eq!(newest.ids(), ["s6", "s5"]);
    assert!(newest.json.get("previousCursor").is_none());
    let next = newest.json["nextCursor"].as_str().unwrap();
    let older = server
        .get(&format!("/v1/sessions?limit=2&sort=createdAt&after={next}"))
        .await;
    assert_eq!(older.ids(), ["s4", "s3"]);
    let previous = older.json["previousCursor"].as_str().unwrap();
    let back = server
        .get(&format!(
            "/v1/sessions?limit=2&sort=createdAt&before={previous}"
        ))
        .await;
    assert_eq!(back.ids(), ["s6", "s5"]);

    let odd = server
        .get("/v1/sessions?userId=odd&order=asc&sort=createdAt")
        .await;
    assert_eq!(odd.ids(), ["s1", "s3", "s5"]);
    // Default order is updatedAt, newest first: touching a session moves it to the front.
    server.say("s0", "m", "touch").await;
    assert_eq!(server.get("/v1/sessions?limit=1").await.ids(), ["s0"]);

    for bad in [
        "/v1/sessions?limit=0",
        "/v1/sessions?limit=101",
        "/v1/sessions?limit=x",
        "/v1/sessions?order=sideways",
        "/v1/sessions?sort=name",
        "/v1/sessions?after=zz",
        "/v1/sessions?after=a&before=b",
        "/v1/sessions?unknown=1",
    ] {
        let answer = server.get(bad).await;
        assert_eq!(
            (answer.status, answer.code()),
            (StatusCode::BAD_REQUEST, "invalid_request"),
            "{bad}"
        );
    }
}

/// `DELETE /v1/sessions?userId=` erases one user's sessions in the key's namespace only, and
/// is refused without a user rather than read as "every session".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_users_sessions_are_deleted_in_the_keys_namespace() {
    let mut server = crate::common::start_with(sessiondb_server::ServerConfig {
        api_keys: std::collections::HashMap::from([
            ("key-a".to_owned(), "tenant-a".to_owned()),
            ("key-b".to_owned(), "tenant-b".to_owned()),
        ]),
        ..Default::default()
    })
    .await;
    for key in ["key-a", "key-b"] {
        server.key = Some(key.into());
        for (id, user) in [("a", "u1"), ("b", "u1"), ("c", "u2")] {
            let created = server
                .post("/v1/sessions", json!({"id": id, "userId": user}))
                .await;
            assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
            server.say(id, "m1", "hello").await;
        }
    }
    server.key = Some("key-a".into());
    for refused in [
        "/v1/sessions",
        "/v1/sessions?userId=",
        "/v1/sessions?user=u1",
    ] {
        let answer = server.delete(refused).await;
        assert_eq!(
            (answer.status, answer.code()),
            (StatusCode::BAD_REQUEST, "invalid_request"),
            "{refused}"
        );
    }
    assert_eq!(
        server.get("/v1/sessions").await.json["items"]
            .as_array()
            .unwrap()
            .len(),
        3
    );

    let erased = server.delete("/v1/sessions?userId=u1").await;
    assert_eq!(erased.status, StatusCode::OK, "{erased:?}");
    assert_eq!(erased.json, json!({"deleted": 2}));
    let left = server.get("/v1/sessions").await;
    let ids: Vec<&str> = left.json["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["c"]);
    assert_eq!(
        server.get("/v1/sessions/a").await.status,
        StatusCode::NOT_FOUND
    );
    let again = server.delete("/v1/sessions?userId=u1").await;
    assert_eq!(again.json, json!({"deleted": 0}));

    server.key = Some("key-b".into());
    let other = server.get("/v1/sessions?userId=u1").await;
    assert_eq!(other.json["items"].as_array().unwrap().len(), 2);
}
