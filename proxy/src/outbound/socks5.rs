//! SOCKS5 on 127.0.0.1:15080 (`UNSTABLE_ENABLE_SOCKS5`), as istio/ztunnel
//! offers it: an application that cannot be captured names its
//! destination to the proxy instead, and the connection is routed and
//! carried exactly as a captured one (`outbound.rs`): mesh destinations
//! over HBONE with the pod's own identity, the rest passed through.
//!
//! Only what common clients use (RFC 1928): no authentication, CONNECT,
//! and IPv4, IPv6 or a hostname. A mesh service's hostname is its VIP on
//! our network; any other name is looked up with the node's resolver.
//! Unlike istio/ztunnel, the success reply is sent once the upstream is
//! connected, so a client learns of a refusal from the reply rather than
//! from a close after it; and the negotiation has a deadline, so a client
//! that stops sending holds nothing for long.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use ztunnel_certs::error_chain::ErrorChain;

use super::{carry, open_to};
use crate::accept;
use crate::capacity::Listener;
use crate::context::Proxy;
use crate::socket::canonical;

/// How long a client may take to say where it goes: the greeting and the
/// request are a few dozen bytes, sent at once by every client.
const NEGOTIATION_TIMEOUT: Duration = Duration::from_secs(10);

/// The protocol version byte.
const VERSION: u8 = 5;
/// "No authentication required".
const NO_AUTHENTICATION: u8 = 0;
/// "No acceptable methods".
const NO_ACCEPTABLE_METHOD: u8 = 0xff;

/// Where the client asked to go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// An address.
    Address(SocketAddr),
    /// A hostname and port, resolved by the proxy.
    Hostname(String, u16),
}

