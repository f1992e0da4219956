//! A real Kubernetes cluster of one or two nodes on this machine, for the
//! tests that install what users install: the API server (`crate::kube`),
//! kube-controller-manager and kube-scheduler on this machine's loopback;
//! on every node containerd with runc, kubelet and kube-proxy
//! (`real_cluster/node.rs` says how a node is made); CoreDNS as the cluster
//! DNS. Deployments, DaemonSets, EndpointSlices, Services and
//! service-account tokens behave as in any cluster; images come from OCI
//! archives (`images.rs`), since no registry is reachable.
//!
//! The network, all in 198.18.0.0/15: a fabric namespace with a bridge
//! (198.18.0.0/24) joining the nodes (198.18.0.11, .12); each node's pods
//! on a bridge of its own (198.18.64.0/24, 198.18.65.0/24), routed between
//! nodes; Services in 198.19.128.0/20, DNS at 198.19.128.10. The API server
//! listens on this process's loopback; the fabric carries the nodes' and
//! pods' connections to it from 198.18.0.1, the `kubernetes` Service's
//! endpoint. The API server's own connections into the cluster
//! (webhooks, kubelets' logs and port-forwards) go through an HTTP CONNECT
//! proxy that dials from the fabric (`crate::egress`). No interface of
//! this machine's own network changes.
//!
//! Teardown, in this order and written once ([`Drop`]): every node (its
//! init, and with it every process of the node; then its cgroups,
//! depth-first), the controllers, the API server's forward, the API
//! server and etcd, its egress proxy, the namespaces, the files, and last the sysctls kubelet
//! rewrites (`vm.overcommit_memory`, `kernel.panic`, `kernel.panic_on_oops`)
//! as they were.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::egress::EgressProxy;
use crate::kube::KubeApi;
use crate::netns::{NetNs, PortForward};

mod containerd;
mod control_plane;
mod images;
pub mod istio;
mod kubelet;
mod loadgen;
mod mesh;
mod node;

pub use control_plane::CLUSTER_DNS;
pub use images::{APP, COREDNS, Images, PAUSE, PROJECT};
pub use kubelet::container_log;
pub use loadgen::LoadgenPod;
pub use mesh::{MESH_NAMESPACE, NOT_READY_TAINT, RELEASE, has_condition};
pub use node::Node;

/// The fabric's own address: where nodes and pods reach the API server.
const FABRIC_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
/// Every node's pod subnet lies in this range (kube-proxy's cluster CIDR).
const POD_CIDRS: &str = "198.18.64.0/18";
/// Binaries a real cluster needs from `scripts/k8s-test-env.sh`.
const BINARIES: [&str; 13] = [
    "crictl",
    "etcd",
    "kube-apiserver",
    "kubectl",
    "kubelet",
    "kube-controller-manager",
    "kube-scheduler",
    "kube-proxy",
    "containerd",
    "containerd-shim-runc-v2",
    "ctr",
    "runc",
    "coredns",
];
/// The kernel settings kubelet rewrites at start, restored at teardown.
const KUBELET_SYSCTLS: [&str; 3] = [
    "/proc/sys/vm/overcommit_memory",
    "/proc/sys/kernel/panic",
    "/proc/sys/kernel/panic_on_oops",
];
/// How long nodes get to register and turn Ready: about 15 s on a warm
/// machine; the bound only keeps a broken start from hanging a test.
const NODE_READY_TIMEOUT: Duration = Duration::from_secs(120);

/// What a cluster is made of.
#[derive(Debug, Clone)]
pub struct ClusterSpec {
    /// Node names, one or two.
    pub nodes: Vec<String>,
    /// Taints every node registers with (NoSchedule), e.g.
    /// `cni.istio.io/not-ready` as a node provisioner sets it.
    pub taints: Vec<String>,
    /// More tags every project image is loaded under, beside its own: the
    /// same image under a second tag, for upgrades.
    pub extra_tags: Vec<String>,
    /// Istio's images are loaded too ([`istio::ISTIO_IMAGES`]), under
    /// their tag and the `ambient` profile's variant of it.
    pub istio: bool,
}

