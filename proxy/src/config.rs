//! The proxy's configuration, parsed once at start-up from environment
//! variables with flags to override them, into typed values. The variable
//! names are istio/ztunnel's wherever the meaning is the same, so that a
//! deployment moves over unchanged. This is the one module that reads the
//! environment (through clap); the rest of the proxy gets a [`Config`].
//!
//! The local workload file's format lives in `config/local.rs`; the xDS
//! client's settings are parsed in `config/xds.rs`.

use std::net::{Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser, ValueEnum};
use ztunnel_proto::ports::HBONE_PORT;

use crate::control_plane::{ControlPlaneError, ExtraHeaders};
use crate::ports::{INBOUND_PLAINTEXT_PORT, OUTBOUND_PORT};
use crate::version::BuildInfo;

mod dns;
mod keepalive;
pub mod local;
mod value;
mod workers;
mod xds;

pub use dns::{DnsAddress, DnsSettings, DnsUpstream};
pub use value::{ValueError, WorkloadInfo, parse_duration};
pub use xds::{DEFAULT_TOKEN_PATH, DEFAULT_XDS_ADDRESS, NodeSettings, XdsSettings};

/// How the proxy captures traffic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProxyMode {
    /// One proxy per node, opening listeners inside each pod's network
    /// namespace handed over by the node agent (ZDS).
    Shared,
    /// One proxy for one workload, with ordinary sockets in the current
    /// network namespace.
    Dedicated(WorkloadInfo),
}

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

/// The environment variable Istio's chart sets the cluster id in; it wins
/// over `CLUSTER_ID`, as it does for istio/ztunnel.
const ISTIO_CLUSTER_ID: &str = "ISTIO_META_CLUSTER_ID";

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Plain,
    /// One JSON object a line.
    Json,
}

/// The whole configuration, typed.
#[derive(Debug, Clone)]
pub struct Config {
    /// Shared (in-pod) or dedicated.
    pub mode: ProxyMode,
    /// Workloads, services and policies from a local file, reloaded on change.
    pub local_xds_path: Option<PathBuf>,
    /// The xDS client's settings; `None` when configuration comes only from
    /// the local file.
    pub xds: Option<XdsSettings>,
    /// The CA, always over TLS.
    pub ca_address: String,
    /// The only root the CA's serving certificate is trusted through; read
    /// again before each CA call, so a rotated root is used from then on.
    pub ca_root_ca: PathBuf,
    /// A second name the CA's certificate may carry (`ALT_CA_HOSTNAME`).
    pub ca_alt_hostname: Option<String>,
    /// Revocation lists (PEM or DER) peers are checked against, read again
    /// when the file changes (`CRL_PATH`).
    pub crl_path: Option<PathBuf>,
    /// Headers sent on every CA call (`CA_HEADER_<NAME>`).
    pub ca_headers: ExtraHeaders,
    /// Service-account token file, re-read on every CA request
    /// (`AUTH_TOKEN`, else [`DEFAULT_TOKEN_PATH`]).
    pub auth_token: PathBuf,
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
    /// Whether an application tunnel speaking PROXY is dialled on loopback
    /// (`LOCALHOST_APP_TUNNEL`), so that its listener need not be reachable
    /// from the pod network; the header carries the real addresses.
    pub localhost_app_tunnel: bool,
    /// Shared (in-pod) mode settings; unused in dedicated mode.
    pub inpod: InpodSettings,
    /// The DNS proxy.
    pub dns: DnsSettings,
}

