//! Fuzzes what the inbound side (15008) reads from an HBONE CONNECT: the
//! `:authority` (`Authority`'s parser) and the whole request as the h2
//! server of `hbone::serve_connection` receives it, over an in-memory pipe
//! with the TLS already done. The handler behind it records each request it
//! is asked to admit, and refuses it (503) or admits it to an upstream that
//! is already closed (200), by the parity of the port.
//!
//! The first byte picks the mode:
//! - 0: the rest is an `:authority` text;
//! - 1: the rest is lines: the `:authority`, then `name: value` headers;
//!   an h2 client sends them as one request (CONNECT, or GET when the
//!   mode byte's bit 7 is set);
//! - 2: the rest is raw HTTP/2 frames after the client preface.
//!
//! Properties: no panic, no hang; an accepted authority has a non-zero
//! port, an IP one is a socket address and a hostname one a DNS name, and
//! either reads back from its text; a hostname authority can go in
//! `forwarded`; the request's `baggage`, however many lines, reads into
//! fields that are each non-empty and hold neither `,` nor `=`, and is
//! empty when a line is not visible ASCII; a request is answered 400
//! exactly when it is not a
//! CONNECT with such an authority, and otherwise the handler sees the
//! same authority, the same headers and the connection's identity.

#![no_main]

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode, Uri};
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncWriteExt, DuplexStream};
use tokio_util::sync::CancellationToken;
use ztunnel_certs::identity::Identity;
use ztunnel_proxy::copy::{CopyError, Transferred};
use ztunnel_proxy::drain;
use ztunnel_proxy::hbone::{
    Authority, BAGGAGE, Baggage, H2Settings, InboundHandler, InboundRefusal, InboundRequest,
    forwarded, serve_connection,
};

/// The HTTP/2 client connection preface (RFC 9113 §3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// The pipe's capacity each way: larger than any input, so a write never
/// waits for the other side.
const PIPE: usize = 64 * 1024;
const PEER_ADDR: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 2, 0, 7)), 41000);
const LOCAL_ADDR: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 1, 0, 10)), 15008);
/// Bounds each input in virtual time: the clock is paused and jumps ahead
/// whenever every task waits.
const DEADLINE: Duration = Duration::from_secs(60);

/// What a request's `baggage` reads as: each field one member's value,
/// so non-empty and free of the separators; nothing from unreadable lines.
fn check_baggage(headers: &HeaderMap) {
    let baggage = Baggage::parse(headers.get_all(BAGGAGE));
    let fields = [
        &baggage.cluster,
        &baggage.namespace,
        &baggage.workload_name,
        &baggage.canonical_name,
        &baggage.canonical_revision,
        &baggage.region,
        &baggage.zone,
    ];
    for field in fields.into_iter().flatten() {
        assert!(!field.is_empty() && !field.contains([',', '=']), "{field:?}");
    }
    if headers.get_all(BAGGAGE).iter().any(|value| value.to_str().is_err()) {
        assert!(baggage.is_empty(), "read from an unreadable line: {baggage:?}");
    }
}

/// Records every request it is asked to admit.
#[derive(Default)]
struct Recorder {
    seen: Mutex<Vec<InboundRequest>>,
}

impl InboundHandler for Recorder {
    type Upstream = DuplexStream;

    fn open(
        &self,
        request: &InboundRequest,
    ) -> impl Future<Output = Result<DuplexStream, InboundRefusal>> + Send {
        check_authority(&request.authority);
        check_baggage(&request.headers);
        self.seen
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(request.clone());
        let result = if port(&request.authority) % 2 == 0 {
            // The other end is gone: the copy sees EOF and ends at once.
            Ok(tokio::io::duplex(64).0)
        } else {
            Err(InboundRefusal::Unavailable("refused by the fuzz handler"))
        };
        std::future::ready(result)
    }

    fn stop(_upstream: &DuplexStream) -> CancellationToken {
        CancellationToken::new()
    }

    fn closed(&self, _upstream: DuplexStream, _result: Result<Transferred, CopyError>) {}
}

fn port(authority: &Authority) -> u16 {
    match authority {
        Authority::Address(address) => address.port(),
        Authority::Hostname { port, .. } => *port,
    }
}

fn check_authority(authority: &Authority) {
    assert_ne!(port(authority), 0);
    let text = match authority {
        Authority::Address(address) => address.to_string(),
        Authority::Hostname { host, port } => {
            assert!(host.parse::<IpAddr>().is_err(), "{host} is an IP");
            assert!(!host.is_empty() && host.len() <= 253);
            let value = forwarded(PEER_ADDR, Some(host)).expect("a DNS name fits a header");
            assert!(value.to_str().is_ok_and(|text| text.ends_with(&**host)));
            format!("{host}:{port}")
        }
    };
    assert_eq!(text.parse::<Authority>().as_ref(), Ok(authority));
}

