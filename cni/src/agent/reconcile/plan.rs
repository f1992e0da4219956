//! What a reconciliation pass does (KUBERNETES.md A5, A6), decided from
//! plain data: the pods of this node as the API shows them, with their
//! enrollment already decided, against the pods the agent holds. The
//! passes themselves (reading the watch, scanning procfs, calling the
//! mesh) are `reconcile.rs`'s.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Pod;
use ztunnel_mesh::kube::convert::{pod_addresses, service_account};

use crate::agent::enablement::{self, EnablementSettings, Enrollment, should_enroll};
use crate::agent::kube::{REDIRECTION_ANNOTATION, Redirection};
use crate::agent::mesh::Removal;
use crate::agent::pods::PodRecord;

/// A pod of this node as the API shows it, reduced to what the pass needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiPod {
    /// `metadata.uid`.
    pub uid: String,
    /// Pod name.
    pub name: String,
    /// Pod namespace.
    pub namespace: String,
    /// `spec.serviceAccountName`, `default` when empty.
    pub service_account: String,
    /// `status.podIPs`, else `status.podIP`; IPv4-mapped addresses
    /// unmapped, each once.
    pub ips: Vec<IpAddr>,
    /// Whether it belongs in the mesh, and why not.
    pub enrollment: Enrollment,
    /// Its redirection annotation: `None` when absent or unknown.
    pub redirection: Option<Redirection>,
    /// Its own DNS capture choice (annotation).
    pub dns_capture: Option<bool>,
}

impl ApiPod {
    /// The pod as the pass sees it, in a namespace labelled
    /// `namespace_labels`; `None` for an object without a uid, name or
    /// namespace, which no pass can act on.
    pub fn of(
        pod: &Pod,
        namespace_labels: &BTreeMap<String, String>,
        settings: &EnablementSettings,
    ) -> Option<ApiPod> {
        let metadata = &pod.metadata;
        let non_empty = |value: &Option<String>| value.clone().filter(|value| !value.is_empty());
        let mut ips = Vec::new();
        for ip in pod_addresses(pod).into_iter().map(|ip| ip.to_canonical()) {
            if !ips.contains(&ip) {
                ips.push(ip);
            }
        }
        let redirection = metadata
            .annotations
            .as_ref()
            .and_then(|annotations| annotations.get(REDIRECTION_ANNOTATION))
            .and_then(|value| match value.as_str() {
                "enabled" => Some(Redirection::Enabled),
                "pending" => Some(Redirection::Pending),
                _ => None,
            });
        Some(ApiPod {
            uid: non_empty(&metadata.uid)?,
            name: non_empty(&metadata.name)?,
            namespace: non_empty(&metadata.namespace)?,
            service_account: service_account(pod).to_owned(),
            ips,
            enrollment: should_enroll(pod, namespace_labels, settings),
            redirection,
            dns_capture: enablement::dns_capture(pod),
        })
    }

    /// `namespace/name`, for logs.
    pub fn label(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// One thing a pass does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// The pod belongs in the mesh and runs, but the agent does not hold
    /// it, or holds a netns that is gone: find its netns through procfs
    /// and enroll it.
    Find(ApiPod),
    /// The pod is held and its netns is there, but its annotation does not
    /// say `enabled`: hand it to ztunnel again and annotate it.
    Refresh(ApiPod, PodRecord),
    /// Take the pod out.
    Remove(PodRecord, Removal),
    /// The watch does not show the held pod: ask the API server before
    /// removing it, because a pod added through the CNI plugin may have
    /// been read directly while the watch lagged.
    Confirm(PodRecord),
}

/// The steps that bring the agent's `held` pods in line with the `api`
/// pods of its node. `netns_alive` says whether a held pod's netns is
/// still there. Removals come first, so that a pod replaced under the same
/// name loses its old record before the new one is found.
pub fn plan(
    api: &[ApiPod],
    held: &[PodRecord],
    netns_alive: impl Fn(&PodRecord) -> bool,
) -> Vec<Step> {
    let by_name: HashMap<(&str, &str), &ApiPod> = api
        .iter()
        .map(|pod| ((pod.namespace.as_str(), pod.name.as_str()), pod))
        .collect();
    let mut removals = Vec::new();
    let mut kept: HashMap<(&str, &str), &PodRecord> = HashMap::new();
    for record in held {
        let key = (record.namespace.as_str(), record.name.as_str());
        match by_name.get(&key) {
            None => removals.push(Step::Confirm(record.clone())),
            Some(pod) if pod.uid != record.uid => {
                removals.push(Step::Remove(record.clone(), Removal::Deleted));
            }
            Some(pod) => match pod.enrollment {
                Enrollment::Enrolled => {
                    kept.insert(key, record);
                }
                Enrollment::Terminal => {
                    removals.push(Step::Remove(record.clone(), Removal::Deleted));
                }
                _ => removals.push(Step::Remove(record.clone(), Removal::OptedOut)),
            },
        }
    }
    let mut steps = removals;
    for pod in api {
        // A pod without an address has no running sandbox yet: its CNI
        // ADD enrolls it.
        if !pod.enrollment.is_enrolled() || pod.ips.is_empty() {
            continue;
        }
        match kept.get(&(pod.namespace.as_str(), pod.name.as_str())) {
            Some(record) if netns_alive(record) => {
                if pod.redirection != Some(Redirection::Enabled) {
                    steps.push(Step::Refresh(pod.clone(), (*record).clone()));
                }
            }
            _ => steps.push(Step::Find(pod.clone())),
        }
    }
    steps
}

#[cfg(test)]
mod tests;
