//! A small in-pod mesh on this machine, the way a Kubernetes cluster lays it
//! out: a "fabric" namespace with a bridge joining the control plane (the
//! CA, which also serves delta xDS) and the nodes (198.18.0.0/24), and in
//! each node a pod bridge (`cni0`, a /24 of its own from 198.18.0.0/15) made
//! by the real `bridge` and `host-local` CNI plugins, routes to the other
//! nodes' pods, our node agent and a shared-mode ztunnel. Pods are network
//! namespaces added through the real CNI chain `bridge` → `ztunnel-cni`, as
//! a container runtime does.
//!
//! The ztunnels get the mesh configuration from the control plane over xDS
//! by default, or from a local file ([`ConfigSource`]) for ztunnel builds
//! that only read one.
//!
//! Everything lives under one temporary directory and in namespaces named
//! uniquely; dropping the [`Cluster`] stops every process it started (by
//! PID) and removes every namespace.
//!
//! Nodes are in `cluster/node.rs`, pods in `cluster/pods.rs`; the files the
//! components read (pod registry, mesh configuration) in
//! `cluster/files.rs`.

use std::fs::File;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};

use crate::ca::{PodRef, TestCa};
use crate::netns::{self, NetNs};
use crate::wait;

mod files;
mod kube;
mod node;
mod pods;

pub use files::{ConfigSource, MeshFile, deny_policy, peer_authentication, ztunnel_pod};
pub use kube::ClusterApi;
pub use node::{AccessEntry, Node};
pub use pods::{Pod, PodSpec, closed_by_peer, still_echoes};

/// The CA's address on the fabric.
const CA_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
/// The trust domain of every identity in the cluster.
pub const TRUST_DOMAIN: &str = "cluster.local";
/// How long a component gets to come up.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// Where the binaries the cluster runs are.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// The node proxy.
    pub ztunnel: PathBuf,
    /// The node agent.
    pub agent: PathBuf,
    /// Our CNI plugin.
    pub plugin: PathBuf,
}

impl Binaries {
    /// The workspace's binaries in the same target directory as the running
    /// executable (a test in `target/<profile>/deps`, or a binary in
    /// `target/<profile>`), and the Debian CNI plugins.
    pub fn from_target_dir() -> anyhow::Result<Binaries> {
        let exe = std::env::current_exe()?;
        let mut dir = exe.parent().context("executable without a directory")?;
        if dir.ends_with("deps") {
            dir = dir.parent().context("deps without a parent")?;
        }
        let binaries = Binaries {
            ztunnel: dir.join("ztunnel"),
            agent: dir.join("ztunnel-agent"),
            plugin: dir.join("ztunnel-cni"),
        };
        Ok(binaries)
    }

    /// Fails with what is missing.
    fn check(&self) -> anyhow::Result<()> {
        for path in [&self.ztunnel, &self.agent, &self.plugin] {
            if !path.exists() {
                bail!(
                    "{} is missing (cargo build --workspace builds it)",
                    path.display()
                );
            }
        }
        Ok(())
    }
}

/// Why the cluster cannot run here, if it cannot: root, `ip`, `iptables`
/// and the CNI plugins are needed.
pub fn unavailable() -> Option<String> {
    crate::cni::unavailable()
}

/// The running cluster.
pub struct Cluster {
    /// Nodes, in the order given.
    pub nodes: Vec<Node>,
    /// Pods added and not deleted.
    pub pods: Vec<Pod>,
    /// Namespaces whose pods are captured.
    pub ambient_namespaces: Vec<String>,
    mesh: MeshFile,
    binaries: Binaries,
    /// Environment set on every ztunnel after the cluster's own, so a later
    /// value wins: benchmarks tune worker threads this way.
    ztunnel_env: Vec<(String, String)>,
    /// Environment set on every node agent started from now on, over what
    /// it inherits: a test turns DNS capture off this way.
    agent_env: Vec<(String, String)>,
    ca: TestCa,
    /// The API server, when the control plane reads Kubernetes.
    kube: Option<ClusterApi>,
    /// The control plane's namespace, where a restart binds again.
    ca_ns: NetNs,
    // Dropped after the processes: the namespaces and files they use.
    _fabric: NetNs,
    _dir: tempfile::TempDir,
}

