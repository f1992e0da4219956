//! `services[]` entries of the local config file (WIRE.md §11) and their
//! conversion into [`Service`].

use serde::Deserialize;
use serde::de::IgnoredAny;
use ztunnel_certs::identity::Identity;

use super::values::{GatewayForm, Text};
use crate::state::{
    HealthPolicy, Interner, IpFamilies, LoadBalancing, LoadBalancingMode, NetworkAddress,
    NetworkCidr, PortMap, RoutingScope, Service, Visibility, WeightedWaypoint,
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

impl ServiceForm {
    /// The typed service, made of fresh or shared values: nothing is
    /// borrowed from the form, so that what the store keeps is allocated
    /// here, not by the parse.
    pub(super) fn to_service(&self, interner: &mut Interner) -> Service {
        let subject_alt_names = self
            .subject_alt_names
            .iter()
            .map(|san| {
                let san = &san.0;
                interner
                    .identity(san.trust_domain(), san.namespace(), san.service_account())
                    .unwrap_or_else(|_| san.clone())
            })
            .collect();
        Service {
            name: self.name.as_str().into(),
            namespace: interner.str(&self.namespace),
            hostname: interner.str(&self.hostname),
            vips: self
                .vips
                .iter()
                .map(|vip| NetworkAddress {
                    network: interner.str(&vip.0.network),
                    address: vip.0.address,
                })
                .collect(),
            cidr_vips: self
                .cidr_vips
                .iter()
                .map(|vip| NetworkCidr {
                    network: interner.str(&vip.0.network),
                    cidr: vip.0.cidr,
                })
                .collect(),
            ports: self.ports.clone(),
            subject_alt_names,
            waypoint: self
                .waypoint
                .as_ref()
                .map(|gateway| gateway.to_gateway(interner)),
            weighted_waypoints: self
                .weighted_waypoints
                .iter()
                .map(|waypoint| WeightedWaypoint {
                    destination: waypoint.destination.to_gateway(interner),
                    weight: waypoint.weight,
                })
                .collect(),
            load_balancing: self.load_balancer.as_ref().map(Into::into),
            ip_families: self.ip_families.map(Into::into).unwrap_or_default(),
            canonical: self.canonical,
            ingress_use_waypoint: false,
            visibility: self.visibility.into(),
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct LoadBalancerForm {
    #[serde(default)]
    routing_preferences: Vec<RoutingScope>,
    #[serde(default)]
    mode: ModeForm,
    #[serde(default)]
    health_policy: HealthPolicyForm,
}

impl From<&LoadBalancerForm> for LoadBalancing {
    fn from(form: &LoadBalancerForm) -> Self {
        LoadBalancing {
            routing_preferences: form.routing_preferences.clone(),
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

#[derive(Clone, Copy, Default, Deserialize)]
enum ModeForm {
    #[default]
    Standard,
    Strict,
    Failover,
    Passthrough,
}

#[derive(Clone, Copy, Default, Deserialize)]
enum HealthPolicyForm {
    #[default]
    OnlyHealthy,
    AllowAll,
}

#[derive(Clone, Copy, Deserialize)]
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

#[derive(Clone, Copy, Default, Deserialize)]
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
