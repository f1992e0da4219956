//! Workload identities: the certificates this proxy presents, fetched from
//! the CA and kept fresh (issue 3 "Identity manager", WIRE.md §3).
//!
//! `ca_client` talks to the CA, `manager` caches, prioritises and refreshes,
//! `schedule` holds the pure timing decisions both rely on.

pub mod ca_client;
pub mod manager;
pub mod schedule;
