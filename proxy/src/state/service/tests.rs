//! Conversion of `istio.workload.Service`: VIPs, ports, SANs and WIRE.md §7 rejections.

use ztunnel_proto::istio::workload as proto;

use super::*;
use crate::state::GatewayDestination;

fn vip(network: &str, address: Vec<u8>, length: Option<u32>) -> proto::NetworkAddress {
    proto::NetworkAddress {
        network: network.into(),
        address,
        length,
    }
}

fn minimal() -> proto::Service {
    proto::Service {
        name: "echo".into(),
        namespace: "default".into(),
        hostname: "echo.default.svc.cluster.local".into(),
        addresses: vec![vip("", vec![10, 96, 0, 1], None)],
        ports: vec![proto::Port {
            service_port: 80,
            target_port: 8080,
            app_protocol: 4,
        }],
        ..Default::default()
    }
}

#[test]
fn vips_split_into_host_and_cidr_vips_by_prefix_length() {
    let mut wire = minimal();
    wire.addresses = vec![
        vip("", vec![10, 96, 0, 1], None),
        vip("net", vec![10, 96, 0, 2], Some(32)),
        vip("", vec![10, 128, 7, 7], Some(16)),
        vip(
            "",
            [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1].to_vec(),
            Some(128),
        ),
        vip("", vec![0; 16], Some(0)),
    ];
    let service = Service::try_from(&wire).unwrap();
    let vips: Vec<String> = service.vips.iter().map(ToString::to_string).collect();
    assert_eq!(vips, ["/10.96.0.1", "net/10.96.0.2", "/fd00::1"]);
    let cidrs: Vec<String> = service
        .cidr_vips
        .iter()
        .map(|vip| vip.cidr.to_string())
        .collect();
    assert_eq!(cidrs, ["10.128.0.0/16", "::/0"]);
    assert_eq!(service.ports.get(&80), Some(&8080));
    assert_eq!(
        service.key().to_string(),
        "default/echo.default.svc.cluster.local"
    );
}

#[test]
fn non_spiffe_subject_alt_names_are_dropped() {
    let mut wire = minimal();
    wire.subject_alt_names = vec![
        "spiffe://cluster.local/ns/default/sa/echo".into(),
        "echo.example.com".into(),
    ];
    let service = Service::try_from(&wire).unwrap();
    let sans: Vec<&str> = service
        .subject_alt_names
        .iter()
        .map(|id| id.as_str())
        .collect();
    assert_eq!(sans, ["spiffe://cluster.local/ns/default/sa/echo"]);
}

#[test]
fn waypoints_load_balancing_and_flags_are_carried_over() {
    let mut wire = minimal();
    let waypoint = proto::GatewayAddress {
        destination: Some(proto::gateway_address::Destination::Address(vip(
            "",
            vec![10, 0, 0, 9],
            None,
        ))),
        hbone_mtls_port: 15008,
    };
    wire.waypoint = Some(waypoint.clone());
    wire.weighted_waypoints = vec![proto::WeightedWaypoint {
        destination: Some(waypoint),
        weight: 3,
    }];
    wire.load_balancing = Some(proto::LoadBalancing {
        routing_preference: vec![2, 1],
        mode: proto::load_balancing::Mode::Failover as i32,
        health_policy: proto::load_balancing::HealthPolicy::AllowAll as i32,
    });
    wire.ip_families = proto::IpFamilies::Dual as i32;
    wire.canonical = true;
    wire.ingress_use_waypoint = true;
    wire.visibility = 9;

    let service = Service::try_from(&wire).unwrap();
    assert!(matches!(
        service.waypoint.unwrap().destination,
        GatewayDestination::Address(_)
    ));
    assert_eq!(service.weighted_waypoints[0].weight, 3);
    assert_eq!(
        service.load_balancing,
        Some(LoadBalancing {
            routing_preferences: vec![RoutingScope::Zone, RoutingScope::Region],
            mode: LoadBalancingMode::Failover,
            health_policy: HealthPolicy::AllowAll,
        })
    );
    assert_eq!(service.ip_families, IpFamilies::Dual);
    assert!(service.canonical && service.ingress_use_waypoint);
    assert_eq!(
        service.visibility,
        Visibility::Public,
        "unknown visibility reads as PUBLIC"
    );
}

