//! The files the cluster's components read, and which of them carries the
//! mesh configuration ([`ConfigSource`]):
//!
//! - xDS: one mesh file, the CA's (`ztunnel-ca serve --mesh` format:
//!   `{pods, services, policies}`). It is the pod registry of the CA and of
//!   the node agents, and what the control plane serves the ztunnels over
//!   delta xDS: pods gain their IP and protocol once added, policies and
//!   services are as the test sets them.
//! - Local file: the CA's registry stays the pod list it started with, and
//!   every ztunnel loads a file of its own (`LOCAL_XDS_PATH`, WIRE.md §11)
//!   of workloads, services and policies.
//!
//! Either way [`MeshFile`] is rewritten, atomically, as pods come and go
//! and as policies change. Tokens are written by `cluster.rs`.

use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use anyhow::bail;

use crate::cluster::PodSpec;

/// Where the ztunnels of a cluster get the mesh configuration from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ConfigSource {
    /// Delta xDS from the control plane on the CA's port (`XDS_ADDRESS`),
    /// which serves the CA's mesh file.
    #[default]
    Xds,
    /// A local file each ztunnel reloads (`LOCAL_XDS_PATH`): what any
    /// ztunnel build that takes the same environment and file format can
    /// run on, e.g. upstream's, for the benchmarks.
    LocalFile,
}

/// The ztunnel pod of `node`, as the registry and its token name it.
pub fn ztunnel_pod(node: &str) -> String {
    format!("ztunnel-{node}")
}

/// The registry as a YAML list of pods, none with an address yet: one
/// ztunnel pod per node, then the application pods. The CA starts on it.
pub fn registry(nodes: &[&str], pods: &[PodSpec]) -> String {
    let mut text = String::new();
    for node in nodes {
        text.push_str(&ztunnel_entry(node, None));
    }
    for pod in pods {
        text.push_str(&pod_entry(pod, None, ""));
    }
    text
}

/// The registry entry of the ztunnel pod of `node`, a workload reached
/// over HBONE at `ip` when published as one.
fn ztunnel_entry(node: &str, ip: Option<Ipv4Addr>) -> String {
    let name = ztunnel_pod(node);
    let workload = ip.map_or_else(String::new, |ip| format!(", ips: [{ip}], protocol: HBONE"));
    format!(
        "- {{name: {name}, namespace: istio-system, uid: uid-{name}, serviceAccount: ztunnel, nodeName: {node}, phase: Running{workload}}}\n"
    )
}

/// The registry entry of an application pod, with its address and protocol
/// once it has a workload, on `network` (the default when empty).
fn pod_entry(spec: &PodSpec, workload: Option<&Workload>, network: &str) -> String {
    let mut entry = format!(
        "- {{name: {}, namespace: {}, uid: {}, serviceAccount: {}, nodeName: {}, phase: Running",
        spec.name,
        spec.namespace,
        spec.uid(),
        spec.service_account,
        spec.node
    );
    if let Some(workload) = workload {
        let _ = write!(
            entry,
            ", ips: [{}], protocol: {}",
            workload.ip,
            workload.protocol()
        );
    }
    if !network.is_empty() {
        let _ = write!(entry, ", network: {network}");
    }
    entry.push_str("}\n");
    entry
}

/// A policy of `namespace` (as a YAML list item for
/// [`MeshFile::set_policies`]) that denies the identity of
/// `service_account` of the same namespace everything in it.
pub fn deny_policy(namespace: &str, service_account: &str) -> String {
    let trust_domain = crate::cluster::TRUST_DOMAIN;
    format!(
        "- name: deny-{service_account}\n  namespace: {namespace}\n  scope: Namespace\n  action: Deny\n  rules:\n  - - - principals: [!Exact \"{trust_domain}/ns/{namespace}/sa/{service_account}\"]\n"
    )
}

/// A namespace-wide PeerAuthentication `default` of `namespace` with mTLS
/// `mode` (`Strict`, `Permissive`, `Disable` or `Unset`), as a YAML list
/// item for [`MeshFile::set_peer_authentications`].
pub fn peer_authentication(namespace: &str, mode: &str) -> String {
    format!("- {{name: default, namespace: {namespace}, mode: {mode}}}\n")
}

