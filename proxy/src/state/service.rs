//! The typed service (WIRE.md §8) and its conversion from
//! `istio.workload.Service`, applying the §7 rejection rules.
//!
//! A service's endpoints are not part of it: they are the workloads whose
//! `services` map names it, indexed in `state.rs`.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use ztunnel_certs::error_chain::ErrorChain;
use ztunnel_certs::identity::Identity;
use ztunnel_proto::istio::workload as proto;

use super::ResourceError;
use super::network::{
    GatewayAddress, NamespacedHostname, NetworkAddress, NetworkCidr, network_address_from_proto,
};
use super::workload::{HealthStatus, PortMap, port_map_from_proto};
use crate::cidr::Cidr;

/// A service: a name and VIPs in front of a set of workloads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Service {
    /// Kubernetes service name.
    pub name: Arc<str>,
    /// Kubernetes namespace; with the hostname, the store key.
    pub namespace: Arc<str>,
    /// FQDN.
    pub hostname: Arc<str>,
    /// Host VIPs. Empty for headless services.
    pub vips: Vec<NetworkAddress>,
    /// VIPs that cover a range of addresses.
    pub cidr_vips: Vec<NetworkCidr>,
    /// Service port → target port; a target of 0 means "same as the service port".
    pub ports: PortMap,
    /// Identities accepted from its endpoints besides their own.
    pub subject_alt_names: Vec<Identity>,
    /// Waypoint that traffic to it goes through, when one is set.
    pub waypoint: Option<GatewayAddress>,
    /// Traffic split over several waypoints; `waypoint` stays the primary.
    pub weighted_waypoints: Vec<WeightedWaypoint>,
    /// How endpoints are picked, when the service says.
    pub load_balancing: Option<LoadBalancing>,
    /// Which address families the service serves.
    pub ip_families: IpFamilies,
    /// Wins hostname lookups across namespaces.
    pub canonical: bool,
    /// Ingress traffic also goes through the waypoint.
    pub ingress_use_waypoint: bool,
    /// Who may look the service up by hostname.
    pub visibility: Visibility,
}

impl Service {
    /// The store key, `namespace/hostname`.
    pub fn key(&self) -> NamespacedHostname {
        NamespacedHostname {
            namespace: self.namespace.clone(),
            hostname: self.hostname.clone(),
        }
    }

    /// Whether a workload with `status` is stored as one of its endpoints:
    /// a healthy one always, an unhealthy one only under `AllowAll`. The
    /// store applies this when the workload arrives and when the service
    /// is replaced (AMBIENT.md §4.1), not on each connection.
    pub fn admits(&self, status: HealthStatus) -> bool {
        status == HealthStatus::Healthy
            || self
                .load_balancing
                .as_ref()
                .is_some_and(|balancing| balancing.health_policy == HealthPolicy::AllowAll)
    }

    /// How its endpoints are chosen: `Standard` when it says nothing.
    pub fn mode(&self) -> LoadBalancingMode {
        self.load_balancing
            .as_ref()
            .map_or(LoadBalancingMode::Standard, |balancing| balancing.mode)
    }

    /// The scopes endpoints are ranked on, most significant first.
    pub fn routing_preferences(&self) -> &[RoutingScope] {
        self.load_balancing
            .as_ref()
            .map_or(&[], |balancing| &balancing.routing_preferences)
    }
}

/// One waypoint of a weighted split.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WeightedWaypoint {
    /// The waypoint.
    pub destination: GatewayAddress,
    /// Share = weight / sum of weights; 0 takes no traffic.
    pub weight: u32,
}

/// Endpoint choice preferences.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadBalancing {
    /// Locality levels to match, most significant first.
    pub routing_preferences: Vec<RoutingScope>,
    /// How strictly `routing_preferences` apply.
    pub mode: LoadBalancingMode,
    /// Whether unhealthy endpoints may be picked.
    pub health_policy: HealthPolicy,
}

