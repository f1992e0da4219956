//! The agent's side of ZDS (WIRE.md §5): it listens on a SOCK_SEQPACKET
//! socket, and for each ztunnel that connects reads the hello, sends a
//! snapshot of every pod (`add` with the netns fd, or `keep` when the netns
//! cannot be opened; nothing, and the pod's record dropped, when the netns
//! is gone), waiting for the ack after each message, then
//! `snapshot_sent`. After that a new pod's `add` goes to the newest
//! connection and a `del` to all; idle connections are probed every 5 s.
//!
//! Each connection is one tokio task over a non-blocking socket
//! (`socket.rs`); it sends one request at a time, so acks match requests
//! by order. Message bytes and the keep-instead-of-add decision are in
//! `wire.rs`; which pods exist is the mesh's (`mesh.rs`).

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use ztunnel_certs::error_chain::ErrorChain;

use super::mesh::Mesh;
use super::{ACCEPT_ERROR_PAUSE, stopped};

use socket::{SeqPacket, SeqPacketListener};
use wire::{Ack, Request, WireError};

pub mod socket;
pub mod wire;

/// Receive buffer, as both ends use (WIRE.md §5): an answer is a few bytes,
/// and a longer datagram is an error, not something to grow for.
const RECV_BUFFER: usize = 1024;
/// Deadline for sending one request, and again for reading its ack.
const IO_DEADLINE: Duration = Duration::from_secs(5);
/// How often an idle connection is probed.
const PROBE_INTERVAL: Duration = Duration::from_secs(5);
/// How long a probe read waits: silence means the peer is alive.
const PROBE_READ: Duration = Duration::from_millis(10);
/// Connections accepted per [`ACCEPT_WINDOW`], as istio-cni allows.
const ACCEPTS_PER_WINDOW: usize = 5;
/// The window of [`ACCEPTS_PER_WINDOW`].
const ACCEPT_WINDOW: Duration = Duration::from_secs(1);
/// How long connection tasks get to finish after shutdown.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

/// A request for the connection tasks, with an optional way to learn how
/// ztunnel answered.
#[derive(Debug)]
pub struct ZdsEvent {
    /// What to send.
    pub request: Request,
    /// Told the outcome once the request is acked, refused or failed.
    pub reply: Option<oneshot::Sender<Result<(), ZdsError>>>,
}

/// The open ztunnel connections, oldest first. Plain data: the mesh keeps
/// it under the same lock as the pod set, so a connection's snapshot and
/// the events queued for it after the snapshot never miss a pod.
#[derive(Debug, Default)]
pub struct Connections {
    next_id: u64,
    open: Vec<(u64, mpsc::UnboundedSender<ZdsEvent>)>,
}

impl Connections {
    /// Adds a connection; it becomes the newest.
    pub fn register(&mut self) -> (u64, mpsc::UnboundedReceiver<ZdsEvent>) {
        let (sender, receiver) = mpsc::unbounded_channel();
        self.next_id += 1;
        self.open.push((self.next_id, sender));
        (self.next_id, receiver)
    }

    /// Forgets a connection.
    pub fn deregister(&mut self, id: u64) {
        self.open.retain(|(open, _)| *open != id);
    }

    /// Queues `event` for the newest live connection; false (and the
    /// event dropped) when there is none.
    pub fn send_to_newest(&mut self, mut event: ZdsEvent) -> bool {
        while let Some((_, sender)) = self.open.last() {
            match sender.send(event) {
                Ok(()) => return true,
                Err(mpsc::error::SendError(back)) => {
                    event = back;
                    self.open.pop();
                }
            }
        }
        false
    }

    /// Queues `request` for every connection, without waiting for answers.
    pub fn send_to_all(&mut self, request: &Request) {
        self.open.retain(|(_, sender)| {
            sender
                .send(ZdsEvent {
                    request: request.clone(),
                    reply: None,
                })
                .is_ok()
        });
    }

    /// How many connections are open.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.open.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }
}

/// At most 5 accepts in any second, as istio-cni allows.
#[derive(Debug, Default)]
struct AcceptLimiter {
    recent: VecDeque<Instant>,
}

impl AcceptLimiter {
    /// How long to wait before the next accept, if at all.
    fn delay(&self, now: Instant) -> Option<Duration> {
        if self.recent.len() < ACCEPTS_PER_WINDOW {
            return None;
        }
        let opens = *self.recent.front()? + ACCEPT_WINDOW;
        (opens > now).then(|| opens - now)
    }

    /// Notes an accept.
    fn record(&mut self, now: Instant) {
        self.recent.push_back(now);
        while self.recent.len() > ACCEPTS_PER_WINDOW {
            self.recent.pop_front();
        }
    }
}

