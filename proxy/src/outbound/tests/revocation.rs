//! Open HBONE connections closed when a revocation list installed while
//! they are open revokes their peer, over loopback between the proxy's own
//! ends: client proxies' outbound path (pool, HBONE client, copy, report)
//! and server proxies' 15008 listeners (TLS, HBONE server, admission, dial,
//! copy, report), with an echo application behind each server. In each
//! direction the revoked peer's connection closes and its stream ends,
//! reported as `CERT_REVOKED` and counted, while a connection to or from an
//! unrevoked peer stays open and keeps carrying bytes. Only the capture
//! (SO_ORIGINAL_DST) is left out: each test connects its application to
//! the client proxy by hand.
//!
//! The lists in force are process-wide: each test's CA has a name of its
//! own, so its lists revoke nothing of another test's.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime};

use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use ztunnel_certs::cert::WorkloadCertificate;
use ztunnel_certs::identity::Identity;
use ztunnel_certs::issuer::{Issuer, SigningMaterial, generate_root};

use super::*;
use crate::config::local;
use crate::context::LocalPods;
use crate::drain::DrainTrigger;
use crate::identity::ca_client::CaClientError;
use crate::identity::manager::CertificateSource;
use crate::metrics::encode;
use crate::outbound::test_proxy::{self, TestProxy};
use crate::pool::PoolConfig;
use crate::resolve::Resolver;

/// How long any step may take before the test fails instead of hanging.
const PATIENCE: Duration = Duration::from_secs(10);

/// The mesh: two clients and two servers, each a proxy of its own. The
/// servers' IPs are distinct loopback addresses, where their listeners and
/// applications are bound.
const MESH: &str = r#"
workloads:
- {uid: client-0, name: client-0, namespace: default, serviceAccount: client, workloadIps: [127.0.0.2], protocol: HBONE, services: {}}
- {uid: client-1, name: client-1, namespace: default, serviceAccount: other, workloadIps: [127.0.0.3], protocol: HBONE, services: {}}
- {uid: server-0, name: server-0, namespace: default, serviceAccount: server, workloadIps: [127.0.0.1], protocol: HBONE, services: {}}
- {uid: server-1, name: server-1, namespace: default, serviceAccount: backup, workloadIps: [127.0.0.4], protocol: HBONE, services: {}}
"#;

fn id(service_account: &str) -> Identity {
    Identity::new("cluster.local", "default", service_account).unwrap()
}

/// A CA of a name no other test's CA has, which remembers the serial of
/// every certificate it issued, to revoke them.
#[derive(Clone)]
struct Ca {
    issuer: Arc<Issuer>,
    root_cert_pem: String,
    root_key_pem: String,
    issued: Arc<Mutex<Vec<(Identity, rcgen::SerialNumber)>>>,
}

impl Ca {
    fn new() -> Ca {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let number = NEXT.fetch_add(1, Ordering::Relaxed);
        let name = format!("revocation-{number}.test");
        let root = generate_root(&name, SystemTime::now()).unwrap();
        let material = SigningMaterial {
            root_cert_pem: root.cert_pem.clone(),
            root_key_pem: Some(root.key_pem.clone()),
            ..SigningMaterial::default()
        };
        Ca {
            issuer: Arc::new(Issuer::new(&material).unwrap()),
            root_cert_pem: root.cert_pem,
            root_key_pem: root.key_pem.to_string(),
            issued: Arc::default(),
        }
    }

    fn issue(&self, identity: &Identity) -> WorkloadCertificate {
        let cert = test_proxy::issue(&self.issuer, identity);
        let serial = serial_number(cert.leaf().serial());
        self.issued.lock().unwrap().push((identity.clone(), serial));
        cert
    }

    /// A list, signed by the root, revoking every certificate issued to
    /// `identity`.
    fn revoking(&self, identity: &Identity) -> String {
        let key = rcgen::KeyPair::from_pem(&self.root_key_pem).unwrap();
        let issuer = rcgen::Issuer::from_ca_cert_pem(&self.root_cert_pem, key).unwrap();
        let now = time::OffsetDateTime::now_utc();
        let revoked_certs = self
            .issued
            .lock()
            .unwrap()
            .iter()
            .filter(|(issued_to, _)| issued_to == identity)
            .map(|(_, serial)| rcgen::RevokedCertParams {
                serial_number: serial.clone(),
                revocation_time: now - time::Duration::minutes(1),
                reason_code: Some(rcgen::RevocationReason::KeyCompromise),
                invalidity_date: None,
            })
            .collect();
        rcgen::CertificateRevocationListParams {
            this_update: now - time::Duration::minutes(5),
            next_update: now + time::Duration::hours(1),
            crl_number: rcgen::SerialNumber::from_slice(&[1]),
            issuing_distribution_point: None,
            revoked_certs,
            key_identifier_method: rcgen::KeyIdMethod::Sha256,
        }
        .signed_by(&issuer)
        .unwrap()
        .pem()
        .unwrap()
    }
}

