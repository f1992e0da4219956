//! The dialing side of HBONE: mTLS over a connected TCP socket (or, for the
//! inner tunnel of double HBONE, over an outer CONNECT stream), the h2
//! client handshake with our settings, the connection driver with its PING
//! keepalive, and CONNECT requests on the result.
//!
//! A connection whose server certificate a revocation list revokes while
//! it is open (`revocation.rs`) is dropped at once by its driver: it leaves
//! the pool, and its streams stop and report why.
//!
//! Which connection to reuse for which destination is `pool.rs`'s decision;
//! the tunnel inside a tunnel is `hbone/double.rs`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use h2::client::SendRequest;
use http::uri::{Authority as UriAuthority, InvalidUri};
use http::{HeaderMap, Method, Request, StatusCode, Uri, Version};
use rustls::ClientConfig;
use tokio::io::{AsyncRead, AsyncWrite};
use ztunnel_certs::error_chain::ErrorChain;
use ztunnel_certs::identity::Identity;
use ztunnel_certs::tls::record::{self, HandshakeError};
use ztunnel_certs::tls::revocation::Revocation;
use ztunnel_certs::tls::{ALPN_H2, dummy_server_name};

use crate::hbone::Authority;
use crate::hbone::baggage::Baggage;
use crate::hbone::headers::BAGGAGE;
use crate::hbone::stream::{ActiveStream, H2Stream};
use crate::hbone::{H2Settings, keepalive};
use crate::revocation::RevocationWatch;

