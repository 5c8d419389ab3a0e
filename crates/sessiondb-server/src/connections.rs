//! One accepted connection: its TLS handshake, its protocol, and when it is closed for idling.
//!
//! HTTP/2 is chosen by ALPN over TLS (`h2`, as browsers ask for it) and by its connection
//! preface in clear text (prior knowledge, as proxies and gRPC-style clients send it); there is
//! no `Upgrade: h2c` (RFC 9113 dropped it). Everything else is HTTP/1.1.
//!
//! Whatever the protocol, a connection that sends no request for the request-head timeout is
//! closed: before its first request (a handshake or preface that does not finish in time), and
//! between requests (HTTP/1.1: hyper's head timer; HTTP/2: no stream open for that long, then a
//! GOAWAY). A request whose head arrived is never cut.

use std::convert::Infallible;
use std::future::Future;
use std::io::Cursor;
use std::pin::{Pin, pin};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::server::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::Watcher;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::watch;
use tokio_native_tls::TlsAcceptor;

/// What a client sends first on an HTTP/2 connection without TLS (RFC 9113 §3.4).
const HTTP2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// HTTP/2 pings an otherwise quiet connection this often, and closes it when a ping is not
/// answered within the same time: a peer gone without a FIN (a dropped network) is noticed
/// even while a change-feed stream holds its connection open.
const HTTP2_PING_INTERVAL: Duration = Duration::from_secs(20);
/// The largest request head HTTP/2 takes (its path and headers, decoded): HTTP/1.1's
/// request-target limit (64 KiB) plus room for headers. hyper's default is 16 KiB.
const HTTP2_MAX_HEADER_LIST_BYTES: u32 = 80 * 1024;

type Api = TowerToHyperService<Router>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    Http1,
    Http2,
}

/// Serves the API on accepted connections in either protocol. Clones share the API.
#[derive(Clone)]
pub(crate) struct Connections {
    api: Api,
    http1: http1::Builder,
    http2: http2::Builder<TokioExecutor>,
    head_timeout: Duration,
}

impl Connections {
    pub(crate) fn new(router: Router, head_timeout: Duration) -> Self {
        let mut http1 = http1::Builder::new();
        http1
            .timer(TokioTimer::new())
            .header_read_timeout(head_timeout);
        let mut http2 = http2::Builder::new(TokioExecutor::new());
        http2
            .timer(TokioTimer::new())
            .keep_alive_interval(HTTP2_PING_INTERVAL)
            .keep_alive_timeout(HTTP2_PING_INTERVAL)
            .max_header_list_size(HTTP2_MAX_HEADER_LIST_BYTES);
        Self {
            api: TowerToHyperService::new(router),
            http1,
            http2,
            head_timeout,
        }
    }

    /// Serves `stream` until it closes, idles out, or the server stops (a change of `stopping`,
    /// taken when the connection was accepted: readiness withdrawn before then does not count;
    /// the server's drain waits while `draining` is held, that is, for this call to end).
    pub(crate) async fn serve(
        &self,
        stream: TcpStream,
        tls: Option<TlsAcceptor>,
        draining: Watcher,
        mut stopping: watch::Receiver<bool>,
    ) {
        let served = match tls {
            None => {
                let preface = read_http2_preface(stream);
                let Some((protocol, io)) = self.opening("preface", preface, &mut stopping).await
                else {
                    return;
                };
                self.serve_protocol(protocol, io, draining, stopping).await
            }
            Some(acceptor) => {
                let handshake = acceptor.accept(stream);
                let Some(stream) = self
                    .opening("TLS handshake", handshake, &mut stopping)
                    .await
                else {
                    return;
                };
                let protocol = match stream.get_ref().negotiated_alpn() {
                    Ok(Some(chosen)) if chosen == b"h2" => Protocol::Http2,
                    _ => Protocol::Http1,
                };
                self.serve_protocol(protocol, stream, draining, stopping)
                    .await
            }
        };
        if let Err(error) = served {
            tracing::debug!("connection ended: {error}");
        }
    }

