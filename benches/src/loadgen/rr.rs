//! `rr`: fixed-size requests and responses over C connections, each with one
//! request in flight, either closed loop or at a fixed total rate, with a
//! latency histogram. The pacing rule is the pure [`Schedule`]; the workers
//! only move bytes and read the clock.

use std::io;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::cli::RrArgs;
use super::dial::{self, RETRY_BACKOFF};
use super::latency::{LatencyError, Recorder};
use super::progress::{Counters, Progress, Unit};
use super::protocol::{self, Exchange, Header};
use super::report::{self, RrReport};

/// The largest request or response buffer. Longer messages are sent and
/// read in pieces of this size; 256 KiB keeps the per-call cost negligible
/// without a buffer as large as a multi-megabyte message.
const MESSAGE_BUFFER_MAX: usize = 256 * 1024;

/// Tokio's timers fire on a 1 ms tick. Below this interval per connection a
/// paced sender wakes late for most requests and sends them in bursts; the
/// latencies stay right (see [`Schedule`]) but the load is less even.
const TIMER_RESOLUTION: Duration = Duration::from_millis(1);

/// The longest interval or stagger a schedule uses: a day is longer than
/// any run, so a slower pace changes nothing, and the cap keeps the
/// schedule's time arithmetic far from overflow.
const PACING_MAX: Duration = Duration::from_secs(86_400);

/// Intended send times for one paced connection, and the latency each
/// request is charged.
///
/// Latency at a fixed rate must not hide stalls behind the requests they
/// held back (coordinated omission): a request whose slot passed while the
/// previous response was outstanding has waited since its slot, as it would
/// on a client with a fixed schedule. But this sender's own timer wakes up to
/// a 1 ms tick late, and that lateness is ours, not the system's. So the
/// latency is taken from an ideal sender that sends exactly at each slot, or
/// at once when the previous response is late: it sends at
/// `max(slot, ideal end of the previous request)`, each request takes the
/// response time actually measured, and the latency is the ideal end minus
/// the slot.
#[derive(Debug, Clone, Copy)]
pub struct Schedule {
    /// The next intended send time.
    next: Instant,
    /// Time between this connection's sends.
    interval: Duration,
    /// When the ideal sender's previous request finished.
    ideal_done: Option<Instant>,
}

impl Schedule {
    /// Sends at `first`, then every `interval`.
    pub fn new(first: Instant, interval: Duration) -> Self {
        Schedule {
            next: first,
            interval,
            ideal_done: None,
        }
    }

    /// When the next request is meant to go.
    pub fn intended(&self) -> Instant {
        self.next
    }

    /// Records that the request meant for [`Self::intended`] was sent at
    /// `sent` and answered at `done`, moves on to the next slot, and returns
    /// the latency to record for it.
    pub fn complete(&mut self, sent: Instant, done: Instant) -> Duration {
        let slot = self.next;
        let ideal_send = self.ideal_done.map_or(slot, |previous| previous.max(slot));
        let ideal_done = ideal_send + done.saturating_duration_since(sent);
        self.ideal_done = Some(ideal_done);
        self.next += self.interval;
        ideal_done - slot
    }

    /// Skips the slots missed while the connection was down, keeping the
    /// phase: reconnecting after a failure is counted as an error, not as
    /// latency of the requests that could not be sent.
    pub fn resume(&mut self, now: Instant) {
        self.ideal_done = None;
        if now <= self.next || self.interval.is_zero() {
            return;
        }
        let behind = (now - self.next).as_nanos();
        let slots = behind.div_ceil(self.interval.as_nanos());
        let skip = self.interval.as_nanos().saturating_mul(slots);
        self.next += Duration::from_nanos(u64::try_from(skip).unwrap_or(u64::MAX));
    }
}

