//! `ztunnel-agent`: the node agent. Parses flags, sets up logging, and runs
//! [`ztunnel_cni::agent::run`] until SIGTERM or SIGINT.

use std::ffi::OsString;
use std::io::IsTerminal;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use ztunnel_certs::error_chain;
use ztunnel_cni::agent::enablement::{
    DEFAULT_SYSTEM_NAMESPACE, EnablementSelector, EnablementSettings,
};
use ztunnel_cni::agent::health;
use ztunnel_cni::agent::install::{self, InstallConfig};
use ztunnel_cni::agent::peer::PeerPolicy;
use ztunnel_cni::agent::rules::RuleSettings;
use ztunnel_cni::agent::upgrade::{AgentPod, ExitPolicy};
use ztunnel_cni::agent::{self, AgentConfig, KubeCredentials, PodSourceConfig};
use ztunnel_cni::event;

/// The ztunnel node agent: installs in-pod redirection for ambient pods the
/// CNI plugin reports, and hands those pods to ztunnel over ZDS.
#[derive(Debug, Parser)]
#[command(name = "ztunnel-agent", version, args_override_self = true)]
#[command(group = clap::ArgGroup::new("pod_source").required(true).args(["pods", "kubeconfig", "in_cluster"]))]
struct Cli {
    /// Unix socket where the CNI plugin posts pod events (HTTP/1.1).
    #[arg(long, env = "ZTUNNEL_AGENT_PLUGIN_SOCKET", default_value = event::DEFAULT_SOCKET)]
    plugin_socket: PathBuf,
    /// Unix SOCK_SEQPACKET socket where ztunnel connects for ZDS.
    #[arg(long, env = "ZTUNNEL_AGENT_ZDS_SOCKET", default_value = agent::DEFAULT_ZDS_SOCKET)]
    zds_socket: PathBuf,
    /// Directory of the agent's pod set (pods.json), kept across restarts.
    #[arg(long, env = "ZTUNNEL_AGENT_STATE_DIR", default_value = agent::DEFAULT_STATE_DIR)]
    state_dir: PathBuf,
    /// A uid whose processes may connect to either socket, besides root and
    /// the agent's own uid (repeatable). The plugin and ztunnel run as root
    /// in Istio's charts and ours; add their uid when they do not.
    #[arg(long = "peer-uid", value_name = "UID")]
    peer_uids: Vec<u32>,
    /// Serve any process the sockets' mode (0600, the agent's user) lets
    /// connect, whatever its uid.
    #[arg(long, default_value_t = false, conflicts_with = "peer_uids")]
    any_peer: bool,
    /// Pod registry: the CA's YAML list of pods (name, namespace, uid,
    /// serviceAccount, nodeName, phase, ips); re-read when an add names a
    /// pod it does not know.
    #[arg(long, env = "ZTUNNEL_AGENT_PODS")]
    pods: Option<PathBuf>,
    /// Take pods from the Kubernetes API, with this kubeconfig.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Take pods from the Kubernetes API, with the credentials of the pod
    /// the agent runs in.
    #[arg(long)]
    in_cluster: bool,
    /// This node's name; pods placed on another node are refused. Required
    /// with the Kubernetes API; with the registry, the node is not checked
    /// without it.
    #[arg(long, env = "NODE_NAME", required_unless_present = "pods")]
    node_name: Option<String>,
    /// Which pods belong in the ambient mesh: a YAML list of
    /// `{podSelector, namespaceSelector}` (Kubernetes label selectors).
    /// Istio's default list when absent. With the Kubernetes API only.
    #[arg(long, env = "AMBIENT_ENABLEMENT_SELECTOR", conflicts_with = "pods")]
    ambient_enablement_selector: Option<String>,
    /// Namespaces whose pods are never enrolled, comma-separated.
    #[arg(
        long,
        env = "EXCLUDE_NAMESPACES",
        value_delimiter = ',',
        default_value = "kube-system"
    )]
    exclude_namespaces: Vec<String>,
    /// The namespace ztunnel runs in; its ztunnel pods are never enrolled.
    #[arg(long, env = "POD_NAMESPACE", default_value = DEFAULT_SYSTEM_NAMESPACE)]
    system_namespace: String,
    /// Source address of kubelet probes after host SNAT; exempt from capture.
    #[arg(long, default_value_t = agent::DEFAULT_PROBE_SNAT_IPV4)]
    probe_snat_ipv4: Ipv4Addr,
    /// IPv6 source address of kubelet probes after host SNAT.
    #[arg(long, default_value_t = agent::DEFAULT_PROBE_SNAT_IPV6)]
    probe_snat_ipv6: Ipv6Addr,
    /// Redirect pods' DNS (UDP and TCP port 53) to ztunnel's DNS proxy on
    /// 15053 (`--dns-capture=false` to leave it alone). The environment
    /// variable is istio-cni's, read from its ConfigMap; on by default as
    /// there.
    #[arg(
        long,
        env = "AMBIENT_DNS_CAPTURE",
        default_value_t = true,
        num_args = 0..=1,
        default_missing_value = "true",
        action = clap::ArgAction::Set
    )]
    dns_capture: bool,
    /// Interface inside pods whose inbound TCP is the pod's own outbound
    /// traffic (e.g. a VM's tap device). Repeatable.
    #[arg(long = "virtual-interface")]
    virtual_interfaces: Vec<String>,
    /// Install the `ztunnel-cni` binary and its chained entry on this node,
    /// keep them in place while running, and take them out on exit. Off,
    /// the node's CNI configuration is left alone.
    #[arg(long, default_value_t = false)]
    install_cni: bool,
    /// The host's CNI bin directory, where the plugin binary is copied.
    #[arg(long, default_value = install::DEFAULT_BIN_DIR)]
    cni_bin_dir: PathBuf,
    /// The host's CNI configuration directory, whose chosen file gets our
    /// entry.
    #[arg(long, default_value = install::DEFAULT_CONF_DIR)]
    cni_conf_dir: PathBuf,
    /// The configuration file to chain into; without it, the file the
    /// runtime would pick (the first valid one by name).
    #[arg(long, env = "CNI_CONF_NAME")]
    cni_conf_name: Option<String>,
    /// The `ztunnel-cni` binary to install; `ztunnel-cni` next to this
    /// executable when absent.
    #[arg(long)]
    plugin_binary: Option<PathBuf>,
    /// Namespaces whose pods the installed plugin reports to the agent,
    /// comma-separated; `*` means all (the agent then decides).
    #[arg(long, value_delimiter = ',', default_value = "*")]
    ambient_namespaces: Vec<String>,
    /// Always leave the installed plugin, its entry and the host probe
    /// rules in place on exit, without asking the API. Without this flag
    /// (and without --ambient-disable-safe-upgrade) they stay only when the
    /// agent's DaemonSet still exists, is not being deleted and still
    /// places a pod on this node: an upgrade or a reboot, after which the
    /// next agent answers the pods that failed meanwhile (Istio's safe
    /// upgrade). For agents without the API; after an uninstall, new pods
    /// on the node fail until the entry is removed by hand.
    #[arg(long, default_value_t = false)]
    keep_cni_on_exit: bool,
    /// istio-cni's switch: `true` always takes the plugin, its entry and
    /// the host probe rules out on exit, so pods created while the agent
    /// is replaced start outside the mesh.
    #[arg(long, env = "AMBIENT_DISABLE_SAFE_UPGRADE", default_value_t = false, action = clap::ArgAction::Set)]
    ambient_disable_safe_upgrade: bool,
    /// This agent's pod (downward API): at exit, its controlling DaemonSet
    /// tells an upgrade from an uninstall. Without it, the DaemonSet named
    /// istio-cni-node in POD_NAMESPACE.
    #[arg(long, env = "POD_NAME")]
    pod_name: Option<String>,
    /// Where the kubelet's probes are answered: `GET /readyz` and
    /// `GET /healthz` (HTTP/1.1).
    #[arg(long, default_value = health::DEFAULT_LISTEN)]
    readiness_listen: SocketAddr,
    /// Where the host's root filesystem is seen: `/` when the agent runs on
    /// the host; in a container, where the host's paths are mounted
    /// (istio-cni mounts the netns directory at `/host/var/run/netns`, so
    /// `/host`). The netns paths the CNI plugin reports are the host's.
    #[arg(long, default_value = "/")]
    host_root: PathBuf,
    /// The host's procfs, where the netns of pods that were running before
    /// they joined the mesh are found: `/proc` when the agent runs on the
    /// host, the host's `/proc` mounted into the container otherwise
    /// (istio-cni mounts it at `/host/proc`).
    #[arg(long, default_value = ztunnel_cni::agent::procfs::DEFAULT_PROCFS)]
    procfs: PathBuf,
    /// Keep the node's side of kubelet probes in the agent's netns (the
    /// node's): the `istio-inpod-probes-v4/v6` ipsets of enrolled pods'
    /// addresses and the `ISTIO_POSTRT` SNAT of the node's own connections
    /// to them. `--host-probe-rules=false` leaves the node's rules alone.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    host_probe_rules: bool,
    /// The node's netns for the probe rules, when the agent runs in a
    /// netns of its own; the agent's own netns when absent.
    #[arg(long)]
    host_netns: Option<PathBuf>,
    /// istio-cni's switch for the same: with `true`, the probe rules go in
    /// `<procfs>/1/ns/net`, the host's netns (unless --host-netns says
    /// otherwise).
    #[arg(long, env = "ALLOW_SWITCH_TO_HOST_NS", default_value_t = false, action = clap::ArgAction::Set)]
    allow_switch_to_host_ns: bool,
    /// Log filter (tracing EnvFilter syntax), e.g. `info` or
    /// `ztunnel_cni=debug`.
    #[arg(long, env = "RUST_LOG", default_value = "info")]
    log: String,
    /// istio-cni's log level flag (`info`, or scopes such as
    /// `default:debug,cni:info`): its `default` scope, or the bare level,
    /// replaces --log.
    #[arg(long = "log_output_level")]
    log_output_level: Option<String>,
    /// Log lines as JSON objects (istio-cni's flag).
    #[arg(long = "log-as-json", visible_alias = "log_as_json")]
    log_as_json: bool,
}

