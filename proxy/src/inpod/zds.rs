//! ztunnel's side of ZDS, the node agent ↔ ztunnel protocol (WIRE.md §5):
//! connect to the agent's SOCK_SEQPACKET socket, say hello, answer every
//! request with an ACK or a NACK, and ask [`PodProxies`] to start, stop and
//! reconcile the pods' proxies. Also the connection's life: connect retries,
//! reconnects after a read error or a close, retries of pods whose proxy
//! failed to start, and the readiness the session holds back.
//!
//! This file is the async shell. The decisions live in `zds/session.rs`
//! (the state machine of one connection), the datagram format in
//! `zds/message.rs`, the socket calls in `zds/socket.rs`; the arithmetic of
//! the waits is `backoff.rs`'s, with the settings of [`Timing`]. The pods'
//! listeners are `workloads`' business.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Instant, MissedTickBehavior};
use ztunnel_certs::error_chain::ErrorChain;

use crate::backoff::{Backoff, Jitter};
use crate::drain::DrainWatcher;
use crate::inpod::PodProxies;
use crate::metrics::Metrics;
use crate::readiness::{BlockReady, Ready};

mod message;
mod session;
mod socket;
#[cfg(test)]
mod tests;

pub use message::{Datagram, Handle, ReadError, Request, ack, hello, parse};
pub use session::{ProtocolError, RequestError, Session, StartFailure};
pub use socket::ZdsSocket;

use socket::Received;

/// The name the session's readiness guard shows on `/healthz/ready`.
const READY_TASK: &str = "zds snapshot";

/// Where the agent is and how patiently to reach it.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The agent's socket (`INPOD_UDS`).
    pub path: PathBuf,
    /// The waits; [`Timing::default`] has WIRE.md's, tests shorten them.
    pub timing: Timing,
    /// Where NACKs and connection errors are counted.
    pub metrics: Arc<Metrics>,
}

impl Settings {
    /// The agent's socket at `path`, with WIRE.md's timing.
    pub fn new(path: PathBuf, metrics: Arc<Metrics>) -> Self {
        Settings {
            path,
            timing: Timing::default(),
            metrics,
        }
    }
}

/// The waits of the session. Each field says where its default comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// The first wait after a failed connect (or a missing socket path):
    /// 20 ms, since istio's ztunnel starts from 10 ms and doubles before
    /// each wait. It doubles after each failure.
    pub connect_first: Duration,
    /// The longest wait between connect attempts: 500 ms ([`SHORT_MAX`]).
    pub connect_max: Duration,
    /// The first wait before connecting again after a connection ended
    /// (read error, close): 5 ms, doubling, jittered by ±20 %, and reset
    /// once the proxy is ready.
    pub reconnect_first: Duration,
    /// The longest wait before connecting again: 500 ms ([`SHORT_MAX`]).
    pub reconnect_max: Duration,
    /// How often pods whose proxy failed to start are tried again: 5 s.
    pub retry_interval: Duration,
}

/// The cap of both backoffs, where istio's ztunnel waits up to 15 s. A
/// node agent that restarts (an upgrade, a crash) is back within seconds,
/// and every pod it enrolls before ztunnel connects again fails closed
/// until then (its rules send its traffic to ports nobody listens on yet):
/// a 15 s cap could keep new pods refused for up to 15 s after the agent
/// is back. A connect to a missing socket path costs one system call, so
/// two a second while the agent is away cost nothing.
pub const SHORT_MAX: Duration = Duration::from_millis(500);

impl Default for Timing {
    fn default() -> Self {
        Timing {
            connect_first: Duration::from_millis(20),
            connect_max: SHORT_MAX,
            reconnect_first: Duration::from_millis(5),
            reconnect_max: SHORT_MAX,
            retry_interval: Duration::from_secs(5),
        }
    }
}

impl Timing {
    /// The waits between connect attempts: doubling, no jitter.
    fn connect_backoff(&self) -> Backoff {
        Backoff {
            initial: self.connect_first,
            max: self.connect_max,
            multiplier: 2,
            jitter: Jitter::None,
        }
    }