/// How the shared (in-pod) mode reaches the node agent and opens pod sockets
/// (WIRE.md §5).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InpodSettings {
    /// The node agent's ZDS socket (SOCK_SEQPACKET) to connect to.
    pub uds: PathBuf,
    /// SO_REUSEPORT on in-pod listeners, so that an old and a new ztunnel can
    /// hold the same pod ports during a rollout.
    pub port_reuse: bool,
    /// IP_TRANSPARENT on in-pod listeners: `None` tries and carries on
    /// without it, `Some(true)` makes a failure fatal, `Some(false)` skips it.
    pub original_source: Option<bool>,
    /// Whether the wildcard address is the dual-stack `[::]` rather than
    /// `0.0.0.0`; in both modes, whether a hostname endpoint's AAAA
    /// records are looked up besides its A records.
    pub ipv6_enabled: bool,
    /// Whether a connection between two pods this proxy serves is handed
    /// from the client's outbound side to the server's inbound side in the
    /// process (policy, logs and metrics as over HBONE) instead of going
    /// through a TLS and HTTP/2 tunnel to the proxy's own 15008.
    pub same_node_shortcut: bool,
    /// Whether such a connection, once it has exchanged a few messages, is
    /// joined in the kernel (a BPF socket map) so that its bytes no longer
    /// pass through the proxy; where the kernel refuses, the proxy copies.
    pub same_node_splice: bool,
}

/// Connection pool limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolSettings {
    /// Streams per h2 connection; the peer's own limit caps it further.
    pub max_streams_per_connection: u32,
    /// How long an unused connection is kept.
    pub unused_release_timeout: Duration,
    /// Connections one pool key may spread its streams over.
    pub max_connections_per_key: usize,
}

/// HTTP/2 windows and frame size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Http2Settings {
    /// Initial stream flow-control window, bytes.
    pub stream_window: u32,
    /// Connection flow-control window, bytes.
    pub connection_window: u32,
    /// Largest frame we accept, bytes.
    pub frame_size: u32,
}

/// Listener addresses. Defaults are the Istio ports; they are configurable so
/// that several dedicated proxies can share one host during development.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listeners {
    /// Outbound capture (15001).
    pub outbound: SocketAddr,
    /// Inbound plaintext capture (15006).
    pub inbound_plaintext: SocketAddr,
    /// Inbound HBONE (15008).
    pub inbound: SocketAddr,
    /// Admin (15000), localhost only.
    pub admin: SocketAddr,
    /// Prometheus (15020).
    pub stats: SocketAddr,
    /// Readiness (15021).
    pub readiness: SocketAddr,
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
    /// Not a failure: `version` or `help` was asked for; print this text on
    /// standard output and exit 0.
    #[error("{0}")]
    Print(String),
    /// Two settings that exclude each other are both set.
    #[error("{0} and {1} are both set; set only one")]
    Conflict(&'static str, &'static str),
}

