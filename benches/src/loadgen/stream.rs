//! `stream`: bulk transfer over N connections in one direction, counting the
//! bytes the client writes (up) or reads (down). The server's side of it is
//! the sink and source modes in `server.rs`.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::cli::{Direction, StreamArgs};
use super::dial::{self, RETRY_BACKOFF};
use super::progress::{Counters, Progress, Unit};
use super::protocol::Header;
use super::report::StreamReport;

/// The transfer buffer, one per connection, reused for every call. 256 KiB
/// per read or write is what the kernel's socket buffers move in one system
/// call at full speed, so the per-call cost disappears from the result even
/// at tens of Gbit/s on loopback; bigger buffers only cost memory.
const STREAM_BUFFER: usize = 256 * 1024;

/// What every worker of one run shares.
struct Run {
    /// The server.
    target: SocketAddr,
    /// Which way the bytes go.
    direction: Direction,
    /// Where the run stops.
    deadline: Instant,
    /// Stop once this many bytes moved in total.
    max_bytes: u64,
    /// Bytes moved and failures.
    counters: Arc<Counters>,
}

/// Runs `stream` and reports what moved.
pub async fn run(args: &StreamArgs, quiet: bool, counters: &Arc<Counters>) -> StreamReport {
    let header = match args.direction {
        Direction::Up => Header::Sink,
        Direction::Down => Header::Source,
    };
    // Connections are opened before the clock starts, so set-up time stays
    // out of the throughput (the connect mode measures it).
    let streams = dial::open_many(args.target, header, args.connections, counters).await;
    let start = Instant::now();
    let run = Arc::new(Run {
        target: args.target,
        direction: args.direction,
        deadline: start + args.duration,
        max_bytes: args.max_bytes.unwrap_or(u64::MAX),
        counters: Arc::clone(counters),
    });
    let progress = Progress::start(Arc::clone(counters), Unit::Bytes, args.duration, quiet);
    let mut workers = JoinSet::new();
    for stream in streams {
        workers.spawn(worker(stream, Arc::clone(&run), header));
    }
    while workers.join_next().await.is_some() {}
    let duration_s = start.elapsed().as_secs_f64();
    drop(progress);

    let bytes = counters.done();
    StreamReport {
        direction: args.direction,
        connections: u64::from(args.connections),
        duration_s,
        bytes,
        gbit_per_s: if duration_s > 0.0 {
            bytes as f64 * 8.0 / duration_s / 1e9
        } else {
            0.0
        },
        errors: counters.errors(),
    }
}

/// One connection's share: transfer until the deadline or the byte limit,
/// reconnecting after a failure.
async fn worker(mut stream: Option<TcpStream>, run: Arc<Run>, header: Header) {
    let mut buf = vec![0u8; STREAM_BUFFER];
    // Cancelling at the deadline drops the transfer between two calls or in
    // one; bytes are counted as each call returns, so none are lost.
    let _ = tokio::time::timeout_at(run.deadline, async {
        loop {
            let mut connection = match stream.take() {
                Some(connection) => connection,
                None => match dial::open(run.target, header).await {
                    Ok(connection) => connection,
                    Err(err) => {
                        run.counters.add_error(&err);
                        tokio::time::sleep(RETRY_BACKOFF).await;
                        continue;
                    }
                },
            };
            match transfer(&mut connection, &mut buf, &run).await {
                Ok(()) => return,
                Err(err) => {
                    run.counters.add_error(&err);
                    tokio::time::sleep(RETRY_BACKOFF).await;
                }
            }
        }
    })
    .await;
}

/// Moves bytes until the run's byte limit is reached (`Ok`) or the
/// connection fails. The server never closes first, so an EOF is a failure.
async fn transfer(connection: &mut TcpStream, buf: &mut [u8], run: &Run) -> io::Result<()> {
    loop {
        let remaining = run.max_bytes.saturating_sub(run.counters.done());
        if remaining == 0 {
            return Ok(());
        }
        let chunk = usize::try_from(remaining).map_or(buf.len(), |left| left.min(buf.len()));
        let moved = match run.direction {
            Direction::Up => connection.write(&buf[..chunk]).await?,
            Direction::Down => connection.read(&mut buf[..chunk]).await?,
        };
        if moved == 0 {
            return Err(match run.direction {
                Direction::Up => io::ErrorKind::WriteZero.into(),
                Direction::Down => io::ErrorKind::UnexpectedEof.into(),
            });
        }
        run.counters.add_done(moved as u64);
    }
}
