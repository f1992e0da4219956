//! Copy behaviour over in-memory duplex pipes and loopback TCP.

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, duplex};
use tokio::net::{TcpListener, TcpStream};

use super::*;

/// Pipe capacity for the duplex tests: small, so that a large transfer must
/// interleave reads and writes many times.
const PIPE: usize = 4096;

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 % 251) as u8).collect()
}

#[tokio::test]
async fn counts_bytes_in_each_direction() {
    let (mut client, mut proxy_a) = duplex(PIPE);
    let (mut proxy_b, mut server) = duplex(PIPE);
    let copy = tokio::spawn(async move { copy_bidirectional(&mut proxy_a, &mut proxy_b).await });

    client.write_all(b"hello server").await.unwrap();
    client.shutdown().await.unwrap();
    let mut request = Vec::new();
    server.read_to_end(&mut request).await.unwrap();
    server.write_all(b"hi").await.unwrap();
    server.shutdown().await.unwrap();
    let mut reply = Vec::new();
    client.read_to_end(&mut reply).await.unwrap();

    assert_eq!(request, b"hello server");
    assert_eq!(reply, b"hi");
    let transferred = copy.await.unwrap().unwrap();
    assert_eq!(
        transferred,
        Transferred {
            a_to_b: 12,
            b_to_a: 2
        }
    );
}

#[tokio::test]
async fn a_stop_ends_an_open_copy_with_its_counts_and_closes_both_sides() {
    let (mut client, mut proxy_a) = duplex(PIPE);
    let (mut proxy_b, mut server) = duplex(PIPE);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let copy = tokio::spawn(async move {
        let result = copy_bidirectional_until(&mut proxy_a, &mut proxy_b, async {
            let _ = stopped.await;
        })
        .await;
        // Dropping the sides is what closes them for the peers.
        drop((proxy_a, proxy_b));
        result
    });
    client.write_all(b"ping").await.unwrap();
    let mut request = [0; 4];
    server.read_exact(&mut request).await.unwrap();
    stop.send(()).unwrap();

    match copy.await.unwrap() {
        Err(CopyError::Stopped { transferred }) => assert_eq!(transferred.a_to_b, 4),
        other => panic!("expected a stop, got {other:?}"),
    }
    let mut rest = Vec::new();
    assert_eq!(client.read_to_end(&mut rest).await.unwrap(), 0);
    assert_eq!(server.read_to_end(&mut rest).await.unwrap(), 0);
}

#[tokio::test]
async fn half_close_lets_the_reply_through() {
    let (mut client, mut proxy_a) = duplex(PIPE);
    let (mut proxy_b, mut server) = duplex(PIPE);
    let copy = tokio::spawn(async move { copy_bidirectional(&mut proxy_a, &mut proxy_b).await });
    let reply = pattern(100_000);

    // The client says everything, then closes its write side.
    client.write_all(b"request").await.unwrap();
    client.shutdown().await.unwrap();
    // The server only answers after seeing EOF.
    let server_side = tokio::spawn({
        let reply = reply.clone();
        async move {
            let mut request = Vec::new();
            server.read_to_end(&mut request).await.unwrap();
            server.write_all(&reply).await.unwrap();
            server.shutdown().await.unwrap();
            request
        }
    });
    let mut received = Vec::new();
    client.read_to_end(&mut received).await.unwrap();

    assert_eq!(server_side.await.unwrap(), b"request");
    assert_eq!(received, reply);
    assert_eq!(copy.await.unwrap().unwrap().b_to_a, reply.len() as u64);
}

