//! `dns`: A queries over UDP to one nameserver, a closed loop with a fixed
//! number in flight, round robin over a list of names, bounded by
//! `--duration` and `--max-queries`. In a pod the nameserver is the one
//! its resolv.conf names, so the queries take the path an application's
//! take (a DNS proxy's capture rules included). Every reply is counted by
//! what it is: an answer to an open query (by response code, with or
//! without an address), a reply to no open query, or bytes that are no
//! DNS response at all.
//!
//! The book of open queries is `dns/in_flight.rs`, the messages
//! `dns/message.rs`, the `dns-server` mode `dns/nameserver.rs`.

use std::collections::BTreeMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;

use tokio::net::UdpSocket;
use tokio::time::Instant;

use super::cli::DnsArgs;
use super::latency::{LatencyError, Recorder};
use super::progress::{Counters, Progress, Unit};
use super::report::{self, DnsReport};

mod in_flight;
mod message;
pub mod nameserver;

use in_flight::InFlight;
use message::AQuery;

/// Where the system's resolver configuration is; `ip netns exec` puts a
/// namespace's own (`/etc/netns/<ns>/resolv.conf`) here.
const RESOLV_CONF: &str = "/etc/resolv.conf";

/// The DNS port, where a resolv.conf's nameservers listen.
const DNS_PORT: u16 = 53;

/// The most distinct answer addresses a report lists: enough to tell the
/// proxy's answer from the nameserver's, and a bound on what a server that
/// answers every query differently can make the client keep.
const ADDRESSES_LISTED: usize = 16;

/// The receive buffer: queries carry no EDNS, so a conforming server
/// answers in at most 512 bytes; room for more so that an oversized reply
/// is read whole and counted as what it is.
const REPLY_BUFFER: usize = 4096;

