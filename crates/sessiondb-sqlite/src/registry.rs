//! Reads and writes of the session registry, compactions and state.

use std::sync::LazyLock;

use rusqlite::{Connection, OptionalExtension, Row, params};
use sessiondb_core::message::JsonMap;
use sessiondb_core::{
    Compaction, SearchFilter, SearchHit, SessionInfo, SessionKey, SessionQuery, SessionRecord,
    SessionSort, SessionStats, StoreError,
};

use crate::backend_error;
use crate::queries::{self, SessionRange, match_expression, search_hits};
use sessiondb_core::plan::linear_range;

type Result<T> = std::result::Result<T, StoreError>;

const INFO_COLUMNS: &str =
    "id, name, parent_session_id, model, source, user_id, metadata, settings,
    end_reason, input_tokens, output_tokens, cost, created_at, updated_at, last_message_at,
    leaf_id, path_len, path_tokens, path_bytes, stored_messages,
    EXISTS (SELECT 1 FROM compactions c
             WHERE c.namespace = sessions.namespace AND c.session_id = sessions.id),
    leaf_seq, path_head_seq, path_dense, version";

fn json_object(text: String) -> rusqlite::Result<JsonMap> {
    serde_json::from_str(&text).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Text, Box::new(e))
    })
}

fn info_from_row(r: &Row<'_>) -> rusqlite::Result<SessionInfo> {
    Ok(SessionInfo {
        id: r.get(0)?,
        record: SessionRecord {
            name: r.get(1)?,
            parent_session_id: r.get(2)?,
            model: r.get(3)?,
            source: r.get(4)?,
            user_id: r.get(5)?,
            metadata: json_object(r.get(6)?)?,
            settings: json_object(r.get(7)?)?,
            end_reason: r.get(8)?,
            input_tokens: r.get::<_, i64>(9)? as u64,
            output_tokens: r.get::<_, i64>(10)? as u64,
            cost: r.get(11)?,
        },
        created_at: r.get(12)?,
        updated_at: r.get(13)?,
        last_message_at: r.get(14)?,
        stats: SessionStats {
            leaf_id: r.get(15)?,
            message_count: r.get::<_, i64>(16)? as u64,
            token_estimate: r.get::<_, i64>(17)? as u64,
            content_bytes: r.get::<_, i64>(18)? as u64,
            stored_messages: r.get::<_, i64>(19)? as u64,
            has_compactions: r.get(20)?,
            linear_range: linear_range(r.get(21)?, r.get(22)?, r.get(23)?),
            version: r.get(24)?,
        },
    })
}

pub(crate) fn session_info(conn: &Connection, key: &SessionKey) -> Result<Option<SessionInfo>> {
    conn.prepare_cached(&format!(
        "SELECT {INFO_COLUMNS} FROM sessions WHERE namespace = ?1 AND id = ?2"
    ))
    .and_then(|mut stmt| {
        stmt.query_row(params![key.namespace, key.session_id], info_from_row)
            .optional()
    })
    .map_err(backend_error)
}

pub(crate) fn list_sessions(
    conn: &Connection,
    namespace: &str,
    query: &SessionQuery,
) -> Result<Vec<SessionInfo>> {
    let mut stmt = conn
        .prepare_cached(&list_sql(query))
        .map_err(backend_error)?;
    let (value, id) = match &query.after {
        Some(c) => (Some(c.value), Some(c.id.as_str())),
        None => (None, None),
    };
    let user = query.user_id.as_deref();
    let params = params![namespace, query.limit as i64, value, id, user];
    // Each variant names only the parameters it uses; unused trailing ones are still bound.
    let used = match (&query.after, user) {
        (None, None) => 2,
        (Some(_), None) => 4,
        (_, Some(_)) => 5,
    };
    stmt.query_map(&params[..used], info_from_row)
        .and_then(|rows| rows.collect())
        .map_err(backend_error)
}

