#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test
//! The identity manager against the real CA, in-process on loopback, with
//! real tokens in a token file: own and impersonated identities, denial and
//! backoff, serving from cache through a CA outage, refresh at half-life,
//! token re-reading, and forgetting.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tonic::Code;
use ztunnel_certs::error_chain::ErrorChain;
use ztunnel_certs::identity::Identity;
use ztunnel_certs::issuer::{Issuer, SigningMaterial, TtlPolicy, generate_root};
use ztunnel_control_plane::ca::authenticator::Authenticator;
use ztunnel_control_plane::ca::authn::{DEFAULT_AUDIENCE, DEFAULT_ISSUER, TokenPolicy};
use ztunnel_control_plane::ca::metrics::CaMetrics;
use ztunnel_control_plane::ca::token::{PodToken, TokenSigner};
use ztunnel_control_plane::ca::{CaConfig, server};
use ztunnel_mesh::FileRegistry;
use ztunnel_proxy::control_plane::{ExtraHeaders, LiteralToken, RootSource, TokenSource};
use ztunnel_proxy::identity::ca_client::{CaClient, CaClientConfig, CaClientError};
use ztunnel_proxy::identity::manager::{CertificateState, FetchError, IdentityManager};

const ZTUNNEL: &str = "spiffe://cluster.local/ns/istio-system/sa/ztunnel";
/// Runs on node-a, like the ztunnel whose token is used.
const APP: &str = "spiffe://cluster.local/ns/default/sa/app";
/// Runs only on node-b: node-a's ztunnel may not ask for it.
const DB: &str = "spiffe://cluster.local/ns/default/sa/db";
const HOUR: Duration = Duration::from_secs(3600);

const PODS: &str = "\
- {name: ztunnel-a, namespace: istio-system, uid: uid-za, serviceAccount: ztunnel, nodeName: node-a, phase: Running}
- {name: app-a, namespace: default, uid: uid-app, serviceAccount: app, nodeName: node-a, phase: Running}
- {name: db-b, namespace: default, uid: uid-db, serviceAccount: db, nodeName: node-b, phase: Running}
";

/// A CA running in-process on loopback, with its root in a file.
struct Ca {
    addr: SocketAddr,
    signer: TokenSigner,
    root_file: PathBuf,
    stop: Option<oneshot::Sender<()>>,
    stopped: Option<tokio::task::JoinHandle<()>>,
    dir: tempfile::TempDir,
}

async fn start_ca() -> Ca {
    ztunnel_certs::tls::install_provider();
    let dir = tempfile::tempdir().unwrap();
    let root = generate_root("cluster.local", SystemTime::now()).unwrap();
    let root_file = dir.path().join("root-cert.pem");
    std::fs::write(&root_file, &root.cert_pem).unwrap();
    let issuer = Arc::new(
        Issuer::new(&SigningMaterial {
            root_cert_pem: root.cert_pem,
            root_key_pem: Some(root.key_pem),
            ..SigningMaterial::default()
        })
        .unwrap(),
    );
    let signer = TokenSigner::generate().unwrap();
    let pods = dir.path().join("pods.yaml");
    std::fs::write(&pods, PODS).unwrap();
    let config = CaConfig {
        trust_domain: "cluster.local".into(),
        issuer,
        ttl: TtlPolicy::new(24 * HOUR, 48 * HOUR),
        authenticator: Arc::new(Authenticator::Keys {
            keys: signer.verifying_keys().unwrap(),
            policy: TokenPolicy::default(),
        }),
        trusted_node_accounts: vec!["istio-system/ztunnel".parse().unwrap()],
        registry: Arc::new(FileRegistry::load(&pods).unwrap()),
        metrics: Arc::new(CaMetrics::new()),
        serving_dns_names: vec!["localhost".into()],
        serving_ips: vec!["127.0.0.1".parse().unwrap()],
        connections: ztunnel_control_plane::ca::connection::ConnectionLimits::DEFAULT,
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stop_signal) = oneshot::channel::<()>();
    let stopped = tokio::spawn(async move {
        let shutdown = async move {
            let _ = stop_signal.await;
        };
        server::serve(config, listener, shutdown).await.unwrap();
    });
    Ca {
        addr,
        signer,
        root_file,
        stop: Some(stop),
        stopped: Some(stopped),
        dir,
    }
}

