#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test
//! The control plane's port under peers that connect and send nothing: a
//! thousand such connections held open do not delay an honest ztunnel's
//! certificate request or xDS stream, and one source cannot hold more
//! than its share of pending handshakes (the rest are closed at once and
//! counted). Past the handshake, a connection that never sends its
//! HTTP/2 preface, or never authenticates a request, is closed after a
//! bound, and one source holds only its share of established connections.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant, SystemTime};

use tokio::io::AsyncReadExt;
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Request;
use ztunnel_certs::csr::CertRequest;
use ztunnel_control_plane::ca::authn::{DEFAULT_AUDIENCE, DEFAULT_ISSUER};
use ztunnel_control_plane::ca::connection::ConnectionLimits;
use ztunnel_control_plane::ca::token::PodToken;
use ztunnel_proto::envoy::config::core::v3::Node;
use ztunnel_proto::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use ztunnel_proto::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use ztunnel_proto::xds_types::ADDRESS_TYPE_URL;

#[path = "support/ca_client.rs"]
#[allow(dead_code)] // Shared by the test crates; this one uses a part.
mod ca_client;
#[path = "support/server.rs"]
#[allow(dead_code)]
mod test_server;

const MESH: &str = "\
pods:
- {name: ztunnel-a, namespace: istio-system, uid: uid-za, serviceAccount: ztunnel, nodeName: node-a}
- {name: app-a, namespace: default, uid: uid-app, serviceAccount: app, nodeName: node-a, ips: [10.0.0.10]}
";

/// Silent connections held open.
const SILENT: usize = 1_000;

/// The bound the issue sets on an honest caller's answer while they are.
const ANSWERED_WITHIN: Duration = Duration::from_secs(1);

/// The most handshakes one source may have pending (`ca/server.rs`).
const PER_SOURCE: usize = 16;

/// Raises this process's descriptor limit to what the test holds, with
/// room to spare (each silent connection costs one here and one in the
/// server).
fn raise_descriptor_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    let wanted = 8_192.min(hard).max(soft);
    setrlimit(Resource::RLIMIT_NOFILE, wanted, hard).unwrap();
    assert!(
        wanted >= 4 * SILENT as u64,
        "the descriptor limit ({hard}) is too low for the test"
    );
}

/// A TCP connection to `server` from `source`, that then sends nothing.
async fn silent(source: Ipv4Addr, server: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(IpAddr::V4(source), 0)).unwrap();
    socket.connect(server).await.unwrap()
}

fn ztunnel_token(plane: &test_server::TestServer) -> String {
    let token = PodToken {
        issuer: DEFAULT_ISSUER.into(),
        audiences: vec![DEFAULT_AUDIENCE.into()],
        namespace: "istio-system".into(),
        service_account: "ztunnel".into(),
        pod_name: "ztunnel-a".into(),
        pod_uid: "uid-za".into(),
        node_name: None,
        ttl: Duration::from_secs(3600),
    };
    plane.signer.mint(&token, SystemTime::now()).unwrap()
}

/// How long an honest ztunnel waits for a certificate for its own pod,
/// the CSR made beforehand.
async fn certificate_takes(plane: &test_server::TestServer, token: &str) -> Duration {
    let identity = "spiffe://cluster.local/ns/default/sa/app".parse().unwrap();
    let csr = CertRequest::generate(&identity).unwrap();
    let request = ca_client::request(
        Some(token),
        csr.csr_pem(),
        Some("spiffe://cluster.local/ns/default/sa/app"),
        0,
    );
    let started = Instant::now();
    let mut client = ca_client::connect(plane.addr, plane.issuer.roots()).await;
    let response = client.create_certificate(request).await.unwrap();
    assert!(!response.into_inner().cert_chain.is_empty());
    started.elapsed()
}

