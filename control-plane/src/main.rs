//! `ztunnel-ca`: the mesh certificate authority and control plane.
//!
//! `serve` runs the CA and the delta xDS server (both gRPC on one TLS
//! port, as istiod's 15012), plus `/metrics` over plain HTTP;
//! `token` mints a pod-bound service-account token with the state
//! directory's local key, which `serve` trusts when `--token-keys` is not
//! given. The CA signs with the root (or intermediate) of the flags; else,
//! on Kubernetes, with the one in the Secrets of its namespace
//! (`ca::signing_secret`); else with the state directory's. `serve`'s
//! flags and their conversions are `settings`'; this file only wires the
//! library together.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use tokio::net::TcpListener;
use tokio::sync::watch;
use ztunnel_certs::error_chain;
use ztunnel_certs::issuer::{Issuer, SigningMaterial};
use ztunnel_control_plane::ca::authenticator::Authenticator;
use ztunnel_control_plane::ca::authn::{DEFAULT_AUDIENCE, DEFAULT_ISSUER};
use ztunnel_control_plane::ca::metrics::{self, CaMetrics, Readiness};
use ztunnel_control_plane::ca::signing_secret;
use ztunnel_control_plane::ca::state_dir::{StateDir, StateDirError};
use ztunnel_control_plane::ca::token::PodToken;
use ztunnel_control_plane::ca::{CaConfig, server};
use ztunnel_control_plane::kubernetes::{self, MetricsObserver, Permissions};
use ztunnel_control_plane::root_configmap;
use ztunnel_control_plane::untaint;
use ztunnel_control_plane::{service_entry_status, waypoint_status};
use ztunnel_mesh::kube::source::KubeRegistry;
use ztunnel_mesh::{FileRegistry, MeshSnapshot, PodRegistry, StaticRegistry};

use settings::{ServeArgs, parse_duration};

mod settings;

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
    let client = args.source.kubernetes_client().await?;
    let issuer = Arc::new(issuer(&args, state, client.as_ref(), now).await?);
    let (stop, stopped) = watch::channel(false);
    let metrics = Arc::new(CaMetrics::new());
    let source = match client {
        Some(client) => kubernetes_source(&args, client, &issuer, &metrics, &stopped)?,
        None => file_source(&args, state, &metrics, &stopped)?,
    };
    let config = CaConfig {
        trust_domain: args.trust_domain.clone(),
        issuer,
        ttl: args.ttl.policy(),
        authenticator: source.authenticator,
        trusted_node_accounts: args.trusted_node_accounts.clone(),
        registry: source.registry,
        metrics: Arc::clone(&metrics),
        serving_dns_names: args.serving_cert.serving_dns_names.clone(),
        serving_ips: args.serving_cert.serving_ips.clone(),
        connections: ztunnel_control_plane::ca::connection::ConnectionLimits::DEFAULT,
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
    let authenticator = Arc::new(args.authentication.local_keys(state)?);
    let registry: Arc<dyn PodRegistry> = match args.source.mesh_file() {
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

/// The Kubernetes API: watched objects, tokens checked against its
/// published keys and then by TokenReview, readiness once the permissions
/// are in place, the keys fetched and every watch listed; the root
/// published to the namespaces ztunnel reads it in.
fn kubernetes_source(
    args: &ServeArgs,
    client: kube::Client,
    issuer: &Issuer,
    metrics: &Arc<CaMetrics>,
    stopped: &watch::Receiver<bool>,
) -> anyhow::Result<Source> {
    // Read before anything starts: a bad mesh config stops start-up.
    let settings = args
        .convert
        .settings(&args.trust_domain, &args.pod_namespace)?;
    tokio::spawn(root_configmap::run(
        client.clone(),
        args.root_namespaces(),
        issuer.root_bundle_pem().to_owned(),
        wait(stopped.clone()),
    ));
    let permissions = Arc::new(Permissions::default());
    let mut required = kubernetes::REQUIRED_ACCESS.to_vec();
    if let Some(config) = args.untaint.config(&args.pod_namespace) {
        required.extend_from_slice(kubernetes::UNTAINT_ACCESS);
        tokio::spawn(untaint::run(client.clone(), config, wait(stopped.clone())));
    }
    tokio::spawn(waypoint_status::run(
        client.clone(),
        settings.cluster_domain.clone(),
        wait(stopped.clone()),
    ));
    tokio::spawn(service_entry_status::run(
        client.clone(),
        wait(stopped.clone()),
    ));
    tokio::spawn(kubernetes::watch_permissions(
        client.clone(),
        Arc::clone(&permissions),
        required,
    ));
    let registry = KubeRegistry::start(
        client.clone(),
        settings,
        Arc::new(MetricsObserver(Arc::clone(metrics))),
        wait(stopped.clone()),
    );
    let (authenticator, keys) =
        args.authentication
            .token_review(client, Arc::clone(metrics), wait(stopped.clone()));
    tracing::info!("mesh source: the Kubernetes API");
    Ok(Source {
        registry: Arc::clone(&registry) as Arc<dyn PodRegistry>,
        authenticator: Arc::new(authenticator),
        readiness: kubernetes::readiness(registry, permissions, keys),
    })
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
    let (mut material, origin) = match (args.signing.root()?, client) {
        (Some(material), _) => (
            material,
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
    args.signing
        .add_intermediate_and_extra_roots(&mut material)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