/// One statement per listing shape, so each is a range on its index: `(namespace, value, id)`,
/// or `(namespace, user_id, value, id)` for one user's sessions, entered at the cursor. A
/// generic statement with `?x IS NULL OR …` terms would scan from the index's start instead.
fn list_sql(query: &SessionQuery) -> String {
    let (sort, index) = match query.sort {
        SessionSort::UpdatedAt => ("updated_at", "updated"),
        SessionSort::LastMessageAt => ("coalesce(last_message_at, created_at)", "last_message"),
        SessionSort::CreatedAt => ("created_at", "created"),
    };
    // Named, because without statistics the planner may prefer the namespace-wide index for
    // one user's listing, which would read every session of the namespace.
    let index = match query.user_id {
        Some(_) => format!("sessions_by_user_{index}"),
        None => format!("sessions_by_{index}"),
    };
    let (cmp, dir) = if query.descending {
        ("<", "DESC")
    } else {
        (">", "ASC")
    };
    let mut filter = String::from("namespace = ?1");
    if query.user_id.is_some() {
        filter.push_str(" AND user_id = ?5");
    }
    if query.after.is_some() {
        // The plain comparison is the index range; SQLite does not seek on a row value over
        // an expression index (`coalesce(…)`), so the row value only settles ties.
        filter.push_str(&format!(
            " AND {sort} {cmp}= ?3 AND ({sort}, id) {cmp} (?3, ?4)"
        ));
    }
    format!(
        "SELECT {INFO_COLUMNS} FROM sessions INDEXED BY {index} WHERE {filter}
          ORDER BY {sort} {dir}, id {dir} LIMIT ?2"
    )
}

/// The record alone, for patching inside a write.
pub(crate) fn record(conn: &Connection, key: &SessionKey) -> Result<Option<SessionRecord>> {
    Ok(session_info(conn, key)?.map(|info| info.record))
}

pub(crate) fn save_record(
    conn: &Connection,
    key: &SessionKey,
    record: &SessionRecord,
) -> Result<()> {
    conn.prepare_cached(
        "UPDATE sessions SET name = ?3, parent_session_id = ?4, model = ?5, source = ?6,
                user_id = ?7, metadata = ?8, settings = ?9, end_reason = ?10,
                input_tokens = ?11, output_tokens = ?12, cost = ?13
          WHERE namespace = ?1 AND id = ?2",
    )
    .and_then(|mut stmt| {
        stmt.execute(params![
            key.namespace,
            key.session_id,
            record.name,
            record.parent_session_id,
            record.model,
            record.source,
            record.user_id,
            serde_json::Value::Object(record.metadata.clone()).to_string(),
            serde_json::Value::Object(record.settings.clone()).to_string(),
            record.end_reason,
            record.input_tokens as i64,
            record.output_tokens as i64,
            record.cost,
        ])
    })
    .map_err(backend_error)?;
    Ok(())
}

/// Removes every row of a session except its `sessions` row (which the caller handles).
pub(crate) fn delete_session_rows(
    conn: &Connection,
    session: &SessionRange<'_>,
    search_index: bool,
) -> Result<()> {
    delete_messages(conn, session, search_index)?;
    let key = session.key;
    for sql in [
        "DELETE FROM compactions WHERE namespace = ?1 AND session_id = ?2",
        "DELETE FROM session_state WHERE namespace = ?1 AND session_id = ?2",
        "DELETE FROM sessions WHERE namespace = ?1 AND id = ?2",
    ] {
        execute_for_session(conn, key, sql)?;
    }
    Ok(())
}

