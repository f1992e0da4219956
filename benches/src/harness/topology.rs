//! The benchmark topology: the two-node in-pod mesh of the end-to-end tests
//! (`ztunnel_test_support::cluster`), with a load-generator server in each
//! server pod and clients on node-a, so that the paths share nodes, bridges
//! and routes:
//!
//! - direct: a pod outside the mesh to a pod outside the mesh on node-b, no
//!   proxy;
//! - tcp: a meshed client to a meshed server on node-b whose workload speaks
//!   plain TCP: the client's ztunnel passes the bytes through and the
//!   server's ztunnel takes them on its plaintext inbound listener;
//! - hbone: a meshed client to a meshed HBONE server on node-b, through the
//!   tunnel;
//! - same-node: a meshed client to a meshed HBONE server on node-a, where
//!   one ztunnel is the proxy of both ends.
//!
//! Each path has a client pod of its own: sockets a run leaves in TIME_WAIT
//! stay in its pod's namespace and do not slow the next path's connects
//! (tens of thousands of them after a `connect` run made the tunnel's
//! connect p99 15 ms instead of 0.8 ms when both shared one pod).
//!
//! For the DNS scenarios, a nameserver behind node-a is the ztunnels'
//! upstream and the nameserver of every client pod (`harness/dns.rs`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use serde::Serialize;
use ztunnel_proto::ports::HBONE_PORT;
use ztunnel_test_support::cluster::{Binaries, Cluster, ConfigSource, Pod, PodSpec};
use ztunnel_test_support::wait;

use crate::harness::dns::{self, Nameserver};
use crate::harness::process::Process;

/// The port the load-generator servers listen on.
const SERVER_PORT: u16 = 9000;
/// The meshed namespace.
const MESHED: &str = "bench";
/// The namespace left out of the mesh, for the direct path.
const UNMESHED: &str = "bench-direct";
/// The node of the clients and the node of the servers.
const CLIENT_NODE: &str = "node-a";
const SERVER_NODE: &str = "node-b";
/// How long a load-generator server gets to bind.
const SERVER_START: Duration = Duration::from_secs(10);

/// One way from a client pod to a server pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Path3 {
    /// No proxy.
    Direct,
    /// Through both ztunnels as plain TCP.
    Tcp,
    /// Through the HBONE tunnel between the two nodes.
    Hbone,
    /// From a meshed pod to a meshed HBONE pod on the same node, through
    /// that node's one ztunnel.
    #[serde(rename = "same-node")]
    SameNode,
}

impl Path3 {
    /// Every path, in report order.
    pub const ALL: [Path3; 4] = [Path3::Direct, Path3::Tcp, Path3::Hbone, Path3::SameNode];

    /// Its name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Path3::Direct => "direct",
            Path3::Tcp => "tcp",
            Path3::Hbone => "hbone",
            Path3::SameNode => "same-node",
        }
    }

    /// The path named `name`.
    pub fn parse(name: &str) -> Option<Path3> {
        Path3::ALL.into_iter().find(|path| path.name() == name)
    }

    /// The client and server pod names.
    fn pods(self) -> (&'static str, &'static str) {
        match self {
            Path3::Direct => ("direct-client", "direct-server"),
            Path3::Tcp => ("tcp-client", "tcp-server"),
            Path3::Hbone => ("client", "hbone-server"),
            Path3::SameNode => ("same-node-client", "same-node-server"),
        }
    }

    /// The ztunnels whose costs are read for a run on this path, each with
    /// its place on it. On the same-node path one process is the proxy of
    /// both ends, so it is read once.
    fn proxy_nodes(self) -> &'static [(ProxyRole, &'static str)] {
        match self {
            Path3::Direct | Path3::Tcp | Path3::Hbone => &[
                (ProxyRole::Client, CLIENT_NODE),
                (ProxyRole::Server, SERVER_NODE),
            ],
            Path3::SameNode => &[(ProxyRole::Both, CLIENT_NODE)],
        }
    }
}

/// A ztunnel's place on a path, as the figures name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ProxyRole {
    /// The client node's ztunnel.
    Client,
    /// The server node's ztunnel.
    Server,
    /// The one ztunnel of a node that holds both ends (same-node path).
    Both,
}

