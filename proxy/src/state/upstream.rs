//! Upstream selection: where an outbound connection to an original
//! destination goes (AMBIENT.md §4). A pure function over the store; the
//! caller supplies the connecting workload, whose locality the service's
//! routing preferences are matched against, and the random number that
//! spreads connections across endpoints.
//!
//! The ranking and the weighted pick are `upstream/balance.rs`. How the
//! connection is then made (HBONE, plain TCP, through a network gateway)
//! is the outbound path's business; this only says what is there.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use ztunnel_certs::identity::Identity;

use super::State;
use super::network::NamespacedHostname;
use super::service::{LoadBalancingMode, Service};
use super::workload::{InboundProtocol, Workload};

mod balance;

/// What an original destination resolves to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Destination {
    /// A known workload: the destination IP is its own, or it was picked as
    /// an endpoint of the service VIP dialled.
    Workload(Endpoint),
    /// A service VIP with nothing to send to: the service lacks the port
    /// dialled, or no endpoint is left once health, the port, the routing
    /// preferences and the capacities have had their say.
    NoHealthyEndpoint {
        /// The service dialled.
        service: Arc<Service>,
    },
    /// The VIP of a `Passthrough` service: the connection goes to the
    /// original destination as it is, with no endpoint picked and no
    /// service attributed.
    Passthrough,
    /// Nothing known at this address: pass the connection through as plain TCP.
    Unknown,
}

/// A workload to connect to, and how it was reached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// The destination workload.
    pub workload: Arc<Workload>,
    /// How it is addressed.
    pub address: EndpointAddress,
    /// The port to deliver to: for a service, the target port.
    pub port: u16,
    /// The service whose VIP was dialled, if any.
    pub service: Option<Arc<Service>>,
}

/// How a chosen workload is addressed (AMBIENT.md §4.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndpointAddress {
    /// One of its IPs.
    Ip(IpAddr),
    /// Its `hostname`, resolved by DNS per connection.
    Hostname,
    /// No IP that serves the service, and no hostname; its network gateway
    /// may still reach it when it is on another network.
    NetworkGateway,
    /// No IP that serves the service, no hostname and no network gateway.
    Unreachable,
}

impl Endpoint {
    /// How the workload takes traffic: HBONE tunnel or plain TCP.
    pub fn protocol(&self) -> InboundProtocol {
        self.workload.protocol
    }

    /// The IP and port to reach it on, when it is addressed by IP.
    pub fn socket_addr(&self) -> Option<SocketAddr> {
        match self.address {
            EndpointAddress::Ip(ip) => Some(SocketAddr::new(ip, self.port)),
            EndpointAddress::Hostname
            | EndpointAddress::NetworkGateway
            | EndpointAddress::Unreachable => None,
        }
    }

    /// Identities the server may present over HBONE: the workload's own,
    /// then the service's `subject_alt_names`, without repeats.
    pub fn expected_identities(&self) -> Vec<Identity> {
        let mut identities = vec![self.workload.identity.clone()];
        for san in self
            .service
            .iter()
            .flat_map(|service| &service.subject_alt_names)
        {
            if !identities.contains(san) {
                identities.push(san.clone());
            }
        }
        identities
    }
}

/// Resolves `dst` as seen from the workload `source`, on its network.
///
/// A service VIP wins over a workload IP, as in istio/ztunnel's upstream
/// lookup. For a VIP, an endpoint is picked among the service's stored
/// (health-filtered) endpoints as AMBIENT.md §4.2–4.4 lay out; `pick` is
/// the caller's random number (see `balance::weighted`). The endpoint
/// may be on another network: reaching it through its network gateway is
/// the caller's decision.
pub fn select_upstream(
    state: &State,
    source: &Workload,
    dst: SocketAddr,
    pick: u64,
) -> Destination {
    let ip = dst.ip().to_canonical();
    let dst = SocketAddr::new(ip, dst.port());
    if let Some(service) = state.service_by_vip(&source.network, ip) {
        if service.mode() == LoadBalancingMode::Passthrough {
            return Destination::Passthrough;
        }
        return service_endpoint(state, source, service, dst, Resolution::Standard, pick);
    }
    match state.workload_by_address(&source.network, ip) {
        Some(workload) => Destination::Workload(Endpoint {
            workload: workload.clone(),
            address: EndpointAddress::Ip(ip),
            port: dst.port(),
            service: None,
        }),
        None => Destination::Unknown,
    }
}

/// What an endpoint of a service is picked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// A connection to the service itself: the port must be the service's.
    Standard,
    /// A hop to a waypoint service: the port (15008) need not be declared,
    /// for an endpoint with an application tunnel takes any.
    Waypoint,
}

