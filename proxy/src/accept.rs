//! The accept loop every listener shares (outbound 15001, inbound plaintext
//! 15006, inbound HBONE 15008): each accepted connection goes to the
//! listener's handler until the drain starts, and an accept error never
//! turns the loop into a spin.
//!
//! An error that leaves the connection queued (out of file descriptors:
//! `EMFILE`, `ENFILE`; out of memory: `ENOBUFS`, `ENOMEM`; anything not
//! known to concern one connection only) would come back at once on the
//! next accept: the loop pauses first, from [`MIN_PAUSE`] doubling to
//! [`MAX_PAUSE`] while the errors go on. An error about one connection only
//! (`ECONNABORTED`: the client gave up while queued) is counted and the loop
//! goes on at once. Every error is counted in `ztunnel_accept_errors_total`
//! by listener and kind; the log has one warning when a run of errors
//! starts and one line when accepting works again, with the run's count.
//! A connection the listener's admission refuses (its pod's share of the
//! connection bound, `capacity.rs`) is closed at once. When the drain starts, the
//! connections already queued on the listener are taken before it closes,
//! which would reset them.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use nix::errno::Errno;
use tokio::net::{TcpListener, TcpStream};

use crate::backoff::{Backoff, Jitter};
use crate::drain::DrainWatcher;
use crate::metrics::Metrics;

/// The first pause after an accept error that would repeat.
pub const MIN_PAUSE: Duration = Duration::from_millis(10);

/// The longest pause: how late a listener starts accepting again once the
/// resource it lacked is free.
pub const MAX_PAUSE: Duration = Duration::from_secs(1);

/// What an accept error means for the loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcceptErrorKind {
    /// The process or the system lacks a resource: the connection stays
    /// queued and the next accept would fail the same way. Also every
    /// error not known to be about one connection: deny the spin on doubt.
    Exhausted,
    /// Only the connection being accepted failed.
    Connection,
}

impl AcceptErrorKind {
    /// The `kind` label of `ztunnel_accept_errors_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            AcceptErrorKind::Exhausted => "exhausted",
            AcceptErrorKind::Connection => "connection",
        }
    }
}

/// What `error`, returned by `accept`, means for the loop.
pub fn classify(error: &io::Error) -> AcceptErrorKind {
    let errno = error.raw_os_error().map(Errno::from_raw);
    match errno {
        Some(Errno::ECONNABORTED | Errno::ECONNRESET | Errno::EPROTO | Errno::EINTR) => {
            AcceptErrorKind::Connection
        }
        _ => AcceptErrorKind::Exhausted,
    }
}

/// The pauses: no jitter, since listeners do not fail in step the way
/// clients of one server do.
const PAUSES: Backoff = Backoff {
    initial: MIN_PAUSE,
    max: MAX_PAUSE,
    multiplier: 2,
    jitter: Jitter::None,
};

/// The pause after the `repeated`-th error in a row that would repeat
/// (1 for the first): [`MIN_PAUSE`] doubled each time, at most [`MAX_PAUSE`].
pub fn pause(repeated: u32) -> Duration {
    PAUSES.wait(repeated, 0.0)
}

/// Accepts on `listener`, named `name` in logs and metrics, and hands each
/// connection `admit` lets in, with what `admit` gave it (a slot of the
/// connection bound, kept by the handler as long as it carries the
/// connection), to `handle` until `drain` is signalled. A connection
/// `admit` refuses is closed at once.
pub async fn serve<A, H>(
    listener: TcpListener,
    name: &'static str,
    drain: DrainWatcher,
    metrics: &Metrics,
    mut admit: impl FnMut() -> Option<A>,
    mut handle: H,
) where
    H: FnMut(TcpStream, SocketAddr, A),
{
    // Errors since the last accepted connection, and how many of them
    // would repeat.
    let (mut errors, mut repeated) = (0u64, 0u32);
    loop {
        let accepted = tokio::select! {
            () = drain.signaled() => {
                take_queued(&listener, name, &mut admit, &mut handle);
                return;
            }
            accepted = listener.accept() => accepted,
        };
        let error = match accepted {
            Ok((tcp, peer)) => {
                if errors > 0 {
                    tracing::info!(listener = name, errors, "accepting connections again");
                    (errors, repeated) = (0, 0);
                }
                // Closed at once (dropped) when refused.
                if let Some(admitted) = admit() {
                    handle(tcp, peer, admitted);
                }
                continue;
            }
            Err(error) => error,
        };
        let kind = classify(&error);
        metrics.record_accept_error(name, kind.as_str());
        errors += 1;
        if kind == AcceptErrorKind::Connection {
            tracing::debug!(listener = name, %error, "a connection failed while being accepted");
            continue;
        }
        repeated = repeated.saturating_add(1);
        if repeated == 1 {
            tracing::warn!(
                listener = name,
                %error,
                "cannot accept connections; retrying with pauses of up to {MAX_PAUSE:?} until it works"
            );
        }
        tokio::select! {
            () = drain.signaled() => return,
            () = tokio::time::sleep(pause(repeated)) => {}
        }
    }
}

