//! The certificate cache of every identity this proxy serves, and the one
//! task that fills it: fetches queued by priority (a waiting connection, then
//! a local workload's prefetch, then background refresh), at most
//! [`MAX_CONCURRENT_FETCHES`] CA calls at once, refresh at half-life with
//! jitter, and per-identity backoff after failures while a still-valid
//! certificate keeps being served (WIRE.md §3 "Refresh and retry").
//!
//! This file and `manager/task.rs` are the async shell. What happens to each
//! identity is decided by the pure [`entry::step`] and
//! [`Entry::answer`](entry::Entry::answer): this file steps the entries for
//! callers and holds their waiters, the task steps them for dequeued
//! fetches, finished fetches and timers, and runs the CA calls and timers
//! the steps ask for. Talking to the CA is `ca_client.rs`'s business; the
//! timing arithmetic is `schedule.rs`'s.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use ztunnel_certs::cert::WorkloadCertificate;
use ztunnel_certs::error_chain::ErrorChain;
use ztunnel_certs::identity::Identity;

use crate::identity::ca_client::{CaClient, CaClientError};
use crate::identity::entry::{self, Action, Answer, Event, Validity};
use crate::identity::schedule::Priority;

mod task;

/// How many CA calls run at once (WIRE.md §3), so a node full of new
/// workloads does not flood the CA.
pub const MAX_CONCURRENT_FETCHES: usize = 8;

/// How long [`IdentityManager::fetch_certificate`] waits: longer than one CA
/// call can take (5 s connect plus 30 s request), with room for queueing.
const FETCH_WAIT_LIMIT: Duration = Duration::from_secs(45);

/// Where certificates come from: the CA client in the proxy, a fake in the
/// manager's own tests.
pub trait CertificateSource: Clone + Send + Sync + 'static {
    /// Fetches a certificate whose leaf carries exactly `identity`.
    fn fetch(
        &self,
        identity: &Identity,
    ) -> impl Future<Output = Result<WorkloadCertificate, CaClientError>> + Send;
}

impl CertificateSource for CaClient {
    fn fetch(
        &self,
        identity: &Identity,
    ) -> impl Future<Output = Result<WorkloadCertificate, CaClientError>> + Send {
        CaClient::fetch(self, identity)
    }
}

impl Validity for WorkloadCertificate {
    fn not_before(&self) -> SystemTime {
        self.leaf().not_before()
    }

    fn not_after(&self) -> SystemTime {
        self.leaf().not_after()
    }
}

/// Why no certificate could be handed out.
#[derive(Debug, Clone, thiserror::Error)]
pub enum FetchError {
    /// The latest fetch failed and no valid certificate is cached; a retry is
    /// scheduled with backoff.
    #[error("no certificate for this identity")]
    Ca(#[source] Arc<CaClientError>),
    /// The workload went away while a connection waited for its certificate.
    #[error("identity {0} was forgotten while waiting for its certificate")]
    Forgotten(Identity),
    /// No fetch finished within the wait limit.
    #[error("timed out waiting for a certificate for {0}")]
    Timeout(Identity),
    /// The manager task has stopped (shutdown); nothing new is fetched.
    #[error("the identity manager has stopped")]
    Stopped,
}

/// Where an identity's certificate stands, for `/config_dump`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CertificateState {
    /// The latest fetch succeeded.
    Available,
    /// No fetch has finished yet.
    Pending,
    /// The latest fetch failed; any certificate shown is the previous one.
    Failed {
        /// The error of the latest attempt.
        error: String,
        /// Failures in a row; sets the backoff.
        attempts: u32,
    },
}

/// One identity as `/config_dump` shows it. The certificate is shared, key
/// and all: whoever renders the summary shows only its public parts.
#[derive(Debug, Clone)]
pub struct CertificateSummary {
    /// The identity served.
    pub identity: Identity,
    /// Where its certificate stands.
    pub state: CertificateState,
    /// The cached certificate, if any: the chain and roots to show.
    pub certificate: Option<Arc<WorkloadCertificate>>,
    /// When the next refresh or retry is due, if one is scheduled.
    pub refresh_at: Option<SystemTime>,
}

