//! Behaviour specific to the SQLite backend: the on-disk layout, locking, migrations, lazy search
//! index, group commit, and crash safety under SIGKILL.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::executor::block_on;
use rusqlite::Connection;
use sessiondb::{AppendOptions, Db, Error, HistoryOptions, ImportOptions, Message, Source};
use sessiondb_core::StoreError;
use sessiondb_sqlite::{
    DATABASE_FILE, SCHEMA_VERSION, SEARCH_BACKLOG_ROWS, SqliteConfig, SqliteStore,
};

fn open(dir: &std::path::Path) -> Db<SqliteStore> {
    Db::new(SqliteStore::open(dir).unwrap())
}

fn raw(dir: &std::path::Path) -> Connection {
    Connection::open(dir.join(DATABASE_FILE)).unwrap()
}

fn count(conn: &Connection, sql: &str) -> i64 {
    conn.query_row(sql, [], |r| r.get(0)).unwrap()
}

/// Appends a user message whose id and text are `id`.
fn add_text(session: &sessiondb::Session<SqliteStore>, id: &str) -> sessiondb::AppendResult {
    block_on(session.append(
        Message::text("user", id).with_id(id),
        AppendOptions::default(),
    ))
    .unwrap()
}

/// Rows of the full-text index that match `query`.
fn fts_matches(conn: &Connection, query: &str) -> i64 {
    count(
        conn,
        &format!("SELECT count(*) FROM message_fts WHERE message_fts MATCH '{query}'"),
    )
}

/// Texts of `message_search` rows the full-text index does not hold yet, oldest first.
fn pending_texts(conn: &Connection) -> Vec<String> {
    let mut stmt = conn
        .prepare(
            "SELECT pending_text FROM message_search WHERE pending_text IS NOT NULL ORDER BY rowid",
        )
        .unwrap();
    stmt.query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// Rewrites the closed store in `dir` as a release with schema `version` (before 13) kept it: a
/// file built by the migrations up to `version` holding the same sessions and messages, these
/// keyed by namespace, session and seq, and nothing that is built on demand (the search index).
fn rewrite_at_schema(dir: &std::path::Path, version: i64) {
    let current = dir.join("current.db");
    raw(dir)
        .execute("VACUUM INTO ?1", [current.to_str().unwrap()])
        .unwrap();
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(dir.join(format!("{DATABASE_FILE}{suffix}")));
    }
    let mut conn = raw(dir);
    sessiondb_sqlite::create_schema_version(&mut conn, version).unwrap();
    conn.execute("ATTACH ?1 AS current", [current.to_str().unwrap()])
        .unwrap();
    conn.execute_batch(
        "INSERT INTO sessions (namespace, id, created_at, updated_at, last_message_at, next_seq,
             leaf_id, leaf_seq, path_len, path_tokens, path_bytes, path_capped, path_head_seq,
             path_dense, path_epoch, stored_messages, name, parent_session_id, model, source,
             user_id, metadata, settings, end_reason, input_tokens, output_tokens, cost)
         SELECT namespace, id, created_at, updated_at, last_message_at, next_seq, leaf_id,
                leaf_seq, path_len, path_tokens, path_bytes, path_capped, path_head_seq,
                path_dense, path_epoch, stored_messages, name, parent_session_id, model, source,
                user_id, metadata, settings, end_reason, input_tokens, output_tokens, cost
           FROM current.sessions;
         INSERT INTO messages (namespace, session_id, seq, id, parent_id, parent_seq, role,
             content, content_chunks, bytes, token_estimate, content_hash, created_at,
             updated_at, path_len, path_tokens, path_bytes, path_epoch)
         SELECT s.namespace, s.id, m.seq, m.id, m.parent_id, m.parent_seq, m.role, m.content,
                m.content_chunks, m.bytes, m.token_estimate, m.content_hash, m.created_at,
                m.updated_at, m.path_len, m.path_tokens, m.path_bytes, m.path_epoch
           FROM current.messages m JOIN current.sessions s ON s.number = m.k >> 32;
         DETACH current;",
    )
    .unwrap();
    drop(conn);
    std::fs::remove_file(current).unwrap();
}

fn table_exists(conn: &Connection, name: &str) -> bool {
    count(
        conn,
        &format!("SELECT count(*) FROM sqlite_schema WHERE name = '{name}'"),
    ) > 0
}

#[test]
fn search_index_is_built_by_the_first_search_and_back_fills() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path());
    let s = db.session("s").unwrap();
    block_on(async {
        s.append(
            Message::text("user", "the quick brown fox").with_id("a"),
            AppendOptions::default(),
        )
        .await
        .unwrap();
        let big = format!("{} needle", "x ".repeat(1_000_000));
        s.append(
            Message::text("user", big.clone()).with_id("chunked"),
            AppendOptions::default(),
        )
        .await
        .unwrap();
        assert!(!table_exists(&raw(dir.path()), "message_fts"));
        assert!(!db.store().has_search_index());
        assert_eq!(s.search("quick brown", 5).await.unwrap()[0].id, "a");
        assert!(table_exists(&raw(dir.path()), "message_fts"));
        // Chunked messages are back-filled from their whole body, and a hit's text is whole.
        let hits = s.search("needle", 5).await.unwrap();
        assert_eq!(hits[0].id, "chunked");
        assert_eq!(hits[0].content, big);
    });
    drop((s, db));
    let db = open(dir.path());
    assert!(db.store().has_search_index(), "the index survives a reopen");
}

/// The build reads the messages on a thread of its own and hands their texts over in batches:
/// every one of several batches, from every session, is indexed once and only in its session.
#[test]
fn the_first_search_back_fills_every_session_across_many_batches() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path());
    let sessions = ["one", "two", "three"];
    block_on(async {
        for name in sessions {
            let s = db.session(name).unwrap();
            for i in 0..400 {
                let text = format!("common word{i}x{name}");
                let m = Message::text("user", text).with_id(format!("{name}-{i}"));
                s.append(m, AppendOptions::default()).await.unwrap();
            }
            // A message without indexed text gets no row.
            let tool = Message::from_value(serde_json::json!({
                "id": format!("{name}-tool"), "role": "assistant",
                "parts": [{"type": "tool-call", "input": {"q": "common"}}]}))
            .unwrap();
            s.append(tool, AppendOptions::default()).await.unwrap();
        }
        let two = db.session("two").unwrap();
        assert_eq!(
            ids_of(&two.search("word399xtwo", 5).await.unwrap()),
            ["two-399"]
        );
        assert!(two.search("word7xone", 5).await.unwrap().is_empty());
        for name in sessions {
            let s = db.session(name).unwrap();
            for i in [0, 255, 256, 399] {
                let hits = s.search(&format!("word{i}x{name}"), 5).await.unwrap();
                assert_eq!(ids_of(&hits), [format!("{name}-{i}")]);
            }
            assert_eq!(s.search("common", 500).await.unwrap().len(), 400);
        }
    });
    drop(db);
    let conn = raw(dir.path());
    assert_eq!(count(&conn, "SELECT count(*) FROM message_search"), 1200);
    assert_eq!(fts_matches(&conn, "common"), 1200);
    assert!(
        pending_texts(&conn).is_empty(),
        "the index holds no copies of texts"
    );
    assert!(table_exists(&conn, "message_search_key"));
}

/// A message that cannot be read stops the build with an error naming it, and the build leaves
/// nothing behind: no index tables, no mark, and the next search tries again.
#[test]
fn a_build_that_meets_an_unreadable_message_leaves_no_index() {
    let dir = tempfile::tempdir().unwrap();
    {
        let db = open(dir.path());
        let s = db.session("s").unwrap();
        block_on(async {
            for i in 0..700 {
                let m = Message::text("user", format!("text {i}")).with_id(format!("m{i}"));
                s.append(m, AppendOptions::default()).await.unwrap();
            }
        });
    }
    let conn = raw(dir.path());
    let content: String = conn
        .query_row("SELECT content FROM messages WHERE id = 'm600'", [], |r| {
            r.get(0)
        })
        .unwrap();
    conn.execute(
        "UPDATE messages SET content = '{broken' WHERE id = 'm600'",
        [],
    )
    .unwrap();
    drop(conn);
    let db = open(dir.path());
    let s = db.session("s").unwrap();
    let err = block_on(s.search("text", 5)).unwrap_err();
    assert!(
        matches!(&err, Error::Store(StoreError::Corrupt(m)) if m.contains("m600")),
        "{err}"
    );
    assert!(!db.store().has_search_index());
    drop((s, db));
    let conn = raw(dir.path());
    assert!(!table_exists(&conn, "message_search"));
    assert!(!table_exists(&conn, "message_fts"));
    conn.execute(
        "UPDATE messages SET content = ?1 WHERE id = 'm600'",
        [content],
    )
    .unwrap();
    drop(conn);
    let db = open(dir.path());
    let s = db.session("s").unwrap();
    assert_eq!(block_on(s.search("text", 1000)).unwrap().len(), 700);
}