impl ProxyRole {
    /// Its name in figures and reports.
    pub fn name(self) -> &'static str {
        match self {
            ProxyRole::Client => "client",
            ProxyRole::Server => "server",
            ProxyRole::Both => "both",
        }
    }
}

/// The running topology.
pub struct Topology {
    /// The cluster; dropping it removes every namespace and process.
    pub cluster: Cluster,
    loadgen: PathBuf,
    /// The load-generator server of each path.
    servers: Vec<(Path3, Child)>,
    /// The DNS scenarios' nameserver.
    nameserver: Nameserver,
}

/// The ztunnels' log filter unless `--env RUST_LOG=...` says otherwise.
const PRODUCTION_LOG_LEVEL: &str = "info";

impl Topology {
    /// Builds the cluster with `ztunnel` as the proxy of both nodes, adds
    /// the pods and starts a load-generator server in each server pod.
    pub fn start(
        ztunnel: &Path,
        loadgen: &Path,
        env: &[(String, String)],
        mesh_size: usize,
    ) -> anyhow::Result<Topology> {
        let mut binaries = Binaries::from_target_dir()?;
        binaries.ztunnel = ztunnel.to_path_buf();
        let specs = [
            PodSpec::new("client", MESHED, "client", CLIENT_NODE),
            PodSpec::new("tcp-client", MESHED, "client", CLIENT_NODE),
            PodSpec::new("hbone-server", MESHED, "server", SERVER_NODE),
            PodSpec::new("tcp-server", MESHED, "server", SERVER_NODE),
            PodSpec::new("direct-client", UNMESHED, "client", CLIENT_NODE),
            PodSpec::new("direct-server", UNMESHED, "server", SERVER_NODE),
            PodSpec::new("same-node-client", MESHED, "client", CLIENT_NODE),
            PodSpec::new("same-node-server", MESHED, "server", CLIENT_NODE),
        ];
        // A local file: the harness runs any compatible ztunnel build, and
        // not every one speaks xDS to our control plane.
        let mut cluster = Cluster::start_with(
            &[CLIENT_NODE, SERVER_NODE],
            &specs,
            &[MESHED],
            binaries,
            ConfigSource::LocalFile,
        )?;
        // What an operator runs: INFO, so one access-log line per
        // connection ("connection complete"). The test clusters' default
        // also logs every open at DEBUG, which is not what is measured.
        cluster.set_ztunnel_env("RUST_LOG", PRODUCTION_LOG_LEVEL);
        // The DNS proxy's upstream: names outside the mesh go to the
        // harness's nameserver, never to this machine's resolvers.
        cluster.set_ztunnel_env("DNS_UPSTREAMS", &dns::NAMESERVER.to_string());
        for (key, value) in env {
            cluster.set_ztunnel_env(key, value);
        }
        for spec in &specs {
            cluster.add_pod(spec)?;
        }
        // The tcp-server pod is captured like any meshed pod, but its
        // workload says plain TCP: that is what makes the tcp path.
        let tcp_server = cluster.pod("tcp-server")?;
        let (spec, ip) = (tcp_server.spec.clone(), tcp_server.ip);
        cluster.mesh().set_workload(&spec, ip, false)?;
        cluster.mesh().set_remote_workloads(mesh_size)?;
        cluster.mesh().set_services(&dns::service(MESHED))?;
        let mut nameserver = Nameserver::start(&cluster.node(CLIENT_NODE)?.ns, loadgen)?;
        for path in Path3::ALL {
            nameserver.configure_pod(cluster.pod(path.pods().0)?)?;
        }
        let mut topology = Topology {
            cluster,
            loadgen: loadgen.to_path_buf(),
            servers: Vec::new(),
            nameserver,
        };
        topology.restart_ztunnels()?;
        for path in Path3::ALL {
            topology.start_server(path)?;
        }
        Ok(topology)
    }

