#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test
//! The xDS client of a real `ztunnel` process (dedicated mode, no local
//! file) against a fake delta ADS server in this test: tonic over real
//! TLS 1.3 with a generated root, plus the real CA for the workload's
//! certificate. Everything listens on 127.0.0.1.
//!
//! Covered: readiness only after both wildcard types are ACKed, pushed
//! workloads in `/config_dump`, a NACK with the exact detail while the good
//! resources of the same response apply, a reconnect after the server
//! closes the stream with `initial_resource_versions` of the accepted
//! resources, the Bearer token re-read on reconnect, an `http://`
//! address that never connects, a local file (`LOCAL_XDS_PATH`) beside
//! xDS seeding the state that xDS then updates, and on-demand Address
//! resources (`XDS_ON_DEMAND`) asked for by a connection (the last two in
//! `xds/local_file.rs` and `xds/on_demand.rs`, on this file's harness).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use prost::Message;
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer as RcgenIssuer, KeyPair, SanType};
use rustls_pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::{ReceiverStream, UnboundedReceiverStream};
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status, Streaming};
use ztunnel_certs::issuer::{Issuer, SigningMaterial, TtlPolicy, generate_root};
use ztunnel_control_plane::ca::authenticator::Authenticator;
use ztunnel_control_plane::ca::authn::{DEFAULT_AUDIENCE, DEFAULT_ISSUER, TokenPolicy};
use ztunnel_control_plane::ca::metrics::CaMetrics;
use ztunnel_control_plane::ca::token::{PodToken, TokenSigner};
use ztunnel_control_plane::ca::{CaConfig, server};
use ztunnel_mesh::FileRegistry;
use ztunnel_proto::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use ztunnel_proto::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, Resource,
};
use ztunnel_proto::istio::security as wire_policy;
use ztunnel_proto::istio::workload as wire;
use ztunnel_proto::xds_types::{ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL};

const HOUR: Duration = Duration::from_secs(3600);
/// Bounds every wait for the proxy: start-up, a reply, a reconnect.
const WAIT: Duration = Duration::from_secs(30);

/// One stream the proxy opened: its headers, its requests, and the sender
/// of its responses (dropping it ends the stream with OK).
struct Session {
    headers: MetadataMap,
    requests: mpsc::UnboundedReceiver<DeltaDiscoveryRequest>,
    responses: mpsc::UnboundedSender<Result<DeltaDiscoveryResponse, Status>>,
}

impl Session {
    async fn request(&mut self) -> DeltaDiscoveryRequest {
        tokio::time::timeout(WAIT, self.requests.recv())
            .await
            .expect("no request from the proxy")
            .expect("stream closed")
    }

    fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .map(|value| value.to_str().unwrap().to_owned())
    }

    /// Sends a response and returns the proxy's reply to it.
    async fn push(
        &mut self,
        type_url: &str,
        nonce: &str,
        resources: Vec<Resource>,
        removed: &[&str],
    ) -> DeltaDiscoveryRequest {
        self.responses
            .send(Ok(DeltaDiscoveryResponse {
                type_url: type_url.into(),
                nonce: nonce.into(),
                resources,
                removed_resources: removed.iter().map(|name| (*name).to_owned()).collect(),
                ..Default::default()
            }))
            .unwrap();
        let reply = self.request().await;
        assert_eq!(reply.response_nonce, nonce);
        assert_eq!(reply.type_url, type_url);
        assert!(reply.node.is_none(), "replies carry no node");
        reply
    }

    /// Sends a response that the proxy must accept: its reply is an ACK.
    async fn push_acked(
        &mut self,
        type_url: &str,
        nonce: &str,
        resources: Vec<Resource>,
        removed: &[&str],
    ) {
        let ack = self.push(type_url, nonce, resources, removed).await;
        assert!(ack.error_detail.is_none(), "{:?}", ack.error_detail);
    }
}

/// The fake server: hands every stream to the test.
struct FakeAds {
    sessions: mpsc::UnboundedSender<Session>,
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for FakeAds {
    type DeltaAggregatedResourcesStream =
        UnboundedReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        let headers = request.metadata().clone();
        let mut inbound = request.into_inner();
        let (requests_in, requests) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok(Some(request)) = inbound.message().await {
                if requests_in.send(request).is_err() {
                    return;
                }
            }
        });
        let (responses, responses_out) = mpsc::unbounded_channel();
        let _ = self.sessions.send(Session {
            headers,
            requests,
            responses,
        });
        Ok(Response::new(UnboundedReceiverStream::new(responses_out)))
    }
}

