//! What an established connection on the control plane's port may cost
//! before it proves who it is. Past its TLS handshake a connection holds a
//! socket, rustls' and h2's state and an entry in the server; a peer that
//! never sends the HTTP/2 preface, or never sends a request whose token
//! authenticates, is closed after a bound, and one source may hold only so
//! many connections at once. A connection that authenticated a request (a
//! ztunnel's xDS stream, a CSR) is left to the HTTP/2 keepalive.
//!
//! [`Guarded`] wraps the server's side of a connection: it holds the
//! source's slot ([`super::slots`]) and ends the connection (a read error,
//! which closes it) once a deadline passes with nothing proven.
//! [`Authenticated`], reachable from each request's extensions, is how a
//! service says a caller proved itself.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};
use tonic::transport::server::Connected;

use super::metrics::CaMetrics;
use super::slots::Slot;

/// The bounds on established connections; [`ConnectionLimits::DEFAULT`]
/// in production, shorter in tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// How long after its handshake a connection may take to send its
    /// first bytes (the HTTP/2 preface, which a client sends at once).
    pub preface_timeout: Duration,
    /// How long after its handshake a connection may go without a request
    /// whose token authenticates.
    pub unauthenticated_timeout: Duration,
    /// Established connections one source address may hold.
    pub per_source: usize,
    /// Established connections in all.
    pub total: usize,
}

impl ConnectionLimits {
    /// The production bounds.
    pub const DEFAULT: ConnectionLimits = ConnectionLimits {
        // A client sends the preface with its first flight after the
        // handshake, milliseconds later; 10 s is the handshake's own bound.
        preface_timeout: Duration::from_secs(10),
        // A ztunnel's first request follows its preface at once; a minute
        // covers a token file read slowly and a TokenReview that waits for
        // the API server, and frees what a silent peer holds.
        unauthenticated_timeout: Duration::from_secs(60),
        // A ztunnel holds one or two (xDS, the CA); a node's dedicated
        // proxies and a NAT in front of many nodes more. 256 from one
        // address is far above both and a small part of the total.
        per_source: 256,
        // Each holds a socket and some tens of KiB of TLS and HTTP/2
        // state: 16,384 is a few hundred MiB at worst, and several
        // thousand nodes with room to spare.
        total: 16_384,
    };
}

/// Set once a request on the connection authenticated; tonic puts it in
/// each request's extensions.
#[derive(Debug, Clone, Default)]
pub struct Authenticated(Arc<AtomicBool>);

impl Authenticated {
    /// The connection's caller proved who it is.
    pub fn set(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    fn is_set(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// Marks the connection a request came on as authenticated, given the
/// request's [`Authenticated`] extension: a request that did not come
/// through [`Guarded`] (one built by hand in a test) has none.
pub fn mark_authenticated(authenticated: Option<&Authenticated>) {
    if let Some(authenticated) = authenticated {
        authenticated.set();
    }
}

/// Where a guarded connection is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Nothing read yet.
    Silent,
    /// Read from, no request authenticated yet.
    Unproven,
    /// A request authenticated: only the keepalive bounds it now.
    Proven,
    /// Ended for proving nothing in time; counted once.
    Ended,
}

/// The server's side of an established connection, with its source's slot
/// and the deadlines of what it must prove.
pub struct Guarded<S> {
    inner: S,
    _slot: Slot,
    authenticated: Authenticated,
    phase: Phase,
    established: Instant,
    limits: ConnectionLimits,
    deadline: Pin<Box<Sleep>>,
    metrics: Arc<CaMetrics>,
}

impl<S> Guarded<S> {
    /// Guards `inner`, established now, holding `slot`.
    pub fn new(inner: S, slot: Slot, limits: ConnectionLimits, metrics: Arc<CaMetrics>) -> Self {
        let established = Instant::now();
        Guarded {
            inner,
            _slot: slot,
            authenticated: Authenticated::default(),
            phase: Phase::Silent,
            established,
            limits,
            deadline: Box::pin(tokio::time::sleep_until(
                established + limits.preface_timeout,
            )),
            metrics,
        }
    }

    /// Whether the current phase's deadline has passed: the connection
    /// must then end. Registers the waker until it has, so a connection
    /// that sends nothing more is ended too.
    fn expired(&mut self, cx: &mut Context<'_>) -> Option<&'static str> {
        if self.phase != Phase::Proven && self.authenticated.is_set() {
            self.phase = Phase::Proven;
        }
        let reason = match self.phase {
            Phase::Proven => return None,
            Phase::Ended => return Some("ended"),
            Phase::Silent => "preface_timeout",
            Phase::Unproven => "unauthenticated_timeout",
        };
        self.deadline.as_mut().poll(cx).is_ready().then_some(reason)
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Guarded<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(reason) = this.expired(cx) {
            if this.phase != Phase::Ended {
                this.phase = Phase::Ended;
                this.metrics.record_connection_refused(reason);
                tracing::debug!(
                    reason,
                    "closing a CA connection that proved nothing in time"
                );
            }
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, reason)));
        }
        let before = buf.filled().len();
        let read = Pin::new(&mut this.inner).poll_read(cx, buf);
        if this.phase == Phase::Silent && buf.filled().len() > before {
            this.phase = Phase::Unproven;
            let deadline = this.established + this.limits.unauthenticated_timeout;
            this.deadline.as_mut().reset(deadline);
        }
        read
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Guarded<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// Each request on the connection carries its [`Authenticated`].
impl<S> Connected for Guarded<S> {
    type ConnectInfo = Authenticated;

    fn connect_info(&self) -> Authenticated {
        self.authenticated.clone()
    }
}
