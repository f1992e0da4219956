//! The certificate cache of every identity this proxy serves, and the one
//! task that fills it: fetches queued by priority (a waiting connection, then
//! a local workload's prefetch, then background refresh), at most
//! [`MAX_CONCURRENT_FETCHES`] CA calls at once, refresh at half-life with
//! jitter, and per-identity backoff after failures while a still-valid
//! certificate keeps being served (WIRE.md §3 "Refresh and retry").
//!
//! Talking to the CA is `ca_client.rs`'s business; the timing decisions are
//! the pure functions of `schedule.rs`.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use tokio::sync::{mpsc, watch};
use tokio::task::{Id as TaskId, JoinSet};
use tokio::time::Instant;
use ztunnel_certs::cert::WorkloadCertificate;
use ztunnel_certs::error_chain::ErrorChain;
use ztunnel_certs::identity::Identity;

use crate::identity::ca_client::{CaClient, CaClientError};
use crate::identity::schedule::{self, Priority, QueuedFetch};

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

/// Why no certificate could be handed out.
#[derive(Debug, Clone, thiserror::Error)]
pub enum IdentityError {
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

/// One identity as `/config_dump` shows it: never the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificateSummary {
    /// The identity served.
    pub identity: Identity,
    /// Where its certificate stands.
    pub state: CertificateState,
    /// Validity of the cached certificate, if any.
    pub not_before: Option<SystemTime>,
    /// Expiry of the cached certificate, if any.
    pub not_after: Option<SystemTime>,
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
    /// Fetch requests for the task; unbounded but deduplicated per identity
    /// by [`Entry::want`], so it holds at most one message per priority.
    requests: mpsc::UnboundedSender<FetchRequest>,
}

struct State {
    entries: HashMap<Identity, Entry>,
    /// Set when the task ends, so waiters stop waiting.
    stopped: bool,
}

/// One identity's cache slot.
struct Entry {
    certificate: Option<Arc<WorkloadCertificate>>,
    /// The outcome of the latest fetch.
    last_error: Option<Arc<CaClientError>>,
    attempts: u32,
    /// The highest priority asked for and not yet started.
    queued: Option<Priority>,
    in_flight: bool,
    /// The next refresh or retry.
    next_fetch: Option<SystemTime>,
    /// The timer allowed to start that fetch; older timers are stale.
    timer: Option<u64>,
    /// Ticks whenever a fetch finishes; dropping it tells waiters the entry
    /// was forgotten.
    changed: watch::Sender<()>,
}

struct FetchRequest {
    identity: Identity,
    priority: Priority,
}

/// A scheduled refresh or retry.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct Timer {
    at: Instant,
    id: u64,
    identity: Identity,
    priority: Priority,
}

