//! `ztunnel-agent`: the node agent. Parses flags, sets up logging, and runs
//! [`ztunnel_cni::agent::run`] until SIGTERM or SIGINT.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use ztunnel_cni::agent::rules::RuleSettings;
use ztunnel_cni::agent::{self, AgentConfig};
use ztunnel_cni::event;

/// The ztunnel node agent: installs in-pod redirection for ambient pods the
/// CNI plugin reports, and hands those pods to ztunnel over ZDS.
#[derive(Debug, Parser)]
#[command(name = "ztunnel-agent", version)]
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
    pods: PathBuf,
    /// This node's name; pods the registry places on another node are
    /// refused. Without it, the node is not checked.
    #[arg(long, env = "NODE_NAME")]
    node_name: Option<String>,
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
    let config = AgentConfig {
        plugin_socket: cli.plugin_socket,
        zds_socket: cli.zds_socket,
        state_dir: cli.state_dir,
        pods: cli.pods,
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
    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }
}
