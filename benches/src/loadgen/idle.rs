//! `idle`: open N connections, prove each with a 1-byte round trip, hold
//! them until the hold ends, then check which ones the far side dropped and
//! close them. Held connections are bare sockets in a `Vec`: no task, no
//! buffer, so ten thousand of them cost the client almost nothing.

use std::io::{self, Read};
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use socket2::SockRef;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::cli::IdleArgs;
use super::dial::{self, CONNECT_TIMEOUT, DialError};
use super::limits::{LimitError, OpenFiles};
use super::progress::{Counters, Progress, Unit};
use super::protocol::{self, Exchange, Header};
use super::report::{self, Event, IdleReport};
use super::shutdown::StopSignals;

/// Connections being opened at once when no open rate is given. 256 keeps
/// the server's accept queue and the proxies' connection set-up busy without
/// a burst of thousands of SYNs that would measure SYN retransmits instead.
const MAX_IN_FLIGHT: usize = 256;

/// Why the idle run could not go on.
#[derive(Debug, thiserror::Error)]
pub enum IdleError {
    /// The connections asked for do not fit under the open-file limit.
    #[error(transparent)]
    Limit(#[from] LimitError),
    /// The SIGTERM/SIGINT handlers could not be installed.
    #[error("installing signal handlers")]
    Signals(#[source] io::Error),
    /// The holding event could not be written to stdout.
    #[error("writing to stdout")]
    Output(#[source] io::Error),
}

/// Runs `idle` and reports how many connections were held.
pub async fn run(
    args: &IdleArgs,
    quiet: bool,
    counters: &Arc<Counters>,
) -> Result<IdleReport, IdleError> {
    // Where /proc does not say, the connects themselves will fail and count.
    if let Ok(Some(limits)) = OpenFiles::current() {
        limits.check(u64::from(args.connections))?;
    }
    let mut stop = StopSignals::install().map_err(IdleError::Signals)?;
    let open_time = open_rate(args)
        .and_then(|rate| Duration::try_from_secs_f64(f64::from(args.connections) / rate).ok())
        .unwrap_or_default();
    let progress = Progress::start(
        Arc::clone(counters),
        Unit::Opened,
        open_time.saturating_add(args.hold),
        quiet,
    );

    let start = Instant::now();
    let mut held = Vec::new();
    let stopped = tokio::select! {
        () = open_all(args, &mut held, counters) => false,
        // Dropping the opening future aborts the connects in flight; the
        // connections already open stay in `held`.
        () = stop.recv() => true,
    };
    let open_s = start.elapsed().as_secs_f64();
    drop(progress);

    let count = held.len() as u64;
    report::print(&Event::Holding {
        held: count,
        errors: counters.errors(),
    })
    .map_err(IdleError::Output)?;
    if !stopped {
        let stdin_closed = stdin_eof(args.ignore_stdin);
        // Cancel safe: whichever branch loses is dropped, and none holds state.
        // A dropped sender (stdin not watched) fails the pattern, which
        // disables that branch instead of ending the hold.
        tokio::select! {
            () = tokio::time::sleep(args.hold) => {}
            () = stop.recv() => {}
            Ok(()) = stdin_closed => {}
        }
    }
    let dropped = held.iter().filter(|stream| !is_open(stream)).count() as u64;
    drop(held);

    Ok(IdleReport {
        held: count,
        errors: counters.errors(),
        dropped,
        open_s,
    })
}

/// Opens the connections, at `--open-rate` or as fast as [`MAX_IN_FLIGHT`]
/// allows, pushing each proven one onto `held`.
async fn open_all(args: &IdleArgs, held: &mut Vec<TcpStream>, counters: &Counters) {
    let start = Instant::now();
    let mut opening = JoinSet::new();
    let mut collect = |opened: Result<Result<TcpStream, DialError>, _>| match opened {
        Ok(Ok(stream)) => {
            held.push(stream);
            counters.add_done(1);
        }
        Ok(Err(err)) => counters.add_error(&err),
        Err(join) => counters.add_error(&join),
    };
    for index in 0..args.connections {
        if let Some(rate) = open_rate(args) {
            let due = Duration::try_from_secs_f64(f64::from(index) / rate).unwrap_or(Duration::MAX);
            if let Some(due) = start.checked_add(due) {
                tokio::time::sleep_until(due).await;
            }
        }
        while let Some(opened) = opening.try_join_next() {
            collect(opened);
        }
        while opening.len() >= MAX_IN_FLIGHT {
            if let Some(opened) = opening.join_next().await {
                collect(opened);
            }
        }
        opening.spawn(open_one(args.target));
    }
    while let Some(opened) = opening.join_next().await {
        collect(opened);
    }
}

/// The pace of new connections; `None` (also for 0) means as fast as
/// [`MAX_IN_FLIGHT`] allows.
fn open_rate(args: &IdleArgs) -> Option<f64> {
    args.open_rate.filter(|rate| *rate > 0.0)
}

/// Opens one connection and proves it with a 1-byte round trip, so a held
/// connection is known to reach the server (through any proxies), not just
/// the nearest listener.
async fn open_one(target: SocketAddr) -> Result<TcpStream, DialError> {
    let exchange = Exchange {
        request: NonZeroU32::MIN,
        response: NonZeroU32::MIN,
        close_after_response: false,
    };
    let proven = async {
        let mut stream = dial::open(target, Header::Echo(exchange)).await?;
        let round_trip = async {
            stream.write_all(&[0]).await?;
            let mut byte = [0u8; 1];
            if protocol::read_message(&mut stream, &mut byte, 1).await? {
                Ok(())
            } else {
                Err(io::Error::from(io::ErrorKind::UnexpectedEof))
            }
        };
        round_trip.await.map_err(DialError::FirstExchange)?;
        Ok(stream)
    };
    tokio::time::timeout(CONNECT_TIMEOUT, proven)
        .await
        .unwrap_or(Err(DialError::Timeout))
}

/// A receiver that gets `Ok(())` when stdin reaches EOF, and an error (the
/// sender dropped) when `ignore` is set or stdin cannot be read: a missing
/// stdin must not end the hold at once.
///
/// The read runs on its own detached thread: a blocking read cannot be
/// cancelled, and a runtime blocking task would hold up the exit until it
/// returned.
fn stdin_eof(ignore: bool) -> oneshot::Receiver<()> {
    let (eof, closed) = oneshot::channel();
    if ignore {
        return closed;
    }
    let spawned = std::thread::Builder::new()
        .name("stdin-eof".to_owned())
        .spawn(move || {
            let mut stdin = io::stdin().lock();
            // Only EOF matters; anything read is discarded in small pieces
            // so the thread's memory stays flat.
            let mut buf = [0u8; 512];
            loop {
                match stdin.read(&mut buf) {
                    Ok(0) => {
                        let _ = eof.send(());
                        return;
                    }
                    Ok(_) => {}
                    Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => return,
                }
            }
        });
    if spawned.is_err() {
        eprintln!("ztunnel-loadgen idle: cannot watch stdin; holding for --hold");
    }
    closed
}

/// Whether the far side still has the connection open: a non-blocking peek
/// that would block means nothing arrived, neither data nor FIN nor reset.
fn is_open(stream: &TcpStream) -> bool {
    let mut byte = [MaybeUninit::<u8>::uninit(); 1];
    match SockRef::from(stream).peek(&mut byte) {
        Ok(0) => false,
        Ok(_) => true,
        Err(err) => err.kind() == io::ErrorKind::WouldBlock,
    }
}
