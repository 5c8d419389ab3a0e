//! `SqliteStore::check`: SQLite's own integrity check, then the store's invariants that a
//! damaged file or a hand edit could break, each as a problem in words. Read-only, in one
//! snapshot; every query is a scan, so a large store takes a while.

use rusqlite::{Connection, params};
use sessiondb_core::StoreError;

use crate::backend_error;
use crate::queries::MAX_SEQ;

/// Counts of rows that break an invariant, each with what it says of them (`?1`, where a query
/// has it, is the highest seq).
const ROW_CHECKS: [(&str, &str); 5] = [
    (
        "messages belong to no session",
        "SELECT count(*) FROM messages m
          WHERE NOT EXISTS (SELECT 1 FROM sessions s WHERE s.number = m.k >> 32)",
    ),
    (
        "messages link to a parent row that is not the one they name",
        "SELECT count(*) FROM messages c
          WHERE c.parent_seq IS NOT NULL
            AND NOT EXISTS (SELECT 1 FROM messages p
                             WHERE p.k = ((c.k >> 32) << 32) + c.parent_seq
                               AND p.id IS c.parent_id)",
    ),
    (
        "messages name a parent in their session without linking to it",
        "SELECT count(*) FROM messages c
          WHERE c.parent_seq IS NULL AND c.parent_id IS NOT NULL
            AND EXISTS (SELECT 1 FROM messages p INDEXED BY messages_by_id
                         WHERE p.id = c.parent_id
                           AND p.k BETWEEN (c.k >> 32) << 32 AND ((c.k >> 32) << 32) + ?1)",
    ),
    (
        "attachment references name no stored payload",
        "SELECT count(*) FROM attachment_refs r
          WHERE NOT EXISTS (SELECT 1 FROM attachments a
                             WHERE a.namespace = r.namespace AND a.hash = r.hash)",
    ),
    (
        "attachment payloads have no reference or not all their chunks",
        "SELECT count(*) FROM attachments a
          WHERE (NOT EXISTS (SELECT 1 FROM attachment_refs r
                              WHERE r.namespace = a.namespace AND r.hash = a.hash)
                 OR a.chunks <> (SELECT count(*) FROM attachment_chunks c
                                  WHERE c.namespace = a.namespace AND c.hash = a.hash))",
    ),
];

/// Every problem found, in words; none for a sound store.
pub(crate) fn problems(conn: &Connection) -> Result<Vec<String>, StoreError> {
    let mut problems = Vec::new();
    let mut integrity = conn
        .prepare("PRAGMA integrity_check(20)")
        .map_err(backend_error)?;
    let lines = integrity
        .query_map([], |r| r.get::<_, String>(0))
        .map_err(backend_error)?;
    for line in lines {
        let line = line.map_err(backend_error)?;
        if line != "ok" {
            problems.push(format!("SQLite: {line}"));
        }
    }
    for (what, sql) in ROW_CHECKS {
        let mut stmt = conn.prepare(sql).map_err(backend_error)?;
        let count: i64 = if stmt.parameter_count() == 1 {
            stmt.query_row(params![MAX_SEQ], |r| r.get(0))
        } else {
            stmt.query_row([], |r| r.get(0))
        }
        .map_err(backend_error)?;
        if count > 0 {
            problems.push(format!("{count} {what}"));
        }
    }
    let mut sessions = conn
        .prepare(
            "SELECT s.namespace, s.id, s.stored_messages, s.next_seq, s.leaf_id, s.leaf_seq,
                    count(m.k), max(m.k & ?1),
                    (SELECT l.id FROM messages l WHERE l.k = (s.number << 32) + s.leaf_seq)
               FROM sessions s
               LEFT JOIN messages m ON m.k BETWEEN s.number << 32 AND (s.number << 32) + ?1
              GROUP BY s.namespace, s.id",
        )
        .map_err(backend_error)?;
    let rows = sessions
        .query_map(params![MAX_SEQ], |r| {
            Ok(SessionFacts {
                namespace: r.get(0)?,
                id: r.get(1)?,
                stored_messages: r.get(2)?,
                next_seq: r.get(3)?,
                leaf_id: r.get(4)?,
                leaf_seq: r.get(5)?,
                rows: r.get(6)?,
                highest_seq: r.get(7)?,
                leaf_row_id: r.get(8)?,
            })
        })
        .map_err(backend_error)?;
    for facts in rows {
        facts.map_err(backend_error)?.problems(&mut problems);
    }
    Ok(problems)
}

/// What the session row says and what its messages are.
struct SessionFacts {
    namespace: String,
    id: String,
    stored_messages: i64,
    next_seq: i64,
    leaf_id: Option<String>,
    leaf_seq: Option<i64>,
    rows: i64,
    highest_seq: Option<i64>,
    /// The id of the row at the session's leaf seq.
    leaf_row_id: Option<String>,
}

impl SessionFacts {
    fn problems(&self, problems: &mut Vec<String>) {
        let name = match self.namespace.as_str() {
            "" => format!("session `{}`", self.id),
            namespace => format!("session `{}` of namespace `{namespace}`", self.id),
        };
        if self.stored_messages != self.rows {
            problems.push(format!(
                "{name} counts {} messages and holds {}",
                self.stored_messages, self.rows
            ));
        }
        if self.highest_seq.is_some_and(|seq| seq >= self.next_seq) {
            problems.push(format!(
                "{name} would give seq {} again (its highest is {})",
                self.next_seq,
                self.highest_seq.unwrap_or_default()
            ));
        }
        if let Some(leaf) = &self.leaf_id
            && self.leaf_row_id.as_ref() != Some(leaf)
        {
            problems.push(format!(
                "{name} has active leaf `{leaf}` at seq {:?}, where no such message is",
                self.leaf_seq
            ));
        }
    }
}