#[test]
fn bad_services_are_rejected_with_the_nack_message() {
    type Edit = fn(&mut proto::Service);
    let cases: &[(&str, Edit, &str)] = &[
        (
            "3-byte VIP",
            |s| s.addresses = vec![vip("", vec![1, 2, 3], None)],
            "failed to parse address, had 3 bytes",
        ),
        (
            "IPv4 VIP prefix 33",
            |s| s.addresses = vec![vip("", vec![10, 0, 0, 0], Some(33))],
            "invalid cidr: prefix length 33 is above 32",
        ),
        (
            "IPv6 VIP prefix 129",
            |s| s.addresses = vec![vip("", vec![0; 16], Some(129))],
            "invalid cidr: prefix length 129 is above 128",
        ),
        (
            "unknown ip family",
            |s| s.ip_families = 4,
            "decode error: unknown enumeration value 4",
        ),
        (
            "unspecified routing scope",
            |s| {
                s.load_balancing = Some(proto::LoadBalancing {
                    routing_preference: vec![1, 0],
                    mode: 0,
                    health_policy: 0,
                })
            },
            "unknown enum: unsupported routing preference: unspecified scope",
        ),
        (
            "unknown routing scope",
            |s| {
                s.load_balancing = Some(proto::LoadBalancing {
                    routing_preference: vec![7],
                    mode: 0,
                    health_policy: 0,
                })
            },
            "decode error: unknown enumeration value 7",
        ),
        (
            "unknown balancing mode",
            |s| {
                s.load_balancing = Some(proto::LoadBalancing {
                    routing_preference: vec![],
                    mode: 4,
                    health_policy: 0,
                })
            },
            "decode error: unknown enumeration value 4",
        ),
        (
            "unknown health policy",
            |s| {
                s.load_balancing = Some(proto::LoadBalancing {
                    routing_preference: vec![],
                    mode: 0,
                    health_policy: 2,
                })
            },
            "decode error: unknown enumeration value 2",
        ),
        (
            "waypoint without destination",
            |s| s.waypoint = Some(proto::GatewayAddress::default()),
            "gateway address has no destination",
        ),
        (
            "weighted waypoint without destination",
            |s| {
                s.weighted_waypoints = vec![proto::WeightedWaypoint {
                    destination: None,
                    weight: 1,
                }]
            },
            "gateway address has no destination",
        ),
        (
            "service port above 65535",
            |s| {
                s.ports = vec![proto::Port {
                    service_port: 65536,
                    target_port: 80,
                    app_protocol: 0,
                }]
            },
            "port 65536 is out of range",
        ),
    ];
    for (name, edit, message) in cases {
        let mut wire = minimal();
        edit(&mut wire);
        let error = Service::try_from(&wire).expect_err(name);
        assert_eq!(error.to_string(), *message, "{name}");
    }
}

/// The health policy as the store applies it (AMBIENT.md §4.1): each row
/// is a sequence of pushes, then the endpoints the service is left with.
#[test]
fn health_policy_table() {
    use crate::state::{State, Workload};

    enum Push {
        Service(HealthPolicy),
        RemoveService,
        Workload(&'static str, HealthStatus),
    }
    use HealthPolicy::{AllowAll, OnlyHealthy};
    use HealthStatus::{Healthy, Unhealthy};
    use Push::{RemoveService, Service as Svc, Workload as Wl};

    #[rustfmt::skip]
    let cases: &[(&str, &[Push], &[&str])] = &[
        ("healthy is an endpoint", &[Svc(OnlyHealthy), Wl("a", Healthy)], &["a"]),
        ("unhealthy is left out", &[Svc(OnlyHealthy), Wl("a", Unhealthy)], &[]),
        ("unhealthy is kept under ALLOW_ALL", &[Svc(AllowAll), Wl("a", Unhealthy)], &["a"]),
        ("a push to unhealthy takes it out", &[Svc(OnlyHealthy), Wl("a", Healthy), Wl("a", Unhealthy)], &[]),
        ("a push back to healthy puts it back", &[Svc(OnlyHealthy), Wl("a", Unhealthy), Wl("a", Healthy)], &["a"]),
        ("ONLY_HEALTHY to ALLOW_ALL restores nothing by itself",
            &[Svc(OnlyHealthy), Wl("a", Unhealthy), Wl("b", Healthy), Svc(AllowAll)], &["b"]),
        ("... until the workload is pushed again",
            &[Svc(OnlyHealthy), Wl("a", Unhealthy), Svc(AllowAll), Wl("a", Unhealthy)], &["a"]),
        ("ALLOW_ALL to ONLY_HEALTHY filters the stored endpoints at once",
            &[Svc(AllowAll), Wl("a", Unhealthy), Wl("b", Healthy), Svc(OnlyHealthy)], &["b"]),
        ("workloads before their service are filtered when it arrives",
            &[Wl("a", Unhealthy), Wl("b", Healthy), Svc(OnlyHealthy)], &["b"]),
        ("... and all kept when it allows all",
            &[Wl("a", Unhealthy), Wl("b", Healthy), Svc(AllowAll)], &["a", "b"]),
        ("a service removed and pushed again is filtered again",
            &[Svc(AllowAll), Wl("a", Unhealthy), RemoveService, Svc(OnlyHealthy)], &[]),
    ];
    let key: crate::state::NamespacedHostname =
        "default/echo.default.svc.cluster.local".parse().unwrap();
    for (why, pushes, want) in cases {
        let mut state = State::new();
        for push in *pushes {
            match push {
                Svc(policy) => {
                    let mut service = super::Service::for_test(
                        "default",
                        "echo.default.svc.cluster.local",
                        &[],
                        &[(80, 80)],
                    );
                    service.load_balancing = Some(LoadBalancing {
                        health_policy: *policy,
                        ..LoadBalancing::default()
                    });
                    state.insert_service(service);
                }
                RemoveService => {
                    state.remove_service(&key);
                }
                Wl(uid, status) => {
                    let mut workload = Workload::for_test(uid, "default", &[]);
                    workload.status = *status;
                    workload.services = [(key.clone(), Default::default())].into_iter().collect();
                    state.insert_workload(workload);
                }
            }
        }
        let endpoints: Vec<&str> = state.endpoints(&key).map(|w| &*w.uid).collect();
        assert_eq!(endpoints, *want, "{why}");
    }
}