fn settings() -> H2Settings {
    H2Settings {
        keepalive_interval: Duration::from_secs(5),
        keepalive_timeout: Duration::from_secs(5),
        ..H2Settings::default()
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime")
}

fn peer() -> Identity {
    Identity::new("cluster.local", "frontend", "web").expect("a valid identity")
}

/// Serves one connection whose client side is `client`; returns what the
/// client returned and every request the handler saw.
fn serve<T, F>(client: impl FnOnce(DuplexStream) -> F) -> (Option<T>, Vec<InboundRequest>)
where
    F: Future<Output = Option<T>>,
{
    let runtime = runtime();
    let recorder = Arc::new(Recorder::default());
    let handler = Arc::clone(&recorder);
    let answer = runtime.block_on(async move {
        let (client_io, server_io) = tokio::io::duplex(PIPE);
        let (_trigger, watcher) = drain::channel();
        let settings = settings();
        tokio::spawn(async move {
            let addresses = (PEER_ADDR, LOCAL_ADDR);
            let _ =
                serve_connection(server_io, peer().into(), addresses, &settings, handler, watcher).await;
        });
        tokio::time::timeout(DEADLINE, client(client_io))
            .await
            .ok()
            .flatten()
    });
    drop(runtime);
    let seen = std::mem::take(
        &mut *recorder
            .seen
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()),
    );
    (answer, seen)
}

/// Mode 1: one request through a real h2 client.
fn structured(text: &str, connect: bool) {
    let mut lines = text.lines();
    let authority_text = lines.next().unwrap_or_default();
    let Ok(uri_authority) = authority_text.parse::<http::uri::Authority>() else {
        return;
    };
    let uri = if connect {
        Uri::from(uri_authority)
    } else {
        let Ok(uri) = format!("http://{uri_authority}/").parse::<Uri>() else {
            return;
        };
        uri
    };
    let mut headers = HeaderMap::new();
    for line in lines {
        let Some((name, value)) = line.split_once(": ") else {
            continue;
        };
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            headers.append(name, value);
        }
    }
    let method = if connect {
        Method::CONNECT
    } else {
        Method::GET
    };
    let mut request = Request::new(());
    *request.method_mut() = method.clone();
    *request.uri_mut() = uri;
    *request.headers_mut() = headers.clone();

    let (status, seen) = serve(|io| async move {
        let (send_request, connection) = h2::client::handshake(io).await.ok()?;
        tokio::spawn(connection);
        let mut send_request = send_request.ready().await.ok()?;
        let (response, _stream) = send_request.send_request(request, true).ok()?;
        Some(response.await.ok()?.status())
    });
    let Some(status) = status else {
        // h2 refused to send it, or the server reset the stream: the
        // request never reached our checks.
        assert!(seen.is_empty());
        return;
    };
    let authority = authority_text.parse::<Authority>();
    match (&method, &authority) {
        (&Method::CONNECT, Ok(authority)) => {
            let [seen] = seen.as_slice() else {
                panic!("the handler saw {} requests", seen.len());
            };
            assert_eq!(&seen.authority, authority);
            assert_eq!(seen.peer_identity, peer());
            assert_eq!((seen.peer_addr, seen.local_addr), (PEER_ADDR, LOCAL_ADDR));
            for (name, value) in &headers {
                assert!(
                    seen.headers.get_all(name).iter().any(|seen| seen == value),
                    "{name} lost"
                );
            }
            let expected = if port(authority) % 2 == 0 {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            assert_eq!(status, expected);
        }
        _ => {
            assert_eq!(status, StatusCode::BAD_REQUEST, "{method} {authority_text}");
            assert!(seen.is_empty());
        }
    }
}

/// Mode 2: raw frames after the preface; the handler checks what it sees.
fn raw(frames: &[u8]) {
    let mut input = PREFACE.to_vec();
    input.extend_from_slice(frames);
    let _ = serve(|io| async move {
        let (mut reader, mut writer) = tokio::io::split(io);
        // Read everything the server sends, so that it never waits on us.
        tokio::spawn(async move {
            let _ = tokio::io::copy(&mut reader, &mut tokio::io::sink()).await;
        });
        writer.write_all(&input).await.ok()?;
        // Let the server take every request in before it sees the end of
        // the connection (an h2 server reports the end rather than the
        // streams still queued); the clock jumps ahead when all wait.
        tokio::time::sleep(Duration::from_secs(1)).await;
        writer.shutdown().await.ok()?;
        tokio::time::sleep(Duration::from_secs(30)).await;
        Some(())
    });
}

fuzz_target!(|data: &[u8]| {
    let Some((mode, rest)) = data.split_first() else {
        return;
    };
    match mode & 0b11 {
        0 => {
            let Ok(text) = std::str::from_utf8(rest) else {
                return;
            };
            if let Ok(authority) = text.parse::<Authority>() {
                check_authority(&authority);
            }
        }
        1 => {
            if let Ok(text) = std::str::from_utf8(rest) {
                structured(text, mode & 0x80 == 0);
            }
        }
        _ => raw(rest),
    }
});
