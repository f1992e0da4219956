//! One shared copy of each value the workloads of a mesh repeat:
//! namespaces, nodes, networks, identities, the per-controller
//! [`WorkloadGroup`], the services a workload is an endpoint of. A mesh of
//! 10,000 pods has a few hundred distinct values of each, and a workload
//! that held its own copies would pay for every one.
//!
//! A source converts with one: the xDS client keeps one for its stream, a
//! load of the local file uses one for the file. Values are looked up from
//! the borrowed text of the message or file before anything is allocated,
//! so a repeated value costs no allocation at all: none made and freed
//! again, leaving holes among the objects the store keeps. Lookups on the
//! data path never touch it.

use std::collections::HashSet;
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;

use hashbrown::HashTable;
use ztunnel_certs::identity::{Identity, IdentityError};

use super::network::{GatewayAddress, GatewayDestination, NamespacedHostname, NetworkAddress};
use super::workload::{EndpointOf, Locality, WorkloadGroup, WorkloadType};

/// Below this many values, the interner never sweeps: a small mesh is not
/// worth the pass.
const MIN_SWEEP: usize = 1024;

/// The shared copies. Values no workload holds any more are dropped by a
/// sweep once the set has doubled since the last one, so its size follows
/// the mesh's at an amortized constant cost per workload.
#[derive(Clone, Debug, Default)]
pub struct Interner {
    hasher: RandomState,
    strings: HashSet<Arc<str>>,
    /// Hashed by their three parts, so that a lookup needs no URI built.
    identities: HashTable<Identity>,
    /// Hashed by their parts ([`GroupParts`]).
    groups: HashTable<Arc<WorkloadGroup>>,
    services: HashSet<EndpointOf>,
    /// Total size after the last sweep.
    swept_at: usize,
}

/// The parts of a [`WorkloadGroup`] as a message or file holds them.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub(crate) struct GroupParts<'a> {
    pub(crate) canonical_name: &'a str,
    pub(crate) canonical_revision: &'a str,
    pub(crate) workload_type: WorkloadType,
    pub(crate) workload_name: &'a str,
    /// Already defaulted: never empty.
    pub(crate) cluster_id: &'a str,
    pub(crate) region: &'a str,
    pub(crate) zone: &'a str,
    pub(crate) subzone: &'a str,
}

impl<'a> GroupParts<'a> {
    fn of(group: &'a WorkloadGroup) -> Self {
        GroupParts {
            canonical_name: &group.canonical_name,
            canonical_revision: &group.canonical_revision,
            workload_type: group.workload_type,
            workload_name: &group.workload_name,
            cluster_id: &group.cluster_id,
            region: &group.locality.region,
            zone: &group.locality.zone,
            subzone: &group.locality.subzone,
        }
    }
}

impl Interner {
    /// An empty interner.
    pub fn new() -> Self {
        Self::default()
    }

    /// The shared copy of `value`.
    pub(crate) fn str(&mut self, value: &str) -> Arc<str> {
        if let Some(shared) = self.strings.get(value) {
            return Arc::clone(shared);
        }
        let shared: Arc<str> = value.into();
        self.strings.insert(Arc::clone(&shared));
        shared
    }

    /// The shared `namespace/hostname` key.
    pub(crate) fn key(&mut self, namespace: &str, hostname: &str) -> NamespacedHostname {
        NamespacedHostname {
            namespace: self.str(namespace),
            hostname: self.str(hostname),
        }
    }

    /// The shared identity of these parts (empty ones already defaulted);
    /// parts that make no valid identity are an error.
    pub(crate) fn identity(
        &mut self,
        trust_domain: &str,
        namespace: &str,
        service_account: &str,
    ) -> Result<Identity, IdentityError> {
        let hash = self
            .hasher
            .hash_one((trust_domain, namespace, service_account));
        let same = |identity: &Identity| {
            identity.trust_domain() == trust_domain
                && identity.namespace() == namespace
                && identity.service_account() == service_account
        };
        if let Some(shared) = self.identities.find(hash, same) {
            return Ok(shared.clone());
        }
        let identity = Identity::new(trust_domain, namespace, service_account)?;
        let hasher = &self.hasher;
        self.identities
            .insert_unique(hash, identity.clone(), |identity| {
                hasher.hash_one((
                    identity.trust_domain(),
                    identity.namespace(),
                    identity.service_account(),
                ))
            });
        Ok(identity)
    }

    /// The shared group of these parts.
    pub(crate) fn group(&mut self, parts: GroupParts<'_>) -> Arc<WorkloadGroup> {
        let hash = self.hasher.hash_one(parts);
        if let Some(shared) = self
            .groups
            .find(hash, |group| GroupParts::of(group) == parts)
        {
            return Arc::clone(shared);
        }
        let group = Arc::new(WorkloadGroup {
            canonical_name: self.str(parts.canonical_name),
            canonical_revision: self.str(parts.canonical_revision),
            workload_type: parts.workload_type,
            workload_name: self.str(parts.workload_name),
            cluster_id: self.str(parts.cluster_id),
            locality: Locality {
                region: self.str(parts.region),
                zone: self.str(parts.zone),
                subzone: self.str(parts.subzone),
            },
        });
        let hasher = &self.hasher;
        self.groups
            .insert_unique(hash, Arc::clone(&group), |group| {
                hasher.hash_one(GroupParts::of(group))
            });
        group
    }

    /// The shared copy of `services`, whose keys come from [`Self::key`].
    pub(crate) fn services(&mut self, services: EndpointOf) -> EndpointOf {
        if let Some(shared) = self.services.get(&services) {
            return shared.clone();
        }
        self.services.insert(services.clone());
        services
    }

    /// A copy of `gateway` made of shared strings.
    pub(crate) fn gateway(&mut self, gateway: &GatewayAddress) -> GatewayAddress {
        let destination = match &gateway.destination {
            GatewayDestination::Address(address) => GatewayDestination::Address(NetworkAddress {
                network: self.str(&address.network),
                address: address.address,
            }),
            GatewayDestination::Hostname(name) => {
                GatewayDestination::Hostname(self.key(&name.namespace, &name.hostname))
            }
        };
        GatewayAddress {
            destination,
            hbone_mtls_port: gateway.hbone_mtls_port,
        }
    }

    /// Drops the values only the interner holds, when it has doubled since
    /// the last sweep. Sources call it after each workload.
    pub(crate) fn sweep_if_grown(&mut self) {
        if self.len() < MIN_SWEEP.max(2 * self.swept_at) {
            return;
        }
        // Groups and service lists first: they hold strings.
        self.groups.retain(|value| Arc::strong_count(value) > 1);
        self.services.retain(|value| value.shared_count() > 1);
        self.identities.retain(|value| value.shared_count() > 1);
        self.strings.retain(|value| Arc::strong_count(value) > 1);
        self.swept_at = self.len();
    }

    /// How many values are held.
    pub(crate) fn len(&self) -> usize {
        self.strings.len() + self.identities.len() + self.groups.len() + self.services.len()
    }
}
