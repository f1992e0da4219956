//! The mesh the state benchmarks load: 10,000 workloads behind 1,000
//! services in 100 namespaces, built as the control plane sends them
//! (`istio.workload` messages). Shared by `lookup` and `memory`.

use std::net::Ipv4Addr;

use ztunnel_proto::istio::workload as proto;
use ztunnel_proxy::state::{Interner, Service, State, Workload};

/// Workloads in the store: a large cluster's pods, as one node's proxy
/// sees them all.
pub const WORKLOADS: u32 = 10_000;
/// Services in the store; with `WORKLOADS` that is 10 endpoints each.
pub const SERVICES: u32 = 1_000;
/// Namespaces the services and workloads spread over, 10 services each.
const NAMESPACES: u32 = 100;
/// First workload IP, 10.1.0.0: room for 65,536 pods in one block.
const WORKLOAD_BASE: u32 = u32::from_be_bytes([10, 1, 0, 0]);
/// First service VIP, 10.96.0.0, the Kubernetes default service range.
const SERVICE_BASE: u32 = u32::from_be_bytes([10, 96, 0, 0]);

pub fn workload_ip(index: u32) -> Ipv4Addr {
    Ipv4Addr::from(WORKLOAD_BASE + index)
}

pub fn service_vip(index: u32) -> Ipv4Addr {
    Ipv4Addr::from(SERVICE_BASE + index)
}

fn namespace(service: u32) -> String {
    format!("ns-{:03}", service % NAMESPACES)
}

fn hostname(service: u32) -> String {
    format!("svc-{service}.{}.svc.cluster.local", namespace(service))
}

/// Service `index`: one VIP, two ports, as most Kubernetes services have.
pub fn service(index: u32) -> proto::Service {
    proto::Service {
        name: format!("svc-{index}"),
        namespace: namespace(index),
        hostname: hostname(index),
        addresses: vec![proto::NetworkAddress {
            network: String::new(),
            address: service_vip(index).octets().to_vec(),
            length: None,
        }],
        ports: vec![port(80, 8080), port(443, 8443)],
        ..proto::Service::default()
    }
}

fn port(service_port: u32, target_port: u32) -> proto::Port {
    proto::Port {
        service_port,
        target_port,
        ..proto::Port::default()
    }
}

/// Workload `index`: an HBONE pod, endpoint of service `index % SERVICES`.
pub fn workload(index: u32) -> proto::Workload {
    let service = index % SERVICES;
    let ports = proto::PortList {
        ports: vec![port(80, 8080), port(443, 8443)],
    };
    proto::Workload {
        uid: format!("Kubernetes//Pod/{}/pod-{index}", namespace(service)),
        name: format!("pod-{index}"),
        namespace: namespace(service),
        addresses: vec![workload_ip(index).octets().to_vec()],
        tunnel_protocol: proto::TunnelProtocol::Hbone.into(),
        service_account: format!("svc-{service}"),
        // 100 nodes of 100 pods: the node only matters to the locality of endpoints.
        node: format!("node-{}", index % 100),
        canonical_name: format!("svc-{service}"),
        canonical_revision: "v1".into(),
        workload_name: format!("svc-{service}"),
        services: [(
            format!("{}/{}", namespace(service), hostname(service)),
            ports,
        )]
        .into(),
        ..proto::Workload::default()
    }
}

/// Workload `index`, converted on its own.
#[allow(dead_code)] // lookup's; the memory bench converts through `store_of`
pub fn typed_workload(index: u32) -> Workload {
    Workload::try_from(&workload(index)).unwrap()
}

/// A store holding `workloads` workloads and every service, converted as
/// the xDS client does: with one interner for all.
pub fn store_of(count: u32) -> State {
    let services = (0..SERVICES).map(|index| Service::try_from(&service(index)).unwrap());
    let mut interner = Interner::new();
    let workloads =
        (0..count).map(|index| Workload::from_proto(&workload(index), &mut interner).unwrap());
    let mut state = State::new();
    state.replace_all(workloads, services, []);
    assert_eq!(state.workloads().count(), count as usize);
    assert_eq!(state.services().count(), SERVICES as usize);
    state
}