/// What makes a pod a workload: its address, and whether peers reach it
/// over HBONE.
#[derive(Debug, Clone, Copy)]
struct Workload {
    ip: Ipv4Addr,
    hbone: bool,
}

impl Workload {
    /// The `protocol` value of both file formats.
    fn protocol(self) -> &'static str {
        if self.hbone { "HBONE" } else { "TCP" }
    }
}

/// One pod the mesh file knows of.
#[derive(Debug, Clone)]
struct Entry {
    spec: PodSpec,
    /// `None` while the pod has no address in the mesh: not added yet, or
    /// removed from it.
    workload: Option<Workload>,
}

/// The mesh configuration: the pods (with their workloads once they have
/// an address), plus policies and services as YAML list text.
#[derive(Debug)]
pub struct MeshFile {
    path: PathBuf,
    source: ConfigSource,
    /// Nodes whose ztunnel pods the registry lists (xDS only).
    nodes: Vec<String>,
    /// Every pod, in the order they became known.
    pods: Vec<Entry>,
    policies: String,
    services: String,
    /// `peerAuthentications:` list items (YAML), xDS only: a ztunnel's
    /// local file has no such key.
    peer_authentications: String,
    /// `serviceEntries:` list items (YAML: Istio's objects with `metadata`
    /// and `spec`), xDS only.
    service_entries: String,
    /// `networkGateways:` list items (YAML), as the mesh file spells them.
    network_gateways: String,
    /// The network of each node's pods, where it is not the default one.
    node_networks: Vec<(String, String)>,
    /// Workloads on nodes outside the cluster, only written to the file:
    /// the size of the mesh a proxy knows (`set_remote_workloads`).
    remote_workloads: usize,
    /// The ztunnel pods published as HBONE workloads at their node's
    /// address (`set_ztunnel_workload`), xDS only.
    ztunnel_workloads: Vec<(String, Ipv4Addr)>,
}

/// The most remote workloads [`MeshFile::set_remote_workloads`] can
/// address: one per address of 198.19.0.0/16, then as many again in the
/// IPv6 benchmarking range 2001:2::/48 (RFC 5180). None is ever sent
/// traffic.
pub const MAX_REMOTE_WORKLOADS: usize = 1 << 17;

/// Remote workloads addressed in 198.19.0.0/16; the rest are IPv6.
const REMOTE_IPV4_WORKLOADS: usize = 1 << 16;

/// The address of remote workload `index`, quoted for a YAML flow list.
fn remote_ip(index: usize) -> String {
    if index < REMOTE_IPV4_WORKLOADS {
        format!("198.19.{}.{}", index / 256, index % 256)
    } else {
        format!("\"2001:2::{:x}\"", index - REMOTE_IPV4_WORKLOADS)
    }
}

/// The uid of remote workload `index`.
fn remote_uid(index: usize) -> String {
    format!("remote/{index}")
}

/// Services the remote workloads are endpoints of, round robin.
const REMOTE_SERVICES: usize = 1_000;

/// Service accounts the remote workloads run as, round robin.
const REMOTE_SERVICE_ACCOUNTS: usize = 50;

/// Nodes the remote workloads run on, round robin.
const REMOTE_NODES: usize = 100;

impl MeshFile {
    /// The mesh of `source` at `path`, knowing of the ztunnel pods of
    /// `nodes` and of `pods`, none of them with an address yet; written at
    /// once, so that the CA and the ztunnels can start on it.
    pub fn new(
        path: PathBuf,
        source: ConfigSource,
        nodes: &[&str],
        pods: &[PodSpec],
    ) -> anyhow::Result<MeshFile> {
        let file = MeshFile {
            path,
            source,
            nodes: nodes.iter().map(|node| (*node).to_owned()).collect(),
            pods: pods
                .iter()
                .map(|spec| Entry {
                    spec: spec.clone(),
                    workload: None,
                })
                .collect(),
            policies: String::new(),
            services: String::new(),
            peer_authentications: String::new(),
            service_entries: String::new(),
            network_gateways: String::new(),
            node_networks: Vec::new(),
            remote_workloads: 0,
            ztunnel_workloads: Vec::new(),
        };
        file.write()?;
        Ok(file)
    }

    /// Where it is: the CA's mesh file with xDS, the ztunnels' local file
    /// otherwise.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Which format it is written in.
    pub fn source(&self) -> ConfigSource {
        self.source
    }

