//! The mesh model and its sources: which pods exist (with which UID and
//! service account, on which node), which services select them, and which
//! authorization policies apply. The control plane's CA authorizes
//! impersonation against it and its xDS server serves it to node agents;
//! both read the same [`MeshSnapshot`], so a pod that moves node is seen
//! the same way by both. The node agent reads pods from it too.
//!
//! [`PodRegistry`] is the seam between the model and where it comes from:
//! a YAML file ([`FileRegistry`], `file.rs`) or the Kubernetes API
//! ([`kube`], whose [`kube::convert::convert`] is the pure mapping from
//! Kubernetes objects to a [`MeshFile`]). Readers take an immutable
//! [`MeshSnapshot`], so one request sees one consistent mesh; a change
//! swaps the whole snapshot at once and tells [`PodRegistry::changes`]
//! watchers. The entries are `pod.rs`, `workload_entry.rs` (workloads that
//! are no pods: WorkloadEntries and ServiceEntries' endpoints),
//! `service.rs`, `policy.rs` and `peer_authentication.rs` (with the
//! policies istiod makes of them), with
//! the waypoints and network gateways they name in `waypoint.rs`; checks
//! across entries are `snapshot.rs`'s.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::fmt;
use std::marker::PhantomData;
use std::str::FromStr;
use std::sync::Arc;

use serde::Deserializer;
use serde::de::{self, Visitor};
use tokio::sync::watch;

pub use file::{FileRegistry, RegistryError};
pub use peer_authentication::{
    CONVERTED_POLICY_PREFIX, MtlsMode, PeerAuthentication, STATIC_STRICT_POLICY_NAME,
};
pub use pod::{Labels, Locality, Pod, PodPhase, WorkloadProtocol, WorkloadType};
pub use policy::{
    Cidr, Policy, PolicyAction, PolicyMatch, PolicyScope, ServiceAccountMatch, StringMatch,
};
pub use service::{
    AppProtocol, HealthPolicy, IpFamilies, LoadBalancing, LoadBalancingMode, LocalityScope,
    NetworkAddress, Service, ServicePort, ServiceVisibility, TargetPort,
};
pub use snapshot::{DEFAULT_ROOT_NAMESPACE, MeshError, MeshFile, MeshSnapshot};
pub use waypoint::{
    ApplicationTunnel, GatewayAddress, GatewayDestination, NetworkGateway, TunnelHeader,
    WAYPOINT_HBONE_PORT, WeightedWaypoint,
};
pub use workload_entry::{EntryAddress, WorkloadEntry};

mod file;
pub mod kube;
mod peer_authentication;
mod pod;
mod policy;
mod service;
mod snapshot;
mod waypoint;
mod workload_entry;

/// Where pod, service and policy facts come from.
pub trait PodRegistry: Send + Sync {
    /// The current registry. Cheap: an `Arc` clone.
    fn snapshot(&self) -> Arc<MeshSnapshot>;

    /// A receiver told of every later snapshot; it sees the current one as
    /// already seen.
    fn changes(&self) -> watch::Receiver<Arc<MeshSnapshot>>;
}

/// A registry that never changes: for tests, and for pods built in code.
#[derive(Debug)]
pub struct StaticRegistry(watch::Sender<Arc<MeshSnapshot>>);

impl StaticRegistry {
    /// A registry that always returns `snapshot`.
    pub fn new(snapshot: MeshSnapshot) -> Self {
        StaticRegistry(watch::Sender::new(Arc::new(snapshot)))
    }
}

impl PodRegistry for StaticRegistry {
    fn snapshot(&self) -> Arc<MeshSnapshot> {
        Arc::clone(&self.0.borrow())
    }

    fn changes(&self) -> watch::Receiver<Arc<MeshSnapshot>> {
        self.0.subscribe()
    }
}

/// Deserializes a value written as one string through its `FromStr`,
/// inside the string's own visit, so that an error carries the line and
/// column of the value itself.
fn text_value<'de, D, T>(deserializer: D, expecting: &'static str) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: FromStr<Err = String>,
{
    deserializer.deserialize_str(TextVisitor {
        expecting,
        value: PhantomData,
    })
}

struct TextVisitor<T> {
    expecting: &'static str,
    value: PhantomData<T>,
}

impl<T: FromStr<Err = String>> Visitor<'_> for TextVisitor<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.expecting)
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<T, E> {
        text.parse().map_err(E::custom)
    }
}

#[cfg(test)]
mod tests;
