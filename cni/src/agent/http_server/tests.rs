#![allow(clippy::unwrap_used)] // tests: a panic is a failed test

use std::time::Instant;

use hyper::service::service_fn;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::*;

/// A server answering `ok` to everything, with `limits`.
async fn server(limits: Limits) -> (std::net::SocketAddr, watch::Sender<bool>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (stop, shutdown) = watch::channel(false);
    let service = service_fn(|_request: Request<Incoming>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
    });
    tokio::spawn(serve(listener, "test", limits, service, shutdown));
    (address, stop)
}

/// One GET on `stream`; whether it was answered 200 within 5 s.
async fn get(stream: &mut TcpStream) -> bool {
    let request = b"GET / HTTP/1.1\r\nhost: x\r\n\r\n";
    if stream.write_all(request).await.is_err() {
        return false;
    }
    answer(stream).await
}

/// Reads one whole answer (its body is `ok`) within 5 s; whether it is a
/// 200.
async fn answer(stream: &mut TcpStream) -> bool {
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), async {
        let mut chunk = [0u8; 256];
        while !answer.ends_with(b"\r\n\r\nok") {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => answer.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await;
    read.is_ok() && answer.starts_with(b"HTTP/1.1 200")
}

#[tokio::test]
async fn a_client_that_sends_no_head_is_closed_after_the_timeout() {
    let limits = Limits {
        max_connections: 4,
        header_read_timeout: Duration::from_millis(300),
    };
    let (address, _stop) = server(limits).await;
    let mut silent = TcpStream::connect(address).await.unwrap();
    let started = Instant::now();
    let mut byte = [0u8; 1];
    let closed = tokio::time::timeout(Duration::from_secs(10), silent.read(&mut byte)).await;
    assert!(
        matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
        "a silent client was not closed: {closed:?}"
    );
    assert!(started.elapsed() >= limits.header_read_timeout);
    let mut honest = TcpStream::connect(address).await.unwrap();
    assert!(get(&mut honest).await);
}

#[tokio::test]
async fn past_the_cap_a_connection_waits_for_a_slot() {
    let limits = Limits {
        max_connections: 2,
        header_read_timeout: Duration::from_secs(30),
    };
    let (address, _stop) = server(limits).await;
    let mut held = vec![];
    for _ in 0..2 {
        let mut stream = TcpStream::connect(address).await.unwrap();
        assert!(get(&mut stream).await, "within the cap");
        held.push(stream);
    }
    // The third connects (the listen backlog) but is not served.
    let mut third = TcpStream::connect(address).await.unwrap();
    let request = b"GET / HTTP/1.1\r\nhost: x\r\n\r\n";
    third.write_all(request).await.unwrap();
    let mut byte = [0u8; 1];
    let waited = tokio::time::timeout(Duration::from_millis(500), third.read(&mut byte)).await;
    assert!(waited.is_err(), "served past the cap: {waited:?}");
    // A slot given back serves it.
    drop(held.pop());
    assert!(answer(&mut third).await, "not served once a slot was free");
}

#[tokio::test]
async fn shutdown_closes_the_open_connections() {
    let (address, stop) = server(Limits::DEFAULT).await;
    let mut open = TcpStream::connect(address).await.unwrap();
    assert!(get(&mut open).await);
    stop.send(true).unwrap();
    let mut byte = [0u8; 1];
    let closed = tokio::time::timeout(Duration::from_secs(5), open.read(&mut byte)).await;
    assert!(matches!(closed, Ok(Ok(0)) | Ok(Err(_))), "{closed:?}");
}
