//! The CA and its xDS server, run in-process on loopback for integration
//! tests: a generated root for `cluster.local`, a token signer the server
//! trusts, `istio-system/ztunnel` as the trusted node agent, a mesh file
//! polled every 20 ms, and `/metrics`. Dropping it stops the server.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use ztunnel_certs::issuer::{Issuer, SigningMaterial, TtlPolicy, generate_root};
use ztunnel_control_plane::ca::authenticator::Authenticator;
use ztunnel_control_plane::ca::authn::TokenPolicy;
use ztunnel_control_plane::ca::connection::ConnectionLimits;
use ztunnel_control_plane::ca::metrics::{self, CaMetrics};
use ztunnel_control_plane::ca::token::TokenSigner;
use ztunnel_control_plane::ca::{CaConfig, server};
use ztunnel_mesh::FileRegistry;

const HOUR: Duration = Duration::from_secs(3600);

/// How long `stop` waits for the server to return.
const STOP_PATIENCE: Duration = Duration::from_secs(10);

/// A running server.
pub struct TestServer {
    /// The gRPC/TLS address (the CA and xDS).
    pub addr: SocketAddr,
    /// The `/metrics` address.
    pub metrics_addr: SocketAddr,
    /// The CA's issuer, whose roots clients trust.
    pub issuer: Arc<Issuer>,
    /// Mints tokens the server accepts.
    pub signer: TokenSigner,
    /// The mesh file the server polls.
    pub mesh: PathBuf,
    stop: Option<oneshot::Sender<()>>,
    stopped: Option<oneshot::Receiver<()>>,
    _dir: tempfile::TempDir,
}

/// Starts a server reading `mesh` (written to a fresh file).
pub async fn start(mesh: &str) -> TestServer {
    start_limited(mesh, ConnectionLimits::DEFAULT).await
}

/// [`start`], with `limits` on its established connections.
pub async fn start_limited(mesh: &str, limits: ConnectionLimits) -> TestServer {
    ztunnel_certs::tls::install_provider();
    let dir = tempfile::tempdir().unwrap();
    let root = generate_root("cluster.local", SystemTime::now()).unwrap();
    let issuer = Arc::new(
        Issuer::new(&SigningMaterial {
            root_cert_pem: root.cert_pem,
            root_key_pem: Some(root.key_pem),
            ..SigningMaterial::default()
        })
        .unwrap(),
    );
    let signer = TokenSigner::generate().unwrap();
    let path = dir.path().join("mesh.yaml");
    std::fs::write(&path, mesh).unwrap();
    let registry = Arc::new(FileRegistry::load(&path).unwrap());
    let metrics = Arc::new(CaMetrics::new());
    let config = CaConfig {
        trust_domain: "cluster.local".into(),
        issuer: Arc::clone(&issuer),
        ttl: TtlPolicy::new(24 * HOUR, 48 * HOUR),
        authenticator: Arc::new(Authenticator::Keys {
            keys: signer.verifying_keys().unwrap(),
            policy: TokenPolicy::default(),
        }),
        trusted_node_accounts: vec!["istio-system/ztunnel".parse().unwrap()],
        registry: Arc::clone(&registry) as _,
        metrics: Arc::clone(&metrics),
        serving_dns_names: vec!["localhost".into()],
        serving_ips: vec!["127.0.0.1".parse().unwrap()],
        connections: limits,
    };
    let (stop, stop_requested) = oneshot::channel::<()>();
    let (done, stopped) = oneshot::channel::<()>();
    let (stop_side, side_stopped) = watch::channel(false);
    let side = move || {
        let mut rx = side_stopped.clone();
        async move {
            let _ = rx.wait_for(|stop| *stop).await;
        }
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let http = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let metrics_addr = http.local_addr().unwrap();
    let poll = Duration::from_millis(20);
    let refusals = Arc::clone(&metrics);
    let on_refused = move |_: &_| refusals.record_mesh_reload_error();
    tokio::spawn(registry.watch(poll, on_refused, side()));
    tokio::spawn(metrics::serve(metrics, Arc::new(|| None), http, side()));
    tokio::spawn(async move {
        let shutdown = async move {
            let _ = stop_requested.await;
        };
        server::serve(config, listener, shutdown).await.unwrap();
        let _ = stop_side.send(true);
        let _ = done.send(());
    });
    TestServer {
        addr,
        metrics_addr,
        issuer,
        signer,
        mesh: path,
        stop: Some(stop),
        stopped: Some(stopped),
        _dir: dir,
    }
}

impl TestServer {
    /// Stops the server and waits until it has returned.
    #[allow(dead_code)] // Not every test crate stops its server by hand.
    pub async fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(stopped) = self.stopped.take() {
            tokio::time::timeout(STOP_PATIENCE, stopped)
                .await
                .unwrap()
                .unwrap();
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}
