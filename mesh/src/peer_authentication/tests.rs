//! The PeerAuthentication tables: one case per line, each with the istiod
//! behaviour it mirrors (istio/istio
//! `pilot/pkg/serviceregistry/ambient/authorization.go`, functions
//! `convertedSelectorPeerAuthentications` and `convertPeerAuthentication`,
//! and the steps of `TestAmbientIndex_Policy` in `ambientindex_test.go`).

use super::*;
use crate::Pod;

use MtlsMode::{Disable, Permissive, Strict, Unset};

const ROOT: &str = "istio-system";
const STATIC: &str = "istio-system/istio_converted_static_strict";
const CONVERTED: &str = "shop/converted_peer_authentication_w";

/// Rules → clauses → matches, as `Policy::rules`.
type Rules = Vec<Vec<Vec<PolicyMatch>>>;

fn peer(
    namespace: &str,
    name: &str,
    selector: Option<&[(&str, &str)]>,
    mode: MtlsMode,
    ports: &[(u16, MtlsMode)],
) -> PeerAuthentication {
    PeerAuthentication {
        name: name.to_owned(),
        namespace: namespace.to_owned(),
        selector: selector.map(|labels| {
            labels
                .iter()
                .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
                .collect()
        }),
        mode,
        port_level_mtls: ports.iter().copied().collect(),
    }
}

/// Mesh-wide: the root namespace, no selector.
fn mesh(mode: MtlsMode) -> PeerAuthentication {
    peer(ROOT, "mesh", None, mode, &[])
}

/// Namespace-wide in `shop`.
fn namespace_wide(mode: MtlsMode) -> PeerAuthentication {
    peer("shop", "ns", None, mode, &[])
}

/// `w`, picking `app=web` pods of `shop`.
fn workload(mode: MtlsMode, ports: &[(u16, MtlsMode)]) -> PeerAuthentication {
    peer("shop", "w", Some(&[("app", "web")]), mode, ports)
}

fn web() -> Labels {
    Labels::from([("app".to_owned(), "web".to_owned())])
}

/// A pod labelled `app=web` in `namespace`.
fn web_pod(namespace: &str) -> Pod {
    Pod {
        name: "web-1".to_owned(),
        namespace: namespace.to_owned(),
        labels: web(),
        ..Pod::default()
    }
}

/// Plaintext to any port.
fn plaintext() -> PolicyMatch {
    without_identity()
}

/// Plaintext to `port`.
fn plaintext_to(port: u16) -> PolicyMatch {
    PolicyMatch {
        destination_ports: vec![port],
        ..without_identity()
    }
}

/// Any port but `port`.
fn not_port(port: u16) -> PolicyMatch {
    PolicyMatch {
        not_destination_ports: vec![port],
        ..PolicyMatch::default()
    }
}

