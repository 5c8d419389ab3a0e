//! Reads and writes of the session registry, compactions and state.

use deadpool_postgres::GenericClient;
use sessiondb_core::message::JsonMap;
use sessiondb_core::{
    Compaction, SearchFilter, SearchHit, SessionInfo, SessionKey, SessionQuery, SessionRecord,
    SessionSort, SessionStats, StoreError,
};
use tokio_postgres::Row;

use crate::sql::{
    Param, Result, exec, get, lookup, pairs, row, rows, search_filter, search_query, search_words,
};
use sessiondb_core::plan::linear_range;

const INFO_COLUMNS: &str =
    "id, name, parent_session_id, model, source, user_id, metadata, settings,
    end_reason, input_tokens, output_tokens, cost, created_at, updated_at, last_message_at,
    leaf_id, path_len, path_tokens, path_bytes, stored_messages,
    EXISTS (SELECT 1 FROM compactions c
             WHERE c.namespace = sessions.namespace AND c.session_id = sessions.id),
    leaf_seq, path_head_seq, path_dense, version";

fn json_object(text: &str) -> Result<JsonMap> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt(format!("session record: {e}")))
}

fn info_from_row(r: &Row) -> Result<SessionInfo> {
    Ok(SessionInfo {
        id: get(r, 0)?,
        record: SessionRecord {
            name: get(r, 1)?,
            parent_session_id: get(r, 2)?,
            model: get(r, 3)?,
            source: get(r, 4)?,
            user_id: get(r, 5)?,
            metadata: json_object(get(r, 6)?)?,
            settings: json_object(get(r, 7)?)?,
            end_reason: get(r, 8)?,
            input_tokens: get::<i64>(r, 9)? as u64,
            output_tokens: get::<i64>(r, 10)? as u64,
            cost: get(r, 11)?,
        },
        created_at: get(r, 12)?,
        updated_at: get(r, 13)?,
        last_message_at: get(r, 14)?,
        stats: SessionStats {
            leaf_id: get(r, 15)?,
            message_count: get::<i64>(r, 16)? as u64,
            token_estimate: get::<i64>(r, 17)? as u64,
            content_bytes: get::<i64>(r, 18)? as u64,
            stored_messages: get::<i64>(r, 19)? as u64,
            has_compactions: get(r, 20)?,
            linear_range: linear_range(get(r, 21)?, get(r, 22)?, get(r, 23)?),
            version: get(r, 24)?,
        },
    })
}

pub(crate) async fn session_info<C: GenericClient>(
    c: &C,
    key: &SessionKey,
) -> Result<Option<SessionInfo>> {
    let sql = format!("SELECT {INFO_COLUMNS} FROM sessions WHERE namespace = $1 AND id = $2");
    row(c, &sql, &[&key.namespace, &key.session_id])
        .await?
        .as_ref()
        .map(info_from_row)
        .transpose()
}

pub(crate) async fn list_sessions<C: GenericClient>(
    c: &C,
    namespace: &str,
    query: &SessionQuery,
) -> Result<Vec<SessionInfo>> {
    let limit = query.limit as i64;
    let mut params: Vec<Param<'_>> = vec![&namespace, &limit];
    if let Some(cursor) = &query.after {
        params.push(&cursor.value);
        params.push(&cursor.id);
    }
    if let Some(user) = &query.user_id {
        params.push(user);
    }
    rows(c, &list_sql(query), &params)
        .await?
        .iter()
        .map(info_from_row)
        .collect()
}

/// One statement per listing shape, each a range on the index of its sort order (led by the
/// user for one user's listing), entered at the cursor with a row comparison.
fn list_sql(query: &SessionQuery) -> String {
    let sort = match query.sort {
        SessionSort::UpdatedAt => "updated_at",
        SessionSort::LastMessageAt => "(coalesce(last_message_at, created_at))",
        SessionSort::CreatedAt => "created_at",
    };
    let (cmp, dir) = if query.descending {
        ("<", "DESC")
    } else {
        (">", "ASC")
    };
    let mut filter = String::from("namespace = $1");
    if query.after.is_some() {
        filter.push_str(&format!(" AND ({sort}, id) {cmp} ($3, $4)"));
    }
    if query.user_id.is_some() {
        let n = if query.after.is_some() { 5 } else { 3 };
        filter.push_str(&format!(" AND user_id = ${n}"));
    }
    format!(
        "SELECT {INFO_COLUMNS} FROM sessions WHERE {filter}
          ORDER BY {sort} {dir}, id {dir} LIMIT $2"
    )
}

pub(crate) const SAVE_RECORD: &str =
    "UPDATE sessions SET name = $3, parent_session_id = $4, model = $5, source = $6,
                user_id = $7, metadata = $8, settings = $9, end_reason = $10,
                input_tokens = $11, output_tokens = $12, cost = $13
          WHERE namespace = $1 AND id = $2";

/// The record alone, for patching inside a write.
pub(crate) async fn record<C: GenericClient>(
    c: &C,
    key: &SessionKey,
) -> Result<Option<SessionRecord>> {
    Ok(session_info(c, key).await?.map(|info| info.record))
}

