//! L4 authorization (WIRE.md §9): typed policies and how one connection is
//! matched against them.
//!
//! These types are the one form of a policy in the proxy: xDS converts into
//! them, the local config file is read straight into them and
//! `/config_dump` writes them. Their serde is derived here, in camelCase;
//! what a derive cannot say (a string match, which the two spell
//! differently) is `rbac/form.rs`.
//!
//! The decision over a set of policies is `rbac/authorize.rs`; conversion
//! from `istio.security.Authorization` is `rbac/proto.rs`. Policies are
//! stored and indexed in `state.rs`. All matching is exact string
//! comparison, never regex.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::cidr::Cidr;

mod authorize;
mod form;
mod proto;

pub use authorize::{
    Connection, Decision, DenyReason, DryRunMatch, PolicyName, Verdict, authorize,
};

/// Why an `Authorization` resource is rejected. The messages are those a NACK
/// carries (WIRE.md §7).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// `scope` holds a value this proxy does not know.
    #[error("decode error: {0}")]
    UnknownScope(prost::UnknownEnumValue),
    /// `action` holds a value this proxy does not know.
    #[error("decode error: {0}")]
    UnknownAction(prost::UnknownEnumValue),
}

/// One authorization policy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Policy {
    /// Policy name, printed in denials.
    #[serde(with = "form::arc_str")]
    pub name: Arc<str>,
    /// Policy namespace: printed in denials, and the namespace a NAMESPACE
    /// policy applies to.
    #[serde(with = "form::arc_str")]
    pub namespace: Arc<str>,
    /// Which destination workloads it applies to.
    pub scope: Scope,
    /// What a match does.
    pub action: Action,
    /// Evaluate and log only; never changes the decision.
    #[serde(default)]
    pub dry_run: bool,
    /// OR-ed; a policy with no rules never matches. Written three lists
    /// deep: rules, their clauses, their matches.
    #[serde(default)]
    pub rules: Vec<Rule>,
}

impl Policy {
    /// Whether any rule matches the connection.
    pub fn matches(&self, connection: &Connection) -> bool {
        let peer = Peer::of(connection);
        self.rules
            .iter()
            .any(|rule| rule.matches(connection, &peer))
    }

    /// `namespace/name`, as denials print it.
    pub fn policy_name(&self) -> PolicyName {
        PolicyName {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        }
    }
}

/// Which destination workloads a policy applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Scope {
    /// Every workload, whatever the policy's namespace.
    Global,
    /// Workloads in the policy's namespace.
    Namespace,
    /// Workloads that list the policy in `authorization_policies`.
    WorkloadSelector,
}

/// What a matching policy does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Action {
    /// Permit the connection.
    Allow,
    /// Refuse the connection.
    Deny,
}

/// AND of clauses; a rule with no clauses matches every connection.
/// Written as the list of its clauses.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Rule {
    /// All must match.
    pub clauses: Vec<Clause>,
}

impl Rule {
    fn matches(&self, connection: &Connection, peer: &Peer<'_>) -> bool {
        self.clauses
            .iter()
            .all(|clause| clause.matches(connection, peer))
    }
}

/// OR of matches; a clause with no matches counts as matched. Written as
/// the list of its matches.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Clause {
    /// Any must match. Empty ones are skipped, not counted as matched.
    pub matches: Vec<Match>,
}

impl Clause {
    fn matches(&self, connection: &Connection, peer: &Peer<'_>) -> bool {
        self.matches.is_empty()
            || self
                .matches
                .iter()
                .filter(|m| !m.is_empty())
                .any(|m| m.matches(connection, peer))
    }
}

/// Conditions on one connection. Each kind (namespaces, principals, IPs,
/// ports, service accounts) passes when its positive list is empty or has a
/// hit, and its negative list is empty or has no hit; all kinds must pass.
///
/// A list left out of the local config file is empty, and `/config_dump`
/// leaves empty lists out, as istio/ztunnel's does.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct Match {
    /// Namespace of the peer identity.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<StringMatch>,
    /// Negated `namespaces`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_namespaces: Vec<StringMatch>,
    /// Peer identity without `spiffe://`, e.g. `cluster.local/ns/a/sa/b`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub principals: Vec<StringMatch>,
    /// Negated `principals`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_principals: Vec<StringMatch>,
    /// Client IP.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub source_ips: Vec<Cidr>,
    /// Negated `source_ips`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_source_ips: Vec<Cidr>,
    /// Upstream (destination workload) IP.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub destination_ips: Vec<Cidr>,
    /// Negated `destination_ips`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_destination_ips: Vec<Cidr>,
    /// Destination port after service → target translation.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub destination_ports: Vec<u16>,
    /// Negated `destination_ports`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_destination_ports: Vec<u16>,
    /// Peer namespace and service account, trust domain ignored.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub service_accounts: Vec<ServiceAccountMatch>,
    /// Negated `service_accounts`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_service_accounts: Vec<ServiceAccountMatch>,
}