/// Starts the fake server on 127.0.0.1 with a certificate for that IP from a
/// fresh root; returns its address, the root's PEM and the stream of sessions.
async fn start_fake_ads() -> (SocketAddr, String, mpsc::UnboundedReceiver<Session>) {
    let mut root_params = CertificateParams::default();
    root_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let root_key = KeyPair::generate().unwrap();
    let root = root_params.self_signed(&root_key).unwrap();
    let issuer = RcgenIssuer::new(root_params, root_key);
    let mut server_params = CertificateParams::default();
    server_params.subject_alt_names = vec![SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST))];
    let server_key = KeyPair::generate().unwrap();
    let server_cert = server_params.signed_by(&server_key, &issuer).unwrap();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(server_key.serialize_der()));
    let mut tls = rustls::ServerConfig::builder_with_provider(ztunnel_certs::tls::provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![server_cert.der().clone()], key)
        .unwrap();
    tls.alpn_protocols = vec![b"h2".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (connections, incoming) = mpsc::channel(16);
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            let connections = connections.clone();
            tokio::spawn(async move {
                if let Ok(Ok(tls)) =
                    tokio::time::timeout(Duration::from_secs(5), acceptor.accept(tcp)).await
                {
                    let _ = connections.send(Ok::<_, std::io::Error>(tls)).await;
                }
            });
        }
    });
    let (sessions, sessions_out) = mpsc::unbounded_channel();
    tokio::spawn(tonic::transport::Server::builder().serve_with_incoming(
        AggregatedDiscoveryServiceServer::new(FakeAds { sessions }),
        ReceiverStream::new(incoming),
    ));
    (addr, root.pem(), sessions_out)
}

/// The real CA on 127.0.0.1 and a token of the proxied workload.
struct Ca {
    addr: SocketAddr,
    root_file: PathBuf,
    signer: TokenSigner,
    _stop: oneshot::Sender<()>,
}

async fn start_ca(dir: &Path) -> Ca {
    let root = generate_root("cluster.local", SystemTime::now()).unwrap();
    let root_file = dir.join("ca-root.pem");
    std::fs::write(&root_file, &root.cert_pem).unwrap();
    let issuer = Issuer::new(&SigningMaterial {
        root_cert_pem: root.cert_pem,
        root_key_pem: Some(root.key_pem),
        ..SigningMaterial::default()
    })
    .unwrap();
    let pods = dir.join("pods.yaml");
    std::fs::write(
        &pods,
        "- {name: app-0, namespace: default, uid: uid-app, serviceAccount: app, nodeName: node-a, phase: Running}\n",
    )
    .unwrap();
    let signer = TokenSigner::generate().unwrap();
    let config = CaConfig {
        trust_domain: "cluster.local".into(),
        issuer: Arc::new(issuer),
        ttl: TtlPolicy::new(24 * HOUR, 48 * HOUR),
        authenticator: Arc::new(Authenticator::Keys {
            keys: signer.verifying_keys().unwrap(),
            policy: TokenPolicy::default(),
        }),
        trusted_node_accounts: Vec::new(),
        registry: Arc::new(FileRegistry::load(&pods).unwrap()),
        metrics: Arc::new(CaMetrics::new()),
        serving_dns_names: vec!["localhost".into()],
        serving_ips: vec![IpAddr::V4(Ipv4Addr::LOCALHOST)],
        connections: ztunnel_control_plane::ca::connection::ConnectionLimits::DEFAULT,
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(async move {
        let shutdown = async move {
            let _ = stopped.await;
        };
        let _ = server::serve(config, listener, shutdown).await;
    });
    Ca {
        addr,
        root_file,
        signer,
        _stop: stop,
    }
}

impl Ca {
    fn app_token(&self) -> String {
        let token = PodToken {
            issuer: DEFAULT_ISSUER.into(),
            audiences: vec![DEFAULT_AUDIENCE.into()],
            namespace: "default".into(),
            service_account: "app".into(),
            pod_name: "app-0".into(),
            pod_uid: "uid-app".into(),
            node_name: Some("node-a".into()),
            ttl: HOUR,
        };
        self.signer.mint(&token, SystemTime::now()).unwrap()
    }
}

/// A running `ztunnel`, killed (by its own handle) on drop.
struct Ztunnel {
    child: Child,
    log: PathBuf,
    admin: SocketAddr,
    stats: SocketAddr,
    readiness: SocketAddr,
}

impl Drop for Ztunnel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            eprintln!(
                "--- ztunnel log (last lines, newest first)\n{}",
                tail.join("\n")
            );
        }
    }
}

