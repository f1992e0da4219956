//! One pod of the mesh: the facts the CA authorizes against (uid,
//! service account, node, phase) and the ones xDS turns into a workload
//! (IPs, labels, whether it speaks HBONE, readiness, locality). The mesh
//! file spells it directly; `kube/convert/pod.rs` builds it from a
//! Kubernetes Pod.
//!
//! Which pods a service or a policy selects is decided here
//! ([`Pod::is_selected_by`]); what a pod becomes on the wire is
//! `xds/resources.rs`'s business.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::Deserialize;

use super::waypoint::{ApplicationTunnel, GatewayAddress};

/// Pod labels, and label selectors: key → value. Ordered, so that anything
/// built from them is built the same way every time.
pub type Labels = BTreeMap<String, String>;

/// One pod, as the mesh file spells it. The keys after `workloadName` are
/// the ones a Kubernetes pod fills and a hand-written file rarely needs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Pod {
    /// Pod name.
    pub name: String,
    /// Pod namespace.
    pub namespace: String,
    /// Pod UID; a token for a deleted and recreated pod of the same name
    /// carries the old UID and must not match. Also the workload's xDS
    /// resource name (WIRE.md §7).
    pub uid: String,
    /// `spec.serviceAccountName`.
    pub service_account: String,
    /// `spec.nodeName`; absent while the pod is unscheduled.
    #[serde(default)]
    pub node_name: Option<String>,
    /// `status.phase`.
    #[serde(default)]
    pub phase: PodPhase,
    /// Pod IPs. A pod without one is no workload (nothing can reach it).
    #[serde(default)]
    pub ips: Vec<IpAddr>,
    /// `metadata.labels`: what service and policy selectors match, and where
    /// the canonical service name and revision come from.
    #[serde(default)]
    pub labels: Labels,
    /// Whether the pod is enrolled in the mesh (HBONE) or not (plain TCP).
    #[serde(default)]
    pub protocol: WorkloadProtocol,
    /// The network the pod's IPs belong to; empty is the default network.
    #[serde(default)]
    pub network: String,
    /// The cluster the pod runs in; absent is the default cluster.
    #[serde(default)]
    pub cluster_id: Option<String>,
    /// The workload (e.g. Deployment) the pod belongs to, for telemetry;
    /// absent means the pod stands alone and is named by its own name.
    #[serde(default)]
    pub workload_name: Option<String>,
    /// The workload's xDS resource name and `Workload.uid`, when it is not
    /// `uid`: Kubernetes pods are named `<cluster>//Pod/<namespace>/<name>`
    /// on the wire, while the CA matches tokens against the pod's own UID.
    #[serde(default)]
    pub workload_uid: Option<String>,
    /// `Workload.workload_type`; absent, `Deployment` when `workload_name`
    /// is set and `Pod` otherwise.
    #[serde(default)]
    pub workload_type: Option<WorkloadType>,
    /// The pod terminates HBONE itself (label `networking.istio.io/tunnel`
    /// lists `http`), so peers tunnel to it rather than to its node's proxy.
    #[serde(default)]
    pub native_tunnel: bool,
    /// The pod runs in its node's network namespace: its IP is the node's,
    /// shared with the node's other such pods, so it is never looked up by
    /// address and may share one.
    #[serde(default)]
    pub host_network: bool,
    /// Where the pod runs, for locality-aware load balancing; absent when
    /// its node carries no topology labels.
    #[serde(default)]
    pub locality: Option<Locality>,
    /// Whether the pod passes its readiness checks. Known (a Kubernetes pod:
    /// condition `Ready` is `True` and no deletion is pending), it alone
    /// decides the workload's health, and selector services count the pod
    /// in any phase that makes a workload. Unknown, a Running pod is ready
    /// and only Running pods are selector-service endpoints.
    #[serde(default)]
    pub ready: Option<bool>,
    /// The trust domain peers are told the pod's identity is in; absent is
    /// the CA's. Empty stands for `cluster.local` on the wire.
    #[serde(default)]
    pub trust_domain: Option<String>,
    /// Named TCP ports of the pod's containers, name → port: a service
    /// whose target port is a name reaches the pod on the port so named,
    /// and a pod without that name is not reached on that service port.
    #[serde(default)]
    pub container_ports: BTreeMap<String, u16>,
    /// The waypoint that traffic addressed to the pod's own IPs goes
    /// through; absent, peers reach the pod directly.
    #[serde(default)]
    pub waypoint: Option<GatewayAddress>,
    /// How the pod, itself a waypoint's instance, takes traffic its node's
    /// proxy hands it; absent, as HBONE delivers it.
    #[serde(default)]
    pub application_tunnel: Option<ApplicationTunnel>,
}

impl Pod {
    /// Whether a selector picks this pod: every selector label is on the pod
    /// with the same value. The namespace is the caller's to compare.
    pub fn is_selected_by(&self, selector: &Labels) -> bool {
        selects(selector, &self.labels)
    }

    /// Whether the pod runs or is about to: the phases that make a workload
    /// and that the CA issues identities for. A finished pod (`Succeeded`,
    /// `Failed`) or one whose node stopped reporting (`Unknown`) is not.
    pub fn is_live(&self) -> bool {
        matches!(self.phase, PodPhase::Running | PodPhase::Pending)
    }

    /// The workload's xDS resource name and `Workload.uid`.
    pub fn resource_name(&self) -> &str {
        self.workload_uid.as_deref().unwrap_or(&self.uid)
    }

    /// Whether label-selector services of its namespace count this pod
    /// among their endpoints when their labels match (see `ready`).
    pub fn joins_selector_services(&self) -> bool {
        self.ready.is_some() || self.phase == PodPhase::Running
    }

    /// Whether the pod is healthy: services balance only to healthy pods.
    /// A Pending pod is not ready: peers may address it, but services do
    /// not balance to it.
    pub fn is_healthy(&self) -> bool {
        self.ready.unwrap_or(self.phase == PodPhase::Running)
    }
}

/// Whether `selector` picks a workload with these labels: every selector
/// label is among them with the same value.
pub(crate) fn selects(selector: &Labels, labels: &Labels) -> bool {
    selector
        .iter()
        .all(|(key, value)| labels.get(key) == Some(value))
}

/// `status.phase`; which phases are live is [`Pod::is_live`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum PodPhase {
    /// Accepted, not all containers started.
    Pending,
    /// Bound to a node, containers started.
    #[default]
    Running,
    /// All containers exited successfully.
    Succeeded,
    /// All containers exited, at least one in failure.
    Failed,
    /// The node stopped reporting.
    Unknown,
}

/// How peers reach a pod.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum WorkloadProtocol {
    /// Enrolled in the mesh: peers tunnel to it over HBONE.
    #[default]
    #[serde(rename = "HBONE")]
    Hbone,
    /// Not enrolled: peers send plain TCP.
    #[serde(rename = "TCP")]
    Tcp,
}

/// `Workload.workload_type`: what kind of object runs the pod, for
/// telemetry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum WorkloadType {
    /// A Deployment (or anything long-running that is not named otherwise).
    Deployment,
    /// A CronJob.
    CronJob,
    /// The pod itself; istiod says this of every Kubernetes pod.
    Pod,
    /// A Job.
    Job,
}

/// Where a pod runs: its node's topology labels.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Locality {
    /// `topology.kubernetes.io/region`.
    pub region: String,
    /// `topology.kubernetes.io/zone`.
    pub zone: String,
    /// `topology.istio.io/subzone`.
    pub subzone: String,
}
