//! When the identity manager fetches: the refresh time of a certificate, the
//! backoff after a CA failure, and the order of queued fetches (WIRE.md §3
//! "Refresh and retry"). Pure functions over plain data; the manager's task
//! only sleeps until the moments these return.

use std::cmp::Ordering;
use std::time::{Duration, SystemTime};

/// The largest share of the wait until half-life that jitter takes off, so
/// that the certificates of workloads started together do not all refresh in
/// the same second.
pub const REFRESH_JITTER: f64 = 0.1;

/// The shortest wait before a refresh. A certificate whose half-life has
/// already passed (a CA issuing lifetimes shorter than its NotBefore backdate)
/// would otherwise be fetched again at once, in a loop, for as long as the CA
/// answers.
pub const MIN_REFRESH_DELAY: Duration = Duration::from_secs(1);

/// The first backoff after a failed fetch (WIRE.md §3).
pub const BACKOFF_INITIAL: Duration = Duration::from_millis(500);

/// The growth factor of the backoff per failed attempt (WIRE.md §3).
pub const BACKOFF_MULTIPLIER: u32 = 2;

/// The share by which a backoff is randomly made longer or shorter, so that
/// proxies that lost the CA together do not come back together (WIRE.md §3).
pub const BACKOFF_JITTER: f64 = 0.2;

/// The longest backoff (WIRE.md §3).
pub const BACKOFF_MAX: Duration = Duration::from_secs(150);

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

/// How long to wait before retrying after `attempt` failed fetches in a row
/// (1 for the first failure): [`BACKOFF_INITIAL`] times
/// [`BACKOFF_MULTIPLIER`] per further attempt, scaled by up to
/// ±[`BACKOFF_JITTER`] (`jitter` 0.0 is the shortest, 1.0 the longest,
/// 0.5 none), and at most [`BACKOFF_MAX`].
pub fn backoff(attempt: u32, jitter: f64) -> Duration {
    let doublings = attempt.saturating_sub(1).min(16);
    let base = BACKOFF_INITIAL
        .saturating_mul(BACKOFF_MULTIPLIER.saturating_pow(doublings))
        .min(BACKOFF_MAX);
    let scale = 1.0 + BACKOFF_JITTER * (2.0 * clamp_unit(jitter) - 1.0);
    base.mul_f64(scale).min(BACKOFF_MAX)
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