/// How long an honest ztunnel waits for its first xDS response.
async fn xds_takes(plane: &test_server::TestServer, token: &str) -> Duration {
    let started = Instant::now();
    let channel = ca_client::channel(plane.addr, plane.issuer.roots()).await;
    let mut client = AggregatedDiscoveryServiceClient::new(channel);
    let (requests, outbound) = mpsc::channel(4);
    requests
        .send(DeltaDiscoveryRequest {
            node: Some(Node {
                id: "ztunnel~10.0.0.1~ztunnel-a.istio-system~istio-system.svc.cluster.local".into(),
                ..Node::default()
            }),
            type_url: ADDRESS_TYPE_URL.into(),
            ..DeltaDiscoveryRequest::default()
        })
        .await
        .unwrap();
    let mut request = Request::new(ReceiverStream::new(outbound));
    let value = format!("Bearer {token}").parse().unwrap();
    request.metadata_mut().insert("authorization", value);
    let mut inbound = client
        .delta_aggregated_resources(request)
        .await
        .unwrap()
        .into_inner();
    let response = inbound.message().await.unwrap().unwrap();
    assert_eq!(response.type_url, ADDRESS_TYPE_URL);
    assert!(!response.resources.is_empty(), "the pod's workload");
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_delay_no_honest_caller_and_one_source_holds_only_its_share() {
    raise_descriptor_limit();
    let plane = test_server::start(MESH).await;
    let token = ztunnel_token(&plane);

    // A thousand silent connections from 250 addresses, four each: all
    // within their sources' share, all pending at once.
    let mut held = Vec::with_capacity(2 * SILENT);
    for index in 0..SILENT {
        let source = Ipv4Addr::new(127, 0, 1, 1 + (index / 4) as u8);
        held.push(silent(source, plane.addr).await);
    }
    let certificate = certificate_takes(&plane, &token).await;
    let xds = xds_takes(&plane, &token).await;
    eprintln!("with {SILENT} silent connections: certificate in {certificate:?}, xDS in {xds:?}");
    assert!(
        certificate < ANSWERED_WITHIN,
        "the certificate took {certificate:?}"
    );
    assert!(xds < ANSWERED_WITHIN, "the xDS response took {xds:?}");

    // A thousand more from one address: its share stays pending, the rest
    // are closed at once.
    let one = Ipv4Addr::new(127, 0, 2, 1);
    let mut from_one = Vec::with_capacity(SILENT);
    for _ in 0..SILENT {
        from_one.push(silent(one, plane.addr).await);
    }
    let mut closed = 0;
    for stream in &mut from_one {
        let mut byte = [0; 1];
        if let Ok(Ok(0) | Err(_)) =
            tokio::time::timeout(Duration::from_millis(50), stream.read(&mut byte)).await
        {
            closed += 1;
        }
    }
    assert_eq!(
        closed,
        SILENT - PER_SOURCE,
        "all but the source's share are closed at once"
    );
    let metrics = ca_client::metrics(plane.metrics_addr).await;
    let refused = format!(
        "ca_connections_refused_total{{reason=\"pending_per_source\"}} {}",
        SILENT - PER_SOURCE
    );
    assert!(
        metrics.lines().any(|line| line == refused),
        "{refused} in\n{metrics}"
    );
    let certificate = certificate_takes(&plane, &token).await;
    assert!(
        certificate < ANSWERED_WITHIN,
        "the certificate took {certificate:?}"
    );
    held.extend(from_one);
    drop(held);
}

/// Whether `stream` is closed by the server within `within`: EOF or an
/// error on a read. Nothing is ever sent to these connections, so a read
/// returns only when the server ends them.
async fn closed_within<S: tokio::io::AsyncRead + Unpin>(stream: &mut S, within: Duration) -> bool {
    let mut buffer = [0u8; 64];
    loop {
        match tokio::time::timeout(within, stream.read(&mut buffer)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            // The server's own HTTP/2 SETTINGS, sent at once.
            Ok(Ok(_)) => {}
        }
    }
}

/// The value of `ca_connections_refused_total{reason}` on the server.
async fn refused(plane: &test_server::TestServer, reason: &str) -> u64 {
    let text = ca_client::metrics(plane.metrics_addr).await;
    let prefix = format!("ca_connections_refused_total{{reason=\"{reason}\"}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .map_or(0, |count| count.trim().parse().unwrap())
}

#[tokio::test]
async fn past_tls_a_silent_connection_is_closed_and_one_source_holds_only_its_share() {
    let limits = ConnectionLimits {
        preface_timeout: Duration::from_secs(2),
        unauthenticated_timeout: Duration::from_secs(4),
        per_source: 3,
        total: 100,
    };
    let plane = test_server::start_limited(MESH, limits).await;
    let roots = plane.issuer.roots();

    // Three established connections that send nothing: the source's share.
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(ca_client::tls_only(plane.addr, roots).await);
    }
    // A fourth is closed as soon as its handshake is done.
    let mut fourth = ca_client::tls_only(plane.addr, roots).await;
    assert!(
        closed_within(&mut fourth, Duration::from_secs(1)).await,
        "the fourth established connection of one source is closed at once"
    );
    assert_eq!(refused(&plane, "established_per_source").await, 1);

    // The three send no preface: closed after its bound, counted.
    let started = Instant::now();
    for connection in &mut held {
        assert!(
            closed_within(connection, Duration::from_secs(10)).await,
            "a connection that never sends its preface is closed"
        );
    }
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "closed by the preface bound, not at once: {:?}",
        started.elapsed()
    );
    assert_eq!(refused(&plane, "preface_timeout").await, 3);

    // Their slots came back: a new connection is established again, and
    // an honest caller is served.
    let mut again = ca_client::tls_only(plane.addr, roots).await;
    assert!(!closed_within(&mut again, Duration::from_millis(500)).await);
    let token = ztunnel_token(&plane);
    certificate_takes(&plane, &token).await;
}

#[tokio::test]
async fn a_connection_that_never_authenticates_is_closed_and_an_authenticated_one_is_kept() {
    let limits = ConnectionLimits {
        preface_timeout: Duration::from_secs(5),
        unauthenticated_timeout: Duration::from_secs(1),
        ..ConnectionLimits::DEFAULT
    };
    let plane = test_server::start_limited(MESH, limits).await;
    let roots = plane.issuer.roots();
    let identity = "spiffe://cluster.local/ns/default/sa/app".parse().unwrap();
    let csr = CertRequest::generate(&identity).unwrap();
    let impersonate = Some("spiffe://cluster.local/ns/default/sa/app");

    // An honest caller authenticates its first request on its connection;
    // a junk one sends a request whose token does not.
    let token = ztunnel_token(&plane);
    let mut honest = ca_client::connect(plane.addr, roots).await;
    let request = ca_client::request(Some(&token), csr.csr_pem(), impersonate, 0);
    honest.create_certificate(request).await.unwrap();
    let mut junk = ca_client::connect(plane.addr, roots).await;
    let request = ca_client::request(Some("junk"), csr.csr_pem(), impersonate, 0);
    let refusal = junk.create_certificate(request).await.unwrap_err();
    assert_eq!(refusal.code(), tonic::Code::Unauthenticated);

    // Past the bound the junk connection is closed; the honest one stays.
    let closed = async {
        while refused(&plane, "unauthenticated_timeout").await == 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), closed)
        .await
        .expect("the connection that never authenticated is closed");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        refused(&plane, "unauthenticated_timeout").await,
        1,
        "only the junk connection is closed"
    );
    let request = ca_client::request(Some(&token), csr.csr_pem(), impersonate, 0);
    honest.create_certificate(request).await.unwrap();
}
