use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use ztunnel_test_support::skip::skip;

use super::*;

/// A client, the proxy's two sockets of a connection, and the server.
struct Pair {
    client: TcpStream,
    a: TcpStream,
    b: TcpStream,
    server: TcpStream,
}

async fn pair() -> Pair {
    let outbound = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let app = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = TcpStream::connect(outbound.local_addr().unwrap())
        .await
        .unwrap();
    let (a, _) = outbound.accept().await.unwrap();
    let b = TcpStream::connect(app.local_addr().unwrap()).await.unwrap();
    let (server, _) = app.accept().await.unwrap();
    Pair {
        client,
        a,
        b,
        server,
    }
}

/// The process's splicer, or `None`, skipped with the reason: joining
/// sockets needs CAP_BPF and CAP_NET_ADMIN and a kernel with socket maps.
fn splicer() -> Option<&'static Splicer> {
    let splicer = Splicer::shared();
    if splicer.is_none() {
        skip(
            "the kernel refused the socket maps or the verdict program (not root, or no BPF socket maps)",
        );
    }
    splicer
}

/// The join callback of these tests: every join here must be taken.
fn joined(taken: bool) {
    assert!(taken, "the kernel took the sockets");
}

/// Carries `a` and `b` on a task; the receiver hears whether the kernel
/// took them.
fn carry(
    splicer: &'static Splicer,
    a: TcpStream,
    b: TcpStream,
) -> (
    tokio::task::JoinHandle<Result<Transferred, CopyError>>,
    oneshot::Receiver<bool>,
) {
    let (taken, was_taken) = oneshot::channel();
    let carried = tokio::spawn(async move {
        let joined = move |joined| {
            let _ = taken.send(joined);
        };
        splicer
            .run(a, b, Transferred::default(), std::future::pending(), joined)
            .await
    });
    (carried, was_taken)
}

/// Closes `socket` with a reset: a linger of zero does that.
fn reset(socket: TcpStream) {
    socket2::SockRef::from(&socket)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    drop(socket);
}

fn pattern(length: usize, seed: u8) -> Vec<u8> {
    (0..length)
        .map(|index| (index % 251) as u8 ^ seed)
        .collect()
}

#[tokio::test]
async fn joined_sockets_carry_requests_and_the_half_close_both_ways_with_counts() {
    let Some(splicer) = splicer() else { return };
    let Pair {
        mut client,
        a,
        b,
        mut server,
    } = pair().await;
    // Sent before the join: waits in the receive queues and must still go.
    client.write_all(b"early request").await.unwrap();
    server.write_all(b"banner").await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let carried = tokio::spawn(async move {
        splicer
            .run(a, b, Transferred::default(), std::future::pending(), joined)
            .await
    });

    let mut early = [0; 13];
    server.read_exact(&mut early).await.unwrap();
    assert_eq!(&early, b"early request");
    let mut banner = [0; 6];
    client.read_exact(&mut banner).await.unwrap();
    assert_eq!(&banner, b"banner");

    let (mut sent_up, mut sent_down) = (13u64, 6u64);
    for round in 0..200u32 {
        let request = pattern(1 + (round as usize * 37) % 3000, 1);
        client.write_all(&request).await.unwrap();
        let mut got = vec![0; request.len()];
        server.read_exact(&mut got).await.unwrap();
        assert_eq!(got, request, "request {round}");
        let response = pattern(1 + (round as usize * 53) % 9000, 2);
        server.write_all(&response).await.unwrap();
        let mut got = vec![0; response.len()];
        client.read_exact(&mut got).await.unwrap();
        assert_eq!(got, response, "response {round}");
        sent_up += request.len() as u64;
        sent_down += response.len() as u64;
    }

    // The client closes its side; the server reads EOF and still answers.
    client.write_all(b"last").await.unwrap();
    client.shutdown().await.unwrap();
    let mut rest = Vec::new();
    server.read_to_end(&mut rest).await.unwrap();
    assert_eq!(rest, b"last");
    server.write_all(b"after the close").await.unwrap();
    server.shutdown().await.unwrap();
    let mut rest = Vec::new();
    client.read_to_end(&mut rest).await.unwrap();
    assert_eq!(rest, b"after the close");

    let moved = tokio::time::timeout(Duration::from_secs(10), carried)
        .await
        .expect("the splice ends once both sides closed")
        .unwrap()
        .unwrap();
    assert_eq!(moved.a_to_b, sent_up + 4);
    assert_eq!(moved.b_to_a, sent_down + 15);
}