/// What every worker of one run shares.
struct Run {
    /// The server.
    target: SocketAddr,
    /// Request and response sizes.
    exchange: Exchange,
    /// When the run started; paced schedules count from here.
    start: Instant,
    /// Where the run stops.
    deadline: Instant,
    /// Time between one connection's sends, when paced.
    interval: Option<Duration>,
    /// Time between the first sends of consecutive connections, so that
    /// paced connections spread over the interval instead of sending together.
    stagger: Duration,
    /// Requests claimed so far, for `--max-requests`.
    claimed: AtomicU64,
    /// The most requests to send in total.
    max_requests: u64,
    /// Requests answered and failures.
    counters: Arc<Counters>,
}

/// Runs `rr` and reports the requests answered and their latency.
pub async fn run(
    args: &RrArgs,
    quiet: bool,
    counters: &Arc<Counters>,
) -> Result<RrReport, LatencyError> {
    let exchange = Exchange {
        request: args.size,
        response: args.response_size.unwrap_or(args.size),
        close_after_response: false,
    };
    let recorder = Recorder::new()?;
    let (interval, stagger) = pacing(args.rate, args.connections);
    if interval.is_some_and(|interval| interval < TIMER_RESOLUTION) {
        eprintln!(
            "ztunnel-loadgen rr: {:.0} requests/s per connection is finer than the 1 ms \
             timer, so requests go out in bursts; use more connections for an even load",
            args.rate / f64::from(args.connections)
        );
    }
    let streams = dial::open_many(
        args.target,
        Header::Echo(exchange),
        args.connections,
        counters,
    )
    .await;
    let start = Instant::now();
    let run = Arc::new(Run {
        target: args.target,
        exchange,
        start,
        deadline: start + args.duration,
        interval,
        stagger,
        claimed: AtomicU64::new(0),
        max_requests: args.max_requests.unwrap_or(u64::MAX),
        counters: Arc::clone(counters),
    });
    let progress = Progress::start(Arc::clone(counters), Unit::Requests, args.duration, quiet);
    let mut workers = JoinSet::new();
    for (index, stream) in (0u32..).zip(streams) {
        workers.spawn(worker(stream, index, Arc::clone(&run), recorder.clone()));
    }
    let mut total = recorder;
    while let Some(finished) = workers.join_next().await {
        match finished {
            Ok(recorded) => total.merge(&recorded)?,
            Err(join) => counters.add_error(&join),
        }
    }
    let duration_s = start.elapsed().as_secs_f64();
    drop(progress);

    Ok(RrReport {
        connections: u64::from(args.connections),
        duration_s,
        requests: total.count(),
        requests_per_s: report::per_second(total.count(), duration_s),
        errors: counters.errors(),
        latency_us: total.summary(),
    })
}

/// The interval between one connection's sends and the stagger between
/// connections, for a total `rate` (0: closed loop, no interval).
fn pacing(rate: f64, connections: u32) -> (Option<Duration>, Duration) {
    if rate <= 0.0 {
        return (None, Duration::ZERO);
    }
    let seconds =
        |value: f64| Duration::try_from_secs_f64(value).map_or(PACING_MAX, |d| d.min(PACING_MAX));
    (
        Some(seconds(f64::from(connections) / rate)),
        seconds(1.0 / rate),
    )
}

