//! Context blocks, their keyed entries and frozen prompts. A scope is a session, or the
//! namespace's templates (session id `''`); reads see the templates first, then the session's own.

use deadpool_postgres::GenericClient;
use sessiondb_core::context::{BlockDef, BlockKind, ContextError, WriteMode, written_content};
use sessiondb_core::{
    ContextEntry, FrozenPrompt, ScopedBlock, ScopedEntry, SessionKey, StoreError,
};
use tokio_postgres::Row;

use crate::sql::{Result, exec, get, pairs, row, rows, search_words};

const BLOCK_COLUMNS: &str = "session_id, label, kind, description, max_tokens, content";

fn block_from_row(r: &Row) -> Result<ScopedBlock> {
    let kind: &str = get(r, 2)?;
    let kind = BlockKind::parse(kind)
        .ok_or_else(|| StoreError::Corrupt(format!("unknown block kind `{kind}`")))?;
    Ok(ScopedBlock {
        template: get::<&str>(r, 0)?.is_empty(),
        block: BlockDef {
            label: get(r, 1)?,
            kind,
            description: get(r, 3)?,
            max_tokens: get::<Option<i64>>(r, 4)?.map(|n| n as u64),
            content: get(r, 5)?,
        },
    })
}

pub(crate) async fn blocks<C: GenericClient>(c: &C, key: &SessionKey) -> Result<Vec<ScopedBlock>> {
    let sql = format!(
        "SELECT {BLOCK_COLUMNS} FROM context_blocks
          WHERE namespace = $1 AND session_id IN ('', $2)
          ORDER BY session_id <> '', seq"
    );
    rows(c, &sql, &[&key.namespace, &key.session_id])
        .await?
        .iter()
        .map(block_from_row)
        .collect()
}

/// The block of `label` the scope sees: its own, else its template.
async fn visible_block<C: GenericClient>(
    c: &C,
    key: &SessionKey,
    label: &str,
) -> Result<Option<ScopedBlock>> {
    let sql = format!(
        "SELECT {BLOCK_COLUMNS} FROM context_blocks
          WHERE namespace = $1 AND session_id IN ('', $2) AND label = $3
          ORDER BY session_id = '' LIMIT 1"
    );
    row(c, &sql, &[&key.namespace, &key.session_id, &label])
        .await?
        .as_ref()
        .map(block_from_row)
        .transpose()
}

pub(crate) async fn put_block<C: GenericClient>(
    c: &C,
    key: &SessionKey,
    block: &BlockDef,
) -> Result<()> {
    let max_tokens = block.max_tokens.map(|n| n as i64);
    exec(
        c,
        "INSERT INTO context_blocks (namespace, session_id, label, seq, kind, description,
                                     max_tokens, content)
         VALUES ($1, $2, $3, (SELECT coalesce(max(seq), 0) + 1 FROM context_blocks
                               WHERE namespace = $1 AND session_id = $2),
                 $4, $5, $6, $7)
         ON CONFLICT (namespace, session_id, label) DO UPDATE SET
             kind = excluded.kind, description = excluded.description,
             max_tokens = excluded.max_tokens, content = excluded.content",
        &[
            &key.namespace,
            &key.session_id,
            &block.label,
            &block.kind.as_str(),
            &block.description,
            &max_tokens,
            &block.content,
        ],
    )
    .await?;
    Ok(())
}

/// Writes a text block's content (the template's copied into the scope when only it exists).
pub(crate) async fn write_block<C: GenericClient>(
    c: &C,
    key: &SessionKey,
    label: &str,
    text: &str,
    mode: WriteMode,
) -> Result<BlockDef> {
    let mut block = visible_block(c, key, label)
        .await?
        .ok_or_else(|| ContextError::NotFound(label.to_owned()))?
        .block;
    block.content = written_content(&block, text, mode)?;
    put_block(c, key, &block).await?;
    Ok(block)
}

