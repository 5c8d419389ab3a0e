//! Planner statistics. Until a table is analyzed PostgreSQL guesses that `namespace = $1 AND
//! session_id = $2` matches about one row, and may then answer an id look-up by scanning the
//! whole session through another index, or walk a path by rescanning the session at every step
//! (measured: a 10,001-row path read took 54 s). Autovacuum analyzes eventually (a minute after
//! a change, and only after enough of them); the store analyzes itself where that is too late: a
//! new database once it holds messages, and the tables after a bulk write.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use deadpool_postgres::GenericClient;
use sessiondb_core::{StoreError, WriteOutcome};

use crate::sql::{Result, backend_error, get, row};

/// A request that inserts at least this many rows refreshes the statistics, at most once per
/// [`ANALYZE_INTERVAL`] per instance.
const ANALYZE_AFTER_ROWS: usize = 1000;
const ANALYZE_INTERVAL: Duration = Duration::from_secs(60);

/// Analyzes a new database as soon as it holds messages; returns whether statistics exist now.
pub(crate) async fn analyze_if_missing<C: GenericClient>(c: &C) -> Result<bool> {
    let state = row(
        c,
        "SELECT EXISTS (SELECT 1 FROM pg_stats
                         WHERE schemaname = current_schema() AND tablename = 'messages'),
                EXISTS (SELECT 1 FROM messages)",
        &[],
    )
    .await?
    .ok_or_else(|| StoreError::Corrupt("no answer".into()))?;
    let (has_stats, has_rows): (bool, bool) = (get(&state, 0)?, get(&state, 1)?);
    if has_stats {
        return Ok(true);
    }
    if has_rows {
        analyze(c).await?;
    }
    Ok(has_rows)
}

/// Refreshes the planner's statistics of the tables whose look-ups depend on them.
async fn analyze<C: GenericClient>(c: &C) -> Result<()> {
    c.batch_execute("ANALYZE messages, message_chunks, sessions, attachment_refs, feed")
        .await
        .map_err(backend_error)
}

/// When this instance last analyzed after a bulk write.
#[derive(Debug, Default)]
pub(crate) struct BulkAnalyze {
    analyzed_at: Mutex<Option<Instant>>,
}

impl BulkAnalyze {
    /// Analyzes after a committed request that inserted many rows (unless done lately).
    /// Statistics only steer plans: a failure leaves them as they were.
    pub(crate) async fn after<C: GenericClient>(&self, c: &C, outcomes: &[WriteOutcome]) {
        let inserted = outcomes
            .iter()
            .filter(|o| {
                matches!(
                    o,
                    WriteOutcome::Appended { inserted: true, .. } | WriteOutcome::Imported(Some(_))
                )
            })
            .count();
        if inserted < ANALYZE_AFTER_ROWS {
            return;
        }
        {
            let mut last = self.analyzed_at.lock().unwrap_or_else(|p| p.into_inner());
            if last.is_some_and(|at| at.elapsed() < ANALYZE_INTERVAL) {
                return;
            }
            *last = Some(Instant::now());
        }
        let _ = analyze(c).await;
    }
}
