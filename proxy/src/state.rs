//! The proxy's view of the mesh: workloads, services and authorization
//! policies, with the indexes the data path looks them up by.
//!
//! Both configuration sources feed this one store: the local file through
//! [`State::replace_all`], delta xDS through the per-resource insert and
//! remove calls. The typed resources live in `state/{workload,service}.rs`,
//! addresses in `state/network.rs`, upstream selection in
//! `state/upstream.rs`. Authorization policies are typed and evaluated in
//! `rbac.rs`; here they are only stored and indexed.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use ztunnel_certs::identity::IdentityError;
use ztunnel_proto::istio::workload as proto;

use crate::cidr::AddressError;
use crate::rbac::{Policy, Scope};

// Crate-visible so that conversions elsewhere share the wire helpers; the
// public path of every type is the re-export below.
mod gateway;
mod index;
pub(crate) mod intern;
pub(crate) mod network;
pub(crate) mod service;
mod shared;
pub(crate) mod upstream;
pub(crate) mod workload;

pub use gateway::{GatewayTarget, find_gateway};
pub use intern::Interner;
pub use network::{
    GatewayAddress, GatewayDestination, NamespacedHostname, NetworkAddress, NetworkCidr,
};
pub use service::{
    HealthPolicy, IpFamilies, LoadBalancing, LoadBalancingMode, RoutingScope, Service, Visibility,
    WeightedWaypoint,
};
pub use shared::SharedState;
pub use upstream::{
    Destination, Endpoint, EndpointAddress, Resolution, select_upstream, service_endpoint,
};
pub use workload::{
    ApplicationTunnel, ApplicationTunnelProtocol, DEFAULT_CLUSTER_ID, DEFAULT_SERVICE_ACCOUNT,
    DEFAULT_TRUST_DOMAIN, EndpointOf, HealthStatus, InboundProtocol, Locality, NetworkMode,
    PortMap, Workload, WorkloadGroup, WorkloadType,
};

/// Why a workload or service resource is rejected (WIRE.md §7). The messages
/// are those a NACK carries.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResourceError {
    /// An address or a CIDR is malformed.
    #[error(transparent)]
    Address(#[from] AddressError),
    /// A checked enum holds a value this proxy does not know.
    #[error("decode error: {value}")]
    UnknownEnum {
        /// The field holding it, for logs.
        field: &'static str,
        /// The value.
        value: prost::UnknownEnumValue,
    },
    /// The workload asks for the legacy sidecar mTLS tunnel, which ztunnel does not speak.
    #[error("unknown enum: unsupported tunnel protocol: legacy istio mtls")]
    LegacyIstioMtls,
    /// A `namespace/hostname` key has no `/`.
    #[error("failed to parse namespaced hostname: {0}")]
    NamespacedHostname(String),
    /// A gateway or weighted waypoint has no destination.
    #[error("gateway address has no destination")]
    GatewayWithoutDestination,
    /// A routing preference is `UNSPECIFIED_SCOPE`.
    #[error("unknown enum: unsupported routing preference: unspecified scope")]
    UnspecifiedRoutingScope,
    /// A port number does not fit in 16 bits.
    #[error("port {0} is out of range")]
    PortOutOfRange(u32),
    /// A workload's trust domain, namespace and service account make no
    /// valid SPIFFE identity.
    #[error("invalid workload identity: {0}")]
    Identity(IdentityError),
    /// An `Address` resource holds neither a workload nor a service.
    #[error("address has neither workload nor service")]
    EmptyAddress,
}

/// One decoded `istio.workload.Address` resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AddressResource {
    /// A workload, stored by its uid.
    Workload(Workload),
    /// A service, stored by `namespace/hostname`.
    Service(Service),
}

impl TryFrom<&proto::Address> for AddressResource {
    type Error = ResourceError;

    /// Converts with an interner of its own; see [`AddressResource::from_proto`].
    fn try_from(address: &proto::Address) -> Result<Self, Self::Error> {
        AddressResource::from_proto(address, &mut Interner::new())
    }
}

