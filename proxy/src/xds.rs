//! The delta xDS client (WIRE.md §7): one
//! `DeltaAggregatedResources` stream to istiod, wildcard subscriptions to
//! workloads/services (`istio.workload.Address`) and policies
//! (`istio.security.Authorization`), applied to the shared [`State`]
//! resource by resource, with ACK/NACK, reconnect and readiness.
//!
//! - `xds/apply.rs`: the pure core, a response → state changes, the ACK or
//!   NACK, and the versions to remember;
//! - `xds/request.rs`: node id, metadata and the requests themselves;
//! - `xds/reconnect.rs`: how long to wait before reconnecting;
//! - `xds/client.rs`: the task that moves messages and calls the above;
//! - `xds/demand.rs`: Address resources asked for one by one
//!   (`XDS_ON_DEMAND`), and the waits for them;
//! - `xds/metrics.rs`: connection, message and NACK counters.
//!
//! The type URLs and [`ResourceKind`] are the wire contract's, shared with
//! the control plane: `ztunnel_proto::xds_types`.
//!
//! Dialing, TLS and credential headers are `control_plane.rs`'s; the
//! resource conversions are `state.rs`'s and `rbac/proto.rs`'s.
//!
//! [`State`]: crate::state::State
//! [`ResourceKind`]: ztunnel_proto::xds_types::ResourceKind

use crate::control_plane::ControlPlaneError;

mod apply;
mod client;
pub mod demand;
mod known;
mod metrics;
mod reconnect;
mod request;

pub use apply::{Applied, Change, Update, apply_changes, decide};
pub use client::XdsClient;
pub use known::{KnownVersions, Rejection, VersionChange};
pub use metrics::XdsMetrics;
pub use reconnect::{Reconnect, StreamEnd};
pub use request::{ack, initial_requests, initial_requests_on_demand, nack, node};

/// Why the xDS client cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum XdsError {
    /// The credentials or the alternative server name are unusable.
    #[error("xDS settings")]
    Settings(#[from] ControlPlaneError),
}

#[cfg(test)]
mod tests;
