//! The authorization table: each case is a caller, a request, and the
//! identity or denial it must get.

use super::*;
use ztunnel_mesh::{Pod, PodPhase};

const TD: &str = "cluster.local";

/// Name, caller, requested identity, and the identity or denial label expected.
type Case = (
    &'static str,
    Caller,
    Option<&'static str>,
    Result<Identity, &'static str>,
);

fn pod(
    namespace: &str,
    name: &str,
    uid: &str,
    sa: &str,
    node: Option<&str>,
    phase: PodPhase,
) -> Pod {
    Pod {
        name: name.into(),
        namespace: namespace.into(),
        uid: uid.into(),
        service_account: sa.into(),
        node_name: node.map(Into::into),
        phase,
        ..Pod::default()
    }
}

fn registry() -> MeshSnapshot {
    use PodPhase::*;
    MeshSnapshot::from_pods(vec![
        pod(
            "istio-system",
            "ztunnel-a",
            "uid-za",
            "ztunnel",
            Some("node-a"),
            Running,
        ),
        pod(
            "istio-system",
            "ztunnel-u",
            "uid-zu",
            "ztunnel",
            None,
            Pending,
        ),
        pod(
            "default",
            "app-a",
            "uid-app-a",
            "app",
            Some("node-a"),
            Running,
        ),
        pod(
            "default",
            "pending-a",
            "uid-p",
            "pending",
            Some("node-a"),
            Pending,
        ),
        pod(
            "default",
            "done-a",
            "uid-d",
            "done",
            Some("node-a"),
            Succeeded,
        ),
        pod(
            "default",
            "failed-a",
            "uid-f",
            "failed",
            Some("node-a"),
            Failed,
        ),
        pod(
            "default",
            "other-b",
            "uid-ob",
            "other",
            Some("node-b"),
            Running,
        ),
    ])
    .unwrap()
}

fn ztunnel() -> Caller {
    Caller {
        namespace: "istio-system".into(),
        service_account: "ztunnel".into(),
        pod_name: "ztunnel-a".into(),
        pod_uid: "uid-za".into(),
        node_name: Some("node-a".into()),
        expires: None,
    }
}

fn app() -> Caller {
    Caller {
        namespace: "default".into(),
        service_account: "app".into(),
        pod_name: "app-a".into(),
        pod_uid: "uid-app-a".into(),
        node_name: None,
        expires: None,
    }
}

/// The token of a pod that has run to completion.
fn finished() -> Caller {
    Caller {
        service_account: "done".into(),
        pod_name: "done-a".into(),
        pod_uid: "uid-d".into(),
        ..app()
    }
}

fn trusted() -> Vec<NodeAgentAccount> {
    vec![DEFAULT_TRUSTED_NODE_ACCOUNT.parse().unwrap()]
}

fn id(uri: &str) -> Identity {
    uri.parse().unwrap()
}