impl IdentityManager {
    /// Creates the manager and the task that fetches for it. Spawn the task
    /// (on the admin runtime); it runs until `shutdown` resolves (e.g.
    /// `async move { drain.signaled().await }`), then cancels fetches in
    /// flight. Cached certificates stay served after that; anything not
    /// cached fails with [`IdentityError::Stopped`].
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
        let task = run(Arc::clone(&shared), client, receiver, shutdown);
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
    ) -> Result<Arc<WorkloadCertificate>, IdentityError> {
        let deadline = Instant::now() + FETCH_WAIT_LIMIT;
        let mut changed = {
            let mut state = self.shared.lock();
            let stopped = state.stopped;
            let entry = state
                .entries
                .entry(identity.clone())
                .or_insert_with(Entry::new);
            if let Some(answer) = entry.answer(SystemTime::now(), stopped) {
                return answer;
            }
            let changed = entry.changed.subscribe();
            if entry.want(Priority::Waiting) {
                self.shared.send(identity, Priority::Waiting)?;
            }
            changed
        };
        loop {
            match tokio::time::timeout_at(deadline, changed.changed()).await {
                Err(_) => return Err(IdentityError::Timeout(identity.clone())),
                Ok(Err(_)) => return Err(IdentityError::Forgotten(identity.clone())),
                Ok(Ok(())) => {}
            }
            let state = self.shared.lock();
            let entry = state
                .entries
                .get(identity)
                .ok_or_else(|| IdentityError::Forgotten(identity.clone()))?;
            if let Some(answer) = entry.answer(SystemTime::now(), state.stopped) {
                return answer;
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
        let mut entry = Entry::new();
        if entry.want(Priority::Prefetch) && self.shared.send(&identity, Priority::Prefetch).is_ok()
        {
            state.entries.insert(identity, entry);
        }
    }

    /// Drops the identity when its last workload went away: its certificate
    /// is no longer served or refreshed, and waiters get
    /// [`IdentityError::Forgotten`].
    pub fn forget(&self, identity: &Identity) {
        self.shared.lock().entries.remove(identity);
    }

    /// Every identity with its state and validity, sorted by identity, for
    /// `/config_dump`. Keys are never part of it.
    pub fn snapshot(&self) -> Vec<CertificateSummary> {
        let state = self.shared.lock();
        let mut summaries: Vec<_> = state
            .entries
            .iter()
            .map(|(identity, entry)| entry.summary(identity))
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

    fn send(&self, identity: &Identity, priority: Priority) -> Result<(), IdentityError> {
        let request = FetchRequest {
            identity: identity.clone(),
            priority,
        };
        self.requests
            .send(request)
            .map_err(|_| IdentityError::Stopped)
    }

    /// Whether the dequeued fetch should run now: the identity is still
    /// known and this is its current request, not a stale lower one.
    fn start(&self, fetch: &QueuedFetch<Identity>) -> bool {
        let mut state = self.lock();
        let Some(entry) = state.entries.get_mut(&fetch.key) else {
            return false;
        };
        if entry.queued != Some(fetch.priority) || entry.in_flight {
            return false;
        }
        entry.queued = None;
        entry.in_flight = true;
        true
    }

    /// Records a finished fetch, wakes its waiters and returns when to fetch
    /// next (refresh after success, retry after failure).
    fn finish(
        &self,
        identity: &Identity,
        priority: Priority,
        result: Result<WorkloadCertificate, CaClientError>,
        timer_id: u64,
    ) -> Option<Timer> {
        let now = SystemTime::now();
        let mut state = self.lock();
        let entry = state.entries.get_mut(identity)?;
        entry.in_flight = false;
        let (next_fetch, next_priority) = match result {
            Ok(certificate) => {
                let leaf = certificate.leaf();
                let refresh =
                    schedule::refresh_at(leaf.not_before(), leaf.not_after(), now, rand::random());
                tracing::debug!(%identity, not_after = ?leaf.not_after(), "certificate fetched");
                entry.certificate = Some(Arc::new(certificate));
                entry.last_error = None;
                entry.attempts = 0;
                (refresh, Priority::Refresh)
            }
            Err(error) => {
                entry.attempts = entry.attempts.saturating_add(1);
                let retry = now + schedule::backoff(entry.attempts, rand::random());
                tracing::warn!(%identity, attempts = entry.attempts, error = %ErrorChain(&error), "certificate fetch failed");
                entry.last_error = Some(Arc::new(error));
                // A retry nobody is blocked on yet must not jump ahead of
                // connections that are.
                (retry, priority.min(Priority::Prefetch))
            }
        };
        entry.next_fetch = Some(next_fetch);
        entry.timer = Some(timer_id);
        entry.changed.send_replace(());
        let delay = next_fetch.duration_since(now).unwrap_or_default();
        Some(Timer {
            at: Instant::now() + delay,
            id: timer_id,
            identity: identity.clone(),
            priority: next_priority,
        })
    }

    /// A timer fired: queue its fetch if it is still the identity's current one.
    fn fire(&self, timer: &Timer) -> bool {
        let mut state = self.lock();
        let Some(entry) = state.entries.get_mut(&timer.identity) else {
            return false;
        };
        if entry.timer != Some(timer.id) {
            return false;
        }
        entry.timer = None;
        entry.want(timer.priority)
    }

    /// Marks the task gone and wakes every waiter so none waits in vain.
    fn stop(&self) {
        let mut state = self.lock();
        state.stopped = true;
        for entry in state.entries.values() {
            entry.changed.send_replace(());
        }
    }
}

impl Entry {
    fn new() -> Entry {
        Entry {
            certificate: None,
            last_error: None,
            attempts: 0,
            queued: None,
            in_flight: false,
            next_fetch: None,
            timer: None,
            changed: watch::Sender::new(()),
        }
    }

    /// What a waiter gets now, or `None` to keep waiting.
    fn answer(
        &self,
        now: SystemTime,
        stopped: bool,
    ) -> Option<Result<Arc<WorkloadCertificate>, IdentityError>> {
        if let Some(certificate) = &self.certificate
            && certificate.leaf().not_after() > now
        {
            return Some(Ok(Arc::clone(certificate)));
        }
        if let Some(error) = &self.last_error {
            return Some(Err(IdentityError::Ca(Arc::clone(error))));
        }
        stopped.then_some(Err(IdentityError::Stopped))
    }

    /// Records that a fetch at `priority` is wanted; true if the task must be
    /// told (nothing in flight, nothing queued at this priority or higher).
    fn want(&mut self, priority: Priority) -> bool {
        if self.in_flight || self.queued.is_some_and(|queued| queued >= priority) {
            return false;
        }
        self.queued = Some(priority);
        true
    }

    fn summary(&self, identity: &Identity) -> CertificateSummary {
        let state = match (&self.last_error, &self.certificate) {
            (Some(error), _) => CertificateState::Failed {
                error: ErrorChain(&**error).to_string(),
                attempts: self.attempts,
            },
            (None, Some(_)) => CertificateState::Available,
            (None, None) => CertificateState::Pending,
        };
        let leaf = self
            .certificate
            .as_ref()
            .map(|certificate| certificate.leaf());
        CertificateSummary {
            identity: identity.clone(),
            state,
            not_before: leaf.map(|leaf| leaf.not_before()),
            not_after: leaf.map(|leaf| leaf.not_after()),
            refresh_at: self.next_fetch,
        }
    }
}

/// The fetch task: takes requests into the priority queue, starts fetches
/// while fewer than [`MAX_CONCURRENT_FETCHES`] run, records results, and
/// fires refresh and retry timers. Every branch of its `select!` is cancel
/// safe (`recv`, `join_next_with_id`, `sleep_until`).
async fn run(
    shared: Arc<Shared>,
    client: impl CertificateSource,
    mut requests: mpsc::UnboundedReceiver<FetchRequest>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    tokio::pin!(shutdown);
    let mut queue = BinaryHeap::new();
    let mut timers: BinaryHeap<Reverse<Timer>> = BinaryHeap::new();
    let mut in_flight = JoinSet::new();
    let mut running: HashMap<TaskId, (Identity, Priority)> = HashMap::new();
    let mut sequence = 0u64;
    loop {
        while in_flight.len() < MAX_CONCURRENT_FETCHES
            && let Some(fetch) = queue.pop()
        {
            if !shared.start(&fetch) {
                continue;
            }
            let client = client.clone();
            let identity = fetch.key.clone();
            let handle = in_flight.spawn(async move { client.fetch(&identity).await });
            running.insert(handle.id(), (fetch.key, fetch.priority));
        }
        let next_timer = timers.peek().map(|Reverse(timer)| timer.at);
        let finished = tokio::select! {
            () = &mut shutdown => break,
            request = requests.recv() => {
                let Some(request) = request else { break };
                queue.push(QueuedFetch {
                    priority: request.priority,
                    sequence,
                    key: request.identity,
                });
                sequence += 1;
                continue;
            }
            () = tokio::time::sleep_until(next_timer.unwrap_or_else(Instant::now)),
                if next_timer.is_some() =>
            {
                let now = Instant::now();
                while timers.peek().is_some_and(|Reverse(timer)| timer.at <= now) {
                    let Some(Reverse(timer)) = timers.pop() else { break };
                    if shared.fire(&timer) {
                        queue.push(QueuedFetch {
                            priority: timer.priority,
                            sequence,
                            key: timer.identity,
                        });
                        sequence += 1;
                    }
                }
                continue;
            }
            Some(finished) = in_flight.join_next_with_id(), if !in_flight.is_empty() => finished,
        };
        let (task, result) = match finished {
            Ok((task, result)) => (task, result),
            Err(join_error) => {
                // The fetch panicked; count it as a failure so the identity
                // is retried instead of staying in flight forever.
                let error =
                    tonic::Status::internal(format!("certificate fetch aborted: {join_error}"));
                (join_error.id(), Err(CaClientError::Rpc(error)))
            }
        };
        let Some((identity, priority)) = running.remove(&task) else {
            continue;
        };
        if let Some(timer) = shared.finish(&identity, priority, result, sequence) {
            timers.push(Reverse(timer));
        }
        sequence += 1;
    }
    in_flight.abort_all();
    shared.stop();
}

#[cfg(test)]
mod tests;
