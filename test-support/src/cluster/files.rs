//! The files the cluster's components read: the pod registry (the CA's and
//! the node agents'), and the mesh configuration every ztunnel loads
//! (`LOCAL_XDS_PATH`, WIRE.md §11), rewritten as pods come and go and as
//! policies change.

use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use crate::cluster::PodSpec;

/// The ztunnel pod of `node`, as the registry and its token name it.
pub fn ztunnel_pod(node: &str) -> String {
    format!("ztunnel-{node}")
}

/// The registry YAML: one ztunnel pod per node, then the application pods.
pub fn registry(nodes: &[&str], pods: &[PodSpec]) -> String {
    let mut text = String::new();
    for node in nodes {
        let name = ztunnel_pod(node);
        let _ = writeln!(
            text,
            "- {{name: {name}, namespace: istio-system, uid: uid-{name}, serviceAccount: ztunnel, nodeName: {node}, phase: Running}}"
        );
    }
    for pod in pods {
        let _ = writeln!(
            text,
            "- {{name: {}, namespace: {}, uid: {}, serviceAccount: {}, nodeName: {}, phase: Running}}",
            pod.name,
            pod.namespace,
            pod.uid(),
            pod.service_account,
            pod.node
        );
    }
    text
}

/// One workload entry of the mesh file.
#[derive(Debug, Clone)]
struct WorkloadEntry {
    spec: PodSpec,
    ip: Ipv4Addr,
    hbone: bool,
}

/// The mesh configuration: workloads from the pods, plus policies as YAML
/// text.
#[derive(Debug)]
pub struct MeshFile {
    path: PathBuf,
    workloads: Vec<WorkloadEntry>,
    policies: String,
}

impl MeshFile {
    /// An empty mesh, written at once so that ztunnels can start on it.
    pub fn new(path: PathBuf) -> anyhow::Result<MeshFile> {
        let file = MeshFile {
            path,
            workloads: Vec::new(),
            policies: String::new(),
        };
        file.write()?;
        Ok(file)
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Adds or replaces the workload of a pod.
    pub fn set_workload(
        &mut self,
        spec: &PodSpec,
        ip: Ipv4Addr,
        hbone: bool,
    ) -> anyhow::Result<()> {
        self.workloads
            .retain(|entry| entry.spec.uid() != spec.uid());
        self.workloads.push(WorkloadEntry {
            spec: spec.clone(),
            ip,
            hbone,
        });
        self.write()
    }

    /// Removes a pod's workload.
    pub fn remove_workload(&mut self, spec: &PodSpec) -> anyhow::Result<()> {
        self.workloads
            .retain(|entry| entry.spec.uid() != spec.uid());
        self.write()
    }

    /// Replaces the `policies:` list (YAML list items).
    pub fn set_policies(&mut self, policies: &str) -> anyhow::Result<()> {
        policies.clone_into(&mut self.policies);
        self.write()
    }

    /// The file's text.
    fn render(&self) -> String {
        let mut text = String::from("workloads:\n");
        if self.workloads.is_empty() {
            text = String::from("workloads: []\n");
        }
        for entry in &self.workloads {
            let spec = &entry.spec;
            let _ = write!(
                text,
                "- uid: {uid}\n  name: {name}\n  namespace: {namespace}\n  serviceAccount: {sa}\n  workloadIps: [{ip}]\n  protocol: {protocol}\n  node: {node}\n  services: {{}}\n",
                uid = spec.uid(),
                name = spec.name,
                namespace = spec.namespace,
                sa = spec.service_account,
                ip = entry.ip,
                protocol = if entry.hbone { "HBONE" } else { "TCP" },
                node = spec.node,
            );
        }
        if !self.policies.is_empty() {
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
