//! `ztunnel-agent`: the node agent. Parses flags, sets up logging, and runs
//! [`ztunnel_cni::agent::run`] until SIGTERM or SIGINT.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use ztunnel_cni::agent::enablement::{
    DEFAULT_SYSTEM_NAMESPACE, EnablementSelector, EnablementSettings,
};
use ztunnel_cni::agent::rules::RuleSettings;
use ztunnel_cni::agent::{self, AgentConfig, KubeCredentials, PodSourceConfig};
use ztunnel_cni::event;

/// The ztunnel node agent: installs in-pod redirection for ambient pods the
/// CNI plugin reports, and hands those pods to ztunnel over ZDS.
#[derive(Debug, Parser)]
#[command(name = "ztunnel-agent", version)]
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
    /// Also redirect the pod's DNS (UDP and TCP port 53) to ztunnel's DNS
    /// proxy on 15053.
    #[arg(long, default_value_t = false)]
    dns_capture: bool,
    /// Interface inside pods whose inbound TCP is the pod's own outbound
    /// traffic (e.g. a VM's tap device). Repeatable.
    #[arg(long = "virtual-interface")]
    virtual_interfaces: Vec<String>,
    /// Log filter (tracing EnvFilter syntax), e.g. `info` or
    /// `ztunnel_cni=debug`.
    #[arg(long, env = "RUST_LOG", default_value = "info")]
    log: String,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_new(&cli.log).context("--log")?;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let pods = pod_source(&cli)?;
    let config = AgentConfig {
        plugin_socket: cli.plugin_socket,
        zds_socket: cli.zds_socket,
        state_dir: cli.state_dir,
        pods,
        node_name: cli.node_name,
        rules: RuleSettings {
            probe_snat_ipv4: cli.probe_snat_ipv4,
            probe_snat_ipv6: cli.probe_snat_ipv6,
            dns_capture: cli.dns_capture,
            virtual_interfaces: cli.virtual_interfaces,
        },
    };
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?
        .block_on(async { agent::run(config, shutdown_signal()).await })?;
    Ok(())
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
        excluded_namespaces: cli
            .exclude_namespaces
            .iter()
            .map(|namespace| namespace.trim())
            .filter(|namespace| !namespace.is_empty())
            .map(str::to_owned)
            .collect(),
        system_namespace: cli.system_namespace.clone(),
    };
    Ok(PodSourceConfig::Kubernetes {
        credentials,
        enablement,
    })
}

/// SIGINT or SIGTERM.
async fn shutdown_signal() {
    let mut terminate =
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(signal) => signal,
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM");
                let _ = tokio::signal::ctrl_c().await;
                return;
            }
        };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)] // tests: a panic is a failed test

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
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
}
