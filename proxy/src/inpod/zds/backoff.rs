//! Exponential backoff between attempts to reach the node agent: plain
//! arithmetic, with the randomness passed in so tests can pin it.

use std::time::Duration;

/// Waits that double from `first` up to `max`, each scaled by a jitter
/// factor within `1 ± jitter`.
#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    jitter: f64,
    next: Duration,
}

impl Backoff {
    /// A backoff whose first wait is `first`.
    pub fn new(first: Duration, max: Duration, jitter: f64) -> Self {
        Backoff {
            first,
            max,
            jitter,
            next: first.min(max),
        }
    }

    /// The next wait. `random` is a value in `[0, 1)`; it only matters
    /// with a jitter.
    pub fn next_wait(&mut self, random: f64) -> Duration {
        let base = self.next;
        self.next = self.next.saturating_mul(2).min(self.max);
        let factor = 1.0 + self.jitter * (2.0 * random.clamp(0.0, 1.0) - 1.0);
        base.mul_f64(factor.max(0.0))
    }

    /// Starts over from the first wait.
    pub fn reset(&mut self) {
        self.next = self.first.min(self.max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_cap_and_resets() {
        let ms = Duration::from_millis;
        let mut backoff = Backoff::new(ms(20), ms(150), 0.0);
        let waits: Vec<_> = (0..6).map(|_| backoff.next_wait(0.5)).collect();
        assert_eq!(waits, [ms(20), ms(40), ms(80), ms(150), ms(150), ms(150)]);
        backoff.reset();
        assert_eq!(backoff.next_wait(0.5), ms(20));
    }

    #[test]
    fn jitter_stays_within_its_band() {
        let ms = Duration::from_millis;
        let mut low = Backoff::new(ms(100), ms(100), 0.2);
        let mut high = low.clone();
        assert_eq!(low.next_wait(0.0), ms(80));
        assert_eq!(high.next_wait(1.0), ms(120));
    }
}