/// Why a SOCKS5 connection was not carried; each has its reply code
/// (`Socks5Error::reply`), sent where the protocol has one.
#[derive(Debug, thiserror::Error)]
pub enum Socks5Error {
    /// Reading or writing the client failed, or it closed.
    #[error("talking to the SOCKS client")]
    Io(#[from] io::Error),
    /// The client did not finish within `NEGOTIATION_TIMEOUT`.
    #[error("the SOCKS negotiation took too long")]
    TimedOut,
    /// Not version 5.
    #[error("SOCKS version {0} is not supported")]
    Version(u8),
    /// The client offered no method, or none without authentication.
    #[error("the SOCKS client offers no method without authentication")]
    NoAcceptableMethod,
    /// BIND or UDP ASSOCIATE.
    #[error("SOCKS command {0} is not supported (CONNECT only)")]
    Command(u8),
    /// An address type other than IPv4, IPv6 or a domain name.
    #[error("SOCKS address type {0} is not supported")]
    AddressType(u8),
    /// The domain name is not UTF-8 or is empty.
    #[error("the SOCKS domain name is not a name")]
    BadName,
    /// The hostname resolves to nothing.
    #[error("{0} resolves to no address")]
    Unresolved(String),
    /// Routing or connecting the upstream failed (logged and reported by
    /// the outbound path).
    #[error("the destination could not be reached")]
    Unreachable,
}

impl Socks5Error {
    /// The reply code of RFC 1928 §6 this error is answered with; `None`
    /// where nothing more can be sent.
    fn reply(&self) -> Option<u8> {
        match self {
            Socks5Error::Io(_) | Socks5Error::TimedOut | Socks5Error::NoAcceptableMethod => None,
            Socks5Error::Version(_) | Socks5Error::BadName => Some(0x01),
            Socks5Error::Unresolved(_) => Some(0x04),
            Socks5Error::Unreachable => Some(0x05),
            Socks5Error::Command(_) => Some(0x07),
            Socks5Error::AddressType(_) => Some(0x08),
        }
    }
}

/// A reply with `code` and no bound address (`0.0.0.0:0`), as
/// istio/ztunnel sends: clients read and skip it.
fn reply(code: u8) -> [u8; 10] {
    [VERSION, code, 0, 1, 0, 0, 0, 0, 0, 0]
}

/// Reads the greeting and the request and answers the greeting; the
/// target, or why not (not yet answered).
async fn negotiate(stream: &mut TcpStream) -> Result<Target, Socks5Error> {
    let mut head = [0u8; 2];
    stream.read_exact(&mut head).await?;
    let [version, count] = head;
    if version != VERSION {
        return Err(Socks5Error::Version(version));
    }
    // At most 255 methods: a count byte bounds the read.
    let mut methods = vec![0u8; usize::from(count)];
    stream.read_exact(&mut methods).await?;
    if !methods.contains(&NO_AUTHENTICATION) {
        stream.write_all(&[VERSION, NO_ACCEPTABLE_METHOD]).await?;
        return Err(Socks5Error::NoAcceptableMethod);
    }
    stream.write_all(&[VERSION, NO_AUTHENTICATION]).await?;
    let mut request = [0u8; 4];
    stream.read_exact(&mut request).await?;
    let [version, command, _reserved, address_type] = request;
    if version != VERSION {
        return Err(Socks5Error::Version(version));
    }
    if command != 1 {
        return Err(Socks5Error::Command(command));
    }
    let target = match address_type {
        1 => {
            let mut octets = [0u8; 4];
            stream.read_exact(&mut octets).await?;
            let port = stream.read_u16().await?;
            Target::Address(SocketAddr::new(Ipv4Addr::from(octets).into(), port))
        }
        4 => {
            let mut octets = [0u8; 16];
            stream.read_exact(&mut octets).await?;
            let port = stream.read_u16().await?;
            Target::Address(canonical(SocketAddr::new(
                Ipv6Addr::from(octets).into(),
                port,
            )))
        }
        3 => {
            let length = stream.read_u8().await?;
            // At most 255 bytes: the length byte bounds the read.
            let mut name = vec![0u8; usize::from(length)];
            stream.read_exact(&mut name).await?;
            let port = stream.read_u16().await?;
            let name = String::from_utf8(name).map_err(|_| Socks5Error::BadName)?;
            let name = name.trim_end_matches('.').to_ascii_lowercase();
            if name.is_empty() {
                return Err(Socks5Error::BadName);
            }
            Target::Hostname(name, port)
        }
        other => return Err(Socks5Error::AddressType(other)),
    };
    Ok(target)
}

/// The address `target` names: a mesh service's VIP on our network for
/// its hostname, else what the node's resolver finds first.
async fn resolve(proxy: &Proxy, target: Target) -> Result<SocketAddr, Socks5Error> {
    let (name, port) = match target {
        Target::Address(address) => return Ok(address),
        Target::Hostname(name, port) => (name, port),
    };
    let vip = {
        let state = proxy.node.state.read();
        state.service_by_hostname(&name).and_then(|service| {
            service
                .vips
                .iter()
                .find(|vip| *vip.network == *proxy.node.config.network)
                .map(|vip| vip.address)
        })
    };
    if let Some(vip) = vip {
        return Ok(SocketAddr::new(vip, port));
    }
    let name: Arc<str> = name.into();
    match proxy.node.resolver.lookup(&name).await {
        Ok(addresses) => addresses
            .first()
            .map(|address| SocketAddr::new(*address, port))
            .ok_or_else(|| Socks5Error::Unresolved(name.to_string())),
        Err(error) => {
            tracing::debug!(%name, error = %ErrorChain(&error), "SOCKS hostname not resolved");
            Err(Socks5Error::Unresolved(name.to_string()))
        }
    }
}

/// Accepts SOCKS5 connections until the drain; each holds a slot of the
/// pod's share, as a captured outbound connection does.
pub async fn serve(proxy: Arc<Proxy>, listener: TcpListener) {
    let (drain, metrics) = (proxy.drain.clone(), Arc::clone(&proxy.node.metrics));
    let admit = || proxy.share.admit(Listener::Socks5);
    accept::serve(listener, "socks5", drain, &metrics, admit, |tcp, peer, slot| {
        let proxy = Arc::clone(&proxy);
        tokio::spawn(async move {
            if let Err(error) = Box::pin(handle(&proxy, tcp, canonical(peer))).await {
                tracing::debug!(%peer, error = %ErrorChain(&error), "SOCKS connection not carried");
            }
            drop(slot);
        });
    })
    .await;
}

/// One SOCKS5 connection: negotiated, routed, answered, then carried.
async fn handle(proxy: &Proxy, mut tcp: TcpStream, peer: SocketAddr) -> Result<(), Socks5Error> {
    let outcome = async {
        let target = tokio::time::timeout(NEGOTIATION_TIMEOUT, negotiate(&mut tcp))
            .await
            .map_err(|_| Socks5Error::TimedOut)??;
        let target = resolve(proxy, target).await?;
        open_to(proxy, peer, target)
            .await
            .ok_or(Socks5Error::Unreachable)
    }
    .await;
    match outcome {
        Ok(opened) => {
            tcp.write_all(&reply(0)).await?;
            carry(proxy, tcp, opened).await;
            Ok(())
        }
        Err(error) => {
            if let Some(code) = error.reply() {
                // The client may be gone already; the error is what counts.
                let _ = tcp.write_all(&reply(code)).await;
            }
            Err(error)
        }
    }
}

/// Binds the SOCKS5 listener in the current namespace, with SO_REUSEPORT
/// as the other listeners, so that a new ztunnel beside the old one in a
/// rollout binds it too.
pub fn bind(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        None,
    )?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    Ok(socket.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_refusal_has_its_rfc_1928_reply_or_none() {
        let rows: &[(Socks5Error, Option<u8>, &str)] = &[
            (
                Socks5Error::Command(2),
                Some(0x07),
                "BIND: command not supported",
            ),
            (
                Socks5Error::AddressType(9),
                Some(0x08),
                "address type not supported",
            ),
            (
                Socks5Error::Unresolved("x".into()),
                Some(0x04),
                "host unreachable",
            ),
            (Socks5Error::Unreachable, Some(0x05), "connection refused"),
            (Socks5Error::Version(4), Some(0x01), "general failure"),
            (
                Socks5Error::NoAcceptableMethod,
                None,
                "answered 0xff in the greeting",
            ),
            (Socks5Error::TimedOut, None, "a silent client gets nothing"),
        ];
        for (error, code, reason) in rows {
            assert_eq!(error.reply(), *code, "{reason}");
        }
        assert_eq!(reply(0x05), [5, 5, 0, 1, 0, 0, 0, 0, 0, 0]);
    }
}
