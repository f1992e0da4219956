//! Tables for [`decide`] and [`apply_changes`]: what is applied, what is
//! NACKed and with which text, and what is remembered.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};

use prost::Message;
use ztunnel_proto::istio::security as wire_policy;
use ztunnel_proto::istio::workload as wire;
use ztunnel_proto::xds_types::{ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL};

use super::*;

/// [`super::decide`] with an interner of its own.
fn decide(known: &KnownVersions, response: &DeltaDiscoveryResponse) -> Update {
    super::decide(known, response, &mut Interner::new())
}

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

fn workload(uid: &str, addresses: Vec<Vec<u8>>) -> wire::Workload {
    wire::Workload {
        uid: uid.into(),
        name: uid.into(),
        namespace: "default".into(),
        addresses,
        tunnel_protocol: wire::TunnelProtocol::Hbone as i32,
        ..Default::default()
    }
}

fn address_resource(name: &str, version: &str, address: &wire::Address) -> Resource {
    Resource {
        name: name.into(),
        version: version.into(),
        resource: Some(prost_types::Any {
            type_url: ADDRESS_TYPE_URL.into(),
            value: address.encode_to_vec(),
        }),
        ..Default::default()
    }
}

fn workload_resource(workload: wire::Workload, version: &str) -> Resource {
    let name = workload.uid.clone();
    let address = wire::Address {
        r#type: Some(wire::address::Type::Workload(workload)),
    };
    address_resource(&name, version, &address)
}

fn good_workload(uid: &str, last_octet: u8, version: &str) -> Resource {
    workload_resource(workload(uid, vec![vec![10, 0, 0, last_octet]]), version)
}

fn service_resource(namespace: &str, hostname: &str, vip: [u8; 4]) -> Resource {
    let service = wire::Service {
        name: hostname.split('.').next().unwrap_or_default().into(),
        namespace: namespace.into(),
        hostname: hostname.into(),
        addresses: vec![wire::NetworkAddress {
            network: String::new(),
            address: vip.to_vec(),
            length: None,
        }],
        ..Default::default()
    };
    let address = wire::Address {
        r#type: Some(wire::address::Type::Service(service)),
    };
    address_resource(&format!("{namespace}/{hostname}"), "1", &address)
}

fn policy_resource(name: &str, action: i32) -> Resource {
    let (namespace, policy_name) = name.split_once('/').unwrap();
    let policy = wire_policy::Authorization {
        name: policy_name.into(),
        namespace: namespace.into(),
        scope: wire_policy::Scope::Namespace as i32,
        action,
        ..Default::default()
    };
    Resource {
        name: name.into(),
        version: "p1".into(),
        resource: Some(prost_types::Any {
            type_url: AUTHORIZATION_TYPE_URL.into(),
            value: policy.encode_to_vec(),
        }),
        ..Default::default()
    }
}

fn response(type_url: &str, resources: Vec<Resource>, removed: &[&str]) -> DeltaDiscoveryResponse {
    DeltaDiscoveryResponse {
        type_url: type_url.into(),
        nonce: "nonce-7".into(),
        resources,
        removed_resources: removed.iter().map(|name| (*name).to_owned()).collect(),
        ..Default::default()
    }
}

/// The NACK reason of a one-resource Address response, or `None` when it is
/// accepted.
fn address_verdict(resource: Resource) -> Option<String> {
    let update = decide(
        &KnownVersions::new(),
        &response(ADDRESS_TYPE_URL, vec![resource], &[]),
    );
    assert_eq!(update.rejected.len() + update.changes.len(), 1);
    update
        .rejected
        .first()
        .map(|rejection| rejection.reason.clone())
}

