//! One PeerAuthentication of the mesh (the mTLS mode its workloads accept),
//! and what istiod makes of them for ztunnel, which has no notion of an
//! mTLS mode: DENY policies refusing peers without an identity (plaintext),
//! which a workload lists by name (KUBERNETES.md E10; istio/istio
//! `pilot/pkg/serviceregistry/ambient/authorization.go`).
//!
//! Which level a PeerAuthentication is at follows from where it is, as in
//! Kubernetes: without a selector in the root namespace it is mesh-wide,
//! without one elsewhere namespace-wide, with one it picks workloads of its
//! namespace (a selector in the root namespace is not read for ztunnel).
//! At each level the oldest applies; the list order is the age order.
//!
//! Both decisions are pure: [`converted_policies`] (the Authorization
//! resources) and [`workload_policies`] (the names a workload carries).
//! Reading them from Kubernetes is `kube/convert/peer_authentication.rs`'s;
//! putting them on the wire is the xDS server's.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::pod::{Labels, selects};
use super::policy::{Policy, PolicyAction, PolicyMatch, PolicyScope, StringMatch};

/// The name of the one policy every workload under an effective STRICT
/// mode lists. Its `_` cannot be in a Kubernetes name, so it meets no
/// user's policy.
pub const STATIC_STRICT_POLICY_NAME: &str = "istio_converted_static_strict";

/// What istiod puts before a PeerAuthentication's name to name the policy
/// converted from it (`_`, as above, keeps it apart from users' names).
pub const CONVERTED_POLICY_PREFIX: &str = "converted_peer_authentication_";

/// One PeerAuthentication, as the mesh file spells it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PeerAuthentication {
    /// Its name.
    pub name: String,
    /// Its namespace; the root namespace's apply to the mesh.
    pub namespace: String,
    /// The labels of the pods of its namespace it applies to; absent, every
    /// pod of its namespace (empty, the same outside the root namespace).
    #[serde(default)]
    pub selector: Option<Labels>,
    /// The mode of every port not in `port_level_mtls`.
    #[serde(default)]
    pub mode: MtlsMode,
    /// Modes of single ports (target ports, as the pod listens), which
    /// istiod honours only on a PeerAuthentication with a selector.
    #[serde(default)]
    pub port_level_mtls: BTreeMap<u16, MtlsMode>,
}

impl PeerAuthentication {
    /// The selector's labels, if it picks workloads rather than a whole
    /// namespace: istiod reads a selector without labels as none.
    fn workload_labels(&self) -> Option<&Labels> {
        self.selector.as_ref().filter(|labels| !labels.is_empty())
    }

    /// The level it applies at, under this root namespace.
    fn level(&self, root_namespace: &str) -> Level {
        // In the root namespace istiod reads only a PeerAuthentication
        // without a selector at all; elsewhere, one without labels as one
        // without a selector.
        match (self.namespace == root_namespace, self.workload_labels()) {
            (true, _) if self.selector.is_some() => Level::Unread,
            (true, _) => Level::Mesh,
            (false, None) => Level::Namespace,
            (false, Some(_)) => Level::Workload,
        }
    }

    /// The name of the policy converted from it.
    pub fn converted_name(&self) -> String {
        format!("{CONVERTED_POLICY_PREFIX}{}", self.name)
    }
}

/// `mtls.mode`, and each mode of `portLevelMtls`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum MtlsMode {
    /// Inherit the mode of the level above (the mesh's default: PERMISSIVE).
    #[default]
    Unset,
    /// No mTLS asked of peers; for ztunnel, the same as PERMISSIVE.
    Disable,
    /// mTLS and plaintext.
    Permissive,
    /// mTLS only: plaintext is refused.
    Strict,
}

/// Where a PeerAuthentication applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Level {
    Mesh,
    Namespace,
    Workload,
    /// A selector in the root namespace, even without labels: istiod does
    /// not read it for ztunnel, though it counts as one that exists.
    Unread,
}

