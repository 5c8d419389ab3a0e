//! Vacuuming the embedded store while `sessiondb serve` runs: on SIGUSR2 (`kill -USR2 <pid>`)
//! the server rewrites its database without free pages, as `sessiondb vacuum` does on a store no
//! server holds. Writes wait for it (they queue, and go on afterwards), reads go on; requests
//! that arrive while one runs are served by the next.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use sessiondb::SqliteStore;
use sessiondb_server::App;

use crate::signals::Requests;

/// Counters for `/metrics`.
#[derive(Debug, Default)]
pub struct VacuumStats {
    pub done: AtomicU64,
    pub failed: AtomicU64,
}

impl VacuumStats {
    pub fn write_metrics(&self, out: &mut String) {
        use std::fmt::Write;
        let _ = writeln!(
            out,
            "# HELP sessiondb_vacuums_total Vacuums run while serving (SIGUSR2).\n\
             # TYPE sessiondb_vacuums_total counter\n\
             sessiondb_vacuums_total {}\n\
             # HELP sessiondb_vacuum_failures_total Vacuums that failed (the file stays as it \
             was; serving went on).\n\
             # TYPE sessiondb_vacuum_failures_total counter\n\
             sessiondb_vacuum_failures_total {}",
            self.done.load(Relaxed),
            self.failed.load(Relaxed)
        );
    }
}

/// Runs a vacuum at each request until the runtime stops.
pub async fn on_request(
    mut requests: Requests,
    app: Arc<App<SqliteStore>>,
    stats: Arc<VacuumStats>,
) {
    loop {
        requests.next().await;
        let app = app.clone();
        let outcome = tokio::task::spawn_blocking(move || app.db.store().vacuum()).await;
        match outcome {
            Ok(Ok(vacuumed)) => {
                stats.done.fetch_add(1, Relaxed);
                tracing::info!(
                    bytes_before = vacuumed.bytes_before,
                    bytes_after = vacuumed.bytes_after,
                    "vacuumed"
                );
            }
            Ok(Err(error)) => {
                stats.failed.fetch_add(1, Relaxed);
                tracing::error!("vacuum failed: {error}");
            }
            Err(panic) => {
                stats.failed.fetch_add(1, Relaxed);
                tracing::error!("vacuum failed: it panicked: {panic}");
            }
        }
    }
}
