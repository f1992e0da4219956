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

use std::time::Duration;

use tokio::sync::watch;

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
}

/// Held by every long-lived task; cheap to clone (one reference count).
///
/// The trigger waits for every clone to be dropped, so a task must not keep
/// its watcher past its own end, and the code that calls
/// [`DrainTrigger::drain`] must not hold one itself.
#[derive(Debug, Clone)]
pub struct DrainWatcher {
    phase: watch::Receiver<Phase>,
}

/// A new drain pair, in the running phase.
pub fn channel() -> (DrainTrigger, DrainWatcher) {
    let (phase, watcher) = watch::channel(Phase::Running);
    (DrainTrigger { phase }, DrainWatcher { phase: watcher })
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
    pub async fn forced(&self) {
        self.reached(Phase::Forced).await;
    }

    /// Whether a drain has started, without waiting.
    pub fn is_draining(&self) -> bool {
        *self.phase.borrow() != Phase::Running
    }

    async fn reached(&self, wanted: Phase) {
        // A private receiver, so `&self` is enough and concurrent waits on
        // clones do not disturb each other's "seen" marker.
        let mut phase = self.phase.clone();
        // An error means every trigger was dropped: treated as forced.
        let _ = phase.wait_for(|phase| *phase >= wanted).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEADLINE: Duration = Duration::from_secs(30);

    #[tokio::test(start_paused = true)]
    async fn graceful_when_every_watcher_is_released_before_the_deadline() {
        let (trigger, watcher) = channel();
        let task = tokio::spawn({
            let watcher = watcher.clone();
            async move {
                watcher.signaled().await;
                // Finishing its work after the signal, then releasing.
                tokio::time::sleep(Duration::from_secs(1)).await;
                drop(watcher);
            }
        });
        drop(watcher);
        assert_eq!(trigger.drain(DEADLINE).await, DrainOutcome::Graceful);
        task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn forced_after_the_deadline_when_a_watcher_is_still_held() {
        let (trigger, watcher) = channel();
        let start = tokio::time::Instant::now();
        let task = tokio::spawn(async move {
            watcher.signaled().await;
            // Ignores the graceful signal and only stops when forced.
            watcher.forced().await;
            tokio::time::Instant::now()
        });
        assert_eq!(trigger.drain(DEADLINE).await, DrainOutcome::Forced);
        let forced_at = task.await.unwrap();
        assert!(forced_at >= start + DEADLINE);
    }

    #[tokio::test(start_paused = true)]
    async fn forced_does_not_resolve_during_the_graceful_phase() {
        let (trigger, watcher) = channel();
        let drain = tokio::spawn(async move { trigger.drain(DEADLINE).await });
        watcher.signaled().await;
        assert!(watcher.is_draining());
        tokio::select! {
            () = watcher.forced() => panic!("forced before the deadline"),
            () = tokio::time::sleep(DEADLINE / 2) => {}
        }
        watcher.forced().await;
        assert_eq!(drain.await.unwrap(), DrainOutcome::Forced);
    }

    #[tokio::test]
    async fn signaled_resolves_for_watchers_cloned_after_the_drain_started() {
        let (trigger, watcher) = channel();
        let holder = watcher.clone();
        drop(watcher);
        let drain = tokio::spawn({
            let trigger = trigger.clone();
            async move { trigger.drain(DEADLINE).await }
        });
        holder.signaled().await;
        let late = holder.clone();
        late.signaled().await;
        assert!(trigger.is_draining());
        assert_eq!(trigger.watchers(), 2);
        drop((holder, late));
        assert_eq!(drain.await.unwrap(), DrainOutcome::Graceful);
    }

    #[tokio::test]
    async fn dropping_every_trigger_forces_the_watchers() {
        let (trigger, watcher) = channel();
        drop(trigger);
        watcher.signaled().await;
        watcher.forced().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_second_drain_waits_for_the_same_end() {
        let (trigger, watcher) = channel();
        let first = tokio::spawn({
            let trigger = trigger.clone();
            async move { trigger.drain(DEADLINE).await }
        });
        watcher.signaled().await;
        let second = tokio::spawn({
            let trigger = trigger.clone();
            async move { trigger.drain(DEADLINE).await }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        drop(watcher);
        assert_eq!(first.await.unwrap(), DrainOutcome::Graceful);
        assert_eq!(second.await.unwrap(), DrainOutcome::Graceful);
    }
}
