//! The generated code keeps the wire contract of WIRE.md: field numbers that
//! differ from the obvious order, oneof members, and the gRPC paths peers
//! dial. A renumbered field would still compile, so these encode real
//! messages and compare bytes.

use prost::Message;
use tonic::server::NamedService;
use ztunnel_proto::envoy::service::discovery::v3 as xds;
use ztunnel_proto::istio::security;
use ztunnel_proto::istio::v1::auth;
use ztunnel_proto::istio::workload::zds;

/// Protobuf tag byte for a length-delimited field.
fn tag(field: u8) -> u8 {
    (field << 3) | 2
}

#[test]
fn zds_uses_the_istio_field_numbers() {
    let del = zds::WorkloadRequest {
        payload: Some(zds::workload_request::Payload::Del(zds::DelWorkload {
            uid: "u".into(),
        })),
    };
    // WorkloadRequest.del = 2 wrapping DelWorkload.uid = 2.
    assert_eq!(del.encode_to_vec(), [tag(2), 3, tag(2), 1, b'u']);

    let keep = zds::WorkloadRequest {
        payload: Some(zds::workload_request::Payload::Keep(zds::KeepWorkload {
            uid: "u".into(),
        })),
    };
    // WorkloadRequest.keep = 5 wrapping KeepWorkload.uid = 1.
    assert_eq!(keep.encode_to_vec(), [tag(5), 3, tag(1), 1, b'u']);

    let snapshot = zds::WorkloadRequest {
        payload: Some(zds::workload_request::Payload::SnapshotSent(
            zds::SnapshotSent {},
        )),
    };
    assert_eq!(snapshot.encode_to_vec(), [tag(3), 0]);

    // A request with no payload encodes to nothing, which a peer reads as
    // end of stream (WIRE.md §5).
    assert!(
        zds::WorkloadRequest { payload: None }
            .encode_to_vec()
            .is_empty()
    );

    let hello = zds::ZdsHello {
        version: zds::Version::V1.into(),
    };
    assert_eq!(hello.encode_to_vec(), [1 << 3, 1]);
}

#[test]
fn ca_request_skips_field_two() {
    let request = auth::IstioCertificateRequest {
        csr: "c".into(),
        validity_duration: 7,
        metadata: Some(prost_types::Struct::default()),
    };
    assert_eq!(
        request.encode_to_vec(),
        [tag(1), 1, b'c', 3 << 3, 7, tag(4), 0]
    );
}

#[test]
fn authorization_clause_matches_are_field_two() {
    let clause = security::Clause {
        matches: vec![security::Match {
            destination_ports: vec![80],
            ..Default::default()
        }],
    };
    // Clause.matches = 2; Match.destination_ports = 9, packed.
    assert_eq!(clause.encode_to_vec(), [tag(2), 3, tag(9), 1, 80]);
}

#[test]
fn delta_xds_response_fields() {
    let response = xds::DeltaDiscoveryResponse {
        type_url: "t".into(),
        nonce: "n".into(),
        removed_resources: vec!["r".into()],
        ..Default::default()
    };
    assert_eq!(
        response.encode_to_vec(),
        [tag(4), 1, b't', tag(5), 1, b'n', tag(6), 1, b'r']
    );
}

#[test]
fn grpc_service_names_match_istio() {
    type Ca<T> = auth::istio_certificate_service_server::IstioCertificateServiceServer<T>;
    type Ads<T> = xds::aggregated_discovery_service_server::AggregatedDiscoveryServiceServer<T>;
    assert_eq!(
        <Ca<Unused> as NamedService>::NAME,
        "istio.v1.auth.IstioCertificateService"
    );
    assert_eq!(
        <Ads<Unused> as NamedService>::NAME,
        "envoy.service.discovery.v3.AggregatedDiscoveryService"
    );
}

/// Stands in for a service implementation; only the type-level name is read.
struct Unused;
