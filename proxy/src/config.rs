//! The proxy's configuration, parsed once at start-up from environment
//! variables with flags to override them, into typed values. The variable
//! names are istio/ztunnel's wherever the meaning is the same, so that a
//! deployment moves over unchanged. This is the one module that reads the
//! environment (through clap); the rest of the proxy gets a [`Config`].
//!
//! Here: the `Config`, the command line and its wiring. The command line is
//! one group of flags per concern, each in its own file under `config/`
//! with the conversion of its flags into its part of the `Config`: `mode`,
//! `xds` (and where the configuration comes from), `ca`, `mesh`,
//! `keepalive`, `dns`, `workers`, `pool`, `http2`, `listeners`, `logging`,
//! `limits` (drain deadline and caps), `inpod`, and `proxy_config`
//! (Istio's ProxyConfig and mesh config, which the others read defaults
//! from). The local workload
//! file's format lives in `config/local.rs`; value syntax in
//! `config/value.rs`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{CommandFactory, FromArgMatches, Parser, ValueEnum};
use ztunnel_certs::tls::KeyExchange;

use crate::control_plane::{ControlPlaneError, ExtraHeaders, RootSource, TokenSource};
use crate::version::BuildInfo;

mod ca;
mod dns;
mod http2;
mod inpod;
mod keepalive;
mod limits;
mod listeners;
pub mod local;
mod logging;
mod mesh;
mod mode;
mod pool;
mod proxy_config;
mod value;
mod workers;
mod xds;

pub use dns::{DnsAddress, DnsSettings, DnsUpstream};
pub use http2::Http2Settings;
pub use inpod::InpodSettings;
pub use limits::drain_deadline;
pub use listeners::Listeners;
pub use logging::LogFormat;
pub use mode::ProxyMode;
pub use pool::PoolSettings;
pub use value::{ValueError, WorkloadInfo, parse_duration};
pub use xds::{DEFAULT_TOKEN_PATH, DEFAULT_XDS_ADDRESS, NodeSettings, XdsSettings};

/// The first argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Command {
    /// Run the proxy.
    Proxy,
    /// Print the version and exit.
    Version,
    /// Print this help and exit.
    Help,
}

