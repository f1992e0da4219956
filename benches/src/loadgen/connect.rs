//! `connect`: a new connection for every request. Each attempt connects,
//! sends the header and one request in one write, reads the full response
//! and closes, recording how long connect() took and how long until the
//! response: the set-up a tunnel adds shows in the second.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::cli::{Close, ConnectArgs};
use super::dial::{self, DialError, Linger, RETRY_BACKOFF};
use super::latency::{LatencyError, Recorder};
use super::progress::{Counters, Progress, Unit};
use super::protocol::{self, Exchange, HEADER_LEN, Header};
use super::report::{self, ConnectReport};

/// The largest request or response buffer; longer messages move in pieces.
/// 64 KiB covers any first request a connection benchmark uses in one write.
const MESSAGE_BUFFER_MAX: usize = 64 * 1024;

/// What every worker of one run shares.
struct Run {
    /// The server.
    target: SocketAddr,
    /// The request and response size, and whether the server closes first.
    exchange: Exchange,
    /// How the client's socket closes.
    linger: Linger,
    /// Where the run stops.
    deadline: Instant,
    /// Attempts claimed so far, for `--max-connections`.
    claimed: AtomicU64,
    /// The most attempts in total.
    max_connections: u64,
    /// Connections made and failures.
    counters: Arc<Counters>,
}

/// One worker's samples.
struct Samples {
    /// connect() durations.
    connect: Recorder,
    /// From the start of connect() to the full response.
    setup: Recorder,
}

/// Runs `connect` and reports the connections made and their timings.
pub async fn run(
    args: &ConnectArgs,
    quiet: bool,
    counters: &Arc<Counters>,
) -> Result<ConnectReport, LatencyError> {
    // Server-first close is the default; see `Close` for why.
    let (close_after_response, linger) = match args.close {
        Close::Server => (true, Linger::Normal),
        Close::Reset => (false, Linger::Reset),
    };
    let recorder = Recorder::new()?;
    let start = Instant::now();
    let run = Arc::new(Run {
        target: args.target,
        exchange: Exchange {
            request: args.size,
            response: args.size,
            close_after_response,
        },
        linger,
        deadline: start + args.duration,
        claimed: AtomicU64::new(0),
        max_connections: args.max_connections.unwrap_or(u64::MAX),
        counters: Arc::clone(counters),
    });
    let progress = Progress::start(
        Arc::clone(counters),
        Unit::Connections,
        args.duration,
        quiet,
    );
    let mut workers = JoinSet::new();
    for _ in 0..args.concurrency {
        let samples = Samples {
            connect: recorder.clone(),
            setup: recorder.clone(),
        };
        workers.spawn(worker(Arc::clone(&run), samples));
    }
    let mut connect = recorder.clone();
    let mut setup = recorder;
    while let Some(finished) = workers.join_next().await {
        match finished {
            Ok(samples) => {
                connect.merge(&samples.connect)?;
                setup.merge(&samples.setup)?;
            }
            Err(join) => counters.add_error(&join),
        }
    }
    let duration_s = start.elapsed().as_secs_f64();
    drop(progress);

    Ok(ConnectReport {
        connections_made: setup.count(),
        connections_per_s: report::per_second(setup.count(), duration_s),
        errors: counters.errors(),
        connect_us: connect.summary(),
        setup_us: setup.summary(),
    })
}

/// Attempts connections one after the other until the deadline or the
/// attempt limit. Returns its samples.
async fn worker(run: Arc<Run>, mut samples: Samples) -> Samples {
    let message_len = (run.exchange.request.get() as usize).min(MESSAGE_BUFFER_MAX);
    // Header and request go out in one write, as a client's first request
    // would; the buffer is built once and reused for every attempt.
    let mut message = Vec::with_capacity(HEADER_LEN + message_len);
    message.extend_from_slice(&Header::Echo(run.exchange).encode());
    message.resize(HEADER_LEN + message_len, 0);
    let mut response = vec![0u8; (run.exchange.response.get() as usize).min(MESSAGE_BUFFER_MAX)];
    // Cancelling at the deadline drops at most the attempt in progress,
    // which did not finish within the run and is rightly not counted.
    let _ = tokio::time::timeout_at(run.deadline, async {
        while run.claimed.fetch_add(1, Ordering::Relaxed) < run.max_connections {
            match attempt(&run, &message, &mut response).await {
                Ok((connect, setup)) => {
                    samples.connect.record(connect);
                    samples.setup.record(setup);
                    run.counters.add_done(1);
                }
                Err(err) => {
                    run.counters.add_error(&err);
                    tokio::time::sleep(RETRY_BACKOFF).await;
                }
            }
        }
    })
    .await;
    samples
}

/// One connection: returns the connect() time and the set-up time.
async fn attempt(
    run: &Run,
    message: &[u8],
    response: &mut [u8],
) -> Result<(Duration, Duration), DialError> {
    let begin = Instant::now();
    let mut connection = dial::connect(run.target, run.linger).await?;
    let connected = Instant::now();
    let first_exchange = async {
        let request = run.exchange.request.get();
        connection.write_all(message).await?;
        let sent = (message.len() - HEADER_LEN) as u32;
        if request > sent {
            protocol::write_message(&mut connection, &message[HEADER_LEN..], request - sent)
                .await?;
        }
        if !protocol::read_message(&mut connection, response, run.exchange.response.get()).await? {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        Ok(())
    };
    first_exchange.await.map_err(DialError::FirstExchange)?;
    let answered = Instant::now();
    if run.exchange.close_after_response {
        // Wait for the server's FIN before closing, so the server is the
        // side that closed first and keeps the TIME_WAIT.
        let mut byte = [0u8; 1];
        match connection.read(&mut byte).await {
            Ok(0) => {}
            Ok(_) => {
                return Err(DialError::FirstExchange(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "bytes after the response",
                )));
            }
            Err(err) => return Err(DialError::FirstExchange(err)),
        }
    }
    Ok((connected - begin, answered - begin))
}
