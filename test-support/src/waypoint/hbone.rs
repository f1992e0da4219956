//! A minimal HBONE (WIRE.md §4) for the test peers and for tests that talk
//! to ztunnels directly: the accepting side (TLS 1.3 with a required client
//! certificate, h2, one [`Connect`] per CONNECT stream), the dialing side
//! ([`connect`], [`dial`], [`tcp_connect`]) and a CONNECT stream as a byte stream
//! ([`Tunnel`]). Certificates and TLS configurations are `ztunnel-certs`'s:
//! the server config admits clients of its own trust domain only, the client
//! config accepts only the expected server identities.
//!
//! This is not the proxy's HBONE (`proxy/src/hbone/`): it is written apart
//! from it on purpose, with `h2` and `tokio-rustls`, so that tests of the
//! proxy meet a peer that is not built from the code under test. No pooling,
//! no keepalive, no metrics.

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use h2::{RecvStream, SendStream};
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::timeout;
use tokio_rustls::rustls::{ClientConfig, ServerConfig};
use tokio_rustls::{TlsAcceptor, TlsConnector};
use ztunnel_certs::identity::Identity;
use ztunnel_certs::tls::{dummy_server_name, peer_identity};

/// How long a TCP connect, a TLS handshake, an h2 handshake or the answer
/// to a CONNECT may take: generous for a loaded test machine, short enough
/// that a test that cannot connect fails rather than hangs.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// Initial stream window, both sides: ztunnel's 4 MiB (WIRE.md §4), so a
/// bulk transfer through a test peer is not held back by h2's 64 KiB default.
const STREAM_WINDOW: u32 = 4 * 1024 * 1024;

/// Connection window, both sides: ztunnel's 16 MiB, four streams' worth.
const CONNECTION_WINDOW: u32 = 16 * 1024 * 1024;

/// Streams one client may open at once on a test server: ztunnel's 200.
const MAX_CONCURRENT_STREAMS: u32 = 200;

