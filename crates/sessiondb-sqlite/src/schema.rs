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

/// Brings the schema to the latest version, one transaction per migration.
/// The schema version a database file is at (0: a new file).
pub(crate) fn version(conn: &Connection) -> Result<i64, StoreError> {
    conn.query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(backend_error)
}

pub(crate) fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    let version = version(conn)?;
    let latest = SCHEMA_VERSION;
    if version > latest {
        return Err(StoreError::SchemaTooNew {
            found: version,
            supported: latest,
        });
    }
    for (index, sql) in MIGRATIONS.iter().enumerate().skip(version as usize) {
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

    use super::{MIGRATIONS, migrate};
    use crate::queries::reassemble;

    /// Schema 12 moves the text of rows that spill over their page into continuation slices
    /// and keeps every older continuation slice; each message reads back as it was.
    #[test]
    fn migration_12_moves_texts_off_the_page_and_keeps_each_message() {
        let mut conn = Connection::open_in_memory().unwrap();
        for (index, sql) in MIGRATIONS[..11].iter().enumerate() {
            conn.execute_batch(sql).unwrap();
            conn.pragma_update(None, "user_version", index as i64 + 1)
                .unwrap();
        }
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

        migrate(&mut conn).unwrap();
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
}
