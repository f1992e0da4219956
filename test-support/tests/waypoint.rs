//! The test HBONE peers on loopback: a client (this file, through
//! `waypoint::hbone`) reaches an HBONE echo server through the waypoint and
//! through the east-west gateway, with certificates from one generated root,
//! and the refusals a test of the mesh relies on hold: a denied identity, an
//! unknown authority, an upstream of the wrong identity, TLS 1.2, another
//! trust domain, another root. One test runs them inside a namespace, as the tests of
//! the netns cluster will.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderValue, StatusCode};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::rustls::sign::SingleCertAndKey;
use ztunnel_certs::cert::WorkloadCertificate;
use ztunnel_certs::identity::Identity;
use ztunnel_certs::tls::client_config;
use ztunnel_test_support::ca::{TestRoot, foreign_certificate};
use ztunnel_test_support::netns::{self, NetNs};
use ztunnel_test_support::skip::skip;
use ztunnel_test_support::waypoint::hbone::{self, HboneError};
use ztunnel_test_support::waypoint::{
    EastWestGateway, EchoServer, Outcome, Record, Route, Waypoint,
};

/// What a test waits for an echo at most: a failure, not a hang.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(10);

/// The service authority a client asks the waypoint for: a VIP and port.
const SERVICE_VIP: &str = "10.96.0.10:80";

/// The authority of double HBONE, on both CONNECTs.
const SERVICE_HOST: &str = "echo.ns1.svc.cluster.local:80";

fn identity(service_account: &str) -> Identity {
    Identity::new("cluster.local", "ns1", service_account).unwrap()
}

/// One root, and a certificate from it per identity.
struct Mesh {
    root: TestRoot,
}

impl Mesh {
    fn new() -> Mesh {
        Mesh {
            root: TestRoot::generate("cluster.local").unwrap(),
        }
    }

    fn cert(&self, service_account: &str) -> WorkloadCertificate {
        self.root.issue(&identity(service_account)).unwrap()
    }

    fn server(&self) -> EchoServer {
        EchoServer::start(loopback(1), self.cert("server")).unwrap()
    }

    /// A waypoint routing [`SERVICE_VIP`] to `server` as its endpoint
    /// `127.0.0.1:8080`.
    fn waypoint(&self, server: &EchoServer) -> Waypoint {
        let route = Route {
            dial: server.addr(),
            authority: "127.0.0.1:8080".into(),
            identities: vec![server.identity().clone()],
        };
        let routes = HashMap::from([(SERVICE_VIP.to_owned(), route)]);
        Waypoint::start(loopback(2), self.cert("waypoint"), routes).unwrap()
    }
}

/// `127.0.0.<host>`, any port.
fn loopback(host: u8) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, host], 0))
}

/// The headers a ztunnel sends on a CONNECT (WIRE.md §4), those a record
/// keeps.
fn ztunnel_headers() -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(
        "baggage",
        HeaderValue::from_static("k8s.namespace.name=ns1,k8s.pod.name=client"),
    );
    headers.insert(
        "forwarded",
        HeaderValue::from_static("for=\"10.0.0.7:41000\""),
    );
    headers
}

/// A peer a client dials: where, and the identity it must present.
trait Peer {
    fn addr(&self) -> SocketAddr;
    fn identity(&self) -> &Identity;
}

impl Peer for Waypoint {
    fn addr(&self) -> SocketAddr {
        Waypoint::addr(self)
    }
    fn identity(&self) -> &Identity {
        Waypoint::identity(self)
    }
}

impl Peer for EastWestGateway {
    fn addr(&self) -> SocketAddr {
        EastWestGateway::addr(self)
    }
    fn identity(&self) -> &Identity {
        EastWestGateway::identity(self)
    }
}

/// Dials `peer` as `client`, asking for `authority`.
async fn dial(
    peer: &impl Peer,
    client: &WorkloadCertificate,
    authority: &str,
    headers: HeaderMap,
) -> Result<hbone::Tunnel, HboneError> {
    let config = Arc::new(client_config(client, vec![peer.identity().clone()]).unwrap());
    hbone::dial(peer.addr(), config, authority, headers).await
}

