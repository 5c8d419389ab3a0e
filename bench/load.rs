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
                let connection = Connection::open(&base).await;
                send_until(connection, c, concurrency, deadline, load).await
            })
        })
        .collect()
}

/// [`clients`], all on one HTTP/2 connection, each request a stream of its own.
pub async fn http2_clients(
    base: &str,
    concurrency: usize,
    deadline: Instant,
    load: Load,
) -> Vec<tokio::task::JoinHandle<Vec<Duration>>> {
    let connection = Http2Connection::open(base).await;
    (0..concurrency)
        .map(|c| {
            let connection = connection.clone();
            tokio::spawn(send_until(connection, c, concurrency, deadline, load))
        })
        .collect()
}

/// Client `c`'s requests until the deadline; their latencies.
async fn send_until(
    mut requests: impl Requests,
    c: usize,
    concurrency: usize,
    deadline: Instant,
    load: Load,
) -> Vec<Duration> {
    let path = format!("/v1/sessions/c{concurrency}-{c}/messages");
    let mut latencies = Vec::new();
    let mut i = 0;
    while Instant::now() < deadline {
        let started = Instant::now();
        let status = match load {
            Load::Appends => {
                let body = json!({"id": format!("m{i}"), "role": "user",
                    "parts": [{"type": "text", "text": format!("message {i} from client {c}")}]});
                requests.send("POST", &path, Some(&body.to_string())).await
            }
            Load::Health => requests.send("GET", "/healthz", None).await,
            Load::LastFifty => {
                let last_fifty = "/v1/sessions/long/messages?order=desc&limit=50";
                requests.send("GET", last_fifty, None).await
            }
        };
        assert!((200..300).contains(&status), "status {status}");
        latencies.push(started.elapsed());
        i += 1;
    }
    latencies
}

/// Sends a request and reads its whole response; returns the status.
trait Requests: Send + 'static {
    fn send(
        &mut self,
        method: &str,
        path: &str,
        json: Option<&str>,
    ) -> impl std::future::Future<Output = u16> + Send;
}

/// A keep-alive HTTP/1.1 connection that sends one request at a time and reads the whole
/// response. It does only what the load needs (responses carry `Content-Length`), so the load
/// generator, which shares the machine's cores with the server, costs as little as it can: a
/// full HTTP client took ~40% of the CPU at 64 clients.
struct Connection {
    stream: Box<dyn Stream>,
    request: Vec<u8>,
    response: Vec<u8>,
}

/// A connection's bytes: plain TCP, or TLS over it.
trait Stream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Stream for T {}

/// The certificate a benchmark serves HTTPS with (the server tests' self-signed one) and the
/// key to it.
pub const TLS_CERT: &[u8] = include_bytes!("../crates/sessiondb-server/tests/tls/first-cert.pem");
pub const TLS_KEY: &[u8] = include_bytes!("../crates/sessiondb-server/tests/tls/first-key.pem");

/// One client configuration for every connection, trusting [`TLS_CERT`] alone: building one
/// loads the system's certificate store unless told not to, ~40 ms a connection here, which
/// would be measured as the server's. `http2`: asks for HTTP/2 by ALPN.
fn tls_connector(http2: bool) -> &'static tokio_native_tls::TlsConnector {
    use tokio_native_tls::native_tls::{Certificate, TlsConnector};
    type Once = std::sync::OnceLock<tokio_native_tls::TlsConnector>;
    static HTTP1: Once = Once::new();
    static HTTP2: Once = Once::new();
    let alpn: &[&str] = if http2 { &["h2"] } else { &[] };
    (if http2 { &HTTP2 } else { &HTTP1 }).get_or_init(|| {
        let connector = TlsConnector::builder()
            .disable_built_in_roots(true)
            .add_root_certificate(Certificate::from_pem(TLS_CERT).unwrap())
            .request_alpns(alpn)
            .build()
            .unwrap();
        connector.into()
    })
}