impl Cluster {
    /// Builds the fabric, the control plane and the nodes, with an agent
    /// and a ztunnel on each, the ztunnels fed over xDS; `pods` go into the
    /// pod registry (a pod must be known there before it is added, as in
    /// Kubernetes). Pods are added with [`Cluster::add_pod`].
    pub fn start(
        node_names: &[&str],
        pods: &[PodSpec],
        ambient_namespaces: &[&str],
        binaries: Binaries,
    ) -> anyhow::Result<Cluster> {
        Cluster::start_with(
            node_names,
            pods,
            ambient_namespaces,
            binaries,
            ConfigSource::Xds,
        )
    }

    /// [`Cluster::start`], with the ztunnels' configuration from `source`.
    pub fn start_with(
        node_names: &[&str],
        pods: &[PodSpec],
        ambient_namespaces: &[&str],
        binaries: Binaries,
        source: ConfigSource,
    ) -> anyhow::Result<Cluster> {
        Cluster::build(node_names, pods, ambient_namespaces, binaries, source, None)
    }

    /// [`Cluster::start`] with a control plane and node agents that read
    /// only a real Kubernetes API server (started here, `crate::kube`):
    /// `pods` are created there, in their namespaces (labelled ambient if
    /// in `ambient_namespaces`, plain otherwise), and get their status
    /// once added. Every node's plugin reports every pod to its agent,
    /// which decides enrollment from the labels, as an installed agent
    /// does. `None`, after [`KubeApi::start`]'s skip, where the API
    /// server's binaries were not built.
    ///
    /// [`KubeApi::start`]: crate::kube::KubeApi::start
    #[track_caller]
    pub fn start_on_kubernetes(
        node_names: &[&str],
        pods: &[PodSpec],
        ambient_namespaces: &[&str],
        binaries: Binaries,
    ) -> anyhow::Result<Option<Cluster>> {
        let Some(api) = crate::kube::KubeApi::start()? else {
            return Ok(None);
        };
        let api = ClusterApi::prepare(api, node_names, pods, ambient_namespaces)?;
        Cluster::build(
            node_names,
            pods,
            ambient_namespaces,
            binaries,
            ConfigSource::Xds,
            Some(api),
        )
        .map(Some)
    }