#[tokio::test]
async fn large_transfer_over_tcp_arrives_intact_both_ways() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let echo_addr = listener.local_addr().unwrap();
    // An echo server: the far side of the copy.
    let echo = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let (mut read, mut write) = socket.split();
        tokio::io::copy(&mut read, &mut write).await.unwrap();
        write.shutdown().await.unwrap();
    });
    let front = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let front_addr = front.local_addr().unwrap();
    let proxy = tokio::spawn(async move {
        let (mut inbound, _) = front.accept().await.unwrap();
        let mut outbound = TcpStream::connect(echo_addr).await.unwrap();
        copy_bidirectional(&mut inbound, &mut outbound).await
    });

    let data = pattern(8 * 1024 * 1024 + 17);
    let client = TcpStream::connect(front_addr).await.unwrap();
    let (mut read, mut write) = client.into_split();
    let sender = tokio::spawn({
        let data = data.clone();
        async move {
            write.write_all(&data).await.unwrap();
            write.shutdown().await.unwrap();
        }
    });
    let mut echoed = Vec::new();
    read.read_to_end(&mut echoed).await.unwrap();
    sender.await.unwrap();
    echo.await.unwrap();

    assert!(echoed == data, "echoed bytes differ from the sent bytes");
    let transferred = proxy.await.unwrap().unwrap();
    assert_eq!(transferred.a_to_b, data.len() as u64);
    assert_eq!(transferred.b_to_a, data.len() as u64);
}

#[tokio::test]
async fn a_reset_counts_as_a_close_and_keeps_the_counts() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let peer = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        socket.write_all(b"bye").await.unwrap();
        // Zero linger turns the close into an RST.
        socket.set_zero_linger().unwrap();
        drop(socket);
    });
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    let (mut local, mut far) = duplex(PIPE);
    peer.await.unwrap();
    // The local side closes too, so that both directions finish.
    far.shutdown().await.unwrap();

    let result = copy_bidirectional(&mut tcp, &mut local).await;
    let transferred = match result {
        Ok(transferred) => transferred,
        // Writing our EOF to the reset socket may fail; the counts survive.
        Err(error @ CopyError::Write { .. }) => error.transferred(),
        Err(error) => panic!("a reset must not be a read failure: {error}"),
    };
    assert_eq!(transferred.a_to_b, 3);
    let mut received = Vec::new();
    far.read_to_end(&mut received).await.unwrap();
    assert_eq!(received, b"bye");
}

/// A side that hands out queued chunks, then EOF when `eof` is set and
/// waits otherwise; whatever is written to it is taken at once and dropped.
#[derive(Default)]
struct Scripted {
    chunks: std::collections::VecDeque<Vec<u8>>,
    eof: bool,
}

impl AsyncRead for Scripted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let Some(mut chunk) = self.chunks.pop_front() else {
            return if self.eof {
                Poll::Ready(Ok(()))
            } else {
                Poll::Pending
            };
        };
        let take = chunk.len().min(buf.remaining());
        buf.put_slice(&chunk[..take]);
        if take < chunk.len() {
            self.chunks.push_front(chunk.split_off(take));
        }
        Poll::Ready(Ok(()))
    }
}