#[test]
fn a_second_open_of_the_same_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path());
    let err = SqliteStore::open(dir.path()).unwrap_err();
    assert!(matches!(err, StoreError::Locked { .. }), "{err}");
    let s = db.session("s").unwrap();
    block_on(s.append(
        Message::text("user", "kept").with_id("k"),
        AppendOptions::default(),
    ))
    .unwrap();
    drop((s, db));
    let db = open(dir.path());
    let s = db.session("s").unwrap();
    assert!(
        block_on(s.message("k")).unwrap().is_some(),
        "data survives a reopen"
    );
}

#[test]
fn a_data_directory_that_is_a_file_is_named_as_such() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("data");
    std::fs::write(&file, "not a directory").unwrap();
    let err = SqliteStore::open(&file).unwrap_err().to_string();
    assert!(err.ends_with("data: not a directory"), "{err}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "not a directory");
}

/// The size limit holds for the store's whole life: a search builds the full-text index on a
/// fresh writer connection, which keeps the limit too.
#[test]
fn the_size_limit_outlives_the_first_search() {
    let dir = tempfile::tempdir().unwrap();
    let config = SqliteConfig {
        max_database_bytes: Some(1 << 20),
        ..SqliteConfig::default()
    };
    let db = Db::new(SqliteStore::open_with(dir.path(), config).unwrap());
    let s = db.session("s").unwrap();
    block_on(s.append(Message::text("user", "needle"), AppendOptions::default())).unwrap();
    assert_eq!(block_on(s.search("needle", 5)).unwrap().len(), 1);
    let filler = "filler text ".repeat(2_000);
    let full = (0..200).find_map(|i| {
        let message = Message::text("user", format!("{i} {filler}"));
        block_on(s.append(message, AppendOptions::default())).err()
    });
    assert!(
        matches!(full, Some(Error::Store(StoreError::StorageFull(_)))),
        "{full:?}"
    );
}

/// A store at its size limit fails writes as on a full disk: a typed error, nothing of the
/// write stored, including writes that shared a group commit; reads go on, and writes succeed
/// again once a delete frees pages.
#[test]
fn a_full_store_refuses_writes_with_a_typed_error_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let config = SqliteConfig {
        max_database_bytes: Some(1 << 20),
        ..SqliteConfig::default()
    };
    let db = Db::new(SqliteStore::open_with(dir.path(), config.clone()).unwrap());
    let big = |i: usize| {
        let text = format!("{i} {}", "filler text ".repeat(2_000));
        Message::text("user", text).with_id(format!("m{i}"))
    };
    let is_full = |e: &Error| matches!(e, Error::Store(StoreError::StorageFull(_)));
    let (mut kept, mut failed) = (Vec::new(), None);
    for i in 0..200 {
        let s = db.session(["a", "b"][i % 2]).unwrap();
        match block_on(s.append(big(i), AppendOptions::default())) {
            Ok(_) => kept.push(i),
            Err(e) => {
                assert!(is_full(&e), "{e}");
                failed = Some(i);
                break;
            }
        }
    }
    let failed = failed.expect("the limit is reached");
    assert!(kept.len() > 10, "{} appends fit", kept.len());

    // Writers at the limit together: each gets its own outcome, and a refused one left nothing.
    let outcomes: Vec<_> = std::thread::scope(|scope| {
        let writers: Vec<_> = (0..8)
            .map(|w| {
                let s = db.session(&format!("c{w}")).unwrap();
                scope.spawn(move || block_on(s.append(big(1000 + w), AppendOptions::default())))
            })
            .collect();
        writers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    for (w, outcome) in outcomes.iter().enumerate() {
        let stored = block_on(
            db.session(&format!("c{w}"))
                .unwrap()
                .message(&format!("m{}", 1000 + w)),
        );
        match outcome {
            Ok(_) => assert!(stored.unwrap().is_some()),
            Err(e) => {
                assert!(is_full(e), "{e}");
                assert!(stored.unwrap().is_none());
            }
        }
    }
    assert!(outcomes.iter().any(Result::is_err));

    let a = db.session("a").unwrap();
    let b = db.session("b").unwrap();
    let ids = |s: &sessiondb::Session<SqliteStore>| -> Vec<String> {
        block_on(s.full_history(HistoryOptions::default()))
            .unwrap()
            .iter()
            .map(|m| m.id.to_string())
            .collect()
    };
    let in_b: Vec<String> = kept
        .iter()
        .filter(|i| *i % 2 == 1)
        .map(|i| format!("m{i}"))
        .collect();
    assert_eq!(ids(&b), in_b, "reads go on at the limit");
    assert!(
        block_on(b.message(&format!("m{failed}")))
            .unwrap()
            .is_none()
    );

    assert!(block_on(a.delete_session()).unwrap());
    block_on(b.append(big(failed), AppendOptions::default())).unwrap();
    drop((a, b, db));
    let db = Db::new(SqliteStore::open_with(dir.path(), config).unwrap());
    let b = db.session("b").unwrap();
    assert_eq!(ids(&b).last(), Some(&format!("m{failed}")));
}

const HOLD_DIR: &str = "SESSIONDB_HOLD_DIR";

#[test]
fn a_second_process_gets_a_clear_error() {
    if let Ok(dir) = std::env::var(HOLD_DIR) {
        // Child: hold the store open until killed.
        let _db = open(std::path::Path::new(&dir));
        println!("OPEN");
        std::thread::sleep(Duration::from_secs(60));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_second_process_gets_a_clear_error",
            "--nocapture",
        ])
        .env(HOLD_DIR, dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert!(
        lines.any(|l| l.is_ok_and(|l| l == "OPEN")),
        "the child never opened the store"
    );
    let err = SqliteStore::open(dir.path()).unwrap_err();
    assert!(matches!(err, StoreError::Locked { .. }), "{err}");
    assert!(err.to_string().contains("already open in another process"));
    // The database file itself is the process's alone (SQLite's `unix-excl`): its connections
    // share the WAL index in memory, no `-shm` file exists, and another program is refused.
    let shm = dir.path().join(format!("{DATABASE_FILE}-shm"));
    assert!(!shm.exists(), "{} exists", shm.display());
    let outside = raw(dir.path());
    outside.busy_timeout(Duration::ZERO).unwrap();
    let outside = outside.query_row("SELECT count(*) FROM sqlite_schema", [], |r| {
        r.get::<_, i64>(0)
    });
    let refused = outside.unwrap_err();
    assert_eq!(
        refused.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy),
        "{refused}"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        SqliteStore::open(dir.path()).is_ok(),
        "the lock dies with its process"
    );
}

#[test]
fn migrations_stamp_the_schema_version_and_refuse_newer_files() {
    let dir = tempfile::tempdir().unwrap();
    drop(open(dir.path()));
    let conn = raw(dir.path());
    assert_eq!(count(&conn, "PRAGMA user_version"), SCHEMA_VERSION);
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    conn.pragma_update(None, "user_version", 99).unwrap();
    drop(conn);
    let err = SqliteStore::open(dir.path()).unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::SchemaTooNew {
                found: 99,
                supported: SCHEMA_VERSION
            }
        ),
        "{err}"
    );
}

