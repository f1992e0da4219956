//! The accepting side of HBONE: the TLS accept with its handshake timeout,
//! the h2 server with our bounds, the checks of each request (WIRE.md §4
//! "Server handling"), and the copy between the tunnel and the upstream.
//!
//! What a client may make the server hold, and what bounds it:
//! - a connection that never sends its preface, or never a first CONNECT:
//!   [`H2Settings::server_preface_timeout`] and
//!   [`H2Settings::server_first_request_timeout`] close it;
//! - streams opened and reset at once (rapid reset): a reset abandons the
//!   stream's upstream dial at once, at most the advertised stream limit
//!   dial at one time (a stream beyond it is refused with REFUSED_STREAM),
//!   and h2 closes the connection when resets outrun accepts
//!   ([`H2Settings::server_max_pending_accept_reset_streams`]) or the
//!   client keeps causing protocol errors
//!   ([`H2Settings::server_max_local_error_resets`]);
//! - header blocks: 64 KiB a request, and h2 (0.4.16 and later) closes the
//!   connection after a few CONTINUATION frames more than that needs;
//! - PING and SETTINGS floods: h2 holds one unsent acknowledgement of each
//!   and reads no further frame until it is written, so a client that does
//!   not read its acknowledgements is held back by TCP, and one that does
//!   costs a frame written per frame read;
//! - empty and small DATA frames: h2 (0.4.17 on) closes the connection after
//!   100 empty ones (END_STREAM aside) and when small ones buffered outrun
//!   a budget, so their framing cannot cost more than the data they carry.
//!
//! A connection whose client certificate a revocation list revokes while
//! it is open (`revocation.rs`) is closed at once with a GOAWAY, and its
//! streams stop with it.
//!
//! What the tunnel may reach (authorization, the upstream dial) is the
//! [`InboundHandler`]'s decision; this module only speaks h2.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use h2::server::SendResponse;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use rustls::ServerConfig;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use ztunnel_certs::error_chain::ErrorChain;
use ztunnel_certs::identity::Identity;
use ztunnel_certs::tls::record::{self, HandshakeError, RecordStream};
use ztunnel_certs::tls::revocation::{PeerChain, Revocation};

use crate::copy::{CopyError, Side, Transferred, Way, copy_bidirectional_until};
use crate::drain::DrainWatcher;
use crate::hbone::headers::BAGGAGE;
use crate::hbone::stream::H2Stream;
use crate::hbone::{Authority, H2Settings, keepalive};
use crate::revocation::{WatchedPeer, until_revoked};

/// How long a forced drain waits for a connection's streams to report their
/// close: their copies stop at the same signal, so this only bounds a
/// stream still dialing its upstream.
const FORCED_STREAM_GRACE: Duration = Duration::from_millis(100);

/// How long a connection closed for its silence has to take its GOAWAY:
/// one is a few bytes, so this only bounds a client that does not read.
const GOAWAY_FLUSH: Duration = Duration::from_secs(1);

