//! `soak`: traffic a rollout must not disturb, counted. Long-lived
//! connections each send a small message every [`EXCHANGE_INTERVAL`] and
//! check its echo, and are replaced when they break; new short connections
//! (connect, one message and its echo, close) open at a steady rate. Every
//! second the counts so far go to stdout as one JSON line, and when the
//! run ends (`--duration`, SIGTERM or SIGINT) the caller prints them once
//! more as the result. Each failure is also listed with its time, the step
//! of the connection it came in (name lookup, connect, exchange) and its
//! error, and every name lookup is timed, so that a reader tells a lost DNS
//! query from a refused connect.
//!
//! The counts and how they change are `soak/counts.rs`; which kind a
//! failure is, `soak/failure.rs`. This file only moves bytes and keeps time.

use std::io;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};

use super::cli::{Destination, Host, SoakArgs};
use super::dial;
use super::limits::{LimitError, OpenFiles};
use super::progress::Counters;
use super::protocol::{Exchange, Header};
use super::report::{self, Event};
use super::shutdown::StopSignals;
use ztunnel_certs::error_chain::ErrorChain;

mod counts;
mod failure;

pub use counts::{
    Attempt, Break, FailureCounts, FailureKind, LATE_RESOLVE, ListedFailure, LongLived,
    MAX_BREAKS_LISTED, MAX_FAILURES_LISTED, NewConnections, Resolves, SoakReport, Step,
};

use failure::Failure;

/// The size of every message. 32 bytes fit in any segment, so a message
/// never waits on a window, and leave room for the sequence number that
/// tells one answer from another.
const MESSAGE_LEN: usize = 32;

/// [`MESSAGE_LEN`] as the header states it (1 + 31, since a constant
/// cannot unwrap).
const MESSAGE_SIZE: NonZeroU32 = NonZeroU32::MIN.saturating_add(MESSAGE_LEN as u32 - 1);

/// The pause between two messages on a long-lived connection: a break is
/// seen within 0.2 s of happening, while a hundred connections cost only
/// 500 small round trips a second.
const EXCHANGE_INTERVAL: Duration = Duration::from_millis(200);

/// The pause after a long-lived connection broke or failed to open, before
/// the next attempt: a replacement comes almost at once, and a server that
/// is down costs ten attempts a second per connection, not a busy loop.
const REOPEN_BACKOFF: Duration = Duration::from_millis(100);

/// Short connections in progress at once. At the default rate a handful are;
/// when the server stops answering, each waits out `--timeout`, and the cap
/// then holds the sockets, and the load on a struggling path, to this many.
const MAX_IN_FLIGHT: usize = 256;

/// How often the counts are printed.
const REPORT_INTERVAL: Duration = Duration::from_secs(1);

/// The header of a long-lived connection: messages echoed until it closes.
const LONG_LIVED: Header = Header::Echo(Exchange {
    request: MESSAGE_SIZE,
    response: MESSAGE_SIZE,
    close_after_response: false,
});

/// The header of a short connection: the server closes after its answer,
/// so the TIME_WAIT of thousands of them stays on its side, as in `connect`.
const SHORT: Header = Header::Echo(Exchange {
    request: MESSAGE_SIZE,
    response: MESSAGE_SIZE,
    close_after_response: true,
});