/// The whole configuration, typed.
#[derive(Debug, Clone)]
pub struct Config {
    /// Shared (in-pod) or dedicated.
    pub mode: ProxyMode,
    /// ztunnel's own pod (`POD_NAMESPACE`, `POD_NAME`, `SERVICE_ACCOUNT`),
    /// which in shared mode it serves on an HBONE listener of its own, with
    /// its own identity; `None` otherwise.
    pub own_workload: Option<WorkloadInfo>,
    /// Workloads, services and policies from a local file, reloaded on change.
    pub local_xds_path: Option<PathBuf>,
    /// The xDS client's settings; `None` when configuration comes only from
    /// the local file.
    pub xds: Option<XdsSettings>,
    /// The CA, always over TLS.
    pub ca_address: String,
    /// The only roots the CA's serving certificate is trusted through
    /// (`CA_ROOT_CA`); a file is read again before each CA call, so a
    /// rotated root is used from then on.
    pub ca_root_ca: RootSource,
    /// A second name the CA's certificate may carry (`ALT_CA_HOSTNAME`).
    pub ca_alt_hostname: Option<String>,
    /// Revocation lists (PEM or DER) peers are checked against, read again
    /// when the file changes (`CRL_PATH`).
    pub crl_path: Option<PathBuf>,
    /// Headers sent on every CA call (`CA_HEADER_<NAME>`).
    pub ca_headers: ExtraHeaders,
    /// The CA's Bearer token (`AUTH_TOKEN`: a file, re-read on every
    /// request, else the token itself; unset, [`DEFAULT_TOKEN_PATH`] when it
    /// exists, else none).
    pub auth_token: TokenSource,
    /// Sent as `clusterid` to the CA and xDS; the default cluster of workloads.
    pub cluster_id: String,
    /// Trust domain of the proxy's own identity and of its peers.
    pub trust_domain: String,
    /// The Istio release this proxy serves as ztunnel of
    /// (`ISTIO_META_ISTIO_VERSION`, `unknown` when unset).
    pub istio_version: String,
    /// The network this proxy's pods are on (`NETWORK`, default empty): it
    /// keys every address lookup and is the `x-forwarded-network` sent
    /// through a network gateway (AMBIENT.md §3.1). It must equal the
    /// network the control plane gives the node's workloads.
    pub network: Arc<str>,
    /// Node whose workloads count as local; `None` makes every workload local.
    pub node_name: Option<String>,
    /// SO_MARK on every socket the proxy opens, so capture rules skip them.
    pub packet_mark: Option<u32>,
    /// TCP keepalive of every data-plane socket.
    pub keepalive: crate::socket::Keepalive,
    /// Worker threads of the data-plane runtime.
    pub worker_threads: usize,
    /// Connection pool limits.
    pub pool: PoolSettings,
    /// HTTP/2 windows and frame size for HBONE, both directions.
    pub http2: Http2Settings,
    /// Requested workload certificate lifetime.
    pub secret_ttl: Duration,
    /// Where the listeners bind.
    pub listeners: Listeners,
    /// `RUST_LOG`-style filter.
    pub log_filter: String,
    /// Text or JSON logs.
    pub log_format: LogFormat,
    /// How long a drain waits for connections to finish before closing
    /// them: short enough that the forced close comes before kubelet's
    /// SIGKILL ([`drain_deadline`]).
    pub drain_deadline: Duration,
    /// How long a connection of a pod whose workload the control plane has
    /// not described yet waits for it.
    pub local_workload_wait: Duration,
    /// The most HBONE connections one inbound listener holds between
    /// accept and the end of their TLS handshake; more are closed at once.
    pub max_pending_handshakes: usize,
    /// The most connections and HBONE streams the process carries at once
    /// (`capacity.rs`); more are refused.
    pub max_connections: usize,
    /// What each pod keeps of `max_connections` whatever its neighbours
    /// do (`capacity/ledger.rs`).
    pub min_connections_per_pod: usize,
    /// Whether an application tunnel speaking PROXY is dialled on loopback
    /// (`LOCALHOST_APP_TUNNEL`), so that its listener need not be reachable
    /// from the pod network; the header carries the real addresses.
    pub localhost_app_tunnel: bool,
    /// The key exchange groups of every handshake (`COMPLIANCE_POLICY`).
    pub key_exchange: KeyExchange,
    /// Whether each connection's authorization decision is logged at info
    /// rather than debug (`AUTHZ_POLICY_INFO_LOGGING`).
    pub authz_policy_info_logging: bool,
    /// Whether HBONE's `baggage` is read on both sides and answered on the
    /// 200 (`ENABLE_RESPONSE_BAGGAGE`): the only names of an end reached
    /// through another network's gateway.
    pub response_baggage: bool,
    /// The mean bytes allocated between two sampled allocations of the heap
    /// profile (`ZTUNNEL_HEAP_SAMPLE_BYTES`); 0 samples none.
    pub heap_sample_bytes: u64,
    /// Shared (in-pod) mode settings; unused in dedicated mode.
    pub inpod: InpodSettings,
    /// The DNS proxy.
    pub dns: DnsSettings,
}

impl Config {
    /// Parses the process's flags and environment.
    pub fn from_env_and_args() -> Result<Config, ConfigError> {
        // Variables that are not UTF-8 cannot be any of ours.
        let env = std::env::vars_os().filter_map(|(name, value)| {
            Some((name.into_string().ok()?, value.into_string().ok()?))
        });
        Config::from_args_and_env(std::env::args_os(), env)
    }

    /// Parses the given command line; each option not on it falls back to its
    /// environment variable, then to the default. No prefixed variables
    /// (`ISTIO_META_*`, `XDS_HEADER_*`) are read.
    pub fn from_args<I, T>(args: I) -> Result<Config, ConfigError>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        Config::from_args_and_env(args, std::iter::empty())
    }

    /// [`Config::from_args`], with `env` as the source of the prefixed
    /// variables (`ISTIO_META_*`, `ISTIO_METAJSON_*`, `XDS_HEADER_*`).
    pub fn from_args_and_env<I, T>(
        args: I,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let env: Vec<(String, String)> = env.into_iter().collect();
        let mut command = Args::command();
        let matches = command.try_get_matches_from_mut(args)?;
        let mut parsed = Args::from_arg_matches(&matches)?;
        match parsed.command {
            _ if parsed.print_version => return Err(version(parsed.mesh.istio_version())),
            Command::Version => return Err(version(parsed.mesh.istio_version())),
            Command::Proxy => {}
            Command::Help => return Err(ConfigError::Print(command.render_help().to_string())),
        }
        parsed.mesh.prefer_istio_cluster_id(&matches, &env);
        // Where nothing says how many cores the proxy has, the machine's.
        let logical_cpus = std::thread::available_parallelism().map_or(1, usize::from);
        parsed.into_config(&env, logical_cpus)
    }
}