/// The command line. Each option also reads the environment variable shown
/// in `--help`; a flag wins over the variable.
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
    /// `shared` (in-pod, one proxy per node) or `dedicated` (one workload).
    #[arg(long, env = "PROXY_MODE", default_value = "shared")]
    proxy_mode: String,
    /// The dedicated workload, `namespace/name/service-account`.
    #[arg(long, env = "PROXY_WORKLOAD_INFO")]
    proxy_workload_info: Option<String>,
    /// Local workloads/services/policies file (YAML), reloaded on change.
    #[arg(long, env = "LOCAL_XDS_PATH")]
    local_xds_path: Option<PathBuf>,
    /// xDS server address; empty means no xDS [default: https://istiod.istio-system.svc:15012, or none with LOCAL_XDS_PATH].
    #[arg(long, env = "XDS_ADDRESS")]
    xds_address: Option<String>,
    /// Roots of the xDS server: a PEM file, inline PEM, or SYSTEM.
    #[arg(
        long,
        env = "XDS_ROOT_CA",
        default_value = xds::DEFAULT_ROOT_CA
    )]
    xds_root_ca: String,
    /// A second name the xDS server's certificate may carry.
    #[arg(long, env = "ALT_XDS_HOSTNAME")]
    alt_xds_hostname: Option<String>,
    /// This pod's IP, in the xDS node id [default: 1.1.1.1].
    #[arg(long, env = "INSTANCE_IP")]
    instance_ip: Option<String>,
    /// This pod's name, in the xDS node id.
    #[arg(long, env = "POD_NAME")]
    pod_name: Option<String>,
    /// This pod's namespace, in the xDS node id.
    #[arg(long, env = "POD_NAMESPACE")]
    pod_namespace: Option<String>,
    /// CA address (TLS).
    #[arg(
        long,
        env = "CA_ADDRESS",
        default_value = xds::DEFAULT_XDS_ADDRESS
    )]
    ca_address: String,
    /// PEM root the CA's certificate must chain to.
    #[arg(
        long,
        env = "CA_ROOT_CA",
        default_value = xds::DEFAULT_ROOT_CA
    )]
    ca_root_ca: PathBuf,
    /// A second name the CA's certificate may carry besides the host of
    /// CA_ADDRESS. Headers for every CA call are set as CA_HEADER_<NAME>.
    #[arg(long, env = "ALT_CA_HOSTNAME")]
    alt_ca_hostname: Option<String>,
    /// Certificate revocation lists (PEM or DER): a peer whose certificate
    /// or intermediate they revoke is refused; read again when it changes.
    #[arg(long, env = "CRL_PATH")]
    crl_path: Option<PathBuf>,
    /// Service-account token file sent as the Bearer token [default: ./var/run/secrets/tokens/istio-token].
    #[arg(long, env = "AUTH_TOKEN")]
    auth_token: Option<String>,
    /// Cluster ID sent to the CA and used for workloads without one
    /// (`ISTIO_META_CLUSTER_ID` wins over `CLUSTER_ID`).
    #[arg(long, env = "CLUSTER_ID", default_value = "Kubernetes")]
    cluster_id: String,
    /// The Istio release this proxy serves as ztunnel of, as Istio's
    /// images set it: the `tag` of `istio_build` and `IstioVersion` of
    /// `version`, which istioctl and dashboards compare with istiod's.
    #[arg(long, env = "ISTIO_META_ISTIO_VERSION", default_value = "unknown")]
    istio_version: String,
    /// Trust domain.
    #[arg(long, env = "TRUST_DOMAIN", default_value = "cluster.local")]
    trust_domain: String,
    /// The network of this node's pods, as the control plane names it
    /// (Istio's `NETWORK`, chart value `network`); empty is the default network.
    #[arg(long, env = "NETWORK", default_value = "")]
    network: String,
    /// Node whose workloads are local; unset makes every workload local.
    #[arg(long, env = "NODE_NAME")]
    node_name: Option<String>,
    /// SO_MARK for the proxy's own sockets [default: 1337 in shared mode, none in dedicated].
    #[arg(long, env = "PACKET_MARK")]
    packet_mark: Option<u32>,
    #[command(flatten)]
    keepalive: keepalive::KeepaliveArgs,
    #[command(flatten)]
    dns: dns::DnsArgs,
    /// Data-plane worker threads: a count, `0` for one per core, or `N%` of
    /// the cores [default: the resource CPU limit (raised to the request)
    /// when set, else a quarter of the cores, at least the request and 2].
    #[arg(long, env = "ZTUNNEL_WORKER_THREADS")]
    worker_threads: Option<String>,
    /// The cores the proxy has, in whole cores, as Istio's ztunnel chart
    /// sets it from the downward API (limits.cpu rounded up; the node's
    /// cores when no limit is set) [default: the logical CPUs].
    #[arg(long, env = "ZTUNNEL_CPU_LIMIT")]
    cpu_limit: Option<usize>,
    /// The container's CPU limit as a quantity (`2`, `1.5`, `500m`), which
    /// Istio's chart sets only when a limit is set: the cores the proxy
    /// has, and its default worker count.
    #[arg(long, env = "ZTUNNEL_RESOURCE_CPU_LIMIT")]
    resource_cpu_limit: Option<String>,
    /// The container's CPU request as a quantity: the default worker
    /// count is never below it.
    #[arg(long, env = "ZTUNNEL_RESOURCE_CPU_REQUEST")]
    resource_cpu_request: Option<String>,
    /// Most streams on one pooled HBONE connection.
    #[arg(long, env = "POOL_MAX_STREAMS_PER_CONNECTION", default_value_t = 100)]
    pool_max_streams_per_connection: u32,
    /// How long an unused pooled connection is kept.
    #[arg(long, env = "POOL_UNUSED_RELEASE_TIMEOUT", default_value = "5m")]
    pool_unused_release_timeout: String,
    /// Connections one destination key may spread streams over.
    #[arg(long, env = "POOL_MAX_CONNECTIONS_PER_KEY", default_value_t = 4)]
    pool_max_connections_per_key: usize,
    /// HTTP/2 initial stream window, bytes.
    #[arg(long, env = "HTTP2_STREAM_WINDOW_SIZE", default_value_t = 4 * 1024 * 1024)]
    http2_stream_window_size: u32,
    /// HTTP/2 connection window, bytes.
    #[arg(long, env = "HTTP2_CONNECTION_WINDOW_SIZE", default_value_t = 16 * 1024 * 1024)]
    http2_connection_window_size: u32,
    /// HTTP/2 max frame size, bytes.
    #[arg(long, env = "HTTP2_FRAME_SIZE", default_value_t = 1024 * 1024)]
    http2_frame_size: u32,
    /// Requested workload certificate lifetime.
    #[arg(long, env = "SECRET_TTL", default_value = "24h")]
    secret_ttl: String,
    /// Outbound capture listener.
    #[arg(
        long,
        env = "ZTUNNEL_OUTBOUND_ADDR",
        default_value_t = SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), OUTBOUND_PORT)
    )]
    outbound_addr: SocketAddr,
    /// Inbound plaintext capture listener.
    #[arg(
        long,
        env = "ZTUNNEL_INBOUND_PLAINTEXT_ADDR",
        default_value_t = SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), INBOUND_PLAINTEXT_PORT)
    )]
    inbound_plaintext_addr: SocketAddr,
    /// Inbound HBONE listener.
    #[arg(
        long,
        env = "ZTUNNEL_INBOUND_ADDR",
        default_value_t = SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), HBONE_PORT)
    )]
    inbound_addr: SocketAddr,
    /// Admin listener (keep it on localhost).
    #[arg(long, env = "ZTUNNEL_ADMIN_ADDR", default_value = "127.0.0.1:15000")]
    admin_addr: SocketAddr,
    /// Prometheus listener.
    #[arg(long, env = "ZTUNNEL_STATS_ADDR", default_value = "[::]:15020")]
    stats_addr: SocketAddr,
    /// Readiness listener.
    #[arg(long, env = "ZTUNNEL_READINESS_ADDR", default_value = "[::]:15021")]
    readiness_addr: SocketAddr,
    /// Log filter, e.g. `info,access=debug`.
    #[arg(long, env = "RUST_LOG", default_value = "info")]
    log: String,
    /// Log format.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value = "plain")]
    log_format: LogFormat,
    /// Drain deadline on SIGTERM, e.g. `10s` (a bare number is seconds):
    /// connections still open then are closed. Wins over
    /// TERMINATION_GRACE_PERIOD_SECONDS [default: from the grace period, else 5s].
    #[arg(long, env = "CONNECTION_TERMINATION_DEADLINE")]
    connection_termination_deadline: Option<String>,
    /// The pod's grace period in seconds, as Istio's chart passes it: without
    /// CONNECTION_TERMINATION_DEADLINE the drain deadline is 5 s less when it
    /// is over 10 s, else 1 s less but at least 1 s (never more than the
    /// grace period: 0 closes at once), so connections are closed before
    /// kubelet's SIGKILL.
    #[arg(long, env = "TERMINATION_GRACE_PERIOD_SECONDS")]
    termination_grace_period_seconds: Option<String>,
    /// How long a connection from or to a pod this proxy serves waits for
    /// the control plane to describe the pod's workload, when it arrives
    /// first (a pod sends as soon as its network is up).
    #[arg(long, env = "LOCAL_WORKLOAD_WAIT", default_value = "5s")]
    local_workload_wait: String,
    /// The most connections each inbound HBONE listener (15008) holds
    /// before their TLS handshake ends. Beyond it new connections are
    /// closed at once and counted in `ztunnel_handshakes_refused_total`.
    #[arg(long, env = "MAX_PENDING_HANDSHAKES", default_value_t = 4096)]
    max_pending_handshakes: usize,
    /// The most connections the process carries at once, over every pod
    /// and listener, each HBONE stream counted as one. Beyond it new
    /// connections are closed at once and HBONE streams answered 503, each
    /// counted in `ztunnel_connections_refused_total`. The default keeps a
    /// node's busiest hour well inside the chart's memory limit
    /// (deploy/charts/ztunnel-mesh/values.yaml says how it was chosen).
    #[arg(long, env = "MAX_CONNECTIONS", default_value_t = DEFAULT_MAX_CONNECTIONS)]
    max_connections: usize,
    /// Dial a workload's PROXY application tunnel on 127.0.0.1 or ::1
    /// rather than its pod IP.
    #[arg(long, env = "LOCALHOST_APP_TUNNEL", default_value_t = true, action = clap::ArgAction::Set)]
    localhost_app_tunnel: bool,
    /// Shared mode: the node agent's ZDS socket.
    #[arg(
        long,
        env = "INPOD_UDS",
        default_value = "/var/run/ztunnel/ztunnel.sock"
    )]
    inpod_uds: PathBuf,
    /// Shared mode: SO_REUSEPORT on the in-pod listeners.
    #[arg(long, env = "INPOD_PORT_REUSE", default_value_t = true, action = clap::ArgAction::Set)]
    inpod_port_reuse: bool,
    /// Shared mode: IP_TRANSPARENT on the in-pod listeners, so the app sees
    /// the client's IP [default: best effort; true: required; false: off].
    #[arg(long, env = "ENABLE_ORIG_SRC", action = clap::ArgAction::Set)]
    enable_orig_src: Option<bool>,
    /// Listen on the dual-stack `[::]` (true) or on `0.0.0.0` (false) in
    /// pods; look up AAAA records of hostname endpoints besides A (true) or
    /// A only (false).
    #[arg(long, env = "IPV6_ENABLED", default_value_t = true, action = clap::ArgAction::Set)]
    ipv6_enabled: bool,
    /// Shared mode: connections between two pods of this node skip the
    /// HBONE tunnel and are handed to the destination's inbound side in the
    /// process (false: every meshed connection goes over HBONE).
    #[arg(long, env = "SAME_NODE_SHORTCUT", default_value_t = true, action = clap::ArgAction::Set)]
    same_node_shortcut: bool,
    /// Same-node connections that keep exchanging messages are joined in
    /// the kernel with a BPF socket map, so that their bytes skip the
    /// proxy (false: the proxy copies every byte).
    #[arg(long, env = "SAME_NODE_SPLICE", default_value_t = true, action = clap::ArgAction::Set)]
    same_node_splice: bool,
}