/// The command name istio-cni's chart runs (`command: [install-cni]`);
/// the image has it as a link to this binary.
const ISTIO_CNI_COMMAND: &str = "install-cni";

/// What istio-cni's container gets without asking: the pod's own
/// credentials, the plugin installed, and the host's paths where its chart
/// mounts them. Flags given after these win.
const ISTIO_CNI_DEFAULTS: [&str; 6] = [
    "--in-cluster",
    "--install-cni",
    "--cni-bin-dir=/host/opt/cni/bin",
    "--cni-conf-dir=/host/etc/cni/net.d",
    "--procfs=/host/proc",
    "--host-root=/host",
];

/// The arguments, with istio-cni's defaults first when this runs as
/// `install-cni`.
fn arguments(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let mut args: Vec<OsString> = args.into_iter().collect();
    let invoked_as = args
        .first()
        .and_then(|first| Path::new(first).file_name())
        .is_some_and(|name| name == ISTIO_CNI_COMMAND);
    if invoked_as {
        let rest = args.split_off(1);
        args.extend(ISTIO_CNI_DEFAULTS.iter().map(OsString::from));
        args.extend(rest);
    }
    args
}

/// The tracing filter of istio-cni's `--log_output_level`: the level of
/// its `default` scope, or the bare level; `none` is `off`. `None` when
/// it names neither.
fn istio_log_level(value: &str) -> Option<String> {
    let level = value
        .split(',')
        .find_map(|part| match part.split_once(':') {
            Some((scope, level)) if scope.trim() == "default" => Some(level.trim()),
            Some(_) => None,
            None => Some(part.trim()),
        })?;
    match level {
        "none" => Some("off".to_owned()),
        "debug" | "info" | "warn" | "error" => Some(level.to_owned()),
        _ => None,
    }
}