    /// Gives a pod its workload: its address, reached over HBONE or as
    /// plain TCP. A pod the file did not know yet is added to it (with xDS,
    /// to the registry too: no CNI is involved).
    pub fn set_workload(
        &mut self,
        spec: &PodSpec,
        ip: Ipv4Addr,
        hbone: bool,
    ) -> anyhow::Result<()> {
        let workload = Some(Workload { ip, hbone });
        match self
            .pods
            .iter_mut()
            .find(|entry| entry.spec.uid() == spec.uid())
        {
            Some(entry) => {
                entry.spec = spec.clone();
                entry.workload = workload;
            }
            None => self.pods.push(Entry {
                spec: spec.clone(),
                workload,
            }),
        }
        self.write()
    }

    /// Publishes the ztunnel pod of `node` as a workload at `ip` (its
    /// node's address: it runs in the node's namespace here), reached over
    /// HBONE, as istiod does a ztunnel pod labelled
    /// `networking.istio.io/tunnel: http`.
    pub fn set_ztunnel_workload(&mut self, node: &str, ip: Ipv4Addr) -> anyhow::Result<()> {
        self.ztunnel_workloads.retain(|(known, _)| known != node);
        self.ztunnel_workloads.push((node.to_owned(), ip));
        self.write()
    }

    /// Removes a pod's workload: the pod stays known (to the registry,
    /// with xDS), without an address, so no peer routes to it.
    pub fn remove_workload(&mut self, spec: &PodSpec) -> anyhow::Result<()> {
        for entry in &mut self.pods {
            if entry.spec.uid() == spec.uid() {
                entry.workload = None;
            }
        }
        self.write()
    }

    /// Replaces the `policies:` list (YAML list items, the same shape in
    /// both formats; with xDS a `WorkloadSelector` policy may add
    /// `selector`).
    pub fn set_policies(&mut self, policies: &str) -> anyhow::Result<()> {
        policies.clone_into(&mut self.policies);
        self.write()
    }

    /// Replaces the `peerAuthentications:` list of the control plane's
    /// mesh file (YAML list items; see [`peer_authentication`]). Only the
    /// control plane reads them, so a local file is left as it was.
    pub fn set_peer_authentications(&mut self, peer_authentications: &str) -> anyhow::Result<()> {
        peer_authentications.clone_into(&mut self.peer_authentications);
        self.write()
    }

    /// Replaces the ServiceEntries (Istio's objects as YAML list items);
    /// the control plane converts them as istiod does, VIPs included.
    pub fn set_service_entries(&mut self, service_entries: &str) -> anyhow::Result<()> {
        service_entries.clone_into(&mut self.service_entries);
        self.write()
    }

    /// Replaces the `services:` list: YAML list items in the form of the
    /// file's source, the CA's mesh file's with xDS, WIRE.md §11's in a
    /// local file. The two share `name`, `namespace`, `hostname`, `vips`
    /// and `ports`; a local file takes a service's endpoints from the
    /// workloads whose `services` name it and ignores an `endpoints` key,
    /// so there a service has none unless a workload says so.
    pub fn set_services(&mut self, services: &str) -> anyhow::Result<()> {
        services.clone_into(&mut self.services);
        self.write()
    }

    /// The hostnames of the services set with [`MeshFile::set_services`].
    pub(super) fn service_hostnames(&self) -> Vec<String> {
        let Ok(serde_yaml_ng::Value::Sequence(services)) = serde_yaml_ng::from_str(&self.services)
        else {
            return Vec::new();
        };
        services
            .iter()
            .filter_map(|service| service.get("hostname")?.as_str().map(str::to_owned))
            .collect()
    }

    /// Puts the pods of `node` on `network` (the default network when
    /// empty). Only with xDS: the control plane gives workloads their
    /// network.
    pub fn set_node_network(&mut self, node: &str, network: &str) -> anyhow::Result<()> {
        if self.source != ConfigSource::Xds {
            bail!("networks are only written to the control plane's mesh file");
        }
        self.node_networks.retain(|(known, _)| known != node);
        if !network.is_empty() {
            self.node_networks
                .push((node.to_owned(), network.to_owned()));
        }
        self.write()
    }