impl tokio::io::AsyncWrite for Scripted {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl Side for Scripted {}

/// Runs one direction to completion over sides that never block.
fn run_one_way(source: &[u8]) -> OneWay {
    let mut way = OneWay::new();
    let mut cx = Context::from_waker(std::task::Waker::noop());
    let mut reader = Scripted {
        chunks: [source.to_vec()].into(),
        eof: true,
    };
    let mut writer = Scripted::default();
    // Neither side pends, so one poll runs to the end.
    match way.poll(&mut cx, &mut reader, &mut writer) {
        Poll::Ready(Ok(())) => way,
        Poll::Ready(Err(_)) => panic!("copying to a sink failed"),
        Poll::Pending => panic!("a scripted reader with EOF pended"),
    }
}

#[test]
fn bulk_traffic_grows_the_buffer_to_the_cap() {
    let way = run_one_way(&pattern(4 * MAX_BUFFER));
    assert_eq!(way.buffer.size(), MAX_BUFFER);
    assert_eq!(way.moved, 4 * MAX_BUFFER as u64);
}

#[test]
fn small_traffic_keeps_the_small_buffer() {
    let way = run_one_way(b"ping");
    assert_eq!(way.buffer.size(), INITIAL_BUFFER);
    assert_eq!(way.moved, 4);
}

/// Polls one direction until it waits for more to read.
fn poll_until_waiting(way: &mut OneWay, reader: &mut Scripted) {
    let mut cx = Context::from_waker(std::task::Waker::noop());
    let mut writer = Scripted::default();
    match way.poll(&mut cx, reader, &mut writer) {
        Poll::Pending => {}
        Poll::Ready(result) => panic!("a direction without EOF ended: {:?}", result.is_ok()),
    }
}

#[test]
fn a_waiting_direction_holds_no_small_buffer_but_keeps_a_bulk_one() {
    let mut way = OneWay::new();
    let mut reader = Scripted::default();
    poll_until_waiting(&mut way, &mut reader);
    assert!(
        !way.buffer.holds_room(),
        "an idle connection holds no buffer"
    );

    reader.chunks.push_back(b"ping".to_vec());
    poll_until_waiting(&mut way, &mut reader);
    assert_eq!(way.moved, 4);
    assert!(!way.buffer.holds_room(), "nothing is held between requests");

    reader.chunks.push_back(pattern(4 * MAX_BUFFER));
    poll_until_waiting(&mut way, &mut reader);
    assert_eq!(way.moved, 4 + 4 * MAX_BUFFER as u64);
    assert_eq!(way.buffer.size(), MAX_BUFFER);
    assert!(way.buffer.holds_room(), "bulk traffic keeps its buffer");
}

#[tokio::test]
async fn a_copy_asked_to_hand_over_returns_once_both_ways_read_enough_and_wait() {
    let (mut client, mut proxy_a) = duplex(PIPE);
    let (mut proxy_b, mut server) = duplex(PIPE);
    let copy = tokio::spawn(async move {
        let ended = copy_bidirectional_until_quiet(
            &mut proxy_a,
            &mut proxy_b,
            std::future::pending(),
            Some(3),
        )
        .await;
        (ended, proxy_a, proxy_b)
    });
    for round in 0..3u8 {
        client.write_all(&[round; 5]).await.unwrap();
        let mut request = [0; 5];
        server.read_exact(&mut request).await.unwrap();
        assert_eq!(request, [round; 5]);
        assert!(!copy.is_finished(), "not before the third reply");
        server.write_all(&[round; 7]).await.unwrap();
        let mut reply = [0; 7];
        client.read_exact(&mut reply).await.unwrap();
    }
    let (ended, mut proxy_a, mut proxy_b) = copy.await.unwrap();
    assert_eq!(
        ended.unwrap(),
        Ended::Quiet(Transferred {
            a_to_b: 15,
            b_to_a: 21
        })
    );
    // Nothing was held back: what comes next is the taker's to read.
    client.write_all(b"next").await.unwrap();
    let mut next = [0; 4];
    proxy_a.read_exact(&mut next).await.unwrap();
    assert_eq!(&next, b"next");
    server.write_all(b"back").await.unwrap();
    proxy_b.read_exact(&mut next).await.unwrap();
    assert_eq!(&next, b"back");
}

#[tokio::test]
async fn a_connection_that_closes_before_it_is_quiet_ends_as_closed() {
    let (mut client, mut proxy_a) = duplex(PIPE);
    let (mut proxy_b, mut server) = duplex(PIPE);
    let copy = tokio::spawn(async move {
        copy_bidirectional_until_quiet(&mut proxy_a, &mut proxy_b, std::future::pending(), Some(3))
            .await
    });
    client.write_all(b"one request").await.unwrap();
    client.shutdown().await.unwrap();
    let mut request = Vec::new();
    server.read_to_end(&mut request).await.unwrap();
    server.write_all(b"reply").await.unwrap();
    server.shutdown().await.unwrap();
    let mut reply = Vec::new();
    client.read_to_end(&mut reply).await.unwrap();
    assert_eq!(
        copy.await.unwrap().unwrap(),
        Ended::Closed(Transferred {
            a_to_b: 11,
            b_to_a: 5
        })
    );
}
