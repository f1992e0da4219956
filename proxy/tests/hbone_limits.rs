#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test
//! What one HBONE client can make the server hold, and that it is bounded
//! (`hbone/server.rs`): the proxy's HBONE server (`accept_tls`,
//! `serve_connection`) with its production HTTP/2 settings on loopback,
//! against clients that are not ours: tokio-rustls carrying the `h2`
//! crate's client, or frames written by hand. The handler's upstream never
//! answers, so every dial hangs until it is abandoned, and the handler
//! counts the dials in flight.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::{Method, Request};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tokio_util::sync::CancellationToken;
use ztunnel_certs::cert::WorkloadCertificate;
use ztunnel_certs::identity::Identity;
use ztunnel_certs::tls::{client_config, dummy_server_name, server_config};
use ztunnel_proxy::copy::{CopyError, Transferred};
use ztunnel_proxy::drain;
use ztunnel_proxy::hbone::{
    H2Settings, InboundHandler, InboundRefusal, InboundRequest, ServerError, accept_tls,
    serve_connection,
};
use ztunnel_test_support::ca::TestRoot;

/// How long any step may take before the test fails instead of hanging.
const PATIENCE: Duration = Duration::from_secs(10);

/// The client preface (RFC 9113 §3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Frame types and flags written or read by hand (RFC 9113 §6).
const HEADERS: u8 = 0x1;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const CONTINUATION: u8 = 0x9;
const DATA: u8 = 0x0;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
/// GOAWAY's error code for a peer that behaves abusively.
const ENHANCE_YOUR_CALM: u32 = 0xb;

/// Dials the handler started, as they come and go.
#[derive(Default)]
struct Dials {
    started: AtomicUsize,
    in_flight: AtomicUsize,
    peak: AtomicUsize,
}

impl Dials {
    fn started(&self) -> usize {
        self.started.load(Ordering::SeqCst)
    }

    fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    fn peak(&self) -> usize {
        self.peak.load(Ordering::SeqCst)
    }
}

/// One dial in flight until dropped: abandoned, since none ever connects.
struct InFlight(Arc<Dials>);

impl InFlight {
    fn new(dials: Arc<Dials>) -> InFlight {
        dials.started.fetch_add(1, Ordering::SeqCst);
        let now = dials.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        dials.peak.fetch_max(now, Ordering::SeqCst);
        InFlight(dials)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Admits every tunnel and dials an upstream that never answers.
struct Blackhole(Arc<Dials>);

impl InboundHandler for Blackhole {
    type Upstream = TcpStream;

    fn open(
        &self,
        _request: &InboundRequest,
    ) -> impl Future<Output = Result<TcpStream, InboundRefusal>> + Send {
        let dials = Arc::clone(&self.0);
        async move {
            let _in_flight = InFlight::new(dials);
            std::future::pending().await
        }
    }

    fn stop(_upstream: &TcpStream) -> CancellationToken {
        CancellationToken::new()
    }

    fn closed(&self, _upstream: TcpStream, _result: Result<Transferred, CopyError>) {}
}

/// The server's and the client's certificates, from one root.
struct Mesh {
    server: WorkloadCertificate,
    server_identity: Identity,
    client: WorkloadCertificate,
}

impl Mesh {
    fn new() -> Mesh {
        let root = TestRoot::generate("cluster.local").unwrap();
        let server_identity = Identity::new("cluster.local", "default", "server").unwrap();
        let client_identity = Identity::new("cluster.local", "default", "client").unwrap();
        Mesh {
            server: root.issue(&server_identity).unwrap(),
            server_identity,
            client: root.issue(&client_identity).unwrap(),
        }
    }

    /// Serves HBONE on loopback as the proxy's 15008 does after accept,
    /// with `settings`; each connection's outcome comes out of the channel.
    async fn serve(
        &self,
        settings: H2Settings,
        dials: &Arc<Dials>,
    ) -> (SocketAddr, mpsc::UnboundedReceiver<Result<(), ServerError>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let config = Arc::new(server_config(&self.server).unwrap());
        let handler = Arc::new(Blackhole(Arc::clone(dials)));
        let (outcomes, outcome) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let (_trigger, drain) = drain::channel();
            loop {
                let (tcp, peer) = listener.accept().await.unwrap();
                let local = tcp.local_addr().unwrap();
                let (config, handler, drain) =
                    (Arc::clone(&config), Arc::clone(&handler), drain.clone());
                let (settings, outcomes) = (settings.clone(), outcomes.clone());
                tokio::spawn(async move {
                    let (tls, client) = accept_tls(tcp, config, PATIENCE).await.unwrap();
                    let served = serve_connection(
                        tls,
                        client.identity.into(),
                        (peer, local),
                        &settings,
                        handler,
                        drain,
                    );
                    let _ = outcomes.send(served.await);
                });
            }
        });
        (addr, outcome)
    }