#[test]
fn single_address_resources_are_accepted_or_rejected_with_the_wire_text() {
    let mut legacy = workload("legacy", vec![vec![10, 0, 0, 1]]);
    legacy.tunnel_protocol = wire::TunnelProtocol::LegacyIstioMtls as i32;
    let mut unknown_status = workload("status", vec![vec![10, 0, 0, 1]]);
    unknown_status.status = 7;
    let mut unknown_type = workload("type", vec![vec![10, 0, 0, 1]]);
    unknown_type.workload_type = 9;
    let mut bad_service_key = workload("key", vec![vec![10, 0, 0, 1]]);
    bad_service_key
        .services
        .insert("no-slash".into(), wire::PortList::default());
    let no_resource = Resource {
        name: "empty".into(),
        ..Default::default()
    };
    let neither = address_resource("neither", "1", &wire::Address { r#type: None });
    let mut garbage = good_workload("garbage", 1, "1");
    if let Some(any) = &mut garbage.resource {
        any.value = vec![0xff, 0xff, 0xff];
    }

    let table: Vec<(&str, Resource, Option<&str>)> = vec![
        ("ipv4", good_workload("a", 1, "1"), None),
        (
            "ipv6",
            workload_resource(
                workload("v6", vec![Ipv6Addr::LOCALHOST.octets().to_vec()]),
                "1",
            ),
            None,
        ),
        (
            "five-byte address",
            workload_resource(workload("five", vec![vec![10, 0, 0, 1, 9]]), "1"),
            Some("failed to parse address, had 5 bytes"),
        ),
        (
            "legacy mTLS",
            workload_resource(legacy, "1"),
            Some("unknown enum: unsupported tunnel protocol: legacy istio mtls"),
        ),
        (
            "unknown status",
            workload_resource(unknown_status, "1"),
            Some("decode error: unknown enumeration value 7"),
        ),
        (
            "unknown workload type reads as DEPLOYMENT",
            workload_resource(unknown_type, "1"),
            None,
        ),
        (
            "service key without a slash",
            workload_resource(bad_service_key, "1"),
            Some("failed to parse namespaced hostname: no-slash"),
        ),
        (
            "service",
            service_resource("default", "echo.default.svc", [10, 96, 0, 1]),
            None,
        ),
        ("no Any", no_resource, Some("resource is missing")),
        (
            "neither workload nor service",
            neither,
            Some("address has neither workload nor service"),
        ),
    ];
    for (case, resource, expected) in table {
        assert_eq!(address_verdict(resource).as_deref(), expected, "{case}");
    }
    let reason = address_verdict(garbage).unwrap();
    assert!(reason.starts_with("decode error: "), "{reason}");
}

#[test]
fn bad_resources_are_nacked_while_good_ones_and_removals_apply() {
    let mut state = State::new();
    let mut known = KnownVersions::new();
    let first = decide(
        &known,
        &response(ADDRESS_TYPE_URL, vec![good_workload("old", 1, "v1")], &[]),
    );
    assert!(first.is_ack());
    apply_changes(&mut state, first.changes);
    known.record(ResourceKind::Address, first.versions);

    let mut legacy = workload("uid-2", vec![vec![10, 0, 0, 3]]);
    legacy.tunnel_protocol = wire::TunnelProtocol::LegacyIstioMtls as i32;
    let update = decide(
        &known,
        &response(
            ADDRESS_TYPE_URL,
            vec![
                workload_resource(workload("uid-1", vec![vec![10, 0, 0, 2, 7]]), "v2"),
                good_workload("new", 4, "v2"),
                workload_resource(legacy, "v2"),
            ],
            &["old", "never-known"],
        ),
    );

    let detail = update.reply.error_detail.clone().expect("a NACK");
    assert_eq!(
        detail.message,
        "uid-1: failed to parse address, had 5 bytes; \
         uid-2: unknown enum: unsupported tunnel protocol: legacy istio mtls"
    );
    assert_eq!(detail.code, 0);
    assert!(detail.details.is_empty());
    assert_eq!(update.reply.response_nonce, "nonce-7");
    assert_eq!(update.reply.type_url, ADDRESS_TYPE_URL);
    assert!(update.reply.node.is_none());
    assert!(update.reply.resource_names_subscribe.is_empty());
    assert!(update.reply.initial_resource_versions.is_empty());
    assert!(update.authorization_changed());

    let applied = apply_changes(&mut state, update.changes);
    assert_eq!(
        applied,
        Applied {
            updated: 1,
            removed: 1
        }
    );
    known.record(ResourceKind::Address, update.versions);
    assert!(state.workload("new").is_some());
    assert!(state.workload_by_address("", ip("10.0.0.4")).is_some());
    assert!(state.workload("old").is_none());
    assert!(state.workload_by_address("", ip("10.0.0.1")).is_none());
    assert!(state.workload("uid-1").is_none() && state.workload("uid-2").is_none());
    assert_eq!(
        known.initial_resource_versions(ResourceKind::Address),
        HashMap::from([("new".to_owned(), "v2".to_owned())])
    );
}

#[test]
fn a_rejected_update_keeps_the_version_of_what_is_still_applied() {
    let mut known = KnownVersions::new();
    let accepted = decide(
        &known,
        &response(ADDRESS_TYPE_URL, vec![good_workload("pod", 1, "v1")], &[]),
    );
    known.record(ResourceKind::Address, accepted.versions);
    let rejected = decide(
        &known,
        &response(
            ADDRESS_TYPE_URL,
            vec![workload_resource(
                workload("pod", vec![vec![1, 2, 3]]),
                "v2",
            )],
            &[],
        ),
    );
    assert!(!rejected.is_ack() && rejected.changes.is_empty());
    known.record(ResourceKind::Address, rejected.versions);
    assert_eq!(known.version(ResourceKind::Address, "pod"), Some("v1"));
}

#[test]
fn unknown_types_are_acked_and_change_nothing() {
    let update = decide(
        &KnownVersions::new(),
        &response(
            "type.googleapis.com/envoy.config.cluster.v3.Cluster",
            vec![good_workload("x", 1, "1")],
            &["y"],
        ),
    );
    assert_eq!(update.kind, None);
    assert!(update.changes.is_empty() && update.versions.is_empty());
    assert!(update.is_ack());
    assert_eq!(
        update.reply,
        request::ack(&update.reply.type_url, "nonce-7")
    );
    assert_eq!(
        update.reply.type_url,
        "type.googleapis.com/envoy.config.cluster.v3.Cluster"
    );
}

#[test]
fn policies_are_stored_by_resource_name_and_changes_call_for_a_recheck() {
    let mut state = State::new();
    let mut known = KnownVersions::new();
    let update = decide(
        &known,
        &response(
            AUTHORIZATION_TYPE_URL,
            vec![
                policy_resource("default/allow", wire_policy::Action::Allow as i32),
                policy_resource("default/odd", 7),
            ],
            &[],
        ),
    );
    assert_eq!(
        update.reply.error_detail.as_ref().unwrap().message,
        "default/odd: decode error: unknown enumeration value 7"
    );
    assert!(update.authorization_changed());
    apply_changes(&mut state, update.changes);
    known.record(ResourceKind::Authorization, update.versions);
    assert_eq!(
        state.policy("default/allow").unwrap().name.as_ref(),
        "allow"
    );
    assert!(state.policy("default/odd").is_none());
    assert_eq!(known.len(ResourceKind::Authorization), 1);

    let removal = decide(
        &known,
        &response(AUTHORIZATION_TYPE_URL, vec![], &["default/allow"]),
    );
    assert!(removal.is_ack() && removal.authorization_changed());
    apply_changes(&mut state, removal.changes);
    known.record(ResourceKind::Authorization, removal.versions);
    assert!(state.policy("default/allow").is_none());
    assert!(known.is_empty(ResourceKind::Authorization));
}

#[test]
fn only_policies_and_workloads_call_for_a_recheck() {
    let known = KnownVersions::new();
    let services = decide(
        &known,
        &response(
            ADDRESS_TYPE_URL,
            vec![service_resource(
                "default",
                "echo.default.svc",
                [10, 96, 0, 1],
            )],
            &[],
        ),
    );
    assert!(!services.authorization_changed());
    let empty = decide(&known, &response(AUTHORIZATION_TYPE_URL, vec![], &[]));
    assert!(empty.is_ack() && !empty.authorization_changed());
    let workloads = decide(
        &known,
        &response(ADDRESS_TYPE_URL, vec![good_workload("w", 1, "1")], &[]),
    );
    assert!(workloads.authorization_changed());
}

#[test]
fn services_are_removed_by_namespaced_hostname() {
    let mut state = State::new();
    let mut known = KnownVersions::new();
    let added = decide(
        &known,
        &response(
            ADDRESS_TYPE_URL,
            vec![service_resource(
                "default",
                "echo.default.svc",
                [10, 96, 0, 1],
            )],
            &[],
        ),
    );
    apply_changes(&mut state, added.changes);
    known.record(ResourceKind::Address, added.versions);
    assert!(state.service_by_vip("", ip("10.96.0.1")).is_some());

    let removed = decide(
        &known,
        &response(ADDRESS_TYPE_URL, vec![], &["default/echo.default.svc"]),
    );
    let applied = apply_changes(&mut state, removed.changes);
    assert_eq!(applied.removed, 1);
    assert!(state.service_by_vip("", ip("10.96.0.1")).is_none());
}

#[test]
fn removing_what_was_added_in_the_same_response_wins() {
    let mut state = State::new();
    let update = decide(
        &KnownVersions::new(),
        &response(ADDRESS_TYPE_URL, vec![good_workload("w", 1, "1")], &["w"]),
    );
    let mut known = KnownVersions::new();
    apply_changes(&mut state, update.changes);
    known.record(ResourceKind::Address, update.versions);
    assert!(state.workload("w").is_none());
    assert!(known.is_empty(ResourceKind::Address));
}

#[test]
fn a_removal_takes_out_what_a_local_file_seeded_without_a_version_to_forget() {
    let mut state = State::new();
    let seeded = decide(
        &KnownVersions::new(),
        &response(
            AUTHORIZATION_TYPE_URL,
            vec![policy_resource(
                "default/seeded",
                wire_policy::Action::Allow as i32,
            )],
            &[],
        ),
    );
    // Put in the state as the file would: no xDS version recorded.
    apply_changes(&mut state, seeded.changes);
    let known = KnownVersions::new();
    assert!(state.policy("default/seeded").is_some());

    let removal = decide(
        &known,
        &response(
            AUTHORIZATION_TYPE_URL,
            vec![],
            &["default/seeded", "default/never"],
        ),
    );
    assert!(removal.is_ack());
    assert!(removal.versions.is_empty(), "no version to forget");
    apply_changes(&mut state, removal.changes);
    assert!(state.policy("default/seeded").is_none());
}
