//! Connections on the control plane's port, counted per source address
//! and in all, in two stages: TLS handshakes in flight, and established
//! connections. A peer that opens connections and sends nothing, or keeps
//! many open, holds slots; counting per source keeps one such peer (or a
//! few) from taking the slots every ztunnel of the cluster needs, and the
//! accept loop never waits for a slot: a connection over a limit is closed
//! at once.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

/// What is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// TLS handshakes in flight.
    Pending,
    /// Connections past their handshake, until they close.
    Established,
}

/// Why a connection got no slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Its source already has the most one source may have at this stage.
    PerSource(Stage),
    /// The most in all are at this stage.
    Total(Stage),
}

impl Refused {
    /// Its `reason` label on `ca_connections_refused`.
    pub fn label(self) -> &'static str {
        match self {
            Refused::PerSource(Stage::Pending) => "pending_per_source",
            Refused::Total(Stage::Pending) => "pending_total",
            Refused::PerSource(Stage::Established) => "established_per_source",
            Refused::Total(Stage::Established) => "established_total",
        }
    }
}

/// The counts of one stage, shared by the accept loop and the connections.
#[derive(Debug)]
pub struct SourceSlots {
    stage: Stage,
    per_source: usize,
    total: usize,
    counts: Mutex<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    by_source: HashMap<IpAddr, usize>,
    total: usize,
}

/// One connection's slot, given back when dropped.
#[derive(Debug)]
pub struct Slot {
    slots: Arc<SourceSlots>,
    source: IpAddr,
}

impl SourceSlots {
    /// At most `per_source` connections at `stage` from one address and
    /// `total` in all.
    pub fn new(stage: Stage, per_source: usize, total: usize) -> Arc<SourceSlots> {
        Arc::new(SourceSlots {
            stage,
            per_source,
            total,
            counts: Mutex::default(),
        })
    }

    /// A slot for a connection from `source`, or why there is none. An
    /// IPv4-mapped IPv6 address counts as its IPv4 address.
    pub fn admit(self: &Arc<Self>, source: IpAddr) -> Result<Slot, Refused> {
        let source = source.to_canonical();
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        if counts.total >= self.total {
            return Err(Refused::Total(self.stage));
        }
        let from_source = counts.by_source.entry(source).or_default();
        if *from_source >= self.per_source {
            return Err(Refused::PerSource(self.stage));
        }
        *from_source += 1;
        counts.total += 1;
        Ok(Slot {
            slots: Arc::clone(self),
            source,
        })
    }

    /// Connections at this stage now, for tests.
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
            .slots
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
        let pending = SourceSlots::new(Stage::Pending, 2, 5);
        let a1 = pending.admit(ip("10.0.0.1")).unwrap();
        let _a2 = pending.admit(ip("::ffff:10.0.0.1")).unwrap();
        assert_eq!(
            pending.admit(ip("10.0.0.1")).unwrap_err(),
            Refused::PerSource(Stage::Pending),
            "a third from the same source, mapped or not"
        );
        let _b1 = pending.admit(ip("10.0.0.2")).unwrap();
        let _b2 = pending.admit(ip("10.0.0.2")).unwrap();
        let _c1 = pending.admit(ip("10.0.0.3")).unwrap();
        assert_eq!(pending.total(), 5);
        assert_eq!(
            pending.admit(ip("10.0.0.4")).unwrap_err(),
            Refused::Total(Stage::Pending),
            "a new source once all slots are taken"
        );
        drop(a1);
        assert_eq!(pending.total(), 4);
        let _d1 = pending.admit(ip("10.0.0.4")).expect("a slot came back");
        let refused = pending.admit(ip("10.0.0.1")).unwrap_err();
        assert_eq!(refused, Refused::Total(Stage::Pending));
        assert_eq!(refused.label(), "pending_total");
    }

    #[test]
    fn a_source_with_nothing_pending_is_forgotten() {
        let pending = SourceSlots::new(Stage::Established, 1, 10);
        for _ in 0..100 {
            let slot = pending.admit(ip("10.0.0.9")).unwrap();
            drop(slot);
        }
        let counts = pending.counts.lock().unwrap();
        assert!(counts.by_source.is_empty());
        assert_eq!(counts.total, 0);
    }
}
