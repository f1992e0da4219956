//! A real Kubernetes API for tests (the envtest pattern): etcd and
//! kube-apiserver, built by `scripts/k8s-test-env.sh` from pinned Go
//! modules, started on loopback ports with a temporary data directory,
//! generated serving and client certificates, service-account signing keys
//! and issuer (so the TokenRequest API mints real pod-bound tokens), and
//! RBAC authorization. There is no kubelet, scheduler or controller
//! manager: tests write pod status themselves (`objects.rs`).
//!
//! [`KubeApi::start_for_cluster`] starts the same API server for a cluster
//! of real nodes (`crate::real_cluster`): it advertises an address the
//! nodes reach, authorizes kubelets with the Node authorizer, and signs
//! client certificates for the other components.
//!
//! Dropping a [`KubeApi`] stops both processes (by PID) and removes the
//! directory. The admin identity is a client certificate in group
//! `system:masters`; [`KubeApi::kubeconfig_for_token`] gives a kubeconfig
//! for any other identity, such as a service account bound to exactly the
//! role a component ships with.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair};

use crate::skip::skip;

pub mod objects;

/// The service-account token issuer the API server stamps into tokens.
pub const SERVICE_ACCOUNT_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

/// Virtual IPs of Services: inside the benchmarking range the tests may
/// use, and apart from the pod subnets (198.18.x.0/24) the netns cluster
/// hands out.
pub const SERVICE_CLUSTER_IP_RANGE: &str = "198.19.128.0/20";

/// The `kubernetes` Service's virtual IP: the first of the range, which the
/// API server reserves for it.
pub const KUBERNETES_SERVICE_IP: Ipv4Addr = Ipv4Addr::new(198, 19, 128, 1);

/// How long the API server may take to report ready: a cold start on two
/// busy cores takes a few seconds; the bound only keeps a broken start from
/// hanging a test.
const START_TIMEOUT: Duration = Duration::from_secs(90);

/// A running etcd and kube-apiserver. Dropping it stops both and removes
/// their files.
pub struct KubeApi {
    bin: PathBuf,
    dir: tempfile::TempDir,
    etcd: Option<Child>,
    apiserver: Option<Child>,
    /// `https://127.0.0.1:<port>`.
    server: String,
    etcd_url: String,
    /// The serving CA, PEM.
    ca_pem: String,
    admin_kubeconfig: PathBuf,
    /// The signing CA's key, PEM: client certificates for cluster
    /// components are signed with it.
    ca_key_pem: String,
    /// Set for a cluster of real nodes: the address the API server
    /// advertises to them.
    advertise: Option<Ipv4Addr>,
    started_in: Duration,
}

/// The API server's egress selector configuration, in its directory.
const EGRESS_SELECTOR_FILE: &str = "egress-selector.json";

/// The Gateway API CRDs the control plane watches, as
/// `scripts/k8s-test-env.sh` extracts them.
const GATEWAY_API_CRDS: [&str; 2] = [
    "gateway.networking.k8s.io_gateways.yaml",
    "gateway.networking.k8s.io_gatewayclasses.yaml",
];

