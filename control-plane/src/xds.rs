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
//! from the shared encoded resources. The type URLs and resource kinds are the
//! wire contract's, shared with the proxy: `ztunnel_proto::xds_types`.

pub mod cache;
pub mod delta;
pub mod resources;
pub mod service;
pub mod wire;