    /// The network of `node`'s pods; empty for the default network.
    pub fn node_network(&self, node: &str) -> &str {
        self.node_networks
            .iter()
            .find(|(known, _)| known == node)
            .map_or("", |(_, network)| network)
    }

    /// Replaces the `networkGateways:` list (YAML list items of the CA's
    /// mesh file). Only with xDS.
    pub fn set_network_gateways(&mut self, gateways: &str) -> anyhow::Result<()> {
        if self.source != ConfigSource::Xds {
            bail!("network gateways are only written to the control plane's mesh file");
        }
        gateways.clone_into(&mut self.network_gateways);
        self.write()
    }

    /// Adds `count` workloads on other nodes (replacing any added before):
    /// the rest of a large mesh, which no test pod talks to but every
    /// proxy holds. Each has an address in 198.19.0.0/16 (past 65,536, in
    /// 2001:2::/48), one of 50
    /// service accounts, runs on one of 100 nodes and is an endpoint of one
    /// of 1,000 services. Only the local file: with xDS the control plane
    /// would also have to know them as pods.
    pub fn set_remote_workloads(&mut self, count: usize) -> anyhow::Result<()> {
        if self.source != ConfigSource::LocalFile {
            bail!("remote workloads are only written to the local config file");
        }
        if count > MAX_REMOTE_WORKLOADS {
            bail!("at most {MAX_REMOTE_WORKLOADS} remote workloads, not {count}");
        }
        self.remote_workloads = count;
        self.write()
    }

    /// The uids of the pods that are workloads, sorted: what every ztunnel
    /// should know once in sync.
    pub fn workload_uids(&self) -> Vec<String> {
        self.workload_uids_by(PodSpec::uid)
    }

    /// The uids of the pods that are workloads, each named by `uid`,
    /// sorted.
    pub(super) fn workload_uids_by(&self, uid: impl Fn(&PodSpec) -> String) -> Vec<String> {
        let mut uids: Vec<String> = self
            .pods
            .iter()
            .filter(|entry| entry.workload.is_some())
            .map(|entry| uid(&entry.spec))
            .chain((0..self.remote_workloads).map(remote_uid))
            .collect();
        uids.sort();
        uids
    }

    /// The file's text.
    fn render(&self) -> String {
        match self.source {
            ConfigSource::Xds => self.render_mesh(),
            ConfigSource::LocalFile => self.render_local(),
        }
    }

    /// The CA's mesh file: registry pods, services, policies.
    fn render_mesh(&self) -> String {
        let mut text = String::from("pods:\n");
        for node in &self.nodes {
            let ip = self
                .ztunnel_workloads
                .iter()
                .find_map(|(known, ip)| (known == node).then_some(*ip));
            text.push_str(&ztunnel_entry(node, ip));
        }
        for entry in &self.pods {
            let network = self.node_network(&entry.spec.node);
            text.push_str(&pod_entry(&entry.spec, entry.workload.as_ref(), network));
        }
        if !self.services.trim().is_empty() {
            let _ = write!(text, "services:\n{}", self.services);
        }
        if !self.network_gateways.trim().is_empty() {
            let _ = write!(text, "networkGateways:\n{}", self.network_gateways);
        }
        if !self.policies.trim().is_empty() {
            let _ = write!(text, "policies:\n{}", self.policies);
        }
        if !self.peer_authentications.trim().is_empty() {
            let _ = write!(text, "peerAuthentications:\n{}", self.peer_authentications);
        }
        if !self.service_entries.trim().is_empty() {
            let _ = write!(text, "serviceEntries:\n{}", self.service_entries);
        }
        text
    }

