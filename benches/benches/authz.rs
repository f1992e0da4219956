#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // bench set-up: a panic is a failed run
//! L4 authorization of one inbound connection against a store of 10,000
//! policies: the per-connection cost the inbound path pays in
//! `inbound::decision::admit` once it has found the destination workload.
//!
//! Each iteration walks `State::applicable_policies` (the store's scope
//! indexes plus the workload's named policies) and runs `rbac::authorize`
//! over what it yields, for three outcomes: allowed, denied by a DENY
//! policy, and denied because no ALLOW policy matched; `allow_matching_only`
//! repeats the first over the policies collected beforehand, to split the
//! cost of the index walk from that of matching. Workload lookup is left
//! out; `lookup.rs` measures it.
//!
//! The policy mix is shaped like a large cluster's: almost every policy is
//! scoped to another namespace or selects other workloads, so the indexes
//! must keep them out of the walk; a few are global; a few are DENY or
//! dry-run. The destination sees 20 global, 10 namespace and 5 selected
//! policies, 35 in all.

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use ztunnel_certs::identity::Identity;
use ztunnel_proto::istio::workload as proto;
use ztunnel_proxy::cidr::Cidr;
use ztunnel_proxy::rbac::{
    Action, Clause, Connection, Decision, DenyReason, Match, Policy, Rule, Scope, StringMatch,
    Verdict, authorize,
};
use ztunnel_proxy::state::{DEFAULT_TRUST_DOMAIN, State, Workload};

/// Policies in the store: the scale of a large mesh, where a linear walk
/// would be noticed per connection.
const POLICIES: usize = 10_000;
/// Namespaces other than the destination's; with 10 namespace-scoped
/// policies each, half the store is namespace-scoped.
const OTHER_NAMESPACES: usize = 499;
/// Namespace-scoped policies per namespace, the destination's included.
const NAMESPACE_POLICIES: usize = 10;
/// Global policies: few in practice (mesh-wide deny lists, monitoring
/// access), but every connection evaluates all of them.
const GLOBAL_POLICIES: usize = 20;
/// Selector policies naming the destination workload: a workload usually
/// has a few of its own.
const SELECTED_POLICIES: usize = 5;

/// The destination workload's namespace.
const DESTINATION_NAMESPACE: &str = "payments";
/// The destination workload's uid.
const DESTINATION_UID: &str = "payments/ledger-0";
/// The port every connection asks for.
const DESTINATION_PORT: u16 = 8080;

fn exact(value: &str) -> StringMatch {
    StringMatch::Exact(value.into())
}

/// A policy of one rule whose clauses are each one match, AND-ed.
fn policy(
    namespace: &str,
    name: &str,
    scope: Scope,
    action: Action,
    clauses: Vec<Match>,
) -> Policy {
    Policy {
        name: name.into(),
        namespace: namespace.into(),
        scope,
        action,
        dry_run: false,
        rules: vec![Rule {
            clauses: clauses
                .into_iter()
                .map(|m| Clause { matches: vec![m] })
                .collect(),
        }],
    }
}

/// ALLOW from a list of principals, to a list of ports: the common policy.
fn allow_principals(
    namespace: &str,
    name: &str,
    scope: Scope,
    principals: &[String],
    ports: &[u16],
) -> Policy {
    let from = Match {
        principals: principals.iter().map(|p| exact(p)).collect(),
        ..Match::default()
    };
    let to = Match {
        destination_ports: ports.to_vec(),
        ..Match::default()
    };
    policy(namespace, name, scope, Action::Allow, vec![from, to])
}

/// The ten namespace-scoped policies of `namespace`: eight ALLOW from
/// namespaces that call it, one ALLOW for the monitoring scraper, and one
/// DENY of sandbox namespaces.
fn namespace_policies(namespace: &str) -> Vec<Policy> {
    let mut policies: Vec<Policy> = (0..NAMESPACE_POLICIES - 2)
        .map(|caller| {
            let from = Match {
                namespaces: vec![exact(&format!("caller-{caller}"))],
                ..Match::default()
            };
            let to = Match {
                destination_ports: vec![DESTINATION_PORT, 9090],
                ..Match::default()
            };
            let name = format!("allow-caller-{caller}");
            policy(
                namespace,
                &name,
                Scope::Namespace,
                Action::Allow,
                vec![from, to],
            )
        })
        .collect();
    let scraper = ["cluster.local/ns/monitoring/sa/prometheus".to_owned()];
    policies.push(allow_principals(
        namespace,
        "allow-metrics",
        Scope::Namespace,
        &scraper,
        &[15020],
    ));
    let sandboxes = Match {
        namespaces: vec![StringMatch::Prefix("sandbox-".into())],
        ..Match::default()
    };
    policies.push(policy(
        namespace,
        "deny-sandboxes",
        Scope::Namespace,
        Action::Deny,
        vec![sandboxes],
    ));
    policies
}

/// Mesh-wide policies: ALLOW for platform callers, DENY of quarantined
/// namespaces, and dry-run DENY of address ranges being phased out.
fn global_policies() -> Vec<Policy> {
    let mut policies = Vec::with_capacity(GLOBAL_POLICIES);
    for index in 0..12 {
        let principal = [format!("cluster.local/ns/platform/sa/agent-{index}")];
        let name = format!("allow-platform-{index}");
        policies.push(allow_principals(
            "istio-system",
            &name,
            Scope::Global,
            &principal,
            &[15020, 15021],
        ));
    }
    for index in 0..4 {
        let quarantined = Match {
            namespaces: vec![exact(&format!("quarantine-{index}"))],
            ..Match::default()
        };
        let name = format!("deny-quarantine-{index}");
        policies.push(policy(
            "istio-system",
            &name,
            Scope::Global,
            Action::Deny,
            vec![quarantined],
        ));
    }
    for index in 0..4u8 {
        let range = IpAddr::V4(Ipv4Addr::new(192, 168, index, 0));
        let legacy = Match {
            source_ips: vec![Cidr::new(range, 24).unwrap()],
            ..Match::default()
        };
        let name = format!("deny-legacy-{index}");
        let mut dry_run = policy(
            "istio-system",
            &name,
            Scope::Global,
            Action::Deny,
            vec![legacy],
        );
        dry_run.dry_run = true;
        policies.push(dry_run);
    }
    policies
}

