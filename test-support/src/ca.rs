//! A real CA and control plane for end-to-end tests: `ztunnel-ca`'s
//! server (the CA and delta xDS on one port), run in-process on its own
//! runtime thread with a socket bound inside a test namespace, a generated
//! root, and one of two mesh sources: a mesh file (pods, services,
//! policies) the test can rewrite, with pod-bound tokens minted with the
//! CA's own token key; or the Kubernetes API (`crate::kube`), with tokens
//! from its TokenRequest API checked against the keys it publishes and
//! reviewed by it. Stopping it is how tests
//! produce a CA and xDS outage; restarting it (same address, root, token
//! key and source) is how the outage ends.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

use anyhow::Context;
use tokio::sync::{oneshot, watch};
use ztunnel_certs::cert::WorkloadCertificate;
use ztunnel_certs::csr::CertRequest;
use ztunnel_certs::error_chain::ErrorChain;
use ztunnel_certs::identity::Identity;
use ztunnel_certs::issuer::{
    GeneratedRoot, Issuer, SigningMaterial, SigningRequest, TtlPolicy, generate_root,
};
use ztunnel_control_plane::ca::authenticator::{Authenticator, TokenReviewer};
use ztunnel_control_plane::ca::authn::{DEFAULT_AUDIENCE, DEFAULT_ISSUER, TokenPolicy};
use ztunnel_control_plane::ca::authz::NodeAgentAccount;
use ztunnel_control_plane::ca::metrics::CaMetrics;
use ztunnel_control_plane::ca::published_keys::PublishedKeys;
use ztunnel_control_plane::ca::token::{PodToken, TokenSigner};
use ztunnel_control_plane::ca::token_keys::TokenKeys;
use ztunnel_control_plane::ca::{CaConfig, server};
use ztunnel_control_plane::kubernetes::{self, MetricsObserver};
use ztunnel_mesh::kube::convert::ConvertSettings;
use ztunnel_mesh::kube::source::KubeRegistry;
use ztunnel_mesh::{FileRegistry, PodRegistry};

use crate::netns::NetNs;

/// How often the CA re-reads the mesh file: short, so tests that move a
/// pod see the change quickly (in authorization and in xDS pushes).
const REGISTRY_POLL: Duration = Duration::from_millis(100);

/// How long the Kubernetes source may take to list everything once.
const SOURCE_READY: Duration = Duration::from_secs(30);

/// Binding the CA's address again when it is still in use: how many
/// retries, and the pause before each (one second in all).
const BIND_TRIES: u32 = 20;
const BIND_RETRY: Duration = Duration::from_millis(50);

/// A pod whose token a test mints.
#[derive(Debug, Clone)]
pub struct PodRef<'a> {
    /// Namespace.
    pub namespace: &'a str,
    /// Service account.
    pub service_account: &'a str,
    /// Pod name.
    pub name: &'a str,
    /// Pod UID.
    pub uid: &'a str,
    /// Node, for the token's node claim.
    pub node: Option<&'a str>,
}

/// Where the control plane takes the mesh from.
#[derive(Debug, Clone)]
enum Source {
    /// Its mesh file (`pods.yaml` in its directory), polled; tokens are
    /// verified with the CA's own token key.
    File,
    /// The Kubernetes API, with this kubeconfig (the control plane's
    /// service account); tokens are reviewed by the API server.
    Kubernetes(PathBuf),
}

