//! `ztunnel-ca`: the mesh certificate authority and control plane.
//!
//! `serve` runs the CA and the delta xDS server (both gRPC on one TLS
//! port, as istiod's 15012), plus `/metrics` over plain HTTP;
//! `token` mints a pod-bound service-account token with the state
//! directory's local key, which `serve` trusts when `--token-keys` is not
//! given. The CA signs with the root (or intermediate) of the flags; else,
//! on Kubernetes, with the one in the Secrets of its namespace
//! (`ca::signing_secret`); else with the state directory's. This file only
//! parses flags and wires the library together.

use std::collections::BTreeSet;
use std::io::{IsTerminal, Write};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use tokio::net::TcpListener;
use tokio::sync::watch;
use ztunnel_certs::error_chain;
use ztunnel_certs::issuer::{IntermediateMaterial, Issuer, SecretPem, SigningMaterial, TtlPolicy};
use ztunnel_control_plane::ca::authenticator::{Authenticator, TokenReviewer};
use ztunnel_control_plane::ca::authn::{
    DEFAULT_AUDIENCE, DEFAULT_ISSUER, DEFAULT_LEEWAY, TokenPolicy,
};
use ztunnel_control_plane::ca::authz::{DEFAULT_TRUSTED_NODE_ACCOUNT, NodeAgentAccount};
use ztunnel_control_plane::ca::metrics::{self, CaMetrics, Readiness};
use ztunnel_control_plane::ca::signing_secret;
use ztunnel_control_plane::ca::state_dir::{StateDir, StateDirError};
use ztunnel_control_plane::ca::token::PodToken;
use ztunnel_control_plane::ca::token_keys::TokenKeys;
use ztunnel_control_plane::ca::{CaConfig, server};
use ztunnel_control_plane::kubernetes::{self, MetricsObserver, Permissions};
use ztunnel_control_plane::root_configmap;
use ztunnel_control_plane::untaint::{self, DEFAULT_TAINT_KEY, UntaintConfig};
use ztunnel_control_plane::waypoint_status;
use ztunnel_mesh::kube::convert::ConvertSettings;
use ztunnel_mesh::kube::source::KubeRegistry;
use ztunnel_mesh::{FileRegistry, MeshSnapshot, PodRegistry, StaticRegistry};

