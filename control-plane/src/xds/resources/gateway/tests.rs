//! Waypoints and network gateways of a mesh file on the wire: a service's
//! and a pod's waypoint by service name, hostname or address, the weighted
//! pair, a waypoint instance's application tunnel, and network gateways
//! as workloads and as the `network_gateway` of their network's pods.

use std::collections::HashMap;

use ztunnel_mesh::{MeshFile, MeshSnapshot};
use ztunnel_proto::istio::workload::{
    Address, GatewayAddress, NamespacedHostname, NetworkAddress as ProtoNetworkAddress,
    Service as ProtoService, Workload, address, application_tunnel, gateway_address::Destination,
};

use super::super::addresses;

const MESH: &str = "\
pods:
- {name: web-1, namespace: shop, uid: u-web-1, serviceAccount: web, ips: [10.0.0.1], labels: {app: web},
   waypoint: {service: wp}, locality: {region: eu, zone: eu-1}}
- {name: db-1, namespace: shop, uid: u-db-1, serviceAccount: db, ips: [10.0.1.1], network: net-2,
   waypoint: {address: net-2/10.0.1.9, port: 15009}}
- {name: wp-1, namespace: shop, uid: u-wp-1, serviceAccount: wp, ips: [10.0.0.9],
   labels: {app: wp}, applicationTunnel: {protocol: PROXY, port: 15088}}
services:
- {name: web, namespace: shop, hostname: web.shop.svc.cluster.local, vips: [10.96.0.1], ports: {80: 8080},
   selector: {app: web}, waypoint: {service: shop/wp}, ingressUseWaypoint: true,
   weightedWaypoints: [{waypoint: {service: wp}, weight: 90},
                       {waypoint: {hostname: canary.shop.svc.cluster.local, namespace: shop}, weight: 10}]}
- {name: wp, namespace: shop, hostname: wp.shop.svc.cluster.local, vips: [10.96.0.9], ports: {15008: 15008},
   selector: {app: wp}}
networkGateways:
- {network: net-2, namespace: istio-system, serviceAccount: eastwest, address: 192.0.2.7, port: 15009}
- {network: net-2, namespace: istio-system, serviceAccount: later, hostname: gw.example.com}
";

fn wire(yaml: &str) -> (HashMap<String, Workload>, HashMap<String, ProtoService>) {
    let file: MeshFile = serde_yaml_ng::from_str(yaml).unwrap();
    let snapshot = MeshSnapshot::new(file).unwrap();
    let mut workloads = HashMap::new();
    let mut services = HashMap::new();
    for (name, Address { r#type }) in addresses(&snapshot, "cluster.local") {
        match r#type {
            Some(address::Type::Workload(workload)) => {
                workloads.insert(name, workload);
            }
            Some(address::Type::Service(service)) => {
                services.insert(name, service);
            }
            None => panic!("{name}: empty"),
        }
    }
    (workloads, services)
}

fn hostname(host: &str) -> Option<GatewayAddress> {
    Some(GatewayAddress {
        destination: Some(Destination::Hostname(NamespacedHostname {
            namespace: "shop".into(),
            hostname: host.into(),
        })),
        hbone_mtls_port: 15008,
    })
}

fn address(network: &str, ip: [u8; 4], port: u32) -> Option<GatewayAddress> {
    Some(GatewayAddress {
        destination: Some(Destination::Address(ProtoNetworkAddress {
            network: network.into(),
            address: ip.to_vec(),
            length: None,
        })),
        hbone_mtls_port: port,
    })
}

#[test]
fn a_services_waypoints_go_on_the_wire_by_hostname() {
    let (_, services) = wire(MESH);
    let web = &services["shop/web.shop.svc.cluster.local"];
    assert_eq!(
        web.waypoint,
        hostname("wp.shop.svc.cluster.local"),
        "by name, resolved"
    );
    let weighted: Vec<(Option<GatewayAddress>, u32)> = web
        .weighted_waypoints
        .iter()
        .map(|weighted| (weighted.destination.clone(), weighted.weight))
        .collect();
    assert_eq!(
        weighted,
        [
            (hostname("wp.shop.svc.cluster.local"), 90),
            (hostname("canary.shop.svc.cluster.local"), 10),
        ]
    );
    assert!(web.ingress_use_waypoint);
    let waypoint = &services["shop/wp.shop.svc.cluster.local"];
    assert_eq!(
        waypoint.waypoint, None,
        "the waypoint's own service goes direct"
    );
}

#[test]
fn pods_carry_their_waypoint_tunnel_locality_and_network_gateway() {
    let (workloads, _) = wire(MESH);
    let web = &workloads["u-web-1"];
    assert_eq!(web.waypoint, hostname("wp.shop.svc.cluster.local"));
    assert_eq!(
        web.network_gateway, None,
        "no gateway into the default network"
    );
    let locality = web.locality.as_ref().unwrap();
    assert_eq!(
        (locality.region.as_str(), locality.zone.as_str()),
        ("eu", "eu-1")
    );
    let db = &workloads["u-db-1"];
    assert_eq!(db.waypoint, address("net-2", [10, 0, 1, 9], 15009));
    assert_eq!(db.network, "net-2");
    assert_eq!(
        db.network_gateway,
        address("net-2", [192, 0, 2, 7], 15009),
        "the first gateway of the pod's network"
    );
    let tunnel = workloads["u-wp-1"].application_tunnel.unwrap();
    assert_eq!(tunnel.protocol, application_tunnel::Protocol::Proxy as i32);
    assert_eq!(tunnel.port, 15088);
}

#[test]
fn network_gateways_are_sent_as_workloads_with_their_identity() {
    let (workloads, _) = wire(MESH);
    let by_ip = &workloads["NetworkGateway/net-2/192.0.2.7/15009"];
    assert_eq!(by_ip.name, by_ip.uid);
    assert_eq!(
        (by_ip.namespace.as_str(), by_ip.service_account.as_str()),
        ("istio-system", "eastwest")
    );
    assert_eq!(by_ip.network, "net-2");
    assert_eq!(by_ip.addresses, [vec![192, 0, 2, 7]]);
    let by_name = &workloads["NetworkGateway/net-2/gw.example.com/15008"];
    assert_eq!(by_name.hostname, "gw.example.com");
    assert!(by_name.addresses.is_empty());
}

#[test]
fn a_waypoint_naming_no_service_of_the_file_is_refused() {
    let yaml = "\
pods:
- {name: web-1, namespace: shop, uid: u-web-1, serviceAccount: web, waypoint: {service: nope}}
";
    let file: MeshFile = serde_yaml_ng::from_str(yaml).unwrap();
    let error = MeshSnapshot::new(file).unwrap_err().to_string();
    assert_eq!(
        error,
        "pod shop/web-1: waypoint shop/nope is not a service of the file"
    );
    for bad in [
        "{service: a, address: 10.0.0.1}",
        "{hostname: wp.example}",
        "{address: 10.0.0.1, port: 0}",
    ] {
        let yaml = format!(
            "pods:\n- {{name: p, namespace: n, uid: u, serviceAccount: s, waypoint: {bad}}}\n"
        );
        assert!(
            serde_yaml_ng::from_str::<MeshFile>(&yaml).is_err(),
            "{bad} is refused"
        );
    }
}