#[test]
fn authorization_table() {
    let with = |f: fn(&mut Caller)| {
        let mut caller = ztunnel();
        f(&mut caller);
        caller
    };
    let app_id = "spiffe://cluster.local/ns/default/sa/app";
    let cases: Vec<Case> = vec![
        ("own identity", app(), None, Ok(id(app_id))),
        (
            "node agent own identity",
            ztunnel(),
            None,
            Ok(id("spiffe://cluster.local/ns/istio-system/sa/ztunnel")),
        ),
        (
            "own identity of a pod the registry does not have",
            with(|c| c.pod_name = "gone".into()),
            None,
            Err("caller_pod_not_found"),
        ),
        (
            "own identity of a pod replaced under its name",
            with(|c| c.pod_uid = "uid-old".into()),
            None,
            Err("caller_pod_uid_mismatch"),
        ),
        (
            "own identity of a finished pod",
            finished(),
            None,
            Err("caller_pod_not_live"),
        ),
        (
            "own identity of a pending pod",
            Caller {
                service_account: "pending".into(),
                pod_name: "pending-a".into(),
                pod_uid: "uid-p".into(),
                ..app()
            },
            None,
            Ok(id("spiffe://cluster.local/ns/default/sa/pending")),
        ),
        (
            "impersonate pod on node",
            ztunnel(),
            Some(app_id),
            Ok(id(app_id)),
        ),
        (
            "pending pod counts",
            ztunnel(),
            Some("spiffe://cluster.local/ns/default/sa/pending"),
            Ok(id("spiffe://cluster.local/ns/default/sa/pending")),
        ),
        (
            "a finished (succeeded) pod does not count",
            ztunnel(),
            Some("spiffe://cluster.local/ns/default/sa/done"),
            Err("no_pod_on_node"),
        ),
        (
            "no node claim is fine",
            with(|c| c.node_name = None),
            Some(app_id),
            Ok(id(app_id)),
        ),
        (
            "caller with bad namespace",
            with(|c| c.namespace = "a/b".into()),
            None,
            Err("invalid_caller_identity"),
        ),
        (
            "untrusted caller",
            app(),
            Some(app_id),
            Err("untrusted_caller"),
        ),
        (
            "trusted namespace, other sa",
            with(|c| c.service_account = "ztunnel2".into()),
            Some(app_id),
            Err("untrusted_caller"),
        ),
        (
            "unparsable identity",
            ztunnel(),
            Some("spiffe://cluster.local/ns/default"),
            Err("invalid_requested_identity"),
        ),
        (
            "not spiffe",
            ztunnel(),
            Some("https://cluster.local/ns/default/sa/app"),
            Err("invalid_requested_identity"),
        ),
        (
            "foreign trust domain",
            ztunnel(),
            Some("spiffe://evil.local/ns/default/sa/app"),
            Err("foreign_trust_domain"),
        ),
        (
            "caller pod unknown",
            with(|c| c.pod_name = "ztunnel-x".into()),
            Some(app_id),
            Err("caller_pod_not_found"),
        ),
        (
            "caller pod uid mismatch",
            with(|c| c.pod_uid = "uid-old".into()),
            Some(app_id),
            Err("caller_pod_uid_mismatch"),
        ),
        (
            "caller pod unscheduled",
            with(|c| {
                c.pod_name = "ztunnel-u".into();
                c.pod_uid = "uid-zu".into();
                c.node_name = None;
            }),
            Some(app_id),
            Err("caller_pod_not_scheduled"),
        ),
        (
            "node claim disagrees",
            with(|c| c.node_name = Some("node-b".into())),
            Some(app_id),
            Err("node_claim_mismatch"),
        ),
        (
            "pod on another node",
            ztunnel(),
            Some("spiffe://cluster.local/ns/default/sa/other"),
            Err("no_pod_on_node"),
        ),
        (
            "failed pod does not count",
            ztunnel(),
            Some("spiffe://cluster.local/ns/default/sa/failed"),
            Err("no_pod_on_node"),
        ),
        (
            "no such identity",
            ztunnel(),
            Some("spiffe://cluster.local/ns/default/sa/nobody"),
            Err("no_pod_on_node"),
        ),
    ];
    let registry = registry();
    for (name, caller, impersonate, want) in cases {
        let got = authorize(&caller, impersonate, TD, &trusted(), &registry);
        match (got, want) {
            (Ok(got), Ok(want)) => assert_eq!(got, want, "{name}"),
            (Err(denial), Err(label)) => assert_eq!(denial.label(), label, "{name}: {denial}"),
            (got, want) => panic!("{name}: got {got:?}, want {want:?}"),
        }
    }
}

#[test]
fn caller_pod_service_account_must_match_the_registry() {
    let registry = MeshSnapshot::from_pods(vec![
        pod(
            "istio-system",
            "ztunnel-a",
            "uid-za",
            "default",
            Some("node-a"),
            PodPhase::Running,
        ),
        pod(
            "default",
            "app-a",
            "uid-app-a",
            "app",
            Some("node-a"),
            PodPhase::Running,
        ),
    ])
    .unwrap();
    let denial = authorize(
        &ztunnel(),
        Some("spiffe://cluster.local/ns/default/sa/app"),
        TD,
        &trusted(),
        &registry,
    )
    .unwrap_err();
    assert_eq!(denial, Denial::CallerPodServiceAccountMismatch);
}

#[test]
fn no_trusted_accounts_means_no_impersonation() {
    let denial = authorize(
        &ztunnel(),
        Some("spiffe://cluster.local/ns/default/sa/app"),
        TD,
        &[],
        &registry(),
    )
    .unwrap_err();
    assert_eq!(denial, Denial::UntrustedCaller);
}

#[test]
fn denial_messages_are_opaque_and_split_authn_from_impersonation() {
    assert_eq!(
        Denial::from(AuthnError::Expired).public_message(),
        "request authenticate failure"
    );
    assert_eq!(
        Denial::NoPodOnNode.public_message(),
        "request impersonation authentication failure"
    );
    assert_eq!(Denial::from(AuthnError::Expired).label(), "expired_token");
}

#[test]
fn node_agent_accounts_parse() {
    let account: NodeAgentAccount = "istio-system/ztunnel".parse().unwrap();
    assert_eq!(account.namespace, "istio-system");
    assert_eq!(account.to_string(), "istio-system/ztunnel");
    for bad in [
        "istio-system",
        "/ztunnel",
        "istio-system/",
        "a/b/c",
        "a b/c",
    ] {
        assert!(bad.parse::<NodeAgentAccount>().is_err(), "{bad}");
    }
}