/// Accepts ztunnel connections until `shutdown`, one task each.
pub async fn serve(
    listener: SeqPacketListener,
    mesh: Arc<Mesh>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut limiter = AcceptLimiter::default();
    let mut connections = JoinSet::new();
    loop {
        while connections.try_join_next().is_some() {}
        if let Some(wait) = limiter.delay(Instant::now()) {
            tokio::select! {
                () = stopped(&mut shutdown) => break,
                () = tokio::time::sleep(wait) => {}
            }
        }
        let accepted = tokio::select! {
            () = stopped(&mut shutdown) => break,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok(connection) => {
                limiter.record(Instant::now());
                let (mesh, shutdown) = (Arc::clone(&mesh), shutdown.clone());
                connections.spawn(async move {
                    match serve_connection(&connection, &mesh, shutdown).await {
                        Ok(()) => tracing::info!("ztunnel connection closed"),
                        Err(error) => {
                            tracing::warn!(error = %ErrorChain(&error), "ztunnel connection closed")
                        }
                    }
                });
            }
            Err(error) => {
                tracing::warn!(error = %ErrorChain(&error), "accepting a ztunnel connection");
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
            }
        }
    }
    let drained = tokio::time::timeout(SHUTDOWN_GRACE, async {
        while connections.join_next().await.is_some() {}
    });
    if drained.await.is_err() {
        connections.abort_all();
    }
}

/// Deregisters a connection however its task ends.
struct Registration<'a> {
    mesh: &'a Mesh,
    id: u64,
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        self.mesh.disconnect(self.id);
    }
}

/// One ztunnel connection: hello, snapshot, then live events and probes.
async fn serve_connection(
    connection: &SeqPacket,
    mesh: &Mesh,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), ZdsError> {
    let mut buf = [0u8; RECV_BUFFER];
    let len = receive(connection, &mut buf, IO_DEADLINE).await?;
    let version = wire::decode_hello(&buf[..len])?;
    tracing::info!(version, "ztunnel connected");

    let (id, mut events, pods) = mesh.connect();
    let _registration = Registration { mesh, id };
    let mut dropped = 0;
    for request in wire::snapshot(&pods) {
        let Some((request, netns)) = snapshot_entry(mesh, request).await else {
            dropped += 1;
            continue;
        };
        if let Ack::Nack(text) = exchange(connection, &request, netns.as_ref(), &mut buf).await? {
            tracing::warn!(?request, nack = %text, "ztunnel refused a snapshot request");
        }
    }
    tracing::info!(pods = pods.len() - dropped, "snapshot sent to ztunnel");
    mesh.snapshot_sent();

    let mut probe = tokio::time::interval_at(Instant::now() + PROBE_INTERVAL, PROBE_INTERVAL);
    probe.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stopped(&mut shutdown) => return Ok(()),
            event = events.recv() => {
                let Some(event) = event else { return Ok(()) };
                deliver(connection, event, &mut buf).await?;
            }
            _ = probe.tick() => probe_idle(connection, &mut buf).await?,
        }
    }
}

/// What to send for one request of a snapshot, with the netns an `add`
/// hands over. An `add` whose netns path is gone sends nothing: the pod
/// has left the node without a DEL, so its record is dropped and ztunnel
/// drops it at `snapshot_sent`. An `add` whose netns exists but cannot be
/// opened becomes `keep`, so ztunnel keeps the proxy it may already run.
async fn snapshot_entry(mesh: &Mesh, request: Request) -> Option<(Request, Option<File>)> {
    let Request::Add {
        uid,
        name,
        namespace,
        netns,
        ..
    } = &request
    else {
        return Some((request, None));
    };
    match File::open(netns) {
        Ok(file) => Some((request, Some(file))),
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            if let Err(error) = mesh.forget_gone(namespace, name, uid).await {
                tracing::warn!(pod = %format!("{namespace}/{name}"), error = %ErrorChain(&error), "cannot drop the record of a pod whose netns is gone");
            }
            None
        }
        Err(error) => {
            tracing::warn!(path = %netns.display(), error = %ErrorChain(&error), "cannot open a pod's netns for ztunnel; sending keep");
            request.keep_for_snapshot().map(|keep| (keep, None))
        }
    }
}

/// Sends a live event, tells its sender the outcome, and returns the error
/// when it ends the connection. A live `add` whose netns cannot be opened
/// is not sent (`keep` is only allowed during a snapshot).
async fn deliver(connection: &SeqPacket, event: ZdsEvent, buf: &mut [u8]) -> Result<(), ZdsError> {
    let netns = match &event.request {
        Request::Add { netns, .. } => match File::open(netns) {
            Ok(file) => Some(file),
            Err(error) => {
                tracing::warn!(path = %netns.display(), error = %ErrorChain(&error), "cannot open a pod's netns for ztunnel");
                if let Some(sender) = event.reply {
                    let _ = sender.send(Err(ZdsError::NetnsGone(error.to_string())));
                }
                return Ok(());
            }
        },
        _ => None,
    };
    let outcome = exchange(connection, &event.request, netns.as_ref(), buf).await;
    // Any failure of the exchange leaves the connection out of step (acks
    // match requests by order), so it ends the connection.
    let (reply, fatal) = match outcome {
        Ok(Ack::Ack) => (Ok(()), None),
        Ok(Ack::Nack(text)) => {
            tracing::warn!(request = ?event.request, nack = %text, "ztunnel refused a request");
            (Err(ZdsError::Nack(text)), None)
        }
        Err(error) => (
            Err(ZdsError::ConnectionLost(error.to_string())),
            Some(error),
        ),
    };
    if let Some(sender) = event.reply {
        let _ = sender.send(reply);
    }
    fatal.map_or(Ok(()), Err)
}