/// Why an HBONE connection or a CONNECT on it failed.
#[derive(Debug, thiserror::Error)]
pub enum HboneError {
    /// The TCP connection to the peer's HBONE port failed or timed out.
    #[error("connecting to the HBONE peer")]
    Connect(#[source] std::io::Error),
    /// The TLS client configuration could not be built.
    #[error("TLS configuration")]
    TlsConfig(#[from] ztunnel_certs::tls::TlsError),
    /// The TLS handshake failed: a wrong server identity, an unknown CA, or a
    /// broken connection.
    #[error("TLS handshake failed")]
    Tls(#[source] HandshakeError),
    /// The server did not agree to speak h2 over the TLS session.
    #[error("server did not negotiate ALPN h2")]
    NoAlpnH2,
    /// The server's certificate carries no SPIFFE identity.
    #[error("server certificate carries no SPIFFE identity")]
    NoPeerIdentity,
    /// The h2 handshake, the request, or the connection failed (GOAWAY,
    /// reset, I/O error).
    #[error("HTTP/2")]
    H2(#[from] h2::Error),
    /// The authority is not a valid URI authority.
    #[error("invalid CONNECT authority")]
    Authority(#[from] InvalidUri),
    /// The request could not be assembled from the given parts.
    #[error("invalid CONNECT request")]
    Request(#[from] http::Error),
    /// The server answered the CONNECT with something other than 200.
    #[error("CONNECT answered with status {0}")]
    Status(StatusCode),
}

/// An established HBONE client connection. Cheap to clone; the connection
/// closes once every clone and every stream on it is dropped.
#[derive(Clone)]
pub struct HboneConnection {
    send_request: SendRequest<Bytes>,
    shared: Arc<Shared>,
}

/// State shared between the handles and the connection driver.
struct Shared {
    /// Set by the driver when the connection ended (error, GOAWAY
    /// completed, keepalive timeout).
    closed: AtomicBool,
    /// Open streams, counted by [`ActiveStream`] guards.
    active: Arc<AtomicUsize>,
    /// The server's SPIFFE identity, for logs and the pool's view.
    peer: Identity,
    /// Largest DATA chunk one write hands to h2.
    max_write: usize,
    /// Fires when the server is revoked; each stream holds a copy.
    revocation: Option<Revocation>,
}

impl std::fmt::Debug for HboneConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HboneConnection")
            .field("peer", &self.shared.peer)
            .field("active_streams", &self.active_streams())
            .field("ready", &self.is_ready())
            .finish()
    }
}

/// Runs TLS (no SNI, ALPN h2) and the h2 client handshake over `io`, a
/// connected TCP socket or an outer tunnel's stream, then spawns the
/// connection driver with its keepalive. The server's identity is checked
/// by `tls`, built with `ztunnel_certs::tls::client_config`; after the
/// handshake, records are sealed and opened by `ztunnel_certs::tls::record`.
/// With `watch` (where `CRL_PATH` is configured), the driver drops the
/// connection once a revocation list revokes the server.
///
/// Not bounded in time by itself: the caller wraps it in its connect timeout.
pub async fn connect<IO>(
    io: IO,
    tls: Arc<ClientConfig>,
    settings: &H2Settings,
    watch: Option<RevocationWatch>,
) -> Result<HboneConnection, HboneError>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (tls_stream, negotiated) = record::connect(tls, dummy_server_name(), io)
        .await
        .map_err(HboneError::Tls)?;
    if negotiated.alpn_protocol.as_deref() != Some(ALPN_H2) {
        return Err(HboneError::NoAlpnH2);
    }
    let peer = negotiated.peer_identity.ok_or(HboneError::NoPeerIdentity)?;
    let watched = watch.and_then(|watch| watch.watch(negotiated.peer_chain, &peer));

    let (send_request, mut connection) = h2::client::Builder::new()
        .initial_window_size(settings.stream_window)
        .initial_connection_window_size(settings.connection_window)
        .max_frame_size(settings.max_frame_size)
        .max_header_list_size(settings.client_max_header_list)
        .initial_max_send_streams(settings.client_initial_max_streams)
        .max_send_buffer_size(settings.client_send_buffer)
        .enable_push(false)
        .handshake::<_, Bytes>(tls_stream)
        .await?;
    let ping_pong = connection.ping_pong();
    let shared = Arc::new(Shared {
        closed: AtomicBool::new(false),
        active: Arc::new(AtomicUsize::new(0)),
        peer,
        max_write: settings.max_frame_size as usize,
        revocation: watched.as_ref().map(|watched| watched.revocation().clone()),
    });
    let driver_shared = Arc::clone(&shared);
    let (interval, timeout) = (settings.keepalive_interval, settings.keepalive_timeout);
    tokio::spawn(async move {
        let keepalive = async move {
            match ping_pong {
                Some(ping_pong) => keepalive(ping_pong, interval, timeout).await,
                // Taken already: no keepalive, so only the connection ends it.
                None => std::future::pending().await,
            }
        };
        let revoked = async {
            match &watched {
                Some(watched) => watched.revoked().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            result = connection => {
                if let Err(error) = result {
                    tracing::debug!(error = %ErrorChain(&error), "HBONE client connection ended");
                }
            }
            () = keepalive => {}
            // Warned and counted already. Out of the pool before the
            // connection goes, which fails every stream still on it; the
            // streams' copies stop on the same signal.
            () = revoked => driver_shared.closed.store(true, Ordering::Release),
        }
        driver_shared.closed.store(true, Ordering::Release);
    });
    Ok(HboneConnection {
        send_request,
        shared,
    })
}

impl HboneConnection {
    /// Sends `CONNECT` with `:authority` (`ip:port`, IPv6 bracketed, or
    /// `host:port`) and `headers`, and waits for the answer. A non-200
    /// answer is [`HboneError::Status`].
    pub async fn send_connect(
        &self,
        authority: &Authority,
        headers: HeaderMap,
    ) -> Result<H2Stream, HboneError> {
        self.send_connect_reserved(self.reserve(), authority, headers)
            .await
    }

    /// Counts a stream on this connection before it is opened, so that the
    /// pool sees it at once; pass it to [`HboneConnection::send_connect_reserved`].
    pub fn reserve(&self) -> ActiveStream {
        ActiveStream::new(Arc::clone(&self.shared.active))
    }

    /// [`HboneConnection::send_connect`] on a slot taken with
    /// [`HboneConnection::reserve`]; the slot lives as long as the stream.
    pub async fn send_connect_reserved(
        &self,
        slot: ActiveStream,
        authority: &Authority,
        headers: HeaderMap,
    ) -> Result<H2Stream, HboneError> {
        let (stream, _response) = self.open_stream(slot, authority, headers).await?;
        Ok(stream)
    }

    /// [`HboneConnection::send_connect`], with what the server's 200 says
    /// of the workload it serves (its `baggage`): the only word on where a
    /// tunnel through another network's gateway ended.
    pub async fn send_connect_reading_baggage(
        &self,
        authority: &Authority,
        headers: HeaderMap,
    ) -> Result<(H2Stream, Baggage), HboneError> {
        let (stream, response) = self.open_stream(self.reserve(), authority, headers).await?;
        Ok((stream, Baggage::parse(response.get_all(BAGGAGE))))
    }

    /// Sends the CONNECT and waits for its 200: the stream, and the
    /// response's headers.
    async fn open_stream(
        &self,
        slot: ActiveStream,
        authority: &Authority,
        headers: HeaderMap,
    ) -> Result<(H2Stream, HeaderMap), HboneError> {
        let uri = Uri::from(UriAuthority::try_from(authority.to_string())?);
        let mut request = Request::builder()
            .method(Method::CONNECT)
            .uri(uri)
            .version(Version::HTTP_2)
            .body(())?;
        *request.headers_mut() = headers;
        let mut send_request = self.send_request.clone().ready().await?;
        // The stream stays open for data: no END_STREAM on HEADERS.
        let (response, send) = send_request.send_request(request, false)?;
        let response = response.await?;
        if response.status() != StatusCode::OK {
            return Err(HboneError::Status(response.status()));
        }
        let (parts, body) = response.into_parts();
        let stream = H2Stream::new(send, body, self.shared.max_write, Some(slot))
            .with_revocation(self.shared.revocation.clone());
        Ok((stream, parts.headers))
    }

    /// Whether new streams can be opened: the driver is running and no
    /// GOAWAY or connection error has been seen.
    pub fn is_ready(&self) -> bool {
        if self.shared.closed.load(Ordering::Acquire) {
            return false;
        }
        // A fresh clone has no pending stream, so poll_ready only reports
        // the connection's error state and never registers interest.
        let mut probe = self.send_request.clone();
        let mut cx = Context::from_waker(Waker::noop());
        !matches!(probe.poll_ready(&mut cx), Poll::Ready(Err(_)))
    }

    /// The peer's advertised SETTINGS_MAX_CONCURRENT_STREAMS (our initial
    /// assumption until its SETTINGS arrive).
    pub fn peer_max_concurrent_streams(&self) -> usize {
        self.send_request.current_max_send_streams()
    }

    /// Streams open (or being opened) on this connection.
    pub fn active_streams(&self) -> usize {
        self.shared.active.load(Ordering::Acquire)
    }

    /// The server's SPIFFE identity, as verified during the handshake.
    pub fn peer_identity(&self) -> &Identity {
        &self.shared.peer
    }

    /// Whether `self` and `other` are handles of the same connection.
    pub fn same_connection(&self, other: &HboneConnection) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }
}
