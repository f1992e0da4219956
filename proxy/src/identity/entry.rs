//! One identity's certificate slot as a pure state machine (WIRE.md §3
//! "Refresh and retry"): when a fetch is asked for and at which priority,
//! what a finished fetch changes, when the refresh or the retry is due,
//! which timer still counts, and what a waiting connection gets.
//!
//! [`step`] takes an [`Entry`], an [`Event`], `now` and a random sample and
//! returns the new entry with the [`Action`]s to carry out;
//! [`Entry::answer`] says what a waiter gets. No clock, channel or lock
//! here: the manager (`manager.rs`) keeps the entries, the queue, the timers
//! and the CA calls, and does what these return. The refresh time and the
//! backoff settings are `schedule.rs`'s.

use std::sync::Arc;
use std::time::SystemTime;

use crate::identity::schedule::{self, Priority};

/// The validity of a certificate: all the state machine needs to know of it.
pub trait Validity {
    /// When the certificate starts being valid.
    fn not_before(&self) -> SystemTime;
    /// When it stops being valid.
    fn not_after(&self) -> SystemTime;
}

/// Names a refresh or retry timer. The manager hands out a new one with
/// every finished fetch, unique across entries, so that a timer armed for
/// an entry that was forgotten and created again is still told apart.
pub type TimerId = u64;

/// Where an entry's fetch stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FetchState {
    /// Nothing asked for, nothing running.
    #[default]
    Idle,
    /// A fetch at this priority waits in the manager's queue; any queued
    /// fetch of this entry at another priority is stale.
    Queued(Priority),
    /// A CA call is running.
    InFlight,
}

/// The armed refresh or retry timer of an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timer {
    /// Only the timer with this id may queue a fetch; older ones are stale.
    pub id: TimerId,
    /// The priority the fetch is queued at when it fires: a refresh, or a
    /// retry that must not jump ahead of connections that wait.
    pub priority: Priority,
}

/// One identity's slot: the certificate `C` served, the error `E` of the
/// latest fetch, and where fetching stands.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry<C, E> {
    /// The latest certificate fetched; kept through failed refreshes, and
    /// served while it is valid.
    certificate: Option<Arc<C>>,
    /// The error of the latest fetch, `None` once one succeeds.
    last_error: Option<Arc<E>>,
    /// Failed fetches in a row; sets the backoff.
    failures: u32,
    /// Keeps one fetch per identity, however many ask.
    fetch: FetchState,
    /// When the refresh or retry is due; kept after its timer fired, for
    /// `/config_dump`.
    next_fetch: Option<SystemTime>,
    /// The timer allowed to start that fetch.
    timer: Option<Timer>,
}

impl<C, E> Default for Entry<C, E> {
    fn default() -> Self {
        Entry {
            certificate: None,
            last_error: None,
            failures: 0,
            fetch: FetchState::Idle,
            next_fetch: None,
            timer: None,
        }
    }
}

impl<C, E> Entry<C, E> {
    /// An entry that has fetched nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The latest certificate fetched, valid or not.
    pub fn certificate(&self) -> Option<&Arc<C>> {
        self.certificate.as_ref()
    }

    /// The error of the latest fetch, if it failed.
    pub fn last_error(&self) -> Option<&Arc<E>> {
        self.last_error.as_ref()
    }

    /// Failed fetches in a row.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// When the next refresh or retry is (or was) due.
    pub fn next_fetch(&self) -> Option<SystemTime> {
        self.next_fetch
    }

    /// Records that a fetch at `priority` is wanted; the queue is told
    /// unless a fetch runs or one at this priority or higher is queued.
    fn want(&mut self, priority: Priority) -> Option<Action> {
        match self.fetch {
            FetchState::InFlight => None,
            FetchState::Queued(queued) if queued >= priority => None,
            FetchState::Idle | FetchState::Queued(_) => {
                self.fetch = FetchState::Queued(priority);
                Some(Action::Queue(priority))
            }
        }
    }
}

impl<C: Validity, E> Entry<C, E> {
    /// What a waiter gets at `now`, or `None` to keep waiting: a valid
    /// certificate, else the latest error, else [`Answer::Stopped`] once
    /// the manager has `stopped`.
    pub fn answer(&self, now: SystemTime, stopped: bool) -> Option<Answer<C, E>> {
        if let Some(certificate) = &self.certificate
            && certificate.not_after() > now
        {
            return Some(Answer::Certificate(Arc::clone(certificate)));
        }
        if let Some(error) = &self.last_error {
            return Some(Answer::Failed(Arc::clone(error)));
        }
        stopped.then_some(Answer::Stopped)
    }

