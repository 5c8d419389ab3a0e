//! Read queries, shared by the reader pool and the writer (which reads inside its transaction).

use rusqlite::{Connection, OptionalExtension, Row, params};
use sessiondb_core::message::StoredRow;
use sessiondb_core::{
    MAX_PATH_DEPTH, MAX_PATH_ROWS, PathRows, RowStat, SearchHit, SessionKey, SessionStats,
    StoreError, StoredMessage,
};

use crate::backend_error;

type Result<T> = std::result::Result<T, StoreError>;

const MESSAGE_COLUMNS: &str =
    "id, role, parent_id, seq, created_at, updated_at, token_estimate, content, content_chunks";

/// Walks from `?3` towards the root, at most MAX_PATH_DEPTH steps; rows come leaf first.
/// Uses only columns of the `messages_tree` covering index.
macro_rules! path_cte {
    () => {
        "WITH RECURSIVE path(id, parent_id, role, bytes, token_estimate, depth) AS (
             SELECT id, parent_id, role, bytes, token_estimate, 0 FROM messages
              WHERE namespace = ?1 AND session_id = ?2 AND id = ?3
             UNION ALL
             SELECT m.id, m.parent_id, m.role, m.bytes, m.token_estimate, path.depth + 1
               FROM path JOIN messages m
                 ON m.namespace = ?1 AND m.session_id = ?2 AND m.id = path.parent_id
              WHERE path.depth < ?4
         ) "
    };
}

fn stored_row(row: &Row<'_>) -> rusqlite::Result<(StoredRow, String, i64)> {
    Ok((
        StoredRow {
            id: row.get(0)?,
            role: row.get(1)?,
            parent_id: row.get(2)?,
            seq: row.get(3)?,
            created_at: row.get(4)?,
            updated_at: row.get(5)?,
            token_estimate: row.get::<_, i64>(6)? as u64,
        },
        row.get(7)?,
        row.get(8)?,
    ))
}

/// Appends the continuation slices of a chunked message to its slice 0.
pub(crate) fn reassemble(
    conn: &Connection,
    key: &SessionKey,
    id: &str,
    mut body: String,
    chunks: i64,
) -> Result<String> {
    if chunks == 0 {
        return Ok(body);
    }
    let mut stmt = conn
        .prepare_cached(
            "SELECT content FROM message_chunks
              WHERE namespace = ?1 AND session_id = ?2 AND id = ?3 ORDER BY idx",
        )
        .map_err(backend_error)?;
    let mut rows = stmt
        .query(params![key.namespace, key.session_id, id])
        .map_err(backend_error)?;
    let mut found = 0;
    while let Some(row) = rows.next().map_err(backend_error)? {
        let slice: String = row.get(0).map_err(backend_error)?;
        body.push_str(&slice);
        found += 1;
    }
    if found != chunks {
        return Err(StoreError::Corrupt(format!(
            "message `{id}` has {found} of its {chunks} continuation slices"
        )));
    }
    Ok(body)
}

fn complete(conn: &Connection, key: &SessionKey, parts: (StoredRow, String, i64)) -> Result<StoredMessage> {
    let (row, content, chunks) = parts;
    let body = reassemble(conn, key, &row.id, content, chunks)?;
    Ok(StoredMessage::from_row(row, &body))
}

pub(crate) fn message(conn: &Connection, key: &SessionKey, id: &str) -> Result<Option<StoredMessage>> {
    let mut stmt = conn
        .prepare_cached(&format!(
            "SELECT {MESSAGE_COLUMNS} FROM messages
              WHERE namespace = ?1 AND session_id = ?2 AND id = ?3"
        ))
        .map_err(backend_error)?;
    let parts = stmt
        .query_row(params![key.namespace, key.session_id, id], stored_row)
        .optional()
        .map_err(backend_error)?;
    parts.map(|p| complete(conn, key, p)).transpose()
}

pub(crate) fn exists(conn: &Connection, key: &SessionKey, id: &str) -> Result<bool> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT 1 FROM messages WHERE namespace = ?1 AND session_id = ?2 AND id = ?3",
        )
        .map_err(backend_error)?;
    stmt.exists(params![key.namespace, key.session_id, id])
        .map_err(backend_error)
}

