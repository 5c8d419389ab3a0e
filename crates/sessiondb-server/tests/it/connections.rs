//! A connection that sends no request head within `request_head_timeout` (from when it opens,
//! or from its last answer) is closed; a request whose head arrived is never cut. `/metrics`
//! counts the connections accepted and open. HTTP/2 with prior knowledge is served on the same
//! port, its streams concurrent, its connections closed when no stream is open for the timeout.

use std::time::Duration;

use serde_json::json;
use sessiondb_server::ServerConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use reqwest::{Method, StatusCode};

use crate::common::{Http2, Server, SseReader, next_data, start, start_with};

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

    // The start of HTTP/2's preface, and no more.
    let mut half_preface = TcpStream::connect(&address).await.unwrap();
    half_preface.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
    assert_eq!(read_until_closed(&mut half_preface).await, b"");

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

    // Once their tasks end, the four count as accepted and no longer as open; the one open is
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
        metrics.contains("\nsessiondb_http_connections_accepted_total 5\n"),
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_with_prior_knowledge_answers_concurrent_streams_on_one_connection() {
    let server = start().await;
    let http2 = Http2::connect(&server).await;
    let appends = (0..32).map(|i| {
        let http2 = http2.clone();
        tokio::spawn(async move {
            let message = json!({"id": format!("m{i}"), "role": "user", "content": "hi"});
            http2
                .call(Method::POST, "/v1/sessions/s/messages", Some(message))
                .await
        })
    });
    for append in futures::future::join_all(appends).await {
        let answer = append.unwrap();
        assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
    }
    let session = http2.call(Method::GET, "/v1/sessions/s", None).await;
    assert_eq!(session.json["messageCount"], json!(32));
    let missing = http2.call(Method::GET, "/v1/sessions/nope", None).await;
    assert_eq!(
        (missing.status, missing.code()),
        (StatusCode::NOT_FOUND, "not_found")
    );
    // The history streams over HTTP/2 as over HTTP/1.1.
    let history = http2
        .call(Method::GET, "/v1/sessions/s/history", None)
        .await;
    assert_eq!(history.lines().len(), 32);
    assert_eq!(
        history.headers["content-type"].to_str().unwrap(),
        "application/x-ndjson"
    );

    // A request head as long as HTTP/1.1 takes (hyper's HTTP/2 default stops at 16 KiB).
    let long = format!("/healthz?padding={}", "x".repeat(40_000));
    assert_eq!(
        http2.call(Method::GET, &long, None).await.status,
        StatusCode::OK
    );

    // The 32 streams and the reads shared one connection; the other is the metrics client's.
    let metrics = server.get("/metrics").await.text;
    assert!(
        metrics.contains("\nsessiondb_http_connections_accepted_total 2\n"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_connections_without_an_open_stream_for_the_head_timeout_are_closed() {
    let server = start_with_head_timeout().await;
    let idle = Http2::connect(&server).await;
    assert_eq!(
        idle.call(Method::GET, "/healthz", None).await.status,
        StatusCode::OK
    );

    let following = Http2::connect(&server).await;
    let feed = following
        .open(Method::GET, "/v1/sessions/s/events", None)
        .await;
    assert_eq!(feed.status(), StatusCode::OK);
    let mut feed = feed.into_body();

    assert!(idle.closed_within(Duration::from_secs(10)).await);
    // The change feed's stream is open, so its connection stays open (and takes new streams)
    // past the timeout.
    tokio::time::sleep(HEAD_TIMEOUT * 3).await;
    assert_eq!(
        following.call(Method::GET, "/healthz", None).await.status,
        StatusCode::OK
    );
    server.say("s", "m1", "still listening").await;
    let mut received = String::new();
    while !received.contains("event: append") {
        let data = tokio::time::timeout(Duration::from_secs(10), next_data(&mut feed))
            .await
            .expect("an event within 10 s")
            .expect("the stream is still open");
        received.push_str(std::str::from_utf8(&data).unwrap());
    }
    assert!(received.contains("still listening"), "{received}");
    // Dropping the feed resets its stream, which then counts as closed: the connection idles out.
    drop(feed);
    assert!(following.closed_within(Duration::from_secs(10)).await);
}

/// Stopping ends the change-feed streams of HTTP/2 connections as of HTTP/1.1 ones, and does
/// not wait for a connection that never finished its preface.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_ends_http2_streams_and_does_not_wait_for_a_preface() {
    let mut server = start().await;
    let address = server.base.trim_start_matches("http://").to_owned();
    let mut stalled = TcpStream::connect(&address).await.unwrap();
    stalled.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
    let http2 = Http2::connect(&server).await;
    let mut feed = http2
        .open(Method::GET, "/v1/sessions/s/events", None)
        .await
        .into_body();
    tokio::time::sleep(Duration::from_millis(100)).await;

    server.stop().await;
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        while next_data(&mut feed).await.is_some() {}
    })
    .await;
    assert!(ended.is_ok(), "the change feed's stream ends at the stop");
    assert!(http2.closed_within(Duration::from_secs(10)).await);
    assert_eq!(read_until_closed(&mut stalled).await, b"");
}

