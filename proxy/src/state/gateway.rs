//! What a waypoint's or network gateway's address names in the store
//! (AMBIENT.md §2.2, §3.4 step 1). Only the lookup: which endpoint of a
//! gateway service to dial, and on which port, is the outbound path's
//! choice; whether the local workload stands behind a waypoint is the
//! inbound path's.

use std::sync::Arc;

use super::State;
use super::network::{GatewayAddress, GatewayDestination};
use super::service::Service;
use super::workload::Workload;

/// The resource a [`GatewayAddress`] names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GatewayTarget {
    /// A service: the gateway's instances are its endpoints.
    Service(Arc<Service>),
    /// One workload.
    Workload(Arc<Workload>),
}

impl GatewayTarget {
    /// Whether `workload` is (one of) the gateway's instances: the workload
    /// itself, or an endpoint of the service.
    pub fn has_instance(&self, state: &State, workload: &Workload) -> bool {
        match self {
            GatewayTarget::Workload(target) => target.uid == workload.uid,
            GatewayTarget::Service(service) => state
                .endpoints(&service.key())
                .any(|endpoint| endpoint.uid == workload.uid),
        }
    }
}

/// Looks `gateway` up as istio/ztunnel does: by hostname, the service with
/// that namespace and hostname, else a workload with that `hostname` in
/// that namespace; by address, the service with that VIP on that network,
/// else the workload owning that IP there. `None` when nothing matches.
pub fn find_gateway(state: &State, gateway: &GatewayAddress) -> Option<GatewayTarget> {
    match &gateway.destination {
        GatewayDestination::Hostname(name) => {
            if let Some(service) = state.service(name) {
                return Some(GatewayTarget::Service(service.clone()));
            }
            state
                .workloads()
                .filter(|workload| {
                    *workload.hostname == *name.hostname && *workload.namespace == *name.namespace
                })
                .min_by(|a, b| a.uid.cmp(&b.uid))
                .map(|workload| GatewayTarget::Workload(workload.clone()))
        }
        GatewayDestination::Address(address) => {
            if let Some(service) = state.service_by_vip(&address.network, address.address) {
                return Some(GatewayTarget::Service(service.clone()));
            }
            state
                .workload_by_address(&address.network, address.address)
                .map(|workload| GatewayTarget::Workload(workload.clone()))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;
    use crate::state::{NamespacedHostname, NetworkAddress};

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn by_address(network: &str, address: &str) -> GatewayAddress {
        GatewayAddress {
            destination: GatewayDestination::Address(NetworkAddress {
                network: network.into(),
                address: ip(address),
            }),
            hbone_mtls_port: 15008,
        }
    }

    fn by_hostname(namespace: &str, hostname: &str) -> GatewayAddress {
        GatewayAddress {
            destination: GatewayDestination::Hostname(NamespacedHostname {
                namespace: namespace.into(),
                hostname: hostname.into(),
            }),
            hbone_mtls_port: 15008,
        }
    }

    #[test]
    fn a_gateway_is_a_service_first_then_a_workload_on_the_named_network() {
        let mut state = State::new();
        state.insert_service(Service::for_test(
            "ns",
            "waypoint.ns.svc.cluster.local",
            &[ip("10.96.0.9")],
            &[(15008, 15008)],
        ));
        let mut pod = Workload::for_test("waypoint-pod", "ns", &[ip("10.0.0.3")]);
        pod.services.insert(
            "ns/waypoint.ns.svc.cluster.local".parse().unwrap(),
            Default::default(),
        );
        state.insert_workload(pod);
        let mut named = Workload::for_test("named", "ns", &[]);
        named.hostname = "wp.example".into();
        state.insert_workload(named);

        let service = |gateway: &GatewayAddress| match find_gateway(&state, gateway) {
            Some(GatewayTarget::Service(service)) => service.hostname.to_string(),
            other => panic!("{gateway:?}: {other:?}"),
        };
        let workload = |gateway: &GatewayAddress| match find_gateway(&state, gateway) {
            Some(GatewayTarget::Workload(workload)) => workload.uid.to_string(),
            other => panic!("{gateway:?}: {other:?}"),
        };
        assert_eq!(
            service(&by_hostname("ns", "waypoint.ns.svc.cluster.local")),
            "waypoint.ns.svc.cluster.local"
        );
        assert_eq!(
            service(&by_address("", "10.96.0.9")),
            "waypoint.ns.svc.cluster.local"
        );
        assert_eq!(workload(&by_address("", "10.0.0.3")), "waypoint-pod");
        assert_eq!(workload(&by_hostname("ns", "wp.example")), "named");
        for missing in [
            by_hostname("other", "waypoint.ns.svc.cluster.local"),
            by_hostname("other", "wp.example"),
            by_address("far", "10.0.0.3"),
            by_address("", "10.0.0.4"),
        ] {
            assert_eq!(find_gateway(&state, &missing), None, "{missing:?}");
        }

        let Some(target) = find_gateway(&state, &by_address("", "10.96.0.9")) else {
            panic!("the waypoint service is there");
        };
        let pod = state.workload("waypoint-pod").unwrap().clone();
        let named = state.workload("named").unwrap().clone();
        assert!(target.has_instance(&state, &pod));
        assert!(!target.has_instance(&state, &named));
    }
}
