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

/// The one response of `responses`.
fn only(responses: Vec<Push>) -> Push {
    let [response] = <[Push; 1]>::try_from(responses)
        .unwrap_or_else(|responses| panic!("one response: {responses:?}"));
    response
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
    let response = only(response);
    assert_eq!(response.type_url, ADDRESS_TYPE_URL);
    assert_eq!(names(&response), ["a", "b"]);
    assert_eq!(response.nonce, "7-1");

    let (_, response) = stream.on_request(&initial(AUTHORIZATION_TYPE_URL, &[]), &resources);
    let response = only(response);
    assert!(response.resources.is_empty() && response.removed.is_empty());
    assert_eq!(
        response.type_url, AUTHORIZATION_TYPE_URL,
        "answered even when empty"
    );
    assert_eq!(response.nonce, "7-2");

    let unknown = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
    let (kind, response) = stream.on_request(&initial(unknown, &[]), &resources);
    assert_eq!(kind, RequestKind::UnknownType);
    let response = only(response);
    assert_eq!(
        (response.type_url.as_str(), response.resources.len()),
        (unknown, 0)
    );
    let (kind, response) = stream.on_request(&ack(unknown, &response.nonce, None), &resources);
    assert_eq!((kind, response), (RequestKind::Stray, vec![]));

    let (kind, response) = stream.on_request(&initial(ADDRESS_TYPE_URL, &[]), &resources);
    assert_eq!(
        (kind, response),
        (
            RequestKind::Resubscribe {
                kind: ResourceKind::Address
            },
            vec![]
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
    let response = only(response);
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
    let nonce = only(response).nonce;

    let (kind, response) = stream.on_request(&ack(ADDRESS_TYPE_URL, &nonce, None), &g1);
    assert_eq!(
        (kind, response),
        (
            RequestKind::Ack {
                kind: ResourceKind::Address
            },
            vec![]
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
            vec![]
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

/// A mesh of a `db` pod and, when `deny` is set, a selector policy that
/// picks it: one change to the mesh that changes both types.
fn db_mesh(deny: bool, previous: &MeshResources) -> MeshResources {
    let mut yaml = String::from(
        "pods:\n- {name: db, namespace: n, uid: db, serviceAccount: db, nodeName: a, ips: [10.0.0.5], labels: {app: db}}\n",
    );
    if deny {
        yaml.push_str(
            "policies:\n- {name: deny, namespace: n, scope: WorkloadSelector, selector: {app: db}, action: Deny}\n",
        );
    }
    let file: MeshFile = serde_yaml_ng::from_str(&yaml).unwrap();
    MeshResources::build(&MeshSnapshot::new(file).unwrap(), "cluster.local", previous)
}

/// Each response as its type, the policies its `db` workload lists (for an
/// Address) or its names (for an Authorization), and the names it removes.
fn summary(responses: &[Push]) -> Vec<(&str, Vec<String>, Vec<&str>)> {
    responses
        .iter()
        .map(|response| {
            let listed = match ResourceKind::from_type_url(&response.type_url) {
                Some(ResourceKind::Address) => db_policies(response),
                _ => names(response).into_iter().map(str::to_owned).collect(),
            };
            (response.type_url.as_str(), listed, removed(response))
        })
        .collect()
}

/// The policies the `db` workload of an Address response lists.
fn db_policies(response: &Push) -> Vec<String> {
    use prost::Message;
    use ztunnel_proto::envoy::service::discovery::v3::Resource;
    use ztunnel_proto::istio::workload::{Address, address};
    let entry = response
        .resources
        .iter()
        .find(|r| &*r.name == "db")
        .unwrap();
    let resource = Resource::decode(entry.encoded.clone()).unwrap();
    let any = resource.resource.unwrap();
    match Address::decode(any.value.as_slice()).unwrap().r#type {
        Some(address::Type::Workload(workload)) => workload.authorization_policies,
        other => panic!("db is a workload: {other:?}"),
    }
}

#[test]
fn a_subscription_answered_from_a_newer_build_sends_that_builds_addresses_first() {
    let before = db_mesh(false, &MeshResources::empty());
    let mut stream = DeltaStream::new(1);
    stream.on_request(&initial(ADDRESS_TYPE_URL, &[]), &before);

    // The policy's build is out; the stream's task reads the Authorization
    // subscription before its notice of the build.
    let after = db_mesh(true, &before);
    let (_, responses) = stream.on_request(&initial(AUTHORIZATION_TYPE_URL, &[]), &after);
    assert_eq!(
        summary(&responses),
        [
            (ADDRESS_TYPE_URL, vec!["n/deny".to_owned()], vec![]),
            (AUTHORIZATION_TYPE_URL, vec!["n/deny".to_owned()], vec![]),
        ],
        "the workload that lists the policy before the policy"
    );
    assert!(stream.on_resources(&after).is_empty(), "nothing twice");
}

#[test]
fn an_ack_read_before_the_notice_of_a_build_brings_every_type_to_it_address_first() {
    let before = db_mesh(false, &MeshResources::empty());
    let mut stream = DeltaStream::new(1);
    stream.on_request(&initial(ADDRESS_TYPE_URL, &[]), &before);
    let (_, answer) = stream.on_request(&initial(AUTHORIZATION_TYPE_URL, &[]), &before);
    let nonce = only(answer).nonce;

    let after = db_mesh(true, &before);
    let (kind, responses) = stream.on_request(&ack(AUTHORIZATION_TYPE_URL, &nonce, None), &after);
    assert_eq!(
        kind,
        RequestKind::Ack {
            kind: ResourceKind::Authorization
        }
    );
    assert_eq!(
        summary(&responses),
        [
            (ADDRESS_TYPE_URL, vec!["n/deny".to_owned()], vec![]),
            (AUTHORIZATION_TYPE_URL, vec!["n/deny".to_owned()], vec![]),
        ],
        "the build is sent, not skipped until the next one"
    );
    assert!(stream.on_resources(&after).is_empty(), "nothing twice");

    let (_, responses) = stream.on_request(&initial("type.googleapis.com/other", &[]), &after);
    assert_eq!(responses.len(), 1, "no catch-up when there is none");
}

#[test]
fn a_client_that_subscribes_authorization_first_gets_address_first_for_every_later_change() {
    let before = db_mesh(false, &MeshResources::empty());
    let mut stream = DeltaStream::new(1);
    let (_, answer) = stream.on_request(&initial(AUTHORIZATION_TYPE_URL, &[]), &before);
    assert_eq!(
        summary(&[only(answer)]),
        [(AUTHORIZATION_TYPE_URL, vec![], vec![])]
    );

    // Its Address subscription is read after the policy's build is out:
    // the Address answer, then the Authorization brought to the same build.
    let after = db_mesh(true, &before);
    let (_, responses) = stream.on_request(&initial(ADDRESS_TYPE_URL, &[]), &after);
    assert_eq!(
        summary(&responses),
        [
            (ADDRESS_TYPE_URL, vec!["n/deny".to_owned()], vec![]),
            (AUTHORIZATION_TYPE_URL, vec!["n/deny".to_owned()], vec![]),
        ]
    );

    // The policy deleted: the workload no longer lists it, then it goes.
    let deleted = db_mesh(false, &after);
    assert_eq!(
        summary(&stream.on_resources(&deleted)),
        [
            (ADDRESS_TYPE_URL, vec![], vec![]),
            (AUTHORIZATION_TYPE_URL, vec![], vec!["n/deny"]),
        ]
    );
}