impl AddressResource {
    /// Converts `address`, taking a workload's repeated values from `interner`.
    pub fn from_proto(
        address: &proto::Address,
        interner: &mut Interner,
    ) -> Result<Self, ResourceError> {
        match &address.r#type {
            Some(proto::address::Type::Workload(workload)) => Ok(AddressResource::Workload(
                Workload::from_proto(workload, interner)?,
            )),
            Some(proto::address::Type::Service(service)) => {
                Ok(AddressResource::Service(service.try_into()?))
            }
            None => Err(ResourceError::EmptyAddress),
        }
    }
}

/// The store. Values are behind `Arc` so that a lookup result outlives the
/// next update without copying.
///
/// When two workloads claim the same address, a lookup prefers a pod, then
/// an HBONE workload, then the one inserted last; removing one leaves the
/// address to the others. When two services claim a VIP, the one inserted
/// last owns it; removing it leaves the VIP unindexed until the other is
/// inserted again.
#[derive(Clone, Debug, Default)]
pub struct State {
    /// By uid, by pod name (how a proxy finds the workload it serves
    /// without scanning the mesh) and by network and IP (host-network
    /// workloads left out).
    workloads: index::Workloads,
    /// service key → uids of its endpoints, ordered so that an endpoint
    /// pick is stable for a given state: the workloads naming it that its
    /// health policy admitted when they arrived or when it was last
    /// replaced (`Service::admits`), and, while the service itself is not
    /// stored, every workload naming it.
    endpoints: HashMap<NamespacedHostname, BTreeSet<Arc<str>>>,
    services: HashMap<NamespacedHostname, Arc<Service>>,
    /// network → VIP → service key.
    service_by_vip: HashMap<Arc<str>, HashMap<IpAddr, NamespacedHostname>>,
    /// CIDR VIPs, searched in order when no host VIP matches.
    service_cidr_vips: Vec<(NetworkCidr, NamespacedHostname)>,
    /// hostname → keys of the services with it, one per namespace.
    service_by_hostname: HashMap<Arc<str>, BTreeSet<NamespacedHostname>>,
    /// resource name → policy.
    policies: HashMap<Arc<str>, Arc<Policy>>,
    /// Resource names of GLOBAL policies.
    global_policies: BTreeSet<Arc<str>>,
    /// namespace → resource names of its NAMESPACE policies.
    namespace_policies: HashMap<Arc<str>, BTreeSet<Arc<str>>>,
}

impl State {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Replaces everything, as loading the local file does.
    pub fn replace_all(
        &mut self,
        workloads: impl IntoIterator<Item = Workload>,
        services: impl IntoIterator<Item = Service>,
        policies: impl IntoIterator<Item = (Arc<str>, Policy)>,
    ) {
        *self = State::new();
        for service in services {
            self.insert_service(service);
        }
        for workload in workloads {
            self.insert_workload(workload);
        }
        for (name, policy) in policies {
            self.insert_policy(name, policy);
        }
    }

    /// Stores a decoded `Address` resource, replacing any with the same key.
    pub fn insert_address(&mut self, resource: AddressResource) {
        match resource {
            AddressResource::Workload(workload) => {
                self.insert_workload(workload);
            }
            AddressResource::Service(service) => {
                self.insert_service(service);
            }
        }
    }

    /// Inserts or replaces the workload with this uid; returns the old one.
    pub fn insert_workload(&mut self, workload: Workload) -> Option<Arc<Workload>> {
        let old = self.remove_workload(&workload.uid);
        let workload = Arc::new(workload);
        for key in workload.services.keys() {
            let admitted = self
                .services
                .get(key)
                .is_none_or(|service| service.admits(workload.status));
            if !admitted {
                continue;
            }
            self.endpoints
                .entry(key.clone())
                .or_default()
                .insert(workload.uid.clone());
        }
        self.workloads.insert(workload);
        old
    }

    /// Removes the workload with this uid; returns it.
    pub fn remove_workload(&mut self, uid: &str) -> Option<Arc<Workload>> {
        let workload = self.workloads.remove(uid)?;
        for key in workload.services.keys() {
            if let Some(uids) = self.endpoints.get_mut(key) {
                uids.remove(uid);
                if uids.is_empty() {
                    self.endpoints.remove(key);
                }
            }
        }
        Some(workload)
    }

    /// The workload with this uid.
    pub fn workload(&self, uid: &str) -> Option<&Arc<Workload>> {
        self.workloads.get(uid)
    }