/// Why the soak run could not go on.
#[derive(Debug, thiserror::Error)]
pub enum SoakError {
    /// The connections asked for do not fit under the open-file limit.
    #[error(transparent)]
    Limit(#[from] LimitError),
    /// The SIGTERM/SIGINT handlers could not be installed.
    #[error("installing signal handlers")]
    Signals(#[source] io::Error),
    /// A line of counts could not be written to stdout.
    #[error("writing to stdout")]
    Output(#[source] io::Error),
}

/// What every task of one run shares.
struct Run {
    /// The server, resolved again for every connection.
    destination: Destination,
    /// The most that opening a connection, or one answer, may take.
    timeout: Duration,
    /// When the run started: breaks and lines are timed from here.
    start: Instant,
    /// When the run ends unless a signal ends it first.
    deadline: Instant,
    /// The counts. A plain lock: it is held for a few additions, never
    /// across an await, and taken a few hundred times a second at most.
    counts: Mutex<SoakReport>,
    /// Keeps the first failure's message for stderr.
    counters: Arc<Counters>,
}

impl Run {
    /// Applies `change` to the counts.
    fn count(&self, change: impl FnOnce(&mut SoakReport)) {
        // A panic while the lock was held cannot leave the counts half
        // changed: every change is a few additions.
        change(&mut self.counts.lock().unwrap_or_else(PoisonError::into_inner));
    }

    /// Counts `failure` of `attempt` with `change`, lists it with the step
    /// `trace` reached, and keeps its message if it is the first.
    fn count_failure(
        &self,
        failure: &Failure,
        attempt: Attempt,
        trace: &Trace,
        change: impl FnOnce(&mut SoakReport, FailureKind),
    ) {
        self.counters.add_error(failure);
        let listed = ListedFailure {
            at_s: counts::seconds(self.start.elapsed()),
            attempt,
            kind: failure.kind(),
            step: failure.step(trace.step),
            resolve_s: trace.resolve.map(counts::seconds),
            error: ErrorChain(failure).to_string(),
        };
        self.count(|counts| {
            change(counts, listed.kind);
            counts.list(listed);
        });
    }

    /// The counts as of now.
    fn snapshot(&self) -> SoakReport {
        let counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        counts.at(self.start.elapsed())
    }

    /// Runs `step` within `--timeout`.
    async fn within_timeout<T>(
        &self,
        step: impl Future<Output = Result<T, Failure>>,
    ) -> Result<T, Failure> {
        tokio::time::timeout(self.timeout, step)
            .await
            .unwrap_or(Err(Failure::Timeout(self.timeout)))
    }
}

/// Runs `soak`, printing the counts every second, and returns them as they
/// stand at the end.
pub async fn run(args: &SoakArgs, counters: &Arc<Counters>) -> Result<SoakReport, SoakError> {
    // Where /proc does not say, the connects themselves will fail and count.
    if let Ok(Some(limits)) = OpenFiles::current() {
        limits.check(u64::from(args.connections).saturating_add(MAX_IN_FLIGHT as u64))?;
    }
    let mut stop = StopSignals::install().map_err(SoakError::Signals)?;
    let start = Instant::now();
    let run = Arc::new(Run {
        destination: args.target.clone(),
        timeout: args.timeout,
        start,
        deadline: start + args.duration,
        counts: Mutex::new(SoakReport::new(args.connections, SystemTime::now())),
        counters: Arc::clone(counters),
    });
    let mut tasks = JoinSet::new();
    for _ in 0..args.connections {
        tasks.spawn(keep_long_lived(Arc::clone(&run)));
    }
    if args.rate > 0.0 {
        tasks.spawn(open_short(Arc::clone(&run), args.rate, args.duration));
    }

    let mut lines = tokio::time::interval_at(start + REPORT_INTERVAL, REPORT_INTERVAL);
    lines.set_missed_tick_behavior(MissedTickBehavior::Delay);
    // Ends at the deadline at the latest. Every branch is cancel safe: the
    // sleep is rebuilt from the fixed deadline, the signal stream keeps
    // undelivered signals, and a missed tick is only delayed.
    loop {
        tokio::select! {
            () = tokio::time::sleep_until(run.deadline) => break,
            () = stop.recv() => break,
            _ = lines.tick() => {
                report::print(&Event::Soak(Box::new(run.snapshot()))).map_err(SoakError::Output)?;
            }
        }
    }
    // What is in flight at the end is neither a success nor a failure: the
    // tasks are dropped where they stand, closing their connections.
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    Ok(run.snapshot())
}

/// Keeps one long-lived connection open for the run: opens it, talks on it
/// until it breaks, then opens a replacement. Every pass waits
/// [`REOPEN_BACKOFF`] and none starts after the deadline, so there are at
/// most duration / backoff passes; the run also aborts the task at its end.
async fn keep_long_lived(run: Arc<Run>) {
    let mut replacing = false;
    let mut sequence = 0u64;
    while Instant::now() < run.deadline {
        sequence += 1;
        let mut trace = Trace::default();
        let opened = run
            .within_timeout(open_long_lived(&run, sequence, &mut trace))
            .await;
        match opened {
            Ok(mut stream) => {
                run.count(|counts| counts.opened(replacing));
                if let Some(failure) = converse(&run, &mut stream, &mut sequence).await {
                    let at = run.start.elapsed();
                    run.count_failure(&failure, Attempt::Break, &trace, |counts, kind| {
                        counts.broke(at, kind)
                    });
                    replacing = true;
                }
            }
            Err(failure) => {
                run.count_failure(&failure, Attempt::Open, &trace, SoakReport::open_failed)
            }
        }
        tokio::time::sleep(REOPEN_BACKOFF).await;
    }
}

/// How far one connection got: what a failure, and above all a timeout,
/// is listed with.
#[derive(Debug, Default)]
struct Trace {
    /// The step in progress.
    step: Step,
    /// How long the name lookup took, once it ended.
    resolve: Option<Duration>,
}

/// Resolves the destination, connects and writes `header`, recording in
/// `trace` each step as it starts and how long the lookup took (counted
/// in the run's resolves). A failed header write is an exchange failure
/// by its kind (`Failure::step`).
async fn open_traced(run: &Run, header: Header, trace: &mut Trace) -> Result<TcpStream, Failure> {
    trace.step = Step::Resolve;
    let started = Instant::now();
    let target = dial::resolve(&run.destination).await?;
    if matches!(run.destination.host, Host::Name(_)) {
        let took = started.elapsed();
        trace.resolve = Some(took);
        run.count(|counts| counts.resolved(took));
    }
    trace.step = Step::Connect;
    let stream = dial::open(target, header).await?;
    trace.step = Step::Exchange;
    Ok(stream)
}

/// Opens a long-lived connection and proves it with a first message, so
/// an open connection is known to reach the server through any proxies,
/// not just the nearest listener.
async fn open_long_lived(
    run: &Run,
    sequence: u64,
    trace: &mut Trace,
) -> Result<TcpStream, Failure> {
    let mut stream = open_traced(run, LONG_LIVED, trace).await?;
    round_trip(&mut stream, sequence).await?;
    Ok(stream)
}

/// Sends a message every [`EXCHANGE_INTERVAL`] until one fails, which it
/// returns, or the deadline passes: at most duration / interval messages.
async fn converse(run: &Run, stream: &mut TcpStream, sequence: &mut u64) -> Option<Failure> {
    let mut ticks = tokio::time::interval_at(Instant::now() + EXCHANGE_INTERVAL, EXCHANGE_INTERVAL);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    while ticks.tick().await < run.deadline {
        *sequence += 1;
        match run.within_timeout(round_trip(stream, *sequence)).await {
            Ok(()) => run.count(SoakReport::exchanged),
            Err(failure) => return Some(failure),
        }
    }
    None
}

/// Opens short connections at `rate` a second until the deadline: at most
/// rate × duration + 1 of them, and at most [`MAX_IN_FLIGHT`] at once (the
/// pace slows rather than bursts when they pile up). Each counts itself.
async fn open_short(run: Arc<Run>, rate: f64, duration: Duration) {
    // The parsed rate is at most 1e9 a second, so the interval is at least
    // a nanosecond; the floor only keeps `interval` from a zero period.
    let period = Duration::try_from_secs_f64(1.0 / rate)
        .unwrap_or(Duration::MAX)
        .max(Duration::from_nanos(1));
    let attempts = ((rate * duration.as_secs_f64()).ceil() as u64).saturating_add(1);
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut in_flight = JoinSet::new();
    for sequence in 0..attempts {
        if ticks.tick().await >= run.deadline {
            break;
        }
        while in_flight.try_join_next().is_some() {}
        if in_flight.len() >= MAX_IN_FLIGHT {
            in_flight.join_next().await;
        }
        let run = Arc::clone(&run);
        in_flight.spawn(async move {
            let mut trace = Trace::default();
            let outcome = run
                .within_timeout(short_connection(&run, sequence, &mut trace))
                .await;
            match outcome {
                Ok(()) => run.count(|counts| counts.new_connection(Ok(()))),
                Err(failure) => {
                    run.count_failure(&failure, Attempt::New, &trace, |counts, kind| {
                        counts.new_connection(Err(kind))
                    })
                }
            }
        });
    }
    // Each one left ends within --timeout; the run aborts them at its end.
    while in_flight.join_next().await.is_some() {}
}

/// One short connection: a message, its echo, and the server's close.
async fn short_connection(run: &Run, sequence: u64, trace: &mut Trace) -> Result<(), Failure> {
    let mut stream = open_traced(run, SHORT, trace).await?;
    round_trip(&mut stream, sequence).await?;
    let mut byte = [0u8; 1];
    match stream.read(&mut byte).await.map_err(Failure::Exchange)? {
        0 => Ok(()),
        _ => Err(Failure::Wrong),
    }
}

/// Sends message number `sequence` and checks that its echo comes back.
async fn round_trip(stream: &mut TcpStream, sequence: u64) -> Result<(), Failure> {
    let request = message(sequence);
    stream
        .write_all(&request)
        .await
        .map_err(Failure::Exchange)?;
    let mut answer = [0u8; MESSAGE_LEN];
    stream
        .read_exact(&mut answer)
        .await
        .map_err(Failure::Exchange)?;
    if answer == request {
        Ok(())
    } else {
        Err(Failure::Wrong)
    }
}

/// Message number `sequence`: the number, big-endian, over and over, so an
/// answer to another message, or a shifted one, does not match.
fn message(sequence: u64) -> [u8; MESSAGE_LEN] {
    let mut message = [0u8; MESSAGE_LEN];
    for chunk in message.chunks_exact_mut(8) {
        chunk.copy_from_slice(&sequence.to_be_bytes());
    }
    message
}
