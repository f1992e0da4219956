//! The shared (in-pod) mode: one proxy per node serving every meshed pod on
//! it, with each pod's listeners opened inside the pod's own network
//! namespace (WIRE.md §1, §5).
//!
//! - `zds`: the session with the node agent over its SOCK_SEQPACKET socket;
//!   it validates every message, acks it, and asks [`PodProxies`] to act.
//! - `netns`: a handle on a pod's network namespace, and the socket factory
//!   that creates sockets inside it.
//! - `workloads`: the per-pod proxies, which implement [`PodProxies`].
//!
//! The ZDS session knows nothing of listeners, and the per-pod proxies know
//! nothing of the wire: this trait is the seam between them.

use std::collections::HashSet;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use crate::config::WorkloadInfo;

pub mod netns;
pub mod workloads;
pub mod zds;

/// A pod as the node agent names it in an `add`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodInfo {
    /// Kubernetes `metadata.uid`: the key of every ZDS message.
    pub uid: Arc<str>,
    /// Namespace, name and service account, which match the pod to its
    /// `Workload` on this node.
    pub workload: WorkloadInfo,
}

/// Why a pod's proxy could not start: the detail of a
/// `failure to start proxy : …` NACK.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The handle is not a network namespace, or entering it failed.
    #[error("entering the pod's network namespace")]
    Netns(#[source] std::io::Error),
    /// A listener could not be bound inside the pod.
    #[error("binding the {what} listener in the pod")]
    Bind {
        /// Which listener.
        what: &'static str,
        /// What the kernel said.
        source: std::io::Error,
    },
    /// The proxy is shutting down and takes no new pods.
    #[error("ztunnel is draining")]
    Draining,
}

/// What the ZDS session asks of the per-pod proxies. Calls are quick and
/// synchronous (bind a few sockets, spawn tasks); they never wait on the
/// network. The one ZDS session is the only caller, so calls never race.
pub trait PodProxies: Send + Sync + 'static {
    /// Starts the pod's listeners inside `netns`. A pod already served in
    /// the same namespace (same device and inode) is left as it is; a
    /// different namespace replaces its proxy. The implementation keeps its
    /// own duplicate of the handle if it needs one.
    fn add(&self, pod: &PodInfo, netns: &OwnedFd) -> Result<(), StartError>;

    /// Stops the pod's proxy at once (not gracefully): its listeners close
    /// and its connections end. An unknown uid is not an error.
    fn del(&self, uid: &str);

    /// Stops every pod whose uid is not in `keep`: the reconciliation after
    /// a snapshot (`snapshot_sent`).
    fn retain(&self, keep: &HashSet<Arc<str>>);

    /// The uids of the pods being served, for the admin view.
    fn served(&self) -> Vec<Arc<str>>;

    /// How many pods' proxies failed to start and wait for a retry, as
    /// the session counts them, for `workload_manager_pending_proxy_count`.
    fn pending(&self, count: usize);
}