/// A locality level that endpoints are matched on. Its serde form, the
/// variant's name, is how the local config file and `/config_dump` write
/// `routingPreferences`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RoutingScope {
    /// Same region.
    Region,
    /// Same zone.
    Zone,
    /// Same subzone.
    Subzone,
    /// Same node.
    Node,
    /// Same cluster.
    Cluster,
    /// Same network.
    Network,
}

/// How routing preferences are applied.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum LoadBalancingMode {
    /// No mode given (`UNSPECIFIED_MODE`).
    #[default]
    Standard,
    /// Only endpoints matching every preference.
    Strict,
    /// Prefer matching endpoints, fall back to others.
    Failover,
    /// Send to the original destination, no endpoint choice.
    Passthrough,
}

/// Whether unhealthy endpoints may be picked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum HealthPolicy {
    /// Healthy endpoints only.
    #[default]
    OnlyHealthy,
    /// Any endpoint.
    AllowAll,
}

/// Address families a service serves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum IpFamilies {
    /// Not stated; follow the VIPs.
    #[default]
    Automatic,
    /// IPv4 only.
    Ipv4Only,
    /// IPv6 only.
    Ipv6Only,
    /// Both.
    Dual,
}

impl IpFamilies {
    /// Whether an endpoint address `ip` may serve the service: a family
    /// restriction is kept only by the `*Only` values.
    pub fn accepts(self, ip: std::net::IpAddr) -> bool {
        match self {
            IpFamilies::Automatic | IpFamilies::Dual => true,
            IpFamilies::Ipv4Only => ip.is_ipv4(),
            IpFamilies::Ipv6Only => ip.is_ipv6(),
        }
    }
}

/// Who may look a service up by hostname.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Visibility {
    /// Everyone (also the fallback for unknown values).
    #[default]
    Public,
    /// Only its own namespace.
    Namespace,
}

impl TryFrom<&proto::Service> for Service {
    type Error = ResourceError;

    fn try_from(service: &proto::Service) -> Result<Self, Self::Error> {
        let mut vips = Vec::new();
        let mut cidr_vips = Vec::new();
        for address in &service.addresses {
            match network_address_from_proto(address)? {
                (vip, None) => vips.push(vip),
                (vip, Some(prefix_len)) => cidr_vips.push(NetworkCidr {
                    network: vip.network,
                    cidr: Cidr::new(vip.address, u32::from(prefix_len))?,
                }),
            }
        }
        Ok(Service {
            name: service.name.as_str().into(),
            namespace: service.namespace.as_str().into(),
            hostname: service.hostname.as_str().into(),
            vips,
            cidr_vips,
            ports: port_map_from_proto(&service.ports)?,
            subject_alt_names: subject_alt_names(&service.subject_alt_names),
            waypoint: service
                .waypoint
                .as_ref()
                .map(GatewayAddress::try_from)
                .transpose()?,
            weighted_waypoints: service
                .weighted_waypoints
                .iter()
                .map(weighted_waypoint_from_proto)
                .collect::<Result<_, _>>()?,
            load_balancing: service
                .load_balancing
                .as_ref()
                .map(load_balancing_from_proto)
                .transpose()?,
            ip_families: ip_families_from_proto(service.ip_families)?,
            canonical: service.canonical,
            ingress_use_waypoint: service.ingress_use_waypoint,
            // Unknown values read as PUBLIC (WIRE.md §8).
            visibility: match proto::service::Visibility::try_from(service.visibility) {
                Ok(proto::service::Visibility::Namespace) => Visibility::Namespace,
                Ok(proto::service::Visibility::Public) | Err(_) => Visibility::Public,
            },
        })
    }
}

/// SANs that are SPIFFE identities. Others can never equal a peer identity,
/// so they are dropped rather than rejecting the whole service.
fn subject_alt_names(names: &[String]) -> Vec<Identity> {
    names
        .iter()
        .filter_map(|name| match name.parse() {
            Ok(identity) => Some(identity),
            Err(error) => {
                tracing::debug!(san = %name, error = %ErrorChain(&error), "dropping subject alt name");
                None
            }
        })
        .collect()
}