/// What `version` and `--version` print.
fn version(istio_version: &str) -> ConfigError {
    ConfigError::Print(format!("{}\n", BuildInfo::new(istio_version)))
}

/// Why the configuration is unusable.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Flags or environment did not parse; clap's message says which.
    #[error(transparent)]
    Args(#[from] clap::Error),
    /// A value parsed by type but is not acceptable.
    #[error("{name}")]
    Value {
        /// The environment variable (and flag) at fault.
        name: &'static str,
        /// What is wrong with it.
        source: ValueError,
    },
    /// A control-plane address or header is unusable.
    #[error("{name}")]
    ControlPlane {
        /// The environment variable at fault.
        name: &'static str,
        /// What is wrong with it.
        source: ControlPlaneError,
    },
    /// On-demand xDS and the DNS proxy are both on: the proxy answers from
    /// every service, which on-demand mode never has (istio/ztunnel refuses
    /// it too).
    #[error(
        "XDS_ON_DEMAND needs the DNS proxy off: set proxyMetadata DNS_CAPTURE=false (or ISTIO_META_DNS_CAPTURE=false)"
    )]
    OnDemandWithDnsProxy,
    /// Not a failure: `version` or `help` was asked for; print this text on
    /// standard output and exit 0.
    #[error("{0}")]
    Print(String),
}

impl ConfigError {
    /// For `map_err`: blames the variable `name` for a [`ValueError`].
    fn value(name: &'static str) -> impl Fn(ValueError) -> ConfigError {
        move |source| ConfigError::Value { name, source }
    }
}

/// The command line. Each option also reads the environment variable shown
/// in `--help`; a flag wins over the variable. The groups are flattened in
/// the order `--help` lists them; a setting that stands between two groups
/// there and belongs to neither is a field here.
#[derive(Debug, Parser)]
#[command(
    name = "ztunnel",
    disable_version_flag = true,
    about = "Node-level zero-trust tunnel proxy (HBONE)"
)]
struct Args {
    /// Print the version, as `version` does, and exit.
    #[arg(long = "version", short = 'V')]
    print_version: bool,
    /// What to do, as istio/ztunnel reads its first argument: `proxy` (the
    /// default) runs the proxy, `version` prints the version, `help` this
    /// text. Istio's chart passes `proxy ztunnel`.
    #[arg(value_enum, default_value = "proxy", hide_default_value = true)]
    command: Command,
    /// The proxy type Istio's chart passes after `proxy` (`ztunnel`); the
    /// only one there is, so it is not looked at.
    #[arg(hide = true)]
    proxy_type: Option<String>,
    #[command(flatten)]
    mode: mode::ModeArgs,
    #[command(flatten)]
    xds: xds::XdsArgs,
    #[command(flatten)]
    ca: ca::CaArgs,
    #[command(flatten)]
    mesh: mesh::MeshArgs,
    // Its default follows the mode: `ProxyMode::packet_mark`.
    /// SO_MARK for the proxy's own sockets [default: 1337 in shared mode, none in dedicated].
    #[arg(long, env = "PACKET_MARK")]
    packet_mark: Option<u32>,
    #[command(flatten)]
    keepalive: keepalive::KeepaliveArgs,
    #[command(flatten)]
    dns: dns::DnsArgs,
    #[command(flatten)]
    workers: workers::WorkerArgs,
    #[command(flatten)]
    pool: pool::PoolArgs,
    #[command(flatten)]
    http2: http2::Http2Args,
    // What the CA client asks for, listed apart from `ca.rs`'s group.
    /// Requested workload certificate lifetime.
    #[arg(long, env = "SECRET_TTL", default_value = "24h")]
    secret_ttl: String,
    #[command(flatten)]
    listeners: listeners::ListenerArgs,
    #[command(flatten)]
    logging: logging::LoggingArgs,
    #[command(flatten)]
    limits: limits::LimitArgs,
    /// Dial a workload's PROXY application tunnel on 127.0.0.1 or ::1
    /// rather than its pod IP.
    #[arg(long, env = "LOCALHOST_APP_TUNNEL", default_value_t = true, action = clap::ArgAction::Set)]
    localhost_app_tunnel: bool,
    /// Istio's compliance policy: `pqc` limits every TLS handshake (HBONE,
    /// the CA, xDS) to the post-quantum X25519MLKEM768 key exchange, as
    /// istio/ztunnel does; any other value changes nothing here (TLS 1.3
    /// with AES-GCM is the only protocol already).
    #[arg(long, env = "COMPLIANCE_POLICY", default_value = "")]
    compliance_policy: String,
    /// `true`: each inbound connection's authorization decision (the policy
    /// that allowed or denied it) is logged at info, else at debug, as
    /// istio/ztunnel does; any other value is false, as there.
    #[arg(long, env = "AUTHZ_POLICY_INFO_LOGGING", default_value = "")]
    authz_policy_info_logging: String,
    /// Answer each HBONE CONNECT's 200 with the local workload's
    /// `baggage`, and read a client's for a source the state cannot name
    /// (one from another network), as istio/ztunnel does by default.
    #[arg(long, env = "ENABLE_RESPONSE_BAGGAGE", default_value_t = true, action = clap::ArgAction::Set)]
    response_baggage: bool,
    /// About one allocation per this many bytes allocated is sampled, with
    /// its stack, for `/debug/pprof/heap` (Go's runtime default); 0 turns
    /// heap profiles off and costs nothing.
    #[arg(long, env = "ZTUNNEL_HEAP_SAMPLE_BYTES", default_value_t = 512 * 1024)]
    heap_sample_bytes: u64,
    #[command(flatten)]
    inpod: inpod::InpodArgs,
    #[command(flatten)]
    proxy_config: proxy_config::ProxyConfigArgs,
}

