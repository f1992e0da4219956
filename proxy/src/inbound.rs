//! Inbound: connections arriving for a local workload, over HBONE (15008,
//! with the peer's verified identity) or as captured plaintext (15006, with
//! none). Each is admitted or refused (`inbound/decision.rs`) before the
//! application is dialled.

pub mod decision;
pub mod listeners;
pub mod proxy_protocol;
pub mod tracker;
