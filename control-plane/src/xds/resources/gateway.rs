//! Waypoints and network gateways of the mesh model → their wire forms
//! (WIRE.md §8: `GatewayAddress`, `ApplicationTunnel`), and the workload a
//! network gateway is sent as (AMBIENT.md §3.2), so node proxies know its
//! identity. Which objects are bound to which waypoint is decided before
//! the snapshot (`ztunnel_mesh::kube::convert`, or the mesh file).

use ztunnel_mesh::{ApplicationTunnel, GatewayDestination, NetworkGateway, TunnelHeader};
use ztunnel_proto::istio::workload::{
    self as proto_workload, NamespacedHostname, NetworkAddress as ProtoNetworkAddress,
    TunnelProtocol, Workload, WorkloadStatus, WorkloadType, gateway_address::Destination,
};

use super::{DEFAULT_CLUSTER_ID, ip_bytes};

/// A waypoint's or gateway's address on the wire. A destination still
/// naming a service by name has no wire form; the snapshot never holds one
/// (`MeshSnapshot::new` resolves them), and it is sent without a
/// destination rather than guessed.
pub(super) fn gateway_address(
    destination: &GatewayDestination,
    hbone_mtls_port: u16,
) -> proto_workload::GatewayAddress {
    let destination = match destination {
        GatewayDestination::Hostname {
            namespace,
            hostname,
        } => Some(Destination::Hostname(NamespacedHostname {
            namespace: namespace.clone(),
            hostname: hostname.clone(),
        })),
        GatewayDestination::Address(address) => Some(Destination::Address(ProtoNetworkAddress {
            network: address.network.clone(),
            address: ip_bytes(address.address),
            length: None,
        })),
        GatewayDestination::Service { .. } => None,
    };
    proto_workload::GatewayAddress {
        destination,
        hbone_mtls_port: u32::from(hbone_mtls_port),
    }
}

pub(super) fn application_tunnel(tunnel: ApplicationTunnel) -> proto_workload::ApplicationTunnel {
    use proto_workload::application_tunnel::Protocol;
    proto_workload::ApplicationTunnel {
        protocol: match tunnel.protocol {
            TunnelHeader::None => Protocol::None,
            TunnelHeader::Proxy => Protocol::Proxy,
        } as i32,
        port: u32::from(tunnel.port),
    }
}

/// The workload a network gateway is sent as: named
/// `NetworkGateway/<network>/<addr>/<port>`, with its identity, network
/// and address (or hostname). `trust_domain` is the CA's.
pub(super) fn network_gateway_workload(gateway: &NetworkGateway, trust_domain: &str) -> Workload {
    let uid = gateway.workload_uid();
    let (addresses, hostname) = match &gateway.destination {
        GatewayDestination::Address(address) => (vec![ip_bytes(address.address)], String::new()),
        GatewayDestination::Hostname { hostname, .. } => (Vec::new(), hostname.clone()),
        GatewayDestination::Service { .. } => (Vec::new(), String::new()),
    };
    Workload {
        name: uid.clone(),
        uid,
        namespace: gateway.namespace.clone(),
        service_account: gateway.service_account.clone(),
        network: gateway.network.clone(),
        trust_domain: trust_domain.to_owned(),
        addresses,
        hostname,
        tunnel_protocol: TunnelProtocol::Hbone as i32,
        status: WorkloadStatus::Healthy as i32,
        workload_type: WorkloadType::Deployment as i32,
        cluster_id: DEFAULT_CLUSTER_ID.to_owned(),
        ..Workload::default()
    }
}

#[cfg(test)]
mod tests;