/// Sends one request (with `netns` as the fd, for `add`) and reads its
/// answer.
async fn exchange(
    connection: &SeqPacket,
    request: &Request,
    netns: Option<&File>,
    buf: &mut [u8],
) -> Result<Ack, ZdsError> {
    let bytes = request.encode();
    tokio::time::timeout(IO_DEADLINE, connection.send(&bytes, netns.map(File::as_fd)))
        .await
        .map_err(|_| ZdsError::Timeout("sending a request"))?
        .map_err(ZdsError::Io)?;
    let len = receive(connection, buf, IO_DEADLINE).await?;
    Ok(wire::decode_ack(&buf[..len])?)
}

/// Reads one datagram within `deadline`; end of stream and truncation are
/// errors.
async fn receive(
    connection: &SeqPacket,
    buf: &mut [u8],
    deadline: Duration,
) -> Result<usize, ZdsError> {
    let datagram = tokio::time::timeout(deadline, connection.recv(buf))
        .await
        .map_err(|_| ZdsError::Timeout("waiting for ztunnel"))?
        .map_err(ZdsError::Io)?;
    if datagram.len == 0 {
        return Err(ZdsError::Closed);
    }
    if datagram.truncated {
        return Err(ZdsError::Truncated);
    }
    Ok(datagram.len)
}

/// A short read on an idle connection: silence means alive, end of stream
/// or an error means gone, and a message nobody asked for is a protocol
/// error.
async fn probe_idle(connection: &SeqPacket, buf: &mut [u8]) -> Result<(), ZdsError> {
    match receive(connection, buf, PROBE_READ).await {
        Err(ZdsError::Timeout(_)) => Ok(()),
        Err(error) => Err(error),
        Ok(_) => Err(ZdsError::Unexpected),
    }
}

/// Why a ZDS exchange or connection failed.
#[derive(Debug, thiserror::Error)]
pub enum ZdsError {
    /// The socket failed.
    #[error("ZDS socket: {0}")]
    Io(std::io::Error),
    /// A deadline passed.
    #[error("ZDS timeout {0}")]
    Timeout(&'static str),
    /// ztunnel closed the connection.
    #[error("ztunnel closed the connection")]
    Closed,
    /// ztunnel sent a datagram longer than the receive buffer.
    #[error("ztunnel sent a datagram longer than {RECV_BUFFER} bytes")]
    Truncated,
    /// ztunnel sent bytes that are not the expected message.
    #[error(transparent)]
    Wire(#[from] WireError),
    /// ztunnel sent a message while idle.
    #[error("ztunnel sent a message nobody asked for")]
    Unexpected,
    /// ztunnel refused the request.
    #[error("ztunnel refused: {0}")]
    Nack(String),
    /// A live `add` whose netns cannot be opened; nothing was sent.
    #[error("cannot open the pod's netns for ztunnel: {0}")]
    NetnsGone(String),
    /// The connection failed while this request was in flight.
    #[error("ztunnel connection lost: {0}")]
    ConnectionLost(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_most_five_accepts_per_second() {
        let start = Instant::now();
        let mut limiter = AcceptLimiter::default();
        for n in 0..5 {
            let now = start + Duration::from_millis(n * 10);
            assert_eq!(limiter.delay(now), None, "accept {n}");
            limiter.record(now);
        }
        let sixth = start + Duration::from_millis(50);
        assert_eq!(limiter.delay(sixth), Some(Duration::from_millis(950)));
        assert_eq!(limiter.delay(start + Duration::from_secs(1)), None);
        limiter.record(start + Duration::from_secs(1));
        assert_eq!(
            limiter.delay(start + Duration::from_secs(1)),
            Some(Duration::from_millis(10))
        );
    }

    #[test]
    fn adds_go_to_the_newest_live_connection_and_dels_to_all() {
        let mut connections = Connections::default();
        let (first, mut first_rx) = connections.register();
        let (_second, second_rx) = connections.register();
        drop(second_rx);
        let event = ZdsEvent {
            request: Request::Del { uid: "a".into() },
            reply: None,
        };
        assert!(connections.send_to_newest(event));
        assert_eq!(
            connections.len(),
            1,
            "the dead newest connection is dropped"
        );
        assert_eq!(
            first_rx.try_recv().unwrap().request,
            Request::Del { uid: "a".into() }
        );

        let (_third, mut third_rx) = connections.register();
        connections.send_to_all(&Request::Del { uid: "b".into() });
        assert!(first_rx.try_recv().is_ok() && third_rx.try_recv().is_ok());

        connections.deregister(first);
        connections.send_to_all(&Request::SnapshotSent);
        assert!(first_rx.try_recv().is_err());
        drop(third_rx);
        let event = ZdsEvent {
            request: Request::SnapshotSent,
            reply: None,
        };
        assert!(!connections.send_to_newest(event));
        assert!(connections.is_empty());
    }
}