/// Schemas 9 to 13 re-key the id index and then the messages; a file of schema 8 opens, gets the
/// id index of the current schema, and still finds its messages by id within their session and,
/// after the first search builds the index, by text.
#[test]
fn a_schema_8_file_migrates_to_the_current_keys() {
    let dir = tempfile::tempdir().unwrap();
    {
        let db = open(dir.path());
        let (a, b) = (db.session("a").unwrap(), db.session("b").unwrap());
        for id in ["m1", "m2", "m3"] {
            add_text(&a, id);
        }
        add_text(&b, "m1");
    }
    let index_columns = |conn: &Connection| -> Vec<String> {
        let mut stmt = conn
            .prepare("SELECT name FROM pragma_index_info('messages_by_id') ORDER BY seqno")
            .unwrap();
        stmt.query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    rewrite_at_schema(dir.path(), 8);
    assert_eq!(
        index_columns(&raw(dir.path())),
        ["namespace", "session_id", "id"]
    );

    let db = open(dir.path());
    let conn = raw(dir.path());
    assert_eq!(index_columns(&conn), ["id"]);
    assert_eq!(count(&conn, "PRAGMA user_version"), SCHEMA_VERSION);
    drop(conn);
    assert!(!db.store().has_search_index());
    let (a, b) = (db.session("a").unwrap(), db.session("b").unwrap());
    let found = block_on(a.search("m3", 5)).unwrap();
    assert_eq!(
        found.iter().map(|h| h.id.as_str()).collect::<Vec<_>>(),
        ["m3"]
    );
    assert!(
        !add_text(&a, "m2").inserted,
        "an existing id is found again"
    );
    assert!(add_text(&b, "m2").inserted, "ids stay per session");
    let m3 = block_on(a.message("m3")).unwrap().unwrap();
    assert_eq!(m3.parent_id.as_deref(), Some("m2"));
    assert_eq!(db.store().check().unwrap(), Vec::<String>::new());
}

/// Schema 14 gives sessions a version: one stored before it is at 0 (no version to name yet),
/// and its next write moves it past every version a session could have had.
#[test]
fn a_schema_13_file_versions_its_sessions_from_their_next_write() {
    let dir = tempfile::tempdir().unwrap();
    let written = {
        let db = open(dir.path());
        add_text(&db.session("a").unwrap(), "m1").version.unwrap()
    };
    raw(dir.path())
        .execute_batch(
            "DROP TABLE deleted_versions; ALTER TABLE sessions DROP COLUMN version;
             PRAGMA user_version = 13;",
        )
        .unwrap();

    let db = open(dir.path());
    assert_eq!(
        count(&raw(dir.path()), "PRAGMA user_version"),
        SCHEMA_VERSION
    );
    let a = db.session("a").unwrap();
    assert_eq!(block_on(a.stats()).unwrap().version, 0);
    let (version, history) = block_on(a.versioned_history(HistoryOptions::default())).unwrap();
    let history: Vec<_> = block_on(futures::TryStreamExt::try_collect::<Vec<_>>(history)).unwrap();
    assert_eq!((version, history.len()), (0, 1));
    assert!(add_text(&a, "m2").version.unwrap() >= written);
}

/// Sessions are numbered from 1 in the order they are first written; the number of the newest,
/// once deleted, goes to the next new session, which sees none of the old session's rows.
#[test]
fn a_new_session_may_take_a_deleted_sessions_number_but_none_of_its_rows() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path());
    let ids = |s: &sessiondb::Session<SqliteStore>| -> Vec<String> {
        let history = block_on(s.full_history(HistoryOptions::default())).unwrap();
        history.iter().map(|m| m.id.to_string()).collect()
    };
    let (a, b) = (db.session("a").unwrap(), db.session("b").unwrap());
    add_text(&a, "a1");
    add_text(&b, "b1");
    add_text(&b, "b2");
    let number = |id: &str| -> i64 {
        raw(dir.path())
            .query_row("SELECT number FROM sessions WHERE id = ?1", [id], |r| {
                r.get(0)
            })
            .unwrap()
    };
    drop((a, b, db));
    assert_eq!((number("a"), number("b")), (1, 2));

    let db = open(dir.path());
    assert!(block_on(db.session("b").unwrap().delete_session()).unwrap());
    let c = db.session("c").unwrap();
    assert!(ids(&c).is_empty());
    add_text(&c, "c1");
    assert_eq!(ids(&c), ["c1"]);
    assert_eq!(ids(&db.session("a").unwrap()), ["a1"]);
    assert!(ids(&db.session("b").unwrap()).is_empty());
    drop((c, db));
    assert_eq!(number("c"), 2);
    assert_eq!(count(&raw(dir.path()), "SELECT count(*) FROM messages"), 2);
}

/// Schema 11 keeps no copies of texts in the search index; a file of schema 10 (whose index kept
/// them in `message_search`) drops its index, and the next search builds it in the new shape and
/// answers with each hit's text.
#[test]
fn a_schema_10_search_index_is_built_again_without_copies_of_texts() {
    let dir = tempfile::tempdir().unwrap();
    {
        let db = open(dir.path());
        let s = db.session("s").unwrap();
        block_on(async {
            for (id, text) in [("a", "alpha one"), ("b", "bravo two")] {
                let m = Message::text("user", text).with_id(id);
                s.append(m, AppendOptions::default()).await.unwrap();
            }
        });
    }
    rewrite_at_schema(dir.path(), 10);
    let conn = raw(dir.path());
    conn.execute_batch(
        "CREATE TABLE message_search (
             rowid INTEGER PRIMARY KEY, namespace TEXT NOT NULL, session_id TEXT NOT NULL,
             message_id TEXT NOT NULL, role TEXT NOT NULL, text TEXT NOT NULL,
             UNIQUE (message_id, namespace, session_id));
         CREATE VIRTUAL TABLE message_fts USING fts5(
             text, content='message_search', content_rowid='rowid', tokenize='porter unicode61');
         INSERT INTO message_search (namespace, session_id, message_id, role, text)
             VALUES ('', 's', 'a', 'user', 'alpha one');
         INSERT INTO message_fts (message_fts) VALUES ('rebuild');
         CREATE TRIGGER message_search_ad AFTER DELETE ON message_search BEGIN
             INSERT INTO message_fts (message_fts, rowid, text)
             VALUES ('delete', old.rowid, old.text);
         END;
         INSERT OR REPLACE INTO store_meta (key, value) VALUES ('search_index', '1');
         INSERT OR REPLACE INTO store_meta (key, value) VALUES ('search_indexed', '1');",
    )
    .unwrap();
    drop(conn);

    let db = open(dir.path());
    assert!(!db.store().has_search_index());
    let conn = raw(dir.path());
    assert_eq!(count(&conn, "PRAGMA user_version"), SCHEMA_VERSION);
    assert!(!table_exists(&conn, "message_search"));
    drop(conn);
    let s = db.session("s").unwrap();
    let hits = block_on(s.search("bravo", 5)).unwrap();
    assert_eq!(ids_of(&hits), ["b"]);
    assert_eq!(hits[0].content, "bravo two");
    assert_eq!(ids_of(&block_on(s.search("alpha", 5)).unwrap()), ["a"]);
    drop((s, db));
    let conn = raw(dir.path());
    assert!(pending_texts(&conn).is_empty());
}

/// The search table is keyed by message id first; clearing a session and deleting one still
/// remove exactly that session's entries.
#[test]
fn clear_and_session_delete_remove_their_search_entries() {
    let dir = tempfile::tempdir().unwrap();
    {
        let db = open(dir.path());
        let sessions: Vec<_> = ["kept", "cleared", "deleted"]
            .iter()
            .map(|name| db.session(name).unwrap())
            .collect();
        block_on(async {
            for s in &sessions {
                for i in 0..3 {
                    let m = Message::text("user", format!("word{i}")).with_id(format!("m{i}"));
                    s.append(m, AppendOptions::default()).await.unwrap();
                }
            }
            assert_eq!(sessions[0].search("word1", 5).await.unwrap().len(), 1);
            sessions[1].clear().await.unwrap();
            assert!(sessions[2].delete_session().await.unwrap());
        });
    }
    let conn = raw(dir.path());
    let entries = |session: &str| {
        count(
            &conn,
            &format!("SELECT count(*) FROM message_search WHERE session_id = '{session}'"),
        )
    };
    assert_eq!(
        [entries("kept"), entries("cleared"), entries("deleted")],
        [3, 0, 0]
    );
}

/// After the first search, writes leave the full-text index alone: the next search indexes what
/// they added. Deleting rows the index holds and rows it does not yet hold keeps it intact.
#[test]
fn searches_index_what_was_written_since_the_last_one() {
    let dir = tempfile::tempdir().unwrap();
    let say = |id: &str, text: &str| Message::text("user", text).with_id(id);
    {
        let db = open(dir.path());
        let s = db.session("s").unwrap();
        block_on(async {
            s.append(say("a", "alpha"), AppendOptions::default())
                .await
                .unwrap();
            assert_eq!(s.search("alpha", 5).await.unwrap().len(), 1);
            for (id, text) in [("b", "bravo"), ("c", "charlie"), ("d", "delta")] {
                s.append(say(id, text), AppendOptions::default())
                    .await
                    .unwrap();
            }
        });
    }
    let conn = raw(dir.path());
    assert_eq!(fts_matches(&conn, "alpha"), 1);
    assert_eq!(fts_matches(&conn, "bravo"), 0, "appends do not index");
    assert_eq!(pending_texts(&conn), ["bravo", "charlie", "delta"]);
    drop(conn);
    {
        let db = open(dir.path());
        let s = db.session("s").unwrap();
        block_on(async {
            // The next search, even after a reopen, finds what was appended since the last one.
            assert_eq!(ids_of(&s.search("bravo", 5).await.unwrap()), ["b"]);
            s.append(say("e", "echo"), AppendOptions::default())
                .await
                .unwrap();
            // An indexed row and a row not indexed yet are deleted; an update re-adds its text.
            s.delete(&["a".into(), "e".into()]).await.unwrap();
            s.update(say("c", "changed"), Source::Server).await.unwrap();
            assert!(s.search("alpha", 5).await.unwrap().is_empty());
            assert!(s.search("echo", 5).await.unwrap().is_empty());
            assert!(s.search("charlie", 5).await.unwrap().is_empty());
            assert_eq!(ids_of(&s.search("changed", 5).await.unwrap()), ["c"]);
            // A row written after the newest indexed row was deleted is still indexed.
            s.delete(&["c".into()]).await.unwrap();
            s.append(say("f", "foxtrot"), AppendOptions::default())
                .await
                .unwrap();
            assert_eq!(ids_of(&s.search("foxtrot", 5).await.unwrap()), ["f"]);
        });
    }
    let conn = raw(dir.path());
    conn.execute_batch("INSERT INTO message_fts (message_fts) VALUES ('integrity-check')")
        .unwrap();
    // The index holds every row there is, and no row keeps a copy of its text.
    assert!(pending_texts(&conn).is_empty());
    assert_eq!(fts_matches(&conn, "bravo OR delta OR foxtrot"), 3);
    assert_eq!(fts_matches(&conn, "alpha OR echo OR charlie OR changed"), 0);
}