/// What every test against the fake server starts with: the CA, the
/// server (its root in a file), and a token file the CA accepts.
struct Harness {
    dir: tempfile::TempDir,
    ca: Ca,
    ads: SocketAddr,
    sessions: mpsc::UnboundedReceiver<Session>,
    root_file: PathBuf,
    token_file: PathBuf,
    token: String,
}

async fn harness() -> Harness {
    ztunnel_certs::tls::install_provider();
    let dir = tempfile::tempdir().unwrap();
    let ca = start_ca(dir.path()).await;
    let (ads, ads_root, sessions) = start_fake_ads().await;
    let root_file = dir.path().join("xds-root.pem");
    std::fs::write(&root_file, ads_root).unwrap();
    let token_file = dir.path().join("token");
    let token = ca.app_token();
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    Harness {
        dir,
        ca,
        ads,
        sessions,
        root_file,
        token_file,
        token,
    }
}

impl Harness {
    /// A ztunnel pointed at the server and the CA, with `more` besides.
    fn spawn(&self, more: &[(&str, String)]) -> Ztunnel {
        let mut env = vec![
            ("XDS_ADDRESS", format!("https://{}", self.ads)),
            ("XDS_ROOT_CA", self.root_file.display().to_string()),
            ("CA_ADDRESS", format!("https://{}", self.ca.addr)),
            ("CA_ROOT_CA", self.ca.root_file.display().to_string()),
            ("AUTH_TOKEN", self.token_file.display().to_string()),
        ];
        env.extend(more.iter().cloned());
        spawn_ztunnel(self.dir.path(), &env)
    }

    /// The next stream the proxy opens.
    async fn session(&mut self) -> Session {
        tokio::time::timeout(WAIT, self.sessions.recv())
            .await
            .unwrap()
            .unwrap()
    }
}

fn free_port() -> SocketAddr {
    ztunnel_test_support::ports::unused_loopback_port().unwrap()
}

fn spawn_ztunnel(dir: &Path, env: &[(&str, String)]) -> Ztunnel {
    let (admin, stats, readiness) = (free_port(), free_port(), free_port());
    let log = dir.join("ztunnel.log");
    let file = std::fs::File::create(&log).unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_ztunnel"));
    command
        .env_clear()
        .env("PROXY_MODE", "dedicated")
        .env("PROXY_WORKLOAD_INFO", "default/app-0/app")
        .env("ZTUNNEL_OUTBOUND_ADDR", "127.0.0.1:0")
        .env("ZTUNNEL_INBOUND_ADDR", "127.0.0.1:0")
        .env("ZTUNNEL_INBOUND_PLAINTEXT_ADDR", "127.0.0.1:0")
        .env("ZTUNNEL_ADMIN_ADDR", admin.to_string())
        .env("ZTUNNEL_STATS_ADDR", stats.to_string())
        .env("ZTUNNEL_READINESS_ADDR", readiness.to_string())
        .env("ZTUNNEL_WORKER_THREADS", "1")
        .env("RUST_LOG", "info")
        .current_dir(dir)
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .stdin(Stdio::null());
    for (name, value) in env {
        command.env(name, value);
    }
    Ztunnel {
        child: command.spawn().unwrap(),
        log,
        admin,
        stats,
        readiness,
    }
}

/// `GET path` over HTTP/1.1; `(status, body)`, or `None` when nothing answers.
async fn get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await.ok()?;
        let head = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
        stream.write_all(head.as_bytes()).await.ok()?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await.ok()?;
        let raw = String::from_utf8(raw).ok()?;
        let (head, body) = raw.split_once("\r\n\r\n")?;
        let status = head.split(' ').nth(1)?.parse().ok()?;
        Some((status, body.to_owned()))
    };
    tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .ok()
        .flatten()
}