/// `App::begin_shutdown` alone (readiness withdrawn, say while a load balancer moves away)
/// does not turn new connections away; the stop that follows it ends them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_opened_after_readiness_was_withdrawn_are_served() {
    let mut server = start().await;
    server.app.begin_shutdown();
    let fresh = reqwest::Client::new();
    let ready = fresh.get(server.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), StatusCode::SERVICE_UNAVAILABLE);
    let http2 = Http2::connect(&server).await;
    let health = http2.call(Method::GET, "/healthz", None).await;
    assert_eq!(health.status, StatusCode::OK);
    server.stop().await;
    assert!(http2.closed_within(Duration::from_secs(10)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_stalls_is_answered_408_and_one_that_trickles_is_taken() {
    let server = start_with(ServerConfig {
        request_body_timeout: Duration::from_millis(300),
        ..Default::default()
    })
    .await;
    let address = server.base.trim_start_matches("http://").to_owned();
    let body = json!({"id": "m1", "role": "user", "content": "hello"}).to_string();
    let head = format!(
        "POST /v1/sessions/s/messages HTTP/1.1\r\nhost: sessiondb\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );

    let mut stalled = TcpStream::connect(&address).await.unwrap();
    stalled.write_all(head.as_bytes()).await.unwrap();
    stalled.write_all(&body.as_bytes()[..10]).await.unwrap();
    let answer = String::from_utf8(read_until_closed(&mut stalled).await).unwrap();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains(r#""code":"request_timeout""#), "{answer}");
    assert_eq!(
        server.get("/v1/sessions/s").await.status,
        StatusCode::NOT_FOUND
    );

    // A byte every 20 ms: the whole body takes longer than the timeout, no gap does.
    let mut trickling = TcpStream::connect(&address).await.unwrap();
    trickling.write_all(head.as_bytes()).await.unwrap();
    for byte in body.bytes() {
        tokio::time::sleep(Duration::from_millis(20)).await;
        trickling.write_all(&[byte]).await.unwrap();
    }
    let answer = read_answer(&mut trickling).await;
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");
    assert_eq!(
        server.get("/v1/sessions/s").await.json["messageCount"],
        json!(1)
    );
}

/// The next answer on a kept connection: its head and its `content-length` body.
async fn read_answer(stream: &mut TcpStream) -> String {
    let mut received = Vec::new();
    let mut buffer = [0; 4096];
    loop {
        let text = String::from_utf8_lossy(&received).into_owned();
        if let Some(end) = text.find("\r\n\r\n") {
            let length = text[..end]
                .lines()
                .find_map(|line| line.strip_prefix("content-length: "))
                .map_or(0, |length| length.parse::<usize>().unwrap());
            if received.len() >= end + 4 + length {
                return text;
            }
        }
        let read = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buffer))
            .await
            .expect("an answer within 10 s")
            .unwrap();
        assert!(read > 0, "closed before answering: {received:?}");
        received.extend_from_slice(&buffer[..read]);
    }
}

/// What the server sends on a new connection to `address` after `head` and `body`, until it
/// closes the connection.
async fn answered_then_closed(address: &str, head: &str, body: &[u8]) -> String {
    let mut stream = TcpStream::connect(address).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body).await.unwrap();
    String::from_utf8(read_until_closed(&mut stream).await).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_before_the_body_was_read_close_the_connection_and_say_so() {
    let server = start_with(ServerConfig {
        limits: sessiondb_server::Limits {
            max_body_bytes: 4096,
            ..Default::default()
        },
        ..Default::default()
    })
    .await;
    let address = server.base.trim_start_matches("http://").to_owned();
    let post = |path: &str, length: usize, extra: &str| {
        format!(
            "POST {path} HTTP/1.1\r\nhost: sessiondb\r\ncontent-type: application/json\r\n\
             content-length: {length}\r\n{extra}\r\n"
        )
    };

    // Declared over the limit: refused before any of it is sent, even when the client asked.
    let head = post("/v1/sessions/s/messages", 5000, "expect: 100-continue\r\n");
    let answer = answered_then_closed(&address, &head, &[]).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("\r\nconnection: close\r\n"), "{answer}");
    assert!(answer.contains(r#""code":"payload_too_large""#), "{answer}");

    // Declared over the limit without asking: what is sent is read and dropped, so a client
    // that sends it all still reads the answer (closed at once, the connection would reset).
    let length = 16 << 20;
    let head = post("/v1/sessions/s/messages", length, "");
    let answer = answered_then_closed(&address, &head, &vec![b'x'; length]).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("\r\nconnection: close\r\n"), "{answer}");

    // An unknown route, its body not read: the same.
    let answer = answered_then_closed(&address, &post("/v1/nowhere", 100, ""), &[]).await;
    assert!(answer.starts_with("HTTP/1.1 404"), "{answer}");
    assert!(answer.contains("\r\nconnection: close\r\n"), "{answer}");

    // Within the limit, a client that asks is asked for the body; refused or taken once it was
    // read, the connection stays for the next request.
    let mut kept = TcpStream::connect(&address).await.unwrap();
    let body = json!({"id": "m1", "role": "user", "content": "hello"}).to_string();
    let head = post(
        "/v1/sessions/s/messages",
        body.len(),
        "expect: 100-continue\r\n",
    );
    kept.write_all(head.as_bytes()).await.unwrap();
    let mut continue_line = [0; 25];
    kept.read_exact(&mut continue_line).await.unwrap();
    assert_eq!(&continue_line, b"HTTP/1.1 100 Continue\r\n\r\n");
    kept.write_all(body.as_bytes()).await.unwrap();
    let answer = read_answer(&mut kept).await;
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");
    let bad = "{not json";
    let head = post("/v1/sessions/s/messages", bad.len(), "");
    kept.write_all(format!("{head}{bad}").as_bytes())
        .await
        .unwrap();
    let answer = read_answer(&mut kept).await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    kept.write_all(b"GET /healthz HTTP/1.1\r\nhost: sessiondb\r\n\r\n")
        .await
        .unwrap();
    let answer = read_answer(&mut kept).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(!answer.contains("connection: close"), "{answer}");
}