/// A serial number from its decimal digits.
fn serial_number(decimal: &str) -> rcgen::SerialNumber {
    // Big-endian; each digit multiplies by ten and adds, carrying upwards.
    let mut bytes = vec![0u8];
    for digit in decimal.bytes().map(|digit| u32::from(digit - b'0')) {
        let mut carry = digit;
        for byte in bytes.iter_mut().rev() {
            let value = u32::from(*byte) * 10 + carry;
            *byte = (value & 0xff) as u8;
            carry = value >> 8;
        }
        if carry > 0 {
            bytes.insert(0, carry as u8);
        }
    }
    let first = bytes.iter().position(|byte| *byte != 0).unwrap_or(0);
    rcgen::SerialNumber::from_slice(&bytes[first..])
}

impl CertificateSource for Ca {
    fn fetch(
        &self,
        identity: &Identity,
    ) -> impl Future<Output = Result<WorkloadCertificate, CaClientError>> + Send {
        std::future::ready(Ok(self.issue(identity)))
    }
}

/// One proxy, configured with `CRL_PATH`, and the registry of its metrics.
struct Node {
    proxy: Arc<Proxy>,
    registry: Registry,
    _drain: DrainTrigger,
}

impl Node {
    fn new(ca: &Ca, crl: &Path, name: &str, service_account: &str) -> Node {
        Node::serving(ca, crl, name, service_account, None)
    }

    /// A proxy whose node also serves `local_pods` (the same-node path).
    fn serving(
        ca: &Ca,
        crl: &Path,
        name: &str,
        service_account: &str,
        local_pods: Option<Arc<LocalPods<Proxy>>>,
    ) -> Node {
        let state = local::parse(MESH, "test.yaml".as_ref())
            .unwrap()
            .into_state();
        let (proxy, registry, trigger) = TestProxy {
            name,
            service_account,
            args: &["--crl-path", crl.to_str().unwrap()],
            pool: PoolConfig::default(),
            resolver: Resolver::with_nameservers(&[], false).unwrap(),
            local_pods,
        }
        .build(ca.clone(), state);
        Node {
            proxy: Arc::new(proxy),
            registry,
            _drain: trigger,
        }
    }

