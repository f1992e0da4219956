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
//! - `xds/metrics.rs`: connection, message and NACK counters.
//!
//! Dialing, TLS and credential headers are `control_plane.rs`'s; the
//! resource conversions are `state.rs`'s and `rbac/proto.rs`'s.
//!
//! [`State`]: crate::state::State

use crate::control_plane::ControlPlaneError;

mod apply;
mod client;
mod metrics;
mod reconnect;
mod request;

pub use apply::{
    Applied, Change, KnownVersions, Rejection, Update, VersionChange, apply_changes, decide,
};
pub use client::XdsClient;
pub use metrics::XdsMetrics;
pub use reconnect::{Reconnect, StreamEnd};
pub use request::{ack, initial_requests, nack, node};

/// Type URL of workloads and services (WIRE.md §7).
pub const ADDRESS_TYPE_URL: &str = "type.googleapis.com/istio.workload.Address";

/// Type URL of authorization policies (WIRE.md §7).
pub const AUTHORIZATION_TYPE_URL: &str = "type.googleapis.com/istio.security.Authorization";

/// The resource types this client subscribes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ResourceKind {
    /// `istio.workload.Address`: a workload or a service.
    Address,
    /// `istio.security.Authorization`: a policy.
    Authorization,
}

impl ResourceKind {
    /// Every type, in the order of the initial requests (Address first).
    pub const ALL: [ResourceKind; 2] = [ResourceKind::Address, ResourceKind::Authorization];

    /// The type URL on the wire.
    pub fn type_url(self) -> &'static str {
        match self {
            ResourceKind::Address => ADDRESS_TYPE_URL,
            ResourceKind::Authorization => AUTHORIZATION_TYPE_URL,
        }
    }

    /// The type a response's `type_url` names; `None` for one we do not
    /// handle (logged and ACKed).
    pub fn from_type_url(type_url: &str) -> Option<ResourceKind> {
        ResourceKind::ALL
            .into_iter()
            .find(|kind| kind.type_url() == type_url)
    }
}

/// Why the xDS client cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum XdsError {
    /// The credentials or the alternative server name are unusable.
    #[error("xDS settings")]
    Settings(#[from] ControlPlaneError),
}

#[cfg(test)]
mod tests;
