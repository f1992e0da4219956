//! Asking the upstream resolver what the proxy does not answer itself
//! (AMBIENT.md §5.5): the query is relayed as the client sent it, over the
//! transport it came on, under an id of our own, from a socket of the
//! client pod's factory (its netns, marked so that the capture rules skip
//! it); the upstream's response comes back as it was, with the client's id
//! put back. A UDP response the upstream truncated reaches the client with
//! TC set, and the client's TCP retry is relayed over TCP.
//!
//! The upstreams are the nameservers of ztunnel's own resolv.conf (its
//! search list and options play no part: the client already expanded its
//! name), or a list the configuration gives.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hickory_resolver::system_conf::parse_resolv_conf;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::DnsError;
use super::wire::{self, Transport};
use crate::socket::SocketFactory;

/// How long one upstream has to answer one try (hickory's default, which
/// istio/ztunnel keeps), and the TCP connect timeout.
pub const TIMEOUT: Duration = Duration::from_secs(5);

/// Tries per upstream, each with [`TIMEOUT`] (hickory's default): one lost
/// datagram does not fail the client's query.
pub const ATTEMPTS: usize = 2;

/// The largest DNS message: the TCP length prefix is 16 bits, and UDP
/// responses never pass the 64 KiB datagram limit.
pub const MAX_MESSAGE: usize = 65_535;

/// The upstream resolvers of the DNS proxy.
#[derive(Debug, Clone)]
pub struct Forwarder {
    upstreams: Arc<[SocketAddr]>,
}

impl Forwarder {
    /// Forwards to `upstreams`, tried in order.
    pub fn new(upstreams: Vec<SocketAddr>) -> Forwarder {
        Forwarder {
            upstreams: upstreams.into(),
        }
    }

    /// Forwards to the nameservers (port 53) of the resolv.conf at `path`.
    pub fn from_resolv_conf(path: &Path) -> Result<Forwarder, DnsError> {
        let shared = || Arc::<Path>::from(path);
        let text = std::fs::read(path).map_err(|source| DnsError::ReadResolvConf {
            path: shared(),
            source,
        })?;
        let (config, _) = parse_resolv_conf(text).map_err(|source| DnsError::ParseResolvConf {
            path: shared(),
            reason: source.to_string(),
        })?;
        let upstreams: Vec<SocketAddr> = config
            .name_servers()
            .iter()
            .map(|server| SocketAddr::new(server.ip, 53))
            .collect();
        if upstreams.is_empty() {
            return Err(DnsError::NoUpstream(shared()));
        }
        Ok(Forwarder::new(upstreams))
    }

    /// Where queries go.
    pub fn upstreams(&self) -> &[SocketAddr] {
        &self.upstreams
    }

    /// The upstream's response to `query` (a request as the client sent
    /// it, `client_id` its id), over `transport`, with sockets of
    /// `sockets`: each upstream in order, [`ATTEMPTS`] times each, until
    /// one answers.
    pub async fn forward(
        &self,
        sockets: &dyn SocketFactory,
        query: &[u8],
        client_id: u16,
        transport: Transport,
    ) -> Result<Vec<u8>, DnsError> {
        let mut query = query.to_vec();
        let mut last = DnsError::NoUpstream(Arc::from(Path::new("the configuration")));
        for _ in 0..ATTEMPTS {
            for upstream in self.upstreams.iter().copied() {
                let id: u16 = rand::random();
                wire::set_id(&mut query, id);
                let asked = async {
                    match transport {
                        Transport::Udp => udp(sockets, upstream, &query, id).await,
                        Transport::Tcp => tcp(sockets, upstream, &query).await,
                    }
                };
                match tokio::time::timeout(TIMEOUT, asked).await {
                    Ok(Ok(mut response)) => {
                        wire::set_id(&mut response, client_id);
                        return Ok(response);
                    }
                    Ok(Err(error)) => last = error,
                    Err(_) => last = DnsError::UpstreamTimeout(upstream),
                }
            }
        }
        Err(last)
    }
}

/// One UDP exchange with `upstream`: the first datagram that carries our
/// `id` and is a response is the answer; anything else that arrives on the
/// connected socket is dropped.
async fn udp(
    sockets: &dyn SocketFactory,
    upstream: SocketAddr,
    query: &[u8],
    id: u16,
) -> Result<Vec<u8>, DnsError> {
    let io = |source| DnsError::Upstream { upstream, source };
    let socket = sockets.udp_socket(upstream).map_err(io)?;
    socket.connect(upstream).await.map_err(io)?;
    socket.send(query).await.map_err(io)?;
    let mut buffer = vec![0; MAX_MESSAGE];
    loop {
        let length = socket.recv(&mut buffer).await.map_err(io)?;
        let response = &buffer[..length];
        let ours = response.len() >= 3
            && u16::from_be_bytes([response[0], response[1]]) == id
            && response[2] & 0x80 != 0;
        if ours {
            return Ok(response.to_vec());
        }
    }
}

/// One TCP exchange with `upstream`: a fresh connection, the query and
/// the response each behind their two-byte length.
async fn tcp(
    sockets: &dyn SocketFactory,
    upstream: SocketAddr,
    query: &[u8],
) -> Result<Vec<u8>, DnsError> {
    let io = |source| DnsError::Upstream { upstream, source };
    let length = u16::try_from(query.len()).map_err(|_| DnsError::TooLarge(query.len()))?;
    let socket = sockets.tcp_socket(upstream, None).map_err(io)?;
    let mut stream = socket.connect(upstream).await.map_err(io)?;
    let mut framed = Vec::with_capacity(query.len() + 2);
    framed.extend_from_slice(&length.to_be_bytes());
    framed.extend_from_slice(query);
    stream.write_all(&framed).await.map_err(io)?;
    let length = stream.read_u16().await.map_err(io)?;
    let mut response = vec![0; usize::from(length)];
    stream.read_exact(&mut response).await.map_err(io)?;
    Ok(response)
}

#[cfg(test)]
mod tests;
