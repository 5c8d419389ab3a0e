//! Connection set-up and numbered schema migrations (`PRAGMA user_version`).

use rusqlite::Connection;
use rusqlite::config::DbConfig;
use sessiondb_core::StoreError;

use crate::{Synchronous, backend_error};

/// Migrations in order; index + 1 is the schema version each one produces.
const MIGRATIONS: &[&str] = &[
    include_str!("../migrations/0001_init.sql"),
    include_str!("../migrations/0002_registry.sql"),
    include_str!("../migrations/0003_user_listings.sql"),
    include_str!("../migrations/0004_attachments.sql"),
    include_str!("../migrations/0005_context.sql"),
    include_str!("../migrations/0006_detached_children.sql"),
    include_str!("../migrations/0007_no_path_index.sql"),
    include_str!("../migrations/0008_branch_points.sql"),
    include_str!("../migrations/0009_ids_first.sql"),
    include_str!("../migrations/0010_search_ids_first.sql"),
    include_str!("../migrations/0011_contentless_search.sql"),
    include_str!("../migrations/0012_text_off_page.sql"),
    include_str!("../migrations/0013_rows_by_session_number.sql"),
    include_str!("../migrations/0014_session_versions.sql"),
    include_str!("../migrations/0015_deleted_versions.sql"),
];

/// The schema version this build creates and reads.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Tables of the full-text index, created by the first search. `message_search` has a row per
/// indexed message, whose rowid is the message's document in `message_fts`, a contentless FTS5
/// table: the index keeps no copy of the texts (a search hit reads its text from the message).
/// Its key ([`SEARCH_KEY_INDEX`]) leads with the message id for the reason the id index does
/// (schema 9): generated ids are time-ordered, so the entries of a group commit's appends to many
/// sessions share a page.
///
/// Writes only insert and delete `message_search` rows (a changed text is a new row), each new
/// row with a rowid above every earlier one and above the mark ([`search_indexed_mark`]), and
/// with its text in `pending_text`. `message_fts` holds exactly the rows at or below the mark,
/// whose `pending_text` is NULL: a search first indexes the rows above it in one statement,
/// clears their texts and moves the mark (`Writer::index_rows_since_last_search`; the writer does
/// so itself past `SEARCH_BACKLOG_ROWS`), so appends never write the full-text index themselves.
pub(crate) const SEARCH_TABLES: &str = r#"
CREATE TABLE IF NOT EXISTS message_search (
    rowid        INTEGER PRIMARY KEY,
    namespace    TEXT NOT NULL,
    session_id   TEXT NOT NULL,
    message_id   TEXT NOT NULL,
    role         TEXT NOT NULL,
    pending_text TEXT
);
CREATE VIRTUAL TABLE IF NOT EXISTS message_fts USING fts5(
    text, content='', contentless_delete=1, tokenize='porter unicode61'
);
"#;

/// Created after the back-fill of a new `message_search` (a sorted bulk build instead of an index
/// insert per row).
pub(crate) const SEARCH_KEY_INDEX: &str = "CREATE UNIQUE INDEX IF NOT EXISTS message_search_key
    ON message_search (message_id, namespace, session_id)";

/// The highest `message_search` rowid that `message_fts` holds, as an SQL expression.
macro_rules! search_indexed_mark {
    () => {
        "coalesce((SELECT CAST(value AS INTEGER) FROM store_meta WHERE key = 'search_indexed'), 0)"
    };
}
pub(crate) use search_indexed_mark;

/// A deleted row leaves `message_fts` if it was indexed (a row above the mark has nothing there
/// to remove).
pub(crate) const SEARCH_TRIGGERS: &str = concat!(
    "CREATE TRIGGER IF NOT EXISTS message_search_ad AFTER DELETE ON message_search
     WHEN old.rowid <= ",
    search_indexed_mark!(),
    " BEGIN
         DELETE FROM message_fts WHERE rowid = old.rowid;
     END;"
);

/// WAL pages after which a commit checkpoints (SQLite's default is 1,000). A checkpoint writes
/// each page once however often the WAL changed it, and a session's newest pages change with
/// every append: at 4,000 pages the writer spent 15% less CPU per append with 32 appenders. A
/// larger WAL saved little more, and the commit that checkpoints stalls for longer.
const WAL_CHECKPOINT_PAGES: u32 = 4000;

