//! Istio's `networking.istio.io/v1` `ServiceEntry` as a Rust type, so that
//! `kube::Api<ServiceEntry>` can list and watch it and the control plane
//! can write the addresses it allocates into its status. Its schema for
//! the API server is `deploy/crds/serviceentries.networking.istio.io.yaml`,
//! which serves `v1beta1` and `v1alpha3` too.
//!
//! Only the shape lives here; what a ServiceEntry means for ztunnel is
//! `convert/service_entry.rs`'s, and which addresses it is given
//! `convert/allocation.rs`'s. Fields are read leniently (unknown fields
//! are ignored, enums kept as written): a value added by a newer Istio must
//! not stop the watch.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

use super::workload_entry_crd::WorkloadEntrySpec;

/// A ServiceEntry object: metadata, spec and the addresses its status
/// holds.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct ServiceEntry {
    /// Name, namespace, labels (`networking.istio.io/enable-autoallocate-ip`,
    /// the endpoints' canonical name), annotations, creation time (the
    /// older of two keeps a contested address).
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The hosts, their ports and endpoints.
    #[serde(default)]
    pub spec: ServiceEntrySpec,
    /// The addresses allocated to its hosts, once written.
    #[serde(default)]
    pub status: Option<ServiceEntryStatus>,
}

custom_resource!(
    ServiceEntry: "networking.istio.io" / "v1",
    "ServiceEntry",
    "serviceentries",
    NamespaceResourceScope,
    with spec
);

/// `spec`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ServiceEntrySpec {
    /// The hostnames, each a service of its own.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
    /// The VIPs of every host (IPs or CIDRs); none, the control plane
    /// allocates some.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<String>,
    /// The ports.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<ServiceEntryPort>,
    /// `MESH_EXTERNAL` (the default) or `MESH_INTERNAL`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    /// `NONE` (the default), `STATIC`, `DNS`, `DNS_ROUND_ROBIN` or
    /// `DYNAMIC_DNS`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resolution: Option<String>,
    /// Endpoints written inline; exclusive with `workload_selector`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub endpoints: Vec<WorkloadEntrySpec>,
    /// The pods and WorkloadEntries of its namespace that serve it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workload_selector: Option<EntryWorkloadSelector>,
    /// Identities its endpoints may present besides their own.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub subject_alt_names: Vec<String>,
}

/// One of `spec.ports`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ServiceEntryPort {
    /// The service port.
    pub number: u32,
    /// `HTTP`, `HTTP2`, `GRPC`, `TLS`, `HTTPS`, `TCP`, ...
    #[serde(skip_serializing_if = "String::is_empty")]
    pub protocol: String,
    /// The port's name: an endpoint declaring a port of this name
    /// receives the service port there.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Where endpoints receive it when they declare no port of its name;
    /// 0 is the service port.
    #[serde(skip_serializing_if = "is_zero")]
    pub target_port: u32,
}

/// `spec.workloadSelector`: a label set, not a Kubernetes `LabelSelector`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct EntryWorkloadSelector {
    /// Labels a pod or WorkloadEntry must all carry.
    pub labels: BTreeMap<String, String>,
}

/// `status`: only the allocated addresses are read and written.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ServiceEntryStatus {
    /// One entry per allocated address and host.
    pub addresses: Vec<ServiceEntryAddress>,
}

/// One of `status.addresses`.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(default)]
pub struct ServiceEntryAddress {
    /// The address.
    pub value: String,
    /// The host it is for.
    pub host: String,
}

fn is_zero(value: &u32) -> bool {
    *value == 0
}