    /// The workload owning `ip` on `network`. Host-network workloads are never found.
    pub fn workload_by_address(&self, network: &str, ip: IpAddr) -> Option<&Arc<Workload>> {
        self.workloads.by_address(network, ip.to_canonical())
    }

    /// The workload of pod `namespace/name` running as `service_account`,
    /// on `node` when one is given: the in-pod match of WIRE.md §5, through
    /// an index, so its cost does not grow with the mesh. When several
    /// match, the one with the lowest uid.
    pub fn local_workload(
        &self,
        namespace: &str,
        name: &str,
        service_account: &str,
        node: Option<&str>,
    ) -> Option<&Arc<Workload>> {
        self.workloads
            .by_name(name)
            .filter(|workload| {
                *workload.namespace == *namespace
                    && workload.service_account() == service_account
                    && node.is_none_or(|node| *workload.node == *node)
            })
            .min_by(|a, b| a.uid.cmp(&b.uid))
    }

    /// The workloads on `node`, in no particular order, through an index:
    /// the cost follows the node's pods, not the mesh.
    pub fn workloads_on_node(&self, node: &str) -> impl Iterator<Item = &Arc<Workload>> {
        self.workloads.on_node(node)
    }

    /// Every workload, in no particular order.
    pub fn workloads(&self) -> impl Iterator<Item = &Arc<Workload>> {
        self.workloads.iter()
    }

    /// The endpoints of the service `key`, ordered by uid: the workloads
    /// naming it in their `services` map that its health policy admitted
    /// (see the `endpoints` field).
    pub fn endpoints(&self, key: &NamespacedHostname) -> impl Iterator<Item = &Arc<Workload>> {
        self.endpoints
            .get(key)
            .into_iter()
            .flatten()
            .filter_map(|uid| self.workloads.get(uid))
    }

    /// Inserts or replaces the service with this `namespace/hostname`; returns the old one.
    pub fn insert_service(&mut self, service: Service) -> Option<Arc<Service>> {
        let key = service.key();
        let old = self.remove_service(&key);
        for vip in &service.vips {
            self.service_by_vip
                .entry(vip.network.clone())
                .or_default()
                .insert(vip.address, key.clone());
        }
        for cidr in &service.cidr_vips {
            self.service_cidr_vips.push((cidr.clone(), key.clone()));
        }
        self.service_by_hostname
            .entry(key.hostname.clone())
            .or_default()
            .insert(key.clone());
        // The endpoints stored under the old policy (or waiting for the
        // service) are filtered again; an unhealthy workload the old policy
        // left out comes back only when it is pushed again, as in
        // istio/ztunnel (AMBIENT.md §4.1).
        if let Some(uids) = self.endpoints.get_mut(&key) {
            let workloads = &self.workloads;
            uids.retain(|uid| {
                workloads
                    .get(uid)
                    .is_some_and(|workload| service.admits(workload.status))
            });
            if uids.is_empty() {
                self.endpoints.remove(&key);
            }
        }
        self.services.insert(key, Arc::new(service));
        old
    }

    /// Removes the service with this `namespace/hostname`; returns it.
    pub fn remove_service(&mut self, key: &NamespacedHostname) -> Option<Arc<Service>> {
        let service = self.services.remove(key)?;
        for vip in &service.vips {
            if let Some(by_ip) = self.service_by_vip.get_mut(&vip.network) {
                if by_ip.get(&vip.address) == Some(key) {
                    by_ip.remove(&vip.address);
                }
                if by_ip.is_empty() {
                    self.service_by_vip.remove(&vip.network);
                }
            }
        }
        self.service_cidr_vips.retain(|(_, owner)| owner != key);
        if let Some(keys) = self.service_by_hostname.get_mut(&key.hostname) {
            keys.remove(key);
            if keys.is_empty() {
                self.service_by_hostname.remove(&key.hostname);
            }
        }
        Some(service)
    }

    /// The service with this `namespace/hostname`.
    pub fn service(&self, key: &NamespacedHostname) -> Option<&Arc<Service>> {
        self.services.get(key)
    }

