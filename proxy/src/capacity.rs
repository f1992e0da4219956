//! The process-wide bound on the connections the proxy carries: one slot
//! per accepted connection on any listener of any pod (outbound 15001,
//! inbound plaintext 15006, a TLS connection on 15008) and one per HBONE
//! stream it opens to an application, held until the connection or the
//! stream is gone. What a carried connection may hold in memory is bounded
//! per connection (copy buffers, TLS records, HTTP/2 windows); this bounds
//! how many there are, so that a flood of connections, from one pod or
//! many, ends in refusals counted here rather than in the kernel's OOM
//! killer taking the whole node's traffic down.
//!
//! When no slot is free, a new connection is closed at once (a stream is
//! answered 503), `ztunnel_connections_refused_total{listener}` counts it,
//! and the log has one warning when refusals start and one line when a
//! connection is admitted again. Which listener refuses, and how, is the
//! caller's: `accept.rs` for listeners, `inbound/hbone.rs` for streams.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Labels of `ztunnel_connections_refused`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RefusedLabels {
    /// `outbound`, `inbound_plaintext`, `hbone` (a TLS connection) or
    /// `hbone_stream` (a CONNECT on an open one).
    listener: &'static str,
}

/// The bound, shared by every pod's proxy of the process.
#[derive(Debug)]
pub struct Capacity {
    slots: Arc<Semaphore>,
    limit: usize,
    /// Whether the last attempt was refused: one warning per episode, not
    /// one per connection of a flood.
    refusing: AtomicBool,
    /// Refusals in the current episode, for the line that ends it.
    refused_in_episode: AtomicU64,
    refused: Family<RefusedLabels, Counter>,
    carried: Gauge,
}

/// A carried connection's slot, given back when dropped.
#[derive(Debug)]
pub struct Slot {
    _permit: OwnedSemaphorePermit,
    carried: Gauge,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.carried.dec();
    }
}

impl Capacity {
    /// A bound of `limit` connections (more than zero; the configuration
    /// refuses zero), with its metrics registered on `registry`.
    pub fn register(registry: &mut Registry, limit: usize) -> Arc<Self> {
        let capacity = Self::new(limit);
        registry.register(
            "ztunnel_connections_refused",
            "Connections closed at once, and HBONE streams answered 503, because the proxy carried its most connections (MAX_CONNECTIONS), by listener",
            capacity.refused.clone(),
        );
        registry.register(
            "ztunnel_connections_carried",
            "Connections and HBONE streams the proxy carries now, each holding one of MAX_CONNECTIONS slots",
            capacity.carried.clone(),
        );
        let limit_gauge = Gauge::<i64>::default();
        limit_gauge.set(i64::try_from(limit).unwrap_or(i64::MAX));
        registry.register(
            "ztunnel_connection_limit",
            "The most connections and HBONE streams the proxy carries at once (MAX_CONNECTIONS)",
            limit_gauge,
        );
        Arc::new(capacity)
    }

    /// A bound of `limit` connections with metrics registered nowhere, for
    /// proxies built by tests.
    pub fn new(limit: usize) -> Self {
        let limit = limit.clamp(1, Semaphore::MAX_PERMITS);
        Self {
            slots: Arc::new(Semaphore::new(limit)),
            limit,
            refusing: AtomicBool::new(false),
            refused_in_episode: AtomicU64::new(0),
            refused: Family::default(),
            carried: Gauge::default(),
        }
    }

    /// A slot for a new connection of `listener`, or `None` (counted and,
    /// at the start of an episode, logged) when every slot is taken.
    pub fn admit(&self, listener: &'static str) -> Option<Slot> {
        match Arc::clone(&self.slots).try_acquire_owned() {
            Ok(permit) => {
                // A load first: the common case writes nothing shared.
                if self.refusing.load(Ordering::Relaxed)
                    && self.refusing.swap(false, Ordering::Relaxed)
                {
                    let refused = self.refused_in_episode.swap(0, Ordering::Relaxed);
                    tracing::info!(
                        limit = self.limit,
                        refused,
                        "admitting connections again, below the connection limit"
                    );
                }
                self.carried.inc();
                Some(Slot {
                    _permit: permit,
                    carried: self.carried.clone(),
                })
            }
            Err(_) => {
                self.refused
                    .get_or_create(&RefusedLabels { listener })
                    .inc();
                self.refused_in_episode.fetch_add(1, Ordering::Relaxed);
                if !self.refusing.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        listener,
                        limit = self.limit,
                        "the proxy carries its most connections (MAX_CONNECTIONS); refusing new ones until some close"
                    );
                }
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(registry: &Registry) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
        text
    }

    #[test]
    fn a_slot_given_back_admits_the_next_connection_and_refusals_are_counted_by_listener() {
        let mut registry = Registry::default();
        let capacity = Capacity::register(&mut registry, 2);
        let first = capacity.admit("outbound").unwrap();
        let _second = capacity.admit("hbone").unwrap();
        assert!(capacity.admit("outbound").is_none());
        assert!(capacity.admit("hbone_stream").is_none());
        assert!(capacity.admit("hbone_stream").is_none());
        drop(first);
        let _third = capacity.admit("inbound_plaintext").unwrap();
        let text = refused(&registry);
        for line in [
            "ztunnel_connections_refused_total{listener=\"outbound\"} 1",
            "ztunnel_connections_refused_total{listener=\"hbone_stream\"} 2",
            "ztunnel_connections_carried 2",
            "ztunnel_connection_limit 2",
        ] {
            assert!(text.contains(line), "{line} in:\n{text}");
        }
        assert!(!capacity.refusing.load(Ordering::Relaxed));
    }

    #[test]
    fn a_limit_of_zero_still_carries_one_connection() {
        let capacity = Capacity::new(0);
        let _only = capacity.admit("outbound").unwrap();
        assert!(capacity.admit("outbound").is_none());
    }
}
