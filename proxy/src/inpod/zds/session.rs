//! The ZDS state machine of one connection (WIRE.md §5): the snapshot
//! bookkeeping, the retry list of pods whose proxy failed to start, the
//! readiness the connection reports, and what each request means for the
//! per-pod proxies. Plain synchronous code: the socket and the timers live
//! in the async shell (`zds.rs`), which feeds requests in and sends the
//! answers out.
//!
//! A new connection starts a new [`Session`]: that resets the snapshot set
//! and clears the retry list, while the proxies already running are kept.

use std::collections::{BTreeMap, HashSet};
use std::os::fd::OwnedFd;
use std::sync::Arc;

use ztunnel_certs::error_chain::ErrorChain;

use crate::inpod::{PodInfo, PodProxies, StartError};

use super::message::{Handle, ReadError, Request};

/// A request the agent should never have sent: NACKed, then the process
/// exits with status 1 (WIRE.md §5).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// `keep` only belongs in the snapshot.
    #[error("keep received after snapshot")]
    KeepAfterSnapshot,
    /// Each connection has exactly one snapshot.
    #[error("duplicate snapshot message")]
    DuplicateSnapshot,
    /// An `add` must name the pod's workload.
    #[error("add without workload info")]
    MissingWorkloadInfo,
}

/// Why a pod's proxy did not start: the detail of a
/// `failure to start proxy : …` NACK. The connection stays up.
#[derive(Debug, thiserror::Error)]
pub enum StartFailure {
    /// The fd of the `add` is not a network namespace. Checked when the
    /// message is read, stricter than istio's ztunnel (which finds out when
    /// `setns` fails); not retried, since it can never succeed.
    #[error("the handle is not a network namespace")]
    NotNetns,
    /// The per-pod proxies could not start it; retried every 5 s.
    #[error(transparent)]
    Proxy(StartError),
}

/// Why a request was NACKed. The `Display` text is the NACK's
/// `Ack.error`, word for word.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// The datagram could not be read.
    #[error("failure to read message : {0}")]
    Read(ReadError),
    /// The pod's proxy did not start. The NACK is all the agent hears, so
    /// it carries the causes in its text.
    #[error("failure to start proxy : {}", ErrorChain(.0))]
    Start(StartFailure),
    /// The agent broke the protocol.
    #[error("failure to process message : ProtocolError(\"{0}\")")]
    Protocol(ProtocolError),
}

impl RequestError {
    /// The metric label of this NACK.
    pub fn reason(&self) -> &'static str {
        match self {
            RequestError::Read(_) => "read",
            RequestError::Start(_) => "start",
            RequestError::Protocol(_) => "protocol",
        }
    }
}

/// A pod whose proxy failed to start, kept with its handle for the next
/// retry round.
#[derive(Debug)]
struct Pending {
    pod: PodInfo,
    netns: OwnedFd,
}

/// The state of one connection with the node agent.
#[derive(Debug)]
pub struct Session {
    /// The uids named (`add` or `keep`) since this connection began; `None`
    /// once `snapshot_sent` has arrived.
    snapshot: Option<HashSet<Arc<str>>>,
    /// Pods to start again on the next retry round, by uid.
    pending: BTreeMap<Arc<str>, Pending>,
    /// The readiness last decided. It is only re-evaluated after an ACK and
    /// after a retry round that leaves nothing pending (WIRE.md §5), so a
    /// start failure after ready leaves it ready until the next ACK.
    ready: bool,
}

impl Default for Session {
    /// A fresh connection: in the snapshot, nothing pending, not ready.
    fn default() -> Self {
        Session {
            snapshot: Some(HashSet::new()),
            pending: BTreeMap::new(),
            ready: false,
        }
    }
}

impl Session {
    /// A fresh connection: in the snapshot, nothing pending, not ready.
    pub fn new() -> Self {
        Session::default()
    }

    /// Whether this connection lets the proxy read as ready.
    pub fn is_ready(&self) -> bool {
        self.ready
    }

