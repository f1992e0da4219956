//! One shared copy of each string and identity the workloads of a mesh
//! repeat: namespaces, nodes, networks, identities, the per-controller
//! [`WorkloadGroup`], the services a workload is an endpoint of. A mesh of 10,000 pods has a few hundred distinct values of
//! each, and a workload that held its own copies would pay for every one.
//!
//! Only the store calls it, as a workload goes in; lookups never touch it.

use std::collections::HashSet;
use std::sync::Arc;

use ztunnel_certs::identity::Identity;

use super::network::NamespacedHostname;
use super::workload::{EndpointOf, Workload, WorkloadGroup};

/// Below this many values, the interner never sweeps: a small mesh is not
/// worth the pass.
const MIN_SWEEP: usize = 1024;

/// The shared copies. Values no workload holds any more are dropped by a
/// sweep once the set has doubled since the last one, so its size follows
/// the mesh's at an amortized constant cost per insert.
#[derive(Clone, Debug, Default)]
pub(crate) struct Interner {
    strings: HashSet<Arc<str>>,
    identities: HashSet<Identity>,
    groups: HashSet<Arc<WorkloadGroup>>,
    services: HashSet<EndpointOf>,
    /// Total size after the last sweep.
    swept_at: usize,
}

impl Interner {
    /// Replaces every repeated part of `workload` by its shared copy.
    pub(crate) fn workload(&mut self, workload: &mut Workload) {
        for value in [
            &mut workload.namespace,
            &mut workload.hostname,
            &mut workload.network,
            &mut workload.node,
        ] {
            self.string(value);
        }
        for name in &mut workload.authorization_policies {
            self.string(name);
        }
        self.group(&mut workload.group);
        self.services(&mut workload.services);
        self.identity(&mut workload.identity);
        self.sweep_if_grown();
    }

    fn group(&mut self, value: &mut Arc<WorkloadGroup>) {
        if let Some(shared) = self.groups.get(value) {
            *value = Arc::clone(shared);
            return;
        }
        if let Some(group) = Arc::get_mut(value) {
            for part in [
                &mut group.canonical_name,
                &mut group.canonical_revision,
                &mut group.workload_name,
                &mut group.cluster_id,
                &mut group.locality.region,
                &mut group.locality.zone,
                &mut group.locality.subzone,
            ] {
                self.string(part);
            }
        }
        self.groups.insert(Arc::clone(value));
    }

    fn services(&mut self, value: &mut EndpointOf) {
        if let Some(shared) = self.services.get(value) {
            *value = shared.clone();
            return;
        }
        if let Some(keys) = value.keys_mut() {
            for key in keys {
                self.key(key);
            }
        }
        self.services.insert(value.clone());
    }

    /// Replaces both parts of a service key by their shared copies.
    fn key(&mut self, key: &mut NamespacedHostname) {
        self.string(&mut key.namespace);
        self.string(&mut key.hostname);
    }

    fn string(&mut self, value: &mut Arc<str>) {
        match self.strings.get(&**value) {
            Some(shared) => *value = Arc::clone(shared),
            None => {
                self.strings.insert(Arc::clone(value));
            }
        }
    }

    fn identity(&mut self, value: &mut Identity) {
        match self.identities.get(value) {
            Some(shared) => *value = shared.clone(),
            None => {
                self.identities.insert(value.clone());
            }
        }
    }

    /// Drops the values only the interner holds, when it has doubled.
    fn sweep_if_grown(&mut self) {
        if self.len() < MIN_SWEEP.max(2 * self.swept_at) {
            return;
        }
        // Groups and service lists first: they hold strings.
        self.groups.retain(|value| Arc::strong_count(value) > 1);
        self.services.retain(|value| value.shared_count() > 1);
        self.strings.retain(|value| Arc::strong_count(value) > 1);
        self.identities.retain(|value| value.shared_count() > 1);
        self.swept_at = self.len();
    }

    /// How many values are held.
    pub(crate) fn len(&self) -> usize {
        self.strings.len() + self.identities.len() + self.groups.len() + self.services.len()
    }
}
