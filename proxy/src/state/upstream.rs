//! Upstream selection: where an outbound connection to an original
//! destination goes. A pure function over the store; the caller supplies the
//! random number that spreads connections across endpoints.
//!
//! How the connection is then made (HBONE or plain TCP) is the outbound
//! path's business; this only says what is there.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use ztunnel_certs::identity::Identity;

use super::State;
use super::service::{HealthPolicy, Service};
use super::workload::{HealthStatus, InboundProtocol, Workload};

/// What an original destination resolves to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Destination {
    /// A known workload: the destination IP is its own, or it was picked as
    /// an endpoint of the service VIP dialled.
    Workload(Endpoint),
    /// A service VIP whose service has no endpoint to send to: none healthy,
    /// or none on the caller's network.
    NoHealthyEndpoint {
        /// The service dialled.
        service: Arc<Service>,
    },
    /// A service VIP on a port the service does not declare.
    UnknownServicePort {
        /// The service dialled.
        service: Arc<Service>,
        /// The port dialled.
        port: u16,
    },
    /// Nothing known at this address: pass the connection through as plain TCP.
    Unknown,
}

/// A workload to connect to, and how it was reached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// The destination workload.
    pub workload: Arc<Workload>,
    /// Its address and port to dial: for a service, the endpoint's IP and the
    /// target port.
    pub addr: SocketAddr,
    /// The service whose VIP was dialled, if any.
    pub service: Option<Arc<Service>>,
}

impl Endpoint {
    /// How the workload takes traffic: HBONE tunnel or plain TCP.
    pub fn protocol(&self) -> InboundProtocol {
        self.workload.protocol
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

/// Resolves `dst` as seen from a workload on `network`.
///
/// A workload IP wins over a service VIP. For a VIP, an endpoint is picked
/// among the service's healthy endpoints on `network` (any endpoint, when
/// the service's health policy is `AllowAll`), as `pick` modulo their count
/// in uid order; the caller passes a random `pick` to spread connections.
/// Endpoints on other networks are skipped: reaching them needs the network
/// gateway, which is not used yet.
pub fn select_upstream(state: &State, network: &str, dst: SocketAddr, pick: u64) -> Destination {
    let ip = dst.ip().to_canonical();
    if let Some(workload) = state.workload_by_address(network, ip) {
        return Destination::Workload(Endpoint {
            workload: workload.clone(),
            addr: SocketAddr::new(ip, dst.port()),
            service: None,
        });
    }
    match state.service_by_vip(network, ip) {
        Some(service) => select_endpoint(state, network, service, ip, dst.port(), pick),
        None => Destination::Unknown,
    }
}

fn select_endpoint(
    state: &State,
    network: &str,
    service: &Arc<Service>,
    vip: IpAddr,
    service_port: u16,
    pick: u64,
) -> Destination {
    let Some(&service_target) = service.ports.get(&service_port) else {
        return Destination::UnknownServicePort {
            service: service.clone(),
            port: service_port,
        };
    };
    let allow_unhealthy = service
        .load_balancing
        .as_ref()
        .is_some_and(|balancing| balancing.health_policy == HealthPolicy::AllowAll);
    let key = service.key();
    let candidates = || {
        state.endpoints(&key).filter(move |workload| {
            (allow_unhealthy || workload.status == HealthStatus::Healthy)
                && *workload.network == *network
                && !workload.addresses.is_empty()
        })
    };
    let count = candidates().count() as u64;
    let chosen = pick.checked_rem(count).and_then(|index| {
        let index = usize::try_from(index).ok()?;
        candidates().nth(index)
    });
    let Some(workload) = chosen else {
        return Destination::NoHealthyEndpoint {
            service: service.clone(),
        };
    };
    let Some(ip) = endpoint_address(workload, vip) else {
        return Destination::NoHealthyEndpoint {
            service: service.clone(),
        };
    };
    // The endpoint's own mapping wins: a named target port can resolve to a
    // different number on each endpoint. A target of 0 means "unset".
    let target_port = workload
        .services
        .get(&key)
        .and_then(|ports| ports.get(&service_port))
        .copied()
        .filter(|port| *port != 0)
        .or(Some(service_target).filter(|port| *port != 0))
        .unwrap_or(service_port);
    Destination::Workload(Endpoint {
        workload: workload.clone(),
        addr: SocketAddr::new(ip, target_port),
        service: Some(service.clone()),
    })
}

/// The endpoint's first address of the VIP's family, else its first address.
fn endpoint_address(workload: &Workload, vip: IpAddr) -> Option<IpAddr> {
    workload
        .addresses
        .iter()
        .find(|ip| ip.is_ipv4() == vip.is_ipv4())
        .or_else(|| workload.addresses.first())
        .copied()
}

#[cfg(test)]
mod tests;