    /// The waits before connecting again after a connection ended:
    /// doubling, then scaled by up to ±20 % (WIRE.md §5). The scaling comes
    /// after the cap, so a wait at the cap may reach 18 s.
    fn reconnect_backoff(&self) -> Backoff {
        Backoff {
            initial: self.reconnect_first,
            max: self.reconnect_max,
            multiplier: 2,
            jitter: Jitter::SpreadPastMax(0.2),
        }
    }
}

/// Why a connection with the agent ended.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The agent broke the protocol. It was NACKed; the process must now
    /// exit with status 1.
    #[error("the node agent broke the ZDS protocol: {0}")]
    Protocol(ProtocolError),
    /// A datagram could not be read. It was NACKed (the wire text is
    /// `session.rs`'s); ztunnel connects again and expects a new
    /// snapshot.
    #[error("unreadable datagram: {0}")]
    Read(ReadError),
    /// The agent closed the connection (a zero-length datagram).
    #[error("the node agent closed the connection")]
    Closed,
    /// The socket failed.
    #[error("ZDS socket")]
    Io(#[from] io::Error),
}

impl Error {
    /// The metric label of this end.
    fn reason(&self) -> &'static str {
        match self {
            Error::Protocol(_) => "protocol",
            Error::Read(_) => "read",
            Error::Closed => "closed",
            Error::Io(_) => "io",
        }
    }
}

/// ztunnel's ZDS client: runs sessions with the agent one after another
/// until the drain starts, and holds the proxy not-ready while the current
/// session is (WIRE.md §5, readiness).
pub struct Client {
    settings: Settings,
    proxies: Arc<dyn PodProxies>,
    ready: Ready,
    /// Held while not ready: before the snapshot, while a pod waits for a
    /// retry, and after a disconnect.
    blocked: Option<BlockReady>,
    /// Connections ended in a row since the proxy was last ready; sets the
    /// wait before the next one.
    ended_connections: u32,
    drain: DrainWatcher,
}

/// Runs the ZDS client until the drain starts (`Ok`) or the agent breaks
/// the protocol (`Err`, after which the caller exits with status 1).
/// Registers its readiness task on `ready` at once, before the returned
/// future is first polled.
pub fn run(
    settings: Settings,
    proxies: Arc<dyn PodProxies>,
    ready: Ready,
    drain: DrainWatcher,
) -> impl Future<Output = Result<(), ProtocolError>> + Send {
    Client::new(settings, proxies, ready, drain).run()
}

impl Client {
    /// A client that has not connected yet; it holds `ready` back already.
    pub fn new(
        settings: Settings,
        proxies: Arc<dyn PodProxies>,
        ready: Ready,
        drain: DrainWatcher,
    ) -> Self {
        Client {
            blocked: Some(ready.register_task(READY_TASK)),
            ended_connections: 0,
            settings,
            proxies,
            ready,
            drain,
        }
    }

    /// Connects, serves, and connects again after every connection that
    /// ends without a protocol error, until the drain starts.
    pub async fn run(mut self) -> Result<(), ProtocolError> {
        loop {
            let Some(socket) = self.connect().await else {
                return Ok(());
            };
            tracing::info!(path = %self.settings.path.display(), "connected to the node agent");
            match self.serve(socket).await {
                Ok(()) => return Ok(()),
                Err(Error::Protocol(error)) => return Err(error),
                Err(error) => {
                    tracing::warn!(error = %ErrorChain(&error), "ZDS connection ended; connecting again")
                }
            }
            self.ended_connections = self.ended_connections.saturating_add(1);
            let backoff = self.settings.timing.reconnect_backoff();
            let wait = backoff.wait(self.ended_connections, rand::random());
            if !self.sleep(wait).await {
                return Ok(());
            }
        }
    }

    /// Serves one connected socket: hello, then requests until the
    /// connection ends. `Ok` means the drain started. The proxies keep
    /// running whatever the outcome; the readiness is held back again.
    pub async fn serve(&mut self, socket: ZdsSocket) -> Result<(), Error> {
        let served = self.serve_session(&socket).await;
        self.set_ready(false);
        // The retry list goes with the session; the next one's snapshot
        // names the pods again.
        self.proxies.pending(0);
        if let Err(error) = &served {
            self.settings.metrics.record_zds_error(error.reason());
        }
        served
    }