/// The policies the PeerAuthentications make, static STRICT one first:
/// none when there are no PeerAuthentications at all; else the static
/// STRICT one, in the root namespace, and one per workload
/// PeerAuthentication whose port modes need their own.
pub(crate) fn converted_policies(
    peer_authentications: &[PeerAuthentication],
    root_namespace: &str,
) -> Vec<Policy> {
    if peer_authentications.is_empty() {
        return Vec::new();
    }
    let mut policies = vec![deny_policy(
        STATIC_STRICT_POLICY_NAME,
        root_namespace,
        None,
        vec![vec![vec![without_identity()]]],
    )];
    let mesh = oldest(peer_authentications, root_namespace, Level::Mesh, None);
    for peer_authentication in peer_authentications {
        if peer_authentication.level(root_namespace) != Level::Workload {
            continue;
        }
        let namespace = &peer_authentication.namespace;
        let namespace_wide = oldest(
            peer_authentications,
            root_namespace,
            Level::Namespace,
            Some(namespace),
        );
        let parent_strict = parent_strict(namespace_wide, mesh);
        policies.extend(converted(peer_authentication, parent_strict));
    }
    policies
}

/// The names (`<namespace>/<name>`, sorted) of the converted policies
/// a workload of `namespace` with these `labels` lists: the static STRICT one when its effective mode
/// is STRICT on every port, its PeerAuthentication's own converted policy
/// when a port differs from the rest.
pub(crate) fn workload_policies(
    peer_authentications: &[PeerAuthentication],
    root_namespace: &str,
    namespace: &str,
    labels: &Labels,
) -> Vec<String> {
    let mesh = oldest(peer_authentications, root_namespace, Level::Mesh, None);
    let namespace_wide = oldest(
        peer_authentications,
        root_namespace,
        Level::Namespace,
        Some(namespace),
    );
    let workload = peer_authentications.iter().find(|candidate| {
        candidate.namespace == namespace
            && candidate.level(root_namespace) == Level::Workload
            && candidate
                .workload_labels()
                .is_some_and(|selector| selects(selector, labels))
    });
    let parent_strict = parent_strict(namespace_wide, mesh);
    let (strict, own) = match workload {
        None => (parent_strict, false),
        Some(workload) => effective(workload, parent_strict),
    };
    let mut names = Vec::with_capacity(2);
    if strict {
        names.push(format!("{root_namespace}/{STATIC_STRICT_POLICY_NAME}"));
    }
    if let Some(workload) = workload.filter(|_| own) {
        names.push(format!("{namespace}/{}", workload.converted_name()));
    }
    names.sort_unstable();
    names
}

/// For a workload's own PeerAuthentication under a parent that is (or not)
/// STRICT: whether the static STRICT policy applies to it, and whether its
/// converted policy does. A port mode that differs from the workload's
/// makes it carry its converted policy, which then holds the STRICT part
/// too (ztunnel refuses what any DENY policy matches, so an exception can
/// not sit beside the static policy).
fn effective(workload: &PeerAuthentication, parent_strict: bool) -> (bool, bool) {
    let ports = || workload.port_level_mtls.values();
    let any_port = |modes: &[MtlsMode]| ports().any(|mode| modes.contains(mode));
    match workload.mode {
        MtlsMode::Strict => {
            let own = any_port(&[MtlsMode::Permissive, MtlsMode::Disable]);
            (!own, own)
        }
        MtlsMode::Permissive | MtlsMode::Disable => (false, any_port(&[MtlsMode::Strict])),
        // Only a PERMISSIVE port breaks an inherited STRICT: istiod reads
        // DISABLE here as no exception, and the port stays STRICT.
        MtlsMode::Unset if parent_strict => {
            let own = any_port(&[MtlsMode::Permissive]);
            (!own, own)
        }
        MtlsMode::Unset => (false, any_port(&[MtlsMode::Strict])),
    }
}

