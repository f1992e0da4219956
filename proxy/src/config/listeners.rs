//! Where the proxy's listeners bind: the capture and HBONE listeners, and
//! the admin, Prometheus and readiness listeners. Binding them is each
//! mode's start-up's business (`app/`); the DNS proxy's address is
//! `dns.rs`'s.
//!
//! Unset, each listens where istio/ztunnel does: the capture, HBONE,
//! Prometheus and readiness listeners on the dual-stack `[::]`, or on
//! `0.0.0.0` with `IPV6_ENABLED=false`, so that a kernel without IPv6
//! never sees an IPv6 socket; the admin on 127.0.0.1, and on `[::1]` too
//! where IPv6 is on.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use ztunnel_proto::ports::HBONE_PORT;

use super::proxy_config::ProxyConfig;
use crate::ports::{INBOUND_PLAINTEXT_PORT, OUTBOUND_PORT, SOCKS5_PORT};

/// The admin port, unless Istio's proxy config sets `proxyAdminPort`.
const ADMIN_PORT: u16 = 15000;
/// The Prometheus port, unless Istio's proxy config sets `statsPort`.
const STATS_PORT: u16 = 15020;
/// The readiness port.
const READINESS_PORT: u16 = 15021;

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
    /// The admin's second address, `[::1]` on its port, where IPv6 is on
    /// and the admin address was left to its default: bound where the
    /// loopback has IPv6, and skipped with a line in the log where not.
    pub admin_ipv6: Option<SocketAddr>,
    /// Prometheus (15020).
    pub stats: SocketAddr,
    /// Readiness (15021).
    pub readiness: SocketAddr,
    /// SOCKS5 (127.0.0.1:15080) in each pod, when `UNSTABLE_ENABLE_SOCKS5`.
    pub socks5: Option<SocketAddr>,
}

/// The flags and variables, flattened into the command line.
#[derive(Debug, clap::Args)]
pub(super) struct ListenerArgs {
    /// Outbound capture listener [default: [::]:15001, 0.0.0.0:15001 without IPv6].
    #[arg(long, env = "ZTUNNEL_OUTBOUND_ADDR")]
    outbound_addr: Option<SocketAddr>,
    /// Inbound plaintext capture listener [default: [::]:15006, 0.0.0.0:15006 without IPv6].
    #[arg(long, env = "ZTUNNEL_INBOUND_PLAINTEXT_ADDR")]
    inbound_plaintext_addr: Option<SocketAddr>,
    /// Inbound HBONE listener [default: [::]:15008, 0.0.0.0:15008 without IPv6].
    #[arg(long, env = "ZTUNNEL_INBOUND_ADDR")]
    inbound_addr: Option<SocketAddr>,
    /// Admin listener, kept on localhost [default: 127.0.0.1:15000, and
    /// [::1]:15000 where IPv6 is on].
    #[arg(long, env = "ZTUNNEL_ADMIN_ADDR")]
    admin_addr: Option<SocketAddr>,
    /// Prometheus listener [default: [::]:15020, 0.0.0.0:15020 without IPv6].
    #[arg(long, env = "ZTUNNEL_STATS_ADDR")]
    stats_addr: Option<SocketAddr>,
    /// Readiness listener [default: [::]:15021, 0.0.0.0:15021 without IPv6].
    #[arg(long, env = "ZTUNNEL_READINESS_ADDR")]
    readiness_addr: Option<SocketAddr>,
    /// A SOCKS5 listener on 127.0.0.1:15080 in each pod, for applications
    /// that name their destination rather than being captured (CONNECT
    /// only, no authentication), as istio/ztunnel's.
    #[arg(long, env = "UNSTABLE_ENABLE_SOCKS5", default_value_t = false, action = clap::ArgAction::Set)]
    unstable_enable_socks5: bool,
}

impl ListenerArgs {
    /// The addresses: as given, else on `[::]` (or `0.0.0.0` unless
    /// `ipv6_enabled`) with Istio's ports, the admin on localhost; the
    /// admin and stats ports as Istio's proxy config sets them.
    pub(super) fn parse(&self, ipv6_enabled: bool, proxy_config: &ProxyConfig) -> Listeners {
        let admin_port = proxy_config.proxy_admin_port.unwrap_or(ADMIN_PORT);
        let stats_port = proxy_config.stats_port.unwrap_or(STATS_PORT);
        let wildcard = if ipv6_enabled {
            IpAddr::V6(Ipv6Addr::UNSPECIFIED)
        } else {
            IpAddr::V4(Ipv4Addr::UNSPECIFIED)
        };
        let or_wildcard =
            |given: Option<SocketAddr>, port| given.unwrap_or(SocketAddr::new(wildcard, port));
        let admin_ipv6 = (ipv6_enabled && self.admin_addr.is_none())
            .then(|| SocketAddr::new(Ipv6Addr::LOCALHOST.into(), admin_port));
        Listeners {
            outbound: or_wildcard(self.outbound_addr, OUTBOUND_PORT),
            inbound_plaintext: or_wildcard(self.inbound_plaintext_addr, INBOUND_PLAINTEXT_PORT),
            inbound: or_wildcard(self.inbound_addr, HBONE_PORT),
            admin: self
                .admin_addr
                .unwrap_or(SocketAddr::new(Ipv4Addr::LOCALHOST.into(), admin_port)),
            admin_ipv6,
            stats: or_wildcard(self.stats_addr, stats_port),
            readiness: or_wildcard(self.readiness_addr, READINESS_PORT),
            // istio/ztunnel's address, whatever IPV6_ENABLED says.
            socks5: self
                .unstable_enable_socks5
                .then(|| SocketAddr::new(Ipv4Addr::LOCALHOST.into(), SOCKS5_PORT)),
        }
    }
}
