//! One pod of the mesh file: the facts the CA authorizes against (uid,
//! service account, node, phase) and the ones xDS turns into a workload
//! (IPs, labels, whether it speaks HBONE).
//!
//! Which pods a service or a policy selects is decided here
//! ([`Pod::is_selected_by`]); what a pod becomes on the wire is
//! `xds/resources.rs`'s business.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::Deserialize;

/// Pod labels, and label selectors: key → value. Ordered, so that anything
/// built from them is built the same way every time.
pub type Labels = BTreeMap<String, String>;

/// One pod, as the mesh file spells it.
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
}

impl Pod {
    /// Whether a selector picks this pod: every selector label is on the pod
    /// with the same value. The namespace is the caller's to compare.
    pub fn is_selected_by(&self, selector: &Labels) -> bool {
        selector
            .iter()
            .all(|(key, value)| self.labels.get(key) == Some(value))
    }

    /// Whether the pod runs or is about to: the phases that make a workload.
    pub fn is_live(&self) -> bool {
        matches!(self.phase, PodPhase::Running | PodPhase::Pending)
    }
}

/// `status.phase`. Failed pods do not count as running an identity on a node.
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