    fn build(
        node_names: &[&str],
        pods: &[PodSpec],
        ambient_namespaces: &[&str],
        binaries: Binaries,
        source: ConfigSource,
        kube: Option<ClusterApi>,
    ) -> anyhow::Result<Cluster> {
        binaries.check()?;
        let dir = tempfile::Builder::new().prefix("zt-cluster").tempdir()?;
        let fabric = NetNs::create("fab")?;
        fabric.exec(&["ip", "link", "add", "fab0", "type", "bridge"])?;
        fabric.exec(&["ip", "link", "set", "fab0", "up"])?;
        let ca_ns = NetNs::create("ca")?;
        attach(&fabric, &ca_ns, CA_IP)?;
        let ca_addr = SocketAddr::from((CA_IP, 15012));
        let ca = match &kube {
            None => TestCa::start(
                &ca_ns,
                ca_addr,
                TRUST_DOMAIN,
                &files::registry(node_names, pods),
            )?,
            Some(api) => TestCa::start_kubernetes(
                &ca_ns,
                ca_addr,
                TRUST_DOMAIN,
                api.control_plane_kubeconfig(),
            )?,
        };
        // On Kubernetes the agent decides which pods are ambient (from the
        // labels), so the plugin reports them all.
        let reported_namespaces = match &kube {
            None => ambient_namespaces,
            Some(_) => &["*"],
        };
        let mut nodes = Vec::with_capacity(node_names.len());
        for (index, name) in node_names.iter().enumerate() {
            let offset = u8::try_from(index).context("too many nodes")?;
            let mut node = Node::create(
                name,
                offset,
                dir.path(),
                &binaries.plugin,
                reported_namespaces,
            )?;
            if let Some(api) = &kube {
                node.reach_api(api.api().address()?)?;
            }
            attach(&fabric, &node.ns, node.ip)?;
            node.ns
                .exec(&["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"])?;
            let ztunnel_pod = files::ztunnel_pod(name);
            let token = node.dir.join("ztunnel.token");
            match &kube {
                None => ca.write_token(
                    &PodRef {
                        namespace: "istio-system",
                        service_account: "ztunnel",
                        name: &ztunnel_pod,
                        uid: &format!("uid-{ztunnel_pod}"),
                        node: Some(name),
                    },
                    &token,
                )?,
                Some(api) => api.write_ztunnel_token(name, &token)?,
            }
            nodes.push(node);
        }
        route_pod_subnets(&nodes)?;
        // With xDS the CA's own file is the one mesh file; a local file is
        // the ztunnels' alone, and the CA keeps the registry it started on.
        let mesh_path = match source {
            ConfigSource::Xds => ca.pods_path(),
            ConfigSource::LocalFile => dir.path().join("mesh.yaml"),
        };
        let mesh = MeshFile::new(mesh_path, source, node_names, pods)?;
        let mut cluster = Cluster {
            nodes,
            pods: Vec::new(),
            ambient_namespaces: ambient_namespaces
                .iter()
                .map(|ns| (*ns).to_owned())
                .collect(),
            mesh,
            binaries,
            ztunnel_env: Vec::new(),
            agent_env: Vec::new(),
            ca,
            kube,
            ca_ns,
            _fabric: fabric,
            _dir: dir,
        };
        for name in node_names {
            cluster.start_agent(name)?;
            cluster.start_ztunnel(name)?;
        }
        Ok(cluster)
    }

    /// The node with this name.
    pub fn node(&self, name: &str) -> anyhow::Result<&Node> {
        self.nodes
            .iter()
            .find(|node| node.name == name)
            .with_context(|| format!("no node {name}"))
    }

    /// The mesh configuration: with xDS the control plane's mesh file
    /// (also the pod registry), which it pushes to the ztunnels on every
    /// change; otherwise the file every ztunnel reloads
    /// (`LOCAL_XDS_PATH`).
    pub fn mesh(&mut self) -> &mut MeshFile {
        &mut self.mesh
    }

    /// The cluster's CA: certificates it issues are trusted by every
    /// ztunnel, as a test's own mesh peers (a waypoint) need.
    pub fn ca(&self) -> &TestCa {
        &self.ca
    }

    /// The API server the control plane reads, when it reads Kubernetes.
    pub fn kube(&self) -> Option<&ClusterApi> {
        self.kube.as_ref()
    }

    /// The API server the control plane reads, to stop and start it.
    pub fn kube_mut(&mut self) -> Option<&mut ClusterApi> {
        self.kube.as_mut()
    }

    /// Where the ztunnels get their configuration.
    pub fn config_source(&self) -> ConfigSource {
        self.mesh.source()
    }

    /// Stops the control plane (CA and xDS): xDS streams end, and neither
    /// certificates nor configuration can be had until
    /// [`Cluster::start_control_plane`]. The mesh file may still change
    /// meanwhile.
    pub fn stop_control_plane(&mut self) {
        self.ca.stop();
    }

    /// Starts the control plane again on the same address, with the same
    /// root and token key, on the mesh file as it is now.
    pub fn start_control_plane(&mut self) -> anyhow::Result<()> {
        self.ca.restart(&self.ca_ns)
    }

    /// Sets `key=value` in the environment of every ztunnel started from now
    /// on, over the cluster's own value of `key`.
    pub fn set_ztunnel_env(&mut self, key: &str, value: &str) {
        self.ztunnel_env.retain(|(existing, _)| existing != key);
        self.ztunnel_env.push((key.to_owned(), value.to_owned()));
    }

