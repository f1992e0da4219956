//! Tunnels copied end to end as the two proxies copy them: an application
//! socket, the client proxy's copy, a real h2 connection with small windows,
//! the server proxy's copy, and the upstream socket. The sockets are
//! in-memory pipes and the clock is paused, so that slow readers pause
//! without slowing the tests.

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, Uri, Version};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream, duplex};
use tokio::task::JoinHandle;

use super::*;
use crate::copy::{CopyError, Transferred, copy_bidirectional};

/// The h2 frame size, also each stream's `max_write`: the smallest h2
/// allows, so that large chunks are sent in many pieces.
const FRAME: u32 = 16 * 1024;
/// Stream window: two frames, so that a slow reader stops the sender
/// after a few frames and the send capacity is often less than the chunk.
const STREAM_WINDOW: u32 = 2 * FRAME;
/// Connection window: two streams' worth.
const CONNECTION_WINDOW: u32 = 2 * STREAM_WINDOW;
/// The application pipes and the pipe under h2: a few KiB, so that every
/// side waits on every other many times.
const PIPE: usize = 8 * 1024;
/// What a slow reader reads at once.
const READ_PIECE: usize = 3 * 1024;
/// A slow reader's pause after each read (virtual time).
const PAUSE: Duration = Duration::from_millis(1);
/// Bounds each test in virtual time: a stuck copy fails instead of hanging.
const DEADLINE: Duration = Duration::from_secs(600);

/// `len` bytes that differ from every other stretch of themselves and from
/// another `seed`'s, so that lost, repeated, reordered or swapped chunks show.
fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u32 ^ seed).wrapping_mul(0x9E37_79B1) >> 24) as u8)
        .collect()
}

/// Asserts `received == sent` without printing megabytes when they differ.
fn assert_same(received: &[u8], sent: &[u8], what: &str) {
    let first_difference = received.iter().zip(sent).position(|(r, s)| r != s);
    assert!(
        received.len() == sent.len() && first_difference.is_none(),
        "{what}: received {} of {} bytes, first difference at {first_difference:?}",
        received.len(),
        sent.len(),
    );
}

/// One CONNECT stream over a fresh h2 connection: (client's end, server's
/// end). Both connections are driven by tasks of their own.
async fn tunnel() -> (H2Stream, H2Stream) {
    let (client_io, server_io) = duplex(PIPE);
    let server = tokio::spawn(async move {
        let mut connection = h2::server::Builder::new()
            .initial_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .max_frame_size(FRAME)
            .handshake::<_, Bytes>(server_io)
            .await
            .unwrap();
        let (request, mut respond) = connection.accept().await.unwrap().unwrap();
        let send = respond.send_response(Response::new(()), false).unwrap();
        tokio::spawn(async move { while connection.accept().await.is_some() {} });
        H2Stream::new(send, request.into_body(), FRAME as usize, None)
    });
    let (send_request, connection) = h2::client::Builder::new()
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_frame_size(FRAME)
        .handshake::<_, Bytes>(client_io)
        .await
        .unwrap();
    tokio::spawn(connection);
    let request = Request::builder()
        .method(Method::CONNECT)
        .uri(Uri::from_static("10.1.0.10:8080"))
        .version(Version::HTTP_2)
        .body(())
        .unwrap();
    let (response, send) = send_request
        .ready()
        .await
        .unwrap()
        .send_request(request, false)
        .unwrap();
    let server_end = server.await.unwrap();
    let response = response.await.unwrap();
    let client_end = H2Stream::new(send, response.into_body(), FRAME as usize, None);
    (client_end, server_end)
}

/// Both proxies' copies over one tunnel, as they run in production: the
/// client proxy copies (application socket, tunnel), the server proxy
/// (tunnel, upstream socket). Returns the application's and the upstream's
/// sockets and the two copies.
struct Proxies {
    application: DuplexStream,
    upstream: DuplexStream,
    client_copy: JoinHandle<Result<Transferred, CopyError>>,
    server_copy: JoinHandle<Result<Transferred, CopyError>>,
}

async fn proxies() -> Proxies {
    let (mut client_end, mut server_end) = tunnel().await;
    let (application, mut captured) = duplex(PIPE);
    let (mut dialed, upstream) = duplex(PIPE);
    Proxies {
        application,
        upstream,
        client_copy: tokio::spawn(async move {
            copy_bidirectional(&mut captured, &mut client_end).await
        }),
        server_copy: tokio::spawn(
            async move { copy_bidirectional(&mut server_end, &mut dialed).await },
        ),
    }
}

/// Writes `data` in writes of `chunk` bytes, then closes the write half.
async fn write_in_chunks(mut writer: impl AsyncWriteExt + Unpin, data: &[u8], chunk: usize) {
    for piece in data.chunks(chunk) {
        writer.write_all(piece).await.unwrap();
    }
    writer.shutdown().await.unwrap();
}

