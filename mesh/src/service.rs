//! One service of the mesh: a hostname, its VIPs and ports, how it
//! balances, and which pods serve it (a label selector, or an explicit list
//! of pod uids). The mesh file spells it directly; `kube/convert/service.rs`
//! builds it from a Kubernetes Service and its EndpointSlices.
//!
//! Checks that need the rest of the file (unknown endpoint uids, duplicate
//! hostnames) are `snapshot.rs`'s.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use serde::de::value::MapAccessDeserializer;
use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

use super::pod::Labels;
use super::text_value;
use super::waypoint::{GatewayAddress, WeightedWaypoint};

/// One service, as the mesh file spells it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Service {
    /// Service name.
    pub name: String,
    /// Service namespace.
    pub namespace: String,
    /// Fully qualified hostname, e.g. `echo.default.svc.cluster.local`.
    pub hostname: String,
    /// Virtual IPs, `"<network>/<ip>"` or a bare IP on the default network.
    /// None makes a headless service.
    #[serde(default)]
    pub vips: Vec<NetworkAddress>,
    /// Service port → where endpoints receive it: `80: 8080`, `80: http`
    /// (a named container port), or `80: {targetPort: http, appProtocol:
    /// HTTP2, name: http}`.
    pub ports: BTreeMap<u16, ServicePort>,
    /// Endpoints are the Running pods and the WorkloadEntries of the
    /// service's namespace carrying these labels. Exclusive with
    /// `endpoints`.
    #[serde(default)]
    pub selector: Option<Labels>,
    /// Endpoints named by pod uid, for pods no label selector describes,
    /// or by the uid of a ServiceEntry's own endpoint. Exclusive with
    /// `selector`.
    #[serde(default)]
    pub endpoints: Option<Vec<String>>,
    /// Which IP families the service serves, for clients choosing a VIP.
    #[serde(default)]
    pub ip_families: IpFamilies,
    /// Locality and health preferences; absent, any healthy endpoint.
    #[serde(default)]
    pub load_balancing: Option<LoadBalancing>,
    /// The service wins hostname lookups across namespaces (every
    /// Kubernetes Service is canonical for its own hostname).
    #[serde(default)]
    pub canonical: bool,
    /// The waypoint that traffic addressed to the service goes through;
    /// absent, clients balance over the endpoints themselves.
    #[serde(default)]
    pub waypoint: Option<GatewayAddress>,
    /// The waypoint beside a canary, with their shares; `waypoint` stays
    /// the primary, for clients that read only it.
    #[serde(default)]
    pub weighted_waypoints: Vec<WeightedWaypoint>,
    /// Ingress gateways send this service's traffic through its waypoint
    /// too (ztunnel does not read it).
    #[serde(default)]
    pub ingress_use_waypoint: bool,
    /// SPIFFE identities its endpoints may present besides their own, as
    /// a ServiceEntry's `subjectAltNames`: what a client expects at the end
    /// of a double HBONE tunnel into another network, where no other
    /// identity is accepted (AMBIENT.md §3.3-3.4).
    #[serde(default)]
    pub subject_alt_names: Vec<String>,
    /// Who may reach it by its VIPs and hostname: everyone, or only
    /// clients of its namespace (a ServiceEntry under the mesh config's
    /// `serviceEntryVisibility`; `kube/convert/export_to.rs`).
    #[serde(default)]
    pub visibility: ServiceVisibility,
}

/// `Service.visibility` on the wire (WIRE.md: `Public` = 0, `Namespace` = 1).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum ServiceVisibility {
    /// Every client.
    #[default]
    Public,
    /// Only clients in the service's namespace.
    Namespace,
}

impl Service {
    /// The xDS resource name and `Workload.services` key:
    /// `<namespace>/<hostname>` (WIRE.md §7).
    pub fn resource_name(&self) -> String {
        format!("{}/{}", self.namespace, self.hostname)
    }
}

/// An IP on a network: `"<network>/<ip>"`, `"/<ip>"` or `"<ip>"` (the last
/// two on the default network, whose name is empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkAddress {
    /// Network name; empty is the default network.
    pub network: String,
    /// The address.
    pub address: IpAddr,
}

impl FromStr for NetworkAddress {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (network, ip) = text.rsplit_once('/').unwrap_or(("", text));
        let address = ip
            .parse::<IpAddr>()
            .map_err(|_| format!("invalid address {text:?}: expected \"<network>/<ip>\""))?;
        Ok(NetworkAddress {
            network: network.to_owned(),
            address,
        })
    }
}

impl fmt::Display for NetworkAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.address)
    }
}

impl<'de> Deserialize<'de> for NetworkAddress {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        text_value(deserializer, "an address \"<network>/<ip>\"")
    }
}

/// One service port: where endpoints receive it, and what it speaks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicePort {
    /// The endpoint port.
    pub target: TargetPort,
    /// The protocol clients speak on it.
    pub app_protocol: AppProtocol,
    /// A ServiceEntry port's name: an endpoint that declares a port of
    /// this name (a pod's container port, a WorkloadEntry's `ports`)
    /// receives the service port there rather than at a numbered `target`.
    /// Kubernetes Services leave it out: they name endpoint ports through
    /// `target` alone.
    pub name: Option<String>,
}

