//! The control plane's delta ADS server (WIRE.md §7): workloads, services
//! and authorization policies from the mesh source (the mesh file or the
//! Kubernetes API), served on the CA's own TLS port as istiod serves both
//! on 15012.
//!
//! The path of a change:
//!
//! ```text
//! FileRegistry::reload, or KubeRegistry's rebuild after a watch event
//!   ─▶ Arc<MeshSnapshot> (the CA authorizes from it too)
//!   ─▶ resources::{addresses, authorizations}
//!                        (pure: snapshot → named Address / Authorization)
//!   ─▶ cache::MeshResources (encoded once, versioned by content hash,
//!                            with the changes since the previous build)
//!   ─▶ every stream: delta::DeltaStream (pure: what this client was sent
//!                    → the response that brings it up to date)
//! ```
//!
//! `service.rs` is the thin async shell: token authentication, the task
//! that rebuilds resources on each snapshot, and one task per stream.
//! `wire.rs` frames the stream's gRPC messages, writing responses straight
//! from the shared encoded resources.

pub mod cache;
pub mod delta;
pub mod resources;
pub mod service;
pub mod wire;

/// Type URL of workloads and services.
pub const ADDRESS_TYPE_URL: &str = "type.googleapis.com/istio.workload.Address";

/// Type URL of authorization policies.
pub const AUTHORIZATION_TYPE_URL: &str = "type.googleapis.com/istio.security.Authorization";

/// The resource types this server serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResourceType {
    /// `istio.workload.Address`: workloads (named by uid) and services
    /// (named `namespace/hostname`).
    Address,
    /// `istio.security.Authorization`, named `namespace/name`.
    Authorization,
}

impl ResourceType {
    /// Every type, in the order ztunnel subscribes to them.
    pub const ALL: [ResourceType; 2] = [ResourceType::Address, ResourceType::Authorization];

    /// The type a request's type URL names, if this server serves it.
    pub fn from_type_url(type_url: &str) -> Option<Self> {
        match type_url {
            ADDRESS_TYPE_URL => Some(ResourceType::Address),
            AUTHORIZATION_TYPE_URL => Some(ResourceType::Authorization),
            _ => None,
        }
    }

    /// The type URL.
    pub fn type_url(self) -> &'static str {
        match self {
            ResourceType::Address => ADDRESS_TYPE_URL,
            ResourceType::Authorization => AUTHORIZATION_TYPE_URL,
        }
    }

    /// A short stable name for metric labels and logs.
    pub fn label(self) -> &'static str {
        match self {
            ResourceType::Address => "address",
            ResourceType::Authorization => "authorization",
        }
    }

    /// Position in [`ResourceType::ALL`], for per-type arrays.
    pub fn index(self) -> usize {
        match self {
            ResourceType::Address => 0,
            ResourceType::Authorization => 1,
        }
    }
}