    async fn serve_session(&mut self, socket: &ZdsSocket) -> Result<(), Error> {
        socket.send(&message::hello()).await?;
        let mut session = Session::new();
        let period = self.settings.timing.retry_interval;
        let mut retry = tokio::time::interval_at(Instant::now() + period, period);
        retry.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let drain = self.drain.clone();
        loop {
            // Each branch is cancel safe: `signaled` and `tick` keep no
            // state of their own, and `recv` takes a datagram off the
            // socket only once it has completed.
            tokio::select! {
                () = drain.signaled() => return Ok(()),
                _ = retry.tick() => {
                    session.retry(&*self.proxies);
                    self.proxies.pending(session.pending());
                    self.set_ready(session.is_ready());
                }
                received = socket.recv() => {
                    let Received::Datagram(datagram) = received? else {
                        return Err(Error::Closed);
                    };
                    self.answer(socket, &mut session, datagram).await?;
                }
            }
        }
    }

    /// Applies one datagram and sends its ACK or NACK; an `Err` ends the
    /// connection.
    async fn answer(
        &mut self,
        socket: &ZdsSocket,
        session: &mut Session,
        datagram: Datagram,
    ) -> Result<(), Error> {
        let request = message::parse(datagram, crate::inpod::netns::is_network_namespace);
        let uid = request.as_ref().ok().and_then(message::Request::uid);
        let answer = request
            .map_err(RequestError::Read)
            .and_then(|request| session.handle(request, &*self.proxies));
        let error = match &answer {
            Ok(()) => String::new(),
            Err(nack) => {
                self.settings.metrics.record_zds_nack(nack.reason());
                tracing::warn!(uid = uid.as_deref().unwrap_or("-"), reason = %nack, "NACK to the node agent");
                nack.to_string()
            }
        };
        // Before the answer leaves, so whoever reads the ACK sees the
        // readiness and the retry list it settled.
        self.proxies.pending(session.pending());
        self.set_ready(session.is_ready());
        let sent = socket.send(&message::ack(error)).await;
        // A read or protocol error ends the connection even if its NACK
        // could not be sent.
        match answer {
            Ok(()) | Err(RequestError::Start(_)) => Ok(sent?),
            Err(RequestError::Read(error)) => Err(Error::Read(error)),
            Err(RequestError::Protocol(error)) => Err(Error::Protocol(error)),
        }
    }

    /// Connects, retrying with the connect backoff; `None` once the drain
    /// has started.
    async fn connect(&self) -> Option<ZdsSocket> {
        let backoff = self.settings.timing.connect_backoff();
        let mut failures = 0u32;
        loop {
            if self.drain.is_draining() {
                return None;
            }
            match ZdsSocket::connect(&self.settings.path) {
                Ok(socket) => return Some(socket),
                Err(error) => tracing::warn!(
                    path = %self.settings.path.display(),
                    error = %ErrorChain(&error),
                    "cannot reach the node agent; retrying"
                ),
            }
            failures = failures.saturating_add(1);
            if !self.sleep(backoff.wait(failures, 0.0)).await {
                return None;
            }
        }
    }

    /// Waits `wait`, or less if the drain starts; `false` if it did.
    async fn sleep(&self, wait: Duration) -> bool {
        tokio::select! {
            () = self.drain.signaled() => false,
            () = tokio::time::sleep(wait) => true,
        }
    }

    /// Holds or releases the readiness guard. Becoming ready also resets
    /// the reconnect backoff.
    fn set_ready(&mut self, ready: bool) {
        if ready {
            if self.blocked.take().is_some() {
                tracing::info!("ZDS snapshot applied; ready");
                self.ended_connections = 0;
            }
        } else if self.blocked.is_none() {
            self.blocked = Some(self.ready.register_task(READY_TASK));
        }
    }
}