pub(crate) async fn delete_block<C: GenericClient>(
    c: &C,
    key: &SessionKey,
    label: &str,
) -> Result<bool> {
    let scope: [crate::sql::Param<'_>; 3] = [&key.namespace, &key.session_id, &label];
    exec(
        c,
        "DELETE FROM context_entries WHERE namespace = $1 AND session_id = $2 AND label = $3",
        &scope,
    )
    .await?;
    let deleted = exec(
        c,
        "DELETE FROM context_blocks WHERE namespace = $1 AND session_id = $2 AND label = $3",
        &scope,
    )
    .await?;
    Ok(deleted > 0)
}

pub(crate) async fn put_entry<C: GenericClient>(
    c: &C,
    key: &SessionKey,
    label: &str,
    entry: &ContextEntry,
) -> Result<()> {
    let block = visible_block(c, key, label)
        .await?
        .ok_or_else(|| ContextError::NotFound(label.to_owned()))?
        .block;
    if !block.kind.is_keyed() {
        return Err(ContextError::NotKeyed(label.to_owned()).into());
    }
    exec(
        c,
        "INSERT INTO context_entries (namespace, session_id, label, key, content, description)
         VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT (namespace, session_id, label, key) DO UPDATE SET
             content = excluded.content, description = excluded.description",
        &[
            &key.namespace,
            &key.session_id,
            &label,
            &entry.key,
            &entry.content,
            &entry.description,
        ],
    )
    .await?;
    Ok(())
}

/// Keys and descriptions, the session's entry shadowing its template's.
pub(crate) async fn delete_entry<C: GenericClient>(
    c: &C,
    key: &SessionKey,
    label: &str,
    entry_key: &str,
) -> Result<bool> {
    let deleted = exec(
        c,
        "DELETE FROM context_entries
          WHERE namespace = $1 AND session_id = $2 AND label = $3 AND key = $4",
        &[&key.namespace, &key.session_id, &label, &entry_key],
    )
    .await?;
    Ok(deleted > 0)
}

pub(crate) async fn entry_keys<C: GenericClient>(
    c: &C,
    key: &SessionKey,
    label: &str,
) -> Result<Vec<(String, Option<String>)>> {
    rows(
        c,
        "SELECT DISTINCT ON (key) key, description FROM context_entries
          WHERE namespace = $1 AND session_id IN ('', $2) AND label = $3
          ORDER BY key, session_id = ''",
        &[&key.namespace, &key.session_id, &label],
    )
    .await
    .and_then(|found| pairs(&found))
}

pub(crate) async fn entries<C: GenericClient>(
    c: &C,
    key: &SessionKey,
    label: &str,
    after: Option<&str>,
    limit: Option<usize>,
) -> Result<Vec<ScopedEntry>> {
    // Every key is at least one character, so all of them sort after ''; `LIMIT NULL` is none.
    let (after, limit) = (
        after.unwrap_or(""),
        limit.map(|n| i64::try_from(n).unwrap_or(i64::MAX)),
    );
    rows(
        c,
        "SELECT session_id, key, content, description FROM context_entries
          WHERE namespace = $1 AND session_id IN ('', $2) AND label = $3 AND key > $4
          ORDER BY key, session_id = ''
          LIMIT $5",
        &[&key.namespace, &key.session_id, &label, &after, &limit],
    )
    .await?
    .iter()
    .map(|r| {
        Ok(ScopedEntry {
            template: get::<String>(r, 0)?.is_empty(),
            entry: ContextEntry {
                key: get(r, 1)?,
                content: get(r, 2)?,
                description: get(r, 3)?,
            },
        })
    })
    .collect()
}

pub(crate) async fn entry<C: GenericClient>(
    c: &C,
    key: &SessionKey,
    label: &str,
    entry_key: &str,
) -> Result<Option<ContextEntry>> {
    row(
        c,
        "SELECT key, content, description FROM context_entries
          WHERE namespace = $1 AND session_id IN ('', $2) AND label = $3 AND key = $4
          ORDER BY session_id = '' LIMIT 1",
        &[&key.namespace, &key.session_id, &label, &entry_key],
    )
    .await?
    .map(|r| {
        Ok(ContextEntry {
            key: get(&r, 0)?,
            content: get(&r, 1)?,
            description: get(&r, 2)?,
        })
    })
    .transpose()
}

pub(crate) async fn search<C: GenericClient>(
    c: &C,
    key: &SessionKey,
    label: &str,
    words: &[String],
    limit: usize,
) -> Result<Vec<(String, String)>> {
    if words.is_empty() {
        return Ok(Vec::new());
    }
    let (query, limit) = (search_words(words), limit as i64);
    rows(
        c,
        "SELECT e.key, e.content
           FROM context_entries e, plainto_tsquery('sessiondb_search', $1) query
          WHERE e.search_vector @@ query AND e.namespace = $2 AND e.session_id IN ('', $3)
            AND e.label = $4
            AND NOT (e.session_id = '' AND $3 <> '' AND EXISTS (
                SELECT 1 FROM context_entries own
                 WHERE own.namespace = $2 AND own.session_id = $3 AND own.label = $4
                   AND own.key = e.key))
          ORDER BY ts_rank(e.search_vector, query) DESC, e.key
          LIMIT $5",
        &[&query, &key.namespace, &key.session_id, &label, &limit],
    )
    .await
    .and_then(|found| pairs(&found))
}

pub(crate) async fn prompt<C: GenericClient>(
    c: &C,
    key: &SessionKey,
) -> Result<Option<FrozenPrompt>> {
    row(
        c,
        "SELECT prompt, frozen_at FROM context_prompts WHERE namespace = $1 AND session_id = $2",
        &[&key.namespace, &key.session_id],
    )
    .await?
    .map(|r| {
        Ok(FrozenPrompt {
            prompt: get(&r, 0)?,
            frozen_at: get(&r, 1)?,
        })
    })
    .transpose()
}

pub(crate) async fn freeze_prompt<C: GenericClient>(
    c: &C,
    key: &SessionKey,
    prompt: &str,
    frozen_at: i64,
    replace: bool,
) -> Result<FrozenPrompt> {
    let sql = if replace {
        "INSERT INTO context_prompts (namespace, session_id, prompt, frozen_at)
         VALUES ($1, $2, $3, $4)
         ON CONFLICT (namespace, session_id) DO UPDATE SET
             prompt = excluded.prompt, frozen_at = excluded.frozen_at"
    } else {
        "INSERT INTO context_prompts (namespace, session_id, prompt, frozen_at)
         VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING"
    };
    exec(
        c,
        sql,
        &[&key.namespace, &key.session_id, &prompt, &frozen_at],
    )
    .await?;
    self::prompt(c, key)
        .await?
        .ok_or_else(|| StoreError::Corrupt("a frozen prompt vanished while writing it".into()))
}

/// The statements that remove a session's context (never its namespace's templates).
pub(crate) const DELETE_SESSION: &[&str] = &[
    "DELETE FROM context_entries WHERE namespace = $1 AND session_id = $2",
    "DELETE FROM context_blocks WHERE namespace = $1 AND session_id = $2",
    "DELETE FROM context_prompts WHERE namespace = $1 AND session_id = $2",
];
