//! Which of a service's candidate endpoints a connection goes to
//! (AMBIENT.md §4.3, §4.4): ranking by the service's routing preferences
//! against where the connecting workload runs, the mode's cut, and the
//! capacity-weighted pick. Pure functions over workloads; which endpoints
//! are candidates, and which port and address the chosen one is dialled
//! on, is `upstream.rs`'s business.

use std::sync::Arc;

use crate::state::service::{LoadBalancingMode, RoutingScope};
use crate::state::workload::Workload;

/// How closely `endpoint` matches `source` on `preferences`, walked in
/// order: each matching scope adds 1 and the first mismatch ends the walk.
/// Empty equals empty counts as a match.
///
/// `NETWORK` as the first scope is special: a match adds `len - 1` on top,
/// and a mismatch is skipped rather than ending the walk. So every endpoint
/// on the source's network outranks every endpoint elsewhere, and
/// locality orders the endpoints within each group.
pub fn rank(preferences: &[RoutingScope], source: &Workload, endpoint: &Workload) -> Rank {
    let network_first = preferences.first() == Some(&RoutingScope::Network);
    let mut matched = 0;
    let mut bonus = 0;
    for scope in preferences {
        let same = match scope {
            RoutingScope::Region => source.group.locality.region == endpoint.group.locality.region,
            RoutingScope::Zone => source.group.locality.zone == endpoint.group.locality.zone,
            RoutingScope::Subzone => {
                source.group.locality.subzone == endpoint.group.locality.subzone
            }
            RoutingScope::Node => source.node == endpoint.node,
            RoutingScope::Cluster => source.group.cluster_id == endpoint.group.cluster_id,
            RoutingScope::Network => {
                let same = source.network == endpoint.network;
                if network_first {
                    if !same {
                        continue;
                    }
                    bonus = preferences.len() - 1;
                }
                same
            }
        };
        if !same {
            break;
        }
        matched += 1;
    }
    Rank { matched, bonus }
}

/// An endpoint's standing under a service's routing preferences.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rank {
    /// Scopes matched before the first mismatch; `Strict` needs all of them.
    pub matched: usize,
    /// The same-network bonus when `NETWORK` comes first.
    pub bonus: usize,
}

impl Rank {
    /// The rank `Failover` orders by.
    pub fn total(self) -> usize {
        self.matched + self.bonus
    }
}

/// The candidates `mode` lets through: all of them under `Standard`
/// (preferences ignored); under `Strict` those that match every scope;
/// under `Failover` those of the best rank found, so traffic leaves the
/// closest group only once that group has no candidate left. With no
/// scopes at all, every candidate passes in every mode.
///
/// `Passthrough` services never get here from a VIP (no endpoint is
/// picked for them); reached another way (a waypoint or gateway named by
/// hostname), they rank as `Failover` does, as in istio/ztunnel.
pub fn preferred<'a>(
    mode: LoadBalancingMode,
    preferences: &[RoutingScope],
    source: &Workload,
    candidates: Vec<&'a Arc<Workload>>,
) -> Vec<&'a Arc<Workload>> {
    if mode == LoadBalancingMode::Standard {
        return candidates;
    }
    let ranked: Vec<(usize, &Arc<Workload>)> = candidates
        .into_iter()
        .filter_map(|endpoint| {
            let rank = rank(preferences, source, endpoint);
            let strict_miss = mode == LoadBalancingMode::Strict && rank.matched < preferences.len();
            (!strict_miss).then_some((rank.total(), endpoint))
        })
        .collect();
    let Some(best) = ranked.iter().map(|(rank, _)| *rank).max() else {
        return Vec::new();
    };
    ranked
        .into_iter()
        .filter(|(rank, _)| *rank == best)
        .map(|(_, endpoint)| endpoint)
        .collect()
}

/// One of `candidates`, each as likely as its share of the total
/// `capacity`: a capacity of 0 is never picked, and `None` when the total
/// is 0 (no candidates, or all of weight 0).
///
/// `pick` is the caller's random number, fresh per connection from a
/// source peers cannot predict; tests pass chosen or seeded values. It is
/// taken modulo the total, whose bias is at most total / 2^64: under 2^-20
/// even for a million endpoints of the largest capacity.
pub fn weighted<'a>(candidates: &[&'a Arc<Workload>], pick: u64) -> Option<&'a Arc<Workload>> {
    // A u64 sum of u32 weights cannot overflow below 2^32 candidates.
    let total: u64 = candidates
        .iter()
        .map(|endpoint| u64::from(endpoint.capacity))
        .sum();
    let mut point = pick.checked_rem(total)?;
    for endpoint in candidates {
        let weight = u64::from(endpoint.capacity);
        if point < weight {
            return Some(endpoint);
        }
        point -= weight;
    }
    None
}

#[cfg(test)]
mod tests;