/// Sends `data`, half-closes, and reads until the other side half-closes.
async fn exchange(mut stream: impl AsyncRead + AsyncWrite + Unpin, data: &[u8]) -> Vec<u8> {
    tokio::time::timeout(EXCHANGE_TIMEOUT, async {
        stream.write_all(data).await.unwrap();
        stream.shutdown().await.unwrap();
        let mut echoed = Vec::new();
        stream.read_to_end(&mut echoed).await.unwrap();
        echoed
    })
    .await
    .expect("the echo came back in time")
}

fn outcomes(records: &[Record]) -> Vec<Outcome> {
    records.iter().map(|record| record.outcome).collect()
}

#[tokio::test]
async fn a_client_reaches_the_server_through_the_waypoint_which_the_server_sees_as_its_peer() {
    let mesh = Mesh::new();
    let server = mesh.server();
    let waypoint = mesh.waypoint(&server);
    let client = mesh.cert("client");

    let tunnel = dial(&waypoint, &client, SERVICE_VIP, ztunnel_headers())
        .await
        .unwrap();
    assert_eq!(exchange(tunnel, b"hello").await, b"hello");

    let [seen] = &waypoint.records()[..] else {
        panic!("one record at the waypoint");
    };
    assert_eq!(seen.identity, identity("client"));
    assert_eq!(seen.authority, SERVICE_VIP);
    assert_eq!(
        seen.baggage.as_deref(),
        Some("k8s.namespace.name=ns1,k8s.pod.name=client")
    );
    assert_eq!(seen.forwarded.as_deref(), Some("for=\"10.0.0.7:41000\""));
    assert_eq!(seen.peer.ip(), loopback(1).ip());
    assert_eq!(seen.outcome, Outcome::Forwarded);
    let [forwarded] = &server.records()[..] else {
        panic!("one record at the server");
    };
    assert_eq!(forwarded.identity, identity("waypoint"));
    assert_eq!(
        forwarded.peer.ip(),
        waypoint.addr().ip(),
        "dialled from its own IP"
    );
    assert_eq!(forwarded.authority, "127.0.0.1:8080");
    assert_eq!(
        forwarded.forwarded.as_deref(),
        Some("for=\"10.0.0.7:41000\""),
        "the client's own forwarded passes on"
    );
    assert_eq!(forwarded.baggage, None);
}

#[tokio::test]
async fn without_a_forwarded_header_the_waypoint_names_the_clients_address() {
    let mesh = Mesh::new();
    let server = mesh.server();
    let waypoint = mesh.waypoint(&server);
    let client = mesh.cert("client");

    let tunnel = dial(&waypoint, &client, SERVICE_VIP, HeaderMap::new())
        .await
        .unwrap();
    assert_eq!(exchange(tunnel, b"ping").await, b"ping");

    let peer = waypoint.records()[0].peer;
    let forwarded = server.records()[0].forwarded.clone();
    assert_eq!(forwarded, Some(format!("for=\"{peer}\"")));
}

#[tokio::test]
async fn a_denied_client_is_refused_and_the_server_sees_nothing_until_the_deny_is_removed() {
    let mesh = Mesh::new();
    let server = mesh.server();
    let waypoint = mesh.waypoint(&server);
    let client = mesh.cert("client");
    let connect = || dial(&waypoint, &client, SERVICE_VIP, ztunnel_headers());

    waypoint.deny(identity("client"));
    let refused = connect().await.unwrap_err();
    assert_eq!(refused.status(), Some(StatusCode::FORBIDDEN));
    assert!(server.records().is_empty());

    waypoint.allow(&identity("client"));
    let tunnel = connect().await.unwrap();
    assert_eq!(exchange(tunnel, b"again").await, b"again");
    assert_eq!(
        outcomes(&waypoint.records()),
        [Outcome::Denied, Outcome::Forwarded]
    );
    assert_eq!(server.records().len(), 1);
}

#[tokio::test]
async fn an_unknown_authority_or_an_unreachable_upstream_is_answered_503() {
    let mesh = Mesh::new();
    let server = mesh.server();
    let waypoint = mesh.waypoint(&server);
    let client = mesh.cert("client");
    // An upstream that does not answer as the identity the route expects.
    waypoint
        .set_route(
            "10.96.0.11:80",
            Route {
                dial: server.addr(),
                authority: "127.0.0.1:8080".into(),
                identities: vec![identity("someone-else")],
            },
        )
        .unwrap();

    for authority in ["10.96.0.99:80", "10.96.0.11:80"] {
        let refused = dial(&waypoint, &client, authority, HeaderMap::new())
            .await
            .unwrap_err();
        assert_eq!(refused.status(), Some(StatusCode::SERVICE_UNAVAILABLE));
    }
    assert_eq!(
        outcomes(&waypoint.records()),
        [Outcome::NoRoute, Outcome::UpstreamFailed(None)]
    );
    assert!(server.records().is_empty());
}