/// The certificate cache; cheap to clone.
#[derive(Clone)]
pub struct IdentityManager {
    shared: Arc<Shared>,
}

/// What callers and the task share.
struct Shared {
    state: Mutex<State>,
    /// What the callers' steps leave for the task (queueing a fetch);
    /// unbounded, but [`entry::step`] queues a fetch only when its priority
    /// rises, so it holds at most one message per identity and priority.
    requests: mpsc::UnboundedSender<Request>,
}

struct State {
    entries: HashMap<Identity, Slot>,
    /// Set when the task ends, so waiters stop waiting.
    stopped: bool,
}

/// An identity's entry as the manager holds it.
type CacheEntry = entry::Entry<WorkloadCertificate, CaClientError>;

/// An event for a [`CacheEntry`].
type CacheEvent = Event<WorkloadCertificate, CaClientError>;

/// One identity's cache slot.
struct Slot {
    entry: CacheEntry,
    /// Ticks on [`Action::Wake`]; dropping it (on [`Action::Remove`]) tells
    /// waiters the entry was forgotten.
    changed: watch::Sender<()>,
}

/// An action a caller's step left for the task.
struct Request {
    identity: Identity,
    action: Action,
}

impl IdentityManager {
    /// Creates the manager and the task that fetches for it. Spawn the task
    /// (on the admin runtime); it runs until `shutdown` resolves (e.g.
    /// `async move { drain.signaled().await }`), then cancels fetches in
    /// flight. Cached certificates stay served after that; anything not
    /// cached fails with [`FetchError::Stopped`].
    pub fn new(
        client: impl CertificateSource,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> (IdentityManager, impl Future<Output = ()> + Send + 'static) {
        let (requests, receiver) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                entries: HashMap::new(),
                stopped: false,
            }),
            requests,
        });
        let task = task::run(Arc::clone(&shared), client, receiver, shutdown);
        (IdentityManager { shared }, task)
    }

    /// The certificate for `identity`: the cached one while it is valid,
    /// otherwise after a fetch at the highest priority. Waiters for the same
    /// identity share one fetch. If the latest fetch failed and nothing valid
    /// is cached, its error comes back at once; the retry is already
    /// scheduled.
    ///
    /// Cancel safe: dropping the future (a connection that gave up) leaves
    /// the fetch running for the next caller.
    pub async fn fetch_certificate(
        &self,
        identity: &Identity,
    ) -> Result<Arc<WorkloadCertificate>, FetchError> {
        let deadline = Instant::now() + FETCH_WAIT_LIMIT;
        let mut changed = {
            let mut state = self.shared.lock();
            let stopped = state.stopped;
            let now = SystemTime::now();
            let slot = state
                .entries
                .entry(identity.clone())
                .or_insert_with(Slot::new);
            if let Some(answer) = slot.entry.answer(now, stopped) {
                return answered(answer);
            }
            let changed = slot.changed.subscribe();
            let actions = state.step(identity, Event::Wanted(Priority::Waiting), now);
            self.shared.forward(identity, actions)?;
            changed
        };
        loop {
            match tokio::time::timeout_at(deadline, changed.changed()).await {
                Err(_) => return Err(FetchError::Timeout(identity.clone())),
                Ok(Err(_)) => return Err(FetchError::Forgotten(identity.clone())),
                Ok(Ok(())) => {}
            }
            let state = self.shared.lock();
            let slot = state
                .entries
                .get(identity)
                .ok_or_else(|| FetchError::Forgotten(identity.clone()))?;
            if let Some(answer) = slot.entry.answer(SystemTime::now(), state.stopped) {
                return answered(answer);
            }
        }
    }

    /// Starts fetching for a workload that arrived on this node, ahead of its
    /// first connection. Does nothing if the identity is already known.
    pub fn prefetch(&self, identity: Identity) {
        let mut state = self.shared.lock();
        if state.stopped || state.entries.contains_key(&identity) {
            return;
        }
        state.entries.insert(identity.clone(), Slot::new());
        let actions = state.step(
            &identity,
            Event::Wanted(Priority::Prefetch),
            SystemTime::now(),
        );
        if self.shared.forward(&identity, actions).is_err() {
            // The task is gone: an entry nobody will fetch for stays out.
            state.entries.remove(&identity);
        }
    }

    /// Drops the identity when its last workload went away: its certificate
    /// is no longer served or refreshed, and waiters get
    /// [`FetchError::Forgotten`].
    pub fn forget(&self, identity: &Identity) {
        let mut state = self.shared.lock();
        let actions = state.step(identity, Event::Forgotten, SystemTime::now());
        // Once the task is gone there is nothing left to tell it.
        let _ = self.shared.forward(identity, actions);
    }

    /// Every identity with its state and validity, sorted by identity, for
    /// `/config_dump`. Keys are never part of it.
    pub fn snapshot(&self) -> Vec<CertificateSummary> {
        let state = self.shared.lock();
        let mut summaries: Vec<_> = state
            .entries
            .iter()
            .map(|(identity, slot)| summary(identity, &slot.entry))
            .collect();
        summaries.sort_by(|a, b| a.identity.cmp(&b.identity));
        summaries
    }
}

