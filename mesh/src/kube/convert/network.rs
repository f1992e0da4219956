//! The control plane's network and the gateways into other networks
//! (AMBIENT.md §3.1–3.2), from Gateway API Gateways. Pure. Which
//! workloads name which gateway is `xds/resources.rs`'s (the first gateway
//! of the workload's network with a known port).

use std::net::IpAddr;
use std::sync::Arc;

use super::super::gateway_crd::Gateway;
use super::waypoint::value_of;
use crate::{GatewayDestination, NetworkAddress, NetworkGateway};

/// On a Gateway: the network it leads into; on the system namespace: the
/// control plane's network.
pub(super) const NETWORK_LABEL: &str = "topology.istio.io/network";
/// On a Gateway: the service account of its pods.
const SERVICE_ACCOUNT_ANNOTATION: &str = "gateway.istio.io/service-account";
/// The class of gateways into a remote network, deployed locally.
const REMOTE_CLASS: &str = "istio-remote";
/// The class of a remote cluster's east-west gateway.
const EAST_WEST_CLASS: &str = "istio-east-west";

/// The gateways into other networks (§3.2): `istio-remote` Gateways with
/// a network label, status addresses and an HBONE listener, one per
/// address; `istio-east-west` ones whose HBONE listener terminates TLS,
/// with port 0 (not known from here). In namespace/name order, whatever
/// order the watch delivered them in: a network's first gateway is the
/// one its workloads name.
pub(super) fn network_gateways(gateways: &[Arc<Gateway>]) -> Vec<NetworkGateway> {
    let mut found = Vec::new();
    let mut gateways: Vec<&Arc<Gateway>> = gateways.iter().collect();
    gateways.sort_by(|a, b| {
        let key = |gateway: &Gateway| {
            (
                gateway.metadata.namespace.clone(),
                gateway.metadata.name.clone(),
            )
        };
        key(a).cmp(&key(b))
    });
    for gateway in gateways {
        let metadata = &gateway.metadata;
        let (Some(name), Some(namespace), Some(network)) = (
            metadata.name.as_deref(),
            metadata.namespace.as_deref(),
            value_of(&metadata.labels, NETWORK_LABEL),
        ) else {
            continue;
        };
        let hbone = gateway
            .spec
            .listeners
            .iter()
            .find(|listener| listener.protocol == "HBONE");
        let (port, default_account) = match (gateway.spec.gateway_class_name.as_str(), hbone) {
            (REMOTE_CLASS, Some(listener)) => (
                u16::try_from(listener.port).unwrap_or(0),
                format!("{name}-istio-remote"),
            ),
            (EAST_WEST_CLASS, Some(listener))
                if listener.tls.as_ref().and_then(|tls| tls.mode.as_deref())
                    == Some("Terminate") =>
            {
                (0, name.to_owned())
            }
            _ => continue,
        };
        let service_account = value_of(&metadata.annotations, SERVICE_ACCOUNT_ANNOTATION)
            .map_or(default_account, str::to_owned);
        let addresses = gateway.status.iter().flat_map(|status| &status.addresses);
        for address in addresses {
            let destination = if address.type_.as_deref() == Some("Hostname") {
                GatewayDestination::Hostname {
                    namespace: namespace.to_owned(),
                    hostname: address.value.clone(),
                }
            } else if let Ok(ip) = address.value.parse::<IpAddr>() {
                GatewayDestination::Address(NetworkAddress {
                    network: network.to_owned(),
                    address: ip,
                })
            } else {
                continue;
            };
            found.push(NetworkGateway {
                network: network.to_owned(),
                namespace: namespace.to_owned(),
                service_account: service_account.clone(),
                destination,
                hbone_mtls_port: port,
            });
        }
    }
    found
}

#[cfg(test)]
mod tests;
