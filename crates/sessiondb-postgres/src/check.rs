//! `check_database`: the store's invariants that a hand edit or a failed tool could break, each
//! as a problem in words (`sessiondb_core::check`), read in one snapshot. PostgreSQL checks its
//! own pages and indexes (`amcheck`); every query here is a scan, so a large store takes a
//! while.

use deadpool_postgres::GenericClient;
use sessiondb_core::check::{RowCheck, SessionFacts};

use crate::sql::{Result, get, row, rows};

/// The query counting the rows that break `check`.
fn count_sql(check: RowCheck) -> &'static str {
    match check {
        RowCheck::MessagesWithoutSession => {
            "SELECT count(*) FROM messages m
              WHERE NOT EXISTS (SELECT 1 FROM sessions s
                                 WHERE s.namespace = m.namespace AND s.id = m.session_id)"
        }
        RowCheck::ParentLinkMismatch => {
            "SELECT count(*) FROM messages c
              WHERE c.parent_seq IS NOT NULL
                AND NOT EXISTS (SELECT 1 FROM messages p
                                 WHERE (p.namespace, p.session_id, p.seq)
                                       = (c.namespace, c.session_id, c.parent_seq)
                                   AND p.id IS NOT DISTINCT FROM c.parent_id)"
        }
        RowCheck::ParentNotLinked => {
            "SELECT count(*) FROM messages c
              WHERE c.parent_seq IS NULL AND c.parent_id IS NOT NULL
                AND EXISTS (SELECT 1 FROM messages p
                             WHERE (p.namespace, p.session_id, p.id)
                                   = (c.namespace, c.session_id, c.parent_id))"
        }
        RowCheck::ReferencesWithoutPayload => {
            "SELECT count(*) FROM attachment_refs r
              WHERE NOT EXISTS (SELECT 1 FROM attachments a
                                 WHERE (a.namespace, a.hash) = (r.namespace, r.hash))"
        }
        RowCheck::PayloadsUnreferencedOrIncomplete => {
            "SELECT count(*) FROM attachments a
              WHERE NOT EXISTS (SELECT 1 FROM attachment_refs r
                                 WHERE (r.namespace, r.hash) = (a.namespace, a.hash))
                 OR a.chunks <> (SELECT count(*) FROM attachment_chunks c
                                  WHERE (c.namespace, c.hash) = (a.namespace, a.hash))"
        }
    }
}

/// Every problem found, in words; none for a sound store.
pub(crate) async fn problems<C: GenericClient>(c: &C) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    for check in RowCheck::ALL {
        let counted = row(c, count_sql(check), &[]).await?;
        let count: i64 = counted
            .as_ref()
            .map(|r| get(r, 0))
            .transpose()?
            .unwrap_or(0);
        problems.extend(check.problem(count));
    }
    let sessions = rows(
        c,
        "SELECT s.namespace, s.id, s.stored_messages, s.next_seq, s.leaf_id, s.leaf_seq,
                count(m.seq), max(m.seq),
                (SELECT l.id FROM messages l
                  WHERE (l.namespace, l.session_id, l.seq) = (s.namespace, s.id, s.leaf_seq))
           FROM sessions s
           LEFT JOIN messages m ON (m.namespace, m.session_id) = (s.namespace, s.id)
          GROUP BY s.namespace, s.id",
        &[],
    )
    .await?;
    for r in &sessions {
        let facts = SessionFacts {
            namespace: get(r, 0)?,
            id: get(r, 1)?,
            stored_messages: get(r, 2)?,
            next_seq: get(r, 3)?,
            leaf_id: get(r, 4)?,
            leaf_seq: get(r, 5)?,
            rows: get(r, 6)?,
            highest_seq: get(r, 7)?,
            leaf_row_id: get(r, 8)?,
        };
        facts.problems(&mut problems);
    }
    Ok(problems)
}
