//! The stream state machine: the initial answer (always sent), ACK and
//! NACK (never resent), unknown types, and pushes of only what changed.

use std::collections::HashMap;

use ztunnel_proto::google::rpc::Status;
use ztunnel_proto::xds_types::{ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL};

use super::*;
use ztunnel_mesh::{MeshFile, MeshSnapshot};

fn build(ips: &[(&str, &str)], policies: &[&str], previous: &MeshResources) -> MeshResources {
    let mut yaml = String::from("pods:\n");
    for (uid, ip) in ips {
        yaml.push_str(&format!(
            "- {{name: {uid}, namespace: n, uid: {uid}, serviceAccount: s, nodeName: a, ips: [{ip}]}}\n"
        ));
    }
    yaml.push_str("policies:\n");
    for name in policies {
        yaml.push_str(&format!(
            "- {{name: {name}, namespace: n, scope: Namespace, action: Allow}}\n"
        ));
    }
    let file: MeshFile = serde_yaml_ng::from_str(&yaml).unwrap();
    MeshResources::build(&MeshSnapshot::new(file).unwrap(), "cluster.local", previous)
}

fn initial(type_url: &str, known: &[(&str, &str)]) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        type_url: type_url.into(),
        initial_resource_versions: known
            .iter()
            .map(|(name, version)| ((*name).to_owned(), (*version).to_owned()))
            .collect::<HashMap<_, _>>(),
        ..DeltaDiscoveryRequest::default()
    }
}

fn ack(type_url: &str, nonce: &str, error: Option<&str>) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        type_url: type_url.into(),
        response_nonce: nonce.into(),
        error_detail: error.map(|message| Status {
            message: message.into(),
            ..Status::default()
        }),
        ..DeltaDiscoveryRequest::default()
    }
}

fn names(response: &Push) -> Vec<&str> {
    response.resources.iter().map(|r| &*r.name).collect()
}

fn removed(response: &Push) -> Vec<&str> {
    response.removed.iter().map(|name| &**name).collect()
}

#[test]
fn initial_requests_are_always_answered() {
    let resources = build(
        &[("a", "10.0.0.1"), ("b", "10.0.0.2")],
        &[],
        &MeshResources::empty(),
    );
    let mut stream = DeltaStream::new(7);

    let (kind, response) = stream.on_request(&initial(ADDRESS_TYPE_URL, &[]), &resources);
    assert_eq!(
        kind,
        RequestKind::Subscribe {
            kind: ResourceKind::Address,
            known: 0
        }
    );
    let response = response.unwrap();
    assert_eq!(response.type_url, ADDRESS_TYPE_URL);
    assert_eq!(names(&response), ["a", "b"]);
    assert_eq!(response.nonce, "7-1");

    let (_, response) = stream.on_request(&initial(AUTHORIZATION_TYPE_URL, &[]), &resources);
    let response = response.unwrap();
    assert!(response.resources.is_empty() && response.removed.is_empty());
    assert_eq!(
        response.type_url, AUTHORIZATION_TYPE_URL,
        "answered even when empty"
    );
    assert_eq!(response.nonce, "7-2");

    let unknown = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
    let (kind, response) = stream.on_request(&initial(unknown, &[]), &resources);
    assert_eq!(kind, RequestKind::UnknownType);
    let response = response.unwrap();
    assert_eq!(
        (response.type_url.as_str(), response.resources.len()),
        (unknown, 0)
    );
    let (kind, response) = stream.on_request(&ack(unknown, &response.nonce, None), &resources);
    assert_eq!((kind, response), (RequestKind::Stray, None));

    let (kind, response) = stream.on_request(&initial(ADDRESS_TYPE_URL, &[]), &resources);
    assert_eq!(
        (kind, response),
        (
            RequestKind::Resubscribe {
                kind: ResourceKind::Address
            },
            None
        ),
        "a second request without a nonce is a subscription change"
    );
    assert_eq!(stream.subscribed().collect::<Vec<_>>(), ResourceKind::ALL);
}

