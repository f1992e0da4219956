#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // bench set-up: a panic is a failed run
//! Opening an HBONE tunnel on an established HTTP/2 connection: the
//! per-connection cost once the pool has a connection to the peer.
//!
//! The server is the proxy's own `hbone::serve_connection`, with a handler
//! that admits every request and hands back an in-memory echo as the
//! upstream, so that the request checks, the response and the copy loop
//! are the proxy's and nothing else. Authorization and the upstream dial
//! are left out (`authz.rs` measures the first).
//!
//! The client sends what `HboneConnection::send_connect` sends (CONNECT,
//! `:authority ip:port`, the `baggage`/`forwarded`/`traceparent` headers of
//! `hbone::connect_headers`, built per request as the proxy does) over a
//! plain h2 client with the proxy's settings: `hbone::connect` only runs
//! over TLS on a `TcpStream`, which would put a handshake in the set-up
//! and sockets in the measurement.
//!
//! `open` stops the clock when the 200 arrives; `open_echo` also sends 64
//! bytes and waits for them to come back through the server's copy loop.
//! Closing the stream happens after the clock stops.
//!
//! Client, server and their connection tasks share one current-thread
//! runtime over a `tokio::io::duplex` pipe: the number is the CPU work of a
//! stream set-up on both ends, not the latency of waking another core.

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use h2::client::SendRequest;
use h2::{RecvStream, SendStream};
use http::uri::Authority;
use http::{Method, Request, StatusCode, Uri, Version};
use tokio::io::SimplexStream;
use tokio_util::sync::CancellationToken;
use ztunnel_certs::identity::Identity;
use ztunnel_proxy::copy::{CopyError, Transferred};
use ztunnel_proxy::drain::{self, DrainTrigger};
use ztunnel_proxy::hbone::{
    H2Settings, InboundHandler, InboundRefusal, InboundRequest, WorkloadLabels, connect_headers,
    serve_connection,
};

/// Capacity of each direction of the client–server pipe: a few HEADERS and
/// DATA frames of a few hundred bytes each never fill it, so neither side
/// waits on the pipe.
const PIPE: usize = 64 * 1024;
/// Capacity of the echo upstream: holds the payload many times over.
const ECHO: usize = 16 * 1024;
/// The first bytes of a typical request, e.g. a short HTTP/1 GET line.
const PAYLOAD: &[u8; 64] = &[b'x'; 64];
/// The source: the TCP peer the server sees, and the client `forwarded` names.
const CLIENT_ADDR: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 2, 0, 7)), 41000);
/// The destination workload's address, where the HBONE connection arrives.
const SERVER_ADDR: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 1, 0, 10)), 15008);
/// The tunnel's target: the destination workload's application port.
const AUTHORITY: &str = "10.1.0.10:8080";

/// The source workload's labels, as a typical deployment fills them.
const LABELS: WorkloadLabels<'static> = WorkloadLabels {
    cluster_id: "Kubernetes",
    namespace: "frontend",
    workload_type: "deployment",
    workload_name: "web",
    canonical_name: "web",
    canonical_revision: "v1",
    region: "eu-west-1",
    zone: "eu-west-1a",
};

/// Admits every tunnel with a fresh in-memory echo as its upstream, and
/// counts tunnels that did not end cleanly.
#[derive(Default)]
struct Echo {
    failures: AtomicUsize,
}

impl InboundHandler for Echo {
    type Upstream = SimplexStream;

    fn open(
        &self,
        _request: &InboundRequest,
    ) -> impl Future<Output = Result<SimplexStream, InboundRefusal>> + Send {
        // Reads return what was written, and EOF once the writer shut down.
        std::future::ready(Ok(SimplexStream::new_unsplit(ECHO)))
    }

    fn stop(_upstream: &SimplexStream) -> CancellationToken {
        // Never stopped early: the bench ends its tunnels itself.
        CancellationToken::new()
    }

