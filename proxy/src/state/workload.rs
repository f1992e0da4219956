//! The typed workload (WIRE.md §8). Its conversion from
//! `istio.workload.Workload`, applying the §7 rejection rules, is
//! `workload/convert.rs`.
//!
//! Where a workload is stored and looked up is `state.rs`'s business.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use ztunnel_certs::identity::Identity;
use ztunnel_proto::istio::workload as proto;

use super::ResourceError;
use super::network::{GatewayAddress, NamespacedHostname, port_from_proto};

/// Trust domain of a workload that names none (WIRE.md §2).
pub const DEFAULT_TRUST_DOMAIN: &str = "cluster.local";
/// Service account of a workload that names none (WIRE.md §2).
pub const DEFAULT_SERVICE_ACCOUNT: &str = "default";
/// Cluster of a workload that names none (WIRE.md §2).
pub const DEFAULT_CLUSTER_ID: &str = "Kubernetes";

/// Service port → target port.
pub type PortMap = BTreeMap<u16, u16>;

/// One workload (a pod, a VM) as the proxy needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workload {
    /// Store key; equals the xDS resource name.
    pub uid: Arc<str>,
    /// Pod name, for logs and metrics.
    pub name: Arc<str>,
    /// Kubernetes namespace; part of the identity.
    pub namespace: Arc<str>,
    /// The workload's IPs, canonical form.
    pub addresses: Box<[IpAddr]>,
    /// Hostname, for workloads reached by name rather than IP.
    pub hostname: Arc<str>,
    /// Network the addresses belong to; empty is the default network.
    pub network: Arc<str>,
    /// Whether traffic to it is tunnelled over HBONE or sent as plain TCP.
    pub protocol: InboundProtocol,
    /// The SPIFFE identity its certificates carry, built from its trust
    /// domain (default `cluster.local`), namespace and service account
    /// (default `default`) when it arrives: a workload whose parts make no
    /// valid identity is rejected then, not on each connection.
    pub identity: Identity,
    /// Waypoint that traffic to it goes through, when one is set. Boxed:
    /// most workloads have none, and each pays only a pointer.
    pub waypoint: Option<Box<GatewayAddress>>,
    /// East-west gateway that fronts it when it is on another network.
    pub network_gateway: Option<Box<GatewayAddress>>,
    /// Kubernetes node it runs on; tells local workloads from remote ones.
    pub node: Arc<str>,
    /// What it shares with the other pods of its controller: telemetry
    /// names, cluster, locality. One copy per distinct value in the store.
    pub group: Arc<WorkloadGroup>,
    /// The workload terminates HBONE itself.
    pub native_tunnel: bool,
    /// Authorization resource names that select this workload.
    pub authorization_policies: Box<[Arc<str>]>,
    /// Unhealthy workloads are not picked as service endpoints.
    pub status: HealthStatus,
    /// Services it is an endpoint of, each with its own port mapping.
    pub services: EndpointOf,
    /// How inbound traffic is handed to the application, when not plain.
    pub application_tunnel: Option<ApplicationTunnel>,
    /// Host-network workloads share the node's IP and are not looked up by IP.
    pub network_mode: NetworkMode,
    /// Relative weight among endpoints; 1 unless set.
    pub capacity: u32,
}

/// What the pods of one controller (a Deployment, a Job, ...) have in
/// common besides their identity: the names telemetry reports, their
/// cluster and where they run. A workload holds it behind an `Arc` that
/// the store shares among all workloads with equal values, so a pod pays a
/// pointer for it rather than about a hundred bytes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct WorkloadGroup {
    /// Canonical service name, for telemetry.
    pub canonical_name: Arc<str>,
    /// Canonical revision, for telemetry.
    pub canonical_revision: Arc<str>,
    /// Kind of controller that owns it, for telemetry.
    pub workload_type: WorkloadType,
    /// Controller name, for telemetry.
    pub workload_name: Arc<str>,
    /// Cluster it belongs to; never empty.
    pub cluster_id: Arc<str>,
    /// Where it runs, for locality-aware load balancing and telemetry.
    pub locality: Locality,
}

impl Default for WorkloadGroup {
    /// No telemetry names, the default cluster, no locality.
    fn default() -> Self {
        WorkloadGroup {
            canonical_name: "".into(),
            canonical_revision: "".into(),
            workload_type: WorkloadType::Deployment,
            workload_name: "".into(),
            cluster_id: DEFAULT_CLUSTER_ID.into(),
            locality: Locality::default(),
        }
    }
}

impl Workload {
    /// The service account of its identity.
    pub fn service_account(&self) -> &str {
        self.identity.service_account()
    }
}

/// The services a workload is an endpoint of, each with the workload's own
/// port mapping, sorted by key. A shared slice rather than a map: most
/// workloads name one or two services, a map's first node alone is
/// several hundred bytes, and the pods of one deployment name the same
/// services with the same ports, so the store keeps one copy for all.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct EndpointOf(Arc<[(NamespacedHostname, PortMap)]>);

impl Default for EndpointOf {
    fn default() -> Self {
        EndpointOf(Arc::new([]))
    }
}