/// Variables named `CA_HEADER_<NAME>` add the header `<NAME>` to CA calls.
const CA_HEADER_PREFIX: &str = "CA_HEADER_";
/// The default SO_MARK in shared mode; istio-cni's rules hard-code 0x539.
const SHARED_MODE_PACKET_MARK: u32 = 1337;
/// MAX_CONNECTIONS unset. A carried connection holds about 4 KiB when idle
/// and about 40 KiB while it moves data (its two copy buffers of at most
/// 16 KiB, benches/README.md), so 65,536 busy connections take about
/// 2.5 GiB over the proxy's own state: the chart's memory limit of 3 GiB.
const DEFAULT_MAX_CONNECTIONS: usize = 65_536;
/// The drain deadline when neither it nor the grace period is set: Istio's.
const DEFAULT_DRAIN_DEADLINE: Duration = Duration::from_secs(5);
/// A grace period longer than this leaves [`LONG_GRACE_MARGIN`] between
/// the forced close and kubelet's SIGKILL; a shorter one, [`GRACE_MARGIN`].
/// Istio's rule, so the same chart drains the same way.
const LONG_GRACE: Duration = Duration::from_secs(10);
/// The margin under a long grace period.
const LONG_GRACE_MARGIN: Duration = Duration::from_secs(5);
/// The margin under a short grace period.
const GRACE_MARGIN: Duration = Duration::from_secs(1);
/// The shortest deadline a short grace period gives, if the grace period
/// itself is not shorter.
const MIN_DEADLINE: Duration = Duration::from_secs(1);

