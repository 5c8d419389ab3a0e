//! Deleting idle sessions while `sessiondb serve` runs (`--delete-idle-after`): a session whose
//! last write (`updatedAt`) is older than the given time goes, with everything in it, in every
//! namespace the server's keys act in (the empty namespace without keys).
//!
//! A sweep runs when the server starts and then every tenth of the idle time (at least every
//! second, at most every hour), so a session goes at most that much later than it could. Each
//! delete checks the session's time again in the writer, so a session written while a sweep
//! runs stays; several servers on one PostgreSQL database may all sweep.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sessiondb::Store;
use sessiondb_server::App;

/// Counters for `/metrics`.
#[derive(Debug, Default)]
pub struct RetentionStats {
    pub deleted: AtomicU64,
    pub failed_sweeps: AtomicU64,
}

impl RetentionStats {
    pub fn write_metrics(&self, out: &mut String) {
        use std::fmt::Write;
        let _ = writeln!(
            out,
            "# HELP sessiondb_idle_sessions_deleted_total Sessions deleted for being idle longer \
             than --delete-idle-after.\n\
             # TYPE sessiondb_idle_sessions_deleted_total counter\n\
             sessiondb_idle_sessions_deleted_total {}\n\
             # HELP sessiondb_idle_sweep_failures_total Sweeps for idle sessions that failed \
             (the next one tries again).\n\
             # TYPE sessiondb_idle_sweep_failures_total counter\n\
             sessiondb_idle_sweep_failures_total {}",
            self.deleted.load(Relaxed),
            self.failed_sweeps.load(Relaxed)
        );
    }
}

/// The time (epoch milliseconds) before which a session not written since has been idle for
/// `idle_after`.
pub fn cutoff_ms(idle_after: Duration) -> i64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    now.saturating_sub(idle_after).as_millis() as i64
}

/// How often sessions idle for `idle_after` are looked for.
pub fn sweep_every(idle_after: Duration) -> Duration {
    (idle_after / 10).clamp(Duration::from_secs(1), Duration::from_secs(3_600))
}

/// Starts sweeping for sessions idle longer than the plan's time, when there is a plan.
pub fn start<S: Store>(app: &Arc<App<S>>, plan: Option<(Duration, Arc<RetentionStats>)>) {
    if let Some((idle_after, stats)) = plan {
        tracing::info!(?idle_after, "sessions idle longer than this are deleted");
        tokio::spawn(run(app.clone(), idle_after, stats));
    }
}

/// Sweeps until the runtime stops.
async fn run<S: Store>(app: Arc<App<S>>, idle_after: Duration, stats: Arc<RetentionStats>) {
    let namespaces: BTreeSet<String> = if app.config.api_keys.is_empty() {
        BTreeSet::from([String::new()])
    } else {
        app.config.api_keys.values().cloned().collect()
    };
    let mut ticker = tokio::time::interval(sweep_every(idle_after));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let cutoff = cutoff_ms(idle_after);
        for namespace in &namespaces {
            match app
                .db
                .delete_sessions_updated_before(namespace, cutoff)
                .await
            {
                Ok(0) => {}
                Ok(deleted) => {
                    stats.deleted.fetch_add(deleted, Relaxed);
                    tracing::info!(namespace, deleted, "idle sessions deleted");
                }
                Err(error) => {
                    stats.failed_sweeps.fetch_add(1, Relaxed);
                    tracing::error!(namespace, "deleting idle sessions failed: {error}");
                }
            }
        }
    }
}
