//! Conversion of `istio.workload.Workload`: defaults and WIRE.md §7 rejections.

use std::collections::HashMap;

use ztunnel_proto::istio::workload as proto;

use super::*;
use crate::state::{GatewayDestination, NetworkAddress};

fn port(service_port: u32, target_port: u32) -> proto::Port {
    proto::Port {
        service_port,
        target_port,
        app_protocol: 0,
    }
}

fn gateway(address: Vec<u8>, length: Option<u32>, hbone_mtls_port: u32) -> proto::GatewayAddress {
    proto::GatewayAddress {
        destination: Some(proto::gateway_address::Destination::Address(
            proto::NetworkAddress {
                network: "net".into(),
                address,
                length,
            },
        )),
        hbone_mtls_port,
    }
}

fn minimal() -> proto::Workload {
    proto::Workload {
        uid: "Kubernetes//Pod/default/echo-1".into(),
        name: "echo-1".into(),
        namespace: "default".into(),
        addresses: vec![vec![10, 0, 0, 1]],
        ..Default::default()
    }
}

#[test]
fn empty_fields_take_the_documented_defaults() {
    let workload = Workload::try_from(&minimal()).unwrap();
    assert_eq!(workload.identity.trust_domain(), "cluster.local");
    assert_eq!(workload.service_account(), "default");
    assert_eq!(workload.group.cluster_id.as_ref(), "Kubernetes");
    assert_eq!(workload.capacity, 1);
    assert_eq!(workload.protocol, InboundProtocol::Tcp);
    assert_eq!(workload.status, HealthStatus::Healthy);
    assert_eq!(workload.network_mode, NetworkMode::Standard);
    assert_eq!(workload.group.workload_type, WorkloadType::Deployment);
    assert_eq!(
        workload.identity.as_str(),
        "spiffe://cluster.local/ns/default/sa/default"
    );
}

#[test]
fn every_field_is_carried_over() {
    let mut wire = minimal();
    let mapped_v4 = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 2].to_vec();
    wire.addresses = vec![
        vec![10, 0, 0, 1],
        vec![0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
        mapped_v4,
    ];
    wire.network = "net".into();
    wire.tunnel_protocol = proto::TunnelProtocol::Hbone as i32;
    wire.trust_domain = "example.org".into();
    wire.service_account = "echo".into();
    wire.waypoint = Some(proto::GatewayAddress {
        destination: Some(proto::gateway_address::Destination::Hostname(
            proto::NamespacedHostname {
                namespace: "default".into(),
                hostname: "waypoint.default.svc.cluster.local".into(),
            },
        )),
        hbone_mtls_port: 15008,
    });
    wire.network_gateway = Some(gateway(vec![192, 0, 2, 1], None, 15009));
    wire.node = "node-1".into();
    wire.canonical_name = "echo".into();
    wire.canonical_revision = "v1".into();
    wire.workload_type = proto::WorkloadType::Pod as i32;
    wire.workload_name = "echo".into();
    wire.native_tunnel = true;
    wire.authorization_policies = vec!["default/allow-echo".into()];
    wire.status = proto::WorkloadStatus::Unhealthy as i32;
    wire.cluster_id = "east".into();
    wire.hostname = "echo-1.example.com".into();
    wire.services = HashMap::from([(
        "default/echo.default.svc.cluster.local".to_string(),
        proto::PortList {
            ports: vec![port(80, 8080), port(443, 8443)],
        },
    )]);
    wire.application_tunnel = Some(proto::ApplicationTunnel {
        protocol: 1,
        port: 15088,
    });
    wire.locality = Some(proto::Locality {
        region: "r".into(),
        zone: "z".into(),
        subzone: "s".into(),
    });
    wire.network_mode = proto::NetworkMode::HostNetwork as i32;
    wire.capacity = Some(3);

    let workload = Workload::try_from(&wire).unwrap();
    let ips: Vec<String> = workload.addresses.iter().map(ToString::to_string).collect();
    assert_eq!(ips, ["10.0.0.1", "fd00::1", "10.0.0.2"]);
    assert_eq!(workload.protocol, InboundProtocol::Hbone);
    assert_eq!(
        workload.identity.as_str(),
        "spiffe://example.org/ns/default/sa/echo"
    );
    assert_eq!(
        workload.waypoint.unwrap().destination,
        GatewayDestination::Hostname(
            "default/waypoint.default.svc.cluster.local"
                .parse()
                .unwrap()
        )
    );
    assert_eq!(
        workload.network_gateway.as_deref(),
        Some(&GatewayAddress {
            destination: GatewayDestination::Address(NetworkAddress {
                network: "net".into(),
                address: "192.0.2.1".parse().unwrap(),
            }),
            hbone_mtls_port: 15009,
        })
    );
    assert_eq!(workload.group.workload_type, WorkloadType::Pod);
    assert_eq!(workload.status, HealthStatus::Unhealthy);
    assert_eq!(workload.group.cluster_id.as_ref(), "east");
    assert_eq!(
        *workload.authorization_policies,
        [Arc::<str>::from("default/allow-echo")]
    );
    let ports = workload
        .services
        .get(&"default/echo.default.svc.cluster.local".parse().unwrap())
        .unwrap();
    assert_eq!(
        ports.iter().map(|(s, t)| (*s, *t)).collect::<Vec<_>>(),
        [(80, 8080), (443, 8443)]
    );
    assert_eq!(
        workload.application_tunnel,
        Some(ApplicationTunnel {
            protocol: ApplicationTunnelProtocol::Proxy,
            port: Some(15088)
        })
    );
    assert_eq!(workload.group.locality.zone.as_ref(), "z");
    assert_eq!(workload.network_mode, NetworkMode::HostNetwork);
    assert_eq!(workload.capacity, 3);
    assert!(workload.native_tunnel);
}