/// The drain deadline for a pod's grace period (SIGTERM to SIGKILL), as
/// istio/ztunnel derives it: 5 s less above 10 s, otherwise 1 s less but at
/// least 1 s. Unlike Istio's, a grace period of 0 (where the u64
/// subtraction wraps round, so nothing is ever forced) gives 0, and no
/// deadline exceeds its grace period: SIGKILL follows at once, so there is
/// nothing to wait for.
pub fn drain_deadline(grace: Duration) -> Duration {
    if grace > LONG_GRACE {
        grace - LONG_GRACE_MARGIN
    } else {
        grace
            .saturating_sub(GRACE_MARGIN)
            .max(MIN_DEADLINE)
            .min(grace)
    }
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
            _ if parsed.print_version => return Err(version(&parsed.istio_version)),
            Command::Version => return Err(version(&parsed.istio_version)),
            Command::Proxy => {}
            Command::Help => return Err(ConfigError::Print(command.render_help().to_string())),
        }
        let cluster_id_on_command_line =
            matches.value_source("cluster_id") == Some(ValueSource::CommandLine);
        if !cluster_id_on_command_line
            && let Some((_, id)) = env
                .iter()
                .find(|(name, id)| name == ISTIO_CLUSTER_ID && !id.is_empty())
        {
            parsed.cluster_id.clone_from(id);
        }
        // Where nothing says how many cores the proxy has, the machine's.
        let logical_cpus = std::thread::available_parallelism().map_or(1, usize::from);
        parsed.into_config(&env, logical_cpus)
    }
}