/// The mesh certificate authority and control plane: issues SPIFFE workload
/// certificates to callers authenticated by Kubernetes service-account
/// tokens, lets trusted node agents obtain the identities of pods on their
/// own node, and serves the mesh file's workloads, services and policies to
/// those node agents over delta xDS on the same port.
#[derive(Debug, Parser)]
#[command(name = "ztunnel-ca", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once at start-up; the size difference between variants costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
enum Command {
    /// Run the CA: IstioCertificateService and delta ADS over TLS, and
    /// /metrics.
    Serve(ServeArgs),
    /// Print a pod-bound service-account token signed by the state
    /// directory's local key (created on first use).
    Token(TokenArgs),
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// Address of the gRPC/TLS listener.
    #[arg(long, default_value = "127.0.0.1:15012")]
    listen: SocketAddr,
    /// Trust domain of every issued identity.
    #[arg(long, default_value = "cluster.local")]
    trust_domain: String,
    /// Root certificate (PEM). Without it, on Kubernetes the CA signs with
    /// the Secret `cacerts` of --pod-namespace (ca-cert.pem, ca-key.pem,
    /// root-cert.pem, cert-chain.pem, as istiod) if it exists, else with
    /// the root in the Secret `istio-ca-secret`, generated and stored there
    /// by the first replica to start; with a mesh file, a root is generated
    /// in --state-dir on first start and reused after.
    #[arg(long)]
    root_cert: Option<PathBuf>,
    /// Root private key (PEM). Not needed when an intermediate signs.
    #[arg(long, requires = "root_cert")]
    root_key: Option<PathBuf>,
    /// Intermediate chain (PEM, signing certificate first) that signs
    /// instead of the root.
    #[arg(long, requires_all = ["intermediate_key", "root_cert"])]
    intermediate_cert: Option<PathBuf>,
    /// Private key (PEM) of the signing intermediate.
    #[arg(long, requires = "intermediate_cert")]
    intermediate_key: Option<PathBuf>,
    /// More root certificates (PEM bundle) to hand out with the root, e.g.
    /// the previous root during a rotation.
    #[arg(long)]
    extra_roots: Option<PathBuf>,
    /// Directory for the generated root and the local token key (mode 0700);
    /// not used on Kubernetes.
    #[arg(long, default_value = "ztunnel-ca-state")]
    state_dir: PathBuf,
    /// Mesh file (YAML), the source of truth for impersonation and xDS:
    /// `{pods: [...], services: [...], policies: [...], networkGateways:
    /// [...]}`, or a bare list of pods. Pods: name, namespace, uid,
    /// serviceAccount, nodeName, phase, ips, labels, protocol (HBONE or
    /// TCP), network, clusterId, workloadName, locality {region, zone,
    /// subzone}, waypoint, applicationTunnel {protocol, port}. Services:
    /// name, namespace, hostname, vips, ports {servicePort: targetPort}, and
    /// selector (labels) or endpoints (pod uids); waypoint,
    /// weightedWaypoints [{waypoint, weight}], ingressUseWaypoint,
    /// subjectAltNames (SPIFFE identities, as a ServiceEntry's). A
    /// waypoint is {service: name or ns/name}, {hostname, namespace} or
    /// {address: net/ip}, each with an optional port (15008). Network
    /// gateways: network, namespace, serviceAccount, address or hostname,
    /// port. Policies: as ztunnel's local file, plus selector for scope
    /// WorkloadSelector. Reloaded when it changes; a bad edit keeps the last
    /// good file. Without it no impersonation is authorized and xDS serves
    /// nothing.
    #[arg(long, visible_alias = "pods", conflicts_with_all = ["kubeconfig", "in_cluster"])]
    mesh: Option<PathBuf>,
    /// Take the mesh from the Kubernetes API with this kubeconfig, instead
    /// of a mesh file: Pods, Namespaces, Services, EndpointSlices, Nodes,
    /// security.istio.io AuthorizationPolicies and (when installed) Gateway
    /// API Gateways and GatewayClasses are watched, and callers'
    /// tokens are checked by TokenReview (the role it needs:
    /// deploy/rbac/control-plane.yaml).
    #[arg(long, conflicts_with = "in_cluster")]
    kubeconfig: Option<PathBuf>,
    /// As --kubeconfig, with the credentials of the pod this runs in.
    #[arg(long)]
    in_cluster: bool,
    /// Cluster id of the workloads (`Kubernetes` is istiod's default).
    #[arg(long, env = "CLUSTER_ID", default_value = "Kubernetes")]
    cluster_id: String,
    /// DNS domain of Service hostnames (`<name>.<ns>.svc.<domain>`).
    #[arg(long, default_value = "cluster.local")]
    cluster_domain: String,
    /// The mesh's root namespace: its policies without a selector apply to
    /// every namespace.
    #[arg(long, default_value = "istio-system")]
    root_namespace: String,
    /// Send AuthorizationPolicies annotated `istio.io/dry-run: "true"` with
    /// dry_run set (ztunnel logs, does not enforce); without it they are
    /// not sent, as istiod's default.
    #[arg(long)]
    enable_dry_run_policies: bool,
    /// Run the node untaint controller (Kubernetes only): remove the
    /// --taint-name taint from a node once the node agent pod there
    /// (label k8s-app=istio-cni-node in --taint-namespace) is Ready. Needs
    /// patch on nodes (deploy/rbac/control-plane-untaint.yaml).
    #[arg(long, env = "PILOT_ENABLE_NODE_UNTAINT_CONTROLLERS")]
    taint_enabled: bool,
    /// Namespace of the node agent pods; empty means the control plane's
    /// own (POD_NAMESPACE), else istio-system.
    #[arg(long, default_value = "")]
    taint_namespace: String,
    /// The taint the untaint controller removes.
    #[arg(long, env = "PILOT_NODE_UNTAINT_CONTROLLERS_TAINT_NAME", default_value = DEFAULT_TAINT_KEY)]
    taint_name: String,
    /// The namespace this control plane runs in (the downward API's): where
    /// the signing Secrets are, and the first namespace the root is
    /// published in.
    #[arg(long, env = "POD_NAMESPACE", default_value = "istio-system")]
    pod_namespace: String,
    /// Another namespace to publish the root in, as the ConfigMap
    /// istio-ca-root-cert that ztunnel mounts (Kubernetes only; always in
    /// --pod-namespace). Repeatable. istiod publishes it in every
    /// namespace; publishing only where ztunnel (or another reader) runs
    /// keeps the role to ConfigMaps in those namespaces alone, with no
    /// cluster-wide write (deploy/rbac/control-plane-ca.yaml).
    #[arg(long = "root-cert-namespace")]
    root_cert_namespaces: Vec<String>,
    /// How often the mesh file is checked for changes.
    #[arg(long, visible_alias = "pods-poll-interval", default_value = "1s", value_parser = parse_duration)]
    mesh_poll_interval: Duration,
    /// Token verification keys: a JWKS JSON file or PEM public keys (RS256,
    /// ES256). Default: the state directory's local token key.
    #[arg(long)]
    token_keys: Option<PathBuf>,
    /// Required token issuer (`iss`).
    #[arg(long, default_value = DEFAULT_ISSUER)]
    token_issuer: String,
    /// Required token audience (one of `aud`).
    #[arg(long, default_value = DEFAULT_AUDIENCE)]
    audience: String,
    /// A node agent (`namespace/service-account`) allowed to request the
    /// identities of pods on its node, and to subscribe to xDS. Repeatable.
    #[arg(long = "trusted-node-account", default_value = DEFAULT_TRUSTED_NODE_ACCOUNT)]
    trusted_node_accounts: Vec<NodeAgentAccount>,
    /// Lifetime of a workload certificate when the request asks for none.
    #[arg(long, default_value = "24h", value_parser = parse_duration)]
    default_ttl: Duration,
    /// Longest lifetime a request may ask for; longer is InvalidArgument.
    #[arg(long, default_value = "90d", value_parser = parse_duration)]
    max_ttl: Duration,
    /// Address of the plain-HTTP /metrics listener.
    #[arg(long, default_value = "127.0.0.1:15014")]
    metrics_listen: SocketAddr,
    /// DNS name in the CA's serving certificate. Repeatable.
    #[arg(long = "serving-dns-name", default_values = ["localhost", "istiod.istio-system.svc"])]
    serving_dns_names: Vec<String>,
    /// IP address in the CA's serving certificate. Repeatable.
    #[arg(long = "serving-ip", default_value = "127.0.0.1")]
    serving_ips: Vec<IpAddr>,
}

