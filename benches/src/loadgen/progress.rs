//! The counters the client workers share, and the once-a-second progress
//! line on stderr that reads them. Results for programs go to stdout and
//! live in `report.rs`.

use std::error::Error;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};
use ztunnel_certs::error_chain::ErrorChain;

/// Runs at most this long print no progress: their result arrives before a
/// person would miss it, and a silent stderr is easier to read in logs.
const QUIET_UP_TO: Duration = Duration::from_secs(3);

/// How often progress is printed.
const INTERVAL: Duration = Duration::from_secs(1);

/// What the counters count, which decides how progress reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Bytes moved; shown as Gbit/s.
    Bytes,
    /// Requests answered; shown per second.
    Requests,
    /// Connections completed; shown per second.
    Connections,
    /// DNS queries answered; shown per second.
    Queries,
    /// Connections opened so far; shown as a running total.
    Opened,
}

/// Counters shared by a run's workers. Relaxed atomics: each is an
/// independent tally, read only for progress and at the end.
#[derive(Debug, Default)]
pub struct Counters {
    /// Units of work done (see [`Unit`]).
    done: AtomicU64,
    /// Failures.
    errors: AtomicU64,
    /// The first failure's message, so that a run where everything failed
    /// can say why.
    first_error: OnceLock<String>,
}

impl Counters {
    /// Adds `count` units of work done.
    pub fn add_done(&self, count: u64) {
        self.done.fetch_add(count, Ordering::Relaxed);
    }

    /// Counts one failure, keeping its message, with its causes, if it is
    /// the first.
    pub fn add_error(&self, error: &dyn Error) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        if self.first_error.get().is_none() {
            // A race between two first failures keeps one of them; either will do.
            let _ = self.first_error.set(ErrorChain(error).to_string());
        }
    }

    /// The first failure's message.
    pub fn first_error(&self) -> Option<&str> {
        self.first_error.get().map(String::as_str)
    }

    /// Work done so far.
    pub fn done(&self) -> u64 {
        self.done.load(Ordering::Relaxed)
    }

    /// Failures so far.
    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }
}

/// A running progress printer; stops when dropped.
pub struct Progress {
    /// The printing task, if progress is shown at all.
    task: Option<JoinHandle<()>>,
}

impl Progress {
    /// Starts printing `counters` once a second, unless `quiet` or the run's
    /// expected length is at most [`QUIET_UP_TO`].
    pub fn start(counters: Arc<Counters>, unit: Unit, expected: Duration, quiet: bool) -> Self {
        if quiet || expected <= QUIET_UP_TO {
            return Progress { task: None };
        }
        let task = tokio::spawn(async move {
            let start = Instant::now();
            let mut ticks = tokio::time::interval_at(start + INTERVAL, INTERVAL);
            ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
            let mut previous = counters.done();
            let mut previous_at = start;
            loop {
                let now = ticks.tick().await;
                let done = counters.done();
                let seconds = (now - previous_at).as_secs_f64();
                let delta = done.saturating_sub(previous) as f64;
                let elapsed = (now - start).as_secs_f64();
                let errors = counters.errors();
                match unit {
                    Unit::Bytes => eprintln!(
                        "[{elapsed:5.0} s] {:.2} Gbit/s, {errors} errors",
                        delta * 8.0 / seconds / 1e9
                    ),
                    Unit::Requests => eprintln!(
                        "[{elapsed:5.0} s] {:.0} requests/s, {errors} errors",
                        delta / seconds
                    ),
                    Unit::Connections => eprintln!(
                        "[{elapsed:5.0} s] {:.0} connections/s, {errors} errors",
                        delta / seconds
                    ),
                    Unit::Queries => eprintln!(
                        "[{elapsed:5.0} s] {:.0} queries/s, {errors} errors",
                        delta / seconds
                    ),
                    Unit::Opened => {
                        eprintln!("[{elapsed:5.0} s] {done} opened, {errors} errors")
                    }
                }
                previous = done;
                previous_at = now;
            }
        });
        Progress { task: Some(task) }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}
