//! Full-text search: stemming, plain-word queries, scoping, index maintenance.

use serde_json::json;
use sessiondb::{
    AppendOptions, Db, Highlighter, Message, SearchFilter, SessionRecord, Source, Store,
};

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

/// A hit's snippet marks the words the backend's index matched, stemmed and folded: the core's
/// highlighter stems as the embedded index does, and the PostgreSQL one agrees on these.
pub async fn snippets_mark_what_the_search_matched<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    let said = "Running the connections tests, the agents generalized with happiness at the café";
    s.append(text("m1", "user", said), AppendOptions::default())
        .await
        .unwrap();
    for (query, marked) in [
        ("run", "Running"),
        ("connected", "connections"),
        ("agent", "agents"),
        ("generalize", "generalized"),
        ("happy", "happiness"),
        ("CAFE", "café"),
    ] {
        let hits = s.search(query, 20).await.unwrap();
        assert_eq!(ids_of(&hits), ["m1"], "{query}");
        let snippet = Highlighter::new(query).snippet(&hits[0].content, 4);
        assert_eq!(
            snippet.get(1).map(String::as_str),
            Some(marked),
            "{query}: {snippet:?}"
        );
    }
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

/// A filter keeps one role's matches, or those created in `[since, until)`, in a session's
/// search and a namespace's (there with a user's sessions too); the ranking among the kept is
/// the unfiltered one.
pub async fn search_filters_keep_one_role_and_a_time_range<S: Store>(db: Db<S>) {
    let record = SessionRecord {
        user_id: Some("u1".into()),
        ..Default::default()
    };
    db.create_session("", Some("s".into()), record)
        .await
        .unwrap();
    let s = db_session(&db, "s");
    let mut times = Vec::new();
    for (id, role) in [
        ("m1", "user"),
        ("m2", "assistant"),
        ("m3", "user"),
        ("m4", "assistant"),
    ] {
        let stored = s
            .append(
                text(id, role, &format!("apples {id}")),
                AppendOptions::default(),
            )
            .await
            .unwrap();
        times.push(stored.message.created_at);
        // Each message in a millisecond of its own.
        std::thread::sleep(std::time::Duration::from_millis(3));
    }
    chain(&db_session(&db, "other"), &["apples"]).await;
    let sorted = |mut ids: Vec<String>| {
        ids.sort_unstable();
        ids
    };
    let in_session = async |filter: SearchFilter| {
        sorted(ids_of(
            &s.search_filtered("apple", &filter, 20).await.unwrap(),
        ))
    };
    let in_namespace = async |user: Option<&str>, filter: SearchFilter| {
        let hits = db.search_all_filtered("", user, "apple", &filter, 20).await;
        let hits = hits.unwrap();
        sorted(
            hits.iter()
                .map(|h| format!("{}/{}", h.session_id, h.id))
                .collect(),
        )
    };
    let role = |role: &str| SearchFilter {
        role: Some(role.into()),
        ..Default::default()
    };
    let between = |since: Option<i64>, until: Option<i64>| SearchFilter {
        since_ms: since,
        until_ms: until,
        ..Default::default()
    };
    assert_eq!(
        in_session(SearchFilter::default()).await,
        ["m1", "m2", "m3", "m4"]
    );
    assert_eq!(in_session(role("user")).await, ["m1", "m3"]);
    assert_eq!(in_session(role("tool")).await, Vec::<String>::new());
    assert_eq!(
        in_session(between(Some(times[1]), None)).await,
        ["m2", "m3", "m4"]
    );
    assert_eq!(
        in_session(between(None, Some(times[2]))).await,
        ["m1", "m2"]
    );
    assert_eq!(
        in_session(between(Some(times[1]), Some(times[3]))).await,
        ["m2", "m3"]
    );
    let assistant_late = SearchFilter {
        since_ms: Some(times[2]),
        ..role("assistant")
    };
    assert_eq!(in_session(assistant_late.clone()).await, ["m4"]);
    assert_eq!(
        in_namespace(None, role("user")).await,
        ["other/apples", "s/m1", "s/m3"]
    );
    assert_eq!(
        in_namespace(Some("u1"), role("user")).await,
        ["s/m1", "s/m3"]
    );
    assert_eq!(in_namespace(None, assistant_late).await, ["s/m4"]);
    let before_all = between(None, Some(times[0]));
    assert_eq!(in_namespace(None, before_all).await, Vec::<String>::new());
    let unfiltered = s.search("apple", 20).await.unwrap();
    let users: Vec<String> = unfiltered
        .iter()
        .filter(|h| h.role == "user")
        .map(|h| h.id.clone())
        .collect();
    let filtered = s.search_filtered("apple", &role("user"), 20).await;
    assert_eq!(ids_of(&filtered.unwrap()), users);
}

/// A search for any of its words finds every message holding one, the one holding them all
/// first, in a session and across the namespace, filters still applying; a search for all of
/// them finds only that one.
pub async fn any_word_searches_find_every_message_holding_one<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    for (id, role, words) in [
        (
            "both",
            "user",
            "we planned the database migration on Friday",
        ),
        ("one", "assistant", "the database is ready"),
        ("other", "user", "a migration needs care"),
        ("none", "user", "lunch at noon"),
    ] {
        s.append(text(id, role, words), AppendOptions::default())
            .await
            .unwrap();
    }
    let other = db_session(&db, "t");
    other
        .append(
            text("elsewhere", "user", "database"),
            AppendOptions::default(),
        )
        .await
        .unwrap();
    let query = "what did we decide about the database migration";
    let any = SearchFilter {
        match_any: true,
        ..Default::default()
    };
    let hits = s.search_filtered(query, &any, 20).await.unwrap();
    assert_eq!(hits[0].id, "both");
    let mut found = ids_of(&hits);
    found.sort();
    assert_eq!(found, ["both", "one", "other"]);
    assert!(s.search(query, 20).await.unwrap().is_empty());
    assert_eq!(
        ids_of(&s.search("database migration", 20).await.unwrap()),
        ["both"]
    );
    let users_only = SearchFilter {
        role: Some("user".into()),
        ..any.clone()
    };
    let mut found = ids_of(&s.search_filtered(query, &users_only, 20).await.unwrap());
    found.sort();
    assert_eq!(found, ["both", "other"]);
    let across = db
        .search_all_filtered("", None, query, &any, 20)
        .await
        .unwrap();
    assert_eq!(across.len(), 4);
    assert_eq!(across[0].id, "both");
    assert!(across.iter().any(|h| h.session_id == "t"));
    // Words past the query's (none of which a message holds) find nothing either way.
    let nothing = s.search_filtered("zzz qqq", &any, 20).await.unwrap();
    assert!(nothing.is_empty());
}