#[derive(Debug, Args)]
struct TokenArgs {
    /// State directory holding the token key (shared with `serve`).
    #[arg(long, default_value = "ztunnel-ca-state")]
    state_dir: PathBuf,
    /// Pod namespace.
    #[arg(long)]
    namespace: String,
    /// Pod service account.
    #[arg(long)]
    service_account: String,
    /// Pod name.
    #[arg(long)]
    pod: String,
    /// Pod UID.
    #[arg(long)]
    pod_uid: String,
    /// Node the pod runs on (the token's node claim).
    #[arg(long)]
    node: Option<String>,
    /// Token lifetime.
    #[arg(long, default_value = "12h", value_parser = parse_duration)]
    ttl: Duration,
    /// Token audience. Repeatable.
    #[arg(long = "audience", default_value = DEFAULT_AUDIENCE)]
    audiences: Vec<String>,
    /// Token issuer (`iss`).
    #[arg(long, default_value = DEFAULT_ISSUER)]
    issuer: String,
}

fn main() -> ExitCode {
    error_chain::exit_code("ztunnel-ca", run())
}

fn run() -> anyhow::Result<()> {
    ztunnel_certs::tls::install_provider();
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => {
            init_logging();
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .context("starting the runtime")?
                .block_on(serve(args))
        }
        Command::Token(args) => token(&args),
    }
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour codes only for a terminal: a log file or the kubelet's
        // log would hold them as text.
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let now = SystemTime::now();
    // Opened only when something is generated or defaulted there, so that a
    // CA run with explicit files, or on Kubernetes, needs no writable
    // directory.
    let state = || StateDir::open(&args.state_dir);
    let client = if args.kubeconfig.is_some() || args.in_cluster {
        Some(kubernetes::client(args.kubeconfig.as_deref()).await?)
    } else {
        None
    };
    let issuer = Arc::new(issuer(&args, state, client.as_ref(), now).await?);
    let (stop, stopped) = watch::channel(false);
    let metrics = Arc::new(CaMetrics::new());
    let source = match client {
        Some(client) => kubernetes_source(&args, client, &issuer, &metrics, &stopped),
        None => file_source(&args, state, &metrics, &stopped)?,
    };
    let config = CaConfig {
        trust_domain: args.trust_domain.clone(),
        issuer,
        ttl: TtlPolicy::new(args.default_ttl, args.max_ttl),
        authenticator: source.authenticator,
        trusted_node_accounts: args.trusted_node_accounts.clone(),
        registry: source.registry,
        metrics: Arc::clone(&metrics),
        serving_dns_names: args.serving_dns_names.clone(),
        serving_ips: args.serving_ips.clone(),
    };

    let grpc = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let http = TcpListener::bind(args.metrics_listen)
        .await
        .with_context(|| format!("binding {}", args.metrics_listen))?;
    let (grpc_addr, http_addr) = (grpc.local_addr()?, http.local_addr()?);
    tokio::spawn(metrics::serve(
        metrics,
        source.readiness,
        http,
        wait(stopped.clone()),
    ));
    tracing::info!(%grpc_addr, %http_addr, trust_domain = %args.trust_domain, "CA and xDS serving");
    // One line on stdout, for scripts and tests that pass port 0.
    let mut stdout = std::io::stdout();
    writeln!(
        stdout,
        "ztunnel-ca listening on {grpc_addr} metrics {http_addr}"
    )?;
    stdout.flush()?;

    tokio::spawn(async move {
        let signal = ztunnel_process::shutdown::signal().await;
        tracing::info!("{}: shutting down", signal.name());
        let _ = stop.send(true);
    });
    server::serve(config, grpc, wait(stopped)).await?;
    Ok(())
}