    /// Restarts both ztunnels (with the binary and environment set on the
    /// cluster) and waits until they serve every pod.
    pub fn restart_ztunnels(&mut self) -> anyhow::Result<()> {
        for node in [CLIENT_NODE, SERVER_NODE] {
            self.cluster.start_ztunnel(node)?;
        }
        self.cluster.wait_synced()?;
        // Ready follows the served snapshot; the HBONE listener in the
        // server pods is what the tunnels need.
        for name in ["hbone-server", "same-node-server"] {
            let server = self.cluster.pod(name)?;
            if !wait::until(SERVER_START, || server.listens_on(HBONE_PORT)) {
                bail!("{name} has no HBONE listener after a restart");
            }
        }
        Ok(())
    }

    /// The ztunnels a run on `path` is measured on, each with its place on
    /// the path.
    pub fn proxies(&self, path: Path3) -> anyhow::Result<Vec<(ProxyRole, Process)>> {
        path.proxy_nodes()
            .iter()
            .map(|(role, node)| {
                let pid = self
                    .cluster
                    .node(node)?
                    .ztunnel_pid()
                    .with_context(|| format!("{node}: ztunnel not running"))?;
                Ok((*role, Process { pid }))
            })
            .collect()
    }

    /// The load-generator server of `path` (`ip netns exec` runs it in
    /// place, so the child's PID is the server's).
    pub fn server(&self, path: Path3) -> Option<Process> {
        self.servers
            .iter()
            .find(|(served, _)| *served == path)
            .map(|(_, child)| Process { pid: child.id() })
    }

    /// The DNS scenarios' nameserver.
    pub fn nameserver(&self) -> Process {
        self.nameserver.process()
    }

    /// A load-generator client command inside the client pod of `path`,
    /// and the server address it targets.
    pub fn client(&self, path: Path3) -> anyhow::Result<(Command, SocketAddr)> {
        let (client, server) = path.pods();
        let server = self.cluster.pod(server)?;
        let command = self
            .cluster
            .pod(client)?
            .ns
            .command(&self.loadgen.to_string_lossy());
        Ok((command, SocketAddr::from((server.ip, SERVER_PORT))))
    }

    /// The node logs, for failure messages.
    pub fn ztunnel_logs(&self) -> String {
        self.cluster
            .nodes
            .iter()
            .map(|node| {
                format!(
                    "--- {} ---\n{}",
                    node.name,
                    ztunnel_test_support::cluster::tail(&node.ztunnel_log(), 20)
                )
            })
            .collect()
    }

    /// Starts a load-generator server in `pod`; it is stopped with the
    /// topology, also when it fails to come up.
    fn start_server(&mut self, path: Path3) -> anyhow::Result<()> {
        let (_, pod) = path.pods();
        let pod: &Pod = self.cluster.pod(pod)?;
        let listen = SocketAddr::from(([0, 0, 0, 0], SERVER_PORT)).to_string();
        let child = pod
            .ns
            .command(&self.loadgen.to_string_lossy())
            .args(["serve", "--listen", &listen])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {} in {}", self.loadgen.display(), pod.spec.name))?;
        self.servers.push((path, child));
        // Checked from inside the server pod itself, where no capture
        // applies to its own address.
        if !wait::until(SERVER_START, || pod.listens_on(SERVER_PORT)) {
            bail!(
                "the load-generator server in {} did not listen on port {SERVER_PORT}",
                pod.spec.name
            );
        }
        Ok(())
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        for (_, server) in &mut self.servers {
            let _ = server.kill();
            let _ = server.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_path_is_parsed_from_its_own_name_and_nothing_else() {
        for path in Path3::ALL {
            assert_eq!(Path3::parse(path.name()), Some(path));
        }
        assert_eq!(Path3::parse("same-node"), Some(Path3::SameNode));
        for unknown in ["", "samenode", "same_node", "HBONE", "hbone "] {
            assert_eq!(Path3::parse(unknown), None, "{unknown:?}");
        }
    }

    #[test]
    fn the_same_node_path_reads_one_proxy_on_the_client_node() {
        assert_eq!(
            Path3::SameNode.proxy_nodes(),
            &[(ProxyRole::Both, CLIENT_NODE)]
        );
        let (client, server) = Path3::SameNode.pods();
        assert_ne!(Path3::Hbone.pods().0, client);
        assert_ne!(Path3::Hbone.pods().1, server);
        assert_eq!(
            serde_json::to_value(Path3::SameNode).unwrap(),
            serde_json::json!("same-node")
        );
    }
}