/// Removes a session's messages, their chunks and their search entries.
pub(crate) fn delete_messages(
    conn: &Connection,
    session: &SessionRange<'_>,
    search_index: bool,
) -> Result<()> {
    let key = session.key;
    let (first, last) = (session.first, session.last());
    if search_index {
        // The search table's key leads with the message id (see `schema::SEARCH_TABLES`), so a
        // session's entries are found through its message ids, before the messages go.
        conn.prepare_cached(
            "DELETE FROM message_search
              WHERE namespace = ?1 AND session_id = ?2
                AND message_id IN (SELECT id FROM messages WHERE k BETWEEN ?3 AND ?4)",
        )
        .and_then(|mut stmt| stmt.execute(params![key.namespace, key.session_id, first, last]))
        .map_err(backend_error)?;
    }
    conn.prepare_cached("DELETE FROM messages WHERE k BETWEEN ?1 AND ?2")
        .and_then(|mut stmt| stmt.execute(params![first, last]))
        .map_err(backend_error)?;
    execute_for_session(
        conn,
        key,
        "DELETE FROM message_chunks WHERE namespace = ?1 AND session_id = ?2",
    )
}

fn execute_for_session(conn: &Connection, key: &SessionKey, sql: &str) -> Result<()> {
    conn.prepare_cached(sql)
        .and_then(|mut stmt| stmt.execute(params![key.namespace, key.session_id]))
        .map_err(backend_error)?;
    Ok(())
}

pub(crate) fn add_compaction(conn: &Connection, key: &SessionKey, c: &Compaction) -> Result<()> {
    conn.prepare_cached(
        "INSERT INTO compactions (namespace, session_id, seq, id, summary, from_message_id,
                                  to_message_id, created_at)
         VALUES (?1, ?2, (SELECT coalesce(max(seq), 0) + 1 FROM compactions
                           WHERE namespace = ?1 AND session_id = ?2),
                 ?3, ?4, ?5, ?6, ?7)",
    )
    .and_then(|mut stmt| {
        stmt.execute(params![
            key.namespace,
            key.session_id,
            c.id,
            c.summary,
            c.from_message_id,
            c.to_message_id,
            c.created_at
        ])
    })
    .map_err(backend_error)?;
    Ok(())
}

pub(crate) fn compactions(conn: &Connection, key: &SessionKey) -> Result<Vec<Compaction>> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT id, summary, from_message_id, to_message_id, created_at FROM compactions
              WHERE namespace = ?1 AND session_id = ?2 ORDER BY seq",
        )
        .map_err(backend_error)?;
    stmt.query_map(params![key.namespace, key.session_id], |r| {
        Ok(Compaction {
            id: r.get(0)?,
            summary: r.get(1)?,
            from_message_id: r.get(2)?,
            to_message_id: r.get(3)?,
            created_at: r.get(4)?,
        })
    })
    .and_then(|rows| rows.collect())
    .map_err(backend_error)
}

pub(crate) fn put_state(
    conn: &Connection,
    key: &SessionKey,
    name: &str,
    value: &str,
) -> Result<()> {
    conn.prepare_cached(
        "INSERT INTO session_state (namespace, session_id, key, value) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (namespace, session_id, key) DO UPDATE SET value = excluded.value",
    )
    .and_then(|mut stmt| stmt.execute(params![key.namespace, key.session_id, name, value]))
    .map_err(backend_error)?;
    Ok(())
}

pub(crate) fn delete_state(conn: &Connection, key: &SessionKey, name: &str) -> Result<bool> {
    conn.prepare_cached(
        "DELETE FROM session_state WHERE namespace = ?1 AND session_id = ?2 AND key = ?3",
    )
    .and_then(|mut stmt| stmt.execute(params![key.namespace, key.session_id, name]))
    .map(|n| n > 0)
    .map_err(backend_error)
}

pub(crate) fn state(conn: &Connection, key: &SessionKey, name: &str) -> Result<Option<String>> {
    conn.prepare_cached(
        "SELECT value FROM session_state WHERE namespace = ?1 AND session_id = ?2 AND key = ?3",
    )
    .and_then(|mut stmt| {
        stmt.query_row(params![key.namespace, key.session_id, name], |r| r.get(0))
            .optional()
    })
    .map_err(backend_error)
}

