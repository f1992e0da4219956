//! One authorization policy of the mesh, in the shape of the ztunnel local
//! file's `policies[]` (WIRE.md §11): rules are nested lists (a rule is a
//! list of clauses, a clause a list of matches), string matches are tagged
//! `!Exact "..."`, `!Prefix`, `!Suffix` or `Presence`. Two keys are added,
//! which the local file has no need for: `selector`, the labels of the pods
//! a `WorkloadSelector` policy applies to, and `allNamespaces`, whether it
//! looks for them beyond its own namespace. `kube/convert/policy.rs` builds
//! it from an Istio AuthorizationPolicy.
//!
//! Whether scope and selector agree is checked in `snapshot.rs`.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use serde::{Deserialize, Deserializer};

use super::pod::Labels;
use super::text_value;

/// One policy, as the mesh file spells it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Policy {
    /// Policy name.
    pub name: String,
    /// Policy namespace.
    pub namespace: String,
    /// Which workloads it applies to.
    pub scope: PolicyScope,
    /// Allow or deny what it matches.
    pub action: PolicyAction,
    /// Log matches only, enforce nothing.
    #[serde(default)]
    pub dry_run: bool,
    /// For scope `WorkloadSelector`: the labels of the pods of the policy's
    /// namespace it applies to. Absent for the other scopes.
    #[serde(default)]
    pub selector: Option<Labels>,
    /// For scope `WorkloadSelector`: the selector picks pods of every
    /// namespace, not only the policy's. A Kubernetes policy in the root
    /// namespace (`istio-system` by default) selects this way.
    #[serde(default)]
    pub all_namespaces: bool,
    /// OR-ed rules; each an AND-ed list of clauses; each an OR-ed list of
    /// matches.
    #[serde(default)]
    pub rules: Vec<Vec<Vec<PolicyMatch>>>,
}

impl Policy {
    /// The xDS resource name: `<namespace>/<name>` (WIRE.md §7).
    pub fn resource_name(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// `scope`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum PolicyScope {
    /// Every workload of the mesh.
    Global,
    /// Every workload of the policy's namespace.
    Namespace,
    /// The workloads its `selector` picks (of the policy's namespace, or
    /// of all with `allNamespaces`).
    WorkloadSelector,
}

/// `action`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum PolicyAction {
    /// Connections must match some enforced ALLOW policy.
    Allow,
    /// Matching connections are refused.
    Deny,
}

/// One match: every kind listed must pass (WIRE.md §9). A match with every
/// list empty is skipped by the proxy, not counted as matched: a clause
/// holding only such matches never matches.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct PolicyMatch {
    /// Peer namespace.
    pub namespaces: Vec<StringMatch>,
    /// Peer namespace, negated.
    pub not_namespaces: Vec<StringMatch>,
    /// Peer SPIFFE id without `spiffe://`.
    pub principals: Vec<StringMatch>,
    /// Peer SPIFFE id, negated.
    pub not_principals: Vec<StringMatch>,
    /// Client address.
    pub source_ips: Vec<Cidr>,
    /// Client address, negated.
    pub not_source_ips: Vec<Cidr>,
    /// Upstream address.
    pub destination_ips: Vec<Cidr>,
    /// Upstream address, negated.
    pub not_destination_ips: Vec<Cidr>,
    /// Destination port after service → target translation.
    pub destination_ports: Vec<u16>,
    /// Destination port, negated.
    pub not_destination_ports: Vec<u16>,
    /// Peer namespace and service account.
    pub service_accounts: Vec<ServiceAccountMatch>,
    /// Peer namespace and service account, negated.
    pub not_service_accounts: Vec<ServiceAccountMatch>,
}

/// A string comparison: `!Exact "v"`, `!Prefix "v"`, `!Suffix "v"`, or
/// `Presence` (also `!Presence null`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub enum StringMatch {
    /// Equal to.
    Exact(String),
    /// Starts with.
    Prefix(String),
    /// Ends with.
    Suffix(String),
    /// Present and non-empty.
    Presence,
}

/// A namespace and service account, trust domain ignored.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ServiceAccountMatch {
    /// Namespace.
    pub namespace: String,
    /// Service account.
    pub service_account: String,
}

/// An address block: `"<ip>/<length>"`, or a bare IP for one host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    /// The address as written (host bits are not cleared: the proxy does).
    pub address: IpAddr,
    /// Prefix length, at most 32 for IPv4 and 128 for IPv6.
    pub prefix_len: u8,
}

impl FromStr for Cidr {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (ip, length) = match text.split_once('/') {
            Some((ip, length)) => (ip, Some(length)),
            None => (text, None),
        };
        let address = ip
            .parse::<IpAddr>()
            .map_err(|_| format!("invalid IP address {ip:?} in {text:?}"))?;
        let max = if address.is_ipv4() { 32 } else { 128 };
        let prefix_len = match length {
            None => max,
            Some(length) => length
                .parse::<u8>()
                .ok()
                .filter(|length| *length <= max)
                .ok_or_else(|| format!("invalid prefix length in {text:?}: at most {max}"))?,
        };
        Ok(Cidr {
            address,
            prefix_len,
        })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.address, self.prefix_len)
    }
}

impl<'de> Deserialize<'de> for Cidr {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        text_value(deserializer, "a CIDR \"<ip>/<length>\" or an IP")
    }
}