/// The policy converted from a workload PeerAuthentication, if its ports
/// need one: a rule per STRICT port the parent does not already make
/// STRICT, and, when the workload is STRICT (itself or inherited), one
/// rule refusing plaintext except on its PERMISSIVE or DISABLE ports.
///
/// What is inherited is read as [`workload_policies`] reads it (a
/// namespace's UNSET passes the mesh's mode down). istiod's conversion
/// reads it otherwise in two cases (a PERMISSIVE or DISABLE workload with
/// a STRICT port under a STRICT mesh; an UNSET workload with a PERMISSIVE
/// port under an UNSET namespace and a STRICT mesh) and then sends no
/// policy for a workload that lists one, which leaves plaintext in where
/// STRICT was asked for; that is not copied.
fn converted(peer_authentication: &PeerAuthentication, parent_strict: bool) -> Option<Policy> {
    let mode = peer_authentication.mode;
    if peer_authentication.port_level_mtls.is_empty() {
        return None;
    }
    let strict_inherited = mode == MtlsMode::Unset && parent_strict;
    let mut clauses = Vec::new();
    if mode == MtlsMode::Strict {
        clauses.push(vec![without_identity()]);
    }
    let mut rules = Vec::new();
    let mut exempt = false;
    for (&port, &port_mode) in &peer_authentication.port_level_mtls {
        match port_mode {
            MtlsMode::Strict => {
                if mode == MtlsMode::Strict || strict_inherited {
                    continue;
                }
                rules.push(vec![vec![PolicyMatch {
                    destination_ports: vec![port],
                    ..without_identity()
                }]]);
            }
            MtlsMode::Permissive | MtlsMode::Disable => {
                if mode != MtlsMode::Strict && !strict_inherited {
                    continue;
                }
                exempt = true;
                // Clauses are AND-ed: a connection to this port fails this
                // one, so the rule does not refuse it.
                clauses.push(vec![PolicyMatch {
                    not_destination_ports: vec![port],
                    ..PolicyMatch::default()
                }]);
            }
            MtlsMode::Unset => {}
        }
    }
    if mode == MtlsMode::Strict && !exempt {
        // Every port STRICT: the static policy says it all.
        return None;
    }
    if clauses.is_empty() && rules.is_empty() {
        return None;
    }
    if parent_strict && exempt {
        clauses.push(vec![without_identity()]);
    }
    if !clauses.is_empty() {
        rules.push(clauses);
    }
    Some(deny_policy(
        &peer_authentication.converted_name(),
        &peer_authentication.namespace,
        peer_authentication.selector.clone(),
        rules,
    ))
}

/// The oldest PeerAuthentication at `level` (of `namespace`, if given).
fn oldest<'a>(
    peer_authentications: &'a [PeerAuthentication],
    root_namespace: &str,
    level: Level,
    namespace: Option<&str>,
) -> Option<&'a PeerAuthentication> {
    peer_authentications.iter().find(|candidate| {
        candidate.level(root_namespace) == level
            && namespace.is_none_or(|namespace| candidate.namespace == namespace)
    })
}

/// Whether what a workload inherits is STRICT: its namespace's mode if
/// set, else the mesh's.
fn parent_strict(
    namespace_wide: Option<&PeerAuthentication>,
    mesh: Option<&PeerAuthentication>,
) -> bool {
    let set =
        |peer_authentication: &&PeerAuthentication| peer_authentication.mode != MtlsMode::Unset;
    namespace_wide
        .filter(set)
        .or(mesh)
        .is_some_and(|peer_authentication| peer_authentication.mode == MtlsMode::Strict)
}

/// A peer without an identity: a plaintext connection.
fn without_identity() -> PolicyMatch {
    PolicyMatch {
        not_principals: vec![StringMatch::Presence],
        ..PolicyMatch::default()
    }
}

fn deny_policy(
    name: &str,
    namespace: &str,
    selector: Option<Labels>,
    rules: Vec<Vec<Vec<PolicyMatch>>>,
) -> Policy {
    Policy {
        name: name.to_owned(),
        namespace: namespace.to_owned(),
        scope: PolicyScope::WorkloadSelector,
        action: PolicyAction::Deny,
        dry_run: false,
        selector,
        all_namespaces: false,
        rules,
    }
}

#[cfg(test)]
mod tests;