/// Polls `check` every 100 ms until it returns `Some`, for at most [`WAIT`].
async fn eventually<T, Fut: Future<Output = Option<T>>>(
    what: &str,
    mut check: impl FnMut() -> Fut,
) -> T {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} within {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits for readiness, which follows the ACK of every wildcard type.
async fn ready_once_acked(ztunnel: &Ztunnel) {
    eventually("ready after the wildcard types' ACKs", || async {
        get(ztunnel.readiness, "/healthz/ready")
            .await
            .filter(|(status, _)| *status == 200)
    })
    .await;
}

async fn workload_uids(ztunnel: &Ztunnel) -> Vec<String> {
    let (status, body) = get(ztunnel.admin, "/config_dump")
        .await
        .expect("admin answers");
    assert_eq!(status, 200);
    let dump: serde_json::Value = serde_json::from_str(&body).unwrap();
    let mut uids: Vec<String> = dump["workloads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|workload| workload["uid"].as_str().unwrap().to_owned())
        .collect();
    uids.sort();
    uids
}

fn workload(uid: &str, address: Vec<u8>, version: &str) -> Resource {
    let workload = wire::Workload {
        uid: uid.into(),
        name: uid.into(),
        namespace: "default".into(),
        addresses: vec![address],
        tunnel_protocol: wire::TunnelProtocol::Hbone as i32,
        node: "node-b".into(),
        ..Default::default()
    };
    let address = wire::Address {
        r#type: Some(wire::address::Type::Workload(workload)),
    };
    Resource {
        name: uid.into(),
        version: version.into(),
        resource: Some(prost_types::Any {
            type_url: ADDRESS_TYPE_URL.into(),
            value: address.encode_to_vec(),
        }),
        ..Default::default()
    }
}

fn policy(name: &str, version: &str) -> Resource {
    let policy = wire_policy::Authorization {
        name: name.into(),
        namespace: "default".into(),
        scope: wire_policy::Scope::Namespace as i32,
        action: wire_policy::Action::Allow as i32,
        ..Default::default()
    };
    Resource {
        name: format!("default/{name}"),
        version: version.into(),
        resource: Some(prost_types::Any {
            type_url: AUTHORIZATION_TYPE_URL.into(),
            value: policy.encode_to_vec(),
        }),
        ..Default::default()
    }
}

fn versions(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(name, version)| ((*name).to_owned(), (*version).to_owned()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn syncs_nacks_bad_resources_and_resumes_after_a_reconnect() {
    let mut harness = harness().await;
    let ztunnel = harness.spawn(&[
        ("CLUSTER_ID", "test-cluster".into()),
        ("INSTANCE_IP", "127.0.0.1".into()),
        ("POD_NAME", "app-0".into()),
        ("POD_NAMESPACE", "default".into()),
        ("NODE_NAME", "node-a".into()),
        ("ISTIO_META_ZONE", "z1".into()),
        ("XDS_HEADER_X_TENANT", "blue".into()),
    ]);
    let token = harness.token.clone();

    // The stream opens with the credentials and the two wildcard requests.
    let mut session = harness.session().await;
    assert_eq!(
        session.header("authorization"),
        Some(format!("Bearer {token}"))
    );
    assert_eq!(session.header("clusterid").as_deref(), Some("test-cluster"));
    assert_eq!(session.header("x_tenant").as_deref(), Some("blue"));
    let first = session.request().await;
    let second = session.request().await;
    assert_eq!(
        (first.type_url.as_str(), second.type_url.as_str()),
        (ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL)
    );
    let node = first.node.as_ref().unwrap();
    assert_eq!(
        node.id,
        "ztunnel~127.0.0.1~app-0.default~default.svc.cluster.local"
    );
    let metadata = &node.metadata.as_ref().unwrap().fields;
    for (key, value) in [
        ("NAME", "app-0"),
        ("NAMESPACE", "default"),
        ("INSTANCE_IPS", "127.0.0.1"),
        ("NODE_NAME", "node-a"),
        ("ZONE", "z1"),
    ] {
        assert_eq!(
            metadata[key].kind,
            Some(prost_types::value::Kind::StringValue(value.into())),
            "{key}"
        );
    }
    for request in [&first, &second] {
        assert!(request.resource_names_subscribe.is_empty());
        assert!(request.initial_resource_versions.is_empty());
    }

    // Not ready until both types are ACKed.
    let not_ready = eventually("readiness answers", || {
        get(ztunnel.readiness, "/healthz/ready")
    })
    .await;
    assert_eq!(not_ready.0, 500, "{}", not_ready.1);
    session
        .push_acked(
            ADDRESS_TYPE_URL,
            "a1",
            vec![
                workload("w-1", vec![10, 1, 0, 1], "1"),
                workload("w-2", vec![10, 1, 0, 2], "1"),
            ],
            &[],
        )
        .await;
    let (status, body) = get(ztunnel.readiness, "/healthz/ready").await.unwrap();
    assert_eq!(status, 500);
    assert!(body.contains("istio.security.Authorization"), "{body}");
    assert!(!body.contains("istio.workload.Address"), "{body}");
    session
        .push_acked(
            AUTHORIZATION_TYPE_URL,
            "p1",
            vec![policy("allow-all", "1")],
            &[],
        )
        .await;
    ready_once_acked(&ztunnel).await;
    assert_eq!(workload_uids(&ztunnel).await, ["w-1", "w-2"]);

    // One bad resource: NACKed with the exact detail; the rest applies.
    let nack = session
        .push(
            ADDRESS_TYPE_URL,
            "a2",
            vec![
                workload("w-3", vec![10, 1, 0, 3], "2"),
                workload("w-bad", vec![10, 1, 0, 4, 5], "2"),
            ],
            &["w-1"],
        )
        .await;
    let detail = nack.error_detail.expect("a NACK");
    assert_eq!(
        detail.message,
        "w-bad: failed to parse address, had 5 bytes"
    );
    assert_eq!(detail.code, 0);
    assert_eq!(workload_uids(&ztunnel).await, ["w-2", "w-3"]);
    let (_, metrics) = get(ztunnel.stats, "/metrics").await.unwrap();
    assert!(
        metrics.contains(&format!(
            "ztunnel_xds_nacks_total{{url=\"{ADDRESS_TYPE_URL}\"}} 1"
        )),
        "{metrics}"
    );
    assert!(metrics.contains("ztunnel_xds_connected 1"), "{metrics}");

    // The server ends the stream; the state is kept, the token re-read, and
    // the new stream echoes what was accepted (not w-bad, not w-1).
    std::fs::write(&harness.token_file, "rotated-token\n").unwrap();
    drop(session.responses);
    let mut session = harness.session().await;
    assert_eq!(
        session.header("authorization").as_deref(),
        Some("Bearer rotated-token")
    );
    let first = session.request().await;
    let second = session.request().await;
    assert_eq!(first.type_url, ADDRESS_TYPE_URL);
    assert!(first.node.is_some());
    assert_eq!(
        first.initial_resource_versions,
        versions(&[("w-2", "1"), ("w-3", "2")])
    );
    assert_eq!(
        second.initial_resource_versions,
        versions(&[("default/allow-all", "1")])
    );
    assert_eq!(workload_uids(&ztunnel).await, ["w-2", "w-3"]);
    assert_eq!(
        get(ztunnel.readiness, "/healthz/ready").await.unwrap().0,
        200
    );

    // The server trusts its removals across the reconnect.
    session
        .push_acked(ADDRESS_TYPE_URL, "a3", vec![], &["w-2"])
        .await;
    assert_eq!(workload_uids(&ztunnel).await, ["w-3"]);
    let (_, metrics) = get(ztunnel.stats, "/metrics").await.unwrap();
    assert!(
        metrics.contains("istio_xds_connection_terminations_total{reason=\"Complete\"} 1"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_address_never_connects() {
    let dir = tempfile::tempdir().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // A CA root is needed to start; the CA itself is never reached.
    let ca_root = dir.path().join("ca-root.pem");
    let root = generate_root("cluster.local", SystemTime::now()).unwrap();
    std::fs::write(&ca_root, root.cert_pem).unwrap();
    let ztunnel = spawn_ztunnel(
        dir.path(),
        &[
            ("XDS_ADDRESS", format!("http://{addr}")),
            ("CA_ADDRESS", format!("https://{}", free_port())),
            ("CA_ROOT_CA", ca_root.display().to_string()),
            ("AUTH_TOKEN", "literal-token".into()),
        ],
    );
    // Every attempt fails as a connection error and is retried.
    eventually("retried connection errors", || async {
        let (_, metrics) = get(ztunnel.stats, "/metrics").await?;
        let line = metrics.lines().find(|line| {
            line.starts_with("istio_xds_connection_terminations_total{reason=\"ConnectionError\"}")
        })?;
        let count: u64 = line.rsplit(' ').next()?.parse().ok()?;
        (count >= 3).then_some(())
    })
    .await;
    let accepted = tokio::time::timeout(Duration::from_millis(200), listener.accept()).await;
    assert!(accepted.is_err(), "ztunnel connected to an http:// address");
    let (status, body) = get(ztunnel.readiness, "/healthz/ready").await.unwrap();
    assert_eq!(status, 500);
    assert!(body.contains("xDS"), "{body}");
    let log = std::fs::read_to_string(&ztunnel.log).unwrap();
    assert!(log.contains("unsupported scheme http"), "{log}");
}

#[path = "xds/local_file.rs"]
mod local_file;
#[path = "xds/on_demand.rs"]
mod on_demand;