    /// Runs what a connection does before its first request (`step`, named `what` in the log);
    /// `None` when it fails, does not finish within the head timeout, or the server begins to
    /// stop meanwhile (there is no request to finish yet).
    async fn opening<T, E: std::fmt::Display>(
        &self,
        what: &str,
        step: impl Future<Output = Result<T, E>>,
        stopping: &mut watch::Receiver<bool>,
    ) -> Option<T> {
        tokio::select! {
            finished = tokio::time::timeout(self.head_timeout, step) => match finished {
                Ok(Ok(done)) => Some(done),
                Ok(Err(error)) => {
                    tracing::debug!("{what} failed: {error}");
                    None
                }
                Err(_) => {
                    tracing::debug!("{what} not finished in time");
                    None
                }
            },
            _ = stopping.changed() => None,
        }
    }

    async fn serve_protocol<I>(
        &self,
        protocol: Protocol,
        io: I,
        draining: Watcher,
        mut stopping: watch::Receiver<bool>,
    ) -> Result<(), hyper::Error>
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let io = TokioIo::new(io);
        if protocol == Protocol::Http1 {
            return draining
                .watch(self.http1.serve_connection(io, self.api.clone()))
                .await;
        }
        let _draining = draining;
        let streams = OpenStreams::default();
        let mut connection = pin!(self.http2.serve_connection(io, streams.counting(&self.api)));
        tokio::select! {
            served = connection.as_mut() => return served,
            () = streams.none_for(self.head_timeout) => {}
            _ = stopping.changed() => {}
        }
        // A GOAWAY: streams already open finish (the change feed's end at a stop), no new one
        // starts, then the connection closes.
        connection.as_mut().graceful_shutdown();
        connection.await
    }
}

/// A clear-text connection whose first bytes were read to tell HTTP/2's preface from an
/// HTTP/1.1 request, with those bytes put back in front.
type Rewound = tokio::io::Join<tokio::io::Chain<Cursor<Vec<u8>>, OwnedReadHalf>, OwnedWriteHalf>;

/// Reads until what arrived either differs from HTTP/2's preface or completes it (a request
/// line differs at its first or second byte, so an HTTP/1.1 connection reads once).
async fn read_http2_preface(stream: TcpStream) -> std::io::Result<(Protocol, Rewound)> {
    let (mut reader, writer) = stream.into_split();
    let mut received = [0; HTTP2_PREFACE.len()];
    let mut filled = 0;
    let protocol = loop {
        let read = reader.read(&mut received[filled..]).await?;
        filled += read;
        if read == 0 || received[..filled] != HTTP2_PREFACE[..filled] {
            break Protocol::Http1;
        }
        if filled == HTTP2_PREFACE.len() {
            break Protocol::Http2;
        }
    };
    let replay = Cursor::new(received[..filled].to_vec());
    Ok((protocol, tokio::io::join(replay.chain(reader), writer)))
}

/// How many streams of one HTTP/2 connection are open: from when a request's head arrives
/// until its answer has been sent or the stream is reset.
#[derive(Clone, Default)]
struct OpenStreams(watch::Sender<usize>);

impl OpenStreams {
    fn counting(&self, api: &Api) -> CountingStreams {
        CountingStreams {
            api: api.clone(),
            open: self.clone(),
        }
    }

    fn opened(&self) -> OpenStream {
        self.0.send_modify(|open| *open += 1);
        OpenStream(self.clone())
    }

    /// Resolves once no stream has been open for `limit`.
    async fn none_for(&self, limit: Duration) {
        let mut open = self.0.subscribe();
        loop {
            // `self` holds the sender, so neither wait can end in an error.
            let _ = open.wait_for(|open| *open == 0).await;
            if tokio::time::timeout(limit, open.changed()).await.is_err() {
                return;
            }
        }
    }
}

/// One open stream; closes when dropped.
struct OpenStream(OpenStreams);

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.0.send_modify(|open| *open -= 1);
    }
}

/// The API, counting the streams it answers on (one HTTP/2 connection's).
#[derive(Clone)]
struct CountingStreams {
    api: Api,
    open: OpenStreams,
}

type Answer = hyper::Response<CountedBody>;

impl hyper::service::Service<hyper::Request<Incoming>> for CountingStreams {
    type Response = Answer;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Answer, Infallible>> + Send>>;

    fn call(&self, request: hyper::Request<Incoming>) -> Self::Future {
        let stream = self.open.opened();
        let answer = self.api.call(request);
        Box::pin(async move {
            let response = answer.await?;
            Ok(response.map(|body| CountedBody {
                body,
                _stream: stream,
            }))
        })
    }
}

/// An answer's body that keeps its stream counted as open until it is dropped.
struct CountedBody {
    body: Body,
    _stream: OpenStream,
}

impl http_body::Body for CountedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