/// Where the mesh comes from, how callers are authenticated, and when the
/// control plane is ready.
struct Source {
    registry: Arc<dyn PodRegistry>,
    authenticator: Arc<Authenticator>,
    readiness: Readiness,
}

/// The mesh file (or nothing), with tokens verified by local keys.
fn file_source(
    args: &ServeArgs,
    state: impl Fn() -> Result<StateDir, StateDirError>,
    metrics: &Arc<CaMetrics>,
    stopped: &watch::Receiver<bool>,
) -> anyhow::Result<Source> {
    let keys = match &args.token_keys {
        Some(path) => TokenKeys::load(path)?,
        None => state()?.token_signer()?.verifying_keys()?,
    };
    let authenticator = Arc::new(Authenticator::Keys {
        keys,
        policy: TokenPolicy {
            issuer: args.token_issuer.clone(),
            audience: args.audience.clone(),
            leeway: DEFAULT_LEEWAY,
        },
    });
    let registry: Arc<dyn PodRegistry> = match &args.mesh {
        Some(path) => {
            let registry = Arc::new(FileRegistry::load(path)?);
            let refusals = Arc::clone(metrics);
            let watcher = Arc::clone(&registry).watch(
                args.mesh_poll_interval,
                move |_| refusals.record_mesh_reload_error(),
                wait(stopped.clone()),
            );
            tokio::spawn(watcher);
            registry
        }
        None => {
            tracing::warn!("no --mesh file: impersonation will be denied, xDS serves nothing");
            Arc::new(StaticRegistry::new(MeshSnapshot::default()))
        }
    };
    Ok(Source {
        registry,
        authenticator,
        readiness: Arc::new(|| None),
    })
}

/// The Kubernetes API: watched objects, TokenReview, readiness once the
/// permissions are in place and every watch has listed; the root
/// published to the namespaces ztunnel reads it in.
fn kubernetes_source(
    args: &ServeArgs,
    client: kube::Client,
    issuer: &Issuer,
    metrics: &Arc<CaMetrics>,
    stopped: &watch::Receiver<bool>,
) -> Source {
    let root_namespaces: BTreeSet<String> = std::iter::once(&args.pod_namespace)
        .chain(&args.root_cert_namespaces)
        .cloned()
        .collect();
    tokio::spawn(root_configmap::run(
        client.clone(),
        root_namespaces,
        issuer.root_bundle_pem().to_owned(),
        wait(stopped.clone()),
    ));
    let permissions = Arc::new(Permissions::default());
    let mut required = kubernetes::REQUIRED_ACCESS.to_vec();
    if args.taint_enabled {
        required.extend_from_slice(kubernetes::UNTAINT_ACCESS);
        let agent_namespace = if args.taint_namespace.is_empty() {
            args.pod_namespace.clone()
        } else {
            args.taint_namespace.clone()
        };
        tokio::spawn(untaint::run(
            client.clone(),
            UntaintConfig {
                agent_namespace,
                taint_key: args.taint_name.clone(),
            },
            wait(stopped.clone()),
        ));
    }
    tokio::spawn(waypoint_status::run(
        client.clone(),
        args.cluster_domain.clone(),
        wait(stopped.clone()),
    ));
    tokio::spawn(kubernetes::watch_permissions(
        client.clone(),
        Arc::clone(&permissions),
        required,
    ));
    let settings = ConvertSettings {
        cluster_id: args.cluster_id.clone(),
        trust_domain: args.trust_domain.clone(),
        cluster_domain: args.cluster_domain.clone(),
        root_namespace: args.root_namespace.clone(),
        enable_dry_run_policies: args.enable_dry_run_policies,
        system_namespace: args.pod_namespace.clone(),
        ..ConvertSettings::default()
    };
    let registry = KubeRegistry::start(
        client.clone(),
        settings,
        Arc::new(MetricsObserver(Arc::clone(metrics))),
        wait(stopped.clone()),
    );
    tracing::info!("mesh source: the Kubernetes API");
    Source {
        registry: Arc::clone(&registry) as Arc<dyn PodRegistry>,
        authenticator: Arc::new(Authenticator::TokenReview(TokenReviewer::new(
            client,
            &args.audience,
        ))),
        readiness: kubernetes::readiness(registry, permissions),
    }
}

