//! Context blocks, keyed entries (with their full-text index) and frozen prompts. A scope is a
//! session, or its namespace's templates (session id `''`); reads see both layers.

use rusqlite::{Connection, OptionalExtension, params};
use sessiondb_core::context::{BlockDef, BlockKind, ContextError, WriteMode, written_content};
use sessiondb_core::{
    ContextEntry, FrozenPrompt, ScopedBlock, ScopedEntry, SessionKey, StoreError,
};

use crate::backend_error;
use crate::queries::match_expression;

type Result<T> = std::result::Result<T, StoreError>;

fn exec(conn: &Connection, sql: &str, params: &[&dyn rusqlite::ToSql]) -> Result<usize> {
    conn.prepare_cached(sql)
        .and_then(|mut stmt| stmt.execute(params))
        .map_err(backend_error)
}

fn block_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<ScopedBlock> {
    let kind: String = r.get(2)?;
    let kind = BlockKind::parse(&kind).ok_or_else(|| {
        rusqlite::Error::FromSqlConversionFailure(
            2,
            rusqlite::types::Type::Text,
            format!("unknown block kind `{kind}`").into(),
        )
    })?;
    Ok(ScopedBlock {
        template: r.get::<_, String>(0)?.is_empty(),
        block: BlockDef {
            label: r.get(1)?,
            kind,
            description: r.get(3)?,
            max_tokens: r.get::<_, Option<i64>>(4)?.map(|n| n as u64),
            content: r.get(5)?,
        },
    })
}

const BLOCK_COLUMNS: &str = "session_id, label, kind, description, max_tokens, content";

pub(crate) fn blocks(conn: &Connection, key: &SessionKey) -> Result<Vec<ScopedBlock>> {
    conn.prepare_cached(&format!(
        "SELECT {BLOCK_COLUMNS} FROM context_blocks
          WHERE namespace = ?1 AND session_id IN ('', ?2)
          ORDER BY session_id <> '', seq"
    ))
    .and_then(|mut stmt| {
        stmt.query_map(params![key.namespace, key.session_id], block_from_row)?
            .collect()
    })
    .map_err(backend_error)
}

/// The block of `label` the scope sees: its own, else its namespace template.
fn visible_block(conn: &Connection, key: &SessionKey, label: &str) -> Result<Option<ScopedBlock>> {
    conn.prepare_cached(&format!(
        "SELECT {BLOCK_COLUMNS} FROM context_blocks
          WHERE namespace = ?1 AND session_id IN ('', ?2) AND label = ?3
          ORDER BY session_id = '' LIMIT 1"
    ))
    .and_then(|mut stmt| {
        stmt.query_row(
            params![key.namespace, key.session_id, label],
            block_from_row,
        )
        .optional()
    })
    .map_err(backend_error)
}

pub(crate) fn put_block(conn: &Connection, key: &SessionKey, block: &BlockDef) -> Result<()> {
    exec(
        conn,
        "INSERT INTO context_blocks (namespace, session_id, label, seq, kind, description,
                                     max_tokens, content)
         VALUES (?1, ?2, ?3, (SELECT coalesce(max(seq), 0) + 1 FROM context_blocks
                               WHERE namespace = ?1 AND session_id = ?2),
                 ?4, ?5, ?6, ?7)
         ON CONFLICT (namespace, session_id, label) DO UPDATE SET
             kind = excluded.kind, description = excluded.description,
             max_tokens = excluded.max_tokens, content = excluded.content",
        params![
            key.namespace,
            key.session_id,
            block.label,
            block.kind.as_str(),
            block.description,
            block.max_tokens.map(|n| n as i64),
            block.content,
        ],
    )?;
    Ok(())
}

/// Applies a text write to the visible block; a template's becomes the session's own copy.
pub(crate) fn write_block(
    conn: &Connection,
    key: &SessionKey,
    label: &str,
    text: &str,
    mode: WriteMode,
) -> Result<BlockDef> {
    let mut block = visible_block(conn, key, label)?
        .ok_or_else(|| ContextError::NotFound(label.to_owned()))?
        .block;
    block.content = written_content(&block, text, mode)?;
    put_block(conn, key, &block)?;
    Ok(block)
}