/// Writes never leave more than `SEARCH_BACKLOG_ROWS` rows for a search to index: past that the
/// writer indexes them itself, without a search.
#[test]
fn the_writer_indexes_a_long_backlog_without_a_search() {
    let dir = tempfile::tempdir().unwrap();
    let bound = SEARCH_BACKLOG_ROWS;
    let append = |range: std::ops::Range<usize>, search_first: bool| {
        let db = open(dir.path());
        let s = db.session("s").unwrap();
        block_on(async {
            if search_first {
                s.search("anything", 5).await.unwrap();
            }
            let messages = range
                .map(|i| Message::text("user", format!("word{i}")))
                .collect();
            s.append_all(messages, AppendOptions::default())
                .await
                .unwrap();
        });
    };
    let indexed = |word: &str| fts_matches(&raw(dir.path()), word);
    append(0..bound, true);
    assert_eq!(
        indexed("word0"),
        0,
        "a backlog of the bound waits for a search"
    );
    assert_eq!(pending_texts(&raw(dir.path())).len(), bound);
    append(bound..bound + 1, false);
    assert_eq!(indexed("word0"), 1);
    assert_eq!(indexed(&format!("word{bound}")), 1);
    // What the index holds keeps no copy of its text.
    assert!(pending_texts(&raw(dir.path())).is_empty());
}

/// Searches racing appends on other threads: every append acknowledged before a search began is
/// found by it (the search indexes what was written since the last one first).
#[test]
fn a_search_finds_every_append_acknowledged_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path());
    let s = db.session("s").unwrap();
    block_on(s.search("warm", 5)).unwrap();
    let acknowledged = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let (s, acknowledged) = (db.session("s").unwrap(), acknowledged.clone());
            std::thread::spawn(move || {
                for i in 0..150 {
                    let n = w * 1_000 + i;
                    let m = Message::text("user", format!("token{n}")).with_id(format!("m{n}"));
                    block_on(s.append(m, AppendOptions::default())).unwrap();
                    acknowledged.fetch_max(n + 1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    let mut checked = 0;
    while writers.iter().any(|w| !w.is_finished()) {
        // Any id below the mark of one writer was acknowledged before this search began.
        let n = acknowledged.load(Ordering::SeqCst);
        if n == 0 {
            continue;
        }
        let latest = n - 1;
        let hits = block_on(s.search(&format!("token{latest}"), 5)).unwrap();
        assert_eq!(ids_of(&hits), [format!("m{latest}").as_str()]);
        checked += 1;
    }
    for w in writers {
        w.join().unwrap();
    }
    assert!(checked > 10, "only {checked} searches raced the appends");
}

/// Snippets mark the words FTS5's `porter unicode61` tokenizer (the message index's, schema.rs)
/// matches: for every word of a vocabulary built to reach each of the stemmer's rules, the words
/// a query of it finds in the index are the ones its snippet of the whole vocabulary marks.
#[test]
fn snippets_mark_the_words_the_index_matches() {
    let stems = [
        "connect",
        "relate",
        "hope",
        "generous",
        "sensitive",
        "happy",
        "run",
        "stop",
        "fall",
        "agree",
        "condition",
        "nation",
        "form",
        "electric",
        "digit",
        "motor",
        "trouble",
        "size",
        "hop",
        "file",
        "fail",
        "sky",
        "vile",
        "analog",
        "feud",
        "decide",
        "callous",
        "probe",
        "cease",
        "control",
        "roll",
        "oscillate",
        "adopt",
        "depend",
        "irritate",
        "gyroscope",
        "allow",
        "infer",
        "revive",
        "triplicate",
        "communis",
        "angular",
        "bowdler",
        "plaster",
        "fizz",
        "tan",
        "sing",
        "conflate",
        "feed",
        "bled",
        "caress",
        "pony",
        "tie",
        "cat",
    ];
    let suffixes = [
        "", "s", "es", "ed", "ing", "ly", "li", "ness", "ful", "fulness", "ation", "ational",
        "tional", "ize", "izer", "ization", "ism", "alism", "ist", "ity", "iviti", "biliti", "ive",
        "iveness", "ative", "able", "ible", "ment", "ement", "ent", "entli", "ence", "enci",
        "ance", "anci", "ous", "ousli", "ousness", "al", "alli", "aliti", "alize", "ic", "ical",
        "icate", "iciti", "er", "ers", "y", "ies", "eed", "at", "bl", "iz", "ll", "e", "ion", "ou",
        "ate", "iti", "logi", "bli", "eli", "ator",
    ];
    let mut vocabulary: Vec<String> = stems
        .iter()
        .flat_map(|stem| suffixes.iter().map(move |suffix| format!("{stem}{suffix}")))
        .chain(
            [
                "Café",
                "cafes",
                "RÉSUMÉS",
                "naïvely",
                "Über",
                "ab",
                "a",
                "xyz",
            ]
            .map(String::from),
        )
        .collect();
    vocabulary.sort();
    vocabulary.dedup();

    let conn = Connection::open_in_memory().unwrap();
    conn.execute_batch("CREATE VIRTUAL TABLE words USING fts5(word, tokenize='porter unicode61')")
        .unwrap();
    for (rowid, word) in vocabulary.iter().enumerate() {
        conn.execute(
            "INSERT INTO words(rowid, word) VALUES (?1, ?2)",
            (rowid as i64, word),
        )
        .unwrap();
    }
    let mut query = conn
        .prepare("SELECT rowid FROM words WHERE words MATCH ?1 ORDER BY rowid")
        .unwrap();
    // A stem keeps its word's first letter, so each word is marked among those sharing it (which
    // keeps the test quick); FTS5 finding a word outside them would fail it all the same.
    let initial = |word: &str| word.chars().next().unwrap().to_lowercase().next().unwrap();
    for word in &vocabulary {
        let text = vocabulary.iter().filter(|w| initial(w) == initial(word));
        let text = text.map(String::as_str).collect::<Vec<_>>().join(" ");
        let indexed: Vec<&str> = query
            .query_map([format!("\"{word}\"")], |r| r.get::<_, i64>(0))
            .unwrap()
            .map(|rowid| vocabulary[rowid.unwrap() as usize].as_str())
            .collect();
        let pieces = sessiondb::Highlighter::new(word).snippet(&text, usize::MAX);
        let marked: Vec<&str> = pieces
            .iter()
            .skip(1)
            .step_by(2)
            .map(String::as_str)
            .collect();
        assert_eq!(marked, indexed, "the words `{word}` finds");
    }
}

fn ids_of(hits: &[sessiondb::SearchHit]) -> Vec<&str> {
    hits.iter().map(|h| h.id.as_str()).collect()
}

#[test]
fn chunk_rows_follow_the_message_size() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path());
    let s = db.session("s").unwrap();
    let chunks = |conn: &Connection| count(conn, "SELECT count(*) FROM message_chunks");
    block_on(async {
        let text = |n: usize| Message::text("user", "a".repeat(n)).with_id("m");
        // A text too long for its row's page goes whole to continuation slices: of 950 bytes
        // up to 16 KiB (the text is ASCII: no character to keep whole moves a cut), else of
        // 1.5 MB.
        let json_bytes = || async { s.message("m").await.unwrap().unwrap().json().len() };
        s.append(text(5_000_000), AppendOptions::default())
            .await
            .unwrap();
        assert_eq!(chunks(&raw(dir.path())), 4);
        s.update(text(2_000_000), Source::Server).await.unwrap();
        assert_eq!(chunks(&raw(dir.path())), 2);
        s.update(text(10_000), Source::Server).await.unwrap();
        assert_eq!(
            chunks(&raw(dir.path())),
            json_bytes().await.div_ceil(950) as i64
        );
        s.update(text(2_000), Source::Server).await.unwrap();
        assert_eq!(chunks(&raw(dir.path())), 3);
        let on_row = |conn: &Connection| count(conn, "SELECT length(content) FROM messages");
        assert_eq!(on_row(&raw(dir.path())), 0);
        s.update(text(4), Source::Server).await.unwrap();
        assert_eq!(chunks(&raw(dir.path())), 0);
        assert!(on_row(&raw(dir.path())) > 4);
        for n in [2_000_000, 20_000, 5_000, 2_000, 600, 4] {
            s.update(text(n), Source::Server).await.unwrap();
            let read = s.message("m").await.unwrap().unwrap().to_value();
            assert_eq!(read["parts"][0]["text"], "a".repeat(n));
        }
        let conn = raw(dir.path());
        let max_slice: i64 = count(
            &conn,
            "SELECT max(length(CAST(content AS BLOB))) FROM messages",
        );
        assert!(max_slice <= 1_572_864);
        s.append(
            Message::text("user", "é".repeat(1_000_000)).with_id("multi"),
            AppendOptions::default(),
        )
        .await
        .unwrap();
        let conn = raw(dir.path());
        let slice_bytes = count(
            &conn,
            "SELECT max(length(CAST(content AS BLOB))) FROM message_chunks",
        );
        assert!(slice_bytes <= 1_572_864);
        s.delete(&["multi".into()]).await.unwrap();
        assert_eq!(chunks(&raw(dir.path())), 0);
    });
}

/// Rows of a few KB keep their text in `message_chunks` (a rowid table, many rows to a page)
/// instead of spilling over their `messages` page into an overflow page each.
#[test]
fn messages_of_a_few_kilobytes_take_about_their_size_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path());
    let s = db.session("s").unwrap();
    let mut json_bytes = 0;
    block_on(async {
        for i in 0..1_000 {
            let text = format!("{i} {}", "word ".repeat(150 + i % 500));
            let appended = s
                .append(Message::text("assistant", text), AppendOptions::default())
                .await
                .unwrap();
            json_bytes += appended.message.json().len() as u64;
        }
    });
    drop(s);
    drop(db);
    let on_disk: u64 = ["", "-wal"]
        .iter()
        .filter_map(|suffix| {
            std::fs::metadata(dir.path().join(format!("{DATABASE_FILE}{suffix}"))).ok()
        })
        .map(|m| m.len())
        .sum();
    // With an overflow page per row (schema 11) these took 2.3 times their JSON, now 1.6.
    assert!(
        on_disk < json_bytes * 19 / 10,
        "{on_disk} bytes on disk for {json_bytes} bytes of messages"
    );
}