/// What `version` and `--version` print.
fn version(istio_version: &str) -> ConfigError {
    ConfigError::Print(format!("{}\n", BuildInfo::new(istio_version)))
}

impl Args {
    /// `logical_cpus` stands in for the core count when no setting gives it.
    fn into_config(
        self,
        env: &[(String, String)],
        logical_cpus: usize,
    ) -> Result<Config, ConfigError> {
        let value = |name: &'static str| move |source| ConfigError::Value { name, source };
        let mode = match self.proxy_mode.as_str() {
            "shared" => ProxyMode::Shared,
            "dedicated" => {
                let info = self
                    .proxy_workload_info
                    .as_deref()
                    .ok_or(ValueError::Missing)
                    .and_then(str::parse)
                    .map_err(value("PROXY_WORKLOAD_INFO"))?;
                ProxyMode::Dedicated(info)
            }
            other => {
                return Err(ConfigError::Value {
                    name: "PROXY_MODE",
                    source: ValueError::Choice(other.to_owned(), "shared, dedicated"),
                });
            }
        };
        let packet_mark = match (&mode, self.packet_mark) {
            (_, Some(mark)) => Some(mark),
            (ProxyMode::Shared, None) => Some(SHARED_MODE_PACKET_MARK),
            (ProxyMode::Dedicated(_), None) => None,
        };
        if self.cpu_limit == Some(0) {
            return Err(ConfigError::Value {
                name: "ZTUNNEL_CPU_LIMIT",
                source: ValueError::Zero,
            });
        }
        let worker_threads = workers::worker_threads(
            workers::WorkerSettings {
                worker_threads: self.worker_threads.as_deref(),
                resource_cpu_limit: self.resource_cpu_limit.as_deref(),
                resource_cpu_request: self.resource_cpu_request.as_deref(),
                cpu_limit: self.cpu_limit,
            },
            logical_cpus,
        )
        .map_err(|(name, source)| ConfigError::Value { name, source })?;
        let xds = xds::parse(
            &xds::XdsArgs {
                address: self.xds_address.as_deref(),
                local_file: self.local_xds_path.is_some(),
                root_ca: &self.xds_root_ca,
                alt_hostname: self.alt_xds_hostname.as_deref(),
                auth_token: self.auth_token.as_deref(),
                instance_ip: self.instance_ip.as_deref(),
                pod_name: self.pod_name.as_deref(),
                pod_namespace: self.pod_namespace.as_deref(),
                node_name: self.node_name.as_deref(),
            },
            env,
        )?;
        Ok(Config {
            mode,
            local_xds_path: self.local_xds_path,
            xds,
            ca_address: self.ca_address,
            ca_root_ca: self.ca_root_ca,
            ca_alt_hostname: self.alt_ca_hostname.filter(|name| !name.is_empty()),
            crl_path: self.crl_path.filter(|path| !path.as_os_str().is_empty()),
            ca_headers: ExtraHeaders::parse(xds::prefixed(env, CA_HEADER_PREFIX), CA_HEADER_PREFIX)
                .map_err(|source| ConfigError::ControlPlane {
                    name: "CA_HEADER_*",
                    source,
                })?,
            auth_token: self
                .auth_token
                .filter(|path| !path.is_empty())
                .map_or_else(|| PathBuf::from(DEFAULT_TOKEN_PATH), PathBuf::from),
            cluster_id: self.cluster_id,
            trust_domain: self.trust_domain,
            istio_version: self.istio_version,
            network: self.network.into(),
            node_name: self.node_name.filter(|name| !name.is_empty()),
            packet_mark,
            keepalive: self.keepalive.parse()?,
            worker_threads,
            pool: PoolSettings {
                max_streams_per_connection: self.pool_max_streams_per_connection.max(1),
                unused_release_timeout: parse_duration(&self.pool_unused_release_timeout)
                    .map_err(value("POOL_UNUSED_RELEASE_TIMEOUT"))?,
                max_connections_per_key: self.pool_max_connections_per_key.max(1),
            },
            http2: Http2Settings {
                stream_window: self.http2_stream_window_size,
                connection_window: self.http2_connection_window_size,
                frame_size: self.http2_frame_size,
            },
            secret_ttl: parse_duration(&self.secret_ttl).map_err(value("SECRET_TTL"))?,
            listeners: Listeners {
                outbound: self.outbound_addr,
                inbound_plaintext: self.inbound_plaintext_addr,
                inbound: self.inbound_addr,
                admin: self.admin_addr,
                stats: self.stats_addr,
                readiness: self.readiness_addr,
            },
            log_filter: self.log,
            log_format: self.log_format,
            drain_deadline: match (
                self.connection_termination_deadline,
                self.termination_grace_period_seconds,
            ) {
                (Some(deadline), _) => {
                    parse_duration(&deadline).map_err(value("CONNECTION_TERMINATION_DEADLINE"))?
                }
                (None, Some(grace)) => drain_deadline(
                    parse_duration(&grace).map_err(value("TERMINATION_GRACE_PERIOD_SECONDS"))?,
                ),
                (None, None) => DEFAULT_DRAIN_DEADLINE,
            },
            local_workload_wait: parse_duration(&self.local_workload_wait)
                .map_err(value("LOCAL_WORKLOAD_WAIT"))?,
            max_pending_handshakes: match self.max_pending_handshakes {
                0 => {
                    return Err(ConfigError::Value {
                        name: "MAX_PENDING_HANDSHAKES",
                        source: ValueError::Zero,
                    });
                }
                limit => limit,
            },
            max_connections: match self.max_connections {
                0 => {
                    return Err(ConfigError::Value {
                        name: "MAX_CONNECTIONS",
                        source: ValueError::Zero,
                    });
                }
                limit => limit,
            },
            localhost_app_tunnel: self.localhost_app_tunnel,
            inpod: InpodSettings {
                uds: self.inpod_uds,
                port_reuse: self.inpod_port_reuse,
                original_source: self.enable_orig_src,
                ipv6_enabled: self.ipv6_enabled,
                same_node_shortcut: self.same_node_shortcut,
                same_node_splice: self.same_node_splice,
            },
            dns: self.dns.parse()?,
        })
    }
}

#[cfg(test)]
mod tests;
