//! The VIPs of ServiceEntries that have none, as istiod's IP allocator
//! gives them (`pilot/pkg/controllers/ipallocate`): one IPv4 address from
//! 240.240.0.0/16 and one IPv6 address from 2001:2::/48 per host, written
//! into the ServiceEntry's `status.addresses` (`{value, host}`), where the
//! conversion reads them back (`service_entry.rs`), so a VIP stays the
//! same across restarts and replicas.
//!
//! Pure: [`allocate`] takes every ServiceEntry and says which statuses
//! must change; writing them is the control plane's
//! (`control-plane/src/service_entry_status.rs`), and the mesh file, which
//! has no status to write, applies them in memory ([`with_allocations`]).
//!
//! Who wants addresses, as istiod: not `resolution: NONE` (traffic keeps
//! its own destination), not with `spec.addresses`, not when labelled
//! `networking.istio.io/enable-autoallocate-ip: "false"`; and of its hosts,
//! not a wildcard unless the resolution is `DYNAMIC_DNS`. Addresses
//! already in a status are kept while their hosts are the spec's; an
//! address in use twice stays with the older ServiceEntry (by creation
//! time, then namespace and name) and the other is given new ones, as it
//! is when a ServiceEntry's own `spec.addresses` claim it. A ServiceEntry
//! that no longer wants addresses has its status emptied.
//!
//! Where ours differs: istiod hands out addresses from a cursor that only
//! moves on while it runs (and never frees a deleted ServiceEntry's); ours
//! takes the lowest free one on each pass, so an address freed by a
//! deleted ServiceEntry can be given again. Each pass starts from what the
//! statuses say, so both survive a restart the same way.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use super::service_entry::Resolution;
use crate::kube::service_entry_crd::{ServiceEntry, ServiceEntryAddress, ServiceEntryStatus};

/// The range IPv4 VIPs come from (istiod's
/// `PILOT_IP_AUTOALLOCATE_IPV4_PREFIX` default): reserved for future use,
/// so never a real destination.
pub const IPV4_RANGE: (Ipv4Addr, u8) = (Ipv4Addr::new(240, 240, 0, 0), 16);

/// The range IPv6 VIPs come from (istiod's
/// `PILOT_IP_AUTOALLOCATE_IPV6_PREFIX` default): the benchmarking block.
pub const IPV6_RANGE: (Ipv6Addr, u8) = (Ipv6Addr::new(0x2001, 2, 0, 0, 0, 0, 0, 0), 48);

/// Opts a ServiceEntry out with the value `false` (any case).
const AUTOALLOCATE_LABEL: &str = "networking.istio.io/enable-autoallocate-ip";

/// A ServiceEntry whose `status.addresses` must become `addresses`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusChange {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// The whole new list (empty to clear it).
    pub addresses: Vec<ServiceEntryAddress>,
}

/// Whether the ServiceEntry's hosts get allocated addresses.
pub fn wants_allocation(entry: &ServiceEntry) -> bool {
    let resolution = Resolution::parse(entry.spec.resolution.as_deref());
    let opted_out = entry
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(AUTOALLOCATE_LABEL))
        .is_some_and(|value| value.eq_ignore_ascii_case("false"));
    resolution.is_ok_and(|resolution| resolution != Resolution::None)
        && !opted_out
        && entry.spec.addresses.is_empty()
}

/// Whether a host of an allocating ServiceEntry gets addresses: a wildcard
/// only with `DYNAMIC_DNS`.
pub fn host_takes_allocation(host: &str, resolution: Resolution) -> bool {
    !host.starts_with('*') || resolution == Resolution::DynamicDns
}

/// The addresses its status holds, by host; text that is no IP is
/// skipped.
pub fn allocated_addresses(entry: &ServiceEntry) -> BTreeMap<&str, Vec<IpAddr>> {
    let mut by_host: BTreeMap<&str, Vec<IpAddr>> = BTreeMap::new();
    for address in status_addresses(entry) {
        if let Ok(ip) = address.value.parse::<IpAddr>() {
            by_host.entry(address.host.as_str()).or_default().push(ip);
        }
    }
    by_host
}

/// Every status that must change for every ServiceEntry to hold the
/// addresses it should, in the order the entries are decided (oldest
/// first).
pub fn allocate(entries: &[Arc<ServiceEntry>]) -> Vec<StatusChange> {
    let mut sorted: Vec<&ServiceEntry> = entries.iter().map(Arc::as_ref).collect();
    sorted.sort_by_key(|entry| {
        let metadata = &entry.metadata;
        (
            metadata.creation_timestamp.as_ref().map(|time| time.0),
            metadata.namespace.clone(),
            metadata.name.clone(),
        )
    });
    let mut pool = Pool::default();
    // Written addresses claim theirs first: an allocated one that meets
    // them moves.
    for entry in &sorted {
        for text in &entry.spec.addresses {
            if let Ok(ip) = text.parse::<IpAddr>() {
                pool.used.insert(ip.to_canonical());
            }
        }
    }
    let mut changes = Vec::new();
    for entry in sorted {
        let (Some(namespace), Some(name)) = (
            entry.metadata.namespace.clone(),
            entry.metadata.name.clone(),
        ) else {
            continue;
        };
        let current = status_addresses(entry);
        let wanted = if wants_allocation(entry) {
            pool.addresses_for(entry)
        } else {
            Vec::new()
        };
        if !same_addresses(current, &wanted) {
            changes.push(StatusChange {
                namespace,
                name,
                addresses: wanted,
            });
        }
    }
    changes
}

