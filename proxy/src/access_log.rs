//! The access log: one line per connection, at tracing target `access`,
//! with the messages and fields of WIRE.md §10. The caller hands plain data
//! ([`ConnectionLog`], [`Outcome`]); the format (text or JSON) is the
//! subscriber's, set up in telemetry.rs.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ztunnel_certs::error_chain::ErrorChain;

/// Which way the connection goes, from the reporting proxy's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// From a local workload out.
    Outbound,
    /// Towards a local workload.
    Inbound,
}

impl Direction {
    /// The field value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Outbound => "outbound",
            Self::Inbound => "inbound",
        }
    }
}

/// What is known of one side of a connection. Missing fields are left out
/// of the line.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct PeerLog {
    /// The workload's name.
    pub workload: Option<Arc<str>>,
    /// The workload's namespace.
    pub namespace: Option<Arc<str>>,
    /// The verified SPIFFE identity; set only under mTLS.
    pub identity: Option<Arc<str>>,
    /// The workload's cluster.
    pub cluster: Option<Arc<str>>,
}

/// Who the two ends of a connection are: the same for every connection
/// between the same two workloads, so open connections share one copy
/// (`crate::interner`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Peers {
    /// The client workload.
    pub src: PeerLog,
    /// The destination service hostname, when the destination is a service.
    pub dst_service: Option<Arc<str>>,
    /// The server workload.
    pub dst: PeerLog,
}

/// The fields of a connection known when it opens.
#[derive(Debug, Clone)]
pub struct ConnectionLog {
    /// The client's address.
    pub src_addr: SocketAddr,
    /// The address the connection is for (the original destination).
    pub dst_addr: SocketAddr,
    /// The HBONE peer the connection is tunnelled to, when it is.
    pub dst_hbone_addr: Option<SocketAddr>,
    /// The two ends' workloads and the service.
    pub peers: Arc<Peers>,
    /// Outbound or inbound.
    pub direction: Direction,
    /// Whether the connection took the same-node path: handed inside the
    /// proxy from one served pod to another, without the HBONE tunnel.
    pub same_node: bool,
}

/// How a connection ended.
#[derive(Debug, Clone, Copy)]
pub struct Outcome<'a> {
    /// Bytes sent towards the client.
    pub bytes_sent: u64,
    /// Bytes received from the client.
    pub bytes_recv: u64,
    /// From open to close.
    pub duration: Duration,
    /// Why it failed; `None` on success.
    pub error: Option<&'a (dyn std::error::Error + 'a)>,
}

/// Formats a duration as WIRE.md's `<n>ms` without building a `String`.
struct Millis(Duration);

impl fmt::Display for Millis {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{}ms", self.0.as_millis())
    }
}

/// Emits one access-log event with every connection field, at the given
/// level, plus any extra fields. A macro because tracing needs the level
/// and the field list at compile time.
macro_rules! connection_event {
    ($level:expr, $log:expr, $message:literal $(, $($extra:tt)*)?) => {{
        let log: &ConnectionLog = $log;
        tracing::event!(
            target: "access",
            $level,
            src.addr = %log.src_addr,
            src.workload = log.peers.src.workload.as_deref(),
            src.namespace = log.peers.src.namespace.as_deref(),
            src.identity = log.peers.src.identity.as_deref(),
            src.cluster = log.peers.src.cluster.as_deref(),
            dst.addr = %log.dst_addr,
            dst.hbone_addr = log.dst_hbone_addr.map(tracing::field::display),
            dst.service = log.peers.dst_service.as_deref(),
            dst.workload = log.peers.dst.workload.as_deref(),
            dst.namespace = log.peers.dst.namespace.as_deref(),
            dst.identity = log.peers.dst.identity.as_deref(),
            dst.cluster = log.peers.dst.cluster.as_deref(),
            direction = log.direction.as_str(),
            path = log.same_node.then_some("same-node"),
            $($($extra)*)?
            $message
        )
    }};
}

/// `connection opened`, at DEBUG.
pub fn opened(log: &ConnectionLog) {
    connection_event!(tracing::Level::DEBUG, log, "connection opened");
}

/// `connection complete`: INFO on success, ERROR with the error on failure.
pub fn complete(log: &ConnectionLog, outcome: &Outcome<'_>) {
    let duration = Millis(outcome.duration);
    match outcome.error {
        None => connection_event!(
            tracing::Level::INFO,
            log,
            "connection complete",
            bytes_sent = outcome.bytes_sent,
            bytes_recv = outcome.bytes_recv,
            duration = %duration,
        ),
        Some(error) => connection_event!(
            tracing::Level::ERROR,
            log,
            "connection complete",
            bytes_sent = outcome.bytes_sent,
            bytes_recv = outcome.bytes_recv,
            duration = %duration,
            error = %ErrorChain(error),
        ),
    }
}

/// `connection failed`, at WARN: an early deny, before a connection was
/// set up (self call, policy on plaintext inbound).
pub fn failed(
    src_addr: SocketAddr,
    dst_addr: SocketAddr,
    direction: Direction,
    error: &dyn std::error::Error,
) {
    tracing::event!(
        target: "access",
        tracing::Level::WARN,
        src.addr = %src_addr,
        dst.addr = %dst_addr,
        direction = direction.as_str(),
        error = %ErrorChain(error),
        "connection failed"
    );
}

#[cfg(test)]
mod tests;