pub(crate) fn parent_of(conn: &Connection, key: &SessionKey, id: &str) -> Result<Option<Option<String>>> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT parent_id FROM messages WHERE namespace = ?1 AND session_id = ?2 AND id = ?3",
        )
        .map_err(backend_error)?;
    stmt.query_row(params![key.namespace, key.session_id, id], |r| r.get(0))
        .optional()
        .map_err(backend_error)
}

pub(crate) fn children(conn: &Connection, key: &SessionKey, id: &str) -> Result<Vec<StoredMessage>> {
    let mut stmt = conn
        .prepare_cached(&format!(
            "SELECT {MESSAGE_COLUMNS} FROM messages
              WHERE namespace = ?1 AND session_id = ?2 AND parent_id = ?3 ORDER BY seq"
        ))
        .map_err(backend_error)?;
    let rows = stmt
        .query_map(params![key.namespace, key.session_id, id], stored_row)
        .map_err(backend_error)?
        .collect::<rusqlite::Result<Vec<_>>>()
        .map_err(backend_error)?;
    rows.into_iter().map(|p| complete(conn, key, p)).collect()
}

pub(crate) fn roots(conn: &Connection, key: &SessionKey) -> Result<Vec<StoredMessage>> {
    let mut stmt = conn
        .prepare_cached(&format!(
            "SELECT {MESSAGE_COLUMNS} FROM messages m
              WHERE namespace = ?1 AND session_id = ?2
                AND (parent_id IS NULL OR NOT EXISTS (
                     SELECT 1 FROM messages p
                      WHERE p.namespace = ?1 AND p.session_id = ?2 AND p.id = m.parent_id))
              ORDER BY seq"
        ))
        .map_err(backend_error)?;
    let rows = stmt
        .query_map(params![key.namespace, key.session_id], stored_row)
        .map_err(backend_error)?
        .collect::<rusqlite::Result<Vec<_>>>()
        .map_err(backend_error)?;
    rows.into_iter().map(|p| complete(conn, key, p)).collect()
}

pub(crate) fn child_ids(conn: &Connection, key: &SessionKey, id: &str) -> Result<Vec<String>> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT id FROM messages WHERE namespace = ?1 AND session_id = ?2 AND parent_id = ?3",
        )
        .map_err(backend_error)?;
    stmt.query_map(params![key.namespace, key.session_id, id], |r| r.get(0))
        .map_err(backend_error)?
        .collect::<rusqlite::Result<Vec<String>>>()
        .map_err(backend_error)
}

pub(crate) fn has_children(conn: &Connection, key: &SessionKey, id: &str) -> Result<bool> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT 1 FROM messages WHERE namespace = ?1 AND session_id = ?2 AND parent_id = ?3",
        )
        .map_err(backend_error)?;
    stmt.exists(params![key.namespace, key.session_id, id])
        .map_err(backend_error)
}

pub(crate) fn leaf_id(conn: &Connection, key: &SessionKey) -> Result<Option<String>> {
    let mut stmt = conn
        .prepare_cached("SELECT leaf_id FROM sessions WHERE namespace = ?1 AND id = ?2")
        .map_err(backend_error)?;
    Ok(stmt
        .query_row(params![key.namespace, key.session_id], |r| r.get(0))
        .optional()
        .map_err(backend_error)?
        .flatten())
}

pub(crate) fn path(conn: &Connection, key: &SessionKey, leaf: &str) -> Result<PathRows> {
    let mut stmt = conn
        .prepare_cached(concat!(
            path_cte!(),
            "SELECT id, parent_id, role, bytes, token_estimate FROM path"
        ))
        .map_err(backend_error)?;
    let mut oldest_parent: Option<String> = None;
    let mut rows = stmt
        .query_map(
            params![key.namespace, key.session_id, leaf, MAX_PATH_DEPTH as i64],
            |r| {
                Ok((
                    RowStat {
                        id: r.get(0)?,
                        role: r.get(2)?,
                        bytes: r.get::<_, i64>(3)? as u64,
                        token_estimate: r.get::<_, i64>(4)? as u64,
                    },
                    r.get::<_, Option<String>>(1)?,
                ))
            },
        )
        .map_err(backend_error)?
        .map(|r| {
            r.map(|(stat, parent)| {
                oldest_parent = parent;
                stat
            })
        })
        .collect::<rusqlite::Result<Vec<_>>>()
        .map_err(backend_error)?;
    rows.reverse();
    let capped = rows.len() == MAX_PATH_ROWS && oldest_parent.is_some();
    Ok(PathRows { rows, capped })
}

