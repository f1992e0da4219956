//! A strict reader of `/config_dump`, written from AMBIENT.md §6.2–6.6
//! (what istio/ztunnel prints and istioctl reads), not from our renderer:
//! unknown keys and missing required keys are refused, enum values are
//! checked by name, and [`Sorted`] checks that every level's keys come
//! sorted. Fields the tests do not look at are still read, to check their
//! type.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct Top {
    pub(super) certificates: Vec<CertificatesRead>,
    pub(super) config: ConfigRead,
    pub(super) policies: Vec<PolicyRead>,
    pub(super) services: Vec<ServiceRead>,
    pub(super) staged_services: BTreeMap<String, BTreeMap<String, EndpointRead>>,
    pub(super) static_config: StaticConfigRead,
    pub(super) version: VersionRead,
    pub(super) workloads: Vec<WorkloadRead>,
    pub(super) workload_state: Option<BTreeMap<String, PodStateRead>>,
}

/// Ours in camelCase; only the keys AMBIENT.md names are read.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ConfigRead {
    pub(super) self_termination_deadline: DurationRead,
    pub(super) num_worker_threads: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DurationRead {
    pub(super) secs: u64,
    pub(super) nanos: u32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct StaticConfigRead {
    pub(super) policies: Vec<PolicyRead>,
    pub(super) services: Vec<ServiceRead>,
    pub(super) workloads: Vec<WorkloadRead>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct VersionRead {
    pub(super) version: String,
    pub(super) git_revision: String,
    pub(super) istio_version: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct WorkloadRead {
    pub(super) workload_ips: Vec<std::net::IpAddr>,
    pub(super) waypoint: Option<GatewayRead>,
    pub(super) network_gateway: Option<GatewayRead>,
    pub(super) protocol: Protocol,
    pub(super) network_mode: NetworkModeRead,
    pub(super) status: Status,
    pub(super) uid: Option<String>,
    pub(super) trust_domain: Option<String>,
    pub(super) service_account: Option<String>,
    pub(super) network: Option<String>,
    pub(super) workload_name: Option<String>,
    pub(super) workload_type: Option<WorkloadTypeRead>,
    pub(super) canonical_name: Option<String>,
    pub(super) canonical_revision: Option<String>,
    pub(super) hostname: Option<String>,
    pub(super) node: Option<String>,
    pub(super) name: String,
    pub(super) namespace: String,
    pub(super) cluster_id: String,
    pub(super) native_tunnel: Option<bool>,
    pub(super) application_tunnel: Option<ApplicationTunnelRead>,
    pub(super) authorization_policies: Option<Vec<String>>,
    pub(super) services: Option<Vec<String>>,
    pub(super) locality: Option<LocalityRead>,
    pub(super) capacity: u32,
}

#[derive(Debug, Deserialize, PartialEq)]
#[serde(rename_all = "UPPERCASE")]
pub(super) enum Protocol {
    Tcp,
    Hbone,
}

#[derive(Debug, Deserialize, PartialEq)]
pub(super) enum NetworkModeRead {
    Standard,
    HostNetwork,
}

#[derive(Debug, Deserialize, PartialEq)]
pub(super) enum Status {
    Healthy,
    Unhealthy,
}

#[derive(Debug, Deserialize, PartialEq)]
#[serde(rename_all = "lowercase")]
pub(super) enum WorkloadTypeRead {
    Deployment,
    Cronjob,
    Pod,
    Job,
}

#[derive(Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct GatewayRead {
    /// Always a string: `network/ip` or `namespace/hostname`.
    pub(super) destination: String,
    pub(super) hbone_mtls_port: u16,
}

#[derive(Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(super) struct ApplicationTunnelRead {
    pub(super) protocol: String,
    pub(super) port: Option<u16>,
}

#[derive(Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(super) struct LocalityRead {
    pub(super) region: String,
    pub(super) zone: String,
    pub(super) subzone: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct ServiceRead {
    pub(super) name: String,
    pub(super) namespace: String,
    pub(super) hostname: String,
    pub(super) vips: Vec<String>,
    pub(super) cidr_vips: Option<Vec<CidrVipRead>>,
    pub(super) ports: BTreeMap<u16, u16>,
    pub(super) endpoints: BTreeMap<String, EndpointRead>,
    pub(super) subject_alt_names: Vec<String>,
    pub(super) waypoint: Option<GatewayRead>,
    pub(super) weighted_waypoints: Option<Vec<WeightedWaypointRead>>,
    pub(super) load_balancer: Option<LoadBalancerRead>,
    pub(super) ip_families: Option<IpFamiliesRead>,
    pub(super) canonical: bool,
    pub(super) visibility: VisibilityRead,
}

#[derive(Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(super) struct CidrVipRead {
    pub(super) network: String,
    pub(super) cidr: String,
}

#[derive(Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct EndpointRead {
    pub(super) workload_uid: String,
    pub(super) port: BTreeMap<u16, u16>,
    pub(super) status: Status,
}

#[derive(Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(super) struct WeightedWaypointRead {
    pub(super) destination: GatewayRead,
    pub(super) weight: u32,
}

#[derive(Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct LoadBalancerRead {
    pub(super) routing_preferences: Vec<ScopeRead>,
    pub(super) mode: ModeRead,
    pub(super) health_policy: HealthPolicyRead,
}

#[derive(Debug, Deserialize, PartialEq)]
pub(super) enum ScopeRead {
    Region,
    Zone,
    Subzone,
    Node,
    Cluster,
    Network,
}