impl Args {
    /// Each group converts its own flags, in the order their errors are
    /// looked for; `logical_cpus` stands in for the core count when no
    /// setting gives it.
    fn into_config(
        self,
        env: &[(String, String)],
        logical_cpus: usize,
    ) -> Result<Config, ConfigError> {
        let proxy_config = self.proxy_config.parse(env)?;
        let mode = self.mode.parse()?;
        let own_workload = self.mode.own_workload(
            &mode,
            self.xds.pod_namespace.as_deref(),
            self.xds.pod_name.as_deref(),
        );
        let packet_mark = mode.packet_mark(self.packet_mark);
        let worker_threads = self.workers.parse(logical_cpus, proxy_config.concurrency)?;
        let xds = self.xds.parse(
            self.ca.auth_token(),
            self.mesh.node_name(),
            proxy_config.discovery_address.as_deref(),
            env,
        )?;
        let ca = self.ca.parse(env)?;
        let mesh = self.mesh.parse();
        let keepalive = self.keepalive.parse()?;
        let pool = self.pool.parse()?;
        let secret_ttl =
            parse_duration(&self.secret_ttl).map_err(ConfigError::value("SECRET_TTL"))?;
        let limits = self.limits.parse()?;
        let inpod = self.inpod.parse();
        let dns = self.dns.parse(&proxy_config.metadata)?;
        if dns.enabled && xds.as_ref().is_some_and(|xds| xds.on_demand) {
            return Err(ConfigError::OnDemandWithDnsProxy);
        }
        Ok(Config {
            mode,
            own_workload,
            local_xds_path: self.xds.local_xds_path,
            xds,
            ca_address: ca.ca_address,
            ca_root_ca: ca.ca_root_ca,
            ca_alt_hostname: ca.ca_alt_hostname,
            crl_path: ca.crl_path,
            ca_headers: ca.ca_headers,
            auth_token: ca.auth_token,
            cluster_id: mesh.cluster_id,
            trust_domain: mesh.trust_domain,
            istio_version: mesh.istio_version,
            network: mesh.network,
            node_name: mesh.node_name,
            packet_mark,
            keepalive,
            worker_threads,
            pool,
            http2: self.http2.parse(),
            secret_ttl,
            listeners: self.listeners.parse(inpod.ipv6_enabled, &proxy_config),
            log_filter: self.logging.log,
            log_format: self.logging.log_format,
            drain_deadline: limits.drain_deadline,
            local_workload_wait: limits.local_workload_wait,
            max_pending_handshakes: limits.max_pending_handshakes,
            max_connections: limits.max_connections,
            min_connections_per_pod: limits.min_connections_per_pod,
            localhost_app_tunnel: self.localhost_app_tunnel,
            authz_policy_info_logging: self.authz_policy_info_logging == "true",
            response_baggage: self.response_baggage,
            heap_sample_bytes: self.heap_sample_bytes,
            key_exchange: if self.compliance_policy == "pqc" {
                KeyExchange::PostQuantum
            } else {
                KeyExchange::Classical
            },
            inpod,
            dns,
        })
    }
}

#[cfg(test)]
mod tests;