/// The most connections [`queued`] takes: more than a listener's
/// backlog holds.
pub const MOST_QUEUED: usize = 8192;

/// Hands on the connections the kernel completed for `listener` but nobody
/// accepted yet, each as `admit` lets it in (refused ones are closed).
/// They are served like any connection accepted before the drain.
fn take_queued<A, H>(
    listener: &TcpListener,
    name: &'static str,
    admit: &mut impl FnMut() -> Option<A>,
    handle: &mut H,
) where
    H: FnMut(TcpStream, SocketAddr, A),
{
    for (tcp, peer) in queued(listener, name) {
        if let Some(admitted) = admit() {
            handle(tcp, peer, admitted);
        }
    }
}

/// The connections the kernel completed for `listener` (named `name` in
/// logs) but nobody accepted yet, taken without waiting: at most
/// [`MOST_QUEUED`]. Closing a listener resets them; in a rollout the new
/// ztunnel's listener beside this one (SO_REUSEPORT) takes only those that
/// arrive later, so a draining listener takes these before it closes.
pub fn queued<'a>(
    listener: &'a TcpListener,
    name: &'static str,
) -> impl Iterator<Item = (TcpStream, SocketAddr)> + 'a {
    let socket = socket2::SockRef::from(listener);
    (0..MOST_QUEUED)
        // The listener is non-blocking: an empty queue is WouldBlock.
        .map_while(move |_| socket.accept().ok())
        .filter_map(move |(accepted, peer)| {
            let peer = peer.as_socket()?;
            let std: std::net::TcpStream = accepted.into();
            match std
                .set_nonblocking(true)
                .and_then(|()| TcpStream::from_std(std))
            {
                Ok(tcp) => Some((tcp, peer)),
                Err(error) => {
                    tracing::debug!(listener = name, %error, "a queued connection could not be taken");
                    None
                }
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn connections_queued_when_the_drain_starts_are_served_not_reset() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        // Their handshakes complete in the kernel; nobody has accepted them.
        let clients: Vec<std::net::TcpStream> = (0..3)
            .map(|_| std::net::TcpStream::connect(address).unwrap())
            .collect();
        let (trigger, drain) = crate::drain::channel();
        let draining = tokio::spawn(async move { trigger.drain(Duration::from_secs(5)).await });
        tokio::task::yield_now().await;
        let metrics = Metrics::register(
            &mut prometheus_client::registry::Registry::default(),
            "test",
        );
        let mut served = Vec::new();
        serve(
            listener,
            "test",
            drain,
            &metrics,
            || Some(()),
            |tcp, peer, ()| {
                served.push((tcp, peer));
            },
        )
        .await;
        let mut peers: Vec<SocketAddr> = served.iter().map(|(_, peer)| *peer).collect();
        let mut expected: Vec<SocketAddr> = clients
            .iter()
            .map(|client| client.local_addr().unwrap())
            .collect();
        peers.sort();
        expected.sort();
        assert_eq!(peers, expected);
        // Each is a working connection: bytes cross it.
        for (tcp, peer) in &mut served {
            tokio::io::AsyncWriteExt::write_all(tcp, b"x")
                .await
                .unwrap();
            let mut client = clients
                .iter()
                .find(|client| client.local_addr().unwrap() == *peer)
                .unwrap();
            let mut byte = [0u8; 1];
            std::io::Read::read_exact(&mut client, &mut byte).unwrap();
            assert_eq!(&byte, b"x");
        }
        draining.await.unwrap();
    }

    #[test]
    fn errors_that_would_repeat_pause_and_others_do_not() {
        let cases = [
            (Errno::EMFILE, AcceptErrorKind::Exhausted),
            (Errno::ENFILE, AcceptErrorKind::Exhausted),
            (Errno::ENOBUFS, AcceptErrorKind::Exhausted),
            (Errno::ENOMEM, AcceptErrorKind::Exhausted),
            (Errno::EINVAL, AcceptErrorKind::Exhausted),
            (Errno::ECONNABORTED, AcceptErrorKind::Connection),
            (Errno::ECONNRESET, AcceptErrorKind::Connection),
            (Errno::EPROTO, AcceptErrorKind::Connection),
            (Errno::EINTR, AcceptErrorKind::Connection),
        ];
        for (errno, kind) in cases {
            let error = io::Error::from_raw_os_error(errno as i32);
            assert_eq!(classify(&error), kind, "{errno}");
        }
        let no_errno = io::Error::other("not from the kernel");
        assert_eq!(classify(&no_errno), AcceptErrorKind::Exhausted);
    }

    #[test]
    fn pauses_double_from_the_minimum_to_the_maximum() {
        let pauses: Vec<u128> = [1, 2, 3, 7, 8, 100, u32::MAX]
            .into_iter()
            .map(|repeated| pause(repeated).as_millis())
            .collect();
        assert_eq!(pauses, [10, 20, 40, 640, 1000, 1000, 1000]);
        assert_eq!(pause(0), MIN_PAUSE);
    }
}