/// Picks an endpoint of `service` for a connection to `dst` from `source`
/// (AMBIENT.md §4.2–4.4): `dst`'s port is the service port, and its IP
/// the address whose family the endpoint's address should have.
pub fn service_endpoint(
    state: &State,
    source: &Workload,
    service: &Arc<Service>,
    dst: SocketAddr,
    resolution: Resolution,
    pick: u64,
) -> Destination {
    let service_port = dst.port();
    let none = || Destination::NoHealthyEndpoint {
        service: service.clone(),
    };
    let service_target = service.ports.get(&service_port).copied();
    if service_target.is_none() && resolution == Resolution::Standard {
        return none();
    }
    let key = service.key();
    let candidates = state
        .endpoints(&key)
        .filter(|workload| {
            is_candidate(
                workload,
                source,
                &key,
                service_port,
                service_target,
                resolution,
            )
        })
        .collect();
    let kept = balance::preferred(
        service.mode(),
        service.routing_preferences(),
        source,
        candidates,
    );
    let Some(workload) = balance::weighted(&kept, pick) else {
        return none();
    };
    let service_target = service_target.unwrap_or(0);
    let Some(port) = target_port(workload, &key, service_port, service_target) else {
        return none();
    };
    Destination::Workload(Endpoint {
        workload: workload.clone(),
        address: endpoint_address(workload, service, dst.ip()),
        port,
        service: Some(service.clone()),
    })
}

/// Whether an endpoint of `service` may take a connection to
/// `service_port` (AMBIENT.md §4.2). One with neither IP nor hostname is
/// reachable only through its network gateway, which is never used on the
/// source's own network. For a standard connection with no target port on
/// the service (a named port), the endpoint must map the port itself; for
/// a waypoint hop to a port the service lacks, it must have an
/// application tunnel.
fn is_candidate(
    workload: &Workload,
    source: &Workload,
    service: &NamespacedHostname,
    service_port: u16,
    service_target: Option<u16>,
    resolution: Resolution,
) -> bool {
    let addressable = !workload.addresses.is_empty() || !workload.hostname.is_empty();
    let through_gateway = workload.network != source.network && workload.network_gateway.is_some();
    if !addressable && !through_gateway {
        return false;
    }
    match resolution {
        Resolution::Standard => {
            service_target.is_some_and(|port| port != 0)
                || own_port(workload, service, service_port).is_some()
        }
        Resolution::Waypoint => service_target.is_some() || workload.application_tunnel.is_some(),
    }
}

/// The endpoint's own mapping of `service_port`, as it came: a named target
/// port can resolve to a different number on each endpoint.
fn own_port(workload: &Workload, service: &NamespacedHostname, service_port: u16) -> Option<u16> {
    workload
        .services
        .get(service)
        .and_then(|ports| ports.get(&service_port))
        .copied()
}

/// The port to deliver to (AMBIENT.md §4.4): the endpoint's own mapping,
/// else the service's target port when set, else the service port itself
/// when the endpoint's application tunnel names a port (a waypoint hop:
/// the waypoint's ztunnel then delivers it), else none.
fn target_port(
    workload: &Workload,
    service: &NamespacedHostname,
    service_port: u16,
    service_target: u16,
) -> Option<u16> {
    if let Some(port) = own_port(workload, service, service_port) {
        return Some(port);
    }
    if service_target != 0 {
        return Some(service_target);
    }
    workload
        .application_tunnel
        .and_then(|tunnel| tunnel.port)
        .map(|_| service_port)
}

/// The address to dial the chosen endpoint on (AMBIENT.md §4.4): the
/// original destination if it is one of the endpoint's IPs; else, among
/// the IPs of a family the service serves, the first of the original's
/// family, else the first; else its hostname; else its network gateway.
fn endpoint_address(workload: &Workload, service: &Service, original: IpAddr) -> EndpointAddress {
    if workload.addresses.contains(&original) {
        return EndpointAddress::Ip(original);
    }
    let mut serving = workload
        .addresses
        .iter()
        .filter(|ip| service.ip_families.accepts(**ip));
    let first = serving.clone().next();
    if let Some(ip) = serving
        .find(|ip| ip.is_ipv6() == original.is_ipv6())
        .or(first)
    {
        return EndpointAddress::Ip(*ip);
    }
    if !workload.hostname.is_empty() {
        EndpointAddress::Hostname
    } else if workload.network_gateway.is_some() {
        EndpointAddress::NetworkGateway
    } else {
        EndpointAddress::Unreachable
    }
}

#[cfg(test)]
mod tests;