/// SQLite's `unix-excl` VFS: the first lock takes an exclusive lock on the database file for
/// the process, and from then on the connections of this process lock among themselves in
/// memory and share a WAL index on the heap instead of the `-shm` file. Every transaction used
/// to make 4–6 `fcntl` calls on the `-shm` file (a third of an append without fsync here). The
/// directory lock already keeps other processes out; a tool that opens the file while the store
/// is open is refused ("database is locked") instead of reading along.
#[cfg(unix)]
pub(crate) const VFS: &str = "unix-excl";
#[cfg(not(unix))]
pub(crate) const VFS: &str = "win32";

pub(crate) fn configure(
    conn: &Connection,
    synchronous: Synchronous,
    read_only: bool,
) -> Result<(), StoreError> {
    let sync = match synchronous {
        Synchronous::Full => "FULL",
        Synchronous::Normal => "NORMAL",
    };
    conn.execute_batch(&format!(
        "PRAGMA journal_mode = WAL;
         PRAGMA synchronous = {sync};
         PRAGMA foreign_keys = ON;
         PRAGMA busy_timeout = 10000;
         PRAGMA cache_size = -16384;
         PRAGMA wal_autocheckpoint = {WAL_CHECKPOINT_PAGES};
         PRAGMA query_only = {};",
        i32::from(read_only)
    ))
    .map_err(backend_error)?;
    // The bundled SQLite has STAT4, which re-prepares a statement whenever a bound value of a
    // range constraint changes; our plans never depend on values, so keep them stable.
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)
        .map_err(backend_error)?;
    conn.set_prepared_statement_cache_capacity(64);
    Ok(())
}

/// The schema version a database file is at (0: a new file).
pub(crate) fn version(conn: &Connection) -> Result<i64, StoreError> {
    conn.query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(backend_error)
}

/// Brings the schema to the latest version, one transaction per migration.
pub(crate) fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    migrate_to(conn, SCHEMA_VERSION)
}