impl Match {
    /// Every list is empty: the match says nothing and is skipped.
    pub fn is_empty(&self) -> bool {
        self.namespaces.is_empty()
            && self.not_namespaces.is_empty()
            && self.principals.is_empty()
            && self.not_principals.is_empty()
            && self.source_ips.is_empty()
            && self.not_source_ips.is_empty()
            && self.destination_ips.is_empty()
            && self.not_destination_ips.is_empty()
            && self.destination_ports.is_empty()
            && self.not_destination_ports.is_empty()
            && self.service_accounts.is_empty()
            && self.not_service_accounts.is_empty()
    }

    fn matches(&self, connection: &Connection, peer: &Peer<'_>) -> bool {
        let namespace_hit = |m: &StringMatch| m.matches(peer.namespace);
        let principal_hit = |m: &StringMatch| peer.principal.is_some_and(|p| m.matches(p));
        let source_hit = |cidr: &Cidr| cidr.contains(connection.source_ip);
        let destination_hit = |cidr: &Cidr| cidr.contains(connection.destination_ip);
        let port_hit = |port: &u16| *port == connection.destination_port;
        let account_hit = |m: &ServiceAccountMatch| m.matches(connection);
        passes(&self.namespaces, &self.not_namespaces, namespace_hit)
            && passes(&self.principals, &self.not_principals, principal_hit)
            && passes(&self.source_ips, &self.not_source_ips, source_hit)
            && passes(
                &self.destination_ips,
                &self.not_destination_ips,
                destination_hit,
            )
            && passes(
                &self.destination_ports,
                &self.not_destination_ports,
                port_hit,
            )
            && passes(
                &self.service_accounts,
                &self.not_service_accounts,
                account_hit,
            )
    }
}

/// One kind of a match: (no positives or a positive hit) and no negative hit.
fn passes<T>(positive: &[T], negative: &[T], hit: impl Fn(&T) -> bool) -> bool {
    (positive.is_empty() || positive.iter().any(&hit)) && !negative.iter().any(hit)
}

/// The peer's identity in the forms matches compare against, computed once
/// per policy evaluation.
struct Peer<'a> {
    /// Identity without `spiffe://`; `None` without identity, so principals never hit.
    principal: Option<&'a str>,
    /// Identity namespace; empty without identity.
    namespace: &'a str,
}

impl<'a> Peer<'a> {
    fn of(connection: &'a Connection) -> Self {
        match &connection.source_identity {
            Some(identity) => Peer {
                principal: identity.as_str().strip_prefix("spiffe://"),
                namespace: identity.namespace(),
            },
            None => Peer {
                principal: None,
                namespace: "",
            },
        }
    }
}

/// A string condition. There are no regexes. Its serde is written by hand
/// in `rbac/form.rs`: the local config file and `/config_dump` spell
/// `Presence` differently.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum StringMatch {
    /// Equal to the value.
    Exact(Arc<str>),
    /// Starts with the value.
    Prefix(Arc<str>),
    /// Ends with the value.
    Suffix(Arc<str>),
    /// Not empty.
    Presence,
}

impl StringMatch {
    /// Whether `value` satisfies the condition.
    pub fn matches(&self, value: &str) -> bool {
        match self {
            StringMatch::Exact(exact) => value == &**exact,
            StringMatch::Prefix(prefix) => value.starts_with(&**prefix),
            StringMatch::Suffix(suffix) => value.ends_with(&**suffix),
            StringMatch::Presence => !value.is_empty(),
        }
    }
}

/// A peer's namespace and service account, whatever its trust domain.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ServiceAccountMatch {
    /// Namespace, compared exactly.
    #[serde(with = "form::arc_str")]
    pub namespace: Arc<str>,
    /// Service account, compared exactly.
    #[serde(with = "form::arc_str")]
    pub service_account: Arc<str>,
}

impl ServiceAccountMatch {
    /// Hits only a connection with a peer identity of this namespace and SA.
    fn matches(&self, connection: &Connection) -> bool {
        connection.source_identity.as_ref().is_some_and(|identity| {
            identity.namespace() == &*self.namespace
                && identity.service_account() == &*self.service_account
        })
    }
}

#[cfg(test)]
impl Policy {
    /// An enforced ALLOW policy with no rules, for tests to adjust.
    pub(crate) fn for_test(namespace: &str, name: &str, scope: Scope) -> Self {
        Policy {
            name: name.into(),
            namespace: namespace.into(),
            scope,
            action: Action::Allow,
            dry_run: false,
            rules: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests;