fn main() -> ExitCode {
    error_chain::exit_code("ztunnel-agent", run())
}

fn run() -> anyhow::Result<()> {
    let cli = Cli::parse_from(arguments(std::env::args_os()));
    let log = match &cli.log_output_level {
        Some(value) => istio_log_level(value).with_context(|| {
            format!("--log_output_level {value:?}: no level for the default scope")
        })?,
        None => cli.log.clone(),
    };
    let filter = tracing_subscriber::EnvFilter::try_new(&log).context("--log")?;
    let logging = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour codes only for a terminal: a log file or the kubelet's
        // log would hold them as text.
        .with_ansi(std::io::stderr().is_terminal());
    if cli.log_as_json {
        logging.json().init();
    } else {
        logging.init();
    }
    let host_netns = match (&cli.host_netns, cli.allow_switch_to_host_ns) {
        (Some(path), _) => Some(path.clone()),
        (None, true) => Some(cli.procfs.join("1/ns/net")),
        (None, false) => None,
    };
    let pods = pod_source(&cli)?;
    let install = install_config(&cli)?;
    let on_exit = exit_policy(&cli)?;
    let peers = peer_policy(&cli);
    let config = AgentConfig {
        plugin_socket: cli.plugin_socket,
        zds_socket: cli.zds_socket,
        state_dir: cli.state_dir,
        peers,
        pods,
        node_name: cli.node_name,
        rules: RuleSettings {
            probe_snat_ipv4: cli.probe_snat_ipv4,
            probe_snat_ipv6: cli.probe_snat_ipv6,
            dns_capture: cli.dns_capture,
            virtual_interfaces: cli.virtual_interfaces,
        },
        install,
        on_exit,
        agent_pod: AgentPod {
            namespace: cli.system_namespace,
            name: cli.pod_name,
        },
        readiness_listen: Some(cli.readiness_listen),
        host_root: cli.host_root,
        procfs: cli.procfs,
        host_probe_rules: cli.host_probe_rules,
        host_netns,
    };
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?
        .block_on(async { agent::run(config, stop_signal()).await })?;
    Ok(())
}

