#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test
//! An application tunnel speaking PROXY, over real sockets on loopback: a
//! dedicated `ztunnel` (local config file, certificate from the real CA
//! in-process) serves a workload with `applicationTunnel {protocol: PROXY,
//! port: P}`; an HBONE client with a workload certificate CONNECTs to it
//! naming another address, and the application listening on 127.0.0.1:P
//! reads a PROXY v2 header (checked byte by byte against the
//! specification, not decoded by our encoder) with the client's address,
//! the authority and the client's SPIFFE URI, then the tunnelled bytes.
//! The client's 200 carries the serving workload's `baggage`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use http::HeaderMap;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use ztunnel_certs::identity::Identity;
use ztunnel_proxy::hbone::{Authority, Baggage, H2Settings, HboneConnection};
use ztunnel_test_support::ca::{PodRef, TestCa};
use ztunnel_test_support::ports::unused_loopback_port;
use ztunnel_test_support::process::LoggedChild;

/// The workload the proxy serves: the tunnel's owner (a waypoint, say).
const SERVER: &str = "spiffe://cluster.local/ns/default/sa/waypoint";
/// The workload the client presents.
const CLIENT: &str = "spiffe://cluster.local/ns/default/sa/client";
/// Where the client says it is going: not the address it dials, which an
/// application tunnel accepts (AMBIENT.md §2.3).
const AUTHORITY: &str = "127.0.0.2:8080";
/// Bound on start-up (the certificate comes from the CA) and on each read.
const PATIENCE: Duration = Duration::from_secs(30);

/// A running `ztunnel`.
type Ztunnel = LoggedChild;

fn spawn_ztunnel(dir: &Path, ca: &TestCa, inbound: SocketAddr) -> Ztunnel {
    let log = dir.join("ztunnel.log");
    let file = std::fs::File::create(&log).unwrap();
    let port = || unused_loopback_port().unwrap().to_string();
    let child = Command::new(env!("CARGO_BIN_EXE_ztunnel"))
        .env_clear()
        .env("PROXY_MODE", "dedicated")
        .env("PROXY_WORKLOAD_INFO", "default/waypoint-0/waypoint")
        .env("LOCAL_XDS_PATH", dir.join("local.yaml"))
        .env("CA_ADDRESS", ca.address())
        .env("CA_ROOT_CA", ca.root_cert_path())
        .env("AUTH_TOKEN", dir.join("waypoint.token"))
        .env("ZTUNNEL_INBOUND_ADDR", inbound.to_string())
        .env("ZTUNNEL_OUTBOUND_ADDR", "127.0.0.1:0")
        .env("ZTUNNEL_INBOUND_PLAINTEXT_ADDR", "127.0.0.1:0")
        .env("ZTUNNEL_ADMIN_ADDR", port())
        .env("ZTUNNEL_STATS_ADDR", port())
        .env("ZTUNNEL_READINESS_ADDR", port())
        .env("ZTUNNEL_WORKER_THREADS", "1")
        .env("RUST_LOG", "info,access=debug")
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    LoggedChild::new("ztunnel", child, log)
}