#[test]
fn invalid_input_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path());
    let s = db.session("s").unwrap();
    for bad in [
        r#"{"role": "user"}"#,
        r#"{"role": 1, "content": "x"}"#,
        r#"[1]"#,
        "{",
        r#"{"role":"u","parts":[{"text":"no type"}]}"#,
    ] {
        let err = Message::parse(bad).unwrap_err();
        assert!(!err.field.is_empty(), "{bad}: {err}");
    }
    block_on(async {
        s.import(
            Message::text("user", "a").with_id("a"),
            ImportOptions {
                parent_id: Some("b".into()),
                created_at: 1,
            },
        )
        .await
        .unwrap();
        let refused = s
            .import(
                Message::text("user", "b").with_id("b"),
                ImportOptions {
                    parent_id: Some("a".into()),
                    created_at: 1,
                },
            )
            .await;
        assert!(matches!(
            refused,
            Err(Error::Store(StoreError::ParentCycle { .. }))
        ));
        assert!(matches!(
            s.update(Message::text("user", "x"), Source::Server).await,
            Err(Error::Invalid(_))
        ));
    });
    let conn = raw(dir.path());
    assert_eq!(count(&conn, "SELECT count(*) FROM messages"), 1);
    assert_eq!(count(&conn, "SELECT count(*) FROM message_chunks"), 0);
}

/// Runs `work(t, session "s{t}")` on 32 threads at once and waits for all of them.
fn on_32_threads(
    db: &Db<SqliteStore>,
    work: impl Fn(usize, sessiondb::Session<SqliteStore>) + Send + Clone + 'static,
) {
    let threads: Vec<_> = (0..32)
        .map(|t| {
            let s = db.session(&format!("s{t}")).unwrap();
            let work = work.clone();
            std::thread::spawn(move || work(t, s))
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn concurrent_appends_share_commits() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path());
    on_32_threads(&db, |t, s| {
        for i in 0..20 {
            block_on(s.append(
                Message::text("user", format!("{t}-{i}")),
                AppendOptions::default(),
            ))
            .unwrap();
        }
    });
    let stats = db.store().write_stats();
    let (commits, requests) = (
        stats.commits.load(Ordering::Relaxed),
        stats.requests.load(Ordering::Relaxed),
    );
    assert_eq!(requests, 640);
    assert!(
        commits < requests,
        "group commit: {commits} commits for {requests} appends"
    );
}

/// A sweep of idle sessions hands each listing page's deletes to the writer together: one commit
/// per page of 100, not one per session; and a kept session stays among them.
#[test]
fn deleting_idle_sessions_commits_a_page_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path());
    for i in 0..250 {
        let session = db.session(&format!("s{i:03}")).unwrap();
        block_on(session.append(Message::text("user", "hi"), AppendOptions::default())).unwrap();
    }
    std::thread::sleep(Duration::from_millis(3));
    let cutoff = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    std::thread::sleep(Duration::from_millis(3));
    let kept = db.session("s100").unwrap();
    block_on(kept.append(
        Message::text("user", "still here"),
        AppendOptions::default(),
    ))
    .unwrap();
    let stats = db.store().write_stats();
    let commits_before = stats.commits.load(Ordering::Relaxed);
    assert_eq!(
        block_on(db.delete_sessions_updated_before("", cutoff)).unwrap(),
        249
    );
    assert_eq!(stats.commits.load(Ordering::Relaxed) - commits_before, 3);
    let listed = block_on(db.list_sessions("", &Default::default())).unwrap();
    let ids: Vec<&str> = listed.items.iter().map(|i| i.id.as_str()).collect();
    assert_eq!(ids, ["s100"]);
}

/// Under steady load a write call returns once its own write is durable; it does not go on
/// committing the writes queued behind it. With one request per commit, each writer one request
/// at a time and answers in commit order, a call sees the commits of the requests outstanding
/// when it began, its own, one more per other writer before its sync, and whatever commits
/// while its thread wakes up: 15–17 in all here. Calls that led while work was waiting saw
/// 530–2,022 of the 2,400; the bound leaves room for a thread that waits long to be scheduled.
#[test]
fn a_write_call_does_not_wait_for_the_writes_queued_behind_it() {
    const WRITERS: u64 = 8;
    let dir = tempfile::tempdir().unwrap();
    let config = SqliteConfig {
        max_batch: 1,
        ..SqliteConfig::default()
    };
    let db = Db::new(SqliteStore::open_with(dir.path(), config).unwrap());
    let stats = db.store().write_stats();
    let writers: Vec<_> = (0..WRITERS)
        .map(|t| {
            let s = db.session(&format!("s{t}")).unwrap();
            let stats = stats.clone();
            std::thread::spawn(move || {
                let message = |i| Message::text("user", format!("{t}-{i}"));
                (0..300)
                    .map(|i| {
                        let before = stats.commits.load(Ordering::SeqCst);
                        block_on(s.append(message(i), AppendOptions::default())).unwrap();
                        stats.commits.load(Ordering::SeqCst) - before
                    })
                    .max()
                    .unwrap()
            })
        })
        .collect();
    let most = writers.into_iter().map(|w| w.join().unwrap()).max();
    assert!(most < Some(250), "a call lasted {most:?} commits");
    assert_eq!(stats.requests.load(Ordering::SeqCst), WRITERS * 300);
}

