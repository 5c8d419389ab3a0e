//! Load generation shared by the HTTP benchmarks: keep-alive clients on their own connections.
//! Each benchmark uses a part of it.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use serde_json::json;
use sessiondb::{Db, Store};
use sessiondb_server::{App, Limits, Metrics, ServerConfig};

pub fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index].as_secs_f64() * 1000.0
}

/// What each client sends.
#[derive(Clone, Copy, PartialEq)]
pub enum Load {
    /// Appends to the client's own session.
    Appends,
    /// `GET /healthz`: the HTTP stack alone, the ceiling for any route on this machine.
    Health,
    /// The newest 50 messages of the session `long` (`GET …/messages?order=desc&limit=50`).
    LastFifty,
}

/// Starts `concurrency` clients, each on its own keep-alive connection, sending until the
/// deadline; each task returns its request latencies.
pub fn clients(
    base: &str,
    concurrency: usize,
    deadline: Instant,
    load: Load,
) -> Vec<tokio::task::JoinHandle<Vec<Duration>>> {
    (0..concurrency)
        .map(|c| {
            let base = base.to_owned();
            tokio::spawn(async move {
                let client = reqwest::Client::builder()
                    .pool_max_idle_per_host(1)
                    .build()
                    .unwrap();
                let url = format!("{base}/v1/sessions/c{concurrency}-{c}/messages");
                let health = format!("{base}/healthz");
                let last_fifty = format!("{base}/v1/sessions/long/messages?order=desc&limit=50");
                let mut latencies = Vec::new();
                let mut i = 0;
                while Instant::now() < deadline {
                    let started = Instant::now();
                    let response = match load {
                        Load::Appends => {
                            let body = json!({"id": format!("m{i}"), "role": "user",
                                "parts": [{"type": "text", "text": format!("message {i} from client {c}")}]});
                            client.post(&url).json(&body).send().await.unwrap()
                        }
                        Load::Health => client.get(&health).send().await.unwrap(),
                        Load::LastFifty => client.get(&last_fifty).send().await.unwrap(),
                    };
                    assert!(response.status().is_success());
                    response.bytes().await.unwrap();
                    latencies.push(started.elapsed());
                    i += 1;
                }
                latencies
            })
        })
        .collect()
}

/// Appends 10,000 messages to the session `long`, 500 per batch request.
pub async fn fill_long(base: &str) {
    let client = reqwest::Client::new();
    for start in (0..10_000).step_by(500) {
        let messages: Vec<_> = (start..start + 500)
            .map(|i| json!({"id": format!("m{i}"), "role": if i % 2 == 0 { "user" } else { "assistant" },
                "parts": [{"type": "text", "text": format!("message {i} of a long conversation about benchmarks")}]}))
            .collect();
        let r = client
            .post(format!("{base}/v1/sessions/long/messages/batch"))
            .json(&json!({"messages": messages}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
    }
}

/// Serves `db` on a loopback port from `runtime` (no per-session message limit); returns the
/// base URL.
pub fn serve<S: Store>(runtime: &tokio::runtime::Runtime, db: Db<S>) -> String {
    let config = ServerConfig {
        limits: Limits {
            max_messages_per_session: u64::MAX,
            ..Limits::default()
        },
        ..ServerConfig::default()
    };
    let app = App::new(db, config, Metrics::default());
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    runtime.spawn(sessiondb_server::serve(
        listener,
        app,
        std::future::pending::<()>(),
    ));
    base
}

/// The server's runtime as `sessiondb serve` builds it: 4 workers per core (`WORKERS=n` to vary).
pub fn server_runtime() -> tokio::runtime::Runtime {
    let workers = std::env::var("WORKERS")
        .ok()
        .and_then(|w| w.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(4, |n| n.get() * 4));
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .unwrap()
}