    /// Records a finished fetch: a certificate is refreshed at half-life
    /// with jitter, a failure retried after the backoff, and either way the
    /// waiters are woken.
    fn finish(
        &mut self,
        priority: Priority,
        result: Result<C, E>,
        timer: TimerId,
        now: SystemTime,
        random: f64,
    ) -> Vec<Action> {
        if self.fetch == FetchState::InFlight {
            self.fetch = FetchState::Idle;
        }
        let (at, next_priority) = match result {
            Ok(certificate) => {
                let at = schedule::refresh_at(
                    certificate.not_before(),
                    certificate.not_after(),
                    now,
                    random,
                );
                self.certificate = Some(Arc::new(certificate));
                self.last_error = None;
                self.failures = 0;
                (at, Priority::Refresh)
            }
            Err(error) => {
                self.failures = self.failures.saturating_add(1);
                let wait = schedule::BACKOFF.wait(self.failures, random);
                self.last_error = Some(Arc::new(error));
                // A retry nobody is blocked on yet must not jump ahead of
                // connections that are. A clock so far ahead that the
                // retry time cannot be represented retries now.
                (
                    now.checked_add(wait).unwrap_or(now),
                    priority.min(Priority::Prefetch),
                )
            }
        };
        self.next_fetch = Some(at);
        self.timer = Some(Timer {
            id: timer,
            priority: next_priority,
        });
        vec![Action::Wake, Action::Arm { at, id: timer }]
    }
}

/// What happened to an entry.
#[derive(Debug)]
pub enum Event<C, E> {
    /// A fetch at this priority is wanted: a connection waits for the
    /// certificate, or a workload using the identity arrived.
    Wanted(Priority),
    /// The manager took a fetch at this priority off its queue and has a CA
    /// slot for it.
    Dequeued(Priority),
    /// A fetch started at `priority` finished.
    Fetched {
        /// The priority it was started at.
        priority: Priority,
        /// The certificate, or why there is none.
        result: Result<C, E>,
        /// The id of the refresh or retry timer this arms.
        timer: TimerId,
    },
    /// The timer with this id went off.
    TimerFired(TimerId),
    /// The identity's last workload went away.
    Forgotten,
    /// The manager stopped: nothing is fetched any more.
    Stopped,
}

/// What the manager does after a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Put a fetch at this priority in the queue.
    Queue(Priority),
    /// Call the CA for this identity now; the priority comes back in
    /// [`Event::Fetched`].
    Fetch(Priority),
    /// Arm a timer that delivers [`Event::TimerFired`] with `id` at `at`.
    Arm {
        /// When it fires.
        at: SystemTime,
        /// What it delivers.
        id: TimerId,
    },
    /// Wake the waiters; each reads its answer again with
    /// [`Entry::answer`].
    Wake,
    /// Drop the entry; its waiters learn that it was forgotten.
    Remove,
}

/// What a connection waiting for a certificate gets.
#[derive(Debug, PartialEq)]
pub enum Answer<C, E> {
    /// The cached certificate, still valid.
    Certificate(Arc<C>),
    /// The latest fetch failed and nothing valid is cached.
    Failed(Arc<E>),
    /// The manager stopped before anything could be fetched.
    Stopped,
}

/// One step of an entry: the entry after `event` at `now`, and what the
/// manager must do. `random` is a sample in `[0, 1)` for the jitter of the
/// refresh or retry time; only a finished fetch uses it.
pub fn step<C: Validity, E>(
    mut entry: Entry<C, E>,
    event: Event<C, E>,
    now: SystemTime,
    random: f64,
) -> (Entry<C, E>, Vec<Action>) {
    let actions = match event {
        Event::Wanted(priority) => entry.want(priority).into_iter().collect(),
        Event::Dequeued(priority) if entry.fetch == FetchState::Queued(priority) => {
            entry.fetch = FetchState::InFlight;
            vec![Action::Fetch(priority)]
        }
        // A lower priority whose request was overtaken, or one already
        // running.
        Event::Dequeued(_) => Vec::new(),
        Event::Fetched {
            priority,
            result,
            timer,
        } => entry.finish(priority, result, timer, now, random),
        Event::TimerFired(id) => match entry.timer {
            Some(timer) if timer.id == id => {
                entry.timer = None;
                entry.want(timer.priority).into_iter().collect()
            }
            _ => Vec::new(),
        },
        Event::Forgotten => vec![Action::Remove],
        Event::Stopped => vec![Action::Wake],
    };
    (entry, actions)
}

#[cfg(test)]
mod tests;
