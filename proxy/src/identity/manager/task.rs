//! The identity manager's one task: the priority queue of fetches, at most
//! [`MAX_CONCURRENT_FETCHES`] CA calls at once, and the refresh and retry
//! timers. It steps the entries for what happens here (a fetch dequeued or
//! finished, a timer due) and carries out what the steps and the callers'
//! steps ask of it. The cache and its callers are `manager.rs`'s.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::time::SystemTime;

use tokio::sync::mpsc;
use tokio::task::{Id as TaskId, JoinError, JoinSet};
use tokio::time::Instant;
use ztunnel_certs::cert::WorkloadCertificate;
use ztunnel_certs::error_chain::ErrorChain;
use ztunnel_certs::identity::Identity;

use crate::identity::ca_client::CaClientError;
use crate::identity::entry::{self, Action, Event, Validity};
use crate::identity::schedule::{Priority, QueuedFetch};

use super::{CertificateSource, MAX_CONCURRENT_FETCHES, Request, Shared};

/// An armed refresh or retry timer.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct Timer {
    at: Instant,
    id: entry::TimerId,
    identity: Identity,
}

/// The fetch task's own state: the queue, the timers and the CA calls.
struct Task<S> {
    shared: Arc<Shared>,
    client: S,
    queue: BinaryHeap<QueuedFetch<Identity>>,
    timers: BinaryHeap<Reverse<Timer>>,
    in_flight: JoinSet<Result<WorkloadCertificate, CaClientError>>,
    /// The identity and priority of each running fetch.
    running: HashMap<TaskId, (Identity, Priority)>,
    /// Orders the queue among equal priorities and names the timers.
    sequence: u64,
}

impl<S: CertificateSource> Task<S> {
    /// Starts queued fetches while CA slots are free.
    fn start_fetches(&mut self) {
        while self.in_flight.len() < MAX_CONCURRENT_FETCHES
            && let Some(fetch) = self.queue.pop()
        {
            let now = SystemTime::now();
            let actions = self
                .shared
                .step(&fetch.key, Event::Dequeued(fetch.priority), now);
            self.carry_out_all(&fetch.key, actions, now);
        }
    }

    /// Steps the entries whose timers are due.
    fn fire_timers(&mut self) {
        let due = Instant::now();
        while self
            .timers
            .peek()
            .is_some_and(|Reverse(timer)| timer.at <= due)
        {
            let Some(Reverse(timer)) = self.timers.pop() else {
                break;
            };
            let now = SystemTime::now();
            let actions = self
                .shared
                .step(&timer.identity, Event::TimerFired(timer.id), now);
            self.carry_out_all(&timer.identity, actions, now);
        }
    }

    /// Steps the entry of a fetch that finished.
    fn finish(
        &mut self,
        finished: Result<(TaskId, Result<WorkloadCertificate, CaClientError>), JoinError>,
    ) {
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
        let Some((identity, priority)) = self.running.remove(&task) else {
            return;
        };
        let timer = self.next_sequence();
        let fetched = result.is_ok();
        let event = Event::Fetched {
            priority,
            result,
            timer,
        };
        let now = SystemTime::now();
        let mut state = self.shared.lock();
        let actions = state.step(&identity, event, now);
        if let Some(entry) = state.entries.get(&identity).map(|slot| &slot.entry) {
            if fetched && let Some(certificate) = entry.certificate() {
                tracing::debug!(%identity, not_after = ?certificate.not_after(), "certificate fetched");
            } else if let Some(error) = entry.last_error() {
                tracing::warn!(%identity, attempts = entry.failures(), error = %ErrorChain(&**error), "certificate fetch failed");
            }
        }
        drop(state);
        self.carry_out_all(&identity, actions, now);
    }

    fn carry_out_all(&mut self, identity: &Identity, actions: Vec<Action>, now: SystemTime) {
        for action in actions {
            self.carry_out(identity.clone(), action, now);
        }
    }

    /// Does what a step asked of the task; `now` is the time the step saw.
    fn carry_out(&mut self, identity: Identity, action: Action, now: SystemTime) {
        match action {
            Action::Queue(priority) => {
                let sequence = self.next_sequence();
                self.queue.push(QueuedFetch {
                    priority,
                    sequence,
                    key: identity,
                });
            }
            Action::Fetch(priority) => {
                let client = self.client.clone();
                let fetched = identity.clone();
                let handle = self
                    .in_flight
                    .spawn(async move { client.fetch(&fetched).await });
                self.running.insert(handle.id(), (identity, priority));
            }
            Action::Arm { at, id } => {
                let delay = at.duration_since(now).unwrap_or_default();
                self.timers.push(Reverse(Timer {
                    at: Instant::now() + delay,
                    id,
                    identity,
                }));
            }
            // Carried out under the lock by `State::step`, which holds the
            // waiters' channel and the map.
            Action::Wake | Action::Remove => {}
        }
    }

    fn next_sequence(&mut self) -> u64 {
        let sequence = self.sequence;
        self.sequence += 1;
        sequence
    }
}

/// The fetch task: takes requests into the priority queue, starts fetches
/// while fewer than [`MAX_CONCURRENT_FETCHES`] run, records results, and
/// fires refresh and retry timers. Every branch of its `select!` is cancel
/// safe (`recv`, `join_next_with_id`, `sleep_until`).
pub(super) async fn run(
    shared: Arc<Shared>,
    client: impl CertificateSource,
    mut requests: mpsc::UnboundedReceiver<Request>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    tokio::pin!(shutdown);
    let mut task = Task {
        shared,
        client,
        queue: BinaryHeap::new(),
        timers: BinaryHeap::new(),
        in_flight: JoinSet::new(),
        running: HashMap::new(),
        sequence: 0,
    };
    loop {
        task.start_fetches();
        let next_timer = task.timers.peek().map(|Reverse(timer)| timer.at);
        tokio::select! {
            () = &mut shutdown => break,
            request = requests.recv() => {
                let Some(Request { identity, action }) = request else { break };
                task.carry_out(identity, action, SystemTime::now());
            }
            () = tokio::time::sleep_until(next_timer.unwrap_or_else(Instant::now)),
                if next_timer.is_some() => task.fire_timers(),
            Some(finished) = task.in_flight.join_next_with_id(), if !task.in_flight.is_empty() => {
                task.finish(finished);
            }
        }
    }
    task.in_flight.abort_all();
    task.shared.stop();
}
