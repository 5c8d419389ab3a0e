//! The schema on a real, throw-away PostgreSQL cluster started by the test itself.

use sessiondb_postgres::cluster::TempCluster;
use sessiondb_postgres::{PgStore, SCHEMA_VERSION, check_database};

fn cluster() -> TempCluster {
    TempCluster::start().unwrap_or_else(|e| panic!("cannot start PostgreSQL for the tests: {e}"))
}

/// A plain connection to `url`, for what the store never does (reading the catalog, breaking
/// its rows).
async fn raw(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrations_apply_once_even_when_instances_start_together() {
    let cluster = cluster();
    let url = cluster.url();
    // Two instances migrate the same empty database at once: the advisory lock makes one wait.
    let (a, b) = tokio::join!(PgStore::connect(&url, 2), PgStore::connect(&url, 2));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.schema_version().await.unwrap(), SCHEMA_VERSION);
    assert_eq!(b.schema_version().await.unwrap(), SCHEMA_VERSION);
    // Reconnecting finds the current version and applies nothing.
    let again = PgStore::connect(&url, 1).await.unwrap();
    assert_eq!(again.schema_version().await.unwrap(), SCHEMA_VERSION);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_table_is_keyed_by_namespace_first() {
    let cluster = cluster();
    let client = raw(&cluster.url()).await;
    PgStore::connect(&cluster.url(), 1).await.unwrap();
    let keys = client
        .query(
            "SELECT c.relname, array_agg(a.attname::text ORDER BY k.ord)
               FROM pg_index i
               JOIN pg_class c ON c.oid = i.indrelid
               JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'public'
               CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
               JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum
              WHERE i.indisprimary AND c.relname <> 'sessiondb_schema'
              GROUP BY c.relname",
            &[],
        )
        .await
        .unwrap();
    assert!(keys.len() >= 13, "tables: {}", keys.len());
    for row in keys {
        let (table, columns): (String, Vec<String>) = (row.get(0), row.get(1));
        if table == "feed_counter" {
            // The feed's one counter row: one position sequence for the database.
            assert_eq!(columns, ["id"]);
            continue;
        }
        assert_eq!(columns[0], "namespace", "{table}: {columns:?}");
        let per_session = !matches!(
            table.as_str(),
            "attachments" | "attachment_chunks" | "deleted_versions"
        );
        if per_session {
            let second = if table == "sessions" {
                "id"
            } else {
                "session_id"
            };
            assert_eq!(columns[1], second, "{table}: {columns:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_schema_is_refused() {
    let cluster = cluster();
    PgStore::connect(&cluster.url(), 1).await.unwrap();
    let client = raw(&cluster.url()).await;
    client
        .execute(
            "INSERT INTO sessiondb_schema (version) VALUES ($1)",
            &[&(SCHEMA_VERSION + 1)],
        )
        .await
        .unwrap();
    let refused = PgStore::connect(&cluster.url(), 1).await.unwrap_err();
    assert!(refused.to_string().contains("newer"), "{refused}");
}

#[tokio::test]
async fn connection_failures_name_their_reason_once() {
    // A port that was just free: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let refused = PgStore::connect(&format!("postgres://postgres@127.0.0.1:{port}/x"), 1)
        .await
        .unwrap_err();
    // Display alone: the error has no source, so a report that walks sources adds nothing.
    assert!(std::error::Error::source(&refused).is_none());
    let text = refused.to_string();
    assert_eq!(
        text.matches("error connecting to server").count(),
        1,
        "{text}"
    );
    assert_eq!(text.matches("Connection refused").count(), 1, "{text}");

    let malformed = PgStore::connect("postgres://127.0.0.1:notaport/x", 1)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        malformed.starts_with("bad connection string: "),
        "{malformed}"
    );
    assert!(malformed.contains("port"), "{malformed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_3_folds_the_accents_of_rows_written_before_it() {
    let cluster = cluster();
    let url = cluster.url();
    let db = sessiondb::Db::new(PgStore::connect(&url, 1).await.unwrap());
    let session = db.session("s").unwrap();
    let message = sessiondb_testkit::text("m", "user", "Un café crème");
    session.append(message, Default::default()).await.unwrap();
    let context = session.context();
    let spec = sessiondb::BlockSpec {
        kind: sessiondb::BlockKind::Search,
        description: None,
        max_tokens: None,
        content: String::new(),
    };
    context.define("kb", spec).await.unwrap();
    context
        .put_entry("kb", "k", "Crème brûlée", None)
        .await
        .unwrap();
    let client = raw(&url).await;
    // The store as schema 2 left it: vectors of the accented words as written.
    client
        .batch_execute(
            "ALTER TEXT SEARCH CONFIGURATION sessiondb_search
                 ALTER MAPPING FOR word, hword, hword_part WITH sessiondb_stem;
             UPDATE messages SET search_text = search_text;
             UPDATE context_entries SET content = content;
             ALTER TABLE sessions DROP COLUMN version;
             DROP TABLE deleted_versions;
             DELETE FROM sessiondb_schema WHERE version >= 3;",
        )
        .await
        .unwrap();
    let found = |db: sessiondb::Db<PgStore>| async move {
        let session = db.session("s").unwrap();
        let hits = session.search("cafe", 10).await.unwrap();
        let args = serde_json::json!({"label": "kb", "query": "creme brulee"});
        let entries = session.context().execute("search_context", &args).await;
        (hits.len(), entries)
    };
    assert_eq!(found(db).await, (0, "No results found.".to_owned()));

    let migrated = PgStore::connect(&url, 1).await.unwrap();
    assert_eq!(migrated.schema_version().await.unwrap(), SCHEMA_VERSION);
    let (hits, entries) = found(sessiondb::Db::new(migrated)).await;
    assert_eq!((hits, entries.as_str()), (1, "[k]\nCrème brûlée"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_that_may_not_create_the_extension_is_told_why() {
    let cluster = cluster();
    let client = raw(&cluster.url()).await;
    // May create tables in the schema, not extensions in the database.
    client
        .batch_execute(
            "CREATE ROLE app LOGIN;
             GRANT CREATE ON SCHEMA public TO app;",
        )
        .await
        .unwrap();
    let url = cluster.url().replacen("postgres@", "app@", 1);
    let refused = PgStore::connect(&url, 1).await.unwrap_err().to_string();
    assert!(
        refused.starts_with("migrating the database to schema 3: ")
            && refused.contains("permission denied to create extension \"unaccent\"")
            && refused.contains("Must have CREATE privilege on current database"),
        "{refused}"
    );
    // Created by a role that may, the extension is there and the migration goes on.
    client
        .batch_execute("CREATE EXTENSION unaccent")
        .await
        .unwrap();
    let store = PgStore::connect(&url, 1).await.unwrap();
    assert_eq!(store.schema_version().await.unwrap(), SCHEMA_VERSION);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_passes_a_sound_store_and_names_what_a_hand_edit_broke() {
    let cluster = cluster();
    let url = cluster.url();
    let db = sessiondb::Db::new(PgStore::connect(&url, 2).await.unwrap());
    sessiondb_testkit::fill_for_check(&db).await;
    assert_eq!(check_database(&url).await.unwrap(), Vec::<String>::new());

    let client = raw(&url).await;
    client
        .batch_execute(
            "UPDATE sessions SET stored_messages = stored_messages + 1, next_seq = 2
              WHERE id = 'a';
             UPDATE sessions SET leaf_id = 'gone' WHERE id = 'b';
             UPDATE messages SET parent_id = 'o' WHERE id = 'o';
             DELETE FROM attachment_chunks;
             INSERT INTO messages (namespace, session_id, seq, id, role, content, content_chunks,
                                   bytes, token_estimate, content_hash, created_at)
                  VALUES ('', 'nowhere', 1, 'stray', 'user', '{}', 0, 2, 1, '\\x00', 1);",
        )
        .await
        .unwrap();
    assert_eq!(
        check_database(&url).await.unwrap(),
        sessiondb_testkit::CHECK_PROBLEMS
    );
}