impl Ca {
    /// Writes a fresh token of the node-a ztunnel pod to a file.
    fn ztunnel_token_file(&self) -> PathBuf {
        let path = self.dir.path().join("istio-token");
        self.write_ztunnel_token(&path);
        path
    }

    fn write_ztunnel_token(&self, path: &Path) {
        self.write_token(
            path,
            "istio-system",
            "ztunnel",
            "ztunnel-a",
            "uid-za",
            Some("node-a"),
        );
    }

    /// Writes a fresh pod-bound token to `path`, as the kubelet would.
    fn write_token(
        &self,
        path: &Path,
        namespace: &str,
        service_account: &str,
        pod: &str,
        uid: &str,
        node: Option<&str>,
    ) {
        let token = PodToken {
            issuer: DEFAULT_ISSUER.into(),
            audiences: vec![DEFAULT_AUDIENCE.into()],
            namespace: namespace.into(),
            service_account: service_account.into(),
            pod_name: pod.into(),
            pod_uid: uid.into(),
            node_name: node.map(Into::into),
            ttl: HOUR,
        };
        let jwt = self.signer.mint(&token, SystemTime::now()).unwrap();
        std::fs::write(path, format!("{jwt}\n")).unwrap();
    }

    fn client_config(&self, token: Option<PathBuf>, secret_ttl: Duration) -> CaClientConfig {
        CaClientConfig {
            address: format!("https://{}", self.addr),
            root: RootSource::File(self.root_file.clone()),
            token: token.map_or(TokenSource::None, TokenSource::File),
            cluster_id: "Kubernetes".into(),
            secret_ttl,
            own_identity: Some(identity(ZTUNNEL)),
            server_name: None,
            alt_hostname: None,
            headers: ExtraHeaders::default(),
        }
    }

    /// Stops the CA and waits until it no longer serves.
    async fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(stopped) = self.stopped.take() {
            tokio::time::timeout(Duration::from_secs(10), stopped)
                .await
                .unwrap()
                .unwrap();
        }
    }
}