pub(crate) async fn save_record<C: GenericClient>(
    c: &C,
    key: &SessionKey,
    record: &SessionRecord,
) -> Result<()> {
    let metadata = serde_json::Value::Object(record.metadata.clone()).to_string();
    let settings = serde_json::Value::Object(record.settings.clone()).to_string();
    let (input, output) = (record.input_tokens as i64, record.output_tokens as i64);
    exec(
        c,
        SAVE_RECORD,
        &[
            &key.namespace,
            &key.session_id,
            &record.name,
            &record.parent_session_id,
            &record.model,
            &record.source,
            &record.user_id,
            &metadata,
            &settings,
            &record.end_reason,
            &input,
            &output,
            &record.cost,
        ],
    )
    .await?;
    Ok(())
}

pub(crate) async fn add_compaction<C: GenericClient>(
    c: &C,
    key: &SessionKey,
    compaction: &Compaction,
) -> Result<()> {
    exec(
        c,
        "INSERT INTO compactions (namespace, session_id, seq, id, summary, from_message_id,
                                  to_message_id, created_at)
         VALUES ($1, $2, (SELECT coalesce(max(seq), 0) + 1 FROM compactions
                           WHERE namespace = $1 AND session_id = $2),
                 $3, $4, $5, $6, $7)",
        &[
            &key.namespace,
            &key.session_id,
            &compaction.id,
            &compaction.summary,
            &compaction.from_message_id,
            &compaction.to_message_id,
            &compaction.created_at,
        ],
    )
    .await?;
    Ok(())
}

pub(crate) async fn compactions<C: GenericClient>(
    c: &C,
    key: &SessionKey,
) -> Result<Vec<Compaction>> {
    rows(
        c,
        "SELECT id, summary, from_message_id, to_message_id, created_at FROM compactions
          WHERE namespace = $1 AND session_id = $2 ORDER BY seq",
        &[&key.namespace, &key.session_id],
    )
    .await?
    .iter()
    .map(|r| {
        Ok(Compaction {
            id: get(r, 0)?,
            summary: get(r, 1)?,
            from_message_id: get(r, 2)?,
            to_message_id: get(r, 3)?,
            created_at: get(r, 4)?,
        })
    })
    .collect()
}

pub(crate) async fn put_state<C: GenericClient>(
    c: &C,
    key: &SessionKey,
    name: &str,
    value: &str,
) -> Result<()> {
    exec(
        c,
        "INSERT INTO session_state (namespace, session_id, key, value) VALUES ($1, $2, $3, $4)
         ON CONFLICT (namespace, session_id, key) DO UPDATE SET value = excluded.value",
        &[&key.namespace, &key.session_id, &name, &value],
    )
    .await?;
    Ok(())
}

pub(crate) async fn delete_state<C: GenericClient>(
    c: &C,
    key: &SessionKey,
    name: &str,
) -> Result<bool> {
    let deleted = exec(
        c,
        "DELETE FROM session_state WHERE namespace = $1 AND session_id = $2 AND key = $3",
        &[&key.namespace, &key.session_id, &lookup(name)],
    )
    .await?;
    Ok(deleted > 0)
}

pub(crate) async fn state<C: GenericClient>(
    c: &C,
    key: &SessionKey,
    name: &str,
) -> Result<Option<String>> {
    row(
        c,
        "SELECT value FROM session_state WHERE namespace = $1 AND session_id = $2 AND key = $3",
        &[&key.namespace, &key.session_id, &name],
    )
    .await?
    .map(|r| get(&r, 0))
    .transpose()
}

pub(crate) async fn state_entries<C: GenericClient>(
    c: &C,
    key: &SessionKey,
) -> Result<Vec<(String, String)>> {
    rows(
        c,
        "SELECT key, value FROM session_state WHERE namespace = $1 AND session_id = $2
          ORDER BY key",
        &[&key.namespace, &key.session_id],
    )
    .await
    .and_then(|found| pairs(&found))
}

pub(crate) async fn search_namespace<C: GenericClient>(
    c: &C,
    namespace: &str,
    user_id: Option<&str>,
    words: &[String],
    filter: &SearchFilter,
    limit: usize,
) -> Result<Vec<SearchHit>> {
    let (query, limit) = (search_words(words), limit as i64);
    rows(
        c,
        concat!(
            "SELECT m.id, m.role, m.search_text, m.session_id, m.created_at
               FROM messages m, ",
            search_query!("$2"),
            "
              WHERE m.namespace = $1 AND m.search_vector @@ query
                AND ($3::text IS NULL OR m.session_id IN
                     (SELECT id FROM sessions WHERE namespace = $1 AND user_id = $3)) AND ",
            search_filter!(),
            " ORDER BY ts_rank(m.search_vector, query) DESC, m.session_id, m.seq
              LIMIT $4"
        ),
        &[
            &namespace,
            &query,
            &user_id,
            &limit,
            &filter.role,
            &filter.since_ms,
            &filter.until_ms,
            &filter.match_any,
        ],
    )
    .await?
    .iter()
    .map(|r| {
        Ok(SearchHit {
            id: get(r, 0)?,
            role: get(r, 1)?,
            content: get(r, 2)?,
            session_id: get(r, 3)?,
            created_at: get(r, 4)?,
        })
    })
    .collect()
}