/// Requests that fail after writing part of themselves (a batch over the message quota), mixed
/// into groups of good ones: each fails alone and leaves nothing, the others all land.
#[test]
fn requests_failing_midway_in_a_group_leave_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path()).reconfigured(sessiondb::Options {
        max_messages_per_session: Some(3),
        ..Default::default()
    });
    on_32_threads(&db, |t, s| {
        for round in 0..10 {
            let batch: Vec<_> = (0..2)
                .map(|i| Message::text("user", format!("{t}-{round}-{i}")))
                .collect();
            let result = block_on(s.append_all(batch, AppendOptions::default()));
            // Round 0 fills 2 of 3 slots; round 1's batch overflows after writing its
            // first message, later ones at once.
            match round {
                0 => assert!(result.is_ok(), "{result:?}"),
                _ => assert!(
                    matches!(result, Err(Error::QuotaExceeded { limit: 3 })),
                    "{result:?}"
                ),
            }
            if round == 1 {
                block_on(s.append(
                    Message::text("user", format!("{t}-single")),
                    AppendOptions::default(),
                ))
                .unwrap();
            }
        }
    });
    let stats = db.store().write_stats();
    assert!(
        stats.commits.load(Ordering::Relaxed) < stats.requests.load(Ordering::Relaxed),
        "the requests were grouped"
    );
    drop(db);
    let conn = raw(dir.path());
    assert_eq!(count(&conn, "SELECT count(*) FROM messages"), 32 * 3);
    for t in 0..32 {
        let texts: Vec<String> = conn
            .prepare(
                "SELECT content FROM messages m JOIN sessions s ON s.number = m.k >> 32
                  WHERE s.id = ?1 ORDER BY m.k",
            )
            .unwrap()
            .query_map([format!("s{t}")], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert_eq!(texts.len(), 3);
        assert!(texts[0].contains(&format!("\"{t}-0-0\"")));
        assert!(texts[1].contains(&format!("\"{t}-0-1\"")));
        assert!(texts[2].contains(&format!("\"{t}-single\"")));
    }
}

// ---- crash safety ----------------------------------------------------------------------------

const CHILD_DIR: &str = "SESSIONDB_CRASH_DIR";
const CHILD_PREFIX: &str = "SESSIONDB_CRASH_PREFIX";

/// The body of message `id`: of every 5 messages one is several MiB (kept in slices of 1.5 MB)
/// and one a few KB (too long for its row's page: kept in slices of 950 bytes).
fn crash_body(id: &str, index: usize) -> String {
    let unit = id
        .bytes()
        .fold(0u32, |a, b| a.wrapping_mul(31).wrapping_add(b as u32));
    let ch = char::from(b'a' + (unit % 26) as u8);
    let len = match index % 5 {
        4 => 3 * 1024 * 1024 + index,
        2 => 1_000 + (index * 37) % 12_000,
        _ => 200 + index % 50,
    };
    format!("{id}:{}", ch.to_string().repeat(len))
}

/// Runs in the child process: appends from four threads until killed, printing each
/// acknowledgement only after the append returned.
fn crash_child(dir: &str, prefix: &str) {
    let db = open(std::path::Path::new(dir));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let s = db.session("crash").unwrap();
            let prefix = prefix.to_owned();
            std::thread::spawn(move || {
                for i in 0.. {
                    let id = format!("{prefix}-{t}-{i}");
                    let message = Message::text("user", crash_body(&id, i)).with_id(&id);
                    block_on(s.append(message, AppendOptions::default())).unwrap();
                    println!("ACK {id} {i}");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn acknowledged_writes_survive_sigkill() {
    if let (Ok(dir), Ok(prefix)) = (std::env::var(CHILD_DIR), std::env::var(CHILD_PREFIX)) {
        crash_child(&dir, &prefix);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut acked: Vec<(String, usize)> = Vec::new();
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64;
    for round in 0..6u64 {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "acknowledged_writes_survive_sigkill",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_DIR, dir.path())
            .env(CHILD_PREFIX, format!("r{round}"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (acks_tx, acks_rx) = std::sync::mpsc::channel::<(String, usize)>();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let mut words = line.strip_prefix("ACK ").unwrap_or_default().split(' ');
                if let (Some(id), Some(Ok(i))) = (words.next(), words.next().map(str::parse)) {
                    let _ = acks_tx.send((id.to_owned(), i));
                }
            }
        });
        // Kill after a pseudo-random number of acknowledgements (so at a random moment); the
        // first round waits long enough that every writer thread has stored a chunked message.
        let mix = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(round * 1442695040888963407);
        let threshold = if round == 0 {
            25
        } else {
            1 + (mix >> 33) as usize % 60
        };
        let mut round_acks = Vec::new();
        while round_acks.len() < threshold {
            match acks_rx.recv_timeout(Duration::from_secs(30)) {
                Ok(ack) => round_acks.push(ack),
                Err(e) => panic!("round {round}: the child stopped acknowledging: {e}"),
            }
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        reader.join().unwrap(); // the pipe is at its end: every printed acknowledgement is in
        round_acks.extend(acks_rx.try_iter());
        acked.extend(round_acks);

        let db = open(dir.path());
        let s = db.session("crash").unwrap();
        let stored = block_on(s.full_history(HistoryOptions::default())).unwrap();
        let stats = block_on(s.stats()).unwrap();
        assert_eq!(
            stats.stored_messages as usize,
            stored.len(),
            "every stored message is on the one chain"
        );
        for m in &stored {
            let index: usize = m.id.rsplit('-').next().unwrap().parse().unwrap();
            let text = m.to_value()["parts"][0]["text"]
                .as_str()
                .unwrap()
                .to_owned();
            assert!(
                text == crash_body(&m.id, index),
                "message {} is not whole",
                m.id
            );
        }
        let present: std::collections::HashSet<&str> =
            stored.iter().map(|m| m.id.as_str()).collect();
        for (id, _) in &acked {
            assert!(present.contains(id.as_str()), "acknowledged {id} was lost");
        }
        assert_eq!(
            db.store().check().unwrap(),
            Vec::<String>::new(),
            "after the kill"
        );
    }
    assert!(
        acked.iter().any(|(_, i)| i % 5 == 4),
        "some acknowledged messages were chunked"
    );
}

/// A store opened with its schema current sets up its writer at the first write. Should that
/// fail (here: the database file is gone by then), the write gets a typed error naming the
/// set-up, nothing is created in the file's place, and reads go on.
#[test]
fn a_writer_that_cannot_be_set_up_refuses_the_write() {
    let dir = tempfile::tempdir().unwrap();
    let append = |s: &sessiondb::Session<SqliteStore>, id: &str| {
        block_on(s.append(
            Message::text("user", "text").with_id(id),
            AppendOptions::default(),
        ))
    };
    append(&open(dir.path()).session("s").unwrap(), "kept").unwrap();
    let db = open(dir.path());
    let s = db.session("s").unwrap();
    std::fs::remove_file(dir.path().join(DATABASE_FILE)).unwrap();
    for id in ["first", "second"] {
        match append(&s, id) {
            Err(Error::Store(StoreError::Backend(message))) => {
                assert!(message.starts_with("setting up the writer: "), "{message}");
            }
            other => panic!("{id}: {other:?}"),
        }
    }
    assert!(!dir.path().join(DATABASE_FILE).exists());
    let history = block_on(s.full_history(HistoryOptions::default())).unwrap();
    assert_eq!(history.len(), 1);
}

/// A failed sync of the write-ahead log (here: its file is gone when the store first syncs it)
/// halts writes: the writes it covered and every later one get `Halted`, later ones are not
/// applied, nothing is published, reads go on, and a reopened store takes writes again with every
/// acknowledged message in place.
#[test]
fn a_failed_wal_sync_halts_writes_until_the_store_is_reopened() {
    let dir = tempfile::tempdir().unwrap();
    let append = |s: &sessiondb::Session<SqliteStore>, id: &str| {
        block_on(s.append(
            Message::text("user", format!("text of {id}")).with_id(id),
            AppendOptions::default(),
        ))
    };
    {
        let db = open(dir.path());
        append(&db.session("s").unwrap(), "kept").unwrap();
    }
    {
        let db = open(dir.path());
        let s = db.session("s").unwrap();
        let mut feed = db.subscribe(sessiondb::FeedFilter::All);
        // The writer is set up by its first job: a search's index build, which needs no sync,
        // so the WAL it writes to is removed before anything syncs it.
        assert_eq!(block_on(s.search("kept", 5)).unwrap().len(), 1);
        std::fs::remove_file(dir.path().join(format!("{DATABASE_FILE}-wal"))).unwrap();
        for id in ["unsynced", "refused"] {
            let halted = append(&s, id);
            assert!(
                matches!(halted, Err(Error::Store(StoreError::Halted(_)))),
                "{id}: {halted:?}"
            );
        }
        assert!(block_on(s.message("refused")).unwrap().is_none());
        assert!(feed.try_next().is_none());
        let history = block_on(s.full_history(HistoryOptions::default())).unwrap();
        assert_eq!(history[0].id.as_str(), "kept");
    }
    let db = open(dir.path());
    let s = db.session("s").unwrap();
    append(&s, "after").unwrap();
    let ids: Vec<String> = block_on(s.full_history(HistoryOptions::default()))
        .unwrap()
        .iter()
        .map(|m| m.id.to_string())
        .collect();
    assert_eq!(ids.first().map(String::as_str), Some("kept"));
    assert_eq!(ids.last().map(String::as_str), Some("after"));
    assert!(!ids.contains(&"refused".to_owned()));
}

#[test]
fn linear_paths_are_read_by_range_and_branches_by_rows() {
    use sessiondb::Store;
    use sessiondb_core::{Parent, PathPlan};
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path());
    let s = db.session("s").unwrap();
    let plan = || block_on(db.store().path_plan(s.key(), None)).unwrap();
    let append = |id: &str, parent: Parent| {
        let options = AppendOptions {
            parent,
            ..Default::default()
        };
        block_on(s.append(Message::text("user", id).with_id(id), options)).unwrap();
    };
    append("a", Parent::ActiveLeaf);
    append("b", Parent::ActiveLeaf);
    append("c", Parent::ActiveLeaf);
    assert_eq!(plan(), PathPlan::Range { first: 1, last: 3 });
    append("x", Parent::Id("a".into()));
    assert!(
        matches!(plan(), PathPlan::Rows(rows) if rows.iter().map(|r| r.seq).collect::<Vec<_>>() == [1, 4])
    );
    append("r", Parent::Root);
    assert_eq!(plan(), PathPlan::Range { first: 5, last: 5 });
    append("r2", Parent::ActiveLeaf);
    assert_eq!(plan(), PathPlan::Range { first: 5, last: 6 });
    block_on(s.delete(&["r2".into(), "r".into()])).unwrap();
    // The newest survivor is x, whose path (a, x) skips b and c.
    assert!(matches!(plan(), PathPlan::Rows(_)));
    block_on(s.delete(&["b".into(), "c".into()])).unwrap();
    assert_eq!(plan(), PathPlan::Range { first: 1, last: 4 });
    let ids: Vec<String> = block_on(s.full_history(HistoryOptions::default()))
        .unwrap()
        .into_iter()
        .map(|m| m.id.to_string())
        .collect();
    assert_eq!(ids, ["a", "x"]);
}

/// A linear append never enters `messages_by_parent`: only branches, roots and rows whose parent
/// is missing (or was spliced away) do, and children are found through both.
#[test]
fn only_detached_children_enter_the_parent_index() {
    use sessiondb_core::Parent;
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path());
    let s = db.session("s").unwrap();
    let append = |id: &str, parent: Parent| {
        let options = AppendOptions {
            parent,
            ..Default::default()
        };
        block_on(s.append(Message::text("user", id).with_id(id), options)).unwrap();
    };
    let indexed = || -> Vec<String> {
        raw(dir.path())
            .prepare(
                "SELECT id FROM messages INDEXED BY messages_by_parent
                  WHERE parent_seq IS NULL OR parent_seq <> seq - 1 ORDER BY seq",
            )
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    let children = |id: &str| -> Vec<String> {
        let rows = block_on(s.branches(id)).unwrap();
        rows.into_iter().map(|m| m.id.to_string()).collect()
    };
    for id in ["a", "b", "c"] {
        append(id, Parent::ActiveLeaf);
    }
    append("x", Parent::Id("a".into()));
    block_on(s.import(
        Message::text("user", "o").with_id("o"),
        ImportOptions {
            parent_id: Some("later".into()),
            created_at: 5,
        },
    ))
    .unwrap();
    assert_eq!(indexed(), ["a", "x", "o"]);
    assert_eq!(children("a"), ["b", "x"]);
    assert_eq!(children("b"), ["c"]);
    assert!(children("c").is_empty());
    append("later", Parent::Root);
    assert_eq!(children("later"), ["o"], "the orphan was adopted");
    assert_eq!(indexed(), ["a", "x", "o", "later"]);
    // c is spliced onto a: no longer right after its parent.
    block_on(s.delete(&["b".into()])).unwrap();
    assert_eq!(indexed(), ["a", "c", "x", "o", "later"]);
    assert_eq!(children("a"), ["c", "x"]);
}

#[test]
fn chunked_messages_are_never_read_torn_during_updates() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path());
    let s = db.session("s").unwrap();
    let bodies = ["a".repeat(1_700_000), "b".repeat(1_700_000)];
    block_on(s.append(
        Message::text("user", bodies[0].clone()).with_id("m"),
        AppendOptions::default(),
    ))
    .unwrap();
    let writer = {
        let s = s.clone();
        let bodies = bodies.clone();
        std::thread::spawn(move || {
            for i in 0..12 {
                let body = bodies[(i + 1) % 2].clone();
                block_on(s.update(Message::text("user", body).with_id("m"), Source::Server))
                    .unwrap();
            }
        })
    };
    let mut reads = 0;
    while !writer.is_finished() || reads < 10 {
        let m = block_on(s.message("m")).unwrap().unwrap();
        let text = m.to_value()["parts"][0]["text"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(
            text == bodies[0] || text == bodies[1],
            "a read mixed two versions"
        );
        reads += 1;
    }
    writer.join().unwrap();
}

/// Reference checks 56, 59 and 60 at the row level: one message row without continuations,
/// one payload in 1,572,864-byte chunks, one reference per message, and billing by rows.
#[test]
fn attachments_are_stored_once_in_chunks_with_a_reference_per_message() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path());
    let s = db.session("s").unwrap();
    let payload = sessiondb_testkit::cases::attachments::bytes(1_572_864 + 500_000, 42);
    let url = format!(
        "data:image/png;base64,{}",
        base64::Engine::encode(&base64::engine::general_purpose::STANDARD, &payload)
    );
    for id in ["a", "b"] {
        let message = Message::from_value(serde_json::json!({"id": id, "role": "user", "parts": [
            {"type": "file", "mediaType": "image/png", "url": url}]}))
        .unwrap();
        block_on(s.append(message, AppendOptions::default())).unwrap();
    }
    let conn = raw(dir.path());
    assert_eq!(count(&conn, "SELECT count(*) FROM attachments"), 1);
    assert_eq!(count(&conn, "SELECT count(*) FROM attachment_chunks"), 2);
    assert_eq!(count(&conn, "SELECT count(*) FROM attachment_refs"), 2);
    assert!(count(&conn, "SELECT max(length(content)) FROM messages") < 1_000);
    assert_eq!(count(&conn, "SELECT max(content_chunks) FROM messages"), 0);
    assert_eq!(count(&conn, "SELECT count(*) FROM message_chunks"), 0);
    assert_eq!(
        count(&conn, "SELECT bytes FROM attachments"),
        payload.len() as i64
    );
}

