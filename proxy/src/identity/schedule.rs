//! When the identity manager fetches: the refresh time of a certificate, the
//! backoff settings after a CA failure, and the order of queued fetches
//! (WIRE.md §3 "Refresh and retry"). Pure functions over plain data; the
//! backoff arithmetic itself is `backoff.rs`'s, the per-identity decisions
//! that use all of these are `entry.rs`'s.

use std::cmp::Ordering;
use std::time::{Duration, SystemTime};

use crate::backoff::{Backoff, Jitter};

/// The largest share of the wait until half-life that jitter takes off, so
/// that the certificates of workloads started together do not all refresh in
/// the same second.
pub const REFRESH_JITTER: f64 = 0.1;

/// The shortest wait before a refresh. A certificate whose half-life has
/// already passed (a CA issuing lifetimes shorter than its NotBefore backdate)
/// would otherwise be fetched again at once, in a loop, for as long as the CA
/// answers.
pub const MIN_REFRESH_DELAY: Duration = Duration::from_secs(1);

/// The backoff after a failed fetch (WIRE.md §3): 0.5 s, doubling per
/// failure in a row, up to 150 s. Each wait is scaled by up to ±20 %, so
/// that proxies that lost the CA together do not come back together, and
/// stays at most 150 s.
pub const BACKOFF: Backoff = Backoff {
    initial: Duration::from_millis(500),
    max: Duration::from_secs(150),
    multiplier: 2,
    jitter: Jitter::Spread(0.2),
};

/// Who is waiting for a fetch. The derived order is the queue order: a
/// connection that waits comes first, then a local workload's prefetch, then
/// background refresh of a certificate that still works.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    /// Renewing a certificate that is still served; nobody waits on it.
    Refresh,
    /// A workload arrived on this node; its first connection will need it.
    Prefetch,
    /// A connection is blocked until the certificate arrives.
    Waiting,
}

/// A fetch waiting for one of the concurrent CA slots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuedFetch<K> {
    /// Who asked; higher goes first.
    pub priority: Priority,
    /// Arrival order; among equal priorities the earlier goes first.
    pub sequence: u64,
    /// What to fetch.
    pub key: K,
}

impl<K: Eq> Ord for QueuedFetch<K> {
    /// Greater means "fetch sooner", as `BinaryHeap` pops the greatest.
    fn cmp(&self, other: &Self) -> Ordering {
        self.priority
            .cmp(&other.priority)
            .then_with(|| other.sequence.cmp(&self.sequence))
    }
}

impl<K: Eq> PartialOrd for QueuedFetch<K> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// When to fetch a replacement for a certificate valid from `not_before` to
/// `not_after`: at half-life, brought forward by `jitter` (clamped to
/// `0.0..=1.0`) times [`REFRESH_JITTER`] of the time left until then, and
/// never sooner than [`MIN_REFRESH_DELAY`] after `now`.
pub fn refresh_at(
    not_before: SystemTime,
    not_after: SystemTime,
    now: SystemTime,
    jitter: f64,
) -> SystemTime {
    let lifetime = not_after.duration_since(not_before).unwrap_or_default();
    let half_life = not_before.checked_add(lifetime / 2).unwrap_or(not_after);
    let until_half_life = half_life.duration_since(now).unwrap_or_default();
    let early = until_half_life.mul_f64(REFRESH_JITTER * clamp_unit(jitter));
    let delay = until_half_life.saturating_sub(early).max(MIN_REFRESH_DELAY);
    now.checked_add(delay).unwrap_or(half_life)
}

/// A random sample comes in as `0.0..1.0`; anything else (NaN included) is
/// pulled into `0.0..=1.0` so the arithmetic above cannot overflow.
fn clamp_unit(sample: f64) -> f64 {
    if sample.is_nan() {
        return 0.0;
    }
    sample.clamp(0.0, 1.0)
}

#[cfg(test)]
mod tests;
