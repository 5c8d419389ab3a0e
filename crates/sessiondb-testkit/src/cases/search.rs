//! Full-text search: stemming, plain-word queries, scoping, index maintenance.

use serde_json::json;
use sessiondb::{AppendOptions, Db, Message, Source, Store};

use crate::*;

pub async fn search_finds_earlier_messages_with_stemming<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    s.append(
        text("m1", "user", "The quick brown fox runs"),
        AppendOptions::default(),
    )
    .await
    .unwrap();
    s.append(
        text("m2", "assistant", "Something else"),
        AppendOptions::default(),
    )
    .await
    .unwrap();
    let hits = s.search("quick brown", 20).await.unwrap();
    assert_eq!(hits.len(), 1);
    assert_eq!((hits[0].id.as_str(), hits[0].role.as_str()), ("m1", "user"));
    assert_eq!(hits[0].content, "The quick brown fox runs");
    assert_eq!(hits[0].session_id, "s");
    assert_eq!(
        hits[0].created_at,
        s.message("m1").await.unwrap().unwrap().created_at
    );
    assert_eq!(ids_of(&s.search("running", 20).await.unwrap()), ["m1"]);
}

/// Accents fold both ways, as someone typing without them expects, in a session's search and a
/// namespace's.
pub async fn search_folds_diacritics<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    for (id, words) in [
        ("m1", "Un café crème, naïve señor"),
        ("m2", "A cafe in Zurich"),
    ] {
        s.append(text(id, "user", words), AppendOptions::default())
            .await
            .unwrap();
    }
    for (query, found) in [
        ("cafe", &["m1", "m2"][..]),
        ("CAFÉ", &["m1", "m2"]),
        ("naive senor", &["m1"]),
        ("naïve", &["m1"]),
        ("Zürich", &["m2"]),
    ] {
        let mut ids = ids_of(&s.search(query, 20).await.unwrap());
        ids.sort();
        assert_eq!(ids, found, "{query}");
    }
    let everywhere = db.search_all("", None, "creme", 20).await.unwrap();
    assert_eq!(ids_of(&everywhere), ["m1"]);
}

fn ids_of(hits: &[sessiondb::SearchHit]) -> Vec<String> {
    hits.iter().map(|h| h.id.clone()).collect()
}

pub async fn query_syntax_is_always_plain_words<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    s.append(
        text("m1", "user", "alpha beta: gamma (delta) NEAR omega"),
        AppendOptions::default(),
    )
    .await
    .unwrap();
    for query in [
        "\"",
        "\"alpha",
        "alpha*",
        "*",
        "NEAR(alpha beta)",
        "-alpha",
        "alpha:beta",
        "((",
        ")",
        "\0",
        "alpha\0beta",
        "",
        "   ",
        "AND",
        "OR NOT",
        "^alpha",
        "{alpha}",
        "a'b",
        "col:alpha",
        "alpha + beta",
        "\u{1F600}",
    ] {
        let hits = s
            .search(query, 20)
            .await
            .unwrap_or_else(|e| panic!("{query:?}: {e}"));
        assert!(hits.iter().all(|h| h.id == "m1"), "{query:?}");
    }
    assert_eq!(ids_of(&s.search("alpha:beta", 20).await.unwrap()), ["m1"]);
    assert_eq!(ids_of(&s.search("(delta) NEAR", 20).await.unwrap()), ["m1"]);
    assert!(
        s.search("alpha zebra", 20).await.unwrap().is_empty(),
        "all words must match"
    );
}

pub async fn search_never_leaves_its_session<S: Store>(db: Db<S>) {
    let a = db_session(&db, "a");
    let b = db_session(&db, "b");
    let other_ns = db.session_in("tenant", "a").unwrap();
    a.append(
        text("x", "user", "shared keyword"),
        AppendOptions::default(),
    )
    .await
    .unwrap();
    b.append(
        text("y", "user", "shared keyword"),
        AppendOptions::default(),
    )
    .await
    .unwrap();
    other_ns
        .append(
            text("z", "user", "shared keyword"),
            AppendOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(ids_of(&a.search("keyword", 20).await.unwrap()), ["x"]);
    assert_eq!(ids_of(&b.search("keyword", 20).await.unwrap()), ["y"]);
    assert_eq!(
        ids_of(&other_ns.search("keyword", 20).await.unwrap()),
        ["z"]
    );
    assert!(a.search("\" OR session_id:b", 20).await.unwrap().is_empty());
}

pub async fn search_ranks_and_limits<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    s.append(
        text(
            "weak",
            "user",
            "rust appears once in a long sentence about many other things entirely",
        ),
        AppendOptions::default(),
    )
    .await
    .unwrap();
    s.append(
        text("strong", "user", "rust rust rust"),
        AppendOptions::default(),
    )
    .await
    .unwrap();
    for i in 0..30 {
        s.append(
            text(&format!("f{i}"), "user", "filler rust text"),
            AppendOptions::default(),
        )
        .await
        .unwrap();
    }
    let hits = s.search("rust", 5).await.unwrap();
    assert_eq!(hits.len(), 5);
    assert_eq!(hits[0].id, "strong");
    assert_eq!(s.search("rust", 100).await.unwrap().len(), 32);
    assert!(s.search("rust", 0).await.unwrap().is_empty());
}

pub async fn search_indexes_text_parts_and_string_content_only<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    let m = |v: serde_json::Value| Message::from_value(v).unwrap();
    s.append(
        m(json!({"id": "c", "role": "user", "content": "plainstring"})),
        AppendOptions::default(),
    )
    .await
    .unwrap();
    s.append(
        m(json!({"id": "arr", "role": "user", "content": [{"type": "text", "text": "arraytext"}]})),
        AppendOptions::default(),
    )
    .await
    .unwrap();
    s.append(m(json!({"id": "r", "role": "assistant", "parts": [{"type": "reasoning", "text": "hiddenthought"}]})), AppendOptions::default()).await.unwrap();
    s.append(m(json!({"id": "t", "role": "assistant", "parts": [{"type": "tool-x", "input": {"q": "toolinput"}}]})), AppendOptions::default()).await.unwrap();
    assert_eq!(ids_of(&s.search("plainstring", 5).await.unwrap()), ["c"]);
    assert_eq!(ids_of(&s.search("arraytext", 5).await.unwrap()), ["arr"]);
    assert!(s.search("hiddenthought", 5).await.unwrap().is_empty());
    assert!(s.search("toolinput", 5).await.unwrap().is_empty());
}

pub async fn index_follows_updates_deletes_and_clears<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    s.append(text("a", "user", "before"), AppendOptions::default())
        .await
        .unwrap();
    assert_eq!(s.search("before", 5).await.unwrap().len(), 1);
    s.append(
        text("b", "user", "appended after the index exists"),
        AppendOptions::default(),
    )
    .await
    .unwrap();
    assert_eq!(ids_of(&s.search("appended", 5).await.unwrap()), ["b"]);
    s.update(text("a", "user", "after"), Source::Server)
        .await
        .unwrap();
    assert!(s.search("before", 5).await.unwrap().is_empty());
    let mut after = ids_of(&s.search("after", 5).await.unwrap());
    after.sort();
    assert_eq!(after, ["a", "b"]);
    s.delete(&["b".into()]).await.unwrap();
    assert_eq!(
        ids_of(&s.search("appended", 5).await.unwrap()),
        Vec::<String>::new()
    );
    s.clear().await.unwrap();
    assert!(s.search("after", 5).await.unwrap().is_empty());
}
