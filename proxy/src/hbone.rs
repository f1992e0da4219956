//! HBONE (WIRE.md §4): TCP tunneled in HTTP/2 `CONNECT` streams over mesh
//! mTLS. The dialing side is `hbone/client.rs`, the tunnel inside a tunnel
//! through a network gateway `hbone/double.rs`, the accepting side
//! `hbone/server.rs`, the stream-as-socket adapter `hbone/stream.rs`, the
//! request headers `hbone/headers.rs`, and `baggage` in both directions
//! `hbone/baggage.rs`. What is shared lives here: the h2
//! settings, the parsed `:authority`, and the PING keepalive. The TLS
//! stream under h2 is `ztunnel_certs::tls::record`'s.
//!
//! Pooling of client connections lives in `pool.rs`; copying bytes in `copy.rs`.

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use h2::{Ping, PingPong};
use ztunnel_certs::error_chain::ErrorChain;

use crate::config::Http2Settings;

mod baggage;
mod client;
mod double;
mod headers;
mod server;
mod stream;

pub use baggage::{Baggage, WorkloadLabels, baggage};
pub use client::{HboneConnection, HboneError, connect};
pub use double::connect_inner;
pub use headers::{
    BAGGAGE, FORWARDED, HeaderError, TRACEPARENT, X_FORWARDED_NETWORK, connect_headers, forwarded,
    forwarded_host, traceparent,
};
pub use server::{
    AcceptedClient, InboundHandler, InboundRefusal, InboundRequest, ServedClient, ServerError,
    accept_tls, serve_connection,
};
pub use stream::{ActiveStream, H2Stream};

/// The HTTP/2 settings of both sides (WIRE.md §4 "HTTP/2 settings"). The
/// defaults are ztunnel's; `HTTP2_*` configuration overrides the windows and
/// the frame size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct H2Settings {
    /// Initial stream window: 4 MiB lets one stream fill a 1 Gbit/s, 30 ms
    /// path without waiting for WINDOW_UPDATE.
    pub stream_window: u32,
    /// Connection window: 16 MiB, four streams' worth, so that a few bulk
    /// streams do not starve each other.
    pub connection_window: u32,
    /// Max frame size: 1 MiB, large frames cut per-frame overhead in bulk.
    pub max_frame_size: u32,
    /// Max header list the client accepts: 16 KiB, responses carry few headers.
    pub client_max_header_list: u32,
    /// Max header list the server accepts: 64 KiB bounds per-request memory.
    pub server_max_header_list: u32,
    /// Streams the server lets one peer open at once: 200 bounds one peer's
    /// share of the proxy.
    pub server_max_concurrent_streams: u32,
    /// Streams the client assumes it may open before the peer's SETTINGS
    /// arrive: 100, as ztunnel.
    pub client_initial_max_streams: usize,
    /// Client send buffer per stream: one stream window (4 MiB) keeps a
    /// window's worth in flight.
    pub client_send_buffer: usize,
    /// Server send buffer per stream: 400 KiB bounds memory across 200
    /// streams per connection.
    pub server_send_buffer: usize,
    /// First PING this long after the handshake, then this often.
    pub keepalive_interval: Duration,
    /// A PING unanswered this long closes the connection: the peer is gone.
    pub keepalive_timeout: Duration,
    /// How long the server waits for the client's connection preface once
    /// TLS is done: 5 s. Ours and Istio's clients write it right after
    /// their TLS handshake, with the first CONNECT behind it, so a few
    /// seconds cover any round trip; without a bound, an authenticated
    /// client that goes silent holds its socket and TLS state until TCP
    /// gives up.
    pub server_preface_timeout: Duration,
    /// How long the server waits for the first CONNECT after the preface:
    /// 5 s, as a client dials only when it has a request to send. After
    /// that, h2 PINGs keep a connection's liveness in check.
    pub server_first_request_timeout: Duration,
    /// Streams the client reset before the server accepted them, held at
    /// once, after which the connection is closed (ENHANCE_YOUR_CALM):
    /// 20, h2's own default, set here so that an upgrade cannot loosen it.
    /// The rapid-reset attack (CVE-2023-44487) opens and resets streams
    /// faster than they are accepted.
    pub server_max_pending_accept_reset_streams: usize,
    /// Streams the server resets for the client's protocol errors before
    /// it closes the connection (ENHANCE_YOUR_CALM): 1024, h2's default,
    /// which no conforming client comes near; each error costs the server
    /// a reset to write, so a client must not force them without end.
    pub server_max_local_error_resets: usize,
}

impl Default for H2Settings {
    fn default() -> H2Settings {
        const MIB: u32 = 1024 * 1024;
        H2Settings {
            stream_window: 4 * MIB,
            connection_window: 16 * MIB,
            max_frame_size: MIB,
            client_max_header_list: 16 * 1024,
            server_max_header_list: 64 * 1024,
            server_max_concurrent_streams: 200,
            client_initial_max_streams: 100,
            client_send_buffer: 4 * MIB as usize,
            server_send_buffer: 400 * 1024,
            keepalive_interval: Duration::from_secs(10),
            keepalive_timeout: Duration::from_secs(20),
            server_preface_timeout: Duration::from_secs(5),
            server_first_request_timeout: Duration::from_secs(5),
            server_max_pending_accept_reset_streams: 20,
            server_max_local_error_resets: 1024,
        }
    }
}