/// Dials the proxy's HBONE port as the client workload, retrying while
/// the proxy starts, and opens a tunnel to [`AUTHORITY`]; returns the
/// client's own TCP address (the PROXY header's source), the stream and
/// what the 200's `baggage` said of the serving workload.
async fn open_tunnel(
    ca: &TestCa,
    inbound: SocketAddr,
) -> (SocketAddr, ztunnel_proxy::hbone::H2Stream, Baggage) {
    let cert = ca.issue(&CLIENT.parse().unwrap()).unwrap();
    let server: Identity = SERVER.parse().unwrap();
    let tls = Arc::new(ztunnel_certs::tls::client_config(&cert, vec![server]).unwrap());
    let authority: Authority = AUTHORITY.parse().unwrap();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let attempt = async {
            let tcp = tokio::net::TcpStream::connect(inbound).await.ok()?;
            let local = tcp.local_addr().ok()?;
            let connection: HboneConnection =
                ztunnel_proxy::hbone::connect(tcp, Arc::clone(&tls), &H2Settings::default(), None)
                    .await
                    .ok()?;
            let (stream, baggage) = connection
                .send_connect_reading_baggage(&authority, HeaderMap::new())
                .await
                .ok()?;
            Some((local, stream, baggage))
        };
        if let Some(opened) = attempt.await {
            return opened;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no tunnel within {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The header the specification (haproxy's proxy-protocol.txt §2.2) says
/// a TCP/IPv4 connection from `source` to `destination` with a 0xD0 TLV
/// holding `identity` has, written out field by field.
fn expected_header(source: SocketAddr, destination: SocketAddr, identity: &str) -> Vec<u8> {
    let (SocketAddr::V4(source), SocketAddr::V4(destination)) = (source, destination) else {
        panic!("IPv4 only here");
    };
    let mut header = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    header.push(0x21); // version 2, PROXY
    header.push(0x11); // AF_INET, STREAM
    let length = 4 + 4 + 2 + 2 + 1 + 2 + identity.len();
    header.extend((length as u16).to_be_bytes());
    header.extend(source.ip().octets());
    header.extend(destination.ip().octets());
    header.extend(source.port().to_be_bytes());
    header.extend(destination.port().to_be_bytes());
    header.push(0xD0);
    header.extend((identity.len() as u16).to_be_bytes());
    header.extend(identity.as_bytes());
    header
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_tunnel_reads_the_client_the_authority_and_its_identity_before_the_data() {
    ztunnel_certs::tls::install_provider();
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::start_here(
        unused_loopback_port().unwrap(),
        "cluster.local",
        "- {name: waypoint-0, namespace: default, uid: uid-waypoint, serviceAccount: waypoint, nodeName: node-a, phase: Running}\n",
    )
    .unwrap();
    ca.write_token(
        &PodRef {
            namespace: "default",
            service_account: "waypoint",
            name: "waypoint-0",
            uid: "uid-waypoint",
            node: Some("node-a"),
        },
        &dir.path().join("waypoint.token"),
    )
    .unwrap();

    // The tunnel's listener, on loopback as LOCALHOST_APP_TUNNEL dials it.
    let app = TcpListener::bind("127.0.0.1:0").unwrap();
    let tunnel_port = app.local_addr().unwrap().port();
    std::fs::write(
        dir.path().join("local.yaml"),
        format!(
            "\
workloads:
- uid: uid-waypoint
  name: waypoint-0
  namespace: default
  serviceAccount: waypoint
  workloadName: waypoint
  canonicalName: waypoint
  workloadIps: [127.0.0.1]
  protocol: HBONE
  node: node-a
  applicationTunnel: {{protocol: PROXY, port: {tunnel_port}}}
  services: {{}}
"
        ),
    )
    .unwrap();
    let inbound = unused_loopback_port().unwrap();
    let _ztunnel = spawn_ztunnel(dir.path(), &ca, inbound);

    let accepted = std::thread::spawn(move || {
        let (mut stream, _) = app.accept().unwrap();
        stream.set_read_timeout(Some(PATIENCE)).unwrap();
        let mut received = Vec::new();
        let mut buf = [0u8; 4096];
        // Until the client's bytes follow the header (or the stream ends).
        while !received.ends_with(b"hello") {
            match stream.read(&mut buf).unwrap() {
                0 => break,
                n => received.extend_from_slice(&buf[..n]),
            }
        }
        stream.write_all(b"world").unwrap();
        received
    });

    let (client, mut tunnel, baggage) = open_tunnel(&ca, inbound).await;
    assert_eq!(
        (
            baggage.namespace.as_deref(),
            baggage.workload_name.as_deref(),
            baggage.canonical_name.as_deref()
        ),
        (Some("default"), Some("waypoint"), Some("waypoint")),
        "the 200 says which workload serves the tunnel"
    );
    tunnel.write_all(b"hello").await.unwrap();
    tunnel.flush().await.unwrap();
    let mut answer = [0u8; 5];
    tokio::time::timeout(PATIENCE, tunnel.read_exact(&mut answer))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        &answer, b"world",
        "the application answers through the tunnel"
    );

    let received = accepted.join().unwrap();
    let mut expected = expected_header(client, AUTHORITY.parse().unwrap(), CLIENT);
    expected.extend_from_slice(b"hello");
    assert_eq!(
        received, expected,
        "the PROXY header (source: the HBONE peer {client}, destination: the authority, \
         TLV 0xD0: the client's identity), then the data"
    );
}