/// Why an HBONE exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum HboneError {
    /// The TCP connect, or reading the peer's address, failed.
    #[error("tcp")]
    Io(#[from] io::Error),
    /// A handshake or the CONNECT's answer took longer than
    /// [`HANDSHAKE_TIMEOUT`].
    #[error("timed out after {HANDSHAKE_TIMEOUT:?}")]
    Timeout,
    /// The TLS handshake failed (version, certificate, identity).
    #[error("tls handshake")]
    Tls(#[source] io::Error),
    /// The TLS handshake completed without a client identity (cannot
    /// happen with `ztunnel-certs`'s server config, which requires one).
    #[error("the client presented no SPIFFE identity")]
    NoPeerIdentity,
    /// HTTP/2 failed: the handshake, a reset, a GOAWAY.
    #[error("http/2")]
    H2(#[from] h2::Error),
    /// The CONNECT request could not be built (a malformed authority or
    /// header).
    #[error("building the CONNECT request")]
    Request(#[from] http::Error),
    /// The peer answered the CONNECT with something other than 200.
    #[error("CONNECT answered {0}")]
    Refused(StatusCode),
}

impl HboneError {
    /// The status a peer refused the CONNECT with, if that is what failed.
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            HboneError::Refused(status) => Some(*status),
            _ => None,
        }
    }
}

/// An established CONNECT stream, read and written as a byte stream. Shutting
/// down the write side sends END_STREAM (a half-close); a read of 0 bytes
/// means the peer half-closed. Dropping it resets the stream if it is open.
#[derive(Debug)]
pub struct Tunnel {
    send: SendStream<Bytes>,
    recv: RecvStream,
    /// What the last DATA frame held beyond what the reader asked for.
    pending: Bytes,
}

impl Tunnel {
    fn new(send: SendStream<Bytes>, recv: RecvStream) -> Tunnel {
        Tunnel {
            send,
            recv,
            pending: Bytes::new(),
        }
    }
}

impl AsyncRead for Tunnel {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        // Empty DATA frames are skipped: returning none of their bytes
        // would read as the end of the stream. Each turn takes one frame
        // off h2's queue, so this ends at the first pending poll.
        while this.pending.is_empty() {
            match ready!(this.recv.poll_data(cx)) {
                None => return Poll::Ready(Ok(())),
                Some(Err(error)) => return Poll::Ready(Err(io_error(error))),
                Some(Ok(data)) => {
                    // The window reopens as soon as the frame is taken: the
                    // tunnel holds at most one frame.
                    this.recv
                        .flow_control()
                        .release_capacity(data.len())
                        .map_err(io_error)?;
                    this.pending = data;
                }
            }
        }
        let n = this.pending.len().min(buf.remaining());
        buf.put_slice(&this.pending.split_to(n));
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Tunnel {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let send = &mut self.send;
        send.reserve_capacity(buf.len());
        // h2 may report a capacity change that leaves none (the capacity
        // went to another frame); asking again then waits for more.
        for _ in 0..2 {
            match ready!(send.poll_capacity(cx)) {
                None => return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into())),
                Some(Err(error)) => return Poll::Ready(Err(io_error(error))),
                Some(Ok(0)) => continue,
                Some(Ok(capacity)) => {
                    let n = capacity.min(buf.len());
                    send.send_data(Bytes::copy_from_slice(&buf[..n]), false)
                        .map_err(io_error)?;
                    return Poll::Ready(Ok(n));
                }
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // h2 sends what it holds as the connection task runs.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(self.send.send_data(Bytes::new(), true).map_err(io_error))
    }
}

fn io_error(error: h2::Error) -> io::Error {
    if error.is_io() {
        return error
            .into_io()
            .unwrap_or_else(|| io::ErrorKind::Other.into());
    }
    io::Error::other(error)
}

/// A CONNECT request a server accepted from a verified client, waiting to be
/// answered: [`Connect::accept`] answers 200 and opens the tunnel,
/// [`Connect::refuse`] answers another status and ends the stream.
#[derive(Debug)]
pub struct Connect {
    /// The client's SPIFFE identity, from its verified certificate.
    pub identity: Identity,
    /// The TCP peer of the HBONE connection.
    pub peer: SocketAddr,
    /// The `:authority`: where the client asks to go.
    pub authority: String,
    /// The request headers (`baggage`, `forwarded`, `traceparent`, ...).
    pub headers: HeaderMap,
    respond: h2::server::SendResponse<Bytes>,
    body: RecvStream,
}

impl Connect {
    /// A header's value, if present and text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name)?.to_str().ok()
    }

    /// Answers 200 and returns the stream as a tunnel.
    pub fn accept(mut self) -> Result<Tunnel, HboneError> {
        let send = self.respond.send_response(Response::new(()), false)?;
        Ok(Tunnel::new(send, self.body))
    }

    /// Answers `status` and ends the stream.
    pub fn refuse(mut self, status: StatusCode) {
        let mut response = Response::new(());
        *response.status_mut() = status;
        // The client may be gone already; there is no one left to tell.
        let _ = self.respond.send_response(response, true);
    }
}

/// Serves one accepted TCP connection as HBONE: the TLS handshake with
/// `config` (from `WorkloadCertificate::server_config`), h2, then `handler`
/// on a task of its own for each CONNECT. A request that is not a CONNECT
/// with an authority is answered 400 here. Returns when the client closes
/// the connection.
pub async fn serve_connection<H, F>(
    tcp: TcpStream,
    config: Arc<ServerConfig>,
    handler: H,
) -> Result<(), HboneError>
where
    H: Fn(Connect) -> F,
    F: Future<Output = ()> + Send + 'static,
{
    let peer = tcp.peer_addr()?;
    let tls = timeout(HANDSHAKE_TIMEOUT, TlsAcceptor::from(config).accept(tcp))
        .await
        .map_err(|_| HboneError::Timeout)?
        .map_err(HboneError::Tls)?;
    let identity = peer_identity(tls.get_ref().1).ok_or(HboneError::NoPeerIdentity)?;
    let handshake = h2::server::Builder::new()
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
        .handshake::<_, Bytes>(tls);
    let mut connection = timeout(HANDSHAKE_TIMEOUT, handshake)
        .await
        .map_err(|_| HboneError::Timeout)??;
    while let Some(next) = connection.accept().await {
        let (request, mut respond) = next?;
        let authority = request.uri().authority().map(|a| a.as_str().to_owned());
        let (parts, body) = request.into_parts();
        let Some(authority) = authority.filter(|_| parts.method == Method::CONNECT) else {
            let mut response = Response::new(());
            *response.status_mut() = StatusCode::BAD_REQUEST;
            let _ = respond.send_response(response, true);
            continue;
        };
        tokio::spawn(handler(Connect {
            identity: identity.clone(),
            peer,
            authority,
            headers: parts.headers,
            respond,
            body,
        }));
    }
    Ok(())
}