    /// The service with VIP `ip` on `network`: a host VIP first, else the
    /// CIDR VIP with the longest prefix that contains it.
    pub fn service_by_vip(&self, network: &str, ip: IpAddr) -> Option<&Arc<Service>> {
        let ip = ip.to_canonical();
        let key = match self
            .service_by_vip
            .get(network)
            .and_then(|by_ip| by_ip.get(&ip))
        {
            Some(key) => key,
            None => {
                let (_, key) = self
                    .service_cidr_vips
                    .iter()
                    .filter(|(vip, _)| *vip.network == *network && vip.cidr.contains(ip))
                    .max_by_key(|(vip, _)| vip.cidr.prefix_len())?;
                key
            }
        };
        self.services.get(key)
    }

    /// The service a hostname resolves to: the canonical one if any, else the
    /// first by namespace.
    pub fn service_by_hostname(&self, hostname: &str) -> Option<&Arc<Service>> {
        let mut services = self.services_by_hostname(hostname);
        let first = services.next()?;
        if first.canonical {
            return Some(first);
        }
        Some(services.find(|service| service.canonical).unwrap_or(first))
    }

    /// Every service with this hostname, ordered by namespace.
    pub fn services_by_hostname(&self, hostname: &str) -> impl Iterator<Item = &Arc<Service>> {
        self.service_by_hostname
            .get(hostname)
            .into_iter()
            .flatten()
            .filter_map(|key| self.services.get(key))
    }

    /// Every service, in no particular order.
    pub fn services(&self) -> impl Iterator<Item = &Arc<Service>> {
        self.services.values()
    }

    /// Inserts or replaces the policy stored under resource `name`; returns the old one.
    pub fn insert_policy(&mut self, name: Arc<str>, policy: Policy) -> Option<Arc<Policy>> {
        let old = self.remove_policy(&name);
        match policy.scope {
            Scope::Global => {
                self.global_policies.insert(name.clone());
            }
            Scope::Namespace => {
                self.namespace_policies
                    .entry(policy.namespace.clone())
                    .or_default()
                    .insert(name.clone());
            }
            // Reached only through the workloads that name it.
            Scope::WorkloadSelector => {}
        }
        self.policies.insert(name, Arc::new(policy));
        old
    }

    /// Removes the policy stored under resource `name`; returns it.
    pub fn remove_policy(&mut self, name: &str) -> Option<Arc<Policy>> {
        let policy = self.policies.remove(name)?;
        self.global_policies.remove(name);
        if let Some(names) = self.namespace_policies.get_mut(&policy.namespace) {
            names.remove(name);
            if names.is_empty() {
                self.namespace_policies.remove(&policy.namespace);
            }
        }
        Some(policy)
    }

    /// The policy stored under resource `name`.
    pub fn policy(&self, name: &str) -> Option<&Arc<Policy>> {
        self.policies.get(name)
    }

    /// The policies that apply to connections to `workload`: GLOBAL ones of any
    /// namespace, NAMESPACE ones of its namespace, then the resource names in
    /// its `authorization_policies`. Names not (yet) known are skipped, and a
    /// named policy already applying by scope is not repeated.
    pub fn applicable_policies<'a>(
        &'a self,
        workload: &'a Workload,
    ) -> impl Iterator<Item = &'a Policy> + 'a {
        let applies_by_scope = move |policy: &Policy| match policy.scope {
            Scope::Global => true,
            Scope::Namespace => policy.namespace == workload.namespace,
            Scope::WorkloadSelector => false,
        };
        let named = workload
            .authorization_policies
            .iter()
            .filter_map(|name| self.policy(name))
            .filter(move |policy| !applies_by_scope(policy));
        self.global_policies()
            .chain(self.namespace_policies(&workload.namespace))
            .chain(named)
            .map(|policy| &**policy)
    }

    /// Every policy with its resource name, in no particular order.
    pub fn policies(&self) -> impl Iterator<Item = (&Arc<str>, &Arc<Policy>)> {
        self.policies.iter()
    }

    /// GLOBAL policies, ordered by resource name.
    pub fn global_policies(&self) -> impl Iterator<Item = &Arc<Policy>> {
        self.global_policies
            .iter()
            .filter_map(|name| self.policies.get(name))
    }

    /// NAMESPACE policies of `namespace`, ordered by resource name.
    pub fn namespace_policies(&self, namespace: &str) -> impl Iterator<Item = &Arc<Policy>> {
        self.namespace_policies
            .get(namespace)
            .into_iter()
            .flatten()
            .filter_map(|name| self.policies.get(name))
    }
}

#[cfg(test)]
mod tests;