impl KubeApi {
    /// Where the binaries are, if `scripts/k8s-test-env.sh` built them: the
    /// reason to skip otherwise.
    pub fn binaries() -> Result<PathBuf, String> {
        let cache = std::env::var_os("ZTUNNEL_KUBE_ENV")
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("HOME")
                    .map(|home| PathBuf::from(home).join(".cache/ztunnel-kube-env"))
            })
            .ok_or_else(|| "no HOME and no ZTUNNEL_KUBE_ENV".to_owned())?;
        let bin = cache.join("current/bin");
        for name in ["etcd", "kube-apiserver"] {
            if !bin.join(name).is_file() {
                return Err(format!(
                    "{} missing: run scripts/k8s-test-env.sh to build the test API server",
                    bin.join(name).display()
                ));
            }
        }
        Ok(bin)
    }

    /// Where `scripts/k8s-test-env.sh` put the Gateway API CRDs (extracted
    /// from the Go module it pins): the reason to skip otherwise.
    pub fn gateway_api_crds() -> Result<PathBuf, String> {
        let bin = Self::binaries()?;
        let crds = bin.with_file_name("crds");
        let gateways = crds.join(GATEWAY_API_CRDS[0]);
        if !gateways.is_file() {
            return Err(format!(
                "{} missing: run scripts/k8s-test-env.sh to fetch the Gateway API CRDs",
                gateways.display()
            ));
        }
        Ok(crds)
    }

    /// Installs the Gateway API's Gateway and GatewayClass CRDs from `crds`
    /// ([`KubeApi::gateway_api_crds`]) and waits until the API server
    /// serves them.
    pub fn install_gateway_api_crds(&self, crds: &Path) -> anyhow::Result<()> {
        for file in GATEWAY_API_CRDS {
            let path = crds.join(file).display().to_string();
            // Server-side: the Gateway CRD is too big for the annotation a
            // client-side apply keeps.
            self.kubectl(&["apply", "--server-side", "-f", &path], None)?;
        }
        self.kubectl(
            &[
                "wait",
                "--for=condition=Established",
                "--timeout=30s",
                "crd/gateways.gateway.networking.k8s.io",
                "crd/gatewayclasses.gateway.networking.k8s.io",
            ],
            None,
        )?;
        Ok(())
    }

    /// Starts etcd and kube-apiserver and waits until the API server is
    /// ready. `None` when the binaries were not built, after
    /// [`crate::skip::skip`] (which fails the test under
    /// `ZTUNNEL_NO_SKIPS`); tests return early then.
    #[track_caller]
    pub fn start() -> anyhow::Result<Option<KubeApi>> {
        let bin = match Self::binaries() {
            Ok(bin) => bin,
            Err(reason) => {
                skip(format_args!("no Kubernetes API server: {reason}"));
                return Ok(None);
            }
        };
        Self::start_with(bin, None).map(Some)
    }

    /// Starts etcd and kube-apiserver for a cluster of real nodes. It
    /// listens on this process's loopback as [`KubeApi::start`]'s does,
    /// and advertises `advertise` (where the cluster carries the nodes'
    /// connections to it) as the `kubernetes` Service's endpoint; its
    /// certificate names that address and the Service's. Kubelets are
    /// authorized by the Node authorizer and NodeRestriction admission, as
    /// in any cluster. Its own connections into the cluster (admission
    /// webhooks, the kubelets' logs, exec and port-forward) follow
    /// `egress_selector`, an `EgressSelectorConfiguration`
    /// ([`crate::egress::EgressProxy::selector_config`]); it reaches
    /// webhooks at their Service's endpoints, and kubelets at their nodes'
    /// InternalIP with the admin's client certificate.
    pub fn start_for_cluster(
        bin: PathBuf,
        advertise: Ipv4Addr,
        egress_selector: &str,
    ) -> anyhow::Result<KubeApi> {
        Self::start_with(bin, Some((advertise, egress_selector)))
    }

    fn start_with(bin: PathBuf, cluster: Option<(Ipv4Addr, &str)>) -> anyhow::Result<KubeApi> {
        let advertise = cluster.map(|(address, _)| address);
        let started = Instant::now();
        let dir = tempfile::Builder::new().prefix("ztunnel-kube-").tempdir()?;
        let mut names = vec![];
        if let Some(address) = advertise {
            names.extend([
                address.to_string(),
                KUBERNETES_SERVICE_IP.to_string(),
                "kubernetes".to_owned(),
                "kubernetes.default".to_owned(),
                "kubernetes.default.svc.cluster.local".to_owned(),
            ]);
        }
        let pki = Pki::generate(names)?;
        pki.write(dir.path())?;
        if let Some((_, egress_selector)) = cluster {
            std::fs::write(dir.path().join(EGRESS_SELECTOR_FILE), egress_selector)?;
        }

        let etcd_client = free_port()?;
        let etcd_peer = free_port()?;
        let etcd_url = format!("http://{etcd_client}");
        let etcd = spawn(
            Command::new(bin.join("etcd"))
                .arg(format!("--data-dir={}", dir.path().join("etcd").display()))
                .arg(format!("--listen-client-urls={etcd_url}"))
                .arg(format!("--advertise-client-urls={etcd_url}"))
                .arg(format!("--listen-peer-urls=http://{etcd_peer}"))
                .arg(format!("--initial-advertise-peer-urls=http://{etcd_peer}"))
                .arg(format!("--initial-cluster=default=http://{etcd_peer}"))
                // Test data need not survive a power cut.
                .arg("--unsafe-no-fsync"),
            &dir.path().join("etcd.log"),
        )?;

        let port = free_port()?.port();
        let server = format!("https://127.0.0.1:{port}");
        let admin_kubeconfig = dir.path().join("admin.kubeconfig");
        std::fs::write(
            &admin_kubeconfig,
            kubeconfig(
                &server,
                &pki.ca_pem,
                User::Certificate {
                    cert_pem: &pki.admin_cert_pem,
                    key_pem: &pki.admin_key_pem,
                },
            ),
        )?;
        let mut api = KubeApi {
            bin,
            dir,
            etcd: Some(etcd),
            apiserver: None,
            server,
            etcd_url,
            ca_pem: pki.ca_pem,
            admin_kubeconfig,
            ca_key_pem: pki.ca_key_pem,
            advertise,
            started_in: Duration::ZERO,
        };
        api.start_apiserver_on(port)?;
        api.started_in = started.elapsed();
        Ok(api)
    }

    fn start_apiserver_on(&mut self, port: u16) -> anyhow::Result<()> {
        let dir = self.dir.path();
        let file = |name: &str| dir.join(name).display().to_string();
        let mut command = Command::new(self.bin.join("kube-apiserver"));
        match self.advertise {
            // Pods reach the API through the `kubernetes` Service, whose
            // endpoint is the advertised address.
            Some(address) => command
                .arg(format!("--advertise-address={address}"))
                .arg("--authorization-mode=Node,RBAC")
                .arg("--enable-admission-plugins=NodeRestriction")
                .arg(format!(
                    "--egress-selector-config-file={}",
                    file(EGRESS_SELECTOR_FILE)
                ))
                // Webhooks by their endpoints: no ClusterIP is routed
                // where the egress proxy dials.
                .arg("--enable-aggregator-routing=true")
                .arg("--kubelet-preferred-address-types=InternalIP")
                .arg(format!(
                    "--kubelet-client-certificate={}",
                    file("admin.pem")
                ))
                .arg(format!("--kubelet-client-key={}", file("admin-key.pem"))),
            // The `kubernetes` Service's endpoints would have to be a
            // routable address; no pod here talks to the API through it.
            None => command
                .arg("--advertise-address=127.0.0.1")
                .arg("--endpoint-reconciler-type=none")
                .arg("--authorization-mode=RBAC"),
        };
        let child = spawn(
            command
                .arg(format!("--etcd-servers={}", self.etcd_url))
                .arg("--bind-address=127.0.0.1")
                .arg(format!("--secure-port={port}"))
                .arg(format!("--cert-dir={}", file("apiserver-certs")))
                .arg(format!("--tls-cert-file={}", file("serving.pem")))
                .arg(format!(
                    "--tls-private-key-file={}",
                    file("serving-key.pem")
                ))
                .arg(format!("--client-ca-file={}", file("ca.pem")))
                .arg(format!("--service-account-issuer={SERVICE_ACCOUNT_ISSUER}"))
                .arg(format!("--service-account-key-file={}", file("sa.pub")))
                .arg(format!(
                    "--service-account-signing-key-file={}",
                    file("sa-key.pem")
                ))
                .arg(format!(
                    "--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}"
                ))
                .arg("--allow-privileged=true")
                // One process serves one test: no fairness queues needed.
                .arg("--enable-priority-and-fairness=false"),
            &dir.join("apiserver.log"),
        )?;
        self.apiserver = Some(child);
        self.wait_ready()
    }

    fn wait_ready(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(child) = self.apiserver.as_mut()
                && let Some(status) = child.try_wait()?
            {
                bail!(
                    "kube-apiserver exited ({status}) while starting:\n{}",
                    self.log_tail("apiserver.log")
                );
            }
            if let Some(etcd) = self.etcd.as_mut()
                && let Some(status) = etcd.try_wait()?
            {
                bail!("etcd exited ({status}):\n{}", self.log_tail("etcd.log"));
            }
            let ready = Command::new(self.bin.join("kubectl"))
                .arg(format!("--kubeconfig={}", self.admin_kubeconfig.display()))
                .args(["get", "--raw", "/readyz"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|status| status.success());
            if ready {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "kube-apiserver not ready after {START_TIMEOUT:?}:\n{}",
                    self.log_tail("apiserver.log")
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Stops the API server; etcd keeps the data. For tests of a control
    /// plane riding out an outage; [`KubeApi::start_apiserver`] ends it.
    pub fn stop_apiserver(&mut self) {
        if let Some(child) = self.apiserver.take() {
            stop(child);
        }
    }

    /// Starts the API server again on the same port, after
    /// [`KubeApi::stop_apiserver`]. Does nothing while it runs.
    pub fn start_apiserver(&mut self) -> anyhow::Result<()> {
        if self.apiserver.is_some() {
            return Ok(());
        }
        let port = self.port()?;
        self.start_apiserver_on(port)
    }

    fn port(&self) -> anyhow::Result<u16> {
        self.server
            .rsplit_once(':')
            .and_then(|(_, port)| port.parse().ok())
            .context("server URL without a port")
    }

    /// `https://127.0.0.1:<port>`.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The API server's address, on this process's loopback.
    pub fn address(&self) -> anyhow::Result<SocketAddr> {
        Ok(SocketAddr::from(([127, 0, 0, 1], self.port()?)))
    }

    /// The CA that signed the API server's serving certificate, PEM.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// A kubeconfig file for the admin (group `system:masters`).
    pub fn admin_kubeconfig(&self) -> &Path {
        &self.admin_kubeconfig
    }

    /// How long start-up took, etcd included.
    pub fn started_in(&self) -> Duration {
        self.started_in
    }

    /// Writes a kubeconfig that authenticates with `token` (e.g. a service
    /// account's, from the TokenRequest API) and returns its path.
    pub fn kubeconfig_for_token(&self, name: &str, token: &str) -> anyhow::Result<PathBuf> {
        let path = self.dir.path().join(format!("{name}.kubeconfig"));
        std::fs::write(
            &path,
            kubeconfig(&self.server, &self.ca_pem, User::Token(token)),
        )?;
        Ok(path)
    }

    /// A kubeconfig file for a client certificate with common name `user`
    /// in `groups`, signed by the API server's client CA: how a kubelet
    /// (`system:node:<name>` in `system:nodes`), kube-proxy, the scheduler
    /// and the controller-manager authenticate.
    pub fn kubeconfig_for_user(
        &self,
        name: &str,
        user: &str,
        groups: &[&str],
    ) -> anyhow::Result<PathBuf> {
        let ca_key = KeyPair::from_pem(&self.ca_key_pem)?;
        let issuer = rcgen::Issuer::from_ca_cert_pem(&self.ca_pem, ca_key)?;
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, user);
        for group in groups {
            params
                .distinguished_name
                .push(DnType::OrganizationName, *group);
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params.signed_by(&key, &issuer)?;
        let path = self.dir.path().join(format!("{name}.kubeconfig"));
        std::fs::write(
            &path,
            kubeconfig(
                &self.server,
                &self.ca_pem,
                User::Certificate {
                    cert_pem: &cert.pem(),
                    key_pem: &key.serialize_pem(),
                },
            ),
        )?;
        Ok(path)
    }

    /// The same kubeconfig with another server URL: for a component that
    /// reaches the API server at another address than this process does.
    pub fn kubeconfig_with_server(
        &self,
        kubeconfig: &Path,
        server: &str,
    ) -> anyhow::Result<PathBuf> {
        let mut config: serde_json::Value = serde_json::from_slice(&std::fs::read(kubeconfig)?)?;
        config["clusters"][0]["cluster"]["server"] = serde_json::Value::from(server);
        let stem = kubeconfig
            .file_stem()
            .and_then(|stem| stem.to_str())
            .unwrap_or("kubeconfig");
        let path = kubeconfig.with_file_name(format!("{stem}-remote.kubeconfig"));
        std::fs::write(&path, config.to_string())?;
        Ok(path)
    }

    /// The service-account signing key (PEM file): the controller-manager
    /// signs the legacy token Secrets with it.
    pub fn service_account_key(&self) -> PathBuf {
        self.dir.path().join("sa-key.pem")
    }

    /// The client and serving CA (PEM file), as kubelets and pods trust it.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// The directory of the binaries `scripts/k8s-test-env.sh` built.
    pub fn bin(&self) -> &Path {
        &self.bin
    }

    /// A directory for the test's own files, removed with the API server.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A client as the admin.
    pub async fn admin_client(&self) -> anyhow::Result<kube::Client> {
        client_from_kubeconfig(&self.admin_kubeconfig).await
    }

    /// Runs `kubectl` as the admin with `args`; its stdout, or an error
    /// carrying its stderr.
    pub fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> anyhow::Result<String> {
        use std::io::Write;
        let mut child = Command::new(self.bin.join("kubectl"))
            .arg(format!("--kubeconfig={}", self.admin_kubeconfig.display()))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("running kubectl")?;
        if let Some(mut pipe) = child.stdin.take() {
            pipe.write_all(stdin.unwrap_or_default().as_bytes())?;
        }
        let output = child.wait_with_output()?;
        if !output.status.success() {
            bail!(
                "kubectl {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// Server-side applies `yaml` as the admin; kubectl's report, one
    /// `<kind>/<name> serverside-applied` line per object, or an error
    /// naming every object the API server refused.
    pub fn apply_server_side(&self, yaml: &str) -> anyhow::Result<String> {
        self.kubectl(
            &[
                "apply",
                "--server-side",
                "--field-manager=ztunnel-tests",
                "-f",
                "-",
            ],
            Some(yaml),
        )
    }

    fn log_tail(&self, name: &str) -> String {
        let text = std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for KubeApi {
    fn drop(&mut self) {
        if let Some(child) = self.apiserver.take() {
            stop(child);
        }
        // etcd last: the API server's shutdown still talks to it.
        if let Some(etcd) = self.etcd.take() {
            stop(etcd);
        }
    }
}

/// A kube client from a kubeconfig file.
pub async fn client_from_kubeconfig(path: &Path) -> anyhow::Result<kube::Client> {
    let kubeconfig = kube::config::Kubeconfig::read_from(path)?;
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await?;
    Ok(kube::Client::try_from(config)?)
}

/// The generated certificates and keys, PEM.
struct Pki {
    ca_pem: String,
    ca_key_pem: String,
    serving_pem: String,
    serving_key_pem: String,
    admin_cert_pem: String,
    admin_key_pem: String,
    sa_key_pem: String,
    sa_public_pem: String,
}

impl Pki {
    /// `names`: serving-certificate names beside the loopback ones.
    fn generate(names: Vec<String>) -> anyhow::Result<Pki> {
        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "ztunnel test kubernetes CA");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let issuer = rcgen::Issuer::new(ca_params, &ca_key);

        let serving_key = KeyPair::generate()?;
        let mut serving_names = vec![
            "localhost".to_owned(),
            "127.0.0.1".to_owned(),
            "kubernetes.default.svc".to_owned(),
        ];
        serving_names.extend(names);
        let mut serving = CertificateParams::new(serving_names)?;
        serving
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let serving_cert = serving.signed_by(&serving_key, &issuer)?;

        let admin_key = KeyPair::generate()?;
        let mut admin = CertificateParams::new(Vec::<String>::new())?;
        admin.distinguished_name.push(DnType::CommonName, "admin");
        admin
            .distinguished_name
            .push(DnType::OrganizationName, "system:masters");
        admin.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let admin_cert = admin.signed_by(&admin_key, &issuer)?;

        let sa_key = KeyPair::generate()?;
        Ok(Pki {
            ca_pem: ca_cert.pem(),
            ca_key_pem: ca_key.serialize_pem(),
            serving_pem: serving_cert.pem(),
            serving_key_pem: serving_key.serialize_pem(),
            admin_cert_pem: admin_cert.pem(),
            admin_key_pem: admin_key.serialize_pem(),
            sa_public_pem: sa_key.public_key_pem(),
            sa_key_pem: sa_key.serialize_pem(),
        })
    }

    fn write(&self, dir: &Path) -> anyhow::Result<()> {
        for (name, content) in [
            ("ca.pem", &self.ca_pem),
            ("serving.pem", &self.serving_pem),
            ("serving-key.pem", &self.serving_key_pem),
            ("sa-key.pem", &self.sa_key_pem),
            ("sa.pub", &self.sa_public_pem),
            ("admin.pem", &self.admin_cert_pem),
            ("admin-key.pem", &self.admin_key_pem),
        ] {
            std::fs::write(dir.join(name), content)?;
        }
        Ok(())
    }
}

enum User<'a> {
    Certificate { cert_pem: &'a str, key_pem: &'a str },
    Token(&'a str),
}

fn kubeconfig(server: &str, ca_pem: &str, user: User<'_>) -> String {
    let user = match user {
        User::Certificate { cert_pem, key_pem } => serde_json::json!({
            "client-certificate-data": STANDARD.encode(cert_pem),
            "client-key-data": STANDARD.encode(key_pem),
        }),
        User::Token(token) => serde_json::json!({ "token": token }),
    };
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": {
            "server": server,
            "certificate-authority-data": STANDARD.encode(ca_pem),
        }}],
        "users": [{"name": "test", "user": user}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
        "current-context": "test",
    })
    .to_string()
}

fn free_port() -> anyhow::Result<SocketAddr> {
    Ok(crate::ports::unused_loopback_port()?)
}

fn spawn(command: &mut Command, log: &Path) -> anyhow::Result<Child> {
    let out = std::fs::File::create(log)?;
    let err = out.try_clone()?;
    command
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .with_context(|| format!("starting {:?}", command.get_program()))
}

/// SIGTERM to the child we started, by PID, then SIGKILL if it has not
/// exited in five seconds.
fn stop(mut child: Child) {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}