pub(crate) fn delete_block(conn: &Connection, key: &SessionKey, label: &str) -> Result<bool> {
    let scope = params![key.namespace, key.session_id, label];
    exec(
        conn,
        "DELETE FROM context_fts WHERE rowid IN (
             SELECT rowid FROM context_entries
              WHERE namespace = ?1 AND session_id = ?2 AND label = ?3)",
        scope,
    )?;
    exec(
        conn,
        "DELETE FROM context_entries WHERE namespace = ?1 AND session_id = ?2 AND label = ?3",
        scope,
    )?;
    let deleted = exec(
        conn,
        "DELETE FROM context_blocks WHERE namespace = ?1 AND session_id = ?2 AND label = ?3",
        scope,
    )?;
    Ok(deleted > 0)
}

pub(crate) fn put_entry(
    conn: &Connection,
    key: &SessionKey,
    label: &str,
    entry: &ContextEntry,
) -> Result<()> {
    let block = visible_block(conn, key, label)?
        .ok_or_else(|| ContextError::NotFound(label.to_owned()))?
        .block;
    if !block.kind.is_keyed() {
        return Err(ContextError::NotKeyed(label.to_owned()).into());
    }
    let rowid: i64 = conn
        .prepare_cached(
            "INSERT INTO context_entries (namespace, session_id, label, key, content, description)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT (namespace, session_id, label, key) DO UPDATE SET
                 content = excluded.content, description = excluded.description
             RETURNING rowid",
        )
        .and_then(|mut stmt| {
            stmt.query_row(
                params![
                    key.namespace,
                    key.session_id,
                    label,
                    entry.key,
                    entry.content,
                    entry.description
                ],
                |r| r.get(0),
            )
        })
        .map_err(backend_error)?;
    exec(
        conn,
        "DELETE FROM context_fts WHERE rowid = ?1",
        params![rowid],
    )?;
    exec(
        conn,
        "INSERT INTO context_fts (rowid, content) VALUES (?1, ?2)",
        params![rowid, entry.content],
    )?;
    Ok(())
}

pub(crate) fn delete_entry(
    conn: &Connection,
    key: &SessionKey,
    label: &str,
    entry_key: &str,
) -> Result<bool> {
    let scope = params![key.namespace, key.session_id, label, entry_key];
    exec(
        conn,
        "DELETE FROM context_fts WHERE rowid IN (
             SELECT rowid FROM context_entries
              WHERE namespace = ?1 AND session_id = ?2 AND label = ?3 AND key = ?4)",
        scope,
    )?;
    let deleted = exec(
        conn,
        "DELETE FROM context_entries
          WHERE namespace = ?1 AND session_id = ?2 AND label = ?3 AND key = ?4",
        scope,
    )?;
    Ok(deleted > 0)
}

pub(crate) fn entry_keys(
    conn: &Connection,
    key: &SessionKey,
    label: &str,
) -> Result<Vec<(String, Option<String>)>> {
    let rows: Vec<(String, Option<String>)> = conn
        .prepare_cached(
            "SELECT key, description FROM context_entries
              WHERE namespace = ?1 AND session_id IN ('', ?2) AND label = ?3
              ORDER BY key, session_id = ''",
        )
        .and_then(|mut stmt| {
            stmt.query_map(params![key.namespace, key.session_id, label], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })?
            .collect()
        })
        .map_err(backend_error)?;
    // The session's entry sorts before its template's of the same key and shadows it.
    let mut keys: Vec<(String, Option<String>)> = Vec::with_capacity(rows.len());
    for row in rows {
        if keys.last().is_none_or(|last| last.0 != row.0) {
            keys.push(row);
        }
    }
    Ok(keys)
}

pub(crate) fn entries(
    conn: &Connection,
    key: &SessionKey,
    label: &str,
    after: Option<&str>,
    limit: Option<usize>,
) -> Result<Vec<ScopedEntry>> {
    // Every key is at least one character, so all of them sort after ''; `LIMIT -1` is none.
    let (after, limit) = (
        after.unwrap_or(""),
        limit.map_or(-1, |n| i64::try_from(n).unwrap_or(i64::MAX)),
    );
    conn.prepare_cached(
        "SELECT session_id, key, content, description FROM context_entries
          WHERE namespace = ?1 AND session_id IN ('', ?2) AND label = ?3 AND key > ?4
          ORDER BY key, session_id = ''
          LIMIT ?5",
    )
    .and_then(|mut stmt| {
        let scope = params![key.namespace, key.session_id, label, after, limit];
        stmt.query_map(scope, |r| {
            Ok(ScopedEntry {
                template: r.get::<_, String>(0)?.is_empty(),
                entry: ContextEntry {
                    key: r.get(1)?,
                    content: r.get(2)?,
                    description: r.get(3)?,
                },
            })
        })?
        .collect()
    })
    .map_err(backend_error)
}