    /// The ztunnels' local file (WIRE.md §11): workloads, services and
    /// policies.
    fn render_local(&self) -> String {
        let workloads: Vec<(&PodSpec, Workload)> = self
            .pods
            .iter()
            .filter_map(|entry| Some((&entry.spec, entry.workload?)))
            .collect();
        let mut text = String::from(if workloads.is_empty() && self.remote_workloads == 0 {
            "workloads: []\n"
        } else {
            "workloads:\n"
        });
        for (spec, workload) in workloads {
            let _ = write!(
                text,
                "- uid: {uid}\n  name: {name}\n  namespace: {namespace}\n  trustDomain: {trust_domain}\n  serviceAccount: {sa}\n  workloadIps: [{ip}]\n  protocol: {protocol}\n  node: {node}\n  services: {{}}\n",
                uid = spec.uid(),
                trust_domain = crate::cluster::TRUST_DOMAIN,
                name = spec.name,
                namespace = spec.namespace,
                sa = spec.service_account,
                ip = workload.ip,
                protocol = workload.protocol(),
                node = spec.node,
            );
        }
        for index in 0..self.remote_workloads {
            let _ = write!(
                text,
                "- uid: {uid}\n  name: remote-{index}\n  namespace: remote\n  trustDomain: {trust_domain}\n  serviceAccount: sa-{sa}\n  workloadIps: [{ip}]\n  protocol: HBONE\n  node: remote-node-{node}\n  services: {{\"remote/svc-{service}.remote.svc.cluster.local\": {{80: 8080}}}}\n",
                uid = remote_uid(index),
                trust_domain = crate::cluster::TRUST_DOMAIN,
                sa = index % REMOTE_SERVICE_ACCOUNTS,
                ip = remote_ip(index),
                node = index % REMOTE_NODES,
                service = index % REMOTE_SERVICES,
            );
        }
        if !self.services.trim().is_empty() {
            let _ = write!(text, "services:\n{}", self.services);
        }
        if !self.policies.trim().is_empty() {
            let _ = write!(text, "policies:\n{}", self.policies);
        }
        text
    }