impl EndpointOf {
    /// The port mapping for service `key`.
    pub fn get(&self, key: &NamespacedHostname) -> Option<&PortMap> {
        let index = self.0.binary_search_by(|(k, _)| k.cmp(key)).ok()?;
        self.0.get(index).map(|(_, ports)| ports)
    }

    /// The service keys, sorted.
    pub fn keys(&self) -> impl Iterator<Item = &NamespacedHostname> {
        self.0.iter().map(|(key, _)| key)
    }

    /// Each service key with its port mapping, sorted by key.
    pub fn iter(&self) -> impl Iterator<Item = (&NamespacedHostname, &PortMap)> {
        self.0.iter().map(|(key, ports)| (key, ports))
    }

    /// How many holders share this copy, for the interner.
    pub(crate) fn shared_count(&self) -> usize {
        Arc::strong_count(&self.0)
    }

    /// Adds or replaces the mapping for service `key`.
    #[cfg(test)]
    pub(crate) fn insert(&mut self, key: NamespacedHostname, ports: PortMap) {
        let mut entries = self.0.to_vec();
        entries.push((key, ports));
        *self = entries.into_iter().collect();
    }

    /// How many services.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether it names no service.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// A later entry for the same key wins, as in a map.
impl FromIterator<(NamespacedHostname, PortMap)> for EndpointOf {
    fn from_iter<I: IntoIterator<Item = (NamespacedHostname, PortMap)>>(entries: I) -> Self {
        let map: BTreeMap<_, _> = entries.into_iter().collect();
        EndpointOf(map.into_iter().collect())
    }
}

/// How a workload accepts inbound traffic.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum InboundProtocol {
    /// Plain TCP: no ztunnel in front of it, or not meshed.
    #[default]
    Tcp,
    /// HBONE on port 15008.
    Hbone,
}

/// Whether a workload may receive traffic for its services.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum HealthStatus {
    /// Ready to receive traffic.
    #[default]
    Healthy,
    /// Not ready; skipped when picking an endpoint.
    Unhealthy,
}

/// The network namespace a workload lives in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum NetworkMode {
    /// Its own pod network.
    #[default]
    Standard,
    /// The node's network; its IP is the node's, so it is never looked up by IP.
    HostNetwork,
}

/// Kind of controller owning a workload.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum WorkloadType {
    /// A Deployment (also the fallback for unknown values).
    #[default]
    Deployment,
    /// A CronJob.
    CronJob,
    /// A bare pod.
    Pod,
    /// A Job.
    Job,
}

impl WorkloadType {
    /// Lower-case name, as used in the local file and in telemetry.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkloadType::Deployment => "deployment",
            WorkloadType::CronJob => "cronjob",
            WorkloadType::Pod => "pod",
            WorkloadType::Job => "job",
        }
    }
}

/// How the destination ztunnel hands traffic to the application.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ApplicationTunnel {
    /// The wrapping protocol.
    pub protocol: ApplicationTunnelProtocol,
    /// Port to deliver to; `None` keeps the original port.
    pub port: Option<u16>,
}

/// Wrapping used towards the application.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ApplicationTunnelProtocol {
    /// Plain bytes.
    #[default]
    None,
    /// A PROXY protocol header first.
    Proxy,
}

/// Where a workload runs; empty parts are unknown.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Locality {
    /// Cloud region.
    pub region: Arc<str>,
    /// Zone inside the region.
    pub zone: Arc<str>,
    /// Subzone inside the zone.
    pub subzone: Arc<str>,
}

/// `value`, or `default` when `value` is empty.
pub(crate) fn or_default<'a>(value: &'a str, default: &'a str) -> &'a str {
    if value.is_empty() { default } else { value }
}

/// Ports of a `PortList` or a `Service`; a later duplicate wins.
pub(crate) fn port_map_from_proto(ports: &[proto::Port]) -> Result<PortMap, ResourceError> {
    ports
        .iter()
        .map(|port| {
            Ok((
                port_from_proto(port.service_port)?,
                port_from_proto(port.target_port)?,
            ))
        })
        .collect()
}

#[cfg(test)]
impl Workload {
    /// A healthy plain-TCP workload on the default network with default
    /// identity parts and no services, for tests to adjust.
    pub(crate) fn for_test(uid: &str, namespace: &str, addresses: &[IpAddr]) -> Self {
        Workload {
            uid: uid.into(),
            name: uid.into(),
            namespace: namespace.into(),
            addresses: addresses.into(),
            hostname: "".into(),
            network: "".into(),
            protocol: InboundProtocol::Tcp,
            identity: Identity::new(DEFAULT_TRUST_DOMAIN, namespace, DEFAULT_SERVICE_ACCOUNT)
                .unwrap(),
            waypoint: None,
            network_gateway: None,
            node: "".into(),
            group: Arc::default(),
            native_tunnel: false,
            authorization_policies: Box::default(),
            status: HealthStatus::Healthy,
            services: EndpointOf::default(),
            application_tunnel: None,
            network_mode: NetworkMode::Standard,
            capacity: 1,
        }
    }
}

mod convert;

pub(crate) use convert::identity_of;

#[cfg(test)]
mod tests;