/// The entries with `changes` applied to their statuses: what the mesh
/// file converts, having no API to write them through.
pub fn with_allocations(entries: &[Arc<ServiceEntry>]) -> Vec<Arc<ServiceEntry>> {
    let mut changes: HashMap<(String, String), Vec<ServiceEntryAddress>> = allocate(entries)
        .into_iter()
        .map(|change| ((change.namespace, change.name), change.addresses))
        .collect();
    entries
        .iter()
        .map(|entry| {
            let key = (
                entry.metadata.namespace.clone().unwrap_or_default(),
                entry.metadata.name.clone().unwrap_or_default(),
            );
            match changes.remove(&key) {
                Some(addresses) => {
                    let mut changed = ServiceEntry::clone(entry);
                    changed.status = Some(ServiceEntryStatus { addresses });
                    Arc::new(changed)
                }
                None => Arc::clone(entry),
            }
        })
        .collect()
}

fn status_addresses(entry: &ServiceEntry) -> &[ServiceEntryAddress] {
    entry
        .status
        .as_ref()
        .map_or(&[], |status| status.addresses.as_slice())
}

/// The same addresses for the same hosts, in any order.
fn same_addresses(current: &[ServiceEntryAddress], wanted: &[ServiceEntryAddress]) -> bool {
    let set = |list: &[ServiceEntryAddress]| list.iter().cloned().collect::<BTreeSet<_>>();
    current.len() == wanted.len() && set(current) == set(wanted)
}

/// The addresses in use, and where the next search starts in each range.
#[derive(Default)]
struct Pool {
    used: HashSet<IpAddr>,
    next_v4: u32,
    next_v6: u128,
}

impl Pool {
    /// The status addresses of an allocating entry: its own kept while
    /// they are its hosts' and nobody older holds them, else new ones for
    /// every host.
    fn addresses_for(&mut self, entry: &ServiceEntry) -> Vec<ServiceEntryAddress> {
        let resolution =
            Resolution::parse(entry.spec.resolution.as_deref()).unwrap_or(Resolution::None);
        let mut hosts: Vec<&str> = Vec::new();
        for host in &entry.spec.hosts {
            if host_takes_allocation(host, resolution) && !hosts.contains(&host.as_str()) {
                hosts.push(host);
            }
        }
        let existing = allocated_addresses(entry);
        // One address held by someone older moves all of the entry's.
        let keep = !existing
            .values()
            .flatten()
            .any(|ip| self.used.contains(&ip.to_canonical()));
        if keep {
            for ip in existing.values().flatten() {
                self.used.insert(ip.to_canonical());
            }
        }
        let mut addresses = Vec::new();
        for host in hosts {
            let ips = match existing.get(host) {
                Some(ips) if keep => ips.clone(),
                _ => self.next_pair(),
            };
            addresses.extend(ips.into_iter().map(|ip| ServiceEntryAddress {
                value: ip.to_string(),
                host: host.to_owned(),
            }));
        }
        addresses
    }

    /// One new IPv4 and one new IPv6 address; a family whose range is
    /// used up gives none.
    fn next_pair(&mut self) -> Vec<IpAddr> {
        let mut pair = Vec::with_capacity(2);
        let (base, bits) = IPV4_RANGE;
        let size = 1u32 << (32 - bits);
        if let Some(offset) = self.free_offset(u128::from(self.next_v4), u128::from(size), |o| {
            IpAddr::V4(Ipv4Addr::from(u32::from(base) + o as u32))
        }) {
            self.next_v4 = offset as u32 + 1;
            pair.push(IpAddr::V4(Ipv4Addr::from(u32::from(base) + offset as u32)));
        }
        let (base, bits) = IPV6_RANGE;
        let size = 1u128 << (128 - bits);
        if let Some(offset) = self.free_offset(self.next_v6, size, |o| {
            IpAddr::V6(Ipv6Addr::from(u128::from(base) + o))
        }) {
            self.next_v6 = offset + 1;
            pair.push(IpAddr::V6(Ipv6Addr::from(u128::from(base) + offset)));
        }
        for ip in &pair {
            self.used.insert(*ip);
        }
        pair
    }

    /// The first free offset from `start` (never 0, the range's own
    /// address), wrapping once; `None` when every one is used.
    fn free_offset(&self, start: u128, size: u128, at: impl Fn(u128) -> IpAddr) -> Option<u128> {
        let start = if start == 0 || start >= size {
            1
        } else {
            start
        };
        let mut offset = start;
        loop {
            if offset >= size {
                offset = 1;
            }
            if !self.used.contains(&at(offset)) {
                return Some(offset);
            }
            offset += 1;
            if offset == start {
                return None;
            }
        }
    }
}

#[cfg(test)]
mod tests;
