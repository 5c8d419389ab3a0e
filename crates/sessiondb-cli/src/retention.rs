//! Deleting idle sessions while `sessiondb serve` runs (`--delete-idle-after`): a session whose
//! last write (`updatedAt`) is older than its namespace's time goes, with everything in it. The
//! plain time applies to every namespace the server's keys act in (the empty namespace without
//! keys); `NAMESPACE=TIME` sets one namespace's own.
//!
//! A sweep runs when the server starts and then every tenth of the shortest time (at least every
//! second, at most every hour), so a session goes at most that much later than it could. Each
//! delete checks the session's time again in the writer, so a session written while a sweep
//! runs stays; several servers on one PostgreSQL database may all sweep. A sweep starts after
//! the idle sessions the one before found kept (`keepWhenIdle`), and every tenth from the
//! oldest ([`IdleSweeper`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;

use sessiondb::{IdleSweep, IdleSweeper, Store};
use sessiondb_server::App;

/// How long sessions may stay idle: everywhere, and per namespace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetentionPlan {
    /// For every namespace the server serves without a time of its own.
    pub everywhere: Option<Duration>,
    pub by_namespace: BTreeMap<String, Duration>,
}

impl RetentionPlan {
    pub fn is_on(&self) -> bool {
        self.everywhere.is_some() || !self.by_namespace.is_empty()
    }

    /// Adds `TIME` (every namespace) or `NAMESPACE=TIME` (the namespace is all before the last
    /// `=`).
    pub fn add(&mut self, text: &str) -> anyhow::Result<()> {
        match text.rsplit_once('=') {
            Some((namespace, time)) => {
                sessiondb::SessionKey::new(namespace, "probe")
                    .with_context(|| format!("namespace `{namespace}` of `{text}`"))?;
                let idle = crate::backups::parse_interval(time)?;
                self.by_namespace.insert(namespace.to_owned(), idle);
            }
            None => self.everywhere = Some(crate::backups::parse_interval(text)?),
        }
        Ok(())
    }

    /// Each swept namespace and its time: the keys' namespaces (or the empty one) with the time
    /// for everywhere, then those named on their own.
    fn namespaces(&self, api_keys: &HashMap<String, String>) -> BTreeMap<String, Duration> {
        let mut swept = BTreeMap::new();
        if let Some(idle) = self.everywhere {
            if api_keys.is_empty() {
                swept.insert(String::new(), idle);
            }
            for namespace in api_keys.values() {
                swept.insert(namespace.clone(), idle);
            }
        }
        swept.extend(self.by_namespace.clone());
        swept
    }

    /// How often to sweep: a tenth of the shortest time, which keys never shorten (they all
    /// take the time for everywhere), so it holds across reloads of the keys.
    fn sweep_every(&self) -> Option<Duration> {
        let shortest = self
            .everywhere
            .into_iter()
            .chain(self.by_namespace.values().copied());
        shortest.min().map(sweep_every)
    }
}

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

/// Starts sweeping for idle sessions when the plan deletes any (`stats` is `Some` exactly then).
pub fn start<S: Store>(
    app: &Arc<App<S>>,
    plan: &RetentionPlan,
    stats: Option<&Arc<RetentionStats>>,
) {
    let (Some(every), Some(stats)) = (plan.sweep_every(), stats) else {
        return;
    };
    for (namespace, idle_after) in plan.namespaces(&app.in_force().api_keys) {
        tracing::info!(
            namespace,
            ?idle_after,
            "sessions idle longer than this are deleted"
        );
    }
    tokio::spawn(run(app.clone(), plan.clone(), every, stats.clone()));
}

/// Sweeps until the runtime stops, each time over the namespaces of the keys then in force.
async fn run<S: Store>(
    app: Arc<App<S>>,
    plan: RetentionPlan,
    every: Duration,
    stats: Arc<RetentionStats>,
) {
    let mut ticker = tokio::time::interval(every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut sweepers: BTreeMap<String, IdleSweeper> = BTreeMap::new();
    loop {
        ticker.tick().await;
        let namespaces = plan.namespaces(&app.in_force().api_keys);
        sweepers.retain(|namespace, _| namespaces.contains_key(namespace));
        for (namespace, idle_after) in namespaces {
            let cutoff = cutoff_ms(idle_after);
            let sweeper = sweepers.entry(namespace.clone()).or_default();
            match app
                .db
                .sweep_idle_sessions(&namespace, cutoff, sweeper)
                .await
            {
                Ok(IdleSweep { deleted: 0, .. }) => {}
                Ok(IdleSweep { deleted, .. }) => {
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