/// Who may connect to the sockets: root and the agent's own uid, plus any
/// `--peer-uid`, or anyone with `--any-peer`.
fn peer_policy(cli: &Cli) -> PeerPolicy {
    if cli.any_peer {
        PeerPolicy::Any
    } else {
        PeerPolicy::root_and_own_uid(cli.peer_uids.iter().copied())
    }
}

/// The pod source the flags choose (clap makes them exclusive).
fn pod_source(cli: &Cli) -> anyhow::Result<PodSourceConfig> {
    let credentials = match (&cli.pods, &cli.kubeconfig) {
        (Some(path), _) => return Ok(PodSourceConfig::File(path.clone())),
        (None, Some(path)) => KubeCredentials::Kubeconfig(path.clone()),
        (None, None) => KubeCredentials::InCluster,
    };
    let selectors = match &cli.ambient_enablement_selector {
        Some(yaml) => {
            EnablementSelector::parse_list(yaml).context("--ambient-enablement-selector")?
        }
        None => EnablementSelector::istio_defaults(),
    };
    let enablement = EnablementSettings {
        selectors,
        excluded_namespaces: trimmed(&cli.exclude_namespaces).into_iter().collect(),
        system_namespace: cli.system_namespace.clone(),
    };
    Ok(PodSourceConfig::Kubernetes {
        credentials,
        enablement,
    })
}

/// What `--install-cni` installs, or `None` without it. The entry's
/// `agent_socket` and `pod_namespace` are set by the agent.
fn install_config(cli: &Cli) -> anyhow::Result<Option<InstallConfig>> {
    if !cli.install_cni {
        return Ok(None);
    }
    let plugin_source = match &cli.plugin_binary {
        Some(path) => path.clone(),
        None => std::env::current_exe()
            .context("finding this executable, beside which ztunnel-cni is")?
            .with_file_name(install::DEFAULT_PLUGIN_NAME),
    };
    let mut config = InstallConfig::new(plugin_source);
    config.bin_dir.clone_from(&cli.cni_bin_dir);
    config.conf_dir.clone_from(&cli.cni_conf_dir);
    config.conf_name.clone_from(&cli.cni_conf_name);
    config.entry.ambient_namespaces = trimmed(&cli.ambient_namespaces);
    config.entry.exclude_namespaces = trimmed(&cli.exclude_namespaces);
    Ok(Some(config))
}

/// What the agent does with its installation on exit: the two explicit
/// switches exclude each other.
fn exit_policy(cli: &Cli) -> anyhow::Result<ExitPolicy> {
    match (cli.keep_cni_on_exit, cli.ambient_disable_safe_upgrade) {
        (false, false) => Ok(ExitPolicy::SafeUpgrade),
        (true, false) => Ok(ExitPolicy::Keep),
        (false, true) => Ok(ExitPolicy::Remove),
        (true, true) => anyhow::bail!(
            "--keep-cni-on-exit and AMBIENT_DISABLE_SAFE_UPGRADE=true ask for opposite things on exit"
        ),
    }
}

