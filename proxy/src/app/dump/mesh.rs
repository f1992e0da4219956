//! `workloads[]` and `services[]` of `/config_dump`, in the shape
//! istio/ztunnel prints and istioctl reads (AMBIENT.md §6.3): camelCase
//! keys, optional keys left out when empty or default, gateway
//! destinations as one string.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::state::{
    ApplicationTunnelProtocol, GatewayAddress, GatewayDestination, HealthPolicy, HealthStatus,
    InboundProtocol, IpFamilies, LoadBalancingMode, Locality, NetworkMode, PortMap, RoutingScope,
    Service, State, Visibility, Workload,
};

/// One workload as istioctl reads it.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct WorkloadDump<'a> {
    uid: &'a str,
    workload_ips: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    waypoint: Option<GatewayDump>,
    #[serde(skip_serializing_if = "Option::is_none")]
    network_gateway: Option<GatewayDump>,
    protocol: &'static str,
    network_mode: &'static str,
    #[serde(skip_serializing_if = "str::is_empty")]
    hostname: &'a str,
    name: &'a str,
    namespace: &'a str,
    trust_domain: &'a str,
    service_account: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    network: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    workload_name: &'a str,
    workload_type: &'static str,
    #[serde(skip_serializing_if = "str::is_empty")]
    canonical_name: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    canonical_revision: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    node: &'a str,
    cluster_id: &'a str,
    #[serde(skip_serializing_if = "is_false")]
    native_tunnel: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    application_tunnel: Option<ApplicationTunnelDump>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    authorization_policies: Vec<&'a str>,
    status: &'static str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    services: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    locality: Option<LocalityDump<'a>>,
    capacity: u32,
}

/// A waypoint or network gateway: `destination` is always one string,
/// `network/ip` or `namespace/hostname`, which istioctl compares with
/// service names and VIPs to name the waypoint.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct GatewayDump {
    destination: String,
    hbone_mtls_port: u16,
}

#[derive(Serialize)]
struct ApplicationTunnelDump {
    protocol: &'static str,
    /// `null` when the original port is kept.
    port: Option<u16>,
}

#[derive(Serialize)]
struct LocalityDump<'a> {
    region: &'a str,
    zone: &'a str,
    subzone: &'a str,
}

/// One service as istioctl reads it.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ServiceDump<'a> {
    name: &'a str,
    namespace: &'a str,
    hostname: &'a str,
    vips: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    cidr_vips: Vec<CidrVipDump>,
    ports: BTreeMap<String, u16>,
    endpoints: BTreeMap<&'a str, EndpointDump<'a>>,
    subject_alt_names: Vec<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    waypoint: Option<GatewayDump>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    weighted_waypoints: Vec<WeightedWaypointDump>,
    #[serde(skip_serializing_if = "Option::is_none")]
    load_balancer: Option<LoadBalancerDump<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ip_families: Option<&'static str>,
    canonical: bool,
    visibility: &'static str,
}

#[derive(Serialize)]
struct CidrVipDump {
    network: String,
    cidr: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct EndpointDump<'a> {
    workload_uid: &'a str,
    port: BTreeMap<String, u16>,
    status: &'static str,
}

#[derive(Serialize)]
struct WeightedWaypointDump {
    destination: GatewayDump,
    weight: u32,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct LoadBalancerDump<'a> {
    routing_preferences: &'a [RoutingScope],
    mode: &'static str,
    health_policy: &'static str,
}

/// Every workload, sorted by uid.
pub(super) fn workloads(state: &State) -> Vec<WorkloadDump<'_>> {
    let mut workloads: Vec<_> = state
        .workloads()
        .map(|workload| workload_dump(workload))
        .collect();
    workloads.sort_by(|a, b| a.uid.cmp(b.uid));
    workloads
}

fn workload_dump(workload: &Workload) -> WorkloadDump<'_> {
    let group = &*workload.group;
    WorkloadDump {
        uid: &workload.uid,
        workload_ips: workload.addresses.iter().map(ToString::to_string).collect(),
        waypoint: workload.waypoint.as_deref().map(gateway),
        network_gateway: workload.network_gateway.as_deref().map(gateway),
        protocol: match workload.protocol {
            InboundProtocol::Tcp => "TCP",
            InboundProtocol::Hbone => "HBONE",
        },
        network_mode: match workload.network_mode {
            NetworkMode::Standard => "Standard",
            NetworkMode::HostNetwork => "HostNetwork",
        },
        hostname: &workload.hostname,
        name: &workload.name,
        namespace: &workload.namespace,
        trust_domain: workload.identity.trust_domain(),
        service_account: workload.service_account(),
        network: &workload.network,
        workload_name: &group.workload_name,
        workload_type: group.workload_type.as_str(),
        canonical_name: &group.canonical_name,
        canonical_revision: &group.canonical_revision,
        node: &workload.node,
        cluster_id: &group.cluster_id,
        native_tunnel: workload.native_tunnel,
        application_tunnel: workload
            .application_tunnel
            .map(|tunnel| ApplicationTunnelDump {
                protocol: match tunnel.protocol {
                    ApplicationTunnelProtocol::None => "NONE",
                    ApplicationTunnelProtocol::Proxy => "PROXY",
                },
                port: tunnel.port,
            }),
        authorization_policies: workload
            .authorization_policies
            .iter()
            .map(|name| &**name)
            .collect(),
        status: health(workload.status),
        services: workload.services.keys().map(ToString::to_string).collect(),
        locality: locality(&group.locality),
        capacity: workload.capacity,
    }
}

