//! The one shutdown primitive of the proxy: graceful drain until a deadline,
//! then forced.
//!
//! [`channel`] gives a [`DrainTrigger`] (kept by whoever decides to stop:
//! the SIGTERM handler, `/quitquitquit`) and a [`DrainWatcher`]. Every
//! long-lived task (listener, connection, server) holds a clone of the
//! watcher for as long as it runs: the watcher itself is the task's
//! "still busy" guard, and dropping it tells the trigger the task is done.
//!
//! A drain goes through three phases:
//! 1. running: [`DrainWatcher::signaled`] pends;
//! 2. draining: `signaled` resolves; listeners stop accepting, HBONE sends
//!    GOAWAY, connections are let finish;
//! 3. forced: [`DrainWatcher::forced`] resolves too; whatever is left closes now.
//!
//! What each task does on each signal is its own business; this module only
//! tells the phases and counts who is left.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::{CancellationToken, DropGuard};

/// Where the proxy is in its shutdown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Phase {
    Running,
    Draining,
    Forced,
}

/// How a drain ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrainOutcome {
    /// Every watcher was dropped before the deadline.
    Graceful,
    /// The deadline passed with watchers still held; they were told to stop now.
    Forced,
}

/// Starts a drain. Clone it to let several sources (signal, admin) start one;
/// the first to call [`DrainTrigger::drain`] starts it, and every caller
/// waits for the same end.
///
/// Dropping every trigger without draining counts as a forced shutdown: no
/// one is left to wait for the tasks, so they are told to stop.
#[derive(Debug, Clone)]
pub struct DrainTrigger {
    phase: watch::Sender<Phase>,
    /// Cancelled when the drain is forced; the watchers' copy of it is
    /// what [`DrainWatcher::forced`] waits on.
    forced: CancellationToken,
    /// Cancels `forced` when the last clone of this trigger is dropped.
    _last: Arc<DropGuard>,
}

/// Held by every long-lived task; cheap to clone (one reference count).
///
/// The trigger waits for every clone to be dropped, so a task must not keep
/// its watcher past its own end, and the code that calls
/// [`DrainTrigger::drain`] must not hold one itself.
#[derive(Debug, Clone)]
pub struct DrainWatcher {
    phase: watch::Receiver<Phase>,
    /// A child's parent phase (see [`DrainTrigger::child`]): the watcher
    /// is as far along as the later of the two, and counts as a watcher of
    /// the parent too.
    parent: Option<watch::Receiver<Phase>>,
    /// The forced phase alone, as a token: a child's is a child token of
    /// its parent's, so one wait covers both. Every open connection waits
    /// on it for its whole life, and this wait is 5× smaller than one on
    /// the two phase channels.
    forced: CancellationToken,
}

/// A new drain pair, in the running phase.
pub fn channel() -> (DrainTrigger, DrainWatcher) {
    pair(CancellationToken::new(), None)
}

/// A trigger and its watcher; `forced` is cancelled when the trigger is
/// forced or its last clone dropped.
fn pair(
    forced: CancellationToken,
    parent: Option<watch::Receiver<Phase>>,
) -> (DrainTrigger, DrainWatcher) {
    let (phase, watcher) = watch::channel(Phase::Running);
    (
        DrainTrigger {
            phase,
            forced: forced.clone(),
            _last: Arc::new(forced.clone().drop_guard()),
        },
        DrainWatcher {
            phase: watcher,
            parent,
            forced,
        },
    )
}

impl DrainTrigger {
    /// Starts a graceful drain, waits until every watcher is dropped or
    /// `deadline` has passed, then signals the forced phase to whoever is
    /// left. Returns how it ended; once forced it does not wait further.
    pub async fn drain(&self, deadline: Duration) -> DrainOutcome {
        self.phase.send_if_modified(|phase| {
            let starting = *phase == Phase::Running;
            if starting {
                *phase = Phase::Draining;
            }
            starting
        });
        // `closed` resolves once no receiver is left, i.e. every watcher
        // (and every clone of it) has been dropped.
        let outcome = match tokio::time::timeout(deadline, self.phase.closed()).await {
            Ok(()) => DrainOutcome::Graceful,
            Err(_elapsed) => DrainOutcome::Forced,
        };
        self.phase.send_replace(Phase::Forced);
        self.forced.cancel();
        outcome
    }

    /// Whether a drain has started (or finished).
    pub fn is_draining(&self) -> bool {
        *self.phase.borrow() != Phase::Running
    }

    /// How many watchers are still held; for the admin view and for logs.
    pub fn watchers(&self) -> usize {
        self.phase.receiver_count()
    }

    /// A drain scope inside this one (one pod's tasks inside the node's):
    /// its trigger drains the child alone; a drain of this trigger reaches
    /// the child's watchers too, with this trigger's deadline, and waits for
    /// them. Holding the trigger does not hold up this drain; holding a
    /// child watcher does.
    pub fn child(&self) -> (DrainTrigger, DrainWatcher) {
        pair(self.forced.child_token(), Some(self.phase.subscribe()))
    }
}

impl DrainWatcher {
    /// Resolves once a drain has started (immediately if it already has, or
    /// if every trigger is gone).
    ///
    /// Cancel safe: the future holds no state of its own, so dropping it
    /// in a `select!` loses nothing, and the next call sees the same phase.
    pub async fn signaled(&self) {
        self.reached(Phase::Draining).await;
    }

    /// Resolves once the drain deadline has passed (or every trigger is
    /// gone): the task must stop now.
    ///
    /// Cancel safe, like [`DrainWatcher::signaled`].
    pub fn forced(&self) -> impl Future<Output = ()> + Send + '_ {
        self.forced.cancelled()
    }

    /// A token of this connection's own, cancelled when the drain is forced
    /// and cancellable by its holder alone (a policy re-check stopping one
    /// connection). Waiting on it covers both.
    pub fn stop_token(&self) -> CancellationToken {
        self.forced.child_token()
    }

    /// Whether a drain has started, without waiting.
    pub fn is_draining(&self) -> bool {
        let draining = |phase: &watch::Receiver<Phase>| *phase.borrow() != Phase::Running;
        draining(&self.phase) || self.parent.as_ref().is_some_and(draining)
    }

    async fn reached(&self, wanted: Phase) {
        // Private receivers, so `&self` is enough and concurrent waits on
        // clones do not disturb each other's "seen" marker. An error means
        // every trigger was dropped: treated as forced.
        let mut own = self.phase.clone();
        match &self.parent {
            None => {
                let _ = own.wait_for(|phase| *phase >= wanted).await;
            }
            Some(parent) => {
                let mut parent = parent.clone();
                tokio::select! {
                    _ = own.wait_for(|phase| *phase >= wanted) => {}
                    _ = parent.wait_for(|phase| *phase >= wanted) => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
