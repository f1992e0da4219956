//! `dns-server`: a nameserver that answers every A query over UDP with
//! one fixed address, standing in for a cluster's DNS as the upstream of a
//! DNS proxy: the same short answer for every name, so that what a run
//! measures is the path to it, not its lookups. Runs until SIGTERM or
//! SIGINT. What it answers is `message.rs`'s `answer`.

use std::io;
use std::net::SocketAddr;

use tokio::net::UdpSocket;

use super::message;
use crate::loadgen::cli::DnsServerArgs;
use crate::loadgen::report::{self, Event};
use crate::loadgen::shutdown::StopSignals;

/// The receive buffer: the largest UDP payload, so that no datagram is
/// cut; a query is at most a few hundred bytes.
const QUERY_BUFFER: usize = 65_535;

/// Why the nameserver could not run.
#[derive(Debug, thiserror::Error)]
pub enum NameserverError {
    /// The listen address could not be bound.
    #[error("binding UDP {addr}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// What the system said.
        source: io::Error,
    },
    /// The SIGTERM/SIGINT handlers could not be installed.
    #[error("installing signal handlers")]
    Signals(#[source] io::Error),
    /// The listening event could not be written to stdout.
    #[error("writing the listening event")]
    Announce(#[source] io::Error),
}

/// Answers queries on `--listen` until a stop signal. Prints
/// `{"event":"listening","addr":...}` once bound.
pub async fn serve(args: &DnsServerArgs) -> Result<(), NameserverError> {
    let mut signals = StopSignals::install().map_err(NameserverError::Signals)?;
    let socket = UdpSocket::bind(args.listen)
        .await
        .map_err(|source| NameserverError::Bind {
            addr: args.listen,
            source,
        })?;
    let addr = socket
        .local_addr()
        .map_err(|source| NameserverError::Bind {
            addr: args.listen,
            source,
        })?;
    report::print(&Event::Listening { addr }).map_err(NameserverError::Announce)?;
    let mut buffer = vec![0u8; QUERY_BUFFER];
    loop {
        // `recv_from` is cancel safe: a datagram is either returned or
        // left in the socket for the next call.
        let received = tokio::select! {
            () = signals.recv() => return Ok(()),
            received = socket.recv_from(&mut buffer) => received,
        };
        // A receive error is an earlier send's ICMP error (the client
        // went away): nothing to answer.
        let Ok((length, client)) = received else {
            continue;
        };
        // What is not a standard query is dropped, as a nameserver drops
        // what it cannot read.
        let Some(response) = buffer
            .get(..length)
            .and_then(|query| message::answer(query, args.address))
        else {
            continue;
        };
        // A full send buffer drops the answer, as a network would; the
        // client counts it as a timeout.
        let _ = socket.send_to(&response, client).await;
    }
}