/// A running CA. Dropping it stops the server.
pub struct TestCa {
    addr: SocketAddr,
    source: Source,
    /// Kept for a restart, which builds the server's configuration again.
    trust_domain: String,
    issuer: Arc<Issuer>,
    dir: tempfile::TempDir,
    signer: TokenSigner,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl TestCa {
    /// Starts a CA listening on `addr` inside `ns`, with the mesh file
    /// `pods`: a YAML list of pods, or `{pods, services, policies}` (the
    /// format of `ztunnel-ca serve --mesh`).
    pub fn start(
        ns: &NetNs,
        addr: SocketAddr,
        trust_domain: &str,
        pods: &str,
    ) -> anyhow::Result<Self> {
        Self::start_in(Some(ns), addr, trust_domain, pods)
    }

    /// [`TestCa::start`] in the test's own network namespace, for tests on
    /// loopback that need no topology.
    pub fn start_here(addr: SocketAddr, trust_domain: &str, pods: &str) -> anyhow::Result<Self> {
        Self::start_in(None, addr, trust_domain, pods)
    }

    fn start_in(
        ns: Option<&NetNs>,
        addr: SocketAddr,
        trust_domain: &str,
        pods: &str,
    ) -> anyhow::Result<Self> {
        ztunnel_certs::tls::install_provider();
        let dir = tempfile::tempdir()?;
        let root = generate_root(trust_domain, SystemTime::now())?;
        let issuer = issuer_of(&root)?;
        std::fs::write(dir.path().join("root-cert.pem"), issuer.root_bundle_pem())?;
        // For tests that sign with the root themselves (revocation lists).
        std::fs::write(dir.path().join("root-key.pem"), &root.key_pem)?;
        let issuer = Arc::new(issuer);
        std::fs::write(dir.path().join("pods.yaml"), pods)?;
        let mut ca = TestCa {
            addr,
            source: Source::File,
            trust_domain: trust_domain.to_owned(),
            issuer,
            dir,
            signer: TokenSigner::generate()?,
            stop: None,
            thread: None,
        };
        ca.serve_in(ns)?;
        Ok(ca)
    }

    /// Starts a control plane listening on `addr` inside `ns` that takes
    /// the mesh from the Kubernetes API through `kubeconfig` and reviews
    /// callers' tokens there, as `ztunnel-ca serve --kubeconfig` does.
    pub fn start_kubernetes(
        ns: &NetNs,
        addr: SocketAddr,
        trust_domain: &str,
        kubeconfig: &Path,
    ) -> anyhow::Result<Self> {
        let mut ca = Self::start(ns, addr, trust_domain, "")?;
        ca.stop();
        ca.source = Source::Kubernetes(kubeconfig.to_owned());
        ca.serve_in(Some(ns))?;
        Ok(ca)
    }

    /// Serves again after [`TestCa::stop`]: the same address (inside `ns`),
    /// root, token key and mesh file, as the file is now, so clients that
    /// trusted it before trust it again. Does nothing while it serves.
    pub fn restart(&mut self, ns: &NetNs) -> anyhow::Result<()> {
        if self.thread.is_some() {
            return Ok(());
        }
        self.serve_in(Some(ns))
    }

    /// Loads the mesh file, binds the address inside `ns` (else here) and
    /// serves on a thread of its own.
    fn serve_in(&mut self, ns: Option<&NetNs>) -> anyhow::Result<()> {
        let setup = match &self.source {
            Source::File => Setup::File {
                registry: Arc::new(FileRegistry::load(&self.pods_path())?),
                keys: self.signer.verifying_keys()?,
            },
            Source::Kubernetes(kubeconfig) => Setup::Kubernetes(kubeconfig.clone()),
        };
        let hour = Duration::from_secs(3600);
        let parts = Parts {
            trust_domain: self.trust_domain.clone(),
            issuer: Arc::clone(&self.issuer),
            ttl: TtlPolicy::new(24 * hour, 90 * 24 * hour),
            serving_ips: vec![self.addr.ip()],
        };
        let addr = self.addr;
        // std's bind sets SO_REUSEADDR, so a restart binds the address
        // again whatever connections of the last run linger. On a loaded
        // machine the last run's listener was once seen still bound just
        // after its thread ended (EADDRINUSE): a few short retries, bounded
        // in count and time, ride that out.
        let mut tries = 0;
        let listener = loop {
            let bound = match ns {
                Some(ns) => ns.run(move || std::net::TcpListener::bind(addr))?,
                None => std::net::TcpListener::bind(addr),
            };
            match bound {
                Err(error)
                    if error.kind() == std::io::ErrorKind::AddrInUse && tries < BIND_TRIES =>
                {
                    tries += 1;
                    std::thread::sleep(BIND_RETRY);
                }
                bound => break bound.context("binding the CA")?,
            }
        };
        listener.set_nonblocking(true)?;
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("test-ca".into())
            .spawn(move || serve(parts, setup, listener, stopped))?;
        self.stop = Some(stop);
        self.thread = Some(thread);
        Ok(())
    }

    /// The gRPC address, as `https://ip:port` for `CA_ADDRESS`.
    pub fn address(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// The root certificate file, for `CA_ROOT_CA`.
    pub fn root_cert_path(&self) -> PathBuf {
        self.dir.path().join("root-cert.pem")
    }

    /// The root's private key (PEM), for a test that signs with the root
    /// itself, e.g. a revocation list; absent for a Kubernetes-backed CA.
    pub fn root_key_path(&self) -> PathBuf {
        self.dir.path().join("root-key.pem")
    }

    /// The xDS address, as `https://ip:port` for `XDS_ADDRESS`: the CA's
    /// own, as istiod serves both on 15012. Only trusted node agents
    /// (`istio-system/ztunnel`) whose pod is in the mesh file may subscribe.
    pub fn xds_address(&self) -> String {
        self.address()
    }

    /// The mesh file; rewriting it changes what the CA authorizes and what
    /// xDS pushes.
    pub fn pods_path(&self) -> PathBuf {
        self.dir.path().join("pods.yaml")
    }

    /// Mints a pod-bound token and writes it to `path`.
    pub fn write_token(&self, pod: &PodRef<'_>, path: &Path) -> anyhow::Result<()> {
        let token = self.signer.mint(
            &PodToken {
                issuer: DEFAULT_ISSUER.into(),
                audiences: vec![DEFAULT_AUDIENCE.into()],
                namespace: pod.namespace.into(),
                service_account: pod.service_account.into(),
                pod_name: pod.name.into(),
                pod_uid: pod.uid.into(),
                node_name: pod.node.map(Into::into),
                ttl: Duration::from_secs(3600),
            },
            SystemTime::now(),
        )?;
        std::fs::write(path, token)?;
        Ok(())
    }

    /// Signs a certificate for any identity directly with the CA's root,
    /// bypassing authorization: how a test makes a peer whose chain is valid
    /// but whose identity the mesh must still refuse.
    pub fn issue(&self, identity: &Identity) -> anyhow::Result<WorkloadCertificate> {
        issue_with(&self.issuer, identity)
    }

    /// Stops the server and waits for it: new CA calls fail, and xDS streams
    /// end, until [`TestCa::restart`].
    pub fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for TestCa {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A certificate for `identity` from a root of its own, unknown to the mesh.
pub fn foreign_certificate(identity: &Identity) -> anyhow::Result<WorkloadCertificate> {
    TestRoot::generate(identity.trust_domain())?.issue(identity)
}

/// A generated root that signs workload certificates directly, with no CA
/// service, namespace or authorization: for tests of TLS peers on loopback
/// (`crate::waypoint`), whose certificates need only share a root; and, as
/// the `cacerts` of a real cluster's mesh, for a peer running in a pod
/// whose certificate the mesh must trust ([`TestRoot::issue_pem`]).
pub struct TestRoot {
    issuer: Issuer,
    /// The root as PEM, kept to hand it to a control plane.
    root: GeneratedRoot,
}

/// A workload certificate as files: what a pod mounts from a Secret.
#[derive(Clone)]
pub struct IssuedPem {
    /// The leaf, then any intermediates, PEM.
    pub cert_chain_pem: String,
    /// The leaf's PKCS#8 private key, PEM.
    pub key_pem: String,
    /// The roots peers are verified against, PEM.
    pub root_cert_pem: String,
}

impl TestRoot {
    /// Generates a root named after `trust_domain`.
    pub fn generate(trust_domain: &str) -> anyhow::Result<TestRoot> {
        let root = generate_root(trust_domain, SystemTime::now())?;
        Ok(TestRoot {
            issuer: issuer_of(&root)?,
            root,
        })
    }

    /// Signs a certificate for `identity`, of any trust domain: one outside
    /// the root's own is how a test makes a peer whose chain verifies but
    /// whose trust domain a server must refuse.
    pub fn issue(&self, identity: &Identity) -> anyhow::Result<WorkloadCertificate> {
        issue_with(&self.issuer, identity)
    }

    /// As [`TestRoot::issue`], as PEM files; valid for an hour.
    pub fn issue_pem(&self, identity: &Identity) -> anyhow::Result<IssuedPem> {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let csr = rcgen::CertificateParams::default().serialize_request(&key)?;
        let signing = SigningRequest::from_pem(&csr.pem()?)?;
        let chain = self.issuer.sign_workload(
            &signing,
            identity,
            Duration::from_secs(3600),
            SystemTime::now(),
        )?;
        let [certs @ .., roots] = chain.as_slice() else {
            anyhow::bail!("the issuer returned an empty chain");
        };
        Ok(IssuedPem {
            cert_chain_pem: certs.concat(),
            key_pem: key.serialize_pem(),
            root_cert_pem: roots.clone(),
        })
    }

    /// The self-signed root certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.root.cert_pem
    }

    /// The root's PKCS#8 private key, PEM.
    pub fn key_pem(&self) -> &str {
        &self.root.key_pem
    }
}

/// An issuer signing with `root`.
fn issuer_of(root: &GeneratedRoot) -> anyhow::Result<Issuer> {
    Ok(Issuer::new(&SigningMaterial {
        root_cert_pem: root.cert_pem.clone(),
        root_key_pem: Some(root.key_pem.clone()),
        ..SigningMaterial::default()
    })?)
}

fn issue_with(issuer: &Issuer, identity: &Identity) -> anyhow::Result<WorkloadCertificate> {
    let request = CertRequest::generate(identity)?;
    let signing = SigningRequest::from_pem(request.csr_pem())?;
    let chain = issuer.sign_workload(
        &signing,
        identity,
        Duration::from_secs(3600),
        SystemTime::now(),
    )?;
    Ok(WorkloadCertificate::from_ca_response(
        &chain,
        request.private_key(),
        Some(identity),
    )?)
}

/// What the control plane serves with, whatever the source.
struct Parts {
    trust_domain: String,
    issuer: Arc<Issuer>,
    ttl: TtlPolicy,
    serving_ips: Vec<std::net::IpAddr>,
}

/// The source, ready to start on the server's runtime.
enum Setup {
    File {
        registry: Arc<FileRegistry>,
        keys: TokenKeys,
    },
    Kubernetes(PathBuf),
}

/// The CA's runtime thread.
fn serve(
    parts: Parts,
    setup: Setup,
    listener: std::net::TcpListener,
    stopped: oneshot::Receiver<()>,
) {
    let Ok(runtime) = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
    else {
        return;
    };
    runtime.block_on(async move {
        let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
            return;
        };
        let metrics = Arc::new(CaMetrics::new());
        let (source_stop, source_stopped) = watch::channel(false);
        let until_stopped = move || {
            let mut stopped = source_stopped.clone();
            async move {
                let _ = stopped.wait_for(|stop| *stop).await;
            }
        };
        let (registry, authenticator): (Arc<dyn PodRegistry>, Authenticator) = match setup {
            Setup::File { registry, keys } => {
                let counter = Arc::clone(&metrics);
                let on_refused = move |_: &_| counter.record_mesh_reload_error();
                tokio::spawn(Arc::clone(&registry).watch(
                    REGISTRY_POLL,
                    on_refused,
                    until_stopped(),
                ));
                let authenticator = Authenticator::Keys {
                    keys,
                    policy: TokenPolicy::default(),
                };
                (registry, authenticator)
            }
            Setup::Kubernetes(kubeconfig) => {
                let client = match kubernetes::client(Some(&kubeconfig)).await {
                    Ok(client) => client,
                    Err(error) => {
                        eprintln!("test control plane: {}", ErrorChain(&*error));
                        return;
                    }
                };
                // The control plane writes its waypoints' status
                // addresses, as `ztunnel-ca serve` does on Kubernetes.
                tokio::spawn(ztunnel_control_plane::waypoint_status::run(
                    client.clone(),
                    ConvertSettings::default().cluster_domain,
                    until_stopped(),
                ));
                let registry = KubeRegistry::start(
                    client.clone(),
                    ConvertSettings::default(),
                    Arc::new(MetricsObserver(Arc::clone(&metrics))),
                    until_stopped(),
                );
                // Serving before the first list, or before the token keys
                // are fetched, would deny every caller for a moment; a
                // source that never gets there (a broken test) is served
                // anyway after a while, so the test fails on what it
                // checks rather than hanging here.
                let keys = PublishedKeys::start(client.clone(), DEFAULT_AUDIENCE, until_stopped());
                let mut ready = registry.readiness();
                let _ = tokio::time::timeout(SOURCE_READY, async {
                    let _ = ready.wait_for(|ready| *ready).await;
                    keys.loaded().await;
                })
                .await;
                let reviewer = TokenReviewer::new(client, keys, Arc::clone(&metrics));
                (registry, Authenticator::TokenReview(reviewer))
            }
        };
        let config = CaConfig {
            trust_domain: parts.trust_domain,
            issuer: parts.issuer,
            ttl: parts.ttl,
            authenticator: Arc::new(authenticator),
            trusted_node_accounts: vec![NodeAgentAccount {
                namespace: "istio-system".into(),
                service_account: "ztunnel".into(),
            }],
            registry,
            metrics,
            serving_dns_names: vec!["localhost".into()],
            serving_ips: parts.serving_ips,
            connections: ztunnel_control_plane::ca::connection::ConnectionLimits::DEFAULT,
        };
        let shutdown = async move {
            let _ = stopped.await;
        };
        if let Err(error) = server::serve(config, listener, shutdown).await {
            eprintln!("test CA stopped: {}", ErrorChain(&error));
        }
        let _ = source_stop.send(true);
    });
}
