//! The API over TLS (`serve_tls`), with a certificate replaced while serving: new connections
//! get the new one, open ones keep theirs, and an unusable replacement (not PEM, or a key that
//! is not the certificate's) changes nothing. A client that asks for HTTP/2 by ALPN gets it.

use std::net::SocketAddr;

use reqwest::{Method, StatusCode};
use sessiondb::{Db, SqliteStore};
use sessiondb_server::{App, Metrics, ServerConfig, ServerError, Tls};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_native_tls::TlsStream;
use tokio_native_tls::native_tls::{Certificate, TlsConnector};

use crate::common::Http2;

const FIRST_CERT: &[u8] = include_bytes!("../tls/first-cert.pem");
const FIRST_KEY: &[u8] = include_bytes!("../tls/first-key.pem");
const SECOND_CERT: &[u8] = include_bytes!("../tls/second-cert.pem");
const SECOND_KEY: &[u8] = include_bytes!("../tls/second-key.pem");

struct TlsServer {
    address: SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    stopped: tokio::task::JoinHandle<std::io::Result<()>>,
    _dir: tempfile::TempDir,
}

async fn start_tls(tls: Tls) -> TlsServer {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::new(SqliteStore::open(dir.path()).unwrap());
    let app = App::new(db, ServerConfig::default(), Metrics::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (stop, stopping) = tokio::sync::oneshot::channel::<()>();
    let stopped = tokio::spawn(sessiondb_server::serve_tls(listener, tls, app, async {
        let _ = stopping.await;
    }));
    TlsServer {
        address,
        stop,
        stopped,
        _dir: dir,
    }
}

/// A TLS connection to `address` that trusts only `trusted`.
async fn connect(
    address: SocketAddr,
    trusted: &[u8],
) -> Result<TlsStream<TcpStream>, tokio_native_tls::native_tls::Error> {
    connect_asking(address, trusted, &[]).await
}

/// [`connect`], offering the application protocols `alpn` (most wanted first).
async fn connect_asking(
    address: SocketAddr,
    trusted: &[u8],
    alpn: &[&str],
) -> Result<TlsStream<TcpStream>, tokio_native_tls::native_tls::Error> {
    let connector = TlsConnector::builder()
        .add_root_certificate(Certificate::from_pem(trusted).unwrap())
        .request_alpns(alpn)
        .build()
        .unwrap();
    let tcp = TcpStream::connect(address).await.unwrap();
    tokio_native_tls::TlsConnector::from(connector)
        .connect("localhost", tcp)
        .await
}

/// Sends `GET /healthz` on a kept connection and reads its answer (a fixed-length body).
async fn health(stream: &mut TlsStream<TcpStream>) -> String {
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let mut buffer = [0; 4096];
    while !String::from_utf8_lossy(&answer).contains("\"ok\"") {
        let n = stream.read(&mut buffer).await.unwrap();
        assert!(n > 0, "closed before answering: {answer:?}");
        answer.extend_from_slice(&buffer[..n]);
    }
    String::from_utf8(answer).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_over_tls_and_takes_a_renewed_certificate_without_a_restart() {
    let tls = Tls::from_pem(FIRST_CERT, FIRST_KEY).unwrap();
    let server = start_tls(tls.clone()).await;
    let address = server.address;
    let mut kept = connect(address, FIRST_CERT).await.unwrap();
    assert!(health(&mut kept).await.starts_with("HTTP/1.1 200 OK"));
    assert!(connect(address, SECOND_CERT).await.is_err());

    tls.replace_pem(SECOND_CERT, SECOND_KEY).unwrap();
    let mut renewed = connect(address, SECOND_CERT).await.unwrap();
    assert!(health(&mut renewed).await.starts_with("HTTP/1.1 200 OK"));
    assert!(connect(address, FIRST_CERT).await.is_err());
    // The connection opened before keeps its session.
    assert!(health(&mut kept).await.starts_with("HTTP/1.1 200 OK"));

    match tls.replace_pem(FIRST_CERT, b"not a key") {
        Err(ServerError::Tls { reason }) => assert!(!reason.is_empty()),
        other => panic!("{other:?}"),
    }
    assert!(Tls::from_pem(b"not a certificate", FIRST_KEY).is_err());
    match tls.replace_pem(SECOND_CERT, FIRST_KEY) {
        Err(ServerError::Tls { reason }) => assert!(reason.contains("handshake"), "{reason}"),
        other => panic!("a key that is not the certificate's: {other:?}"),
    }
    let mut still = connect(address, SECOND_CERT).await.unwrap();
    assert!(health(&mut still).await.starts_with("HTTP/1.1 200 OK"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_to_a_tls_server_gets_no_answer() {
    let server = start_tls(Tls::from_pem(FIRST_CERT, FIRST_KEY).unwrap()).await;
    let mut plain = TcpStream::connect(server.address).await.unwrap();
    plain
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let _ = plain.read_to_end(&mut answer).await;
    assert!(
        !String::from_utf8_lossy(&answer).contains("HTTP/1.1"),
        "{answer:?}"
    );
}

/// A client that opened a connection and never began its handshake does not hold up a stopping
/// server (the handshake's own limit is the request-head timeout, a minute by default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_handshake_does_not_delay_shutdown() {
    let server = start_tls(Tls::from_pem(FIRST_CERT, FIRST_KEY).unwrap()).await;
    let _stalled = TcpStream::connect(server.address).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    server.stop.send(()).unwrap();
    tokio::time::timeout(std::time::Duration::from_secs(10), server.stopped)
        .await
        .expect("the server stops without waiting for the handshake")
        .unwrap()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_ask_for_http2_by_alpn_get_it() {
    let server = start_tls(Tls::from_pem(FIRST_CERT, FIRST_KEY).unwrap()).await;

    let stream = connect_asking(server.address, FIRST_CERT, &["h2", "http/1.1"])
        .await
        .unwrap();
    let chosen = stream.get_ref().negotiated_alpn().unwrap();
    assert_eq!(chosen.as_deref(), Some(&b"h2"[..]));
    let http2 = Http2::over(stream).await;
    let appended = http2
        .call(
            Method::POST,
            "/v1/sessions/s/messages",
            Some(serde_json::json!({"role": "user", "content": "over h2"})),
        )
        .await;
    assert_eq!(appended.status, StatusCode::CREATED, "{appended:?}");
    let history = http2
        .call(Method::GET, "/v1/sessions/s/history", None)
        .await;
    assert_eq!(history.lines()[0]["content"], "over h2");

    // A client that offers only HTTP/1.1 gets HTTP/1.1.
    let mut http1 = connect_asking(server.address, FIRST_CERT, &["http/1.1"])
        .await
        .unwrap();
    let chosen = http1.get_ref().negotiated_alpn().unwrap();
    assert_eq!(chosen.as_deref(), Some(&b"http/1.1"[..]));
    assert!(health(&mut http1).await.starts_with("HTTP/1.1 200 OK"));
}
