//! The store's workload tables: each a hash table of `Arc<Workload>`
//! hashed by one key the workload holds (its uid, its pod name, one of its
//! addresses), so that an entry costs a pointer and a control byte rather
//! than a copy of its key and a second lookup by uid. A mesh of 10,000
//! workloads pays about 15 bytes per workload for each table, and about
//! 10 more for the list of each node's workloads.
//!
//! What is looked up and what it means is `state.rs`'s business.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::net::IpAddr;
use std::sync::Arc;

use hashbrown::HashTable;

use super::workload::{InboundProtocol, NetworkMode, Workload};

/// Every workload, by uid, by pod name and by address.
#[derive(Clone, Debug, Default)]
pub(crate) struct Workloads {
    /// Keyed with a per-store random key, as `HashMap` is: names and
    /// addresses come from outside.
    hasher: RandomState,
    by_uid: HashTable<Arc<Workload>>,
    /// Keyed by the name alone, so that a lookup borrows the caller's
    /// `&str`; several workloads may share a name (in other namespaces).
    by_name: HashTable<Arc<Workload>>,
    /// One entry per (network, IP) of each workload that is not on the
    /// host network; workloads that share an address each keep theirs,
    /// and a lookup takes the one `AddressEntry::precedence` puts first.
    by_address: HashTable<AddressEntry>,
    /// Counts address insertions, so that among equals the workload
    /// inserted last owns an address.
    inserted: u32,
    /// Node → the workloads on it, for what a proxy does for its own
    /// node's workloads on each change. A node has a few hundred pods at
    /// most, so a removal's search is short; workloads without a node are
    /// left out (there may be many, and no proxy's node is unnamed).
    by_node: HashMap<Arc<str>, Vec<Arc<Workload>>>,
}

impl Workloads {
    /// Stores `workload`, which the caller has made sure is not stored by
    /// uid yet; it takes over the addresses another workload held.
    pub(crate) fn insert(&mut self, workload: Arc<Workload>) {
        let hasher = &self.hasher;
        if workload.network_mode != NetworkMode::HostNetwork {
            for (position, ip) in workload.addresses.iter().enumerate() {
                let hash = hasher.hash_one((&*workload.network, Some(ip)));
                // A workload has a handful of addresses at most.
                let Ok(position) = u32::try_from(position) else {
                    break;
                };
                // Wraps after 2^32 insertions; only the order of two
                // equal claimants of one address could then come out
                // reversed.
                self.inserted = self.inserted.wrapping_add(1);
                let entry = AddressEntry {
                    workload: Arc::clone(&workload),
                    position,
                    inserted: self.inserted,
                };
                self.by_address
                    .insert_unique(hash, entry, |owner| owner.hash(hasher));
            }
        }
        if !workload.node.is_empty() {
            self.by_node
                .entry(Arc::clone(&workload.node))
                .or_default()
                .push(Arc::clone(&workload));
        }
        self.by_name.insert_unique(
            hasher.hash_one(&*workload.name),
            Arc::clone(&workload),
            |other| hasher.hash_one(&*other.name),
        );
        self.by_uid
            .insert_unique(hasher.hash_one(&*workload.uid), workload, |other| {
                hasher.hash_one(&*other.uid)
            });
    }

    /// Removes the workload with this uid; returns it.
    pub(crate) fn remove(&mut self, uid: &str) -> Option<Arc<Workload>> {
        let hasher = &self.hasher;
        let (workload, _) = self
            .by_uid
            .find_entry(hasher.hash_one(uid), |workload| *workload.uid == *uid)
            .ok()?
            .remove();
        if let Ok(entry) = self
            .by_name
            .find_entry(hasher.hash_one(&*workload.name), |other| {
                Arc::ptr_eq(other, &workload)
            })
        {
            entry.remove();
        }
        if let Some(on_node) = self.by_node.get_mut(&workload.node) {
            on_node.retain(|other| !Arc::ptr_eq(other, &workload));
            if on_node.is_empty() {
                self.by_node.remove(&workload.node);
            }
        }
        for ip in workload.addresses.iter() {
            let hash = hasher.hash_one((&*workload.network, Some(ip)));
            if let Ok(entry) = self.by_address.find_entry(hash, |owner| {
                Arc::ptr_eq(&owner.workload, &workload) && owner.is(&workload.network, *ip)
            }) {
                entry.remove();
            }
        }
        Some(workload)
    }

    /// The workload with this uid.
    pub(crate) fn get(&self, uid: &str) -> Option<&Arc<Workload>> {
        self.by_uid
            .find(self.hasher.hash_one(uid), |workload| *workload.uid == *uid)
    }

    /// The workload owning `ip` (canonical) on `network`: of those that
    /// claim it, the first by `AddressEntry::precedence`.
    pub(crate) fn by_address(&self, network: &str, ip: IpAddr) -> Option<&Arc<Workload>> {
        self.by_address
            .iter_hash(self.hasher.hash_one((network, Some(&ip))))
            .filter(|owner| owner.is(network, ip))
            .max_by_key(|owner| owner.precedence())
            .map(|owner| &owner.workload)
    }

    /// The workloads with pod name `name`, in no particular order.
    pub(crate) fn by_name<'a, 'n>(
        &'a self,
        name: &'n str,
    ) -> impl Iterator<Item = &'a Arc<Workload>> + use<'a, 'n> {
        self.by_name
            .iter_hash(self.hasher.hash_one(name))
            .filter(move |workload| *workload.name == *name)
    }

    /// The workloads on `node`, in no particular order.
    pub(crate) fn on_node(&self, node: &str) -> impl Iterator<Item = &Arc<Workload>> {
        let indexed = (!node.is_empty()).then(|| self.by_node.get(node));
        let unnamed = node
            .is_empty()
            .then(|| self.iter().filter(|workload| workload.node.is_empty()));
        let indexed = indexed.flatten().into_iter().flatten();
        indexed.chain(unnamed.into_iter().flatten())
    }

    /// Every workload, in no particular order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Arc<Workload>> {
        self.by_uid.iter()
    }
}

/// An entry of the address table: a workload and which of its addresses
/// the entry is for, so that the table can hash the entry again when it
/// grows. Two `u32`s keep it at 16 bytes.
#[derive(Clone, Debug)]
struct AddressEntry {
    workload: Arc<Workload>,
    position: u32,
    /// The table's insertion count when it was added.
    inserted: u32,
}

impl AddressEntry {
    /// Whether the entry is for `ip` on `network`.
    fn is(&self, network: &str, ip: IpAddr) -> bool {
        *self.workload.network == *network && self.address() == Some(&ip)
    }

    fn address(&self) -> Option<&IpAddr> {
        usize::try_from(self.position)
            .ok()
            .and_then(|position| self.workload.addresses.get(position))
    }

    /// Which of several workloads claiming one address owns it (AMBIENT.md
    /// §4.1, as istio/ztunnel): a pod (its uid names `//Pod/`) before any
    /// other kind, since its address is the one least open to spoofing;
    /// then one in the mesh (HBONE), which has more to say about the
    /// destination; then the one inserted last.
    fn precedence(&self) -> (bool, bool, u32) {
        (
            self.workload.uid.contains("//Pod/"),
            self.workload.protocol == InboundProtocol::Hbone,
            self.inserted,
        )
    }

    /// The hash it was inserted with. A stored workload never changes, so
    /// `position` is always one of its addresses.
    fn hash(&self, hasher: &RandomState) -> u64 {
        hasher.hash_one((&*self.workload.network, self.address()))
    }
}
