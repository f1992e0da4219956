//! Istio's `security.istio.io/v1` `AuthorizationPolicy` as a Rust type, so
//! that `kube::Api<AuthorizationPolicy>` can list and watch it. Its schema
//! for the API server is `deploy/crds/authorizationpolicies.security.istio.io.yaml`.
//!
//! Only the shape lives here; what a policy means for ztunnel is
//! `convert/policy.rs`'s. Fields are read leniently (unknown fields are
//! ignored, every list may be absent): objects come from the API server,
//! and a field added by a newer Istio must not stop the watch.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

/// An AuthorizationPolicy object: metadata and spec. Its status is the
/// API server's and is not read.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct AuthorizationPolicy {
    /// Name, namespace, labels, annotations (`istio.io/dry-run`).
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// What the policy allows or denies, for which workloads.
    #[serde(default)]
    pub spec: AuthorizationPolicySpec,
}

custom_resource!(
    AuthorizationPolicy: "security.istio.io" / "v1",
    "AuthorizationPolicy",
    "authorizationpolicies",
    NamespaceResourceScope,
    with spec
);

/// `spec`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct AuthorizationPolicySpec {
    /// The pods of the policy's namespace (of every namespace, for the root
    /// namespace) it applies to; absent, all of them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub selector: Option<WorkloadSelector>,
    /// A gateway or service the policy is for instead of pods; such
    /// policies are enforced by waypoints, not by ztunnel.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_ref: Option<PolicyTargetReference>,
    /// Several targets, as `target_ref`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub target_refs: Vec<PolicyTargetReference>,
    /// What a match does; absent is `ALLOW`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub action: Option<Action>,
    /// The external authorizer of a `CUSTOM` policy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider: Option<Provider>,
    /// OR-ed rules. None: an `ALLOW` policy matches nothing, a `DENY`
    /// policy never applies.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<Rule>,
}

/// `spec.selector`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct WorkloadSelector {
    /// Labels a pod must all carry.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
}

/// `spec.targetRef` / `spec.targetRefs[]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct PolicyTargetReference {
    /// API group of the target; empty is the core group.
    pub group: String,
    /// Kind of the target, e.g. `Gateway` or `Service`.
    pub kind: String,
    /// Name of the target.
    pub name: String,
    /// Namespace of the target; absent is the policy's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// `spec.action`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Action {
    /// Matching requests are allowed; once a workload has one, requests
    /// matching none are refused.
    Allow,
    /// Matching requests are refused.
    Deny,
    /// Matching requests are logged.
    Audit,
    /// Matching requests are decided by an external authorizer.
    Custom,
}

/// `spec.provider`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Provider {
    /// The extension provider's name in the mesh config.
    pub name: String,
}

/// `spec.rules[]`: every part present must match.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Rule {
    /// Who the request comes from; any entry may match.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub from: Vec<RuleFrom>,
    /// What the request is for; any entry may match.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub to: Vec<RuleTo>,
    /// Further conditions; all must match.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub when: Vec<Condition>,
}

/// `rules[].from[]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct RuleFrom {
    /// The peer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<Source>,
}

/// `rules[].from[].source`: values within a field are OR-ed, fields AND-ed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Source {
    /// Peer identities (`<trust domain>/ns/<ns>/sa/<sa>`), `*` patterns.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub principals: Vec<String>,
    /// Peer identities that must not match.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_principals: Vec<String>,
    /// Request JWT principals (HTTP only).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub request_principals: Vec<String>,
    /// Request JWT principals that must not match (HTTP only).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_request_principals: Vec<String>,
    /// Peer namespaces, `*` patterns.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
    /// Peer namespaces that must not match.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_namespaces: Vec<String>,
    /// Peer addresses, IPs or CIDRs.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ip_blocks: Vec<String>,
    /// Peer addresses that must not match.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_ip_blocks: Vec<String>,
    /// Original client addresses (from `X-Forwarded-For`; HTTP only).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub remote_ip_blocks: Vec<String>,
    /// Original client addresses that must not match (HTTP only).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_remote_ip_blocks: Vec<String>,
    /// Peer service accounts, `<ns>/<sa>` or `<sa>` in the policy's
    /// namespace.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub service_accounts: Vec<String>,
    /// Peer service accounts that must not match.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_service_accounts: Vec<String>,
    /// Peer trust domains.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub trust_domains: Vec<String>,
    /// Peer trust domains that must not match.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_trust_domains: Vec<String>,
}

/// `rules[].to[]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct RuleTo {
    /// The request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub operation: Option<Operation>,
}

/// `rules[].to[].operation`: values within a field are OR-ed, fields
/// AND-ed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Operation {
    /// HTTP hosts (HTTP only).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
    /// HTTP hosts that must not match (HTTP only).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_hosts: Vec<String>,
    /// Destination ports, as decimal strings.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<String>,
    /// Destination ports that must not match.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_ports: Vec<String>,
    /// HTTP methods (HTTP only).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub methods: Vec<String>,
    /// HTTP methods that must not match (HTTP only).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_methods: Vec<String>,
    /// HTTP paths (HTTP only).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<String>,
    /// HTTP paths that must not match (HTTP only).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_paths: Vec<String>,
}

/// `rules[].when[]`: an attribute (`key`) and the values it may or must not
/// take.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Condition {
    /// The attribute, e.g. `source.ip` or `request.headers[x-id]`.
    pub key: String,
    /// Values it may take.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
    /// Values it must not take.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_values: Vec<String>,
}

#[cfg(test)]
pub(super) mod tests;
