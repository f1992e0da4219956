//! Open inbound connections, kept so that a policy change can re-check them
//! and close the ones no longer allowed. Closing cancels the connection's
//! stop token, which its copy waits on: the copy ends, reports its close,
//! and drops both sides.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use tokio_util::sync::CancellationToken;

use crate::inbound::decision::still_allowed;
use crate::rbac::{Connection, DenyReason};
use crate::state::State;

/// The open connections.
#[derive(Debug, Clone, Default)]
pub struct Tracker {
    /// Boxed entries: the table keeps spare slots as it grows, and a slot
    /// of a pointer is cheaper to keep spare than one of a whole entry.
    inner: Arc<Mutex<HashMap<u64, Box<Tracked>>>>,
    next: Arc<AtomicU64>,
}

#[derive(Debug)]
struct Tracked {
    connection: Connection,
    /// What the connection's copy waits on.
    stop: CancellationToken,
    /// Why a re-check closed it, set before `stop` is cancelled.
    closed_by: Arc<OnceLock<DenyReason>>,
}

/// Keeps a connection tracked; dropping it forgets the connection.
#[derive(Debug)]
pub struct TrackedGuard {
    tracker: Tracker,
    id: u64,
    closed_by: Arc<OnceLock<DenyReason>>,
}

impl TrackedGuard {
    /// Why a policy re-check closed the connection, if one did: what its
    /// close reports instead of the copy's broken pipe.
    pub fn closed_by_policy(&self) -> Option<&DenyReason> {
        self.closed_by.get()
    }
}

/// A connection closed by a re-check.
#[derive(Debug)]
pub struct Closed {
    /// The authorization inputs of the connection.
    pub connection: Connection,
    /// Why it is no longer allowed.
    pub reason: DenyReason,
}

impl Tracker {
    /// Tracks `connection`, whose copy stops when `stop` is cancelled.
    pub fn track(&self, connection: Connection, stop: CancellationToken) -> TrackedGuard {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let closed_by = Arc::new(OnceLock::new());
        self.lock().insert(
            id,
            Box::new(Tracked {
                connection,
                stop,
                closed_by: Arc::clone(&closed_by),
            }),
        );
        TrackedGuard {
            tracker: self.clone(),
            id,
            closed_by,
        }
    }

    /// Re-checks every open connection against `state` and closes the ones
    /// it no longer allows.
    pub fn recheck(&self, state: &State) -> Vec<Closed> {
        let mut closed = Vec::new();
        let mut open = self.lock();
        open.retain(
            |_, tracked| match still_allowed(state, &tracked.connection) {
                Ok(()) => true,
                Err(reason) => {
                    let _ = tracked.closed_by.set(reason.clone());
                    tracked.stop.cancel();
                    closed.push(Closed {
                        connection: tracked.connection.clone(),
                        reason,
                    });
                    false
                }
            },
        );
        closed
    }

    /// How many connections are open.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no connection is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Box<Tracked>>> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Drop for TrackedGuard {
    fn drop(&mut self) {
        self.tracker.lock().remove(&self.id);
    }
}