#[test]
fn a_reconnect_is_sent_only_what_changed_while_away() {
    let resources = build(
        &[("a", "10.0.0.1"), ("b", "10.0.0.2")],
        &["p"],
        &MeshResources::empty(),
    );
    let addresses = resources.get(ResourceKind::Address);
    let a_version = addresses.get("a").unwrap().version.clone();
    let mut stream = DeltaStream::new(1);
    let known = [("a", a_version.as_str()), ("b", "0000"), ("gone", "1234")];
    let (kind, response) = stream.on_request(&initial(ADDRESS_TYPE_URL, &known), &resources);
    assert_eq!(
        kind,
        RequestKind::Subscribe {
            kind: ResourceKind::Address,
            known: 3
        }
    );
    let response = response.unwrap();
    assert_eq!(names(&response), ["b"]);
    assert_eq!(removed(&response), ["gone"]);
}

#[test]
fn builds_push_each_subscribed_type_only_its_changes() {
    let g1 = build(
        &[("a", "10.0.0.1"), ("b", "10.0.0.2")],
        &["p"],
        &MeshResources::empty(),
    );
    let mut stream = DeltaStream::new(1);
    assert!(
        stream.on_resources(&g1).is_empty(),
        "nothing before a subscription"
    );
    stream.on_request(&initial(ADDRESS_TYPE_URL, &[]), &g1);

    let g2 = build(&[("a", "10.0.0.9"), ("b", "10.0.0.2")], &["p", "q"], &g1);
    let responses = stream.on_resources(&g2);
    let [response] = &responses[..] else {
        panic!("one response, for the one subscribed type: {responses:?}")
    };
    assert_eq!(
        (response.type_url.as_str(), names(response)),
        (ADDRESS_TYPE_URL, vec!["a"])
    );
    assert!(
        stream.on_resources(&g2).is_empty(),
        "the same build again sends nothing"
    );

    stream.on_request(&initial(AUTHORIZATION_TYPE_URL, &[]), &g2);
    let g3 = build(&[("a", "10.0.0.9")], &["q"], &g2);
    let responses = stream.on_resources(&g3);
    let summary: Vec<(&str, Vec<&str>, Vec<&str>)> = responses
        .iter()
        .map(|r| (r.type_url.as_str(), names(r), removed(r)))
        .collect();
    assert_eq!(
        summary,
        [
            (ADDRESS_TYPE_URL, vec![], vec!["b"]),
            (AUTHORIZATION_TYPE_URL, vec![], vec!["n/p"]),
        ]
    );
    let nonces: std::collections::HashSet<&str> =
        responses.iter().map(|r| r.nonce.as_str()).collect();
    assert_eq!(nonces.len(), 2, "nonces are unique");
}

#[test]
fn acks_and_nacks_change_nothing_sent() {
    let g1 = build(&[("a", "10.0.0.1")], &[], &MeshResources::empty());
    let mut stream = DeltaStream::new(1);
    let (_, response) = stream.on_request(&initial(ADDRESS_TYPE_URL, &[]), &g1);
    let nonce = response.unwrap().nonce;

    let (kind, response) = stream.on_request(&ack(ADDRESS_TYPE_URL, &nonce, None), &g1);
    assert_eq!(
        (kind, response),
        (
            RequestKind::Ack {
                kind: ResourceKind::Address
            },
            None
        )
    );
    let (kind, response) = stream.on_request(
        &ack(ADDRESS_TYPE_URL, &nonce, Some("a: failed to parse address")),
        &g1,
    );
    assert_eq!(
        (kind, response),
        (
            RequestKind::Nack {
                kind: ResourceKind::Address,
                detail: "a: failed to parse address".into()
            },
            None
        )
    );
    assert!(
        stream.on_resources(&g1).is_empty(),
        "a rejected version is not resent"
    );
    let (kind, _) = stream.on_request(&ack(AUTHORIZATION_TYPE_URL, "1-9", None), &g1);
    assert_eq!(kind, RequestKind::Stray, "ACK of a type never subscribed");

    let g2 = build(&[("a", "10.0.0.2")], &[], &g1);
    let responses = stream.on_resources(&g2);
    assert_eq!(responses.len(), 1, "its next version is");
}