fn weighted_waypoint_from_proto(
    waypoint: &proto::WeightedWaypoint,
) -> Result<WeightedWaypoint, ResourceError> {
    let destination = waypoint
        .destination
        .as_ref()
        .ok_or(ResourceError::GatewayWithoutDestination)?;
    Ok(WeightedWaypoint {
        destination: destination.try_into()?,
        weight: waypoint.weight,
    })
}

fn load_balancing_from_proto(
    balancing: &proto::LoadBalancing,
) -> Result<LoadBalancing, ResourceError> {
    use proto::load_balancing::{HealthPolicy as WireHealth, Mode, Scope};
    let routing_preferences = balancing
        .routing_preference
        .iter()
        .map(|&value| match Scope::try_from(value) {
            Ok(Scope::UnspecifiedScope) => Err(ResourceError::UnspecifiedRoutingScope),
            Ok(Scope::Region) => Ok(RoutingScope::Region),
            Ok(Scope::Zone) => Ok(RoutingScope::Zone),
            Ok(Scope::Subzone) => Ok(RoutingScope::Subzone),
            Ok(Scope::Node) => Ok(RoutingScope::Node),
            Ok(Scope::Cluster) => Ok(RoutingScope::Cluster),
            Ok(Scope::Network) => Ok(RoutingScope::Network),
            Err(unknown) => Err(ResourceError::UnknownEnum {
                field: "load_balancing.routing_preference",
                value: unknown,
            }),
        })
        .collect::<Result<_, _>>()?;
    let mode = match Mode::try_from(balancing.mode) {
        Ok(Mode::UnspecifiedMode) => LoadBalancingMode::Standard,
        Ok(Mode::Strict) => LoadBalancingMode::Strict,
        Ok(Mode::Failover) => LoadBalancingMode::Failover,
        Ok(Mode::Passthrough) => LoadBalancingMode::Passthrough,
        Err(unknown) => {
            return Err(ResourceError::UnknownEnum {
                field: "load_balancing.mode",
                value: unknown,
            });
        }
    };
    let health_policy = match WireHealth::try_from(balancing.health_policy) {
        Ok(WireHealth::OnlyHealthy) => HealthPolicy::OnlyHealthy,
        Ok(WireHealth::AllowAll) => HealthPolicy::AllowAll,
        Err(unknown) => {
            return Err(ResourceError::UnknownEnum {
                field: "load_balancing.health_policy",
                value: unknown,
            });
        }
    };
    Ok(LoadBalancing {
        routing_preferences,
        mode,
        health_policy,
    })
}

fn ip_families_from_proto(value: i32) -> Result<IpFamilies, ResourceError> {
    match proto::IpFamilies::try_from(value) {
        Ok(proto::IpFamilies::Automatic) => Ok(IpFamilies::Automatic),
        Ok(proto::IpFamilies::Ipv4Only) => Ok(IpFamilies::Ipv4Only),
        Ok(proto::IpFamilies::Ipv6Only) => Ok(IpFamilies::Ipv6Only),
        Ok(proto::IpFamilies::Dual) => Ok(IpFamilies::Dual),
        Err(unknown) => Err(ResourceError::UnknownEnum {
            field: "ip_families",
            value: unknown,
        }),
    }
}

#[cfg(test)]
impl Service {
    /// A service on the default network with host VIPs and ports, for tests to adjust.
    pub(crate) fn for_test(
        namespace: &str,
        hostname: &str,
        vips: &[std::net::IpAddr],
        ports: &[(u16, u16)],
    ) -> Self {
        Service {
            name: hostname.split('.').next().unwrap_or(hostname).into(),
            namespace: namespace.into(),
            hostname: hostname.into(),
            vips: vips
                .iter()
                .map(|ip| NetworkAddress {
                    network: "".into(),
                    address: *ip,
                })
                .collect(),
            cidr_vips: Vec::new(),
            ports: ports.iter().copied().collect(),
            subject_alt_names: Vec::new(),
            waypoint: None,
            weighted_waypoints: Vec::new(),
            load_balancing: None,
            ip_families: IpFamilies::Automatic,
            canonical: false,
            ingress_use_waypoint: false,
            visibility: Visibility::Public,
        }
    }
}

#[cfg(test)]
mod tests;