/// A running cluster. Fields are dropped by [`Drop`] in the order the
/// module header gives.
pub struct RealCluster {
    /// The nodes, in the order of the spec.
    pub nodes: Vec<Node>,
    controllers: Option<control_plane::Controllers>,
    forward: Option<PortForward>,
    api: Option<KubeApi>,
    egress: Option<EgressProxy>,
    fabric: Option<NetNs>,
    images: Images,
    dir: Option<tempfile::TempDir>,
    sysctls: Vec<(PathBuf, String)>,
    started_in: Duration,
}

/// Why a real cluster cannot run here, if it cannot: root, `nsenter` and
/// `unshare`, the CNI plugins, writable cgroup hierarchies, the binaries
/// and the images.
pub fn unavailable() -> Option<String> {
    if let Some(reason) = crate::cni::unavailable() {
        return Some(reason);
    }
    for tool in ["nsenter", "unshare", "mount", "tar"] {
        if !crate::netns::installed(tool) {
            return Some(format!("{tool} is not installed"));
        }
    }
    if !Path::new("/sys/fs/cgroup/memory").is_dir() {
        return Some("no cgroup v1 memory hierarchy at /sys/fs/cgroup/memory".to_owned());
    }
    match KubeApi::binaries() {
        Ok(bin) => {
            for name in BINARIES.iter().chain(&["umoci", "helm"]) {
                if !bin.join(name).is_file() {
                    return Some(format!(
                        "{} missing: run scripts/k8s-test-env.sh",
                        bin.join(name).display()
                    ));
                }
            }
        }
        Err(reason) => return Some(reason),
    }
    Images::built().err()
}

impl RealCluster {
    /// Builds the cluster and waits until every node is Ready and the
    /// cluster DNS is scheduled (it runs once a node without taints, or
    /// tolerated ones, is there).
    pub fn start(spec: &ClusterSpec) -> anyhow::Result<RealCluster> {
        let started = Instant::now();
        let images = Images::built().map_err(|reason| anyhow::anyhow!(reason))?;
        let bin = KubeApi::binaries().map_err(|reason| anyhow::anyhow!(reason))?;
        let sysctls = KUBELET_SYSCTLS
            .iter()
            .map(|path| Ok((PathBuf::from(path), std::fs::read_to_string(path)?)))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let mut cluster = RealCluster {
            nodes: vec![],
            controllers: None,
            forward: None,
            api: None,
            egress: None,
            fabric: None,
            images,
            dir: Some(
                tempfile::Builder::new()
                    .prefix("zt-real-cluster")
                    .tempdir()?,
            ),
            sysctls,
            started_in: Duration::ZERO,
        };
        cluster.build(spec, bin)?;
        cluster.started_in = started.elapsed();
        Ok(cluster)
    }