#[tokio::test]
async fn clients_of_another_trust_domain_or_root_are_refused_at_the_handshake() {
    let mesh = Mesh::new();
    let server = mesh.server();
    let waypoint = mesh.waypoint(&server);
    let other_domain = Identity::new("other.example", "ns1", "client").unwrap();
    // (presented certificate, why); each client trusts the mesh's root, so
    // only the waypoint's check of the client can refuse it.
    let cases = [
        (
            mesh.root.issue(&other_domain).unwrap(),
            "our root, another trust domain",
        ),
        (
            foreign_certificate(&identity("client")).unwrap(),
            "another root",
        ),
    ];
    for (presented, why) in cases {
        let mut config = client_config(&mesh.cert("client"), vec![identity("waypoint")]).unwrap();
        config.client_auth_cert_resolver = Arc::new(SingleCertAndKey::from(Arc::clone(
            presented.certified_key(),
        )));
        let refused = hbone::dial(
            waypoint.addr(),
            Arc::new(config),
            SERVICE_VIP,
            HeaderMap::new(),
        )
        .await
        .expect_err(why);
        assert_eq!(refused.status(), None, "{why}: refused before any CONNECT");
    }
    assert!(waypoint.records().is_empty());
    assert!(server.records().is_empty());
}

#[tokio::test]
async fn a_tls12_client_hello_is_answered_with_an_alert() {
    let mesh = Mesh::new();
    let server = mesh.server();
    let waypoint = mesh.waypoint(&server);

    let mut tcp = TcpStream::connect(waypoint.addr()).await.unwrap();
    tcp.write_all(&tls12_client_hello()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(EXCHANGE_TIMEOUT, tcp.read_to_end(&mut answer))
        .await
        .expect("the waypoint closed the connection")
        .unwrap();

    const ALERT: u8 = 0x15;
    assert_eq!(
        answer.first(),
        Some(&ALERT),
        "no ServerHello: {answer:02x?}"
    );
    assert!(waypoint.records().is_empty());
}

/// A ClientHello that offers TLS 1.2 only (no supported_versions extension),
/// with ECDHE-ECDSA and ECDHE-RSA AES-128-GCM, X25519 and ECDSA P-256:
/// written out byte by byte, so the refusal is checked against a client
/// that is neither rustls nor ours.
fn tls12_client_hello() -> Vec<u8> {
    fn extension(kind: u16, body: &[u8]) -> Vec<u8> {
        let mut out = kind.to_be_bytes().to_vec();
        out.extend_from_slice(&(body.len() as u16).to_be_bytes());
        out.extend_from_slice(body);
        out
    }
    let mut extensions = Vec::new();
    extensions.extend(extension(0x000a, &[0x00, 0x02, 0x00, 0x1d])); // groups: x25519
    extensions.extend(extension(0x000b, &[0x01, 0x00])); // point formats: uncompressed
    extensions.extend(extension(0x000d, &[0x00, 0x02, 0x04, 0x03])); // ecdsa_secp256r1_sha256
    let mut hello = vec![0x03, 0x03]; // TLS 1.2
    hello.extend_from_slice(&[0x5a; 32]); // random
    hello.push(0); // no session id
    hello.extend_from_slice(&[0x00, 0x04, 0xc0, 0x2b, 0xc0, 0x2f]); // two suites
    hello.extend_from_slice(&[0x01, 0x00]); // null compression
    hello.extend_from_slice(&(extensions.len() as u16).to_be_bytes());
    hello.extend(extensions);
    let mut handshake = vec![0x01, 0x00]; // ClientHello, 24-bit length
    handshake.extend_from_slice(&(hello.len() as u16).to_be_bytes());
    handshake.extend(hello);
    let mut record = vec![0x16, 0x03, 0x01]; // handshake record
    record.extend_from_slice(&(handshake.len() as u16).to_be_bytes());
    record.extend(handshake);
    record
}

#[tokio::test]
async fn double_hbone_through_the_gateway_reaches_the_server_as_the_client() {
    let mesh = Mesh::new();
    let server = mesh.server();
    let routes = HashMap::from([(SERVICE_HOST.to_owned(), server.addr())]);
    let gateway = EastWestGateway::start(loopback(3), mesh.cert("east-west"), routes).unwrap();
    let client = mesh.cert("client");

    let outer = dial(&gateway, &client, SERVICE_HOST, HeaderMap::new())
        .await
        .unwrap();
    let mut inner_headers = ztunnel_headers();
    inner_headers.insert("x-forwarded-network", HeaderValue::from_static("network-a"));
    let inner_config = Arc::new(client_config(&client, vec![identity("server")]).unwrap());
    let inner = hbone::connect(outer, inner_config, SERVICE_HOST, inner_headers)
        .await
        .unwrap();
    assert_eq!(exchange(inner, b"across").await, b"across");

    let [outer_seen] = &gateway.records()[..] else {
        panic!("one record at the gateway");
    };
    assert_eq!(outer_seen.identity, identity("client"));
    assert_eq!(outer_seen.authority, SERVICE_HOST);
    assert_eq!(outer_seen.outcome, Outcome::Forwarded);
    let [inner_seen] = &server.records()[..] else {
        panic!("one record at the server");
    };
    assert_eq!(
        inner_seen.identity,
        identity("client"),
        "the inner session is the client's, not the gateway's"
    );
    assert_eq!(inner_seen.authority, SERVICE_HOST);
    assert_eq!(
        inner_seen.peer.ip(),
        gateway.addr().ip(),
        "dialled from its own IP"
    );
    assert_eq!(
        inner_seen.baggage,
        ztunnel_headers()["baggage"].to_str().ok().map(Into::into)
    );
}

#[tokio::test]
async fn the_gateway_answers_503_for_an_unknown_service_or_a_dead_endpoint() {
    let mesh = Mesh::new();
    let dead = ztunnel_test_support::ports::unused_loopback_port().unwrap();
    let routes = HashMap::from([(SERVICE_HOST.to_owned(), dead)]);
    let gateway = EastWestGateway::start(loopback(3), mesh.cert("east-west"), routes).unwrap();
    let client = mesh.cert("client");

    for authority in ["other.ns1.svc.cluster.local:80", SERVICE_HOST] {
        let refused = dial(&gateway, &client, authority, HeaderMap::new())
            .await
            .unwrap_err();
        assert_eq!(refused.status(), Some(StatusCode::SERVICE_UNAVAILABLE));
    }
    assert_eq!(
        outcomes(&gateway.records()),
        [Outcome::NoRoute, Outcome::UpstreamFailed(None)]
    );
}

#[test]
fn peers_started_in_a_namespace_listen_and_dial_there() {
    if let Some(reason) = netns::unavailable() {
        skip(reason);
        return;
    }
    let ns = NetNs::create("waypoint").unwrap();
    // Addresses only the namespace has: binding them elsewhere would fail.
    ns.exec(&["ip", "addr", "add", "198.18.0.1/32", "dev", "lo"])
        .unwrap();
    ns.exec(&["ip", "addr", "add", "198.18.0.2/32", "dev", "lo"])
        .unwrap();
    let mesh = Mesh::new();
    let server = EchoServer::start_in(
        &ns,
        "198.18.0.1:15008".parse().unwrap(),
        mesh.cert("server"),
    )
    .unwrap();
    let route = Route {
        dial: server.addr(),
        authority: "198.18.0.1:8080".into(),
        identities: vec![server.identity().clone()],
    };
    let routes = HashMap::from([(SERVICE_VIP.to_owned(), route)]);
    let waypoint = Waypoint::start_in(
        &ns,
        "198.18.0.2:15008".parse().unwrap(),
        mesh.cert("waypoint"),
        routes,
    )
    .unwrap();
    let client = mesh.cert("client");

    let echoed = ns
        .run(|| {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                let tunnel = dial(&waypoint, &client, SERVICE_VIP, HeaderMap::new())
                    .await
                    .unwrap();
                exchange(tunnel, b"inside").await
            })
        })
        .unwrap();

    assert_eq!(echoed, b"inside");
    assert_eq!(server.records()[0].peer.ip(), waypoint.addr().ip());
}
