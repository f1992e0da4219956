//! Opening client connections: resolving a destination's name, the socket
//! options every client socket gets (TCP_NODELAY, optionally a zero
//! linger), a connect timeout, the header, and the pause before a failed
//! connection is tried again. What each mode sends afterwards lives in its
//! own module.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpSocket, TcpStream};
use tokio::task::JoinSet;

use super::cli::{Destination, Host};
use super::progress::Counters;
use super::protocol::Header;

/// How long one connect() may take. Ten seconds outlasts Linux's first SYN
/// retransmissions (1 s, then 3 s) so a lost SYN is a slow connection and not
/// an error, while a dead target still fails well inside any benchmark run.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The pause after a failed connection before a worker tries again: a dead
/// target then costs a hundred attempts a second per worker instead of a
/// busy loop on a machine shared with the proxies being measured, while a
/// single reset costs a throughput run almost nothing.
pub const RETRY_BACKOFF: Duration = Duration::from_millis(10);

/// How a client socket ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Linger {
    /// The default close: a FIN, with TIME_WAIT on whichever side sends it first.
    Normal,
    /// SO_LINGER 0: close() sends a reset and leaves no TIME_WAIT behind.
    Reset,
}

/// Why a connection could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    /// The name could not be resolved.
    #[error("resolving {name}")]
    Resolve {
        /// The name asked for.
        name: Arc<str>,
        /// What the resolver said.
        source: io::Error,
    },
    /// The name resolved to no address.
    #[error("{0} resolved to no address")]
    NoAddress(Arc<str>),
    /// The socket could not be created or configured (e.g. out of file descriptors).
    #[error("socket")]
    Socket(#[source] io::Error),
    /// connect() failed: refused, unreachable, or reset.
    #[error("connect")]
    Connect(#[source] io::Error),
    /// connect(), or connect() and the first round trip where a mode proves
    /// the connection with one, did not finish within [`CONNECT_TIMEOUT`].
    #[error("no connection within {CONNECT_TIMEOUT:?}")]
    Timeout,
    /// Writing the header failed after the connection was up.
    #[error("writing the header")]
    Header(#[source] io::Error),
    /// The first request or response on the new connection failed.
    #[error("first round trip")]
    FirstExchange(#[source] io::Error),
}

/// Connects to `target` with TCP_NODELAY set, so small requests leave at once
/// instead of waiting on Nagle's algorithm for an ACK.
pub async fn connect(target: SocketAddr, linger: Linger) -> Result<TcpStream, DialError> {
    let socket = match target {
        SocketAddr::V4(_) => TcpSocket::new_v4(),
        SocketAddr::V6(_) => TcpSocket::new_v6(),
    }
    .map_err(DialError::Socket)?;
    socket.set_nodelay(true).map_err(DialError::Socket)?;
    if linger == Linger::Reset {
        socket.set_zero_linger().map_err(DialError::Socket)?;
    }
    match tokio::time::timeout(CONNECT_TIMEOUT, socket.connect(target)).await {
        Ok(Ok(stream)) => Ok(stream),
        Ok(Err(err)) => Err(DialError::Connect(err)),
        Err(_) => Err(DialError::Timeout),
    }
}

/// Connects and writes `header`: a connection ready for its mode.
pub async fn open(target: SocketAddr, header: Header) -> Result<TcpStream, DialError> {
    let mut stream = connect(target, Linger::Normal).await?;
    stream
        .write_all(&header.encode())
        .await
        .map_err(DialError::Header)?;
    Ok(stream)
}

/// The address to dial for `destination`: an IP address as it is, a name
/// through the system's resolver (getaddrinfo: /etc/hosts and DNS as
/// /etc/nsswitch.conf orders them), asked again on every call; the first
/// address it gives.
pub async fn resolve(destination: &Destination) -> Result<SocketAddr, DialError> {
    let name = match &destination.host {
        Host::Address(address) => return Ok(SocketAddr::new(*address, destination.port)),
        Host::Name(name) => name,
    };
    let mut addresses = tokio::net::lookup_host((&**name, destination.port))
        .await
        .map_err(|source| DialError::Resolve {
            name: Arc::clone(name),
            source,
        })?;
    addresses
        .next()
        .ok_or_else(|| DialError::NoAddress(Arc::clone(name)))
}

/// Opens `count` connections at once. A failed one is counted in
/// `counters` and comes back as `None`, for its worker to retry.
pub async fn open_many(
    target: SocketAddr,
    header: Header,
    count: u32,
    counters: &Counters,
) -> Vec<Option<TcpStream>> {
    let mut opening = JoinSet::new();
    for _ in 0..count {
        opening.spawn(open(target, header));
    }
    let mut streams = Vec::with_capacity(count as usize);
    while let Some(opened) = opening.join_next().await {
        streams.push(match opened {
            Ok(Ok(stream)) => Some(stream),
            Ok(Err(err)) => {
                counters.add_error(&err);
                None
            }
            Err(join) => {
                counters.add_error(&join);
                None
            }
        });
    }
    streams
}
