//! Open connections of one pod's proxy: inbound ones, kept so that a
//! policy change can re-check them and close the ones no longer allowed,
//! and outbound ones, kept only to be listed. Closing cancels the
//! connection's stop token, which its copy waits on: the copy ends, reports
//! its close, and drops both sides. Each entry also carries what
//! `/config_dump` lists of it ([`Shown`]); how that is rendered is the
//! dump's business.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use tokio_util::sync::CancellationToken;

use crate::rbac::{Connection, DenyReason};

/// The open connections of one direction: `E` is what each entry keeps
/// beside what is listed, [`Recheck`] inbound and nothing outbound, where
/// no policy of this pod governs the connection.
#[derive(Debug)]
pub struct Tracker<E = Recheck> {
    /// Boxed entries: the table keeps spare slots as it grows, and a slot
    /// of a pointer is cheaper to keep spare than one of a whole entry.
    inner: Arc<Mutex<HashMap<u64, Box<Tracked<E>>>>>,
    next: Arc<AtomicU64>,
}

/// The open outbound connections, kept only to be listed.
pub type OutboundTracker = Tracker<()>;

impl<E> Clone for Tracker<E> {
    fn clone(&self) -> Self {
        Tracker {
            inner: Arc::clone(&self.inner),
            next: Arc::clone(&self.next),
        }
    }
}

impl<E> Default for Tracker<E> {
    fn default() -> Self {
        Tracker {
            inner: Arc::default(),
            next: Arc::default(),
        }
    }
}

#[derive(Debug)]
struct Tracked<E> {
    entry: E,
    /// What `/config_dump` lists.
    shown: Shown,
}

/// What a policy re-check of an inbound connection needs.
#[derive(Debug)]
pub struct Recheck {
    connection: Connection,
    /// What the connection's copy waits on.
    stop: CancellationToken,
    /// Why a re-check closed it, set before `stop` is cancelled.
    closed_by: Arc<OnceLock<DenyReason>>,
}

/// An open connection as `/config_dump`'s `connections` lists it
/// (AMBIENT.md §6.6). Addresses are kept, not strings: the text is made
/// only when the dump is asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shown {
    /// The client's address.
    pub src: SocketAddr,
    /// What the client asked for, where that differs from where it went:
    /// inbound, the HBONE CONNECT's target (`None` on plaintext); outbound,
    /// the captured original destination.
    pub original_dst: Option<SocketAddr>,
    /// Where the connection goes: inbound, the application's address;
    /// outbound, the address dialled (a ztunnel's or gateway's HBONE port,
    /// or the destination itself over TCP).
    pub actual_dst: SocketAddr,
    /// How it is carried.
    pub protocol: ShownProtocol,
}

/// How a connection is carried, by the names `/config_dump` uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShownProtocol {
    /// Plain TCP.
    Tcp,
    /// One HBONE tunnel.
    Hbone,
    /// An HBONE tunnel inside another, through a network gateway.
    DoubleHbone,
}

impl ShownProtocol {
    /// The name `/config_dump` shows.
    pub fn name(self) -> &'static str {
        match self {
            ShownProtocol::Tcp => "TCP",
            ShownProtocol::Hbone => "HBONE",
            ShownProtocol::DoubleHbone => "DOUBLEHBONE",
        }
    }
}

/// Keeps a connection tracked; dropping it forgets the connection.
#[derive(Debug)]
pub struct TrackedGuard<E = Recheck> {
    tracker: Tracker<E>,
    id: u64,
    /// Set inbound only.
    closed_by: Option<Arc<OnceLock<DenyReason>>>,
}

impl<E> TrackedGuard<E> {
    /// Why a policy re-check closed the connection, if one did: what its
    /// close reports instead of the copy's broken pipe.
    pub fn closed_by_policy(&self) -> Option<&DenyReason> {
        self.closed_by.as_deref().and_then(OnceLock::get)
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
    /// Tracks the inbound `connection`, whose copy stops when `stop` is
    /// cancelled.
    pub fn track(
        &self,
        connection: Connection,
        shown: Shown,
        stop: CancellationToken,
    ) -> TrackedGuard {
        let closed_by = Arc::new(OnceLock::new());
        let recheck = Recheck {
            connection,
            stop,
            closed_by: Arc::clone(&closed_by),
        };
        self.insert(recheck, shown, Some(closed_by))
    }

    /// Re-checks every open connection against `state` and closes the ones
    /// it no longer allows.
    pub fn recheck(
        &self,
        still_allowed: impl Fn(&Connection) -> Result<(), DenyReason>,
    ) -> Vec<Closed> {
        let mut closed = Vec::new();
        let mut open = self.lock();
        open.retain(|_, tracked| {
            let recheck = &tracked.entry;
            match still_allowed(&recheck.connection) {
                Ok(()) => true,
                Err(reason) => {
                    let _ = recheck.closed_by.set(reason.clone());
                    recheck.stop.cancel();
                    closed.push(Closed {
                        connection: recheck.connection.clone(),
                        reason,
                    });
                    false
                }
            }
        });
        closed
    }
}

impl OutboundTracker {
    /// Tracks an outbound connection, only to list it.
    pub fn track_listed(&self, shown: Shown) -> TrackedGuard<()> {
        self.insert((), shown, None)
    }
}

impl<E> Tracker<E> {
    fn insert(
        &self,
        entry: E,
        shown: Shown,
        closed_by: Option<Arc<OnceLock<DenyReason>>>,
    ) -> TrackedGuard<E> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(id, Box::new(Tracked { entry, shown }));
        TrackedGuard {
            tracker: self.clone(),
            id,
            closed_by,
        }
    }

    /// What `/config_dump` lists of every open connection, in no order.
    pub fn shown(&self) -> Vec<Shown> {
        self.lock().values().map(|tracked| tracked.shown).collect()
    }

    /// How many connections are open.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no connection is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Box<Tracked<E>>>> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl<E> Drop for TrackedGuard<E> {
    fn drop(&mut self) {
        self.tracker.lock().remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shown(port: u16) -> Shown {
        Shown {
            src: SocketAddr::from(([10, 0, 0, 1], port)),
            original_dst: Some(SocketAddr::from(([10, 96, 0, 10], 80))),
            actual_dst: SocketAddr::from(([10, 0, 0, 2], 15008)),
            protocol: ShownProtocol::Hbone,
        }
    }

    #[test]
    fn an_outbound_connection_is_listed_until_its_guard_drops() {
        let tracker = OutboundTracker::default();
        let first = tracker.track_listed(shown(50000));
        let second = tracker.track_listed(shown(50001));
        drop(first);
        assert_eq!(tracker.shown(), vec![shown(50001)]);
        assert!(second.closed_by_policy().is_none());
        drop(second);
        assert!(tracker.is_empty());
    }
}
