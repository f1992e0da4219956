//! Exponential backoff with jitter, as plain arithmetic: a [`Backoff`]
//! holds one user's settings, [`Backoff::wait`] turns a count of failures in
//! a row and a random sample into the wait before the next attempt.
//!
//! The users keep their own count and their own settings: the identity
//! manager's CA retries (`identity/schedule.rs`), the xDS reconnect
//! (`xds/reconnect.rs`), the ZDS connect and reconnect (`inpod/zds.rs`), and
//! a listener's pause after an accept error (`accept.rs`).
//! When to count a failure and when to start over is theirs to decide.

use std::time::Duration;

/// How the random sample changes a wait. The sample is taken as `0.0..=1.0`;
/// anything outside (NaN included) is pulled into that range, NaN to 0.0.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Jitter {
    /// Every wait is exactly the exponential one.
    None,
    /// Up to this share of the wait is taken off, never added: `max` stays
    /// an upper bound of every wait. Sample 0.0 takes nothing off, 1.0 the
    /// whole share.
    Shorten(f64),
    /// The wait is scaled by up to ± this share and then capped at `max`
    /// again. Sample 0.0 is the shortest, 1.0 the longest, 0.5 unchanged.
    Spread(f64),
    /// As [`Jitter::Spread`], but the scaling comes after the cap, so a wait
    /// at the cap may be longer than `max` by up to the share.
    SpreadPastMax(f64),
}

/// One user's backoff settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// The wait after the first failure.
    pub initial: Duration,
    /// The cap of the exponential wait; see [`Jitter`] for whether jitter
    /// may pass it.
    pub max: Duration,
    /// The growth of the wait per further failure in a row.
    pub multiplier: u32,
    /// How randomness spreads the waits of proxies that failed together.
    pub jitter: Jitter,
}

impl Backoff {
    /// The wait after `failures` failed attempts in a row (0 counts as 1):
    /// [`initial`](Backoff::initial) times [`multiplier`](Backoff::multiplier)
    /// per failure after the first, at most [`max`](Backoff::max), then
    /// jittered with `random`, a sample in `[0, 1)`.
    pub fn wait(&self, failures: u32, random: f64) -> Duration {
        let mut base = self.initial.min(self.max);
        for _ in 1..failures {
            let next = base.saturating_mul(self.multiplier).min(self.max);
            // At the cap (or with a multiplier that does not grow) nothing
            // changes any more; stop rather than count to `failures`.
            if next == base {
                break;
            }
            base = next;
        }
        let random = unit(random);
        match self.jitter {
            Jitter::None => base,
            Jitter::Shorten(share) => scale(base, 1.0 - unit(share) * random),
            Jitter::Spread(share) => {
                scale(base, 1.0 + unit(share) * (2.0 * random - 1.0)).min(self.max)
            }
            Jitter::SpreadPastMax(share) => scale(base, 1.0 + unit(share) * (2.0 * random - 1.0)),
        }
    }
}

/// `wait` times `factor` (0.0 to 2.0 here), with the rounding of
/// [`Duration::mul_f64`] but saturating instead of panicking.
fn scale(wait: Duration, factor: f64) -> Duration {
    Duration::try_from_secs_f64(wait.as_secs_f64() * factor).unwrap_or(Duration::MAX)
}

/// A sample or a share pulled into `0.0..=1.0` (NaN to 0.0), so the
/// arithmetic above can neither go negative nor overflow.
fn unit(sample: f64) -> f64 {
    if sample.is_nan() {
        return 0.0;
    }
    sample.clamp(0.0, 1.0)
}

#[cfg(test)]
mod tests;