#[test]
fn unknown_workload_type_reads_as_deployment() {
    let mut wire = minimal();
    wire.workload_type = 42;
    assert_eq!(
        Workload::try_from(&wire).unwrap().group.workload_type,
        WorkloadType::Deployment
    );
}

#[test]
fn bad_workloads_are_rejected_with_the_nack_message() {
    type Edit = fn(&mut proto::Workload);
    let cases: &[(&str, Edit, &str)] = &[
        (
            "5-byte address",
            |w| w.addresses = vec![vec![1, 2, 3, 4, 5]],
            "failed to parse address, had 5 bytes",
        ),
        (
            "empty address",
            |w| w.addresses = vec![vec![]],
            "failed to parse address, had 0 bytes",
        ),
        (
            "legacy mTLS",
            |w| w.tunnel_protocol = 2,
            "unknown enum: unsupported tunnel protocol: legacy istio mtls",
        ),
        (
            "unknown tunnel",
            |w| w.tunnel_protocol = 9,
            "decode error: unknown enumeration value 9",
        ),
        (
            "unknown status",
            |w| w.status = 2,
            "decode error: unknown enumeration value 2",
        ),
        (
            "unknown network mode",
            |w| w.network_mode = 7,
            "decode error: unknown enumeration value 7",
        ),
        (
            "unknown application tunnel",
            |w| {
                w.application_tunnel = Some(proto::ApplicationTunnel {
                    protocol: 3,
                    port: 0,
                })
            },
            "decode error: unknown enumeration value 3",
        ),
        (
            "services key without a slash",
            |w| w.services = HashMap::from([("echo".to_string(), proto::PortList::default())]),
            "failed to parse namespaced hostname: echo",
        ),
        (
            "waypoint without destination",
            |w| {
                w.waypoint = Some(proto::GatewayAddress {
                    destination: None,
                    hbone_mtls_port: 15008,
                })
            },
            "gateway address has no destination",
        ),
        (
            "network gateway without destination",
            |w| w.network_gateway = Some(proto::GatewayAddress::default()),
            "gateway address has no destination",
        ),
        (
            "gateway IPv4 prefix above 32",
            |w| w.waypoint = Some(gateway(vec![10, 0, 0, 1], Some(33), 15008)),
            "invalid cidr: prefix length 33 is above 32",
        ),
        (
            "gateway IPv6 prefix above 128",
            |w| w.waypoint = Some(gateway(vec![0; 16], Some(129), 15008)),
            "invalid cidr: prefix length 129 is above 128",
        ),
        (
            "gateway port above 65535",
            |w| w.waypoint = Some(gateway(vec![10, 0, 0, 1], None, 70000)),
            "port 70000 is out of range",
        ),
        (
            "target port above 65535",
            |w| {
                w.services = HashMap::from([(
                    "default/echo".to_string(),
                    proto::PortList {
                        ports: vec![port(80, 65536)],
                    },
                )])
            },
            "port 65536 is out of range",
        ),
        (
            "no namespace",
            |w| w.namespace = String::new(),
            "invalid workload identity: identity has an empty namespace",
        ),
        (
            "a service account with a slash",
            |w| w.service_account = "a/b".into(),
            "invalid workload identity: identity must have the form spiffe://<trust-domain>/ns/<namespace>/sa/<service-account>",
        ),
        (
            "a trust domain with a space",
            |w| w.trust_domain = "cluster local".into(),
            "invalid workload identity: identity trust domain contains a forbidden character",
        ),
    ];
    for (name, edit, message) in cases {
        let mut wire = minimal();
        edit(&mut wire);
        let error = Workload::try_from(&wire).expect_err(name);
        assert_eq!(error.to_string(), *message, "{name}");
    }
}