/// Opens an HBONE tunnel over `io`: the TLS handshake with `config` (from
/// `ztunnel_certs::tls::client_config`, which names the identities the
/// server may have), h2, and one CONNECT to `authority` with `headers`.
/// Succeeds only on a 200. `io` is a TCP stream, or another [`Tunnel`] for
/// the inner session of double HBONE.
pub async fn connect<IO>(
    io: IO,
    config: Arc<ClientConfig>,
    authority: &str,
    headers: HeaderMap,
) -> Result<Tunnel, HboneError>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let tls = timeout(
        HANDSHAKE_TIMEOUT,
        TlsConnector::from(config).connect(dummy_server_name(), io),
    )
    .await
    .map_err(|_| HboneError::Timeout)?
    .map_err(HboneError::Tls)?;
    let handshake = h2::client::Builder::new()
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .enable_push(false)
        .handshake::<_, Bytes>(tls);
    let (sender, connection) = timeout(HANDSHAKE_TIMEOUT, handshake)
        .await
        .map_err(|_| HboneError::Timeout)??;
    // Ends once the tunnel is done: `sender`, the only request handle, is
    // dropped below.
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut sender = timeout(HANDSHAKE_TIMEOUT, sender.ready())
        .await
        .map_err(|_| HboneError::Timeout)??;
    let mut request = Request::builder()
        .method(Method::CONNECT)
        .uri(authority)
        .body(())?;
    *request.headers_mut() = headers;
    let (response, send) = sender.send_request(request, false)?;
    let response = timeout(HANDSHAKE_TIMEOUT, response)
        .await
        .map_err(|_| HboneError::Timeout)??;
    if response.status() != StatusCode::OK {
        return Err(HboneError::Refused(response.status()));
    }
    Ok(Tunnel::new(send, response.into_body()))
}

/// [`connect`] over a new TCP connection to `addr` (an HBONE port, 15008).
pub async fn dial(
    addr: SocketAddr,
    config: Arc<ClientConfig>,
    authority: &str,
    headers: HeaderMap,
) -> Result<Tunnel, HboneError> {
    connect(tcp_connect(None, addr).await?, config, authority, headers).await
}

/// A TCP connection to `addr`, from `source` if given, within
/// [`HANDSHAKE_TIMEOUT`].
pub async fn tcp_connect(
    source: Option<IpAddr>,
    addr: SocketAddr,
) -> Result<TcpStream, HboneError> {
    let socket = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    if let Some(source) = source {
        socket.bind(SocketAddr::new(source, 0))?;
    }
    socket.set_nodelay(true)?;
    timeout(HANDSHAKE_TIMEOUT, socket.connect(addr))
        .await
        .map_err(|_| HboneError::Timeout)?
        .map_err(HboneError::Io)
}

/// The `forwarded` value that names `client` as the original client, in
/// ztunnel's form (WIRE.md §4): `for="ip:port"`, IPv6 in brackets.
pub fn forwarded_for(client: SocketAddr) -> HeaderValue {
    // An address prints as ASCII only, which is always a valid value.
    HeaderValue::from_str(&format!("for=\"{client}\""))
        .unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// Echoes a tunnel: writes back what it reads until the peer half-closes,
/// then half-closes too.
pub async fn echo(tunnel: Tunnel) -> io::Result<u64> {
    let (mut reader, mut writer) = tokio::io::split(tunnel);
    let copied = tokio::io::copy(&mut reader, &mut writer).await?;
    writer.shutdown().await?;
    Ok(copied)
}
