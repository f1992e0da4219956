//! Istio's `networking.istio.io/v1` `WorkloadEntry` as a Rust type, so that
//! `kube::Api<WorkloadEntry>` can list and watch it; its spec is also the
//! shape of a ServiceEntry's inline endpoints (`service_entry_crd.rs`).
//! Its schema for the API server is
//! `deploy/crds/workloadentries.networking.istio.io.yaml`, which serves
//! `v1beta1` and `v1alpha3` too.
//!
//! Only the shape lives here; what a WorkloadEntry means for ztunnel is
//! `convert/workload_entry.rs`'s. Fields are read leniently (unknown
//! fields are ignored, every field may be absent): a field added by a newer
//! Istio must not stop the watch.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

/// A WorkloadEntry object: metadata and spec.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct WorkloadEntry {
    /// Name, namespace, labels (merged over `spec.labels`), annotations.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// Where the workload is and what it is.
    #[serde(default)]
    pub spec: WorkloadEntrySpec,
}

custom_resource!(
    WorkloadEntry: "networking.istio.io" / "v1",
    "WorkloadEntry",
    "workloadentries",
    NamespaceResourceScope,
    with spec
);

/// `spec` of a WorkloadEntry, and one of a ServiceEntry's `endpoints`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct WorkloadEntrySpec {
    /// An IP, or a hostname resolved by DNS when the workload is reached;
    /// empty, the workload has no address (reachable only through a
    /// network gateway).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub address: String,
    /// Port name → the workload's port: a service port of that name is
    /// received there.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub ports: BTreeMap<String, u32>,
    /// Labels that selectors match.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// The network the address is on; empty is the control plane's.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub network: String,
    /// `region/zone/subzone`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub locality: String,
    /// Its share of the traffic against the service's other endpoints;
    /// 0 is unset.
    #[serde(skip_serializing_if = "is_zero")]
    pub weight: u32,
    /// The service account of its identity.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub service_account: String,
}

fn is_zero(value: &u32) -> bool {
    *value == 0
}