/// The issuer, from the flags' files, else the Kubernetes Secrets (with a
/// client), else the state directory; errors name where the material came
/// from.
async fn issuer(
    args: &ServeArgs,
    state: impl FnOnce() -> Result<StateDir, StateDirError>,
    client: Option<&kube::Client>,
    now: SystemTime,
) -> anyhow::Result<Issuer> {
    let read = |path: &PathBuf| {
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
    };
    let (mut material, origin) = match (&args.root_cert, client) {
        (Some(cert), _) => (
            SigningMaterial {
                root_cert_pem: read(cert)?,
                root_key_pem: args
                    .root_key
                    .as_ref()
                    .map(read)
                    .transpose()?
                    .map(SecretPem::new),
                ..SigningMaterial::default()
            },
            "the files of --root-cert and the flags beside it".to_owned(),
        ),
        (None, Some(client)) => {
            let namespace = &args.pod_namespace;
            let loaded = signing_secret::load(client, namespace, &args.trust_domain, now)
                .await
                .with_context(|| {
                    format!("reading the CA's signing material in namespace {namespace}")
                })?;
            (
                loaded.material,
                format!("Secret {namespace}/{}", loaded.secret),
            )
        }
        (None, None) => {
            let root = state()?.root(&args.trust_domain, now)?;
            let material = SigningMaterial {
                root_cert_pem: root.cert_pem,
                root_key_pem: Some(root.key_pem),
                ..SigningMaterial::default()
            };
            (
                material,
                format!("--state-dir {}", args.state_dir.display()),
            )
        }
    };
    if let (Some(cert), Some(key)) = (&args.intermediate_cert, &args.intermediate_key) {
        material.intermediate = Some(IntermediateMaterial {
            chain_pem: read(cert)?,
            key_pem: SecretPem::new(read(key)?),
        });
    }
    if let Some(path) = &args.extra_roots {
        let extra = material.extra_roots_pem.take().unwrap_or_default();
        material.extra_roots_pem = Some(extra + &read(path)?);
    }
    Issuer::new(&material).with_context(|| format!("the signing material of {origin}"))
}

fn token(args: &TokenArgs) -> anyhow::Result<()> {
    let signer = StateDir::open(&args.state_dir)?.token_signer()?;
    let token = signer.mint(
        &PodToken {
            issuer: args.issuer.clone(),
            audiences: args.audiences.clone(),
            namespace: args.namespace.clone(),
            service_account: args.service_account.clone(),
            pod_name: args.pod.clone(),
            pod_uid: args.pod_uid.clone(),
            node_name: args.node.clone(),
            ttl: args.ttl,
        },
        SystemTime::now(),
    )?;
    println!("{token}");
    Ok(())
}

/// Resolves once the stop flag is raised (or its sender is gone).
async fn wait(mut stopped: watch::Receiver<bool>) {
    let _ = stopped.wait_for(|stop| *stop).await;
}

/// Parses `45s`, `30m`, `24h`, `90d`.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let unit_at = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{text:?} needs a unit: s, m, h or d"))?;
    let (number, unit) = text.split_at(unit_at);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} does not start with a number"))?;
    let seconds_per_unit = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => {
            return Err(format!(
                "{text:?} has unknown unit {unit:?}; use s, m, h or d"
            ));
        }
    };
    number
        .checked_mul(seconds_per_unit)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("{text:?} is too long"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_a_unit() {
        let cases = [
            ("45s", Some(45)),
            ("30m", Some(1800)),
            ("24h", Some(86_400)),
            ("90d", Some(7_776_000)),
            ("0s", Some(0)),
            ("24", None),
            ("h", None),
            ("1.5h", None),
            ("1w", None),
            ("-1h", None),
            ("", None),
            ("99999999999999999999d", None),
        ];
        for (text, want) in cases {
            assert_eq!(
                parse_duration(text).ok(),
                want.map(Duration::from_secs),
                "{text}"
            );
        }
    }

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
