//! TLS handshakes in flight on the control plane's port, counted per
//! source address and in all. A peer that opens connections and sends
//! nothing holds a slot until the handshake times out; counting per source
//! keeps one such peer (or a few) from taking the slots every ztunnel of
//! the cluster needs, and the accept loop never waits for a slot: a
//! connection over a limit is closed at once.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

/// Why a connection got no slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Its source already has the most pending handshakes one source may.
    PerSource,
    /// The most pending handshakes in all are in flight.
    Total,
}

impl Refused {
    /// Its `reason` label on `ca_connections_refused`.
    pub fn label(self) -> &'static str {
        match self {
            Refused::PerSource => "pending_per_source",
            Refused::Total => "pending_total",
        }
    }
}

/// The counts, shared by the accept loop and the handshake tasks.
#[derive(Debug)]
pub struct PendingHandshakes {
    per_source: usize,
    total: usize,
    counts: Mutex<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    by_source: HashMap<IpAddr, usize>,
    total: usize,
}

/// One pending handshake's slot, given back when dropped.
#[derive(Debug)]
pub struct Slot {
    pending: Arc<PendingHandshakes>,
    source: IpAddr,
}

impl PendingHandshakes {
    /// At most `per_source` pending handshakes from one address and
    /// `total` in all.
    pub fn new(per_source: usize, total: usize) -> Arc<PendingHandshakes> {
        Arc::new(PendingHandshakes {
            per_source,
            total,
            counts: Mutex::default(),
        })
    }

    /// A slot for a handshake from `source`, or why there is none. An
    /// IPv4-mapped IPv6 address counts as its IPv4 address.
    pub fn admit(self: &Arc<Self>, source: IpAddr) -> Result<Slot, Refused> {
        let source = source.to_canonical();
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        if counts.total >= self.total {
            return Err(Refused::Total);
        }
        let from_source = counts.by_source.entry(source).or_default();
        if *from_source >= self.per_source {
            return Err(Refused::PerSource);
        }
        *from_source += 1;
        counts.total += 1;
        Ok(Slot {
            pending: Arc::clone(self),
            source,
        })
    }

    /// Handshakes pending now, for tests.
    #[cfg(test)]
    fn total(&self) -> usize {
        self.counts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .total
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut counts = self
            .pending
            .counts
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        counts.total = counts.total.saturating_sub(1);
        if let Some(from_source) = counts.by_source.get_mut(&self.source) {
            *from_source = from_source.saturating_sub(1);
            if *from_source == 0 {
                counts.by_source.remove(&self.source);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is a failed test

    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn one_source_gets_its_share_the_others_theirs_and_slots_come_back() {
        let pending = PendingHandshakes::new(2, 5);
        let a1 = pending.admit(ip("10.0.0.1")).unwrap();
        let _a2 = pending.admit(ip("::ffff:10.0.0.1")).unwrap();
        assert_eq!(
            pending.admit(ip("10.0.0.1")).unwrap_err(),
            Refused::PerSource,
            "a third from the same source, mapped or not"
        );
        let _b1 = pending.admit(ip("10.0.0.2")).unwrap();
        let _b2 = pending.admit(ip("10.0.0.2")).unwrap();
        let _c1 = pending.admit(ip("10.0.0.3")).unwrap();
        assert_eq!(pending.total(), 5);
        assert_eq!(
            pending.admit(ip("10.0.0.4")).unwrap_err(),
            Refused::Total,
            "a new source once all slots are taken"
        );
        drop(a1);
        assert_eq!(pending.total(), 4);
        let _d1 = pending.admit(ip("10.0.0.4")).expect("a slot came back");
        assert_eq!(pending.admit(ip("10.0.0.1")).unwrap_err(), Refused::Total);
    }

    #[test]
    fn a_source_with_nothing_pending_is_forgotten() {
        let pending = PendingHandshakes::new(1, 10);
        for _ in 0..100 {
            let slot = pending.admit(ip("10.0.0.9")).unwrap();
            drop(slot);
        }
        let counts = pending.counts.lock().unwrap();
        assert!(counts.by_source.is_empty());
        assert_eq!(counts.total, 0);
    }
}