/// Reads to EOF in small pieces with a pause after each, so that the
/// writer, both copies and h2's flow control wait on it.
async fn read_slowly(mut reader: impl AsyncReadExt + Unpin) -> Vec<u8> {
    let mut received = Vec::new();
    let mut piece = [0; READ_PIECE];
    loop {
        let read = reader.read(&mut piece).await.unwrap();
        if read == 0 {
            return received;
        }
        received.extend_from_slice(&piece[..read]);
        tokio::time::sleep(PAUSE).await;
    }
}

/// Sends `up` from the application and `down` from the upstream at once,
/// each in writes of `chunk` bytes, read slowly at the other end; checks
/// what arrived and what both copies counted.
async fn bulk_both_ways(up: Vec<u8>, down: Vec<u8>, chunk: usize) {
    let proxies = proxies().await;
    let (application_read, application_write) = tokio::io::split(proxies.application);
    let (upstream_read, upstream_write) = tokio::io::split(proxies.upstream);
    let (_, _, received_up, received_down) = tokio::join!(
        write_in_chunks(application_write, &up, chunk),
        write_in_chunks(upstream_write, &down, chunk),
        read_slowly(upstream_read),
        read_slowly(application_read),
    );

    assert_same(&received_up, &up, "application to upstream");
    assert_same(&received_down, &down, "upstream to application");
    let expected = Transferred {
        a_to_b: up.len() as u64,
        b_to_a: down.len() as u64,
    };
    assert_eq!(proxies.client_copy.await.unwrap().unwrap(), expected);
    assert_eq!(proxies.server_copy.await.unwrap().unwrap(), expected);
}

#[tokio::test(start_paused = true)]
async fn bytes_arrive_intact_and_in_order_both_ways_for_every_chunk_size() {
    // (chunk, bytes each way): from single bytes to chunks larger than every
    // buffer, window and pipe on the way; totals keep each case short.
    let cases: [(usize, usize); 6] = [
        (1, 3_000),
        (7, 50_000),
        (1024, 1024 * 1024),
        (16 * 1024 + 1, 2 * 1024 * 1024 + 3),
        (256 * 1024, 4 * 1024 * 1024),
        (4 * 1024 * 1024, 8 * 1024 * 1024 + 5),
    ];
    for (seed, (chunk, len)) in (0u32..).zip(cases) {
        let up = pattern(len, 2 * seed);
        let down = pattern(len, 2 * seed + 1);
        tokio::time::timeout(DEADLINE, bulk_both_ways(up, down, chunk))
            .await
            .unwrap_or_else(|_| panic!("chunk {chunk}: the copies stalled"));
    }
}

#[tokio::test(start_paused = true)]
async fn a_reply_sent_after_the_request_half_close_arrives_in_full() {
    let test = async {
        let mut proxies = proxies().await;
        let reply = pattern(3 * 256 * 1024 + 11, 7);
        proxies.application.write_all(b"request").await.unwrap();
        proxies.application.shutdown().await.unwrap();
        // The upstream answers only once it saw the request's end.
        let mut request = Vec::new();
        proxies.upstream.read_to_end(&mut request).await.unwrap();
        assert_eq!(request, b"request");
        let (_upstream_read, upstream_write) = tokio::io::split(proxies.upstream);
        let (_, received) = tokio::join!(
            write_in_chunks(upstream_write, &reply, 100_000),
            read_slowly(proxies.application),
        );
        assert_same(&received, &reply, "the reply");

        let expected = Transferred {
            a_to_b: 7,
            b_to_a: reply.len() as u64,
        };
        assert_eq!(proxies.client_copy.await.unwrap().unwrap(), expected);
        assert_eq!(proxies.server_copy.await.unwrap().unwrap(), expected);
    };
    tokio::time::timeout(DEADLINE, test).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_tunnel_reset_by_the_server_ends_the_client_copy_like_eof() {
    let test = async {
        let (mut client_end, mut server_end) = tunnel().await;
        let (mut application, mut captured) = duplex(PIPE);
        let client_copy =
            tokio::spawn(async move { copy_bidirectional(&mut captured, &mut client_end).await });

        application.write_all(b"ping").await.unwrap();
        let mut request = [0; 4];
        server_end.read_exact(&mut request).await.unwrap();
        server_end.write_all(b"pong").await.unwrap();
        let mut reply = [0; 4];
        application.read_exact(&mut reply).await.unwrap();
        assert_eq!(&reply, b"pong");
        // Dropped without END_STREAM: the client sees RST_STREAM(CANCEL).
        drop(server_end);

        let mut rest = Vec::new();
        application.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty(), "the reset reads as EOF");
        application.shutdown().await.unwrap();
        let transferred = match client_copy.await.unwrap() {
            Ok(transferred) => transferred,
            // Sending our END_STREAM on the reset stream may fail; the
            // counts survive.
            Err(error @ CopyError::Write { .. }) => error.transferred(),
            Err(error) => panic!("a reset must not be a read failure: {error}"),
        };
        assert_eq!(
            transferred,
            Transferred {
                a_to_b: 4,
                b_to_a: 4
            }
        );
    };
    tokio::time::timeout(DEADLINE, test).await.unwrap();
}
