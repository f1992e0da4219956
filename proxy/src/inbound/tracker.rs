//! Open inbound connections, kept so that a policy change can re-check them
//! and close the ones no longer allowed. Closing shuts the upstream socket
//! down through a duplicate of its descriptor, which ends the copy loop on
//! both sides wherever it is running.

use std::collections::HashMap;
use std::io;
use std::net::Shutdown;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use socket2::{SockRef, Socket};
use tokio::net::TcpStream;

use crate::inbound::decision::still_allowed;
use crate::rbac::{Connection, DenyReason};
use crate::state::State;

/// The open connections.
#[derive(Debug, Clone, Default)]
pub struct Tracker {
    inner: Arc<Mutex<HashMap<u64, Tracked>>>,
    next: Arc<AtomicU64>,
}

#[derive(Debug)]
struct Tracked {
    connection: Connection,
    /// A duplicate of the upstream socket, to shut it down from here.
    socket: Socket,
}

/// Keeps a connection tracked; dropping it forgets the connection.
#[derive(Debug)]
pub struct TrackedGuard {
    tracker: Tracker,
    id: u64,
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
    /// Tracks `connection`, whose application side is `upstream`.
    pub fn track(&self, connection: Connection, upstream: &TcpStream) -> io::Result<TrackedGuard> {
        let socket = SockRef::from(upstream).try_clone()?;
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(id, Tracked { connection, socket });
        Ok(TrackedGuard {
            tracker: self.clone(),
            id,
        })
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
                    // The copy loop sees EOF and write errors and ends; errors
                    // here mean the socket is already closed.
                    let _ = tracked.socket.shutdown(Shutdown::Both);
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

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Tracked>> {
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
