//! `SqliteStore::check`: SQLite's own integrity check, then the store's invariants that a
//! damaged file or a hand edit could break, each as a problem in words. Read-only, in one
//! snapshot; every query is a scan, so a large store takes a while.

use rusqlite::{Connection, params};
use sessiondb_core::StoreError;
use sessiondb_core::check::{RowCheck, SessionFacts};

use crate::backend_error;
use crate::queries::MAX_SEQ;

/// The query counting the rows that break `check` (`?1`, where a query has it, is the highest
/// seq).
fn count_sql(check: RowCheck) -> &'static str {
    match check {
        RowCheck::MessagesWithoutSession => {
            "SELECT count(*) FROM messages m
              WHERE NOT EXISTS (SELECT 1 FROM sessions s WHERE s.number = m.k >> 32)"
        }
        RowCheck::ParentLinkMismatch => {
            "SELECT count(*) FROM messages c
              WHERE c.parent_seq IS NOT NULL
                AND NOT EXISTS (SELECT 1 FROM messages p
                                 WHERE p.k = ((c.k >> 32) << 32) + c.parent_seq
                                   AND p.id IS c.parent_id)"
        }
        RowCheck::ParentNotLinked => {
            "SELECT count(*) FROM messages c
              WHERE c.parent_seq IS NULL AND c.parent_id IS NOT NULL
                AND EXISTS (SELECT 1 FROM messages p INDEXED BY messages_by_id
                             WHERE p.id = c.parent_id
                               AND p.k BETWEEN (c.k >> 32) << 32 AND ((c.k >> 32) << 32) + ?1)"
        }
        RowCheck::ReferencesWithoutPayload => {
            "SELECT count(*) FROM attachment_refs r
              WHERE NOT EXISTS (SELECT 1 FROM attachments a
                                 WHERE a.namespace = r.namespace AND a.hash = r.hash)"
        }
        RowCheck::PayloadsUnreferencedOrIncomplete => {
            "SELECT count(*) FROM attachments a
              WHERE (NOT EXISTS (SELECT 1 FROM attachment_refs r
                                  WHERE r.namespace = a.namespace AND r.hash = a.hash)
                     OR a.chunks <> (SELECT count(*) FROM attachment_chunks c
                                      WHERE c.namespace = a.namespace AND c.hash = a.hash))"
        }
    }
}

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
    for check in RowCheck::ALL {
        let mut stmt = conn.prepare(count_sql(check)).map_err(backend_error)?;
        let count: i64 = if stmt.parameter_count() == 1 {
            stmt.query_row(params![MAX_SEQ], |r| r.get(0))
        } else {
            stmt.query_row([], |r| r.get(0))
        }
        .map_err(backend_error)?;
        problems.extend(check.problem(count));
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