/// The store: every policy under its `namespace/name` resource name.
fn policies() -> Vec<(Arc<str>, Policy)> {
    let mut policies = global_policies();
    policies.extend(namespace_policies(DESTINATION_NAMESPACE));
    for namespace in 0..OTHER_NAMESPACES {
        policies.extend(namespace_policies(&format!("team-{namespace:03}")));
    }
    for index in 0..SELECTED_POLICIES {
        let principal = [format!("cluster.local/ns/frontend/sa/web-{index}")];
        let name = format!("ledger-allow-{index}");
        policies.push(allow_principals(
            DESTINATION_NAMESPACE,
            &name,
            Scope::WorkloadSelector,
            &principal,
            &[DESTINATION_PORT],
        ));
    }
    // The rest select workloads in other namespaces, three callers each.
    let mut index = 0;
    while policies.len() < POLICIES {
        let namespace = format!("team-{:03}", index % OTHER_NAMESPACES);
        let callers: Vec<String> = (0..3)
            .map(|caller| format!("cluster.local/ns/team-{:03}/sa/svc-{caller}", index % 97))
            .collect();
        let name = format!("select-{index}");
        policies.push(allow_principals(
            &namespace,
            &name,
            Scope::WorkloadSelector,
            &callers,
            &[DESTINATION_PORT],
        ));
        index += 1;
    }
    policies
        .into_iter()
        .map(|policy| {
            (
                format!("{}/{}", policy.namespace, policy.name).into(),
                policy,
            )
        })
        .collect()
}

/// The destination: an HBONE workload that names its five selector
/// policies, built through the xDS conversion as the proxy receives it.
fn destination() -> Workload {
    let workload = proto::Workload {
        uid: DESTINATION_UID.into(),
        name: "ledger-0".into(),
        namespace: DESTINATION_NAMESPACE.into(),
        addresses: vec![vec![10, 1, 0, 10]],
        tunnel_protocol: proto::TunnelProtocol::Hbone.into(),
        service_account: "ledger".into(),
        authorization_policies: (0..SELECTED_POLICIES)
            .map(|index| format!("{DESTINATION_NAMESPACE}/ledger-allow-{index}"))
            .collect(),
        ..proto::Workload::default()
    };
    Workload::try_from(&workload).unwrap()
}

/// A connection to the destination's port from `peer` (namespace, service account).
fn connection(workload: &Workload, peer: (&str, &str)) -> Connection {
    Connection {
        source_identity: Some(Identity::new(DEFAULT_TRUST_DOMAIN, peer.0, peer.1).unwrap()),
        source_ip: IpAddr::V4(Ipv4Addr::new(10, 2, 0, 7)),
        destination_ip: workload.addresses[0],
        destination_port: DESTINATION_PORT,
        destination_namespace: workload.namespace.clone(),
        destination_workload: workload.uid.clone(),
    }
}

fn decide(state: &State, workload: &Workload, connection: &Connection) -> Decision {
    authorize(connection, state.applicable_policies(workload))
}

fn authz(c: &mut Criterion) {
    let mut state = State::new();
    state.replace_all([destination()], [], policies());
    assert_eq!(state.policies().count(), POLICIES);
    let workload = Arc::clone(state.workload(DESTINATION_UID).unwrap());
    let evaluated = state.applicable_policies(&workload).count();
    assert_eq!(
        evaluated,
        GLOBAL_POLICIES + NAMESPACE_POLICIES + SELECTED_POLICIES
    );

    // Matched by the last selected policy, so the ALLOW search runs to the end.
    let allowed = connection(&workload, ("frontend", "web-4"));
    let denied = connection(&workload, ("sandbox-17", "default"));
    let not_allowed = connection(&workload, ("team-123", "svc-4"));
    assert_eq!(decide(&state, &workload, &allowed).verdict, Verdict::Allow);
    assert!(matches!(
        decide(&state, &workload, &denied).verdict,
        Verdict::Deny(DenyReason::ExplicitlyDenied(_))
    ));
    assert_eq!(
        decide(&state, &workload, &not_allowed).verdict,
        Verdict::Deny(DenyReason::NotAllowed)
    );

    let mut group = c.benchmark_group("authz");
    let cases = [
        ("allow", &allowed),
        ("deny_explicit", &denied),
        ("deny_not_allowed", &not_allowed),
    ];
    for (name, connection) in cases {
        group.bench_function(name, |b| {
            b.iter(|| decide(black_box(&state), &workload, black_box(connection)))
        });
    }
    // The matching alone, over the policies collected once: the rest of
    // `allow` is the walk of the indexes.
    let applicable: Vec<&Policy> = state.applicable_policies(&workload).collect();
    group.bench_function("allow_matching_only", |b| {
        b.iter(|| authorize(black_box(&allowed), applicable.iter().copied()))
    });
    group.finish();
}

criterion_group! {
    name = benches;
    // A decision takes about a microsecond: 100 samples over 3 s are plenty
    // for a stable median, and keep the four cases under 20 s.
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = authz
}
criterion_main!(benches);