    /// Whether the metrics have a line starting with `start` and holding
    /// each of `holding`, once the reports in flight are closed.
    async fn eventually_counts(&self, start: &str, holding: &[&str]) -> bool {
        let found = || {
            let text = encode(&self.registry).unwrap();
            text.lines()
                .any(|line| line.starts_with(start) && holding.iter().all(|h| line.contains(h)))
        };
        let wait = async {
            while !found() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        tokio::time::timeout(PATIENCE, wait).await.is_ok()
    }

    fn metrics(&self) -> String {
        encode(&self.registry).unwrap()
    }
}

/// A server at `ip`: its proxy's HBONE listener and an echo application
/// behind it.
struct Server {
    node: Node,
    identity: Identity,
    hbone: SocketAddr,
    app: SocketAddr,
}

impl Server {
    async fn start(ca: &Ca, crl: &Path, name: &str, service_account: &str, ip: &str) -> Server {
        let node = Node::new(ca, crl, name, service_account);
        let app = TcpListener::bind((ip, 0)).await.unwrap();
        let hbone = TcpListener::bind((ip, 0)).await.unwrap();
        let (app_addr, hbone_addr) = (app.local_addr().unwrap(), hbone.local_addr().unwrap());
        tokio::spawn(echo(app));
        tokio::spawn(crate::inbound::hbone::serve_hbone(
            Arc::clone(&node.proxy),
            hbone,
        ));
        Server {
            node,
            identity: id(service_account),
            hbone: hbone_addr,
            app: app_addr,
        }
    }
}

async fn echo(listener: TcpListener) {
    loop {
        let (mut stream, _peer) = listener.accept().await.unwrap();
        tokio::spawn(async move {
            let (mut read, mut write) = stream.split();
            let _ = tokio::io::copy(&mut read, &mut write).await;
        });
    }
}

/// Connects `client`'s application to `server`'s: the application's socket
/// is handed to the client proxy's outbound path as if captured, which
/// opens an HBONE stream on a pooled connection (or, where the client's
/// node serves the server's pod too, takes the same-node path) and copies.
/// Returns the application's end.
async fn connect(client: &Node, server: &Server) -> TcpStream {
    try_connect(client, server).await.unwrap().0
}

/// [`connect`] on the same-node path, which it must take.
async fn connect_same_node(client: &Node, server: &Server) -> TcpStream {
    let (stream, same_node) = try_connect(client, server).await.unwrap();
    assert!(same_node, "the connection took the same-node path");
    stream
}

/// [`connect`], and whether it took the same-node path; or why the
/// connection was refused.
async fn try_connect(client: &Node, server: &Server) -> Result<(TcpStream, bool), OutboundError> {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let application = TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (captured, peer) = listener.accept().await.unwrap();
    let proxy = Arc::clone(&client.proxy);
    let workload = {
        let state = proxy.node.state.read();
        let ip = server.app.ip();
        let found = state.workloads().find(|w| w.addresses.contains(&ip));
        Arc::clone(found.unwrap())
    };
    let route = HboneRoute {
        dial: server.hbone,
        authority: server.app,
        expected: vec![server.identity.clone()],
        workload,
        service: None,
        waypoint: None,
    };
    let source = proxy.local_workload();
    let opening = open_hbone(&proxy, peer, source.as_deref(), &route);
    let (report, connected) = tokio::time::timeout(PATIENCE, opening).await.unwrap();
    let shown = Shown {
        src: peer,
        original_dst: Some(server.app),
        actual_dst: server.hbone,
        protocol: ShownProtocol::Hbone,
    };
    let upstream = match connected {
        Ok(upstream) => upstream,
        Err(error) => {
            let flags = flags(&error);
            report.refused(flags, &error);
            return Err(error);
        }
    };
    let same_node = matches!(upstream, Upstream::SameNode(_));
    let opened = (report, upstream, shown);
    tokio::spawn(async move { carry(&proxy, captured, opened).await });
    Ok((application, same_node))
}

/// Whether `message` comes back whole through `stream`.
async fn echoes(stream: &mut TcpStream, message: &[u8]) -> bool {
    let round_trip = async {
        stream.write_all(message).await?;
        let mut echoed = vec![0; message.len()];
        stream.read_exact(&mut echoed).await?;
        std::io::Result::Ok(echoed == message)
    };
    matches!(
        tokio::time::timeout(PATIENCE, round_trip).await,
        Ok(Ok(true))
    )
}

/// Whether `stream` ends (EOF or an error) with nothing more read.
async fn ends(stream: &mut TcpStream) -> bool {
    let mut rest = [0u8; 64];
    matches!(
        tokio::time::timeout(PATIENCE, stream.read(&mut rest)).await,
        Ok(Ok(0) | Err(_))
    )
}

/// The `CRL_PATH` of a test, empty and in force: handshakes keep their
/// peer's chain from here on.
fn crl_file(dir: &tempfile::TempDir) -> PathBuf {
    let path = dir.path().join("ca-crl.pem");
    std::fs::write(&path, "").unwrap();
    crate::revocation::load(&path).unwrap();
    path
}

/// Writes `list` to `path` and installs it as the poll would.
fn install(path: &Path, list: &str) {
    std::fs::write(path, list).unwrap();
    crate::revocation::load(path).unwrap();
}

/// Asserts that `node` counted one revocation as `reporter`, and reported
/// its connection with the peer of service account `account` as revoked.
async fn assert_revoked_reported(node: &Node, reporter: &str, account: &str) {
    let rejections = format!("istio_crl_policy_rejections_total{{reporter=\"{reporter}\"}}");
    assert!(
        node.eventually_counts(&rejections, &[" 1"]).await,
        "{}",
        node.metrics()
    );
    let failed = format!("istio_tcp_connections_failed_total{{reporter=\"{reporter}\"");
    let peer = format!("sa/{account}\"");
    let holding = ["response_flags=\"CERT_REVOKED\"", peer.as_str(), " 1"];
    assert!(
        node.eventually_counts(&failed, &holding).await,
        "the connection with {account} reported as revoked:\n{}",
        node.metrics()
    );
}

#[tokio::test]
async fn an_inbound_connection_whose_client_is_revoked_closes_and_the_others_stay_open() {
    let (ca, dir) = (Ca::new(), tempfile::tempdir().unwrap());
    let crl = crl_file(&dir);
    let server = Server::start(&ca, &crl, "server-0", "server", "127.0.0.1").await;
    let revoked_client = Node::new(&ca, &crl, "client-0", "client");
    let kept_client = Node::new(&ca, &crl, "client-1", "other");
    let mut revoked = connect(&revoked_client, &server).await;
    let mut kept = connect(&kept_client, &server).await;
    assert!(echoes(&mut revoked, b"before").await);
    assert!(echoes(&mut kept, b"before").await);

    install(&crl, &ca.revoking(&id("client")));
    assert!(ends(&mut revoked).await, "the revoked client's stream ends");
    assert!(
        echoes(&mut kept, b"after").await,
        "the other client's connection still carries bytes"
    );
    let server = &server.node;
    assert_revoked_reported(server, "destination", "client").await;
    assert!(
        !server
            .metrics()
            .contains("sa/other\",response_flags=\"CERT_REVOKED\"")
    );
}

#[tokio::test]
async fn an_outbound_connection_whose_server_is_revoked_closes_and_the_others_stay_open() {
    let (ca, dir) = (Ca::new(), tempfile::tempdir().unwrap());
    let crl = crl_file(&dir);
    let revoked_server = Server::start(&ca, &crl, "server-0", "server", "127.0.0.1").await;
    let kept_server = Server::start(&ca, &crl, "server-1", "backup", "127.0.0.4").await;
    let client = Node::new(&ca, &crl, "client-0", "client");
    let mut revoked = connect(&client, &revoked_server).await;
    let mut kept = connect(&client, &kept_server).await;
    assert!(echoes(&mut revoked, b"before").await);
    assert!(echoes(&mut kept, b"before").await);

    install(&crl, &ca.revoking(&id("server")));
    assert!(
        ends(&mut revoked).await,
        "the stream to the revoked server ends"
    );
    assert!(
        echoes(&mut kept, b"after").await,
        "the connection to the other server still carries bytes"
    );
    assert_revoked_reported(&client, "source", "server").await;
}

/// A client proxy whose node also serves `server`'s pod: its connections
/// to `server` take the same-node path, with no handshake between them.
fn same_node_client(ca: &Ca, crl: &Path, server: &Server, name: &str, account: &str) -> Node {
    let pods = Arc::new(LocalPods::default());
    pods.insert(&server.node.proxy.workload, &server.node.proxy);
    Node::serving(ca, crl, name, account, Some(pods))
}

#[tokio::test]
async fn a_same_node_connection_whose_client_is_revoked_closes_and_the_client_is_then_refused() {
    let (ca, dir) = (Ca::new(), tempfile::tempdir().unwrap());
    let crl = crl_file(&dir);
    let server = Server::start(&ca, &crl, "server-0", "server", "127.0.0.1").await;
    let revoked_client = same_node_client(&ca, &crl, &server, "client-0", "client");
    let kept_client = same_node_client(&ca, &crl, &server, "client-1", "other");
    let mut revoked = connect_same_node(&revoked_client, &server).await;
    let mut kept = connect_same_node(&kept_client, &server).await;
    assert!(echoes(&mut revoked, b"before").await);
    assert!(echoes(&mut kept, b"before").await);

    install(&crl, &ca.revoking(&id("client")));
    assert!(
        ends(&mut revoked).await,
        "the revoked client's connection ends"
    );
    assert!(
        echoes(&mut kept, b"after").await,
        "the other client's connection still carries bytes"
    );
    assert!(
        revoked_client
            .eventually_counts(
                "istio_crl_policy_rejections_total{reporter=\"destination\"}",
                &[" 1"],
            )
            .await,
        "{}",
        revoked_client.metrics()
    );
    let server_metrics = &server.node;
    assert!(
        server_metrics
            .eventually_counts(
                "istio_tcp_connections_failed_total{reporter=\"destination\"",
                &["response_flags=\"CERT_REVOKED\"", "sa/client\"", " 1"],
            )
            .await,
        "the destination reports the revoked client's connection as revoked:\n{}",
        server_metrics.metrics()
    );

    // A new connection from the revoked client is refused at once, where
    // its handshake would have been.
    let refused = tokio::time::timeout(PATIENCE, try_connect(&revoked_client, &server))
        .await
        .unwrap();
    assert!(
        matches!(refused, Err(OutboundError::Revoked(Reporter::Destination))),
        "{:?}",
        refused.err()
    );
    assert!(
        revoked_client
            .eventually_counts(
                "istio_tcp_connections_failed_total{reporter=\"source\"",
                &["response_flags=\"CERT_REVOKED\""],
            )
            .await,
        "{}",
        revoked_client.metrics()
    );
}

#[tokio::test]
async fn a_same_node_connection_whose_server_is_revoked_closes() {
    let (ca, dir) = (Ca::new(), tempfile::tempdir().unwrap());
    let crl = crl_file(&dir);
    let server = Server::start(&ca, &crl, "server-0", "server", "127.0.0.1").await;
    let client = same_node_client(&ca, &crl, &server, "client-0", "client");
    let mut stream = connect_same_node(&client, &server).await;
    assert!(echoes(&mut stream, b"before").await);

    install(&crl, &ca.revoking(&id("server")));
    assert!(
        ends(&mut stream).await,
        "the connection to the revoked server ends"
    );
    assert_revoked_reported(&client, "source", "server").await;
}