    /// Writes atomically: readers never see half a file.
    fn write(&self) -> anyhow::Result<()> {
        let temporary = self.path.with_extension("yaml.new");
        std::fs::write(&temporary, self.render())?;
        std::fs::rename(&temporary, &self.path)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests: a panic is a failed test

    use std::net::IpAddr;

    use ztunnel_mesh::{FileRegistry, PodRegistry, WorkloadProtocol};

    use super::*;

    #[test]
    fn the_control_plane_reads_pods_with_their_workloads_and_the_policies() {
        let dir = tempfile::tempdir().unwrap();
        let client = PodSpec::new("client", "default", "client", "node-a");
        let legacy = PodSpec::new("legacy", "legacy", "legacy", "node-b");
        let mut mesh = MeshFile::new(
            dir.path().join("mesh.yaml"),
            ConfigSource::Xds,
            &["node-a", "node-b"],
            &[client.clone(), legacy.clone()],
        )
        .unwrap();
        mesh.set_workload(&client, Ipv4Addr::new(198, 18, 10, 2), true)
            .unwrap();
        mesh.set_workload(&legacy, Ipv4Addr::new(198, 18, 11, 2), false)
            .unwrap();
        mesh.set_policies(&deny_policy("default", "client"))
            .unwrap();

        let snapshot = FileRegistry::load(mesh.path()).unwrap().snapshot();
        assert_eq!(snapshot.len(), 4, "two ztunnel pods and two applications");
        let ztunnel = snapshot.pod("istio-system", "ztunnel-node-a").unwrap();
        assert_eq!(ztunnel.uid, "uid-ztunnel-node-a");
        assert_eq!(ztunnel.node_name.as_deref(), Some("node-a"));
        let pod = snapshot.pod_by_uid(&client.uid()).unwrap();
        assert_eq!(pod.ips, [IpAddr::from([198, 18, 10, 2])]);
        assert_eq!(pod.protocol, WorkloadProtocol::Hbone);
        let pod = snapshot.pod_by_uid(&legacy.uid()).unwrap();
        assert_eq!(pod.protocol, WorkloadProtocol::Tcp);
        let policy = snapshot.policies().first().unwrap();
        assert_eq!(policy.resource_name(), "default/deny-client");
        assert_eq!(mesh.workload_uids(), [client.uid(), legacy.uid()]);

        // Removed: still in the registry, no longer a workload.
        mesh.remove_workload(&client).unwrap();
        mesh.set_policies("").unwrap();
        let snapshot = FileRegistry::load(mesh.path()).unwrap().snapshot();
        assert!(snapshot.pod_by_uid(&client.uid()).unwrap().ips.is_empty());
        assert!(snapshot.policies().is_empty());
        assert_eq!(mesh.workload_uids(), [legacy.uid()]);
    }

    #[test]
    fn peer_auth_the_control_plane_reads_the_peer_authentications() {
        let dir = tempfile::tempdir().unwrap();
        let mut mesh = MeshFile::new(
            dir.path().join("mesh.yaml"),
            ConfigSource::Xds,
            &["node-a"],
            &[],
        )
        .unwrap();
        mesh.set_peer_authentications(&peer_authentication("default", "Strict"))
            .unwrap();
        let snapshot = FileRegistry::load(mesh.path()).unwrap().snapshot();
        let [peer_authentication] = snapshot.peer_authentications() else {
            panic!("one PeerAuthentication")
        };
        assert_eq!(peer_authentication.namespace, "default");
        assert_eq!(peer_authentication.mode, ztunnel_mesh::MtlsMode::Strict);
    }

    /// A mesh file at `path` for one node, `node-a`, with `pod` on it.
    fn one_node_file(path: &std::path::Path, source: ConfigSource, pod: &PodSpec) -> MeshFile {
        MeshFile::new(
            path.to_path_buf(),
            source,
            &["node-a"],
            std::slice::from_ref(pod),
        )
        .unwrap()
    }

    /// The local file `mesh.yaml` in `dir`, for `pod`'s node.
    fn local_file(dir: &tempfile::TempDir, pod: &PodSpec) -> MeshFile {
        one_node_file(&dir.path().join("mesh.yaml"), ConfigSource::LocalFile, pod)
    }

    #[test]
    fn the_local_file_lists_workloads_and_services_and_no_registry() {
        let dir = tempfile::tempdir().unwrap();
        let client = PodSpec::new("client", "default", "client", "node-a");
        let mut mesh = local_file(&dir, &client);
        let read = |mesh: &MeshFile| std::fs::read_to_string(mesh.path()).unwrap();
        assert_eq!(read(&mesh), "workloads: []\n");
        mesh.set_workload(&client, Ipv4Addr::new(198, 18, 10, 2), true)
            .unwrap();
        let text = read(&mesh);
        assert!(text.contains("workloadIps: [198.18.10.2]"), "{text}");
        assert!(text.contains("protocol: HBONE"), "{text}");
        assert!(!text.contains("ztunnel"), "no registry in it: {text}");
        let service = "- {name: echo, namespace: default, hostname: echo.default.svc.cluster.local, vips: [\"198.18.254.10\"], ports: {80: 9000}}\n";
        mesh.set_services(service).unwrap();
        let text = read(&mesh);
        assert!(text.contains(&format!("services:\n{service}")), "{text}");
    }

    #[test]
    fn remote_workloads_are_listed_in_the_local_file_and_expected_in_sync() {
        let dir = tempfile::tempdir().unwrap();
        let client = PodSpec::new("client", "default", "client", "node-a");
        let mut mesh = local_file(&dir, &client);
        mesh.set_remote_workloads(300).unwrap();
        let text = std::fs::read_to_string(mesh.path()).unwrap();
        assert_eq!(text.matches("- uid: remote/").count(), 300);
        assert!(text.contains("workloadIps: [198.19.1.43]"), "{text}");
        assert_eq!(mesh.workload_uids().len(), 300);
        mesh.set_workload(&client, Ipv4Addr::new(198, 18, 10, 2), true)
            .unwrap();
        assert_eq!(mesh.workload_uids().len(), 301);
        mesh.set_remote_workloads(0).unwrap();
        assert_eq!(mesh.workload_uids(), [client.uid()]);
        assert!(mesh.set_remote_workloads(MAX_REMOTE_WORKLOADS + 1).is_err());
        // Past the IPv4 block, addresses are IPv6, quoted so YAML reads them.
        assert_eq!(remote_ip(REMOTE_IPV4_WORKLOADS - 1), "198.19.255.255");
        let ipv6 = format!("workloadIps: [{}]", remote_ip(REMOTE_IPV4_WORKLOADS + 10));
        assert_eq!(ipv6, "workloadIps: [\"2001:2::a\"]");
        let parsed: serde_yaml_ng::Value = serde_yaml_ng::from_str(&ipv6).unwrap();
        assert_eq!(parsed["workloadIps"][0].as_str(), Some("2001:2::a"));

        let mut xds = one_node_file(&dir.path().join("xds.yaml"), ConfigSource::Xds, &client);
        assert!(xds.set_remote_workloads(1).is_err());
    }
}