#[test]
fn loaded_skills_and_the_frozen_prompt_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let spec = sessiondb::BlockSpec {
        kind: sessiondb::BlockKind::Skill,
        description: None,
        max_tokens: None,
        content: String::new(),
    };
    let load = serde_json::json!({"label": "skills", "key": "review"});
    let prompt = block_on(async {
        let db = open(dir.path());
        let session = db.session("s").unwrap();
        let context = session.context();
        context.define("skills", spec).await.unwrap();
        context
            .put_entry("skills", "review", "Read twice.", None)
            .await
            .unwrap();
        assert_eq!(context.execute("load_context", &load).await, "Read twice.");
        // The model's turn with the loading result, as the agent appends it.
        let part = serde_json::json!({"type": "tool-load_context", "toolCallId": "c1",
            "state": "output-available", "input": load, "output": "Read twice."});
        let turn = serde_json::json!({"id": "a1", "role": "assistant", "parts": [part]});
        let turn = Message::from_value(turn).unwrap();
        session
            .append(turn, AppendOptions::default())
            .await
            .unwrap();
        context.prompt().await.unwrap()
    });
    block_on(async {
        let db = open(dir.path());
        let context = db.session("s").unwrap().context();
        let loaded: Vec<String> = context.loaded_skills().await.unwrap().into_iter().collect();
        assert_eq!(loaded, ["skills:review"]);
        assert_eq!(context.prompt().await.unwrap(), prompt);
        let unload = context.execute("unload_context", &load).await;
        assert_eq!(
            unload,
            "Unloaded \"review\" from skills. Context reclaimed."
        );
    });
}