/// A TCP connection to `base` (`http://` or, trusting [`TLS_CERT`], `https://`).
async fn connect(base: &str, http2: bool) -> Box<dyn Stream> {
    let (tls, address) = match base.strip_prefix("https://") {
        Some(address) => (true, address),
        None => (false, base.strip_prefix("http://").expect("an http(s) URL")),
    };
    let tcp = tokio::net::TcpStream::connect(address).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    if tls {
        let connector = tls_connector(http2);
        Box::new(connector.connect("localhost", tcp).await.unwrap())
    } else {
        Box::new(tcp)
    }
}

impl Connection {
    async fn open(base: &str) -> Self {
        Self {
            stream: connect(base, false).await,
            request: Vec::new(),
            response: Vec::new(),
        }
    }

    async fn read_more(&mut self) {
        use tokio::io::AsyncReadExt;
        let mut chunk = [0u8; 16 * 1024];
        let n = self.stream.read(&mut chunk).await.unwrap();
        assert!(n > 0, "the server closed the connection");
        self.response.extend_from_slice(&chunk[..n]);
    }
}

impl Requests for Connection {
    async fn send(&mut self, method: &str, path: &str, json: Option<&str>) -> u16 {
        use std::io::Write;
        use tokio::io::AsyncWriteExt;
        self.request.clear();
        write!(self.request, "{method} {path} HTTP/1.1\r\nHost: bench\r\n").unwrap();
        if let Some(json) = json {
            write!(
                self.request,
                "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{json}",
                json.len()
            )
            .unwrap();
        } else {
            self.request.extend_from_slice(b"\r\n");
        }
        self.stream.write_all(&self.request).await.unwrap();
        self.response.clear();
        let head_end = loop {
            if let Some(at) = self.response.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            self.read_more().await;
        };
        let head = std::str::from_utf8(&self.response[..head_end]).unwrap();
        let status: u16 = head[9..12].parse().unwrap();
        let length: usize = head
            .lines()
            .find_map(|line| {
                let (name, value) = line.split_once(':')?;
                name.eq_ignore_ascii_case("content-length")
                    .then(|| value.trim().parse().unwrap())
            })
            .expect("a response with Content-Length");
        while self.response.len() < head_end + length {
            self.read_more().await;
        }
        assert_eq!(
            self.response.len(),
            head_end + length,
            "one response at a time"
        );
        status
    }
}

/// An HTTP/2 connection (hyper's client, with prior knowledge in clear text, by ALPN over TLS);
/// clones share it.
#[derive(Clone)]
struct Http2Connection {
    sender: hyper::client::conn::http2::SendRequest<String>,
}

impl Http2Connection {
    async fn open(base: &str) -> Self {
        let io = hyper_util::rt::TokioIo::new(connect(base, true).await);
        let (sender, connection) =
            hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
                .await
                .unwrap();
        tokio::spawn(connection);
        Self { sender }
    }
}

impl Requests for Http2Connection {
    async fn send(&mut self, method: &str, path: &str, json: Option<&str>) -> u16 {
        use hyper::body::Body as _;
        let mut request = hyper::Request::builder()
            .method(method)
            .uri(format!("http://bench{path}"));
        if json.is_some() {
            request = request.header("content-type", "application/json");
        }
        let request = request.body(json.unwrap_or_default().to_owned()).unwrap();
        self.sender.ready().await.unwrap();
        let response = self.sender.send_request(request).await.unwrap();
        let status = response.status().as_u16();
        let mut body = response.into_body();
        while let Some(frame) =
            std::future::poll_fn(|cx| std::pin::Pin::new(&mut body).poll_frame(cx)).await
        {
            frame.unwrap();
        }
        status
    }
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
    serve_over(runtime, db, false)
}

/// [`serve`], over HTTPS with [`TLS_CERT`] when `tls`.
pub fn serve_over<S: Store>(runtime: &tokio::runtime::Runtime, db: Db<S>, tls: bool) -> String {
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
    let address = listener.local_addr().unwrap();
    let never = std::future::pending::<()>();
    if tls {
        let tls = sessiondb_server::Tls::from_pem(TLS_CERT, TLS_KEY).unwrap();
        runtime.spawn(sessiondb_server::serve_tls(listener, tls, app, never));
        format!("https://{address}")
    } else {
        runtime.spawn(sessiondb_server::serve(listener, app, never));
        format!("http://{address}")
    }
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