    fn build(&mut self, spec: &ClusterSpec, bin: PathBuf) -> anyhow::Result<()> {
        let dir = self.dir().to_owned();
        let fabric = NetNs::create("rfab")?;
        fabric.exec(&["ip", "link", "add", "fab0", "type", "bridge"])?;
        fabric.exec(&[
            "ip",
            "addr",
            "add",
            &format!("{FABRIC_IP}/24"),
            "dev",
            "fab0",
        ])?;
        fabric.exec(&["ip", "link", "set", "fab0", "up"])?;

        let egress = EgressProxy::start(&fabric, &dir.join("egress.sock"))?;
        let api = KubeApi::start_for_cluster(bin.clone(), FABRIC_IP, &egress.selector_config())?;
        self.egress = Some(egress);
        let local = api.address()?;
        let api_server = format!("https://{FABRIC_IP}:{}", local.port());
        self.forward = Some(PortForward::listen_in(
            &fabric,
            SocketAddr::from((FABRIC_IP, local.port())),
            local,
        )?);
        self.controllers = Some(control_plane::Controllers::start(&api, &dir, POD_CIDRS)?);

        let coredns = images::pack_coredns(&bin, &dir, &self.images.tag)?;
        let addresses: Vec<(Ipv4Addr, String)> = (0..spec.nodes.len())
            .map(|index| {
                let index = u8::try_from(index).unwrap_or(u8::MAX);
                (
                    Ipv4Addr::new(198, 18, 0, 11 + index),
                    format!("198.18.{}.0/24", 64 + index),
                )
            })
            .collect();
        for (name, (ip, pod_cidr)) in spec.nodes.iter().zip(&addresses) {
            let netns = NetNs::create("rnode")?;
            crate::cluster::attach(&fabric, &netns, *ip)?;
            netns.exec(&[
                "ip",
                "route",
                "add",
                "default",
                "via",
                &FABRIC_IP.to_string(),
            ])?;
            for (other_ip, other_cidr) in &addresses {
                if other_ip != ip {
                    netns.exec(&[
                        "ip",
                        "route",
                        "add",
                        other_cidr,
                        "via",
                        &other_ip.to_string(),
                    ])?;
                }
            }
            fabric.exec(&["ip", "route", "add", pod_cidr, "via", &ip.to_string()])?;
            // Pods reach Services on their own node through the bridge:
            // replies must pass the node's iptables to be un-NATed.
            netns.exec(&["sysctl", "-qw", "net.ipv4.ip_forward=1"])?;
            netns.exec(&["sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=1"])?;
            let node = Node::create(name, *ip, pod_cidr, netns, &dir)?;
            self.nodes.push(node);
            let node = self.nodes.last_mut().context("node just added")?;
            let pause = format!("docker.io/library/{}", self.images.reference(PAUSE));
            containerd::start(node, &bin, &pause)?;
            let extra: Vec<&str> = spec.extra_tags.iter().map(String::as_str).collect();
            for name in PROJECT {
                containerd::import(
                    node,
                    &bin,
                    &self.images.archive(name),
                    name,
                    &self.images.tag,
                    &extra,
                )?;
            }
            for name in [PAUSE, APP] {
                containerd::import(
                    node,
                    &bin,
                    &self.images.archive(name),
                    name,
                    &self.images.tag,
                    &[],
                )?;
            }
            containerd::import(node, &bin, &coredns, COREDNS, &self.images.tag, &[])?;
            if spec.istio {
                let variant = format!("{}-{}", istio::ISTIO_TAG, istio::ISTIO_VARIANT);
                for name in istio::ISTIO_IMAGES {
                    containerd::import(
                        node,
                        &bin,
                        &self.images.archive(name),
                        name,
                        istio::ISTIO_TAG,
                        &[&variant],
                    )?;
                }
            }
            let taints: Vec<&str> = spec.taints.iter().map(String::as_str).collect();
            kubelet::start(node, &api, &api_server, CLUSTER_DNS, &taints)?;
            control_plane::start_kube_proxy(node, &api, &api_server, POD_CIDRS)?;
        }
        self.api = Some(api);
        self.fabric = Some(fabric);
        self.wait_nodes_ready()?;
        self.api()?
            .apply_server_side(&control_plane::cluster_dns_manifest(
                &self.images.reference(COREDNS),
            ))
            .context("installing the cluster DNS")?;
        Ok(())
    }

