//! Prometheus metrics in the text exposition format, kept in plain atomics and one map.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds (seconds) of the request latency histogram.
const LATENCY_BUCKETS: [f64; 12] = [
    0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0,
];

#[derive(Debug, Default)]
struct RouteStats {
    by_status: BTreeMap<u16, u64>,
    /// Cumulative counts per bucket of [`LATENCY_BUCKETS`].
    buckets: [u64; LATENCY_BUCKETS.len()],
    count: u64,
    sum_seconds: f64,
}

/// Writes backend-specific metrics (e.g. group-commit batch sizes) into the exposition.
pub type BackendMetrics = Box<dyn Fn(&mut String) + Send + Sync>;

#[derive(Default)]
pub struct Metrics {
    routes: Mutex<BTreeMap<(String, String), RouteStats>>,
    appended_messages: AtomicU64,
    appended_bytes: AtomicU64,
    pub(crate) live_subscribers: AtomicI64,
    accepted_connections: AtomicU64,
    open_connections: AtomicI64,
    reloads: AtomicU64,
    reload_failures: AtomicU64,
    backend: Option<BackendMetrics>,
}

/// Counts its connection as open until dropped (the connection's task ended or was cancelled).
pub(crate) struct OpenConnection<'a>(&'a Metrics);

impl Drop for OpenConnection<'_> {
    fn drop(&mut self) {
        self.0.open_connections.fetch_sub(1, Ordering::Relaxed);
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// Metrics that also expose the backend's own numbers.
    pub fn with_backend(backend: BackendMetrics) -> Self {
        Self {
            backend: Some(backend),
            ..Self::default()
        }
    }

    pub fn record_request(&self, method: &str, route: &str, status: u16, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        let mut routes = self.routes.lock().unwrap_or_else(|p| p.into_inner());
        let stats = routes
            .entry((method.to_owned(), route.to_owned()))
            .or_default();
        *stats.by_status.entry(status).or_default() += 1;
        stats.count += 1;
        stats.sum_seconds += seconds;
        for (bound, count) in LATENCY_BUCKETS.iter().zip(stats.buckets.iter_mut()) {
            if seconds <= *bound {
                *count += 1;
            }
        }
    }

    pub(crate) fn connection_opened(&self) -> OpenConnection<'_> {
        self.accepted_connections.fetch_add(1, Ordering::Relaxed);
        self.open_connections.fetch_add(1, Ordering::Relaxed);
        OpenConnection(self)
    }

    /// A reload of the configuration (SIGHUP): put in force, or refused (what was in force
    /// stays).
    pub fn record_reload(&self, succeeded: bool) {
        let counter = if succeeded {
            &self.reloads
        } else {
            &self.reload_failures
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn record_append(&self, bytes: u64) {
        self.appended_messages.fetch_add(1, Ordering::Relaxed);
        self.appended_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        let routes = self.routes.lock().unwrap_or_else(|p| p.into_inner());
        out.push_str("# HELP sessiondb_http_requests_total HTTP requests by route and status.\n");
        out.push_str("# TYPE sessiondb_http_requests_total counter\n");
        for ((method, route), stats) in routes.iter() {
            for (status, count) in &stats.by_status {
                let _ = writeln!(
                    out,
                    "sessiondb_http_requests_total{{method=\"{method}\",route=\"{route}\",status=\"{status}\"}} {count}"
                );
            }
        }
        out.push_str(
            "# HELP sessiondb_http_request_duration_seconds HTTP request latency by route.\n",
        );
        out.push_str("# TYPE sessiondb_http_request_duration_seconds histogram\n");
        for ((method, route), stats) in routes.iter() {
            let labels = format!("method=\"{method}\",route=\"{route}\"");
            for (bound, count) in LATENCY_BUCKETS.iter().zip(stats.buckets.iter()) {
                let _ = writeln!(
                    out,
                    "sessiondb_http_request_duration_seconds_bucket{{{labels},le=\"{bound}\"}} {count}"
                );
            }
            let _ = writeln!(
                out,
                "sessiondb_http_request_duration_seconds_bucket{{{labels},le=\"+Inf\"}} {}\n\
                 sessiondb_http_request_duration_seconds_sum{{{labels}}} {}\n\
                 sessiondb_http_request_duration_seconds_count{{{labels}}} {}",
                stats.count, stats.sum_seconds, stats.count
            );
        }
        drop(routes);
        let _ = writeln!(
            out,
            "# HELP sessiondb_appended_messages_total Messages stored by appends.\n\
             # TYPE sessiondb_appended_messages_total counter\n\
             sessiondb_appended_messages_total {}\n\
             # HELP sessiondb_appended_bytes_total Message bytes stored by appends.\n\
             # TYPE sessiondb_appended_bytes_total counter\n\
             sessiondb_appended_bytes_total {}\n\
             # HELP sessiondb_live_subscribers Open change-feed streams.\n\
             # TYPE sessiondb_live_subscribers gauge\n\
             sessiondb_live_subscribers {}\n\
             # HELP sessiondb_http_connections_accepted_total HTTP connections accepted.\n\
             # TYPE sessiondb_http_connections_accepted_total counter\n\
             sessiondb_http_connections_accepted_total {}\n\
             # HELP sessiondb_http_connections_open HTTP connections open, kept ones included.\n\
             # TYPE sessiondb_http_connections_open gauge\n\
             sessiondb_http_connections_open {}\n\
             # HELP sessiondb_reloads_total Reloads of the API keys and TLS certificate (SIGHUP) put in force.\n\
             # TYPE sessiondb_reloads_total counter\n\
             sessiondb_reloads_total {}\n\
             # HELP sessiondb_reload_failures_total Reloads refused (what was in force stayed).\n\
             # TYPE sessiondb_reload_failures_total counter\n\
             sessiondb_reload_failures_total {}",
            self.appended_messages.load(Ordering::Relaxed),
            self.appended_bytes.load(Ordering::Relaxed),
            self.live_subscribers.load(Ordering::Relaxed),
            self.accepted_connections.load(Ordering::Relaxed),
            self.open_connections.load(Ordering::Relaxed),
            self.reloads.load(Ordering::Relaxed),
            self.reload_failures.load(Ordering::Relaxed),
        );
        if let Some(backend) = &self.backend {
            backend(&mut out);
        }
        out
    }
}