/// The row cache never answers with a row older than an acknowledged write: readers keep filling
/// it from snapshots that may predate each update while the writer, after every acknowledgement,
/// reads the history back and must find its own version.
#[test]
fn history_reads_after_an_acknowledged_update_never_see_the_old_row() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path());
    let s = db.session("s").unwrap();
    let messages: Vec<Message> = (0..120)
        .map(|i| Message::text("user", format!("v0 of {i}")).with_id(format!("m{i}")))
        .collect();
    block_on(s.append_all(messages, AppendOptions::default())).unwrap();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..3)
        .map(|r| {
            let (s, done) = (s.clone(), done.clone());
            std::thread::spawn(move || {
                while !done.load(Ordering::Relaxed) {
                    let options = HistoryOptions {
                        leaf: None,
                        newest_first: r % 2 == 1,
                    };
                    assert_eq!(block_on(s.full_history(options)).unwrap().len(), 120);
                }
            })
        })
        .collect();
    let text_of = |m: &sessiondb::StoredMessage| m.to_value()["parts"][0]["text"].clone();
    for version in 1..=150 {
        let id = format!("m{}", (version * 37) % 120);
        let text = format!("v{version} of {id}");
        block_on(s.update(
            Message::text("user", text.clone()).with_id(&id),
            Source::Server,
        ))
        .unwrap();
        for newest_first in [false, true] {
            let options = HistoryOptions {
                leaf: None,
                newest_first,
            };
            let history = block_on(s.full_history(options)).unwrap();
            let read = history.iter().find(|m| m.id == id).unwrap();
            assert_eq!(
                text_of(read),
                text,
                "version {version}, newest first {newest_first}"
            );
        }
    }
    done.store(true, Ordering::Relaxed);
    for reader in readers {
        reader.join().unwrap();
    }
}

/// A backup taken while another thread appends is a store of its own holding a consistent
/// snapshot: every session's path complete up to some append, its search index, its state; a
/// destination that already holds a database is refused and left as it was.
#[test]
fn a_backup_taken_during_writes_opens_as_a_consistent_store() {
    let dir = tempfile::tempdir().unwrap();
    let backups = tempfile::tempdir().unwrap();
    let db = open(dir.path());
    block_on(async {
        let chat = db.session("chat").unwrap();
        for i in 0..200 {
            let m = Message::text("user", format!("turn {i} about lighthouses"))
                .with_id(format!("m{i}"));
            chat.append(m, AppendOptions::default()).await.unwrap();
        }
        assert_eq!(chat.search("lighthouses", 5).await.unwrap().len(), 5);
        chat.set_state("mood", &serde_json::json!("calm"))
            .await
            .unwrap();
    });
    let target = backups.path().join("copy");
    let appended = std::thread::scope(|scope| {
        let writer = scope.spawn(|| {
            block_on(async {
                let busy = db.session("busy").unwrap();
                let mut n = 0;
                while n < 400 {
                    let m = Message::text("user", format!("busy {n}")).with_id(format!("b{n}"));
                    busy.append(m, AppendOptions::default()).await.unwrap();
                    n += 1;
                }
                n
            })
        });
        let copy = db.store().backup(&target).unwrap();
        assert_eq!(copy, target.join(DATABASE_FILE));
        writer.join().unwrap()
    });
    assert_eq!(appended, 400);
    assert!(!target.join(format!("{DATABASE_FILE}.partial")).exists());

    let again = db.store().backup(&target).unwrap_err();
    assert!(
        matches!(again, StoreError::BackupDestinationExists { .. }),
        "{again}"
    );
    drop(db);

    let copy = open(&target);
    block_on(async {
        let chat = copy.session("chat").unwrap();
        let history = chat.full_history(HistoryOptions::default()).await.unwrap();
        let ids: Vec<&str> = history.iter().map(|m| m.id.as_str()).collect();
        assert_eq!(ids.len(), 200);
        assert_eq!((ids[0], ids[199]), ("m0", "m199"));
        assert_eq!(chat.search("turn 7 lighthouses", 5).await.unwrap().len(), 1);
        assert_eq!(
            chat.state("mood").await.unwrap(),
            Some(serde_json::json!("calm"))
        );
        // Whatever of the concurrent appends the snapshot holds, it holds as a whole path.
        let busy = copy.session("busy").unwrap();
        let rows = busy.full_history(HistoryOptions::default()).await.unwrap();
        for (i, m) in rows.iter().enumerate() {
            assert_eq!(m.id.as_str(), format!("b{i}"));
        }
        assert_eq!(busy.stats().await.unwrap().message_count, rows.len() as u64);
        // The copy takes writes of its own.
        busy.append(Message::text("user", "after"), AppendOptions::default())
            .await
            .unwrap();
    });
}

/// `vacuum` gives the room of deleted sessions back to the file system; everything left reads
/// the same (histories, message search, a context search block's entries, which the full-text
/// index names by rowid), appends queued while it runs go through, and the store reopens.
#[test]
fn vacuum_shrinks_the_file_after_deletes_and_keeps_what_is_left() {
    use sessiondb::{BlockKind, BlockSpec};
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path());
    let text = "lighthouse keepers log the weather ".repeat(50);
    block_on(async {
        for s in 0..40 {
            let session = db.session(&format!("s{s}")).unwrap();
            for i in 0..30 {
                let m = Message::text("user", format!("{s}/{i} {text}")).with_id(format!("m{i}"));
                session.append(m, AppendOptions::default()).await.unwrap();
            }
        }
        let kept = db.session("s0").unwrap();
        assert_eq!(kept.search("lighthouse", 50).await.unwrap().len(), 30);
        let context = kept.context();
        let search_block = BlockSpec {
            kind: BlockKind::Search,
            description: None,
            max_tokens: None,
            content: String::new(),
        };
        context.define("kb", search_block).await.unwrap();
        for (key, entry) in [("a", "the red door"), ("b", "the blue gate")] {
            context.put_entry("kb", key, entry, None).await.unwrap();
        }
        for s in 2..40 {
            assert!(
                db.session(&format!("s{s}"))
                    .unwrap()
                    .delete_session()
                    .await
                    .unwrap()
            );
        }
    });

    let (vacuumed, appended) = std::thread::scope(|scope| {
        let writer = scope.spawn(|| {
            block_on(async {
                let busy = db.session("busy").unwrap();
                for n in 0..200 {
                    let m = Message::text("user", format!("busy {n}")).with_id(format!("b{n}"));
                    busy.append(m, AppendOptions::default()).await.unwrap();
                }
                busy.stats().await.unwrap().message_count
            })
        });
        let vacuumed = db.store().vacuum().unwrap();
        (vacuumed, writer.join().unwrap())
    });
    assert_eq!(appended, 200);
    assert!(
        vacuumed.bytes_after * 4 < vacuumed.bytes_before,
        "{vacuumed:?}"
    );
    let on_disk = std::fs::metadata(dir.path().join(DATABASE_FILE))
        .unwrap()
        .len();
    assert!(
        on_disk <= vacuumed.bytes_after + 64 * 1024,
        "{on_disk} {vacuumed:?}"
    );

    let check = |db: &Db<SqliteStore>| {
        block_on(async {
            for s in ["s0", "s1"] {
                let session = db.session(s).unwrap();
                let history = session
                    .full_history(HistoryOptions::default())
                    .await
                    .unwrap();
                assert_eq!(history.len(), 30, "{s}");
                assert!(history[29].json().contains(&format!("{}/29 ", &s[1..])));
            }
            let kept = db.session("s0").unwrap();
            assert_eq!(kept.search("lighthouse", 50).await.unwrap().len(), 30);
            let found = kept.context().search("kb", "blue").await.unwrap().unwrap();
            assert!(
                found.contains("the blue gate") && !found.contains("red"),
                "{found}"
            );
            assert!(db.session("s7").unwrap().info().await.unwrap().is_none());
            let busy = db.session("busy").unwrap();
            assert_eq!(busy.stats().await.unwrap().message_count, 200);
        })
    };
    check(&db);
    drop(db);
    let reopened = open(dir.path());
    check(&reopened);
    block_on(async {
        let after = Message::text("user", "after the vacuum");
        let s1 = reopened.session("s1").unwrap();
        s1.append(after, AppendOptions::default()).await.unwrap();
        assert_eq!(s1.stats().await.unwrap().message_count, 31);
    });
}

/// `check` finds nothing wrong in a store that took every kind of write, and names each
/// invariant a hand edit then breaks.
#[test]
fn check_passes_a_sound_store_and_names_what_a_hand_edit_broke() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path());
    block_on(sessiondb_testkit::fill_for_check(&db));
    assert_eq!(db.store().check().unwrap(), Vec::<String>::new());
    drop(db);

    let conn = raw(dir.path());
    conn.execute_batch(
        "UPDATE sessions SET stored_messages = stored_messages + 1, next_seq = 2 WHERE id = 'a';
         UPDATE sessions SET leaf_id = 'gone' WHERE id = 'b';
         UPDATE messages SET parent_id = 'o' WHERE id = 'o';
         DELETE FROM attachment_chunks;
         INSERT INTO messages (k, id, role, content, content_chunks, bytes, token_estimate,
                               content_hash, created_at)
              VALUES ((1000 << 32) + 1, 'stray', 'user', '{}', 0, 2, 1, x'00', 1);",
    )
    .unwrap();
    drop(conn);
    let problems = open(dir.path()).store().check().unwrap();
    assert_eq!(problems, sessiondb_testkit::CHECK_PROBLEMS);
}