impl Shared {
    /// The lock is never held across an await; a panic while holding it
    /// leaves plain data that is still consistent enough to serve from.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Hands what a caller's step left to the task.
    fn forward(&self, identity: &Identity, actions: Vec<Action>) -> Result<(), FetchError> {
        for action in actions {
            let request = Request {
                identity: identity.clone(),
                action,
            };
            self.requests
                .send(request)
                .map_err(|_| FetchError::Stopped)?;
        }
        Ok(())
    }

    /// Steps `identity`'s entry under the lock; see [`State::step`].
    fn step(&self, identity: &Identity, event: CacheEvent, now: SystemTime) -> Vec<Action> {
        self.lock().step(identity, event, now)
    }

    /// Marks the task gone and wakes every waiter so none waits in vain.
    fn stop(&self) {
        let mut state = self.lock();
        state.stopped = true;
        let now = SystemTime::now();
        let identities: Vec<Identity> = state.entries.keys().cloned().collect();
        for identity in identities {
            // The task is ending: nothing left for it can run.
            let _ = state.step(&identity, Event::Stopped, now);
        }
    }
}

impl State {
    /// Steps `identity`'s entry, if it is still known, and carries out what
    /// concerns the entry itself: waking its waiters, removing it. Returns
    /// the rest, which is the task's.
    fn step(&mut self, identity: &Identity, event: CacheEvent, now: SystemTime) -> Vec<Action> {
        let Some(slot) = self.entries.get_mut(identity) else {
            return Vec::new();
        };
        let entry = std::mem::take(&mut slot.entry);
        let (entry, actions) = entry::step(entry, event, now, rand::random());
        slot.entry = entry;
        let mut remove = false;
        let mut rest = Vec::new();
        for action in actions {
            match action {
                Action::Wake => {
                    slot.changed.send_replace(());
                }
                Action::Remove => remove = true,
                Action::Queue(_) | Action::Fetch(_) | Action::Arm { .. } => rest.push(action),
            }
        }
        if remove {
            self.entries.remove(identity);
        }
        rest
    }
}

impl Slot {
    fn new() -> Slot {
        Slot {
            entry: CacheEntry::new(),
            changed: watch::Sender::new(()),
        }
    }
}

/// What a waiter returns for an answer of its entry.
fn answered(
    answer: Answer<WorkloadCertificate, CaClientError>,
) -> Result<Arc<WorkloadCertificate>, FetchError> {
    match answer {
        Answer::Certificate(certificate) => Ok(certificate),
        Answer::Failed(error) => Err(FetchError::Ca(error)),
        Answer::Stopped => Err(FetchError::Stopped),
    }
}

/// One entry as `/config_dump` shows it.
fn summary(identity: &Identity, entry: &CacheEntry) -> CertificateSummary {
    let state = match (entry.last_error(), entry.certificate()) {
        (Some(error), _) => CertificateState::Failed {
            error: ErrorChain(&**error).to_string(),
            attempts: entry.failures(),
        },
        (None, Some(_)) => CertificateState::Available,
        (None, None) => CertificateState::Pending,
    };
    CertificateSummary {
        identity: identity.clone(),
        state,
        certificate: entry.certificate().cloned(),
        refresh_at: entry.next_fetch(),
    }
}

#[cfg(test)]
mod tests;