#[test]
fn peer_auth_workload_policies_follow_the_effective_mode() {
    // (case, PeerAuthentications oldest first, pod namespace, names listed)
    let cases: [(&str, Vec<PeerAuthentication>, &str, &[&str]); 24] = [
        (
            "no PeerAuthentication: nothing to list",
            vec![],
            "shop",
            &[],
        ),
        (
            "mesh STRICT: the static policy (meshCfg)",
            vec![mesh(Strict)],
            "shop",
            &[STATIC],
        ),
        (
            "mesh PERMISSIVE: nothing",
            vec![mesh(Permissive)],
            "shop",
            &[],
        ),
        (
            "namespace PERMISSIVE overrides mesh STRICT",
            vec![mesh(Strict), namespace_wide(Permissive)],
            "shop",
            &[],
        ),
        (
            "namespace UNSET inherits mesh STRICT (isMtlsModeUnset)",
            vec![mesh(Strict), namespace_wide(Unset)],
            "shop",
            &[STATIC],
        ),
        (
            "namespace STRICT under mesh PERMISSIVE (test: 'effective mode is STRICT')",
            vec![mesh(Permissive), namespace_wide(Strict)],
            "shop",
            &[STATIC],
        ),
        (
            "namespace DISABLE: not STRICT",
            vec![namespace_wide(Disable)],
            "shop",
            &[],
        ),
        (
            "another namespace's STRICT does not apply",
            vec![namespace_wide(Strict)],
            "bank",
            &[],
        ),
        (
            "workload STRICT under namespace STRICT: no change (test: 'expect no event')",
            vec![namespace_wide(Strict), workload(Strict, &[])],
            "shop",
            &[STATIC],
        ),
        (
            "workload PERMISSIVE under namespace STRICT: removed (test: 'static policy should be removed')",
            vec![namespace_wide(Strict), workload(Permissive, &[])],
            "shop",
            &[],
        ),
        (
            "workload PERMISSIVE with a STRICT port: its own policy (test: 'added back')",
            vec![
                namespace_wide(Strict),
                workload(Permissive, &[(9090, Strict)]),
            ],
            "shop",
            &[CONVERTED],
        ),
        (
            "workload DISABLE with a STRICT port: its own policy (foundStrict)",
            vec![workload(Disable, &[(9090, Strict)])],
            "shop",
            &[CONVERTED],
        ),
        (
            "workload PERMISSIVE with a PERMISSIVE port: nothing",
            vec![
                namespace_wide(Strict),
                workload(Permissive, &[(9090, Permissive)]),
            ],
            "shop",
            &[],
        ),
        (
            "workload STRICT under namespace PERMISSIVE (test: 'set policy')",
            vec![namespace_wide(Permissive), workload(Strict, &[])],
            "shop",
            &[STATIC],
        ),
        (
            "workload STRICT with a PERMISSIVE port: its own policy only (foundPermissive)",
            vec![
                namespace_wide(Permissive),
                workload(Strict, &[(9090, Permissive)]),
            ],
            "shop",
            &[CONVERTED],
        ),
        (
            "workload STRICT with a DISABLE port: its own policy only",
            vec![workload(Strict, &[(9090, Disable)])],
            "shop",
            &[CONVERTED],
        ),
        (
            "workload STRICT with every port STRICT: the static policy",
            vec![workload(Strict, &[(9090, Strict)])],
            "shop",
            &[STATIC],
        ),
        (
            "workload UNSET, STRICT port, namespace PERMISSIVE: its own (test: 'still be added')",
            vec![
                namespace_wide(Permissive),
                workload(Unset, &[(9090, Strict)]),
            ],
            "shop",
            &[CONVERTED],
        ),
        (
            "workload UNSET, PERMISSIVE port, namespace STRICT: its own, no static (test: 'in-line')",
            vec![
                namespace_wide(Strict),
                workload(Unset, &[(9090, Permissive)]),
            ],
            "shop",
            &[CONVERTED],
        ),
        (
            "workload UNSET, DISABLE port, namespace STRICT: static only (UNSET branch looks for PERMISSIVE)",
            vec![namespace_wide(Strict), workload(Unset, &[(9090, Disable)])],
            "shop",
            &[STATIC],
        ),
        (
            "a pod the selector does not pick keeps the namespace's (test: 'pod not in selector')",
            vec![
                namespace_wide(Strict),
                peer("shop", "w", Some(&[("app", "db")]), Permissive, &[]),
            ],
            "shop",
            &[STATIC],
        ),
        (
            "a selector in the root namespace is not read (test: 'nothing should happen')",
            vec![peer(ROOT, "w", Some(&[("app", "web")]), Strict, &[])],
            "shop",
            &[],
        ),
        (
            "the oldest namespace policy wins (getOldestPeerAuthn)",
            vec![
                namespace_wide(Strict),
                peer("shop", "newer", None, Permissive, &[]),
            ],
            "shop",
            &[STATIC],
        ),
        (
            "the oldest workload policy wins",
            vec![
                workload(Permissive, &[]),
                peer("shop", "newer", Some(&[("app", "web")]), Strict, &[]),
            ],
            "shop",
            &[],
        ),
    ];
    for (case, peer_authentications, namespace, expected) in cases {
        let names = workload_policies(
            &peer_authentications,
            ROOT,
            namespace,
            &web_pod(namespace).labels,
        );
        assert_eq!(names, expected, "{case}");
    }
}