/// Brings the schema to `target`; a file already past it is refused.
pub(crate) fn migrate_to(conn: &mut Connection, target: i64) -> Result<(), StoreError> {
    let version = version(conn)?;
    if version > target {
        return Err(StoreError::SchemaTooNew {
            found: version,
            supported: target,
        });
    }
    for (index, sql) in MIGRATIONS[..target as usize]
        .iter()
        .enumerate()
        .skip(version as usize)
    {
        let tx = conn.transaction().map_err(backend_error)?;
        tx.execute_batch(sql).map_err(backend_error)?;
        tx.pragma_update(None, "user_version", index as i64 + 1)
            .map_err(backend_error)?;
        tx.commit().map_err(backend_error)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use rusqlite::{Connection, params};
    use sessiondb_core::SessionKey;

    use super::{SCHEMA_VERSION, migrate, migrate_to, version};
    use crate::queries::reassemble;

    /// Schema 12 moves the text of rows that spill over their page into continuation slices
    /// and keeps every older continuation slice; each message reads back as it was.
    #[test]
    fn migration_12_moves_texts_off_the_page_and_keeps_each_message() {
        let mut conn = Connection::open_in_memory().unwrap();
        migrate_to(&mut conn, 11).unwrap();
        let key = SessionKey::new("", "s").unwrap();
        let short = "s".repeat(300);
        let long = "l".repeat(3_000);
        let chunked = ["a".repeat(1_000), "b".repeat(500)];
        for (seq, (id, content, chunks)) in [
            ("short", short.as_str(), 0),
            ("long", long.as_str(), 0),
            ("chunked", chunked[0].as_str(), 1),
        ]
        .into_iter()
        .enumerate()
        {
            conn.execute(
                "INSERT INTO messages (namespace, session_id, seq, id, role, content,
                     content_chunks, bytes, token_estimate, content_hash, created_at)
                 VALUES ('', 's', ?1, ?2, 'user', ?3, ?4, 0, 0, x'00', 0)",
                params![seq as i64 + 1, id, content, chunks],
            )
            .unwrap();
        }
        conn.execute(
            "INSERT INTO message_chunks (namespace, session_id, id, idx, content)
             VALUES ('', 's', 'chunked', 1, ?1)",
            [&chunked[1]],
        )
        .unwrap();

        migrate_to(&mut conn, 12).unwrap();
        let layout = |id: &str| -> (String, i64) {
            conn.query_row(
                "SELECT content, content_chunks FROM messages WHERE id = ?1",
                [id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap()
        };
        assert_eq!(layout("short"), (short.clone(), 0));
        assert_eq!(layout("long"), (String::new(), 1));
        assert_eq!(layout("chunked"), (chunked[0].clone(), 1));
        for (id, text) in [
            ("short", short),
            ("long", long),
            ("chunked", chunked.concat()),
        ] {
            let (on_row, chunks) = layout(id);
            assert_eq!(reassemble(&conn, &key, id, on_row, chunks).unwrap(), text);
        }
    }

    /// Schema 12's `messages` rows of two sessions, in two namespaces (one with a branch), with
    /// the sessions' rows.
    fn schema_12_with_two_sessions() -> Connection {
        let mut conn = Connection::open_in_memory().unwrap();
        migrate_to(&mut conn, 12).unwrap();
        for (namespace, session) in [("b", "s"), ("a", "t")] {
            conn.execute(
                "INSERT INTO sessions (namespace, id, created_at, updated_at, next_seq, path_len,
                     path_tokens, path_bytes, path_capped, path_dense, path_epoch,
                     stored_messages)
                 VALUES (?1, ?2, 0, 0, 4, 0, 0, 0, 0, 0, 0, 3)",
                [namespace, session],
            )
            .unwrap();
        }
        for (namespace, session, seq, id, parent, parent_seq) in [
            ("b", "s", 1, "m1", None, None),
            ("b", "s", 2, "m2", Some("m1"), Some(1)),
            ("b", "s", 3, "m3", Some("m1"), Some(1)),
            ("a", "t", 1, "m1", None, None),
        ] {
            conn.execute(
                "INSERT INTO messages (namespace, session_id, seq, id, parent_id, parent_seq,
                     role, content, content_chunks, bytes, token_estimate, content_hash,
                     created_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'user', ?4, 0, 0, 0, x'00', 0)",
                params![namespace, session, seq, id, parent, parent_seq],
            )
            .unwrap();
        }
        conn
    }

    /// Schema 13 numbers the sessions and keys each row by its session's number and its seq;
    /// every row keeps its columns, and the partial indexes hold what they held.
    #[test]
    fn migration_13_keys_rows_by_session_number_and_seq() {
        let mut conn = schema_12_with_two_sessions();
        migrate(&mut conn).unwrap();
        assert_eq!(version(&conn).unwrap(), SCHEMA_VERSION);
        let rows: Vec<(String, i64, i64, String, Option<i64>)> = conn
            .prepare(
                "SELECT s.namespace || '/' || s.id, m.k >> 32, m.seq, m.id, m.parent_seq
                   FROM messages m JOIN sessions s ON s.number = m.k >> 32 ORDER BY m.k",
            )
            .unwrap()
            .query_map([], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
            })
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let row = |session: &str, number, seq, id: &str, parent| {
            (session.to_owned(), number, seq, id.to_owned(), parent)
        };
        assert_eq!(
            rows,
            [
                row("a/t", 1, 1, "m1", None),
                row("b/s", 2, 1, "m1", None),
                row("b/s", 2, 2, "m2", Some(1)),
                row("b/s", 2, 3, "m3", Some(1)),
            ]
        );
        let count = |sql: &str| -> i64 { conn.query_row(sql, [], |r| r.get(0)).unwrap() };
        assert_eq!(
            count(
                "SELECT count(*) FROM messages INDEXED BY messages_detached WHERE k > 0 AND (parent_seq IS NULL OR parent_seq <> seq - 1)"
            ),
            3,
            "the roots and the branch"
        );
        assert_eq!(
            count("SELECT k FROM messages INDEXED BY messages_by_id WHERE id = 'm3' AND k > 0"),
            (2 << 32) + 3
        );
    }

    /// A row whose session has no row (never written by sessiondb) stops the migration, which
    /// then leaves the file as it was.
    #[test]
    fn migration_13_refuses_to_drop_a_row_without_a_session() {
        let mut conn = schema_12_with_two_sessions();
        conn.execute("DELETE FROM sessions WHERE namespace = 'a'", [])
            .unwrap();
        let err = migrate(&mut conn).unwrap_err();
        assert!(err.to_string().contains("every_row_moved"), "{err}");
        assert_eq!(version(&conn).unwrap(), 12);
        let count = |sql: &str| -> i64 { conn.query_row(sql, [], |r| r.get(0)).unwrap() };
        assert_eq!(
            count("SELECT count(*) FROM messages WHERE namespace = 'a'"),
            1
        );
        assert_eq!(count("SELECT count(*) FROM messages"), 4);
    }
}