    /// Sets `key=value` in the environment of every node agent started
    /// from now on.
    pub fn set_agent_env(&mut self, key: &str, value: &str) {
        self.agent_env.retain(|(existing, _)| existing != key);
        self.agent_env.push((key.to_owned(), value.to_owned()));
    }

    /// Starts the node agent of `name`, stopping the running one first,
    /// and waits until it is ready. It takes pods from the registry file,
    /// or on Kubernetes from the API server as its service account.
    pub fn start_agent(&mut self, name: &str) -> anyhow::Result<()> {
        let (source_flag, source) = match &self.kube {
            None => ("--pods", self.ca.pods_path()),
            Some(api) => ("--kubeconfig", api.node_agent_kubeconfig().to_owned()),
        };
        let node = node_mut(&mut self.nodes, name)?;
        stop(&mut node.agent);
        let log = append(&node.agent_log_path())?;
        let child = node
            .ns
            .command(&self.binaries.agent.to_string_lossy())
            .arg("--plugin-socket")
            .arg(node.plugin_socket())
            .arg("--zds-socket")
            .arg(node.zds_socket())
            .arg("--state-dir")
            .arg(node.dir.join("agent-state"))
            .arg(source_flag)
            .arg(source)
            .arg("--node-name")
            .arg(&node.name)
            .arg("--readiness-listen")
            .arg(node.agent_readiness_address().to_string())
            .env("RUST_LOG", "info")
            .envs(self.agent_env.iter().map(|(key, value)| (key, value)))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting the node agent")?;
        node.agent = Some(child);
        node.wait_agent_ready()
    }

    /// Stops the node agent of `name` (SIGKILL, by PID).
    pub fn kill_agent(&mut self, name: &str) -> anyhow::Result<()> {
        stop(&mut node_mut(&mut self.nodes, name)?.agent);
        Ok(())
    }

    /// Starts the shared-mode ztunnel of `name`, stopping the running one
    /// first.
    pub fn start_ztunnel(&mut self, name: &str) -> anyhow::Result<()> {
        let network = self.mesh.node_network(name).to_owned();
        let node = node_mut(&mut self.nodes, name)?;
        stop(&mut node.ztunnel);
        let log = append(&node.dir.join("ztunnel.log"))?;
        let mut command = node.ns.command(&self.binaries.ztunnel.to_string_lossy());
        command.env_clear();
        match self.mesh.source() {
            ConfigSource::Xds => command
                .env("XDS_ADDRESS", self.ca.xds_address())
                .env("XDS_ROOT_CA", self.ca.root_cert_path())
                .env("POD_NAME", files::ztunnel_pod(&node.name))
                .env("POD_NAMESPACE", "istio-system")
                .env("INSTANCE_IP", node.ip.to_string()),
            // XDS_ADDRESS empty turns xDS off outright: istio/ztunnel
            // otherwise also dials its default address beside the file, and
            // is not ready until that answers.
            ConfigSource::LocalFile => command
                .env("LOCAL_XDS_PATH", self.mesh.path())
                .env("XDS_ADDRESS", ""),
        };
        let child = command
            .env("PROXY_MODE", "shared")
            .env("NODE_NAME", &node.name)
            .env("INPOD_UDS", node.zds_socket())
            .env("CA_ADDRESS", self.ca.address())
            .env("CA_ROOT_CA", self.ca.root_cert_path())
            .env("AUTH_TOKEN", node.dir.join("ztunnel.token"))
            .env("TRUST_DOMAIN", TRUST_DOMAIN)
            .env("NETWORK", network)
            .env("ZTUNNEL_WORKER_THREADS", "1")
            // Whole seconds, as the pod spec gives it: istio/ztunnel, which
            // the benchmarks run on this cluster, reads nothing else.
            .env("TERMINATION_GRACE_PERIOD_SECONDS", "1")
            .env("RUST_LOG", "info,access=debug")
            .env("LOG_FORMAT", "json")
            .envs(self.ztunnel_env.iter().map(|(key, value)| (key, value)))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting ztunnel")?;
        node.ztunnel = Some(child);
        Ok(())
    }