    fn closed(&self, _upstream: SimplexStream, result: Result<Transferred, CopyError>) {
        if result.is_err() {
            self.failures.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// An established h2 connection with the proxy's server behind it.
struct Connection {
    send_request: SendRequest<Bytes>,
    handler: Arc<Echo>,
    /// Held for the bench's length: dropping every trigger forces a drain.
    _drain: DrainTrigger,
}

/// Connects a client with the settings of `hbone::connect` to
/// `serve_connection` over a pipe, and spawns both connection tasks.
async fn connection() -> Connection {
    let settings = H2Settings {
        // No PING during a run: the keepalive is not what is measured.
        keepalive_interval: Duration::from_secs(3600),
        ..H2Settings::default()
    };
    let (client_io, server_io) = tokio::io::duplex(PIPE);
    let (trigger, watcher) = drain::channel();
    let handler = Arc::new(Echo::default());
    let peer = Identity::new("cluster.local", "frontend", "web").unwrap();
    let server_settings = settings.clone();
    let server_handler = Arc::clone(&handler);
    tokio::spawn(async move {
        let addresses = (CLIENT_ADDR, SERVER_ADDR);
        serve_connection(
            server_io,
            peer.into(),
            addresses,
            &server_settings,
            server_handler,
            watcher,
        )
        .await
        .unwrap();
    });
    let (send_request, connection) = h2::client::Builder::new()
        .initial_window_size(settings.stream_window)
        .initial_connection_window_size(settings.connection_window)
        .max_frame_size(settings.max_frame_size)
        .max_header_list_size(settings.client_max_header_list)
        .initial_max_send_streams(settings.client_initial_max_streams)
        .max_send_buffer_size(settings.client_send_buffer)
        .enable_push(false)
        .handshake::<_, Bytes>(client_io)
        .await
        .unwrap();
    tokio::spawn(async move { connection.await.unwrap() });
    Connection {
        send_request,
        handler,
        _drain: trigger,
    }
}

/// Sends the CONNECT as `HboneConnection::send_connect_reserved` does and
/// waits for the 200.
async fn open(send_request: &SendRequest<Bytes>) -> (SendStream<Bytes>, RecvStream) {
    let headers = connect_headers(&LABELS, CLIENT_ADDR, None).unwrap();
    let uri = Uri::from(AUTHORITY.parse::<Authority>().unwrap());
    let mut request = Request::builder()
        .method(Method::CONNECT)
        .uri(uri)
        .version(Version::HTTP_2)
        .body(())
        .unwrap();
    *request.headers_mut() = headers;
    let mut send_request = send_request.clone().ready().await.unwrap();
    let (response, send) = send_request.send_request(request, false).unwrap();
    let response = response.await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    (send, response.into_body())
}

/// Sends `PAYLOAD` and waits until all of it has come back.
async fn echo(send: &mut SendStream<Bytes>, recv: &mut RecvStream) {
    send.send_data(Bytes::from_static(PAYLOAD), false).unwrap();
    let mut echoed = 0;
    while echoed < PAYLOAD.len() {
        let data = recv.data().await.unwrap().unwrap();
        recv.flow_control().release_capacity(data.len()).unwrap();
        echoed += data.len();
    }
}

/// Ends the stream both ways: END_STREAM out, then read until the server's
/// END_STREAM, which it sends once its copy loop has finished.
async fn close(mut send: SendStream<Bytes>, mut recv: RecvStream) {
    send.send_data(Bytes::new(), true).unwrap();
    while let Some(data) = recv.data().await {
        data.unwrap();
    }
}

fn connect(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let connection = runtime.block_on(connection());
    let mut group = c.benchmark_group("connect");
    for (name, with_echo) in [("open", false), ("open_echo", true)] {
        group.bench_function(name, |b| {
            b.to_async(&runtime).iter_custom(|iters| {
                let send_request = connection.send_request.clone();
                async move {
                    let mut measured = Duration::ZERO;
                    for _ in 0..iters {
                        let start = Instant::now();
                        let (mut send, mut recv) = open(&send_request).await;
                        if with_echo {
                            echo(&mut send, &mut recv).await;
                        }
                        measured += start.elapsed();
                        close(send, recv).await;
                    }
                    measured
                }
            })
        });
    }
    group.finish();
    assert_eq!(connection.handler.failures.load(Ordering::Relaxed), 0);
}

criterion_group! {
    name = benches;
    // A stream set-up takes about ten microseconds: 100 samples over 3 s
    // give a stable median and keep both cases under 15 s.
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = connect
}
criterion_main!(benches);
