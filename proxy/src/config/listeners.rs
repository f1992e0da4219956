//! Where the proxy's listeners bind: the capture and HBONE listeners, and
//! the admin, Prometheus and readiness listeners. Binding them is each
//! mode's start-up's business (`app/`); the DNS proxy's address is
//! `dns.rs`'s.

use std::net::{Ipv6Addr, SocketAddr};

use ztunnel_proto::ports::HBONE_PORT;

use crate::ports::{INBOUND_PLAINTEXT_PORT, OUTBOUND_PORT};

/// Listener addresses. Defaults are the Istio ports; they are configurable so
/// that several dedicated proxies can share one host during development.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listeners {
    /// Outbound capture (15001).
    pub outbound: SocketAddr,
    /// Inbound plaintext capture (15006).
    pub inbound_plaintext: SocketAddr,
    /// Inbound HBONE (15008).
    pub inbound: SocketAddr,
    /// Admin (15000), localhost only.
    pub admin: SocketAddr,
    /// Prometheus (15020).
    pub stats: SocketAddr,
    /// Readiness (15021).
    pub readiness: SocketAddr,
}

/// The flags and variables, flattened into the command line.
#[derive(Debug, clap::Args)]
pub(super) struct ListenerArgs {
    /// Outbound capture listener.
    #[arg(
        long,
        env = "ZTUNNEL_OUTBOUND_ADDR",
        default_value_t = SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), OUTBOUND_PORT)
    )]
    outbound_addr: SocketAddr,
    /// Inbound plaintext capture listener.
    #[arg(
        long,
        env = "ZTUNNEL_INBOUND_PLAINTEXT_ADDR",
        default_value_t = SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), INBOUND_PLAINTEXT_PORT)
    )]
    inbound_plaintext_addr: SocketAddr,
    /// Inbound HBONE listener.
    #[arg(
        long,
        env = "ZTUNNEL_INBOUND_ADDR",
        default_value_t = SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), HBONE_PORT)
    )]
    inbound_addr: SocketAddr,
    /// Admin listener (keep it on localhost).
    #[arg(long, env = "ZTUNNEL_ADMIN_ADDR", default_value = "127.0.0.1:15000")]
    admin_addr: SocketAddr,
    /// Prometheus listener.
    #[arg(long, env = "ZTUNNEL_STATS_ADDR", default_value = "[::]:15020")]
    stats_addr: SocketAddr,
    /// Readiness listener.
    #[arg(long, env = "ZTUNNEL_READINESS_ADDR", default_value = "[::]:15021")]
    readiness_addr: SocketAddr,
}

impl ListenerArgs {
    /// The addresses, as given.
    pub(super) fn parse(&self) -> Listeners {
        Listeners {
            outbound: self.outbound_addr,
            inbound_plaintext: self.inbound_plaintext_addr,
            inbound: self.inbound_addr,
            admin: self.admin_addr,
            stats: self.stats_addr,
            readiness: self.readiness_addr,
        }
    }
}
