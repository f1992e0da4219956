//! One shared copy of each string and identity the workloads of a mesh
//! repeat: namespaces, nodes, networks, service accounts, canonical names,
//! service keys. A mesh of 10,000 pods has a few hundred distinct values of
//! each, and a workload that held its own copies would pay for every one.
//!
//! Only the store calls it, as a workload goes in; lookups never touch it.

use std::collections::HashSet;
use std::sync::Arc;

use ztunnel_certs::identity::Identity;

use super::network::NamespacedHostname;
use super::workload::Workload;

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
            &mut workload.canonical_name,
            &mut workload.canonical_revision,
            &mut workload.workload_name,
            &mut workload.cluster_id,
            &mut workload.locality.region,
            &mut workload.locality.zone,
            &mut workload.locality.subzone,
        ] {
            self.string(value);
        }
        for name in &mut workload.authorization_policies {
            self.string(name);
        }
        for key in workload.services.keys_mut() {
            self.key(key);
        }
        self.identity(&mut workload.identity);
        self.sweep_if_grown();
    }

    /// Replaces both parts of a service key by their shared copies.
    pub(crate) fn key(&mut self, key: &mut NamespacedHostname) {
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
        let size = self.strings.len() + self.identities.len();
        if size < MIN_SWEEP.max(2 * self.swept_at) {
            return;
        }
        self.strings.retain(|value| Arc::strong_count(value) > 1);
        self.identities.retain(|value| value.shared_count() > 1);
        self.swept_at = self.strings.len() + self.identities.len();
    }

    /// How many values are held, for tests.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.strings.len() + self.identities.len()
    }
}