    /// How many pods wait for a retry round.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Whether `snapshot_sent` has arrived on this connection.
    pub fn snapshot_done(&self) -> bool {
        self.snapshot.is_none()
    }

    /// Applies one request: `Ok` is an ACK, `Err` a NACK with its text.
    pub fn handle(
        &mut self,
        request: Request,
        proxies: &dyn PodProxies,
    ) -> Result<(), RequestError> {
        let answer = match request {
            Request::Add {
                uid,
                workload,
                handle,
            } => {
                let workload =
                    workload.ok_or(RequestError::Protocol(ProtocolError::MissingWorkloadInfo))?;
                self.add(PodInfo { uid, workload }, handle, proxies)
            }
            Request::Keep { uid } => self.keep(uid),
            Request::Del { uid } => {
                self.del(&uid, proxies);
                Ok(())
            }
            Request::SnapshotSent => self.snapshot_sent(proxies),
        };
        if answer.is_ok() {
            self.evaluate_readiness();
        }
        answer
    }

    /// Tries every pending pod again; a pod that starts leaves the list.
    pub fn retry(&mut self, proxies: &dyn PodProxies) {
        if self.pending.is_empty() {
            return;
        }
        self.pending.retain(
            |uid, pending| match proxies.add(&pending.pod, &pending.netns) {
                Ok(()) => {
                    tracing::info!(%uid, "pod proxy started on retry");
                    false
                }
                Err(error) => {
                    tracing::warn!(%uid, error = %ErrorChain(&error), "pod proxy still failing to start");
                    true
                }
            },
        );
        if self.pending.is_empty() {
            self.evaluate_readiness();
        }
    }

    fn add(
        &mut self,
        pod: PodInfo,
        handle: Handle,
        proxies: &dyn PodProxies,
    ) -> Result<(), RequestError> {
        let uid = pod.uid.clone();
        if let Some(named) = &mut self.snapshot {
            named.insert(uid.clone());
        }
        // A new `add` supersedes an earlier one still waiting for a retry.
        self.pending.remove(&uid);
        let Handle::Netns(netns) = handle else {
            return Err(RequestError::Start(StartFailure::NotNetns));
        };
        tracing::info!(
            %uid,
            namespace = %pod.workload.namespace,
            name = %pod.workload.name,
            "adding pod"
        );
        match proxies.add(&pod, &netns) {
            Ok(()) => Ok(()),
            Err(error) => {
                let failure = RequestError::Start(StartFailure::Proxy(error));
                self.pending.insert(uid, Pending { pod, netns });
                Err(failure)
            }
        }
    }

    fn keep(&mut self, uid: Arc<str>) -> Result<(), RequestError> {
        let Some(named) = &mut self.snapshot else {
            return Err(RequestError::Protocol(ProtocolError::KeepAfterSnapshot));
        };
        named.insert(uid);
        Ok(())
    }

    fn del(&mut self, uid: &Arc<str>, proxies: &dyn PodProxies) {
        self.pending.remove(uid);
        match &mut self.snapshot {
            // The proxy, if any, goes at `snapshot_sent`, being unnamed.
            Some(named) => {
                tracing::info!(%uid, "deleting pod before the snapshot ends");
                named.remove(uid);
            }
            None => {
                tracing::info!(%uid, "deleting pod");
                proxies.del(uid);
            }
        }
    }

    fn snapshot_sent(&mut self, proxies: &dyn PodProxies) -> Result<(), RequestError> {
        let named = self
            .snapshot
            .take()
            .ok_or(RequestError::Protocol(ProtocolError::DuplicateSnapshot))?;
        tracing::info!(
            pods = named.len(),
            "snapshot received; dropping unnamed pods"
        );
        proxies.retain(&named);
        Ok(())
    }

    fn evaluate_readiness(&mut self) {
        self.ready = self.snapshot_done() && self.pending.is_empty();
    }
}
