//! A connection that sends no request head within `request_head_timeout` (from when it opens,
//! or from its last answer) is closed; a request whose head arrived is never cut. `/metrics`
//! counts the connections accepted and open.

use std::time::Duration;

use serde_json::json;
use sessiondb_server::ServerConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::{Server, SseReader, start_with};

const HEAD_TIMEOUT: Duration = Duration::from_millis(300);

async fn start_with_head_timeout() -> Server {
    start_with(ServerConfig {
        request_head_timeout: HEAD_TIMEOUT,
        ..Default::default()
    })
    .await
}

/// What the server sends until it closes the connection; panics if it is still open after 10 s.
async fn read_until_closed(stream: &mut TcpStream) -> Vec<u8> {
    let mut received = Vec::new();
    let mut buffer = [0; 4096];
    loop {
        let read = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buffer))
            .await
            .expect("the server closes the connection");
        match read {
            Ok(0) | Err(_) => return received,
            Ok(n) => received.extend_from_slice(&buffer[..n]),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_send_no_request_head_in_time_are_closed() {
    let server = start_with_head_timeout().await;
    let address = server.base.trim_start_matches("http://").to_owned();

    let mut silent = TcpStream::connect(&address).await.unwrap();
    assert_eq!(read_until_closed(&mut silent).await, b"");

    // A head that keeps coming, a header line every 50 ms, but never ends.
    let mut slow = TcpStream::connect(&address).await.unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\n").await.unwrap();
    let (mut slow_reader, mut slow_writer) = slow.into_split();
    let trickle = tokio::spawn(async move {
        for i in 0..200 {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let line = format!("x-slow-{i}: 1\r\n");
            if slow_writer.write_all(line.as_bytes()).await.is_err() {
                return i;
            }
        }
        200
    });
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(
        Duration::from_secs(10),
        slow_reader.read_to_end(&mut answer),
    )
    .await
    .expect("the server closes the slow connection");
    assert!(
        !String::from_utf8_lossy(&answer).contains("200 OK"),
        "{answer:?}"
    );
    assert!(trickle.await.unwrap() < 200, "the server stopped reading");

    // A kept connection is answered, then closed once idle for the timeout.
    let mut kept = TcpStream::connect(&address).await.unwrap();
    kept.write_all(b"GET /healthz HTTP/1.1\r\nhost: sessiondb\r\n\r\n")
        .await
        .unwrap();
    let answer = String::from_utf8(read_until_closed(&mut kept).await).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    assert!(!answer.contains("connection: close"), "{answer}");

    // Once their tasks end, the three count as accepted and no longer as open; the one open is
    // the client's asking for the metrics.
    let mut metrics = String::new();
    for _ in 0..250 {
        metrics = server.get("/metrics").await.text;
        if metrics.contains("\nsessiondb_http_connections_open 1\n") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        metrics.contains("\nsessiondb_http_connections_open 1\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("\nsessiondb_http_connections_accepted_total 4\n"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_that_outlast_the_head_timeout_are_not_cut() {
    let server = start_with_head_timeout().await;
    let mut feed = SseReader::open(&server, "/v1/sessions/s/events", None).await;
    tokio::time::sleep(HEAD_TIMEOUT * 3).await;
    server.say("s", "m1", "still listening").await;
    let event = feed.next().await.expect("the stream is still open");
    assert_eq!(event.event, "append");
    assert_eq!(event.data["message"]["id"], json!("m1"));
}