    /// Kills the ztunnel of `name` (SIGKILL, by PID).
    pub fn kill_ztunnel(&mut self, name: &str) -> anyhow::Result<()> {
        stop(&mut node_mut(&mut self.nodes, name)?.ztunnel);
        Ok(())
    }

    /// Waits until every ztunnel is ready and knows exactly the workloads
    /// of the mesh file (pushed over xDS, or read from the local file,
    /// which ztunnel reloads about once a second), and every service set
    /// with [`MeshFile::set_services`].
    pub fn wait_synced(&self) -> anyhow::Result<()> {
        let wanted = match &self.kube {
            None => self.mesh.workload_uids(),
            Some(_) => self.mesh.workload_uids_by(ClusterApi::workload_uid),
        };
        let services = self.mesh.service_hostnames();
        for node in &self.nodes {
            node.wait_ready()?;
            let synced = wait::until(START_TIMEOUT, || {
                let mut known = node.known_workloads();
                known.sort();
                known == wanted
            });
            if !synced {
                bail!(
                    "{}: ztunnel knows {:?}, not {wanted:?}",
                    node.name,
                    node.known_workloads()
                );
            }
            let has_services = || {
                let known = node.known_services();
                services.iter().all(|hostname| known.contains(hostname))
            };
            if !wait::until(START_TIMEOUT, has_services) {
                bail!(
                    "{}: ztunnel knows the services {:?}, not all of {services:?}",
                    node.name,
                    node.known_services()
                );
            }
        }
        Ok(())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            stop(&mut node.ztunnel);
            stop(&mut node.agent);
        }
        // Pods (and their veths) go with their namespaces; the node
        // namespaces take the bridges and routes with them.
        self.pods.clear();
    }
}

/// The node named `name`, for changing its processes.
fn node_mut<'a>(nodes: &'a mut [Node], name: &str) -> anyhow::Result<&'a mut Node> {
    nodes
        .iter_mut()
        .find(|node| node.name == name)
        .with_context(|| format!("no node {name}"))
}

/// Makes every node route every other node's pod subnet to that node.
fn route_pod_subnets(nodes: &[Node]) -> anyhow::Result<()> {
    for node in nodes {
        for other in nodes.iter().filter(|other| other.name != node.name) {
            node.ns.exec(&[
                "ip",
                "route",
                "add",
                &other.pod_subnet(),
                "via",
                &other.ip.to_string(),
            ])?;
        }
    }
    Ok(())
}

/// Joins `member` to the fabric bridge with a veth pair and gives it `ip`.
pub(crate) fn attach(fabric: &NetNs, member: &NetNs, ip: Ipv4Addr) -> anyhow::Result<()> {
    let last = ip.octets()[3];
    let (outer, inner) = (format!("f{}x{last}", std::process::id() % 100_000), "eth0");
    netns::run(
        "ip",
        &[
            "link",
            "add",
            &outer,
            "netns",
            fabric.name(),
            "type",
            "veth",
            "peer",
            "name",
            inner,
            "netns",
            member.name(),
        ],
    )?;
    fabric.exec(&["ip", "link", "set", &outer, "master", "fab0"])?;
    fabric.exec(&["ip", "link", "set", &outer, "up"])?;
    member.exec(&["ip", "addr", "add", &format!("{ip}/24"), "dev", inner])?;
    member.exec(&["ip", "link", "set", inner, "up"])?;
    Ok(())
}

/// Stops a child we started: SIGKILL by PID, then reaps it.
fn stop(child: &mut Option<Child>) {
    if let Some(mut child) = child.take() {
        let _ = child.kill();
        let _ = child.wait();
    }
}

fn append(path: &Path) -> anyhow::Result<File> {
    Ok(File::options().create(true).append(true).open(path)?)
}

/// The last `lines` lines of a log, for failure messages.
pub fn tail(log: &str, lines: usize) -> String {
    let all: Vec<&str> = log.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