pub(crate) fn entry(
    conn: &Connection,
    key: &SessionKey,
    label: &str,
    entry_key: &str,
) -> Result<Option<ContextEntry>> {
    conn.prepare_cached(
        "SELECT key, content, description FROM context_entries
          WHERE namespace = ?1 AND session_id IN ('', ?2) AND label = ?3 AND key = ?4
          ORDER BY session_id = '' LIMIT 1",
    )
    .and_then(|mut stmt| {
        stmt.query_row(
            params![key.namespace, key.session_id, label, entry_key],
            |r| {
                Ok(ContextEntry {
                    key: r.get(0)?,
                    content: r.get(1)?,
                    description: r.get(2)?,
                })
            },
        )
        .optional()
    })
    .map_err(backend_error)
}

pub(crate) fn search(
    conn: &Connection,
    key: &SessionKey,
    label: &str,
    words: &[String],
    limit: usize,
) -> Result<Vec<(String, String)>> {
    if words.is_empty() {
        return Ok(Vec::new());
    }
    conn.prepare_cached(
        "SELECT e.key, e.content
           FROM context_fts
           JOIN context_entries e ON e.rowid = context_fts.rowid
          WHERE context_fts MATCH ?1 AND e.namespace = ?2 AND e.session_id IN ('', ?3)
            AND e.label = ?4
            AND NOT (e.session_id = '' AND ?3 <> '' AND EXISTS (
                SELECT 1 FROM context_entries own
                 WHERE own.namespace = ?2 AND own.session_id = ?3 AND own.label = ?4
                   AND own.key = e.key))
          ORDER BY bm25(context_fts), e.key
          LIMIT ?5",
    )
    .and_then(|mut stmt| {
        stmt.query_map(
            params![
                match_expression(words, false),
                key.namespace,
                key.session_id,
                label,
                limit as i64
            ],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?
        .collect()
    })
    .map_err(backend_error)
}

pub(crate) fn prompt(conn: &Connection, key: &SessionKey) -> Result<Option<FrozenPrompt>> {
    conn.prepare_cached(
        "SELECT prompt, frozen_at FROM context_prompts WHERE namespace = ?1 AND session_id = ?2",
    )
    .and_then(|mut stmt| {
        stmt.query_row(params![key.namespace, key.session_id], |r| {
            Ok(FrozenPrompt {
                prompt: r.get(0)?,
                frozen_at: r.get(1)?,
            })
        })
        .optional()
    })
    .map_err(backend_error)
}

pub(crate) fn freeze_prompt(
    conn: &Connection,
    key: &SessionKey,
    prompt: &str,
    frozen_at: i64,
    replace: bool,
) -> Result<FrozenPrompt> {
    let sql = if replace {
        "INSERT INTO context_prompts (namespace, session_id, prompt, frozen_at)
         VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (namespace, session_id) DO UPDATE SET
             prompt = excluded.prompt, frozen_at = excluded.frozen_at"
    } else {
        "INSERT INTO context_prompts (namespace, session_id, prompt, frozen_at)
         VALUES (?1, ?2, ?3, ?4) ON CONFLICT DO NOTHING"
    };
    exec(
        conn,
        sql,
        params![key.namespace, key.session_id, prompt, frozen_at],
    )?;
    self::prompt(conn, key)?
        .ok_or_else(|| StoreError::Corrupt("a frozen prompt vanished while writing it".into()))
}

/// Everything context-related a session owns (never its namespace's templates).
pub(crate) fn delete_session(conn: &Connection, key: &SessionKey) -> Result<()> {
    let scope = params![key.namespace, key.session_id];
    exec(
        conn,
        "DELETE FROM context_fts WHERE rowid IN (
             SELECT rowid FROM context_entries WHERE namespace = ?1 AND session_id = ?2)",
        scope,
    )?;
    for table in ["context_entries", "context_blocks", "context_prompts"] {
        exec(
            conn,
            &format!("DELETE FROM {table} WHERE namespace = ?1 AND session_id = ?2"),
            scope,
        )?;
    }
    Ok(())
}
