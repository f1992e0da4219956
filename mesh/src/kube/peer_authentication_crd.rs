//! Istio's `security.istio.io/v1` `PeerAuthentication` as a Rust type, so
//! that `kube::Api<PeerAuthentication>` can list and watch it. Its schema
//! for the API server is
//! `deploy/crds/peerauthentications.security.istio.io.yaml`, which serves
//! `v1beta1` too: the API server hands out one stored object under either.
//!
//! Only the shape lives here; what a PeerAuthentication means for ztunnel
//! is `convert/peer_authentication.rs`'s and `peer_authentication.rs`'s.
//! Fields are read leniently (unknown fields are ignored, modes and port
//! keys are kept as written): objects come from the API server, and a
//! value added by a newer Istio must not stop the watch.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

use super::policy_crd::WorkloadSelector;

/// A PeerAuthentication object: metadata and spec.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct PeerAuthentication {
    /// Name, namespace and creation time (the oldest of a level applies).
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The mTLS modes and the workloads they are for.
    #[serde(default)]
    pub spec: PeerAuthenticationSpec,
}

custom_resource!(
    PeerAuthentication: "security.istio.io" / "v1",
    "PeerAuthentication",
    "peerauthentications",
    NamespaceResourceScope,
    with spec
);

/// `spec`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct PeerAuthenticationSpec {
    /// The pods of its namespace it applies to; absent, all of them (all
    /// of the mesh's, in the root namespace).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub selector: Option<WorkloadSelector>,
    /// The mode of every port not in `port_level_mtls`; absent is `UNSET`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mtls: Option<MutualTls>,
    /// Modes of single ports, keyed by the port number as a string (JSON
    /// map keys are strings).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub port_level_mtls: BTreeMap<String, MutualTls>,
}

/// `spec.mtls` and each value of `spec.portLevelMtls`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct MutualTls {
    /// `UNSET`, `DISABLE`, `PERMISSIVE` or `STRICT`; absent is `UNSET`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
}

#[cfg(test)]
mod tests;