/// The non-empty entries of a comma-separated list, trimmed.
fn trimmed(list: &[String]) -> Vec<String> {
    list.iter()
        .map(|item| item.trim())
        .filter(|item| !item.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Resolves at SIGTERM or SIGINT, logging which came.
async fn stop_signal() {
    let stop = ztunnel_process::shutdown::signal().await;
    tracing::info!("{}: stopping", stop.name());
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)] // tests: a panic is a failed test

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }

    /// Run as istio-cni's chart runs it (`command: [install-cni]`, its
    /// args, NODE_NAME from the downward API), the agent takes the pod's
    /// credentials, installs the plugin and finds the host's paths where
    /// that chart mounts them; flags still win, and its log flags work.
    #[test]
    fn as_install_cni_it_takes_istio_cnis_defaults_and_flags() {
        use clap::Parser;
        let parse = |args: &[&str]| {
            let args = super::arguments(args.iter().map(std::ffi::OsString::from));
            super::Cli::try_parse_from(args)
        };
        let cli = parse(&[
            "/usr/local/bin/install-cni",
            "--log_output_level=default:debug,cni:info",
            "--log_as_json",
            "--node-name=node-a",
        ])
        .unwrap();
        assert!(cli.in_cluster && cli.install_cni && cli.log_as_json);
        assert_eq!(cli.cni_bin_dir, std::path::Path::new("/host/opt/cni/bin"));
        assert_eq!(
            cli.cni_conf_dir,
            std::path::Path::new("/host/etc/cni/net.d")
        );
        assert_eq!(cli.procfs, std::path::Path::new("/host/proc"));
        assert_eq!(cli.host_root, std::path::Path::new("/host"));
        assert_eq!(
            super::istio_log_level(cli.log_output_level.as_deref().unwrap()).as_deref(),
            Some("debug")
        );
        let cli = parse(&["install-cni", "--node-name=n", "--procfs=/elsewhere"]).unwrap();
        assert_eq!(
            cli.procfs,
            std::path::Path::new("/elsewhere"),
            "a flag wins"
        );
        // Under its own name nothing is implied.
        assert!(
            parse(&["ztunnel-agent", "--node-name=n"]).is_err(),
            "no pod source"
        );
        assert_eq!(super::istio_log_level("warn").as_deref(), Some("warn"));
        assert_eq!(super::istio_log_level("none").as_deref(), Some("off"));
        assert_eq!(super::istio_log_level("cni:debug"), None);
        assert_eq!(super::istio_log_level("loud"), None);
    }

    #[test]
    fn only_root_and_the_agents_own_uid_connect_unless_flags_admit_more() {
        use clap::Parser;
        use ztunnel_cni::agent::peer::PeerPolicy;
        let policy = |args: &[&str]| {
            let base = ["ztunnel-agent", "--pods", "pods.yaml"];
            super::Cli::try_parse_from(base.iter().chain(args)).map(|cli| super::peer_policy(&cli))
        };
        let own = nix::unistd::geteuid().as_raw();
        let default = policy(&[]).unwrap();
        assert_eq!(default, PeerPolicy::root_and_own_uid([]));
        assert!(default.admits(0) && default.admits(own));
        assert_eq!(default.admits(1337), own == 1337);
        let widened = policy(&["--peer-uid", "1337", "--peer-uid=1338"]).unwrap();
        assert!(widened.admits(0) && widened.admits(1337) && widened.admits(1338));
        assert_eq!(policy(&["--any-peer"]).unwrap(), PeerPolicy::Any);
        assert!(
            policy(&["--any-peer", "--peer-uid", "1"]).is_err(),
            "the two flags contradict each other"
        );
        assert!(
            policy(&["--peer-uid", "root"]).is_err(),
            "a uid is a number"
        );
    }

    #[test]
    fn exactly_one_pod_source_is_chosen_and_kubernetes_needs_the_node() {
        use clap::Parser;
        let parse = |args: &[&str]| {
            super::Cli::try_parse_from(std::iter::once("ztunnel-agent").chain(args.iter().copied()))
        };
        #[rustfmt::skip]
        let cases: &[(&str, &[&str], bool)] = &[
            ("the registry file alone", &["--pods", "pods.yaml"], true),
            ("a kubeconfig with the node", &["--kubeconfig", "kc", "--node-name", "n"], true),
            ("in-cluster with the node", &["--in-cluster", "--node-name", "n"], true),
            ("no source", &["--node-name", "n"], false),
            ("two sources", &["--pods", "pods.yaml", "--kubeconfig", "kc", "--node-name", "n"], false),
            ("both Kubernetes credentials", &["--kubeconfig", "kc", "--in-cluster", "--node-name", "n"], false),
            ("a kubeconfig without the node", &["--kubeconfig", "kc"], false),
            ("selectors with the registry file", &["--pods", "p", "--ambient-enablement-selector", "[]"], false),
        ];
        for (reason, args, accepted) in cases {
            assert_eq!(parse(args).is_ok(), *accepted, "{reason}");
        }
    }

    #[test]
    fn kubernetes_flags_become_enablement_settings() {
        use clap::Parser;
        let cli = super::Cli::try_parse_from([
            "ztunnel-agent",
            "--kubeconfig",
            "kc",
            "--node-name",
            "n",
            "--exclude-namespaces",
            "kube-system, batch",
            "--system-namespace",
            "mesh-system",
            "--ambient-enablement-selector",
            "[{podSelector: {matchLabels: {mesh: 'yes'}}}]",
        ])
        .unwrap();
        let ztunnel_cni::agent::PodSourceConfig::Kubernetes { enablement, .. } =
            super::pod_source(&cli).unwrap()
        else {
            panic!("not the Kubernetes source");
        };
        assert_eq!(enablement.selectors.len(), 1);
        assert_eq!(
            enablement.excluded_namespaces,
            ["batch", "kube-system"].map(str::to_owned).into()
        );
        assert_eq!(enablement.system_namespace, "mesh-system");
    }

    #[test]
    fn the_exit_policy_is_the_safe_upgrade_unless_one_switch_says_otherwise() {
        use clap::Parser;
        use ztunnel_cni::agent::upgrade::ExitPolicy;
        let policy = |args: &[&str]| {
            let cli = super::Cli::try_parse_from(
                ["ztunnel-agent", "--pods", "p"].iter().chain(args).copied(),
            )
            .unwrap();
            super::exit_policy(&cli).ok()
        };
        #[rustfmt::skip]
        let cases: &[(&str, &[&str], Option<ExitPolicy>)] = &[
            ("neither switch: Istio's default", &[], Some(ExitPolicy::SafeUpgrade)),
            ("--keep-cni-on-exit", &["--keep-cni-on-exit"], Some(ExitPolicy::Keep)),
            ("safe upgrade disabled", &["--ambient-disable-safe-upgrade=true"], Some(ExitPolicy::Remove)),
            ("disabled set to false, as a ConfigMap may", &["--ambient-disable-safe-upgrade=false"], Some(ExitPolicy::SafeUpgrade)),
            ("both", &["--keep-cni-on-exit", "--ambient-disable-safe-upgrade=true"], None),
        ];
        for (reason, args, expected) in cases {
            assert_eq!(policy(args), *expected, "{reason}");
        }
    }

    #[test]
    fn install_flags_become_the_install_config_only_with_install_cni() {
        use clap::Parser;
        let parse = |args: &[&str]| {
            let cli = super::Cli::try_parse_from(
                ["ztunnel-agent", "--pods", "p"].iter().chain(args).copied(),
            )
            .unwrap();
            super::install_config(&cli).unwrap()
        };
        assert_eq!(parse(&["--cni-bin-dir", "/b"]), None);
        let install = parse(&[
            "--install-cni",
            "--cni-bin-dir",
            "/b",
            "--cni-conf-dir",
            "/c",
            "--cni-conf-name",
            "10-x.conflist",
            "--plugin-binary",
            "/p/ztunnel-cni",
            "--ambient-namespaces",
            "shop, bank",
        ])
        .unwrap();
        assert_eq!(install.bin_dir, std::path::Path::new("/b"));
        assert_eq!(install.conf_dir, std::path::Path::new("/c"));
        assert_eq!(install.conf_name.as_deref(), Some("10-x.conflist"));
        assert_eq!(
            install.plugin_source,
            std::path::Path::new("/p/ztunnel-cni")
        );
        assert_eq!(install.entry.ambient_namespaces, ["shop", "bank"]);
        assert_eq!(install.entry.exclude_namespaces, ["kube-system"]);
        let beside = parse(&["--install-cni"]).unwrap().plugin_source;
        assert_eq!(beside.file_name().unwrap(), "ztunnel-cni");
    }
}