    fn wait_nodes_ready(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + NODE_READY_TIMEOUT;
        loop {
            for node in &mut self.nodes {
                node.check_running()?;
            }
            if let Some(controllers) = self.controllers.as_mut() {
                controllers.check_running()?;
            }
            let ready = self.ready_nodes()?;
            if ready.len() == self.nodes.len() {
                return Ok(());
            }
            if Instant::now() > deadline {
                let logs: Vec<String> = self
                    .nodes
                    .iter()
                    .map(|node| format!("--- {} kubelet:\n{}", node.name, node.log("kubelet")))
                    .collect();
                bail!(
                    "nodes not Ready in {NODE_READY_TIMEOUT:?} (ready: {ready:?}):\n{}",
                    logs.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Names of the nodes whose Ready condition is True.
    pub fn ready_nodes(&self) -> anyhow::Result<Vec<String>> {
        let json = self.kubectl(&["get", "nodes", "-o", "json"])?;
        let list: serde_json::Value = serde_json::from_str(&json)?;
        Ok(list["items"]
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .filter(|node| has_condition(node, "Ready"))
                    .filter_map(|node| node["metadata"]["name"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// The API server.
    pub fn api(&self) -> anyhow::Result<&KubeApi> {
        self.api.as_ref().context("the API server is stopped")
    }

    /// Runs kubectl as the admin; its stdout.
    pub fn kubectl(&self, args: &[&str]) -> anyhow::Result<String> {
        self.api()?.kubectl(args, None)
    }

    /// The images the cluster loaded.
    pub fn images(&self) -> &Images {
        &self.images
    }

    /// The node named `name`.
    pub fn node(&self, name: &str) -> anyhow::Result<&Node> {
        self.nodes
            .iter()
            .find(|node| node.name == name)
            .with_context(|| format!("no node {name}"))
    }

    /// The cluster's directory: components' configuration and logs.
    pub fn dir(&self) -> &Path {
        self.dir
            .as_ref()
            .map_or(Path::new("/nonexistent"), |dir| dir.path())
    }

    /// How long start-up took, from nothing to every node Ready.
    pub fn started_in(&self) -> Duration {
        self.started_in
    }

    /// A pod's container log (`namespace/pod`, container), read from its
    /// node as kubelet writes it.
    pub fn pod_log(&self, namespace: &str, pod: &str, container: &str) -> anyhow::Result<String> {
        let json = self.kubectl(&["get", "pod", "-n", namespace, pod, "-o", "json"])?;
        let object: serde_json::Value = serde_json::from_str(&json)?;
        let node = object["spec"]["nodeName"]
            .as_str()
            .with_context(|| format!("pod {namespace}/{pod} is not on a node"))?;
        let uid = object["metadata"]["uid"]
            .as_str()
            .context("pod without uid")?;
        Ok(container_log(
            self.node(node)?,
            namespace,
            pod,
            uid,
            container,
        ))
    }

    /// The pods of `namespace` matching the label `selector` (`""`: all).
    pub fn pods(&self, namespace: &str, selector: &str) -> anyhow::Result<Vec<PodStatus>> {
        let mut args = vec!["get", "pods", "-n", namespace, "-o", "json"];
        if !selector.is_empty() {
            args.extend(["-l", selector]);
        }
        let list: serde_json::Value = serde_json::from_str(&self.kubectl(&args)?)?;
        Ok(list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .map(PodStatus::from_json)
            .collect())
    }

    /// A pod's container log as the container wrote it: kubelet's CRI
    /// prefix (time, stream, tag) taken off each line.
    pub fn pod_output(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
    ) -> anyhow::Result<Vec<String>> {
        Ok(self
            .pod_log(namespace, pod, container)?
            .lines()
            .map(|line| line.splitn(4, ' ').nth(3).unwrap_or_default().to_owned())
            .collect())
    }

    /// Runs crictl on `node` against its containerd; its stdout.
    pub fn crictl(&self, node: &Node, args: &[&str]) -> anyhow::Result<String> {
        let endpoint = format!("unix://{}", containerd::SOCKET);
        let mut all = vec!["--runtime-endpoint", endpoint.as_str()];
        all.extend_from_slice(args);
        node.run(&self.api()?.bin().join("crictl"), &all)
    }

    /// Keeps the cluster's files (logs, configuration) after the test, for
    /// a look at a failure; their path.
    pub fn keep_files(&mut self) -> Option<PathBuf> {
        self.dir.take().map(tempfile::TempDir::keep)
    }
}

/// What a test reads of a pod.
#[derive(Debug, Clone, Default)]
pub struct PodStatus {
    /// The pod's name.
    pub name: String,
    /// The node it was scheduled to, once scheduled.
    pub node: Option<String>,
    /// Its address, once it has one.
    pub ip: Option<String>,
    /// `Pending`, `Running`, `Succeeded`, `Failed`.
    pub phase: String,
    /// Its Ready condition is True.
    pub ready: bool,
    /// Its annotations.
    pub annotations: serde_json::Value,
}

impl PodStatus {
    fn from_json(pod: &serde_json::Value) -> PodStatus {
        let text = |value: &serde_json::Value| value.as_str().map(str::to_owned);
        PodStatus {
            name: text(&pod["metadata"]["name"]).unwrap_or_default(),
            node: text(&pod["spec"]["nodeName"]),
            ip: text(&pod["status"]["podIP"]),
            phase: text(&pod["status"]["phase"]).unwrap_or_default(),
            ready: has_condition(pod, "Ready"),
            annotations: pod["metadata"]["annotations"].clone(),
        }
    }
}

impl Drop for RealCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            node.stop();
        }
        self.nodes.clear();
        self.controllers = None;
        self.forward = None;
        self.api = None;
        self.egress = None;
        self.fabric = None;
        self.dir = None;
        for (path, value) in &self.sysctls {
            let _ = std::fs::write(path, value);
        }
    }
}