#[test]
fn peer_auth_levels_depend_on_the_root_namespace() {
    // (case, PeerAuthentications, pod namespace, names listed)
    let cases: [(&str, Vec<PeerAuthentication>, &str, &[&str]); 4] = [
        (
            "a pod of the root namespace takes the mesh's mode",
            vec![mesh(Strict)],
            ROOT,
            &[STATIC],
        ),
        (
            "the root namespace's workload policies are not read for its pods",
            vec![
                mesh(Strict),
                peer(ROOT, "w", Some(&[("app", "web")]), Permissive, &[]),
            ],
            ROOT,
            &[STATIC],
        ),
        (
            "a selector without labels is namespace-wide",
            vec![
                mesh(Strict),
                peer("shop", "empty", Some(&[]), Permissive, &[]),
            ],
            "shop",
            &[],
        ),
        (
            "a selector without labels in the root namespace is not mesh-wide",
            vec![peer(ROOT, "empty", Some(&[]), Strict, &[])],
            "shop",
            &[],
        ),
    ];
    for (case, peer_authentications, namespace, expected) in cases {
        let names = workload_policies(
            &peer_authentications,
            ROOT,
            namespace,
            &web_pod(namespace).labels,
        );
        assert_eq!(names, expected, "{case}");
    }
    let names = workload_policies(
        &[peer("mesh-root", "mesh", None, Strict, &[])],
        "mesh-root",
        "shop",
        &web_pod("shop").labels,
    );
    assert_eq!(
        names,
        ["mesh-root/istio_converted_static_strict"],
        "the static policy lives in the configured root namespace"
    );
}