/// Why the `dns` mode could not run.
#[derive(Debug, thiserror::Error)]
pub enum DnsError {
    /// No `--server` was given and the resolver configuration names no
    /// usable nameserver.
    #[error("{RESOLV_CONF}: no nameserver to ask (give --server)")]
    NoNameserver(#[source] Option<io::Error>),
    /// The client's socket could not be made or connected.
    #[error("opening a UDP socket to {server}")]
    Socket {
        /// The nameserver.
        server: SocketAddr,
        /// What the system said.
        source: io::Error,
    },
    /// A name could not be put in a query.
    #[error("encoding a query for {name}")]
    Encode {
        /// The name.
        name: String,
        /// What the encoder said.
        source: hickory_proto::ProtoError,
    },
    /// The latency histogram could not be built or merged.
    #[error(transparent)]
    Latency(#[from] LatencyError),
}

/// What a run counted, besides latency.
#[derive(Debug, Default)]
struct Tally {
    sent: u64,
    answered: u64,
    with_address: u64,
    timeouts: u64,
    malformed: u64,
    unmatched: u64,
    io_errors: u64,
    rcodes: BTreeMap<&'static str, u64>,
    addresses: Vec<Ipv4Addr>,
}

/// Runs `dns` and reports what was asked, answered and lost.
pub async fn run(
    args: &DnsArgs,
    quiet: bool,
    counters: &Arc<Counters>,
) -> Result<DnsReport, DnsError> {
    let server = match args.server {
        Some(server) => server,
        None => SocketAddr::new(resolv_conf_nameserver(Path::new(RESOLV_CONF))?, DNS_PORT),
    };
    let mut queries = args
        .names
        .iter()
        .map(|name| {
            AQuery::new(name).map_err(|source| DnsError::Encode {
                name: name.to_string(),
                source,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let socket = connect(server)
        .await
        .map_err(|source| DnsError::Socket { server, source })?;
    let mut recorder = Recorder::new()?;
    let progress = Progress::start(Arc::clone(counters), Unit::Queries, args.duration, quiet);
    let start = Instant::now();
    let tally = query_loop(&socket, &mut queries, args, counters, &mut recorder).await;
    let duration_s = start.elapsed().as_secs_f64();
    drop(progress);
    Ok(DnsReport {
        server,
        in_flight: u64::from(args.in_flight),
        duration_s,
        sent: tally.sent,
        answered: tally.answered,
        with_address: tally.with_address,
        timeouts: tally.timeouts,
        malformed: tally.malformed,
        unmatched: tally.unmatched,
        errors: tally.timeouts + tally.malformed + tally.io_errors,
        rcodes: tally
            .rcodes
            .into_iter()
            .map(|(name, count)| (name.to_owned(), count))
            .collect(),
        addresses: tally.addresses,
        queries_per_s: report::per_second(tally.answered, duration_s),
        latency_us: recorder.summary(),
    })
}

/// A UDP socket of the server's family, connected to it: the kernel then
/// delivers only the server's datagrams (after a DNS proxy's redirect,
/// conntrack gives its replies the server's address back).
async fn connect(server: SocketAddr) -> io::Result<UdpSocket> {
    let any: IpAddr = match server {
        SocketAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        SocketAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    };
    let socket = UdpSocket::bind(SocketAddr::new(any, 0)).await?;
    socket.connect(server).await?;
    Ok(socket)
}

/// Sends and receives until the deadline, or until `--max-queries` were
/// sent and each was answered or timed out. Queries still open at the
/// deadline are left: they did not complete within the run.
async fn query_loop(
    socket: &UdpSocket,
    queries: &mut [AQuery],
    args: &DnsArgs,
    counters: &Counters,
    recorder: &mut Recorder,
) -> Tally {
    let mut tally = Tally::default();
    let mut book = InFlight::new(args.timeout);
    let in_flight = usize::try_from(args.in_flight).unwrap_or(usize::MAX);
    let end = Instant::now() + args.duration;
    let mut next_name = 0;
    let mut buffer = vec![0u8; REPLY_BUFFER];
    loop {
        let now = Instant::now();
        let expired = book.expire(now);
        tally.timeouts += expired;
        for _ in 0..expired {
            counters.add_error(&io::Error::from(io::ErrorKind::TimedOut));
        }
        if now >= end || (tally.sent >= args.max_queries && book.is_empty()) {
            return tally;
        }
        let names = queries.len();
        while book.len() < in_flight && tally.sent < args.max_queries {
            let Some(query) = queries.get_mut(next_name) else {
                return tally;
            };
            let Some(id) = book.open(next_name, Instant::now()) else {
                break;
            };
            next_name = (next_name + 1) % names;
            tally.sent += 1;
            if let Err(error) = socket.send(query.with_id(id)).await {
                book.close(id, Instant::now());
                tally.io_errors += 1;
                counters.add_error(&error);
            }
        }
        let wake = book
            .next_deadline()
            .map_or(end, |deadline| deadline.min(end));
        match tokio::time::timeout_at(wake, socket.recv(&mut buffer)).await {
            // Time for the expiry or the end, at the top of the loop.
            Err(_) => {}
            Ok(Err(error)) => {
                // A connected UDP socket reports the ICMP error of an
                // earlier datagram here (nothing listening: refused).
                tally.io_errors += 1;
                counters.add_error(&error);
            }
            Ok(Ok(length)) => {
                let received = Instant::now();
                let reply = &buffer[..length];
                match count_reply(reply, received, queries, &mut book, &mut tally, recorder) {
                    Counted::Answer => counters.add_done(1),
                    Counted::Malformed => counters.add_error(&io::Error::new(
                        io::ErrorKind::InvalidData,
                        "a reply that is not a DNS response to the question asked",
                    )),
                    Counted::Unmatched => {}
                }
            }
        }
    }
}

/// What one datagram from the server was counted as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Counted {
    /// The answer to an open query, which it closed.
    Answer,
    /// No DNS response, or one whose question is not what its id asked.
    Malformed,
    /// A response to no open query: late, after its query timed out, or
    /// a stray.
    Unmatched,
}

/// Counts one datagram from the server; an answer closes its query and
/// records its latency.
fn count_reply(
    bytes: &[u8],
    received: Instant,
    queries: &[AQuery],
    book: &mut InFlight,
    tally: &mut Tally,
    recorder: &mut Recorder,
) -> Counted {
    let Some(reply) = message::read_reply(bytes) else {
        tally.malformed += 1;
        return Counted::Malformed;
    };
    let Some(asked) = book.name_of(reply.id) else {
        tally.unmatched += 1;
        return Counted::Unmatched;
    };
    if reply.name.as_ref() != queries.get(asked).map(AQuery::name) {
        tally.malformed += 1;
        return Counted::Malformed;
    }
    let Some(closed) = book.close(reply.id, received) else {
        tally.unmatched += 1;
        return Counted::Unmatched;
    };
    recorder.record(closed.latency);
    tally.answered += 1;
    if !reply.addresses.is_empty() {
        tally.with_address += 1;
    }
    for address in reply.addresses {
        if tally.addresses.len() < ADDRESSES_LISTED && !tally.addresses.contains(&address) {
            tally.addresses.push(address);
        }
    }
    *tally.rcodes.entry(reply.rcode.name()).or_default() += 1;
    Counted::Answer
}

/// The first nameserver of the resolver configuration at `path` that is
/// an IP address (a scoped IPv6 address is skipped).
fn resolv_conf_nameserver(path: &Path) -> Result<IpAddr, DnsError> {
    let text =
        std::fs::read_to_string(path).map_err(|error| DnsError::NoNameserver(Some(error)))?;
    first_nameserver(&text).ok_or(DnsError::NoNameserver(None))
}

/// The first `nameserver` line's address in a resolv.conf's text.
fn first_nameserver(text: &str) -> Option<IpAddr> {
    text.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        (words.next() == Some("nameserver"))
            .then(|| words.next()?.parse().ok())
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_usable_nameserver_of_a_resolv_conf_is_taken() {
        let cases = [
            ("nameserver 198.18.53.2\n", Some("198.18.53.2")),
            (
                "# kubelet\nsearch bench.svc.cluster.local\nnameserver 10.96.0.10\nnameserver 10.96.0.11\noptions ndots:5\n",
                Some("10.96.0.10"),
            ),
            ("nameserver fe80::1%eth0\nnameserver ::1\n", Some("::1")),
            ("  nameserver\t198.18.0.10  \n", Some("198.18.0.10")),
            ("nameservers 1.2.3.4\n#nameserver 1.2.3.4\n", None),
            ("nameserver\n", None),
            ("", None),
        ];
        for (text, expected) in cases {
            let expected = expected.map(|ip: &str| ip.parse::<IpAddr>().unwrap());
            assert_eq!(first_nameserver(text), expected, "{text:?}");
        }
    }
}