impl From<u16> for ServicePort {
    fn from(port: u16) -> Self {
        ServicePort {
            target: TargetPort::Number(port),
            app_protocol: AppProtocol::Unknown,
            name: None,
        }
    }
}

impl<'de> Deserialize<'de> for ServicePort {
    /// A bare target (number or name), or the map form
    /// `{targetPort, appProtocol, name}`.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ServicePortVisitor)
    }
}

struct ServicePortVisitor;

impl<'de> Visitor<'de> for ServicePortVisitor {
    type Value = ServicePort;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a target port (number or name) or {targetPort, appProtocol}")
    }

    fn visit_u64<E: de::Error>(self, port: u64) -> Result<ServicePort, E> {
        TargetPortVisitor.visit_u64(port).map(plain)
    }

    fn visit_i64<E: de::Error>(self, port: i64) -> Result<ServicePort, E> {
        TargetPortVisitor.visit_i64(port).map(plain)
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<ServicePort, E> {
        TargetPortVisitor.visit_str(text).map(plain)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<ServicePort, A::Error> {
        let form = ServicePortMap::deserialize(MapAccessDeserializer::new(map))?;
        Ok(ServicePort {
            target: form.target_port,
            app_protocol: form.app_protocol,
            name: form.name,
        })
    }
}

fn plain(target: TargetPort) -> ServicePort {
    ServicePort {
        target,
        app_protocol: AppProtocol::Unknown,
        name: None,
    }
}

/// The map form of a service port.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ServicePortMap {
    target_port: TargetPort,
    #[serde(default)]
    app_protocol: AppProtocol,
    #[serde(default)]
    name: Option<String>,
}

/// Where endpoints receive a service port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetPort {
    /// This port on every endpoint.
    Number(u16),
    /// The container port of this name on each endpoint; an endpoint
    /// without it is not reached on this service port.
    Name(String),
}

impl<'de> Deserialize<'de> for TargetPort {
    /// A number, or a name (a string of digits is a number).
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(TargetPortVisitor)
    }
}

struct TargetPortVisitor;

impl Visitor<'_> for TargetPortVisitor {
    type Value = TargetPort;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a port number (0 to 65535) or a port name")
    }

    fn visit_u64<E: de::Error>(self, port: u64) -> Result<TargetPort, E> {
        u16::try_from(port)
            .map(TargetPort::Number)
            .map_err(|_| E::invalid_value(de::Unexpected::Unsigned(port), &self))
    }

    fn visit_i64<E: de::Error>(self, port: i64) -> Result<TargetPort, E> {
        u16::try_from(port)
            .map(TargetPort::Number)
            .map_err(|_| E::invalid_value(de::Unexpected::Signed(port), &self))
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<TargetPort, E> {
        if text.is_empty() || !text.bytes().all(|byte| byte.is_ascii_digit()) {
            return Ok(TargetPort::Name(text.to_owned()));
        }
        text.parse::<u16>()
            .map(TargetPort::Number)
            .map_err(|_| E::invalid_value(de::Unexpected::Str(text), &self))
    }
}

/// `Port.app_protocol`: what clients speak on a service port.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum AppProtocol {
    /// Not declared: the proxy treats the bytes as opaque.
    #[default]
    #[serde(rename = "UNKNOWN")]
    Unknown,
    /// HTTP/1.1.
    #[serde(rename = "HTTP11")]
    Http11,
    /// HTTP/2 in cleartext.
    #[serde(rename = "HTTP2")]
    Http2,
    /// gRPC.
    #[serde(rename = "GRPC")]
    Grpc,
    /// Plain TCP.
    #[serde(rename = "TCP")]
    Tcp,
    /// TLS (HTTPS included).
    #[serde(rename = "TLS")]
    Tls,
}

/// `Service.ip_families`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum IpFamilies {
    /// Not stated: whatever the VIPs are.
    #[default]
    Automatic,
    /// IPv4 only.
    IPv4Only,
    /// IPv6 only.
    IPv6Only,
    /// Both.
    Dual,
}

/// `Service.load_balancing`: which endpoints a client prefers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct LoadBalancing {
    /// Locality scopes an endpoint should share with the client, most
    /// important first.
    pub routing_preference: Vec<LocalityScope>,
    /// Whether the preference is a requirement or an ordering.
    pub mode: LoadBalancingMode,
    /// Whether unhealthy endpoints are used too.
    pub health_policy: HealthPolicy,
}

/// A locality scope of a routing preference.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum LocalityScope {
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

/// How a routing preference is applied.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum LoadBalancingMode {
    /// Not stated.
    #[default]
    Unspecified,
    /// Only endpoints matching every scope are used.
    Strict,
    /// The best-matching endpoints are used, falling back scope by scope.
    Failover,
    /// The client's chosen address is used as is.
    Passthrough,
}

/// Whether unhealthy endpoints are used.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum HealthPolicy {
    /// Healthy endpoints only.
    #[default]
    OnlyHealthy,
    /// Every endpoint, whatever its health (Kubernetes
    /// `publishNotReadyAddresses`).
    AllowAll,
}
