//! `serve`: one listener for every client mode. Each accepted connection
//! reads the header and then sinks, sources or echoes bytes until the client
//! is done. The header itself is defined in `protocol.rs`.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use socket2::{Domain, Protocol, Socket, Type};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

use super::cli::ServeArgs;
use super::protocol::{self, Exchange, Header};
use super::report::{self, Event};
use super::shutdown::StopSignals;

/// Accept queue length. The connect and idle modes open up to 256
/// connections at once; 4096 (the kernel caps it at somaxconn) absorbs those
/// bursts without SYN drops turning into one-second retransmits.
const BACKLOG: i32 = 4096;

/// How long a new connection may take to send its header. Clients send it
/// right after connecting; anything slower is not a load generator and
/// should not hold a task forever.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// The sink and source buffer. A 256 KiB read or write moves what the
/// kernel's socket buffers hold in one system call, so the server's syscall
/// cost per byte stays negligible even at tens of Gbit/s on loopback.
const STREAM_BUFFER: usize = 256 * 1024;

/// The largest echo buffer. Messages longer than this are moved in pieces;
/// sizing the buffer to the message otherwise keeps ten thousand idle 1-byte
/// echo connections at a few bytes each.
const ECHO_BUFFER_MAX: usize = 64 * 1024;

/// After a failed accept (usually out of file descriptors) the loop waits
/// this long, so it does not spin while the condition lasts.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Accept failures are logged at most once per this interval.
const ACCEPT_LOG_INTERVAL: Duration = Duration::from_secs(1);

/// Why the server could not run.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The listen address could not be bound.
    #[error("binding {addr}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// The underlying error.
        source: io::Error,
    },
    /// The SIGTERM/SIGINT handlers could not be installed.
    #[error("installing signal handlers")]
    Signals(#[source] io::Error),
    /// The listening event could not be written to stdout.
    #[error("writing to stdout")]
    Output(#[source] io::Error),
}

/// Serves until SIGTERM or SIGINT.
pub async fn serve(args: &ServeArgs) -> Result<(), ServeError> {
    let listener = bind(args.listen).map_err(|source| ServeError::Bind {
        addr: args.listen,
        source,
    })?;
    let addr = listener.local_addr().map_err(|source| ServeError::Bind {
        addr: args.listen,
        source,
    })?;
    // Installed before the listening line, so a stop sent as soon as the
    // line is seen ends the server cleanly instead of killing it.
    let mut stop = StopSignals::install().map_err(ServeError::Signals)?;
    report::print(&Event::Listening { addr }).map_err(ServeError::Output)?;

    let mut last_logged: Option<Instant> = None;
    loop {
        // Both branches are cancel safe: accept() loses no connection and
        // the signal stream keeps undelivered signals.
        tokio::select! {
            () = stop.recv() => return Ok(()),
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    tokio::spawn(handle(stream, peer));
                }
                Err(err) => {
                    let now = Instant::now();
                    if last_logged.is_none_or(|at| now - at >= ACCEPT_LOG_INTERVAL) {
                        eprintln!("ztunnel-loadgen serve: accept: {err}");
                        last_logged = Some(now);
                    }
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
        }
    }
}

/// A listener with address reuse (restarts do not wait out TIME_WAIT) and
/// the [`BACKLOG`] above.
fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    socket.set_nonblocking(true)?;
    TcpListener::from_std(socket.into())
}

/// Serves one connection. Errors after the header are how clients end
/// (resets, broken pipes) and are not reported.
async fn handle(mut stream: TcpStream, peer: SocketAddr) {
    // Echo responses must leave at once; without NODELAY a response that
    // follows a partial segment waits for the client's delayed ACK.
    let _ = stream.set_nodelay(true);
    let read = tokio::time::timeout(HEADER_TIMEOUT, protocol::read_header(&mut stream)).await;
    let header = match read {
        Ok(Ok(Some(header))) => header,
        Ok(Ok(None)) => return,
        Ok(Err(refused)) => return log_refused(peer, &refused),
        Err(_) => return log_refused(peer, &format_args!("no header within {HEADER_TIMEOUT:?}")),
    };
    let _ = match header {
        Header::Sink => sink(&mut stream).await,
        Header::Source => source(&mut stream).await,
        Header::Echo(exchange) => echo(&mut stream, exchange).await,
    };
}

/// Logs a refused connection; dropping the stream then closes it.
fn log_refused(peer: SocketAddr, refused: &dyn std::fmt::Display) {
    eprintln!("ztunnel-loadgen serve: closing connection from {peer}: {refused}");
}

/// Reads and discards until the client closes.
async fn sink(stream: &mut TcpStream) -> io::Result<()> {
    let mut buf = vec![0u8; STREAM_BUFFER];
    while stream.read(&mut buf).await? > 0 {}
    Ok(())
}

/// Writes until the client goes away (the write then fails).
async fn source(stream: &mut TcpStream) -> io::Result<()> {
    let buf = vec![0u8; STREAM_BUFFER];
    loop {
        stream.write_all(&buf).await?;
    }
}

/// Answers each request with a response until the client closes, or after
/// the first response when the header asks for it.
async fn echo(stream: &mut TcpStream, exchange: Exchange) -> io::Result<()> {
    let longest = exchange.request.max(exchange.response).get() as usize;
    let mut buf = vec![0u8; longest.min(ECHO_BUFFER_MAX)];
    while protocol::read_message(stream, &mut buf, exchange.request.get()).await? {
        protocol::write_message(stream, &buf, exchange.response.get()).await?;
        if exchange.close_after_response {
            break;
        }
    }
    Ok(())
}
