//! ServiceEntries, WorkloadEntries and their visibility as they go out
//! on the wire, from one mesh-file fixture.

use super::*;

/// A mesh file with Istio's objects as Kubernetes holds them: a DNS
/// ServiceEntry with neither endpoints nor selector, a STATIC one with
/// inline endpoints, one selecting a pod and a WorkloadEntry by label.
const ENTRIES: &str = "\
pods:
- {name: api-1, namespace: shop, uid: u-api-1, serviceAccount: api, nodeName: node-a, ips: [10.0.0.1],
   labels: {app: api}, containerPorts: {http-alt: 9080}}
workloadEntries:
- metadata: {name: vm-1, namespace: shop, labels: {app: api}}
  spec: {address: 10.9.0.1, serviceAccount: vm, weight: 3, locality: r1/z1, ports: {http-alt: 7080}}
serviceEntries:
- metadata: {name: external, namespace: shop}
  spec:
    hosts: [api.example.com]
    ports: [{number: 443, name: https, protocol: TLS}]
    resolution: DNS
    location: MESH_EXTERNAL
- metadata: {name: static, namespace: shop, labels: {app: ext}}
  spec:
    hosts: [db.example.com]
    addresses: [10.99.0.1]
    ports: [{number: 5432, name: tcp, targetPort: 15432}]
    resolution: STATIC
    endpoints: [{address: 10.8.0.1}, {address: 10.8.0.2, ports: {tcp: 25432}}]
- metadata: {name: selected, namespace: shop}
  spec:
    hosts: [api.internal]
    ports: [{number: 80, name: http-alt}, {number: 81, name: other, targetPort: 8081}]
    location: MESH_INTERNAL
    resolution: STATIC
    workloadSelector: {labels: {app: api}}
";

#[test]
fn service_entry_hosts_become_services_and_dns_hosts_their_own_endpoints() {
    let (workloads, services) = convert(ENTRIES);
    let external = &services["shop/api.example.com"];
    assert_eq!(external.name, "external");
    assert_eq!(
        external.addresses,
        [
            ProtoNetworkAddress {
                network: String::new(),
                address: vec![240, 240, 0, 1],
                length: None,
            },
            ProtoNetworkAddress {
                network: String::new(),
                address: "2001:2::1"
                    .parse::<std::net::Ipv6Addr>()
                    .unwrap()
                    .octets()
                    .to_vec(),
                length: None,
            },
        ],
        "allocated from istiod's ranges, the file having no status to write"
    );
    assert_eq!(
        external.ports,
        [Port {
            service_port: 443,
            target_port: 443,
            app_protocol: proto_workload::AppProtocol::Tls as i32,
        }]
    );
    assert!(external.canonical);
    let host =
        &workloads["Kubernetes/networking.istio.io/ServiceEntry/shop/external/api.example.com"];
    assert_eq!(host.hostname, "api.example.com");
    assert!(host.addresses.is_empty());
    assert_eq!(
        (host.name.as_str(), host.workload_name.as_str()),
        ("external", "external")
    );
    assert_eq!(host.tunnel_protocol, TunnelProtocol::None as i32);
    assert_eq!(
        host.services["shop/api.example.com"].ports[0].target_port,
        443
    );

    let static_entry = &services["shop/db.example.com"];
    assert_eq!(static_entry.addresses[0].address, vec![10, 99, 0, 1]);
    assert_eq!(static_entry.ports[0].target_port, 15432);
    let first = &workloads["Kubernetes/networking.istio.io/ServiceEntry/shop/static/10.8.0.1"];
    let second = &workloads["Kubernetes/networking.istio.io/ServiceEntry/shop/static/10.8.0.2"];
    assert_eq!(first.addresses, [vec![10, 8, 0, 1]]);
    assert_eq!(first.canonical_name, "ext", "from the entry's labels");
    assert_eq!(
        first.services["shop/db.example.com"].ports[0].target_port,
        15432
    );
    assert_eq!(
        second.services["shop/db.example.com"].ports[0].target_port, 25432,
        "an endpoint port named like the service port"
    );
}

#[test]
fn service_entry_resolution_none_passes_through_and_selectors_pick_pods_and_workload_entries() {
    let (workloads, services) = convert(&ENTRIES.replace(
        "    location: MESH_INTERNAL\n    resolution: STATIC",
        "    location: MESH_INTERNAL\n    resolution: NONE",
    ));
    let selected = &services["shop/api.internal"];
    assert!(
        selected.addresses.is_empty(),
        "NONE takes no allocated address"
    );
    let balancing = selected.load_balancing.as_ref().unwrap();
    assert_eq!(
        (balancing.mode, balancing.health_policy),
        (
            proto_workload::load_balancing::Mode::Passthrough as i32,
            proto_workload::load_balancing::HealthPolicy::AllowAll as i32
        )
    );
    let ports = |uid: &str| -> Vec<(u32, u32)> {
        workloads[uid].services["shop/api.internal"]
            .ports
            .iter()
            .map(|port| (port.service_port, port.target_port))
            .collect()
    };
    assert_eq!(
        ports("u-api-1"),
        [(80, 9080), (81, 8081)],
        "the pod's container port named like the entry's port, else the target"
    );
    assert_eq!(
        ports("Kubernetes/networking.istio.io/WorkloadEntry/shop/vm-1"),
        [(80, 7080), (81, 8081)]
    );
}

#[test]
fn export_to_visibility_of_the_mesh_config_goes_out_on_each_service() {
    let (_, services) = convert(ENTRIES);
    let public = proto_workload::service::Visibility::Public as i32;
    assert!(
        services
            .values()
            .all(|service| service.visibility == public)
    );
    let (_, services) = convert(&format!(
        "{ENTRIES}serviceEntryVisibility: {{defaultVisibility: NAMESPACE}}\n"
    ));
    let namespace = proto_workload::service::Visibility::Namespace as i32;
    assert_eq!(services["shop/api.example.com"].visibility, namespace);
}

#[test]
fn workload_entry_becomes_a_workload_as_istiod_sends_it() {
    let (workloads, _) = convert(ENTRIES);
    let vm = &workloads["Kubernetes/networking.istio.io/WorkloadEntry/shop/vm-1"];
    assert_eq!((vm.name.as_str(), vm.namespace.as_str()), ("vm-1", "shop"));
    assert_eq!(vm.addresses, [vec![10, 9, 0, 1]]);
    assert_eq!(vm.service_account, "vm");
    assert_eq!(vm.capacity, Some(3));
    assert_eq!(
        vm.locality
            .as_ref()
            .map(|l| (l.region.as_str(), l.zone.as_str())),
        Some(("r1", "z1"))
    );
    assert_eq!(
        (vm.canonical_name.as_str(), vm.canonical_revision.as_str()),
        ("api", "latest")
    );
    assert_eq!(vm.workload_type, WorkloadType::Pod as i32);
    assert_eq!(vm.status, WorkloadStatus::Healthy as i32);
    assert_eq!(vm.tunnel_protocol, TunnelProtocol::None as i32);
    assert_eq!(vm.trust_domain, "", "istiod leaves cluster.local out");
    assert_eq!(vm.cluster_id, "Kubernetes");
    let mut services: Vec<&str> = vm.services.keys().map(String::as_str).collect();
    services.sort_unstable();
    assert_eq!(services, ["shop/api.internal"]);
}