#[tokio::test]
async fn megabytes_both_ways_at_once_arrive_in_order_to_a_slow_reader() {
    let Some(splicer) = splicer() else { return };
    let Pair {
        client,
        a,
        b,
        server,
    } = pair().await;
    let carried = tokio::spawn(async move {
        splicer
            .run(a, b, Transferred::default(), std::future::pending(), joined)
            .await
    });
    const LENGTH: usize = 8 << 20;
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let up = tokio::spawn(async move {
        client_write.write_all(&pattern(LENGTH, 3)).await.unwrap();
        client_write.shutdown().await.unwrap();
    });
    let down = tokio::spawn(async move {
        server_write.write_all(&pattern(LENGTH, 4)).await.unwrap();
        server_write.shutdown().await.unwrap();
    });
    // The server reads slowly: 3 KiB at a time with pauses at first.
    let slow = tokio::spawn(async move {
        let mut got = Vec::with_capacity(LENGTH);
        let mut chunk = [0; 3072];
        let mut reads = 0u32;
        loop {
            let read = server_read.read(&mut chunk).await.unwrap();
            if read == 0 {
                break;
            }
            got.extend_from_slice(&chunk[..read]);
            reads += 1;
            if reads < 200 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        got
    });
    let mut got = Vec::new();
    client_read.read_to_end(&mut got).await.unwrap();
    assert!(got == pattern(LENGTH, 4), "the download arrives intact");
    assert!(
        slow.await.unwrap() == pattern(LENGTH, 3),
        "the upload arrives intact"
    );
    up.await.unwrap();
    down.await.unwrap();
    let moved = tokio::time::timeout(Duration::from_secs(10), carried)
        .await
        .expect("the splice ends once both sides closed")
        .unwrap()
        .unwrap();
    assert_eq!((moved.a_to_b, moved.b_to_a), (LENGTH as u64, LENGTH as u64));
}

#[tokio::test]
async fn a_stop_closes_both_sides_and_counts_what_was_moved() {
    let Some(splicer) = splicer() else { return };
    let Pair {
        mut client,
        a,
        b,
        mut server,
    } = pair().await;
    let (stop, stopped) = oneshot::channel::<()>();
    let carried = tokio::spawn(async move {
        splicer
            .run(
                a,
                b,
                Transferred::default(),
                async {
                    let _ = stopped.await;
                },
                joined,
            )
            .await
    });
    client.write_all(b"ping").await.unwrap();
    let mut got = [0; 4];
    server.read_exact(&mut got).await.unwrap();
    stop.send(()).unwrap();
    let result = tokio::time::timeout(Duration::from_secs(10), carried)
        .await
        .unwrap()
        .unwrap();
    match result {
        Err(CopyError::Stopped { transferred }) => assert_eq!(transferred.a_to_b, 4),
        other => panic!("expected a stop, got {other:?}"),
    }
    // Both ends see the connection end.
    let mut rest = Vec::new();
    let _ = client.read_to_end(&mut rest).await;
    let _ = server.read_to_end(&mut rest).await;
    assert!(rest.is_empty());
}

#[tokio::test]
async fn a_reset_server_ends_the_splice_and_closes_the_client() {
    let Some(splicer) = splicer() else { return };
    let Pair {
        mut client,
        a,
        b,
        server,
    } = pair().await;
    let (carried, was_taken) = carry(splicer, a, b);
    assert!(was_taken.await.unwrap(), "the kernel took the sockets");
    client.write_all(b"ping").await.unwrap();
    reset(server);
    let result = tokio::time::timeout(Duration::from_secs(10), carried)
        .await
        .expect("a reset ends the splice")
        .unwrap();
    assert!(
        result.is_err(),
        "bytes were still owed to the server: {result:?}"
    );
    let mut rest = Vec::new();
    let _ = client.read_to_end(&mut rest).await;
    assert!(rest.is_empty());
}

#[tokio::test]
async fn sockets_the_kernel_will_not_take_are_copied_by_the_proxy() {
    let Some(splicer) = splicer() else { return };
    let Pair {
        mut client,
        a,
        b,
        server,
    } = pair().await;
    // A reset socket is no longer established: no socket map takes it.
    reset(server);
    tokio::time::sleep(Duration::from_millis(20)).await;
    let (carried, was_taken) = carry(splicer, a, b);
    assert!(!was_taken.await.unwrap(), "refused, and told so");
    // The proxy's copy carries on and passes the end to the client.
    let mut rest = Vec::new();
    let _ = client.read_to_end(&mut rest).await;
    assert!(rest.is_empty());
    client.shutdown().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), carried)
        .await
        .expect("the copy ends once both sides are gone")
        .unwrap()
        .map(drop)
        .unwrap_or_default();
}