/// Every service with its endpoints, sorted by hostname, then namespace.
pub(super) fn services(state: &State) -> Vec<ServiceDump<'_>> {
    let mut services: Vec<_> = state
        .services()
        .map(|service| service_dump(state, service))
        .collect();
    services.sort_by(|a, b| (a.hostname, a.namespace).cmp(&(b.hostname, b.namespace)));
    services
}

fn service_dump<'a>(state: &'a State, service: &'a Service) -> ServiceDump<'a> {
    let key = service.key();
    let endpoints = state
        .endpoints(&key)
        .map(|workload| {
            let ports = workload.services.get(&key).map(ports).unwrap_or_default();
            let endpoint = EndpointDump {
                workload_uid: &workload.uid,
                port: ports,
                status: health(workload.status),
            };
            (&*workload.uid, endpoint)
        })
        .collect();
    ServiceDump {
        name: &service.name,
        namespace: &service.namespace,
        hostname: &service.hostname,
        vips: service.vips.iter().map(ToString::to_string).collect(),
        cidr_vips: service
            .cidr_vips
            .iter()
            .map(|vip| CidrVipDump {
                network: vip.network.to_string(),
                cidr: vip.cidr.to_string(),
            })
            .collect(),
        ports: ports(&service.ports),
        endpoints,
        subject_alt_names: service
            .subject_alt_names
            .iter()
            .map(|name| name.as_str())
            .collect(),
        waypoint: service.waypoint.as_ref().map(gateway),
        weighted_waypoints: service
            .weighted_waypoints
            .iter()
            .map(|waypoint| WeightedWaypointDump {
                destination: gateway(&waypoint.destination),
                weight: waypoint.weight,
            })
            .collect(),
        load_balancer: service
            .load_balancing
            .as_ref()
            .map(|balancing| LoadBalancerDump {
                routing_preferences: &balancing.routing_preferences,
                mode: match balancing.mode {
                    LoadBalancingMode::Standard => "Standard",
                    LoadBalancingMode::Strict => "Strict",
                    LoadBalancingMode::Failover => "Failover",
                    LoadBalancingMode::Passthrough => "Passthrough",
                },
                health_policy: match balancing.health_policy {
                    HealthPolicy::OnlyHealthy => "OnlyHealthy",
                    HealthPolicy::AllowAll => "AllowAll",
                },
            }),
        ip_families: match service.ip_families {
            IpFamilies::Automatic => None,
            IpFamilies::Ipv4Only => Some("IPv4"),
            IpFamilies::Ipv6Only => Some("IPv6"),
            IpFamilies::Dual => Some("Dual"),
        },
        canonical: service.canonical,
        visibility: match service.visibility {
            Visibility::Public => "Public",
            Visibility::Namespace => "Namespace",
        },
    }
}

fn gateway(gateway: &GatewayAddress) -> GatewayDump {
    GatewayDump {
        destination: match &gateway.destination {
            GatewayDestination::Address(address) => address.to_string(),
            GatewayDestination::Hostname(name) => name.to_string(),
        },
        hbone_mtls_port: gateway.hbone_mtls_port,
    }
}

/// Port maps with string keys, as JSON objects need them.
fn ports(ports: &PortMap) -> BTreeMap<String, u16> {
    ports
        .iter()
        .map(|(port, target)| (port.to_string(), *target))
        .collect()
}

fn health(status: HealthStatus) -> &'static str {
    match status {
        HealthStatus::Healthy => "Healthy",
        HealthStatus::Unhealthy => "Unhealthy",
    }
}

/// `None` when every part is unknown.
fn locality(locality: &Locality) -> Option<LocalityDump<'_>> {
    (*locality != Locality::default()).then_some(LocalityDump {
        region: &locality.region,
        zone: &locality.zone,
        subzone: &locality.subzone,
    })
}

fn is_false(value: &bool) -> bool {
    !value
}