impl From<&Http2Settings> for H2Settings {
    /// The configured windows and frame size; a client stream buffers up to
    /// one stream window.
    fn from(settings: &Http2Settings) -> H2Settings {
        H2Settings {
            stream_window: settings.stream_window,
            connection_window: settings.connection_window,
            max_frame_size: settings.frame_size,
            client_send_buffer: settings.stream_window as usize,
            ..H2Settings::default()
        }
    }
}

/// A CONNECT `:authority`: where the tunnel should lead.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Authority {
    /// `ip:port`: a workload address or a service VIP.
    Address(SocketAddr),
    /// `host:port`: a service hostname (double HBONE through a gateway).
    Hostname {
        /// The service hostname, checked to be a DNS name.
        host: Arc<str>,
        /// The service port.
        port: u16,
    },
}

/// Why an `:authority` is neither `ip:port` nor `host:port`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthorityError {
    /// No `:port` at the end, or a port that is not a number in 1..=65535.
    #[error("authority has no valid port")]
    Port,
    /// The host part is neither an IP address nor a DNS name.
    #[error("authority host is neither an IP address nor a DNS name")]
    Host,
}

impl FromStr for Authority {
    type Err = AuthorityError;

    fn from_str(text: &str) -> Result<Authority, AuthorityError> {
        if let Ok(address) = text.parse::<SocketAddr>() {
            return match address.port() {
                0 => Err(AuthorityError::Port),
                _ => Ok(Authority::Address(address)),
            };
        }
        let (host, port) = text.rsplit_once(':').ok_or(AuthorityError::Port)?;
        let port = match port.parse::<u16>() {
            Ok(0) | Err(_) => return Err(AuthorityError::Port),
            Ok(port) => port,
        };
        if !is_dns_name(host) {
            return Err(AuthorityError::Host);
        }
        Ok(Authority::Hostname {
            host: Arc::from(host),
            port,
        })
    }
}

/// The `:authority` text: `ip:port` (IPv6 in brackets) or `host:port`,
/// which [`Authority::from_str`] reads back.
impl fmt::Display for Authority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Authority::Address(address) => write!(f, "{address}"),
            Authority::Hostname { host, port } => write!(f, "{host}:{port}"),
        }
    }
}

/// Letters, digits, `-` and `.`, labels of 1 to 63 characters, at most 253 in
/// all, not all digits (that would be a malformed IPv4 address).
fn is_dns_name(host: &str) -> bool {
    let label_ok = |label: &str| {
        (1..=63).contains(&label.len())
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    };
    (1..=253).contains(&host.len())
        && host.split('.').all(label_ok)
        && !host.bytes().all(|b| b.is_ascii_digit() || b == b'.')
}

/// Sends a PING every `interval` after an initial `interval`, and returns
/// when one goes unanswered for `timeout` or the connection is gone. Run it
/// beside the connection and close the connection when it returns.
///
/// Bounded in time: each turn waits at most `interval + timeout`, and the
/// loop ends with the connection.
async fn keepalive(mut ping_pong: PingPong, interval: Duration, timeout: Duration) {
    loop {
        tokio::time::sleep(interval).await;
        match tokio::time::timeout(timeout, ping_pong.ping(Ping::opaque())).await {
            Ok(Ok(_pong)) => {}
            Ok(Err(error)) => {
                tracing::debug!(error = %ErrorChain(&error), "keepalive stopped: connection closed");
                return;
            }
            Err(_elapsed) => {
                tracing::debug!(?timeout, "keepalive PING unanswered; closing");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authority_forms() {
        let host = |host: &str, port| Authority::Hostname {
            host: Arc::from(host),
            port,
        };
        let cases: [(&str, Result<Authority, AuthorityError>); 12] = [
            (
                "10.0.0.1:8080",
                Ok(Authority::Address("10.0.0.1:8080".parse().unwrap())),
            ),
            (
                "[fd00::1]:80",
                Ok(Authority::Address("[fd00::1]:80".parse().unwrap())),
            ),
            (
                "reviews.default.svc.cluster.local:9080",
                Ok(host("reviews.default.svc.cluster.local", 9080)),
            ),
            ("localhost:1", Ok(host("localhost", 1))),
            ("10.0.0.1", Err(AuthorityError::Port)),
            ("10.0.0.1:0", Err(AuthorityError::Port)),
            ("10.0.0.1:70000", Err(AuthorityError::Port)),
            ("host:", Err(AuthorityError::Port)),
            ("fd00::1:80", Err(AuthorityError::Host)),
            ("999.1.1.1:80", Err(AuthorityError::Host)),
            ("bad_host:80", Err(AuthorityError::Host)),
            (":80", Err(AuthorityError::Host)),
        ];
        for (text, expected) in cases {
            let parsed = text.parse::<Authority>();
            assert_eq!(parsed, expected, "{text}");
            if let Ok(authority) = parsed {
                assert_eq!(authority.to_string(), text, "the text reads back");
            }
        }
    }
}
