//! `services[]` entries of the local config file (WIRE.md §11) and their
//! conversion into [`Service`].

use serde::Deserialize;
use serde::de::IgnoredAny;
use ztunnel_certs::identity::Identity;

use super::values::{GatewayForm, Text};
use crate::state::{
    HealthPolicy, IpFamilies, LoadBalancing, LoadBalancingMode, NetworkAddress, NetworkCidr,
    PortMap, RoutingScope, Service, Visibility, WeightedWaypoint,
};

/// One `services[]` entry as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct ServiceForm {
    name: String,
    namespace: String,
    hostname: String,
    vips: Vec<Text<NetworkAddress>>,
    #[serde(default)]
    cidr_vips: Vec<Text<NetworkCidr>>,
    ports: PortMap,
    #[serde(default)]
    subject_alt_names: Vec<Text<Identity>>,
    #[serde(default)]
    waypoint: Option<GatewayForm>,
    #[serde(default)]
    weighted_waypoints: Vec<WeightedWaypointForm>,
    #[serde(default)]
    load_balancer: Option<LoadBalancerForm>,
    #[serde(default)]
    ip_families: Option<IpFamiliesForm>,
    #[serde(default)]
    canonical: bool,
    #[serde(default)]
    visibility: VisibilityForm,
    /// Accepted so that files listing endpoints load; endpoints are the
    /// workloads whose `services` map names the service.
    #[serde(default)]
    #[allow(dead_code)] // read only to be accepted
    endpoints: Option<IgnoredAny>,
}

impl From<ServiceForm> for Service {
    fn from(form: ServiceForm) -> Self {
        Service {
            name: form.name.into(),
            namespace: form.namespace.into(),
            hostname: form.hostname.into(),
            vips: form.vips.into_iter().map(|vip| vip.0).collect(),
            cidr_vips: form.cidr_vips.into_iter().map(|vip| vip.0).collect(),
            ports: form.ports,
            subject_alt_names: form
                .subject_alt_names
                .into_iter()
                .map(|san| san.0)
                .collect(),
            waypoint: form.waypoint.map(Into::into),
            weighted_waypoints: form
                .weighted_waypoints
                .into_iter()
                .map(Into::into)
                .collect(),
            load_balancing: form.load_balancer.map(Into::into),
            ip_families: form.ip_families.map(Into::into).unwrap_or_default(),
            canonical: form.canonical,
            ingress_use_waypoint: false,
            visibility: form.visibility.into(),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WeightedWaypointForm {
    destination: GatewayForm,
    #[serde(default)]
    weight: u32,
}

impl From<WeightedWaypointForm> for WeightedWaypoint {
    fn from(form: WeightedWaypointForm) -> Self {
        WeightedWaypoint {
            destination: form.destination.into(),
            weight: form.weight,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct LoadBalancerForm {
    #[serde(default)]
    routing_preferences: Vec<RoutingScopeForm>,
    #[serde(default)]
    mode: ModeForm,
    #[serde(default)]
    health_policy: HealthPolicyForm,
}

impl From<LoadBalancerForm> for LoadBalancing {
    fn from(form: LoadBalancerForm) -> Self {
        LoadBalancing {
            routing_preferences: form
                .routing_preferences
                .into_iter()
                .map(Into::into)
                .collect(),
            mode: match form.mode {
                ModeForm::Standard => LoadBalancingMode::Standard,
                ModeForm::Strict => LoadBalancingMode::Strict,
                ModeForm::Failover => LoadBalancingMode::Failover,
                ModeForm::Passthrough => LoadBalancingMode::Passthrough,
            },
            health_policy: match form.health_policy {
                HealthPolicyForm::OnlyHealthy => HealthPolicy::OnlyHealthy,
                HealthPolicyForm::AllowAll => HealthPolicy::AllowAll,
            },
        }
    }
}

#[derive(Deserialize)]
enum RoutingScopeForm {
    Region,
    Zone,
    Subzone,
    Node,
    Cluster,
    Network,
}

impl From<RoutingScopeForm> for RoutingScope {
    fn from(form: RoutingScopeForm) -> Self {
        match form {
            RoutingScopeForm::Region => RoutingScope::Region,
            RoutingScopeForm::Zone => RoutingScope::Zone,
            RoutingScopeForm::Subzone => RoutingScope::Subzone,
            RoutingScopeForm::Node => RoutingScope::Node,
            RoutingScopeForm::Cluster => RoutingScope::Cluster,
            RoutingScopeForm::Network => RoutingScope::Network,
        }
    }
}

#[derive(Default, Deserialize)]
enum ModeForm {
    #[default]
    Standard,
    Strict,
    Failover,
    Passthrough,
}

#[derive(Default, Deserialize)]
enum HealthPolicyForm {
    #[default]
    OnlyHealthy,
    AllowAll,
}

#[derive(Deserialize)]
enum IpFamiliesForm {
    Dual,
    #[serde(rename = "IPv4")]
    Ipv4,
    #[serde(rename = "IPv6")]
    Ipv6,
}

impl From<IpFamiliesForm> for IpFamilies {
    fn from(form: IpFamiliesForm) -> Self {
        match form {
            IpFamiliesForm::Dual => IpFamilies::Dual,
            IpFamiliesForm::Ipv4 => IpFamilies::Ipv4Only,
            IpFamiliesForm::Ipv6 => IpFamilies::Ipv6Only,
        }
    }
}

#[derive(Default, Deserialize)]
enum VisibilityForm {
    #[default]
    Public,
    Namespace,
}

impl From<VisibilityForm> for Visibility {
    fn from(form: VisibilityForm) -> Self {
        match form {
            VisibilityForm::Public => Visibility::Public,
            VisibilityForm::Namespace => Visibility::Namespace,
        }
    }
}
