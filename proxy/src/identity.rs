//! Workload identities: the certificates this proxy presents, fetched from
//! the CA and kept fresh (WIRE.md §3).
//!
//! `ca_client` talks to the CA; `manager` caches, prioritises and refreshes,
//! as the async shell around `entry`, the pure state machine of one
//! identity; `schedule` holds the timing arithmetic and the queue order.

pub mod ca_client;
pub mod entry;
pub mod manager;
pub mod schedule;