/// `(rows, tokens, bytes)` of the path ending at `leaf`.
pub(crate) fn path_totals(conn: &Connection, key: &SessionKey, leaf: &str) -> Result<(u64, u64, u64)> {
    let mut stmt = conn
        .prepare_cached(concat!(
            path_cte!(),
            "SELECT count(*), coalesce(sum(token_estimate), 0), coalesce(sum(bytes), 0) FROM path"
        ))
        .map_err(backend_error)?;
    stmt.query_row(
        params![key.namespace, key.session_id, leaf, MAX_PATH_DEPTH as i64],
        |r| {
            Ok((
                r.get::<_, i64>(0)? as u64,
                r.get::<_, i64>(1)? as u64,
                r.get::<_, i64>(2)? as u64,
            ))
        },
    )
    .map_err(backend_error)
}

pub(crate) fn fetch(conn: &Connection, key: &SessionKey, ids: &[String]) -> Result<Vec<StoredMessage>> {
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        if let Some(m) = message(conn, key, id)? {
            out.push(m);
        }
    }
    Ok(out)
}

pub(crate) fn ancestors(
    conn: &Connection,
    key: &SessionKey,
    from: &str,
    limit: usize,
) -> Result<Vec<StoredMessage>> {
    let mut out = Vec::with_capacity(limit.min(64));
    let mut next = Some(from.to_owned());
    while let Some(id) = next.take() {
        if out.len() == limit {
            break;
        }
        let Some(m) = message(conn, key, &id)? else {
            break;
        };
        next.clone_from(&m.parent_id);
        out.push(m);
    }
    Ok(out)
}

pub(crate) fn stats(conn: &Connection, key: &SessionKey) -> Result<SessionStats> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT leaf_id, path_len, path_tokens, path_bytes, stored_messages
               FROM sessions WHERE namespace = ?1 AND id = ?2",
        )
        .map_err(backend_error)?;
    Ok(stmt
        .query_row(params![key.namespace, key.session_id], |r| {
            Ok(SessionStats {
                leaf_id: r.get(0)?,
                message_count: r.get::<_, i64>(1)? as u64,
                token_estimate: r.get::<_, i64>(2)? as u64,
                content_bytes: r.get::<_, i64>(3)? as u64,
                stored_messages: r.get::<_, i64>(4)? as u64,
            })
        })
        .optional()
        .map_err(backend_error)?
        .unwrap_or_default())
}

/// Every word must match (implicit AND). Each word is an FTS5 string literal, so nothing in it is
/// syntax; words come from `sessiondb_core::search::query_words` and hold no quotes anyway.
fn match_expression(words: &[String]) -> String {
    words
        .iter()
        .map(|w| format!("\"{}\"", w.replace('"', "\"\"")))
        .collect::<Vec<_>>()
        .join(" ")
}

pub(crate) fn search(
    conn: &Connection,
    key: &SessionKey,
    words: &[String],
    limit: usize,
) -> Result<Vec<SearchHit>> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT s.message_id, s.role, s.text, m.created_at
               FROM message_fts
               JOIN message_search s ON s.rowid = message_fts.rowid
               JOIN messages m ON m.namespace = s.namespace AND m.session_id = s.session_id
                              AND m.id = s.message_id
              WHERE message_fts MATCH ?1 AND s.namespace = ?2 AND s.session_id = ?3
              ORDER BY bm25(message_fts), m.seq
              LIMIT ?4",
        )
        .map_err(backend_error)?;
    stmt.query_map(
        params![match_expression(words), key.namespace, key.session_id, limit as i64],
        |r| {
            Ok(SearchHit {
                id: r.get(0)?,
                role: r.get(1)?,
                content: r.get(2)?,
                session_id: key.session_id.clone(),
                created_at: r.get(3)?,
            })
        },
    )
    .map_err(backend_error)?
    .collect::<rusqlite::Result<Vec<_>>>()
    .map_err(backend_error)
}
