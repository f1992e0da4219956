//! The DNS proxy (AMBIENT.md §5): on 15053, UDP and TCP, in each enrolled
//! pod's namespace (shared mode) or in ztunnel's own (dedicated mode), it
//! answers A and AAAA questions for the mesh's service hostnames from the
//! state, and relays every other query to the upstream resolver.
//!
//! - `name.rs`: the names a query is tried under (pure);
//! - `answer.rs`: answer or forward, and what the answer holds (pure);
//! - `wire.rs`: parsing, EDNS echo, truncation (pure);
//! - `forward.rs`: the upstream exchange;
//! - `server.rs`: the listeners' loops, one query through all of these;
//! - `metrics.rs`: `istio_dns_*`.
//!
//! Where the listeners are bound is each mode's start-up (`app.rs`,
//! `inpod/workloads.rs`); the capture rules that send a pod's port-53
//! traffic here are the node agent's.
//!
//! Choices that differ from istio/ztunnel's, or follow a weakness of it:
//! - A forwarded query is relayed as the client sent it, over its own
//!   transport, and the upstream's response comes back unchanged (its
//!   rcode, sections, EDNS options, its TC). istio/ztunnel asks through a
//!   caching stub resolver and rebuilds the response; we keep no cache, so
//!   every forwarded query reaches the upstream (a cache keyed by question
//!   would spare it, at the cost of answering from stale data).
//! - The search list is fixed (`<ns>.svc.<d>`, `svc.<d>`, `<d>`), as
//!   istio/ztunnel has it; reading the pod's own resolv.conf would also
//!   strip the suffixes of a pod with a custom `dnsConfig`.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use hickory_proto::ProtoError;
use hickory_proto::serialize::binary::DecodeError;

pub mod answer;
pub mod forward;
pub mod metrics;
pub mod name;
pub mod server;
pub mod wire;

/// Why a query got no answer of its own, or the proxy could not start.
#[derive(Debug, thiserror::Error)]
pub enum DnsError {
    /// The request is not a DNS message (answered FORMERR when it has a
    /// header).
    #[error("malformed DNS request")]
    Malformed(#[source] DecodeError),
    /// A response could not be encoded.
    #[error("encoding a DNS response")]
    Encode(#[source] ProtoError),
    /// A message too large for the TCP length prefix.
    #[error("a DNS message of {0} bytes is too large")]
    TooLarge(usize),
    /// A local answer with more records than a TCP message holds
    /// (answered SERVFAIL).
    #[error("an answer of {records} records does not fit in a DNS message")]
    AnswerTooLarge {
        /// The records it would carry.
        records: usize,
    },
    /// The resolver configuration could not be read.
    #[error("reading the resolver configuration {}", .path.display())]
    ReadResolvConf {
        /// The file.
        path: Arc<Path>,
        /// Why.
        source: std::io::Error,
    },
    /// The resolver configuration does not parse.
    #[error("parsing the resolver configuration {}: {reason}", .path.display())]
    ParseResolvConf {
        /// The file.
        path: Arc<Path>,
        /// What the parser said.
        reason: String,
    },
    /// No upstream nameserver is configured.
    #[error("no upstream nameserver in {}", .0.display())]
    NoUpstream(Arc<Path>),
    /// Talking to an upstream failed.
    #[error("asking the upstream nameserver {upstream}")]
    Upstream {
        /// The nameserver.
        upstream: SocketAddr,
        /// What the socket said.
        source: std::io::Error,
    },
    /// An upstream did not answer in time.
    #[error("the upstream nameserver {0} did not answer in time")]
    UpstreamTimeout(SocketAddr),
}
