//! The state every task reads, behind one lock, with the change counters
//! that tell watchers something changed: any change (certificate
//! prefetch), or a change to what authorization depends on (the policy
//! re-check of open connections). The local file (`discovery.rs`) and delta
//! xDS (`xds.rs`) both write through it.

use std::sync::{Arc, RwLock, RwLockReadGuard};
use std::time::Duration;

use tokio::sync::watch;

use super::State;

/// The state every task reads, plus change counters.
#[derive(Clone)]
pub struct SharedState {
    state: Arc<RwLock<State>>,
    /// Ticks on every change.
    version: watch::Sender<u64>,
    /// Ticks when policies or workloads changed, the inputs of authorization,
    /// so that a service-only update does not re-check every connection.
    authorization: watch::Sender<u64>,
}

impl SharedState {
    /// Wraps an initial state.
    pub fn new(state: State) -> Self {
        SharedState {
            state: Arc::new(RwLock::new(state)),
            version: watch::Sender::new(0),
            authorization: watch::Sender::new(0),
        }
    }

    /// A read view. Hold it briefly: writers wait for it.
    pub fn read(&self) -> RwLockReadGuard<'_, State> {
        // A panic while writing leaves the state as it was before the write
        // started or after it ended; reading it stays sound.
        self.state
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Changes the state and tells every watcher, the policy re-check
    /// included.
    pub fn update(&self, change: impl FnOnce(&mut State)) {
        self.apply(change, true);
    }

    /// Changes the state and tells watchers; the policy re-check only when
    /// `authorization_changed`. Returns what `change` returns.
    pub fn apply<R>(&self, change: impl FnOnce(&mut State) -> R, authorization_changed: bool) -> R {
        let result = {
            let mut state = self
                .state
                .write()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            change(&mut state)
        };
        self.version.send_modify(|version| *version += 1);
        if authorization_changed {
            self.authorization.send_modify(|version| *version += 1);
        }
        result
    }

    /// A receiver that sees every change after this call.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }

    /// A receiver that sees every change to policies or workloads after
    /// this call.
    pub fn subscribe_authorization(&self) -> watch::Receiver<u64> {
        self.authorization.subscribe()
    }

    /// What `find` finds in the state, looked for again after each change
    /// for at most `wait`: `None` after the wait, or once the state's
    /// sender is gone (shutting down).
    pub async fn first_within<T>(
        &self,
        wait: Duration,
        find: impl Fn(&State) -> Option<T>,
    ) -> Option<T> {
        // Subscribed before looking, so a change in between is seen.
        let mut changes = self.subscribe();
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if let Some(found) = find(&self.read()) {
                return Some(found);
            }
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => return None,
            }
        }
    }
}