/// Why an inbound HBONE connection failed before or while serving.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The TLS handshake failed: no client certificate, unknown CA, foreign
    /// trust domain, or a broken connection.
    #[error("TLS handshake failed")]
    Tls(#[source] HandshakeError),
    /// The client did not finish the TLS handshake in time.
    #[error("TLS handshake timed out after {0:?}")]
    HandshakeTimeout(Duration),
    /// The client certificate carries no SPIFFE identity.
    #[error("client certificate carries no SPIFFE identity")]
    NoPeerIdentity,
    /// The client sent no HTTP/2 preface in time after its TLS handshake.
    #[error("no HTTP/2 preface within {0:?}")]
    PrefaceTimeout(Duration),
    /// The client sent no request in time after its preface.
    #[error("no request within {0:?} of the HTTP/2 handshake")]
    FirstRequestTimeout(Duration),
    /// The h2 handshake or the connection failed.
    #[error("HTTP/2")]
    H2(#[from] h2::Error),
    /// A revocation list installed while the connection was open revokes
    /// the client's certificate: the connection was closed.
    #[error("the client's certificate was revoked while the connection was open")]
    Revoked,
}

/// The client of an accepted connection, as its handshake verified it.
#[derive(Debug)]
pub struct AcceptedClient {
    /// Its SPIFFE identity.
    pub identity: Identity,
    /// Its chain, kept where open connections are judged against new
    /// revocation lists.
    pub chain: Option<PeerChain>,
}

/// The client of a served connection.
#[derive(Debug)]
pub struct ServedClient {
    /// Its SPIFFE identity, which every request carries to the handler.
    pub identity: Identity,
    /// Its tracking against the revocation lists, where `CRL_PATH` is
    /// configured: the connection closes once a list revokes it.
    pub watched: Option<WatchedPeer>,
}

impl From<Identity> for ServedClient {
    fn from(identity: Identity) -> Self {
        ServedClient {
            identity,
            watched: None,
        }
    }
}

/// A CONNECT that passed the protocol checks, for the handler to admit.
#[derive(Debug, Clone)]
pub struct InboundRequest {
    /// The client's SPIFFE identity from its certificate.
    pub peer_identity: Identity,
    /// Where the tunnel should lead.
    pub authority: Authority,
    /// The TCP peer of the HBONE connection (the client node's ztunnel).
    pub peer_addr: SocketAddr,
    /// The local address the HBONE connection arrived on: the destination
    /// workload's IP, which an `ip:port` authority must match.
    pub local_addr: SocketAddr,
    /// The request headers (`baggage`, `forwarded`, `traceparent`, ...).
    pub headers: HeaderMap,
    /// Fires when the client's certificate is revoked while the connection
    /// is open, which stops the stream; `None` where nothing is watched.
    pub revocation: Option<Revocation>,
}

/// Why the handler refused a tunnel; each maps to one `:status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum InboundRefusal {
    /// The request is malformed for this destination (e.g. the authority IP
    /// is not the local workload's): 400.
    #[error("bad request: {0}")]
    BadRequest(&'static str),
    /// Authorization denied the connection: 401.
    #[error("denied by authorization policy")]
    Denied,
    /// The destination is unknown or cannot be reached: 503.
    #[error("unavailable: {0}")]
    Unavailable(&'static str),
}

impl InboundRefusal {
    /// The `:status` sent for this refusal (WIRE.md §4).
    pub fn status(&self) -> StatusCode {
        match self {
            InboundRefusal::BadRequest(_) => StatusCode::BAD_REQUEST,
            InboundRefusal::Denied => StatusCode::UNAUTHORIZED,
            InboundRefusal::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

/// What the server asks of the proxy for each tunnel: admit it and connect
/// the upstream, then hear how it ended.
pub trait InboundHandler: Send + Sync + 'static {
    /// The connected upstream; a wrapper type can carry per-tunnel context
    /// (start time, policy watch) through to [`InboundHandler::closed`]. A
    /// socket or a socket's wrapper is a [`Side`] with `impl Side for T {}`.
    type Upstream: Side + Send + 'static;

    /// Authorizes `request` and connects the upstream. The client gets its
    /// 200 only once this returns `Ok`. The future is dropped unfinished
    /// when the client resets the stream meanwhile, so it must hold nothing
    /// that dropping does not release (a socket being connected is closed).
    fn open(
        &self,
        request: &InboundRequest,
    ) -> impl Future<Output = Result<Self::Upstream, InboundRefusal>> + Send;

    /// The `baggage` the 200 carries for `upstream`: what the workload it
    /// serves says of itself to the client. None by default.
    fn response_baggage(&self, _upstream: &Self::Upstream) -> Option<HeaderValue> {
        None
    }

    /// What the copy of `upstream` waits on to stop early: the handler
    /// cancels it when the drain is forced, or when the tunnel must close
    /// for its own reasons (a policy re-check).
    fn stop(upstream: &Self::Upstream) -> CancellationToken;

    /// Called once the copy ended, with the bytes moved (`a_to_b` is client
    /// to upstream), for metrics and the access log. The request is gone by
    /// then (its headers are not kept for a connection's life): what the
    /// close reports must travel in the upstream.
    fn closed(&self, upstream: Self::Upstream, result: Result<Transferred, CopyError>);
}

/// Accepts TLS on `tcp` within `timeout` and returns the stream and the
/// client. `config` (from `ztunnel_certs::tls::server_config`) requires and
/// verifies the client certificate; after the handshake, records are
/// sealed and opened by `ztunnel_certs::tls::record`.
pub async fn accept_tls(
    tcp: TcpStream,
    config: Arc<ServerConfig>,
    timeout: Duration,
) -> Result<(RecordStream<TcpStream>, AcceptedClient), ServerError> {
    let (stream, negotiated) = tokio::time::timeout(timeout, record::accept(config, tcp))
        .await
        .map_err(|_elapsed| ServerError::HandshakeTimeout(timeout))?
        .map_err(ServerError::Tls)?;
    let identity = negotiated
        .peer_identity
        .ok_or(ServerError::NoPeerIdentity)?;
    let client = AcceptedClient {
        identity,
        chain: negotiated.peer_chain,
    };
    Ok((stream, client))
}

/// Serves HBONE on an accepted TLS connection until the client closes it,
/// or the drain ends it: on the drain signal GOAWAY goes out and open
/// streams finish; when the drain is forced, the rest are cut. A revoked
/// client is cut at once: GOAWAY, every stream stopped, and
/// [`ServerError::Revoked`].
pub async fn serve_connection<S, H>(
    tls: S,
    client: ServedClient,
    addresses: (SocketAddr, SocketAddr),
    settings: &H2Settings,
    handler: Arc<H>,
    drain: DrainWatcher,
) -> Result<(), ServerError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    H: InboundHandler,
{
    let (peer_addr, local_addr) = addresses;
    let mut connection = handshake(tls, settings).await?;
    let ping_pong = connection.ping_pong();
    let (interval, timeout) = (settings.keepalive_interval, settings.keepalive_timeout);
    let keepalive = async move {
        match ping_pong {
            Some(ping_pong) => keepalive(ping_pong, interval, timeout).await,
            // Taken already: no keepalive, so only the connection ends it.
            None => std::future::pending().await,
        }
    };
    tokio::pin!(keepalive);
    let ServedClient { identity, watched } = client;
    let revoked = async {
        match &watched {
            Some(watched) => watched.revoked().await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(revoked);
    let context = Arc::new(StreamContext {
        peer_identity: identity,
        peer_addr,
        local_addr,
        max_write: settings.max_frame_size as usize,
        revocation: watched.as_ref().map(|watched| watched.revocation().clone()),
    });
    // Tracked, not joined: a join set keeps an entry per stream (120 bytes
    // of every open tunnel); the tracker only counts them. Streams left
    // when the connection ends see it gone and report their close.
    let streams = TaskTracker::new();
    // h2 stops counting a stream the moment the client resets it, while its
    // task may still be dialing: the dials hold a permit each, so resets
    // never let more run than the streams the client may have open.
    let dials = Arc::new(Semaphore::new(
        settings.server_max_concurrent_streams as usize,
    ));
    let first_request_timeout = settings.server_first_request_timeout;
    let first_request = tokio::time::sleep(first_request_timeout);
    tokio::pin!(first_request);
    let (mut draining, mut requested) = (false, false);
    // Bounded by the connection: `accept` returns `None` once it is closed,
    // and h2 caps the streams in flight at the advertised maximum.
    loop {
        tokio::select! {
            accepted = connection.accept() => match accepted {
                Some(Ok((request, mut respond))) => {
                    requested = true;
                    let Ok(dialing) = Arc::clone(&dials).try_acquire_owned() else {
                        // Only a client resetting streams faster than their
                        // dials stop gets here.
                        respond.send_reset(h2::Reason::REFUSED_STREAM);
                        continue;
                    };
                    // The set-up is boxed and built here, so the stream's
                    // task holds only what the copy needs (see `serve_stream`).
                    let opening = Box::pin(open_stream(
                        request,
                        respond,
                        Arc::clone(&context),
                        Arc::clone(&handler),
                        dialing,
                    ));
                    let revocation = context.revocation.clone();
                    streams.spawn(serve_stream(opening, Arc::clone(&handler), revocation));
                }
                Some(Err(error)) => return Err(ServerError::H2(error)),
                None => break,
            },
            () = &mut first_request, if !requested => {
                send_away(&mut connection).await;
                return Err(ServerError::FirstRequestTimeout(first_request_timeout));
            }
            () = drain.signaled(), if !draining => {
                draining = true;
                connection.graceful_shutdown();
            }
            () = drain.forced() => {
                connection.abrupt_shutdown(h2::Reason::NO_ERROR);
                // Copies stop on the same signal and report their close;
                // give them a moment before the connection goes, which
                // fails the streams of the rest.
                streams.close();
                let _ = tokio::time::timeout(FORCED_STREAM_GRACE, streams.wait()).await;
                break;
            }
            // Warned and counted already. The streams stop on the same
            // signal and report their close.
            () = &mut revoked => {
                send_away(&mut connection).await;
                return Err(ServerError::Revoked);
            }
            () = &mut keepalive => break,
        }
    }
    Ok(())
}

/// The h2 server handshake on `tls` with our settings, which ends once the
/// client's preface is read, within [`H2Settings::server_preface_timeout`].
async fn handshake<S>(
    tls: S,
    settings: &H2Settings,
) -> Result<h2::server::Connection<S, Bytes>, ServerError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let handshake = h2::server::Builder::new()
        .initial_window_size(settings.stream_window)
        .initial_connection_window_size(settings.connection_window)
        .max_frame_size(settings.max_frame_size)
        .max_header_list_size(settings.server_max_header_list)
        .max_concurrent_streams(settings.server_max_concurrent_streams)
        .max_send_buffer_size(settings.server_send_buffer)
        .max_pending_accept_reset_streams(settings.server_max_pending_accept_reset_streams)
        .max_local_error_reset_streams(Some(settings.server_max_local_error_resets))
        .handshake::<_, Bytes>(tls);
    let timeout = settings.server_preface_timeout;
    tokio::time::timeout(timeout, handshake)
        .await
        .map_err(|_elapsed| ServerError::PrefaceTimeout(timeout))?
        .map_err(ServerError::H2)
}

/// Closes an idle `connection` with a GOAWAY (NO_ERROR), given
/// [`GOAWAY_FLUSH`] to write it.
async fn send_away<S>(connection: &mut h2::server::Connection<S, Bytes>)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    connection.abrupt_shutdown(h2::Reason::NO_ERROR);
    // `accept` drives the connection until the GOAWAY is out and it ends.
    // Cancel safety: it keeps no state of its own between calls.
    let flush = async { while connection.accept().await.is_some() {} };
    let _ = tokio::time::timeout(GOAWAY_FLUSH, flush).await;
}

/// What every stream on one connection shares.
#[derive(Debug)]
struct StreamContext {
    peer_identity: Identity,
    peer_addr: SocketAddr,
    local_addr: SocketAddr,
    max_write: usize,
    revocation: Option<Revocation>,
}

/// A stream's set-up: the request checked and admitted, the upstream
/// connected and the 200 sent; `None` once it was answered otherwise.
type Opening<U> = Pin<Box<dyn Future<Output = Option<(H2Stream, U)>> + Send>>;

/// Runs one stream: its set-up, then the copy until both sides close, the
/// handler stops it, or the client is revoked.
///
/// Everything an async fn takes lives in its task until the end, and the
/// set-up (the request with its headers, the policy check, the upstream
/// dial) needs far more than the copy; so it comes in boxed, and is freed
/// when it is done.
async fn serve_stream<H: InboundHandler>(
    opening: Opening<H::Upstream>,
    handler: Arc<H>,
    revocation: Option<Revocation>,
) {
    let Some((mut tunnel, mut upstream)) = opening.await else {
        return;
    };
    let stop = H::stop(&upstream);
    let stopped = async {
        tokio::select! {
            () = stop.cancelled() => {}
            () = until_revoked(revocation.as_ref()) => {}
        }
    };
    let result = copy_bidirectional_until(&mut tunnel, &mut upstream, stopped).await;
    handler.closed(upstream, result);
}

/// Checks one request, asks the handler, answers with 200 and hands back
/// the tunnel and its upstream. `dialing` is held until then; a reset of
/// the stream meanwhile abandons the handler's work (the dial).
async fn open_stream<H: InboundHandler>(
    request: Request<h2::RecvStream>,
    mut respond: SendResponse<Bytes>,
    context: Arc<StreamContext>,
    handler: Arc<H>,
    dialing: OwnedSemaphorePermit,
) -> Option<(H2Stream, H::Upstream)> {
    let authority = match check_request(&request) {
        Ok(authority) => authority,
        Err(reason) => {
            tracing::debug!(reason, method = %request.method(), "refusing HBONE request");
            send_status(&mut respond, StatusCode::BAD_REQUEST);
            return None;
        }
    };
    let (parts, body) = request.into_parts();
    let inbound = InboundRequest {
        peer_identity: context.peer_identity.clone(),
        authority,
        peer_addr: context.peer_addr,
        local_addr: context.local_addr,
        headers: parts.headers,
        revocation: context.revocation.clone(),
    };
    let opened = tokio::select! {
        opened = handler.open(&inbound) => Some(opened),
        // The client gave up (or the connection is gone): nobody is left
        // to answer, and a client resetting streams must not leave dials
        // running behind them.
        _reset = std::future::poll_fn(|cx| respond.poll_reset(cx)) => None,
    };
    drop(dialing);
    let Some(opened) = opened else {
        tracing::debug!(peer = %inbound.peer_identity, "HBONE stream reset while opening; upstream abandoned");
        return None;
    };
    let upstream = match opened {
        Ok(upstream) => upstream,
        Err(refusal) => {
            tracing::debug!(%refusal, peer = %inbound.peer_identity, "HBONE tunnel refused");
            send_status(&mut respond, refusal.status());
            return None;
        }
    };
    let mut ok = Response::new(());
    if let Some(baggage) = handler.response_baggage(&upstream) {
        ok.headers_mut().insert(BAGGAGE, baggage);
    }
    match respond.send_response(ok, false) {
        Ok(send) => Some((H2Stream::new(send, body, context.max_write, None), upstream)),
        Err(error) => {
            // The client reset the stream as the upstream was connected.
            let result = Err(CopyError::Read {
                direction: Way::AToB,
                transferred: Transferred::default(),
                source: std::io::Error::other(error),
            });
            handler.closed(upstream, result);
            None
        }
    }
}

/// The protocol checks before the handler sees a request: CONNECT only, and
/// an `ip:port` or `host:port` authority.
fn check_request(request: &Request<h2::RecvStream>) -> Result<Authority, &'static str> {
    if request.method() != Method::CONNECT {
        return Err("method is not CONNECT");
    }
    let authority = request
        .uri()
        .authority()
        .ok_or("CONNECT without :authority")?;
    authority
        .as_str()
        .parse::<Authority>()
        .map_err(|_invalid| "authority is neither ip:port nor host:port")
}

/// Answers with `status` and ends the stream.
fn send_status(respond: &mut SendResponse<Bytes>, status: StatusCode) {
    let mut response = Response::new(());
    *response.status_mut() = status;
    if let Err(error) = respond.send_response(response, true) {
        tracing::debug!(error = %ErrorChain(&error), "sending the refusal failed");
    }
}