impl Drop for Ca {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

fn identity(text: &str) -> Identity {
    text.parse().unwrap()
}

/// A manager whose task runs until the returned sender is dropped.
fn start_manager(config: &CaClientConfig) -> (IdentityManager, oneshot::Sender<()>) {
    let client = CaClient::new(config).unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let (manager, task) = IdentityManager::new(client, async move {
        let _ = stopped.await;
    });
    tokio::spawn(task);
    (manager, stop)
}

fn status_code(error: &FetchError) -> Option<Code> {
    match error {
        FetchError::Ca(error) => match error.as_ref() {
            CaClientError::Rpc(status) => Some(status.code()),
            _ => None,
        },
        _ => None,
    }
}

/// Polls `check` every 100 ms until it returns `Some`, for at most `limit`.
async fn eventually<T, F, Fut>(limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "condition not met within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn own_identity_is_fetched_without_impersonation() {
    let ca = start_ca().await;
    let mut config = ca.client_config(Some(ca.ztunnel_token_file()), HOUR);
    // Without a scheme the address means https.
    config.address = ca.addr.to_string();
    let (manager, _stop) = start_manager(&config);

    let certificate = manager.fetch_certificate(&identity(ZTUNNEL)).await.unwrap();
    assert_eq!(certificate.identity(), Some(&identity(ZTUNNEL)));
    let leaf = certificate.leaf();
    let lifetime = leaf.not_after().duration_since(leaf.not_before()).unwrap();
    assert_eq!(
        lifetime,
        HOUR + Duration::from_secs(120),
        "SECRET_TTL plus the backdate"
    );

    let again = manager.fetch_certificate(&identity(ZTUNNEL)).await.unwrap();
    assert!(Arc::ptr_eq(&certificate, &again), "served from cache");
    let snapshot = manager.snapshot();
    assert_eq!(snapshot.len(), 1);
    assert_eq!(snapshot[0].state, CertificateState::Available);
    assert_eq!(
        snapshot[0]
            .certificate
            .as_ref()
            .map(|cert| cert.leaf().not_after()),
        Some(leaf.not_after())
    );
    assert!(snapshot[0].refresh_at.unwrap() > SystemTime::now());

    // A workload proxying for itself sends no ImpersonatedIdentity: the CA
    // would refuse impersonation from an account that is not a node agent.
    let app_token = ca.dir.path().join("app-token");
    ca.write_token(&app_token, "default", "app", "app-a", "uid-app", None);
    let mut config = ca.client_config(Some(app_token), HOUR);
    config.own_identity = Some(identity(APP));
    let (app_manager, _stop) = start_manager(&config);
    let certificate = app_manager.fetch_certificate(&identity(APP)).await.unwrap();
    assert_eq!(certificate.identity(), Some(&identity(APP)));
    // Asking for another identity does impersonate, and is refused.
    let error = app_manager
        .fetch_certificate(&identity(ZTUNNEL))
        .await
        .unwrap_err();
    let shown = ErrorChain(&error).to_string();
    assert!(shown.contains("impersonation"), "{shown}");
}

#[tokio::test]
async fn after_shutdown_cached_certificates_are_served_and_nothing_is_fetched() {
    let ca = start_ca().await;
    let (manager, stop) = start_manager(&ca.client_config(Some(ca.ztunnel_token_file()), HOUR));
    let cached = manager.fetch_certificate(&identity(APP)).await.unwrap();

    drop(stop);
    let error = eventually(Duration::from_secs(10), || async {
        manager.fetch_certificate(&identity(ZTUNNEL)).await.err()
    })
    .await;
    assert!(matches!(error, FetchError::Stopped), "{error:?}");
    let served = manager.fetch_certificate(&identity(APP)).await.unwrap();
    assert!(Arc::ptr_eq(&cached, &served));
}

#[tokio::test]
async fn a_pod_on_the_node_is_fetched_by_impersonation() {
    let ca = start_ca().await;
    let (manager, _stop) = start_manager(&ca.client_config(Some(ca.ztunnel_token_file()), HOUR));

    // Concurrent waiters share the fetch and get the same certificate.
    let app = identity(APP);
    let (first, second) = tokio::join!(
        manager.fetch_certificate(&app),
        manager.fetch_certificate(&app)
    );
    let (first, second) = (first.unwrap(), second.unwrap());
    assert_eq!(first.identity(), Some(&app));
    assert!(Arc::ptr_eq(&first, &second));

    // A prefetched identity becomes available without anyone waiting.
    manager.forget(&app);
    manager.prefetch(app.clone());
    eventually(Duration::from_secs(10), || async {
        let snapshot = manager.snapshot();
        (snapshot.first()?.state == CertificateState::Available).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_denied_identity_fails_and_is_retried_with_backoff() {
    let ca = start_ca().await;
    let (manager, _stop) = start_manager(&ca.client_config(Some(ca.ztunnel_token_file()), HOUR));

    let error = manager.fetch_certificate(&identity(DB)).await.unwrap_err();
    assert_eq!(
        status_code(&error),
        Some(Code::Unauthenticated),
        "{error:?}"
    );

    let snapshot = manager.snapshot();
    let CertificateState::Failed { error, attempts } = &snapshot[0].state else {
        panic!("{snapshot:?}");
    };
    assert!(error.contains("impersonation"), "{error}");
    assert_eq!(*attempts, 1);
    assert!(snapshot[0].refresh_at.is_some(), "a retry is scheduled");
    assert!(snapshot[0].certificate.is_none());

    // The retry comes after the first backoff (about 0.5 s) and fails again.
    eventually(Duration::from_secs(10), || async {
        match &manager.snapshot()[0].state {
            CertificateState::Failed { attempts, .. } if *attempts >= 2 => Some(()),
            _ => None,
        }
    })
    .await;
}

#[tokio::test]
async fn a_cached_certificate_is_served_while_the_ca_is_down() {
    let mut ca = start_ca().await;
    let (manager, _stop) = start_manager(&ca.client_config(Some(ca.ztunnel_token_file()), HOUR));
    let cached = manager.fetch_certificate(&identity(APP)).await.unwrap();

    ca.stop().await;
    let served = manager.fetch_certificate(&identity(APP)).await.unwrap();
    assert!(Arc::ptr_eq(&cached, &served));
    // The CA is really gone: an identity not cached cannot be fetched.
    let error = manager.fetch_certificate(&identity(ZTUNNEL)).await;
    assert!(matches!(error, Err(FetchError::Ca(_))), "{error:?}");
}

#[tokio::test]
async fn a_certificate_is_replaced_after_its_half_life() {
    let ca = start_ca().await;
    // The CA backdates NotBefore by 120 s, so a 130 s TTL gives a 250 s
    // lifetime whose half-life is about 5 s after issuance.
    let ttl = Duration::from_secs(130);
    let (manager, _stop) = start_manager(&ca.client_config(Some(ca.ztunnel_token_file()), ttl));
    let first = manager.fetch_certificate(&identity(APP)).await.unwrap();
    let refresh_at = manager.snapshot()[0].refresh_at.unwrap();
    let half_life = first.leaf().not_before()
        + (first
            .leaf()
            .not_after()
            .duration_since(first.leaf().not_before())
            .unwrap()
            / 2);
    assert!(refresh_at <= half_life);

    let second = eventually(Duration::from_secs(20), || async {
        let current = manager.fetch_certificate(&identity(APP)).await.unwrap();
        (current.leaf().der() != first.leaf().der()).then_some(current)
    })
    .await;
    assert_eq!(second.identity(), Some(&identity(APP)));
    assert!(second.leaf().not_after() > first.leaf().not_after());
}

#[tokio::test]
async fn the_token_file_is_read_again_on_every_request() {
    let ca = start_ca().await;
    let token = ca.dir.path().join("istio-token");
    std::fs::write(&token, "not-a-token\n").unwrap();
    let (manager, _stop) = start_manager(&ca.client_config(Some(token.clone()), HOUR));

    let error = manager
        .fetch_certificate(&identity(ZTUNNEL))
        .await
        .unwrap_err();
    assert_eq!(
        status_code(&error),
        Some(Code::Unauthenticated),
        "{error:?}"
    );

    // The scheduled retry picks up the new token.
    ca.write_ztunnel_token(&token);
    let certificate = eventually(Duration::from_secs(10), || async {
        manager.fetch_certificate(&identity(ZTUNNEL)).await.ok()
    })
    .await;
    assert_eq!(certificate.identity(), Some(&identity(ZTUNNEL)));
}

#[tokio::test]
async fn a_forgotten_identity_is_no_longer_served_from_cache() {
    let ca = start_ca().await;
    let (manager, _stop) = start_manager(&ca.client_config(Some(ca.ztunnel_token_file()), HOUR));
    let app = identity(APP);
    let first = manager.fetch_certificate(&app).await.unwrap();

    manager.forget(&app);
    assert!(manager.snapshot().is_empty());
    let second = manager.fetch_certificate(&app).await.unwrap();
    assert_ne!(first.leaf().der(), second.leaf().der(), "fetched anew");
}

#[tokio::test]
async fn the_ca_is_trusted_only_through_the_configured_root_and_name() {
    let ca = start_ca().await;
    let other_root = generate_root("cluster.local", SystemTime::now()).unwrap();
    let other_root_file = ca.dir.path().join("other-root.pem");
    std::fs::write(&other_root_file, other_root.cert_pem).unwrap();
    let mut config = ca.client_config(Some(ca.ztunnel_token_file()), HOUR);
    config.root = RootSource::File(other_root_file);
    let (manager, _stop) = start_manager(&config);
    let error = manager
        .fetch_certificate(&identity(ZTUNNEL))
        .await
        .unwrap_err();
    assert_eq!(status_code(&error), Some(Code::Unavailable), "{error:?}");
    let shown = ErrorChain(&error).to_string();
    assert!(shown.contains("invalid peer certificate"), "{shown}");

    // The name checked is the address's host unless configured otherwise.
    let mut config = ca.client_config(Some(ca.ztunnel_token_file()), HOUR);
    config.server_name = Some("istiod.istio-system.svc".into());
    let (manager, _stop) = start_manager(&config);
    let error = manager
        .fetch_certificate(&identity(ZTUNNEL))
        .await
        .unwrap_err();
    let shown = ErrorChain(&error).to_string();
    assert!(shown.contains("not valid for name"), "{shown}");

    config.server_name = Some("localhost".into());
    let (manager, _stop) = start_manager(&config);
    let certificate = manager.fetch_certificate(&identity(ZTUNNEL)).await.unwrap();
    assert_eq!(certificate.identity(), Some(&identity(ZTUNNEL)));
}

#[tokio::test]
async fn ca_root_ca_as_inline_pem_or_system_and_auth_token_as_a_literal_reach_the_ca_as_istio_allows()
 {
    let ca = start_ca().await;
    let token_file = ca.ztunnel_token_file();
    let token = std::fs::read_to_string(&token_file).unwrap();
    let mut config = ca.client_config(None, HOUR);
    config.root = RootSource::Pem(std::fs::read_to_string(&ca.root_file).unwrap());
    config.token = TokenSource::Literal(LiteralToken::new(token.trim().to_owned()));
    let (manager, _stop) = start_manager(&config);
    let certificate = manager.fetch_certificate(&identity(ZTUNNEL)).await.unwrap();
    assert_eq!(certificate.identity(), Some(&identity(ZTUNNEL)));

    // The system's roots are the only anchors then: the mesh's own root
    // is not among them, so the CA's certificate is refused.
    let mut config = ca.client_config(Some(token_file), HOUR);
    config.root = RootSource::System;
    let (manager, _stop) = start_manager(&config);
    let error = manager
        .fetch_certificate(&identity(ZTUNNEL))
        .await
        .unwrap_err();
    let shown = ErrorChain(&error).to_string();
    assert!(shown.contains("invalid peer certificate"), "{shown}");
}

#[tokio::test]
async fn alt_ca_hostname_is_a_second_name_the_ca_may_carry() {
    let ca = start_ca().await;
    let mut config = ca.client_config(Some(ca.ztunnel_token_file()), HOUR);
    // The dialled name is not on the CA's certificate; the second one is.
    config.server_name = Some("istiod.istio-system.svc".into());
    config.alt_hostname = Some("localhost".into());
    let (manager, _stop) = start_manager(&config);
    let certificate = manager.fetch_certificate(&identity(ZTUNNEL)).await.unwrap();
    assert_eq!(certificate.identity(), Some(&identity(ZTUNNEL)));

    config.alt_hostname = Some("elsewhere.example".into());
    let (manager, _stop) = start_manager(&config);
    let error = manager
        .fetch_certificate(&identity(ZTUNNEL))
        .await
        .unwrap_err();
    let shown = ErrorChain(&error).to_string();
    assert!(shown.contains("not valid for name"), "{shown}");
}

#[tokio::test]
async fn a_rotated_ca_root_file_is_used_without_a_restart() {
    let ca = start_ca().await;
    let other_root = generate_root("cluster.local", SystemTime::now()).unwrap();
    let root_file = ca.dir.path().join("mounted-root.pem");
    std::fs::write(&root_file, &other_root.cert_pem).unwrap();
    let mut config = ca.client_config(Some(ca.ztunnel_token_file()), HOUR);
    config.root = RootSource::File(root_file.clone());
    let (manager, _stop) = start_manager(&config);
    let error = manager
        .fetch_certificate(&identity(ZTUNNEL))
        .await
        .unwrap_err();
    assert!(
        ErrorChain(&error)
            .to_string()
            .contains("invalid peer certificate"),
        "{error:?}"
    );

    // The mounted root is replaced by the CA's own, as a ConfigMap update
    // does; the next attempt (after the backoff) trusts it.
    std::fs::write(&root_file, std::fs::read(&ca.root_file).unwrap()).unwrap();
    let certificate = eventually(Duration::from_secs(60), || async {
        manager.fetch_certificate(&identity(ZTUNNEL)).await.ok()
    })
    .await;
    assert_eq!(certificate.identity(), Some(&identity(ZTUNNEL)));
}

#[test]
fn plain_http_addresses_are_refused() {
    let config = CaClientConfig {
        address: "http://127.0.0.1:15012".into(),
        root: RootSource::File(PathBuf::from("/nonexistent")),
        token: TokenSource::None,
        cluster_id: "Kubernetes".into(),
        secret_ttl: HOUR,
        own_identity: Some(identity(ZTUNNEL)),
        server_name: None,
        alt_hostname: None,
        headers: ExtraHeaders::default(),
    };
    assert!(matches!(
        CaClient::new(&config),
        Err(CaClientError::InsecureAddress(_))
    ));
}