#[test]
fn peer_auth_converted_rules_mirror_istiod() {
    // (case, PeerAuthentications oldest first, rules of `w`'s converted policy)
    let cases: [(&str, Vec<PeerAuthentication>, Option<Rules>); 22] = [
        (
            "no port modes: none (case #3)",
            vec![workload(Permissive, &[])],
            None,
        ),
        (
            "namespace-wide with port modes: none (case #1)",
            vec![peer("shop", "w", None, Strict, &[(9090, Permissive)])],
            None,
        ),
        (
            "root-namespace selector: none (case #2)",
            vec![peer(
                ROOT,
                "w",
                Some(&[("app", "web")]),
                Strict,
                &[(9090, Permissive)],
            )],
            None,
        ),
        (
            "STRICT, every port STRICT: none, the static policy serves",
            vec![workload(Strict, &[(9090, Strict)])],
            None,
        ),
        (
            "STRICT, PERMISSIVE port: plaintext refused but on that port",
            vec![workload(Strict, &[(9090, Permissive)])],
            Some(vec![vec![vec![plaintext()], vec![not_port(9090)]]]),
        ),
        (
            "STRICT, DISABLE port: as PERMISSIVE",
            vec![workload(Strict, &[(9090, Disable)])],
            Some(vec![vec![vec![plaintext()], vec![not_port(9090)]]]),
        ),
        (
            "STRICT, PERMISSIVE port, namespace STRICT: the strict clause again (shouldMergeStrict)",
            vec![
                namespace_wide(Strict),
                workload(Strict, &[(9090, Permissive)]),
            ],
            Some(vec![vec![
                vec![plaintext()],
                vec![not_port(9090)],
                vec![plaintext()],
            ]]),
        ),
        (
            "STRICT, a STRICT and a DISABLE port: the STRICT one is the default",
            vec![workload(Strict, &[(8080, Strict), (9090, Disable)])],
            Some(vec![vec![vec![plaintext()], vec![not_port(9090)]]]),
        ),
        (
            "PERMISSIVE, STRICT port: plaintext to that port refused",
            vec![workload(Permissive, &[(9090, Strict)])],
            Some(vec![vec![vec![plaintext_to(9090)]]]),
        ),
        (
            "DISABLE, STRICT port: as PERMISSIVE",
            vec![workload(Disable, &[(9090, Strict)])],
            Some(vec![vec![vec![plaintext_to(9090)]]]),
        ),
        (
            "PERMISSIVE, two STRICT ports: one rule each, port order (maps.SeqStable)",
            vec![workload(Permissive, &[(9090, Strict), (8080, Strict)])],
            Some(vec![
                vec![vec![plaintext_to(8080)]],
                vec![vec![plaintext_to(9090)]],
            ]),
        ),
        (
            "PERMISSIVE, PERMISSIVE port: none",
            vec![workload(Permissive, &[(9090, Permissive)])],
            None,
        ),
        (
            "UNSET, STRICT port, namespace PERMISSIVE: that port",
            vec![
                namespace_wide(Permissive),
                workload(Unset, &[(9090, Strict)]),
            ],
            Some(vec![vec![vec![plaintext_to(9090)]]]),
        ),
        (
            "UNSET, STRICT port, no parent: that port",
            vec![workload(Unset, &[(9090, Strict)])],
            Some(vec![vec![vec![plaintext_to(9090)]]]),
        ),
        (
            "UNSET, STRICT port, namespace STRICT: none, inherited (#2)",
            vec![namespace_wide(Strict), workload(Unset, &[(9090, Strict)])],
            None,
        ),
        (
            "UNSET, STRICT port, mesh STRICT: none, inherited (#3)",
            vec![mesh(Strict), workload(Unset, &[(9090, Strict)])],
            None,
        ),
        (
            "UNSET, PERMISSIVE port, namespace STRICT: the exception with the strict part merged",
            vec![
                namespace_wide(Strict),
                workload(Unset, &[(9090, Permissive)]),
            ],
            Some(vec![vec![vec![not_port(9090)], vec![plaintext()]]]),
        ),
        (
            "UNSET, PERMISSIVE port, mesh STRICT: as namespace STRICT",
            vec![mesh(Strict), workload(Unset, &[(9090, Permissive)])],
            Some(vec![vec![vec![not_port(9090)], vec![plaintext()]]]),
        ),
        (
            "UNSET, PERMISSIVE port, namespace PERMISSIVE over mesh STRICT: none",
            vec![
                mesh(Strict),
                namespace_wide(Permissive),
                workload(Unset, &[(9090, Permissive)]),
            ],
            None,
        ),
        (
            "UNSET, DISABLE port, namespace STRICT: sent though not listed (as istiod)",
            vec![namespace_wide(Strict), workload(Unset, &[(9090, Disable)])],
            Some(vec![vec![vec![not_port(9090)], vec![plaintext()]]]),
        ),
        // Two rows where istiod leaves the workload listing a policy it
        // never sends (so no port is STRICT): the policy is sent here.
        (
            "differs: UNSET, PERMISSIVE port, namespace UNSET, mesh STRICT: inherited STRICT",
            vec![
                mesh(Strict),
                namespace_wide(Unset),
                workload(Unset, &[(9090, Permissive)]),
            ],
            Some(vec![vec![vec![not_port(9090)], vec![plaintext()]]]),
        ),
        (
            "differs: PERMISSIVE, STRICT port, mesh STRICT: the port stays STRICT",
            vec![mesh(Strict), workload(Permissive, &[(9090, Strict)])],
            Some(vec![vec![vec![plaintext_to(9090)]]]),
        ),
    ];
    for (case, peer_authentications, expected) in cases {
        let policies = converted_policies(&peer_authentications, ROOT);
        let rules = policies
            .iter()
            .find(|policy| policy.name == "converted_peer_authentication_w")
            .map(|policy| policy.rules.clone());
        assert_eq!(rules, expected, "{case}");
    }
}

#[test]
fn peer_auth_the_static_strict_policy_is_sent_once_any_exists() {
    assert_eq!(
        converted_policies(&[], ROOT),
        [],
        "none without PeerAuthentications (DefaultPolicy)"
    );
    let policies = converted_policies(&[namespace_wide(Disable)], ROOT);
    let expected = Policy {
        name: "istio_converted_static_strict".to_owned(),
        namespace: ROOT.to_owned(),
        scope: PolicyScope::WorkloadSelector,
        action: PolicyAction::Deny,
        dry_run: false,
        selector: None,
        all_namespaces: false,
        rules: vec![vec![vec![plaintext()]]],
    };
    assert_eq!(
        policies,
        [expected],
        "any PeerAuthentication, whatever its mode"
    );
}

#[test]
fn peer_auth_a_converted_policy_is_named_and_scoped_as_istiod_names_it() {
    let policies = converted_policies(&[workload(Strict, &[(9090, Permissive)])], ROOT);
    let converted = &policies[1];
    assert_eq!(converted.resource_name(), CONVERTED);
    assert_eq!(converted.scope, PolicyScope::WorkloadSelector);
    assert_eq!(converted.action, PolicyAction::Deny);
    assert_eq!(converted.selector, Some(web()));
}