pub(crate) fn state_entries(conn: &Connection, key: &SessionKey) -> Result<Vec<(String, String)>> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT key, value FROM session_state WHERE namespace = ?1 AND session_id = ?2
              ORDER BY key",
        )
        .map_err(backend_error)?;
    stmt.query_map(params![key.namespace, key.session_id], |r| {
        Ok((r.get(0)?, r.get(1)?))
    })
    .and_then(|rows| rows.collect())
    .map_err(backend_error)
}

pub(crate) fn search_namespace(
    conn: &Connection,
    namespace: &str,
    user_id: Option<&str>,
    words: &[String],
    filter: &SearchFilter,
    limit: usize,
) -> Result<Vec<SearchHit>> {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT s.message_id, s.role, s.session_id, m.content, m.content_chunks, m.created_at
               FROM message_fts
               JOIN message_search s ON s.rowid = message_fts.rowid
               JOIN sessions n ON n.namespace = s.namespace AND n.id = s.session_id
               JOIN messages m INDEXED BY messages_by_id
                 ON m.id = s.message_id AND m.k BETWEEN n.number << 32 AND (n.number << 32) + ?5
              WHERE message_fts MATCH ?1 AND s.namespace = ?2
                AND (?3 IS NULL OR n.user_id = ?3) AND {}
              ORDER BY bm25(message_fts), s.session_id, m.k
              LIMIT ?4",
            queries::search_filter(6)
        )
    });
    let mut stmt = conn.prepare_cached(&SQL).map_err(backend_error)?;
    search_hits(
        conn,
        namespace,
        &mut stmt,
        params![
            match_expression(words, filter.match_any),
            namespace,
            user_id,
            limit as i64,
            queries::MAX_SEQ,
            filter.role,
            filter.since_ms,
            filter.until_ms,
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use sessiondb_core::SessionCursor;

    /// The plan SQLite chooses for a listing, one line per step.
    fn plan(conn: &Connection, query: &SessionQuery) -> String {
        let mut stmt = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {}", list_sql(query)))
            .unwrap();
        let unbound = vec![rusqlite::types::Null; stmt.parameter_count()];
        let lines: Vec<String> = stmt
            .query_map(rusqlite::params_from_iter(unbound), |r| {
                r.get::<_, String>(3)
            })
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        lines.join("\n")
    }

    /// Every listing shape is a range on an index in its order: no table scan, no sort.
    #[test]
    fn listings_read_an_index_range_in_order() {
        let mut conn = Connection::open_in_memory().unwrap();
        crate::schema::migrate(&mut conn).unwrap();
        let sorts = [
            (SessionSort::LastMessageAt, "last_message"),
            (SessionSort::UpdatedAt, "updated"),
            (SessionSort::CreatedAt, "created"),
        ];
        for (sort, index) in sorts {
            for descending in [false, true] {
                for after in [
                    None,
                    Some(SessionCursor {
                        value: 5,
                        id: "s".into(),
                    }),
                ] {
                    for user_id in [None, Some("u-42".to_owned())] {
                        let query = SessionQuery {
                            sort,
                            descending,
                            after: after.clone(),
                            user_id: user_id.clone(),
                            limit: 21,
                        };
                        let plan = plan(&conn, &query);
                        let expected = match user_id {
                            Some(_) => format!("USING INDEX sessions_by_user_{index}"),
                            None => format!("USING INDEX sessions_by_{index}"),
                        };
                        assert!(plan.contains(&expected), "{query:?}:\n{plan}");
                        assert!(!plan.contains("TEMP B-TREE"), "{query:?} sorts:\n{plan}");
                        if user_id.is_some() {
                            assert!(plan.contains("user_id=?"), "{query:?}:\n{plan}");
                        }
                        if after.is_some() {
                            // Entered at the cursor, not read from the start of the index.
                            let range = if descending { ['<', '?'] } else { ['>', '?'] };
                            let seeks = plan.contains(&String::from_iter(range))
                                || plan.contains(&format!("{}(?", range[0]));
                            assert!(seeks, "{query:?}:\n{plan}");
                        }
                    }
                }
            }
        }
    }
}