    /// A TLS session to `addr` with the client's certificate: stock
    /// tokio-rustls, the handshake done and nothing sent after it.
    async fn connect(&self, addr: SocketAddr) -> TlsStream<TcpStream> {
        let expected = vec![self.server_identity.clone()];
        let config = client_config(&self.client, expected).unwrap();
        let tcp = TcpStream::connect(addr).await.unwrap();
        TlsConnector::from(Arc::new(config))
            .connect(dummy_server_name(), tcp)
            .await
            .unwrap()
    }
}

/// One frame: its 9-byte header, then `payload`.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let length = u32::try_from(payload.len()).unwrap().to_be_bytes();
    let mut frame = length[1..].to_vec();
    frame.extend([kind, flags]);
    frame.extend(stream.to_be_bytes());
    frame.extend(payload);
    frame
}

/// What the server sent until it closed the connection: its frames as
/// (type, payload). Fails if the connection is still open after `within`.
async fn frames_until_closed(
    tls: &mut TlsStream<TcpStream>,
    within: Duration,
) -> Vec<(u8, Vec<u8>)> {
    let mut received = Vec::new();
    let read_all = async {
        let mut buf = [0u8; 16 * 1024];
        loop {
            match tls.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => received.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(within, read_all)
        .await
        .unwrap_or_else(|_| panic!("the connection is still open after {within:?}"));
    frames_in(&received)
}

/// The whole frames in `received`, as (type, payload).
fn frames_in(received: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let mut frames = Vec::new();
    let mut rest = received;
    while rest.len() >= 9 {
        let length = u32::from_be_bytes([0, rest[0], rest[1], rest[2]]) as usize;
        if rest.len() < 9 + length {
            break;
        }
        frames.push((rest[3], rest[9..9 + length].to_vec()));
        rest = &rest[9 + length..];
    }
    frames
}

/// The error code of the GOAWAY among `frames`, if one came.
fn goaway_code(frames: &[(u8, Vec<u8>)]) -> Option<u32> {
    frames
        .iter()
        .find(|(kind, payload)| *kind == GOAWAY && payload.len() >= 8)
        .map(|(_, payload)| u32::from_be_bytes(payload[4..8].try_into().unwrap()))
}

/// A CONNECT as the mesh sends it.
fn connect_request() -> Request<()> {
    Request::builder()
        .method(Method::CONNECT)
        .uri("10.0.0.1:8080")
        .body(())
        .unwrap()
}

/// Waits until `condition` holds, for at most [`PATIENCE`].
async fn until(condition: impl Fn() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !condition() {
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    true
}

#[tokio::test]
async fn a_client_silent_after_its_tls_handshake_is_closed() {
    let mesh = Mesh::new();
    let settings = H2Settings::default();
    let bound = settings.server_preface_timeout;
    let (addr, mut outcomes) = mesh.serve(settings, &Arc::default()).await;
    let mut tls = mesh.connect(addr).await;
    frames_until_closed(&mut tls, bound + PATIENCE).await;
    let outcome = outcomes.recv().await.unwrap();
    assert!(
        matches!(outcome, Err(ServerError::PrefaceTimeout(timeout)) if timeout == bound),
        "{outcome:?}"
    );
}

#[tokio::test]
async fn a_client_that_sends_its_preface_but_no_request_is_sent_away() {
    let mesh = Mesh::new();
    let settings = H2Settings::default();
    let bound = settings.server_first_request_timeout;
    // Shorter than the first keepalive PING and its timeout, which would
    // close the connection of a client that does not answer them anyway.
    assert!(bound + PATIENCE < settings.keepalive_interval + settings.keepalive_timeout);
    let (addr, mut outcomes) = mesh.serve(settings, &Arc::default()).await;
    let mut tls = mesh.connect(addr).await;
    tls.write_all(PREFACE).await.unwrap();
    tls.write_all(&frame(SETTINGS, 0, 0, &[])).await.unwrap();
    let frames = frames_until_closed(&mut tls, bound + PATIENCE).await;
    assert_eq!(goaway_code(&frames), Some(0), "GOAWAY NO_ERROR: {frames:?}");
    let outcome = outcomes.recv().await.unwrap();
    assert!(
        matches!(outcome, Err(ServerError::FirstRequestTimeout(timeout)) if timeout == bound),
        "{outcome:?}"
    );
}

// Two workers: a reset stream's task and the stream opened behind it can
// run side by side, as in the proxy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resets_abandon_their_dials_and_never_let_more_run_than_the_stream_limit() {
    /// Streams opened and reset, one after the other, once the server
    /// started dialing each (or refused it).
    const CYCLES: usize = 600;
    /// Times every stream is reset and as many opened at once.
    const BURSTS: usize = 5;
    let mesh = Mesh::new();
    let settings = H2Settings::default();
    let limit = settings.server_max_concurrent_streams as usize;
    let dials = Arc::new(Dials::default());
    let (addr, _outcomes) = mesh.serve(settings, &dials).await;
    let tls = mesh.connect(addr).await;
    let (client, connection) = h2::client::handshake(tls).await.unwrap();
    tokio::spawn(connection);
    let mut client = Client {
        send: client,
        refused: Arc::default(),
    };

    // All streams but one held open, each dialing.
    let mut held = Vec::new();
    for _ in 1..limit {
        held.push(client.open().await);
    }
    assert!(until(|| dials.in_flight() == limit - 1).await);

    // The last slot opened and reset over and over: h2 counts each stream
    // gone at its reset, while its dial was started.
    for cycle in 0..CYCLES {
        let (started, refused) = (dials.started(), client.refused());
        let mut send = client.open().await;
        let answered = until(|| dials.started() > started || client.refused() > refused).await;
        assert!(answered, "cycle {cycle}");
        send.send_reset(h2::Reason::CANCEL);
    }
    // Enough dials that, none abandoned, they would be over the limit;
    // fewer means the reset streams' dials held every slot and the rest
    // were refused.
    assert!(
        dials.started() >= 2 * limit,
        "only {} dials: those of reset streams were not abandoned",
        dials.started()
    );

    // Bursts: every stream reset and as many opened right behind, while
    // the reset streams' tasks may not have run yet.
    for burst in 0..BURSTS {
        for mut send in held.drain(..) {
            send.send_reset(h2::Reason::CANCEL);
        }
        client.refused = Arc::default();
        let started = dials.started();
        for _ in 0..limit {
            held.push(client.open().await);
        }
        // Each new stream dialing or refused before the next burst resets it.
        let settled = until(|| dials.started() - started + client.refused() == limit).await;
        assert!(
            settled,
            "burst {burst}: {} dials",
            dials.started() - started
        );
    }
    assert!(
        dials.peak() <= limit,
        "{} dials at once, over the limit of {limit}",
        dials.peak()
    );

    for mut send in held {
        send.send_reset(h2::Reason::CANCEL);
    }
    assert!(
        until(|| dials.in_flight() == 0).await,
        "{} dials left after every stream was reset",
        dials.in_flight()
    );
}

/// An h2 client that counts the streams the server refused.
struct Client {
    send: h2::client::SendRequest<bytes::Bytes>,
    /// Streams answered (REFUSED_STREAM, the only answer a blackhole's
    /// server gives) before this client reset them.
    refused: Arc<AtomicUsize>,
}

impl Client {
    /// Opens a CONNECT stream, waiting for a free slot.
    async fn open(&mut self) -> h2::SendStream<bytes::Bytes> {
        let ready = tokio::time::timeout(PATIENCE, self.send.clone().ready());
        self.send = ready.await.expect("a stream slot frees up").unwrap();
        let (response, send) = self.send.send_request(connect_request(), false).unwrap();
        let refused = Arc::clone(&self.refused);
        tokio::spawn(async move {
            if let Err(error) = response.await
                && error.reason() == Some(h2::Reason::REFUSED_STREAM)
            {
                refused.fetch_add(1, Ordering::SeqCst);
            }
        });
        send
    }

    fn refused(&self) -> usize {
        self.refused.load(Ordering::SeqCst)
    }
}

#[tokio::test]
async fn a_continuation_flood_closes_the_connection() {
    let mesh = Mesh::new();
    let (addr, _outcomes) = mesh.serve(H2Settings::default(), &Arc::default()).await;
    let mut tls = mesh.connect(addr).await;
    let mut flood = PREFACE.to_vec();
    flood.extend(frame(SETTINGS, 0, 0, &[]));
    // `:method: CONNECT` as a literal, then a header block that never ends.
    let method = [&[0x02, 0x07][..], b"CONNECT"].concat();
    flood.extend(frame(HEADERS, 0, 1, &method));
    for _ in 0..1_000 {
        flood.extend(frame(CONTINUATION, 0, 1, &[0x40, 0x01, b'x', 0x01, b'y']));
    }
    // The server may close before reading it all.
    let _ = tls.write_all(&flood).await;
    let frames = frames_until_closed(&mut tls, PATIENCE).await;
    assert_eq!(goaway_code(&frames), Some(ENHANCE_YOUR_CALM), "{frames:?}");
}

#[tokio::test]
async fn a_client_causing_protocol_errors_without_end_is_sent_away() {
    let mesh = Mesh::new();
    let settings = H2Settings {
        server_max_local_error_resets: 50,
        ..H2Settings::default()
    };
    let (addr, _outcomes) = mesh.serve(settings, &Arc::default()).await;
    let mut tls = mesh.connect(addr).await;
    let mut errors = PREFACE.to_vec();
    errors.extend(frame(SETTINGS, 0, 0, &[]));
    // `:method: GET` (static table index 2) and nothing else: a malformed
    // request h2 resets on its own, each on a new stream.
    for stream in (1..).step_by(2).take(100) {
        errors.extend(frame(HEADERS, END_HEADERS | END_STREAM, stream, &[0x82]));
    }
    let _ = tls.write_all(&errors).await;
    let frames = frames_until_closed(&mut tls, PATIENCE).await;
    assert_eq!(goaway_code(&frames), Some(ENHANCE_YOUR_CALM), "{frames:?}");
}

#[tokio::test]
async fn pings_and_settings_a_client_does_not_read_the_answers_to_hold_it_back() {
    /// Far more than the socket buffers and TLS records between the two
    /// can hold: taking it all, the server would have to keep the answers.
    const FLOOD: usize = 64 * 1024 * 1024;
    /// A write that makes no progress this long: the server stopped
    /// reading. A server merely slow keeps taking batches far faster.
    const STALLED: Duration = Duration::from_secs(2);
    let mesh = Mesh::new();
    let (addr, _outcomes) = mesh.serve(H2Settings::default(), &Arc::default()).await;
    for (kind, payload) in [(PING, &[0u8; 8][..]), (SETTINGS, &[][..])] {
        let mut tls = mesh.connect(addr).await;
        let mut start = PREFACE.to_vec();
        start.extend(frame(SETTINGS, 0, 0, &[]));
        tls.write_all(&start).await.unwrap();
        let one = frame(kind, 0, 0, payload);
        let batch = one.repeat(64 * 1024 / one.len());
        let mut written = 0;
        let stalled = loop {
            if written >= FLOOD {
                break false;
            }
            match tokio::time::timeout(STALLED, tls.write_all(&batch)).await {
                Ok(Ok(())) => written += batch.len(),
                Ok(Err(error)) => panic!("frame type {kind}: the server closed: {error}"),
                Err(_) => break true,
            }
        };
        assert!(
            stalled,
            "frame type {kind}: the server took all {written} bytes with none of its answers read"
        );
    }
}

#[tokio::test]
async fn a_flood_of_empty_data_frames_closes_the_connection() {
    let mesh = Mesh::new();
    let (addr, _outcomes) = mesh.serve(H2Settings::default(), &Arc::default()).await;
    let mut tls = mesh.connect(addr).await;
    let mut flood = PREFACE.to_vec();
    flood.extend(frame(SETTINGS, 0, 0, &[]));
    // `:method: CONNECT` and `:authority: 10.0.0.1:8080`, as literals: a
    // stream the server accepts and keeps open while it dials.
    let block = [
        &[0x02, 0x07][..],
        b"CONNECT",
        &[0x01, 0x0d],
        b"10.0.0.1:8080",
    ]
    .concat();
    flood.extend(frame(HEADERS, END_HEADERS, 1, &block));
    // Each frame costs the server its parsing and carries nothing.
    let empty = frame(DATA, 0, 1, &[]);
    for _ in 0..10_000 {
        flood.extend_from_slice(&empty);
    }
    let _ = tls.write_all(&flood).await;
    let frames = frames_until_closed(&mut tls, PATIENCE).await;
    assert_eq!(goaway_code(&frames), Some(ENHANCE_YOUR_CALM), "{frames:?}");
}
