//! What the client sends: node id and metadata, the initial requests, and
//! the ACK/NACK shapes of WIRE.md §7.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use prost_types::value::Kind;
use ztunnel_proto::xds_types::{ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL, ResourceKind};

use super::*;
use crate::config::NodeSettings;

fn settings() -> NodeSettings {
    NodeSettings {
        instance_ip: "10.244.1.7".parse::<IpAddr>().unwrap(),
        pod_name: "ztunnel-abcde".into(),
        pod_namespace: "istio-system".into(),
        node_name: "node-a".into(),
        metadata: BTreeMap::from([
            ("CLUSTER_ID".to_owned(), serde_json::json!("east")),
            ("NAME".to_owned(), serde_json::json!("overridden")),
            (
                "LABELS".to_owned(),
                serde_json::json!({"app": "ztunnel", "replicas": 3, "on": true, "list": [1, null]}),
            ),
        ]),
        invalid_metadata: Vec::new(),
    }
}

fn string(value: &prost_types::Value) -> &str {
    match &value.kind {
        Some(Kind::StringValue(text)) => text,
        other => panic!("not a string: {other:?}"),
    }
}

#[test]
fn the_node_id_and_metadata_follow_the_wire() {
    let node = node(&settings());
    assert_eq!(
        node.id,
        "ztunnel~10.244.1.7~ztunnel-abcde.istio-system~istio-system.svc.cluster.local"
    );
    assert_eq!(node.cluster, "");
    let fields = &node.metadata.as_ref().unwrap().fields;
    assert_eq!(string(&fields["NAME"]), "ztunnel-abcde");
    assert_eq!(string(&fields["NAMESPACE"]), "istio-system");
    assert_eq!(string(&fields["INSTANCE_IPS"]), "10.244.1.7");
    assert_eq!(string(&fields["NODE_NAME"]), "node-a");
    assert_eq!(string(&fields["CLUSTER_ID"]), "east");
    let Some(Kind::StructValue(labels)) = &fields["LABELS"].kind else {
        panic!("LABELS is not a struct: {:?}", fields["LABELS"]);
    };
    assert_eq!(string(&labels.fields["app"]), "ztunnel");
    assert_eq!(labels.fields["replicas"].kind, Some(Kind::NumberValue(3.0)));
    assert_eq!(labels.fields["on"].kind, Some(Kind::BoolValue(true)));
    let Some(Kind::ListValue(list)) = &labels.fields["list"].kind else {
        panic!("list");
    };
    assert_eq!(list.values[0].kind, Some(Kind::NumberValue(1.0)));
    assert!(matches!(list.values[1].kind, Some(Kind::NullValue(_))));
}

#[test]
fn unset_parts_give_the_istio_defaults() {
    let node = node(&NodeSettings {
        instance_ip: "1.1.1.1".parse::<IpAddr>().unwrap(),
        pod_name: String::new(),
        pod_namespace: String::new(),
        node_name: String::new(),
        metadata: BTreeMap::new(),
        invalid_metadata: Vec::new(),
    });
    assert_eq!(node.id, "ztunnel~1.1.1.1~.~.svc.cluster.local");
    assert_eq!(node.id.split('~').count(), 4);
}

#[test]
fn initial_requests_are_wildcards_with_node_and_known_versions() {
    let node = node(&settings());
    let mut known = KnownVersions::new();
    let fresh = initial_requests(&node, &known);
    assert_eq!(
        fresh
            .iter()
            .map(|request| request.type_url.as_str())
            .collect::<Vec<_>>(),
        [ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL]
    );
    for request in &fresh {
        assert_eq!(request.node.as_ref(), Some(&node));
        assert!(request.resource_names_subscribe.is_empty());
        assert!(request.resource_names_unsubscribe.is_empty());
        assert!(request.initial_resource_versions.is_empty());
        assert!(request.response_nonce.is_empty() && request.error_detail.is_none());
    }

    known.record(
        ResourceKind::Address,
        vec![VersionChange::Accepted {
            name: "uid-1".into(),
            version: "v3".into(),
        }],
    );
    known.record(
        ResourceKind::Authorization,
        vec![VersionChange::Accepted {
            name: "default/allow".into(),
            version: "p1".into(),
        }],
    );
    let again = initial_requests(&node, &known);
    assert_eq!(
        again[0].initial_resource_versions,
        HashMap::from([("uid-1".to_owned(), "v3".to_owned())])
    );
    assert_eq!(
        again[1].initial_resource_versions,
        HashMap::from([("default/allow".to_owned(), "p1".to_owned())])
    );
}

#[test]
fn acks_carry_only_type_and_nonce_and_nacks_add_the_detail() {
    let acked = ack(ADDRESS_TYPE_URL, "n1");
    assert_eq!(acked.type_url, ADDRESS_TYPE_URL);
    assert_eq!(acked.response_nonce, "n1");
    assert!(acked.node.is_none() && acked.error_detail.is_none());

    let rejected = [
        Rejection {
            name: "uid-1".into(),
            reason: "failed to parse address, had 5 bytes".into(),
        },
        Rejection {
            name: "uid-2".into(),
            reason: "unknown enum: unsupported tunnel protocol: legacy istio mtls".into(),
        },
    ];
    let nacked = nack(ADDRESS_TYPE_URL, "n2", &rejected);
    let detail = nacked.error_detail.as_ref().unwrap();
    assert_eq!(
        detail.message,
        "uid-1: failed to parse address, had 5 bytes; uid-2: unknown enum: unsupported tunnel protocol: legacy istio mtls"
    );
    assert_eq!(detail.code, 0);
    assert!(detail.details.is_empty());
    assert_eq!(
        DeltaDiscoveryRequestShape::of(&nacked),
        DeltaDiscoveryRequestShape::of(&ack(ADDRESS_TYPE_URL, "n2"))
    );
}

/// Everything of a request but `error_detail`.
#[derive(Debug, PartialEq)]
struct DeltaDiscoveryRequestShape {
    type_url: String,
    nonce: String,
    has_node: bool,
    names: usize,
    versions: usize,
}

impl DeltaDiscoveryRequestShape {
    fn of(request: &ztunnel_proto::envoy::service::discovery::v3::DeltaDiscoveryRequest) -> Self {
        DeltaDiscoveryRequestShape {
            type_url: request.type_url.clone(),
            nonce: request.response_nonce.clone(),
            has_node: request.node.is_some(),
            names: request.resource_names_subscribe.len()
                + request.resource_names_unsubscribe.len(),
            versions: request.initial_resource_versions.len(),
        }
    }
}