#[derive(Debug, Deserialize, PartialEq)]
pub(super) enum ModeRead {
    Standard,
    Strict,
    Failover,
    Passthrough,
}

#[derive(Debug, Deserialize, PartialEq)]
pub(super) enum HealthPolicyRead {
    OnlyHealthy,
    AllowAll,
}

#[derive(Debug, Deserialize, PartialEq)]
pub(super) enum IpFamiliesRead {
    Dual,
    IPv4,
    IPv6,
}

#[derive(Debug, Deserialize, PartialEq)]
pub(super) enum VisibilityRead {
    Public,
    Namespace,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct PolicyRead {
    pub(super) name: String,
    pub(super) namespace: String,
    pub(super) scope: PolicyScopeRead,
    pub(super) action: ActionRead,
    /// Rules, clauses, matches: three arrays deep.
    pub(super) rules: Vec<Vec<Vec<MatchRead>>>,
    pub(super) dry_run: bool,
}

#[derive(Debug, Deserialize, PartialEq)]
pub(super) enum PolicyScopeRead {
    Global,
    Namespace,
    WorkloadSelector,
}

#[derive(Debug, Deserialize, PartialEq)]
pub(super) enum ActionRead {
    Allow,
    Deny,
}

#[derive(Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct MatchRead {
    pub(super) namespaces: Option<Vec<StringMatchRead>>,
    pub(super) not_namespaces: Option<Vec<StringMatchRead>>,
    pub(super) principals: Option<Vec<StringMatchRead>>,
    pub(super) not_principals: Option<Vec<StringMatchRead>>,
    pub(super) service_accounts: Option<Vec<ServiceAccountRead>>,
    pub(super) not_service_accounts: Option<Vec<ServiceAccountRead>>,
    pub(super) source_ips: Option<Vec<String>>,
    pub(super) not_source_ips: Option<Vec<String>>,
    pub(super) destination_ips: Option<Vec<String>>,
    pub(super) not_destination_ips: Option<Vec<String>>,
    pub(super) destination_ports: Option<Vec<u16>>,
    pub(super) not_destination_ports: Option<Vec<u16>>,
}

#[derive(Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(super) enum StringMatchRead {
    Exact(String),
    Prefix(String),
    Suffix(String),
    Presence([(); 0]),
}

#[derive(Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct ServiceAccountRead {
    pub(super) namespace: String,
    pub(super) service_account: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct CertificatesRead {
    pub(super) identity: String,
    pub(super) state: String,
    pub(super) cert_chain: Vec<CertRead>,
    pub(super) root_certs: Vec<CertRead>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct CertRead {
    /// Base64 of the PEM text.
    pub(super) pem: String,
    pub(super) serial_number: String,
    pub(super) valid_from: String,
    pub(super) expiration_time: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PodStateRead {
    pub(super) info: PodInfoRead,
    pub(super) state: PodStateName,
    /// Only for running proxies.
    pub(super) connections: Option<ConnectionsRead>,
}

#[derive(Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(super) struct ConnectionsRead {
    pub(super) inbound: Vec<ConnectionRead>,
    pub(super) outbound: Vec<ConnectionRead>,
}

/// Every key required; `originalDst` is `null` or an address.
#[derive(Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct ConnectionRead {
    pub(super) src: std::net::SocketAddr,
    #[serde(deserialize_with = "Option::deserialize")]
    pub(super) original_dst: Option<std::net::SocketAddr>,
    pub(super) actual_dst: std::net::SocketAddr,
    pub(super) protocol: ConnectionProtocolRead,
}

#[derive(Debug, Deserialize, PartialEq)]
#[serde(rename_all = "UPPERCASE")]
pub(super) enum ConnectionProtocolRead {
    Tcp,
    Hbone,
    DoubleHbone,
}

#[derive(Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct PodInfoRead {
    pub(super) name: String,
    pub(super) namespace: String,
    pub(super) service_account: String,
}

#[derive(Debug, Deserialize, PartialEq)]
pub(super) enum PodStateName {
    Pending,
    Up,
}

/// Accepts any JSON whose objects list their keys in sorted order.
pub(super) struct Sorted;

impl<'de> Deserialize<'de> for Sorted {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(SortedVisitor)
    }
}

pub(super) struct SortedVisitor;

impl<'de> Visitor<'de> for SortedVisitor {
    type Value = Sorted;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Sorted, A::Error> {
        let mut previous: Option<String> = None;
        while let Some(key) = map.next_key::<String>()? {
            if previous.as_ref().is_some_and(|previous| *previous >= key) {
                return Err(de::Error::custom(format!("key {key:?} after {previous:?}")));
            }
            map.next_value::<Sorted>()?;
            previous = Some(key);
        }
        Ok(Sorted)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Sorted, A::Error> {
        while seq.next_element::<Sorted>()?.is_some() {}
        Ok(Sorted)
    }

    fn visit_bool<E>(self, _: bool) -> Result<Sorted, E> {
        Ok(Sorted)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Sorted, E> {
        Ok(Sorted)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Sorted, E> {
        Ok(Sorted)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Sorted, E> {
        Ok(Sorted)
    }
    fn visit_str<E>(self, _: &str) -> Result<Sorted, E> {
        Ok(Sorted)
    }
    fn visit_unit<E>(self) -> Result<Sorted, E> {
        Ok(Sorted)
    }
}