/// One connection's share: requests until the deadline or the request
/// limit, reconnecting after a failure. Returns its latency samples.
async fn worker(
    mut stream: Option<TcpStream>,
    index: u32,
    run: Arc<Run>,
    mut recorder: Recorder,
) -> Recorder {
    let header = Header::Echo(run.exchange);
    let buffer_len = |size: NonZeroU32| (size.get() as usize).min(MESSAGE_BUFFER_MAX);
    let request = vec![0u8; buffer_len(run.exchange.request)];
    let mut response = vec![0u8; buffer_len(run.exchange.response)];
    let first_send = run
        .stagger
        .checked_mul(index)
        .and_then(|offset| run.start.checked_add(offset))
        .unwrap_or(run.deadline);
    let mut schedule = run
        .interval
        .map(|interval| Schedule::new(first_send, interval));
    // Cancelling at the deadline drops at most the request in flight, which
    // did not complete within the run and so is rightly not counted.
    let _ = tokio::time::timeout_at(run.deadline, async {
        loop {
            let mut connection = match stream.take() {
                Some(connection) => connection,
                None => match dial::open(run.target, header).await {
                    Ok(connection) => {
                        if let Some(schedule) = &mut schedule {
                            schedule.resume(Instant::now());
                        }
                        connection
                    }
                    Err(err) => {
                        run.counters.add_error(&err);
                        tokio::time::sleep(RETRY_BACKOFF).await;
                        continue;
                    }
                },
            };
            let exchanged = exchange(
                &mut connection,
                &run,
                &request,
                &mut response,
                schedule.as_mut(),
                &mut recorder,
            );
            match exchanged.await {
                Ok(()) => return,
                Err(err) => {
                    run.counters.add_error(&err);
                    tokio::time::sleep(RETRY_BACKOFF).await;
                }
            }
        }
    })
    .await;
    recorder
}

/// Sends requests and reads responses until the request limit (`Ok`) or a
/// failure. The server never closes first, so an EOF is a failure.
async fn exchange(
    connection: &mut TcpStream,
    run: &Run,
    request: &[u8],
    response: &mut [u8],
    mut schedule: Option<&mut Schedule>,
    recorder: &mut Recorder,
) -> io::Result<()> {
    loop {
        if run.claimed.fetch_add(1, Ordering::Relaxed) >= run.max_requests {
            return Ok(());
        }
        if let Some(schedule) = schedule.as_deref() {
            tokio::time::sleep_until(schedule.intended()).await;
        }
        let sent = Instant::now();
        protocol::write_message(connection, request, run.exchange.request.get()).await?;
        if !protocol::read_message(connection, response, run.exchange.response.get()).await? {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let done = Instant::now();
        recorder.record(match schedule.as_deref_mut() {
            None => done - sent,
            Some(schedule) => schedule.complete(sent, done),
        });
        run.counters.add_done(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_excludes_timer_lateness_but_not_stalls() {
        let t0 = Instant::now();
        let us = Duration::from_micros;
        let mut schedule = Schedule::new(t0, us(1000));
        // Woke 700 µs late, answered in 20 µs: the lateness is ours.
        assert_eq!(schedule.complete(t0 + us(700), t0 + us(720)), us(20));
        // Slot 1000: woke 900 µs late, answered in 30 µs.
        assert_eq!(schedule.complete(t0 + us(1900), t0 + us(1930)), us(30));
        // Slot 2000: a 5 ms stall.
        assert_eq!(schedule.complete(t0 + us(2100), t0 + us(7100)), us(5000));
        // Slots 3000..=6000 waited behind the stall: each is charged from its
        // slot to where an on-time sender would have finished it.
        assert_eq!(schedule.complete(t0 + us(7100), t0 + us(7120)), us(4020));
        assert_eq!(schedule.complete(t0 + us(7120), t0 + us(7140)), us(3040));
        assert_eq!(schedule.intended(), t0 + us(5000));
    }

    #[test]
    fn slots_advance_and_missed_ones_are_skipped_in_phase() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut schedule = Schedule::new(t0 + ms(1), ms(10));
        schedule.complete(t0 + ms(1), t0 + ms(2));
        assert_eq!(schedule.intended(), t0 + ms(11));
        schedule.resume(t0 + ms(5));
        assert_eq!(schedule.intended(), t0 + ms(11));
        schedule.resume(t0 + ms(45));
        assert_eq!(schedule.intended(), t0 + ms(51));
        schedule.resume(t0 + ms(51));
        assert_eq!(schedule.intended(), t0 + ms(51));
    }

    #[test]
    fn a_total_rate_is_split_over_the_connections() {
        assert_eq!(pacing(0.0, 4), (None, Duration::ZERO));
        let (interval, stagger) = pacing(1000.0, 4);
        assert_eq!(interval, Some(Duration::from_millis(4)));
        assert_eq!(stagger, Duration::from_millis(1));
    }
}
