//! The forwarder against nameservers of the test's own on 127.0.0.1: the
//! query relayed as sent, under another id, and the response given back
//! with the client's; the upstreams a resolv.conf names.

use std::io::Write;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UdpSocket};

use super::*;
use crate::socket::LocalSockets;

/// A query with id 0x1234 and a few bytes after the header.
const QUERY: [u8; 16] = [0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4];

/// What the test nameservers answer: the query as received, flagged as a
/// response.
fn echoed(query: &[u8]) -> Vec<u8> {
    let mut response = query.to_vec();
    response[2] |= 0x80;
    response
}

#[tokio::test]
async fn a_udp_query_is_relayed_under_its_own_id_and_answered_with_the_clients() {
    let upstream = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = upstream.local_addr().unwrap();
    let served = tokio::spawn(async move {
        let mut buffer = [0; 512];
        let (length, from) = upstream.recv_from(&mut buffer).await.unwrap();
        let query = buffer[..length].to_vec();
        // A stray datagram with another id comes first and is not taken
        // for the answer.
        let mut stray = echoed(&query);
        stray[0] ^= 0xff;
        upstream.send_to(&stray, from).await.unwrap();
        upstream.send_to(&echoed(&query), from).await.unwrap();
        query
    });
    let forwarder = Forwarder::new(vec![addr]);
    let response = forwarder
        .forward(&LocalSockets::default(), &QUERY, 0x1234, Transport::Udp)
        .await
        .unwrap();
    let relayed = served.await.unwrap();
    assert_eq!(relayed[2..], QUERY[2..], "the query is relayed as sent");
    assert_eq!(response[..2], [0x12, 0x34], "the client's id is put back");
    assert_eq!(response[2..], echoed(&QUERY)[2..]);
}

#[tokio::test]
async fn a_tcp_query_is_relayed_over_tcp_with_its_length() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let length = stream.read_u16().await.unwrap();
        let mut query = vec![0; usize::from(length)];
        stream.read_exact(&mut query).await.unwrap();
        let response = echoed(&query);
        stream
            .write_u16(u16::try_from(response.len()).unwrap())
            .await
            .unwrap();
        stream.write_all(&response).await.unwrap();
    });
    let forwarder = Forwarder::new(vec![addr]);
    let response = forwarder
        .forward(&LocalSockets::default(), &QUERY, 0x1234, Transport::Tcp)
        .await
        .unwrap();
    assert_eq!(response, echoed(&QUERY));
}

#[tokio::test]
async fn an_upstream_that_refuses_is_an_error_for_the_caller_to_answer() {
    // A port nothing listens on: the connection is refused at once.
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let forwarder = Forwarder::new(vec![addr]);
    let error = forwarder
        .forward(&LocalSockets::default(), &QUERY, 0x1234, Transport::Tcp)
        .await
        .unwrap_err();
    assert!(
        matches!(error, DnsError::Upstream { upstream, .. } if upstream == addr),
        "{error}"
    );
    let none = Forwarder::new(Vec::new())
        .forward(&LocalSockets::default(), &QUERY, 0x1234, Transport::Udp)
        .await
        .unwrap_err();
    assert!(matches!(none, DnsError::NoUpstream(_)), "{none}");
}

#[test]
fn the_upstreams_are_the_nameservers_of_the_resolv_conf_on_port_53() {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    writeln!(file, "search default.svc.cluster.local svc.cluster.local\nnameserver 198.18.0.53\nnameserver fd00::53\noptions ndots:5").unwrap();
    let forwarder = Forwarder::from_resolv_conf(file.path()).unwrap();
    assert_eq!(
        forwarder.upstreams(),
        [
            "198.18.0.53:53".parse().unwrap(),
            "[fd00::53]:53".parse().unwrap()
        ]
    );

    let mut empty = tempfile::NamedTempFile::new().unwrap();
    writeln!(empty, "search example.com").unwrap();
    assert!(Forwarder::from_resolv_conf(empty.path()).is_err());
    let missing = Forwarder::from_resolv_conf(Path::new("/nonexistent/resolv.conf")).unwrap_err();
    assert!(
        matches!(missing, DnsError::ReadResolvConf { .. }),
        "{missing}"
    );
}
