//! Joining two TCP sockets in the kernel, so that bytes received on one are
//! sent out of the other without waking the proxy: a socket hash map with
//! an `sk_skb` verdict program (`splice/bpf.rs`). The same-node path joins a
//! client's captured connection to the application connection it was
//! admitted to once the connection has shown it is chatty; from then on
//! each request and response costs the kernel's work only, where a copy in
//! the proxy costs two wake-ups and four system calls per round trip.
//!
//! The proxy still owns both sockets: it learns of each side's close from
//! an epoll set that reports only hang-ups (never data), propagates the
//! half-close once the bytes before it are out, counts the bytes from the
//! kernel's TCP counters, and closes both sides when told to stop.
//!
//! What is joined, and when, is the caller's business (`outbound/same_node.rs`).

use std::future::Future;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::pin::pin;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use nix::libc;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::net::TcpStream;

use crate::copy::{CopyError, Transferred, Way, copy_bidirectional_until};

mod bpf;

use bpf::{SocketMap, Verdict};

/// The most sockets joined at once, two per connection. The kernel sizes
/// each map's hash table by it up front (16 bytes a slot, 512 KiB a map,
/// charged to the proxy's memory group); a node with more chatty same-node
/// connections than this copies the rest in the proxy.
const CAPACITY: u32 = 32_768;

/// How often a closing side checks that the bytes before its close have
/// left through the other side. The check is two socket options; the wait
/// is as long as the destination's reader is slow, usually none.
const DRAIN_POLL: Duration = Duration::from_millis(1);

/// How long a close waits for bytes the kernel still holds for a reader
/// that does not read; then the close goes ahead and they are lost, as
/// they would be with a proxy whose write never completes.
const DRAIN_LIMIT: Duration = Duration::from_secs(30);

/// The kernel objects every splice of the process shares: `peers` holds,
/// under each joined socket's cookie, the socket its bytes go out of;
/// `active` holds the joined sockets themselves, and its verdict program
/// runs for each. A socket is put in `peers` before `active`, so that once
/// its bytes are redirected the socket they go to is always there.
pub struct Splicer {
    peers: SocketMap,
    active: SocketMap,
    _verdict: Verdict,
}

/// Why the kernel cannot join sockets here.
#[derive(Debug, thiserror::Error)]
#[error(
    "joining sockets in the kernel is not available: {0} (needs Linux 5.13 or later with BPF socket maps, and CAP_BPF with CAP_NET_ADMIN)"
)]
pub struct Unavailable(io::Error);

impl Splicer {
    /// Creates the maps and loads the program.
    pub fn new() -> Result<Splicer, Unavailable> {
        let peers = SocketMap::new("ztunnel_peers", CAPACITY).map_err(Unavailable)?;
        let active = SocketMap::new("ztunnel_active", CAPACITY).map_err(Unavailable)?;
        let verdict = Verdict::attach(&peers, &active).map_err(Unavailable)?;
        Ok(Splicer {
            peers,
            active,
            _verdict: verdict,
        })
    }

    /// The process's splicer, made on first use; `None`, logged once, when
    /// the kernel refuses it.
    pub fn shared() -> Option<&'static Splicer> {
        static SHARED: OnceLock<Option<Splicer>> = OnceLock::new();
        SHARED
            .get_or_init(|| match Splicer::new() {
                Ok(splicer) => Some(splicer),
                Err(error) => {
                    tracing::warn!(%error, "same-node connections are copied by the proxy");
                    None
                }
            })
            .as_ref()
    }

    /// Joins `a` and `b`, which must hold nothing read and not yet
    /// written, and carries the connection until both sides closed or
    /// `stop` resolves. `before` is what the proxy copied until now; the
    /// counts returned are the whole connection's. Where the kernel refuses
    /// the join, the proxy goes on copying between the two. `joined` hears
    /// which it was, before the connection is carried.
    pub async fn run<S: Future<Output = ()>>(
        &self,
        mut a: TcpStream,
        mut b: TcpStream,
        before: Transferred,
        stop: S,
        joined: impl FnOnce(bool),
    ) -> Result<Transferred, CopyError> {
        let copy = async |a: &mut TcpStream, b: &mut TcpStream, stop| {
            copy_bidirectional_until(a, b, stop)
                .await
                .map(|moved| moved.after(before))
                .map_err(|error| error.after(before))
        };
        let watch = match watch(&a, &b) {
            Ok(watch) => watch,
            Err(error) => {
                tracing::debug!(%error, "not joining a connection");
                joined(false);
                return copy(&mut a, &mut b, stop).await;
            }
        };
        if let Err(error) = self.enter(watch.cookies, &a, &b) {
            // Full, most likely: this connection stays with the proxy.
            tracing::debug!(%error, "not joining a connection");
            self.leave(watch.cookies);
            joined(false);
            return copy(&mut a, &mut b, stop).await;
        }
        // Out of tokio's reactor, whose registration would wake the proxy
        // for every buffer the kernel now forwards. Deregistering fails
        // only for a socket the reactor no longer knows.
        let sockets = match (a.into_std(), b.into_std()) {
            (Ok(a), Ok(b)) => [OwnedFd::from(a), OwnedFd::from(b)],
            (Err(source), _) | (_, Err(source)) => {
                self.leave(watch.cookies);
                joined(false);
                return Err(CopyError::Read {
                    direction: Way::AToB,
                    transferred: before,
                    source,
                });
            }
        };
        let joined_sockets = Joined {
            splicer: self,
            sockets,
            cookies: watch.cookies,
            directions: [Direction::Open; 2],
        };
        // Bytes that arrived before the join wait in the receive queues
        // for a wake-up that already happened: ask for one now.
        for socket in &joined_sockets.sockets {
            kick(socket);
        }
        tracing::debug!(
            before.a_to_b,
            before.b_to_a,
            "connection joined in the kernel"
        );
        joined(true);
        joined_sockets.carry(&watch.hangups, stop).await
    }

    fn enter(&self, cookies: [u64; 2], a: &TcpStream, b: &TcpStream) -> io::Result<()> {
        self.peers.insert(cookies[0], b)?;
        self.peers.insert(cookies[1], a)?;
        self.active.insert(cookies[0], a)?;
        self.active.insert(cookies[1], b)
    }

    fn leave(&self, cookies: [u64; 2]) {
        for cookie in cookies {
            self.active.remove(cookie);
        }
        for cookie in cookies {
            self.peers.remove(cookie);
        }
    }
}

/// What watches a connection's two sides for hang-ups: an epoll set of
/// its own, registered with tokio, that reports hang-ups and errors only
/// (never data), so that the proxy wakes for a joined connection only when
/// one of its sides closes.
struct Watch {
    cookies: [u64; 2],
    hangups: AsyncFd<Hangups>,
}

fn watch(a: &TcpStream, b: &TcpStream) -> io::Result<Watch> {
    let cookies = [cookie(a)?, cookie(b)?];
    let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
    let interest = EpollFlags::EPOLLRDHUP | EpollFlags::EPOLLET;
    epoll.add(a, EpollEvent::new(interest, 0))?;
    epoll.add(b, EpollEvent::new(interest, 1))?;
    // SAFETY: `Hangups` owns the epoll descriptor and returns that same
    // descriptor for as long as it lives, which is as long as the AsyncFd.
    let hangups = unsafe { AsyncFd::register_with_interest(Hangups(epoll), Interest::READABLE) }
        .map_err(io::Error::from)?;
    Ok(Watch { cookies, hangups })
}

/// A joined connection: side 0 is `a`, side 1 is `b`.
struct Joined<'a> {
    splicer: &'a Splicer,
    sockets: [OwnedFd; 2],
    cookies: [u64; 2],
    /// Indexed by the side the bytes come from.
    directions: [Direction; 2],
}

/// Where one direction (bytes received on one side, sent out of the
/// other) is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    Open,
    /// Its source closed at `since`; waiting for the bytes before the close
    /// to leave.
    Draining {
        since: Instant,
    },
    /// The destination's write side is shut down.
    Done,
}

impl Joined<'_> {
    async fn carry<S: Future<Output = ()>>(
        mut self,
        hangups: &AsyncFd<Hangups>,
        stop: S,
    ) -> Result<Transferred, CopyError> {
        let mut stop = pin!(stop);
        loop {
            let draining = self
                .directions
                .iter()
                .any(|direction| matches!(direction, Direction::Draining { .. }));
            tokio::select! {
                () = &mut stop => {
                    return Err(CopyError::Stopped { transferred: self.transferred() });
                }
                ready = hangups.readable() => match ready {
                    Ok(mut ready) => ready.clear_ready(),
                    Err(_) => return Err(CopyError::Stopped { transferred: self.transferred() }),
                },
                () = tokio::time::sleep(DRAIN_POLL), if draining => {}
            }
            let mut events = [EpollEvent::empty(); 2];
            let count = wait(hangups, &mut events);
            for event in &events[..count] {
                let side = usize::from(event.data() == 1);
                if event.events().contains(EpollFlags::EPOLLERR) {
                    return self.failed(side);
                }
                if self.directions[side] == Direction::Open
                    && event.events().contains(EpollFlags::EPOLLRDHUP)
                {
                    self.directions[side] = Direction::Draining {
                        since: Instant::now(),
                    };
                }
            }
            for side in 0..2 {
                if let Direction::Draining { since } = self.directions[side]
                    && (self.drained(side) || since.elapsed() > DRAIN_LIMIT)
                {
                    // The other side may be gone already; its own hang-up
                    // or error says so.
                    let _ = shutdown(&self.sockets[1 - side]);
                    self.directions[side] = Direction::Done;
                }
            }
            if self.directions == [Direction::Done; 2] {
                return Ok(self.transferred());
            }
        }
    }

    /// Side `side` failed (a reset, most likely). Like the proxy's copy, a
    /// reset on one side is its close, and an error only when bytes were
    /// still owed to it.
    fn failed(&self, side: usize) -> Result<Transferred, CopyError> {
        let transferred = self.transferred();
        if self.directions[1 - side] == Direction::Done {
            return Ok(transferred);
        }
        let direction = if side == 0 { Way::BToA } else { Way::AToB };
        Err(CopyError::Write {
            direction,
            transferred,
            source: socket_error(&self.sockets[side]),
        })
    }

    /// Whether every byte side `side` received before its FIN has been
    /// written to the other side.
    fn drained(&self, side: usize) -> bool {
        self.written(1 - side) >= self.received(side)
    }

    /// Data bytes side `side` received. A FIN takes a sequence number,
    /// which the kernel's count includes; a side whose direction is no
    /// longer open received one.
    fn received(&self, side: usize) -> u64 {
        let fin = u64::from(self.directions[side] != Direction::Open);
        received(&self.sockets[side]).saturating_sub(fin)
    }

    /// Data bytes written to side `side`, whose FIN the proxy sent once the
    /// other side's direction was done.
    fn written(&self, side: usize) -> u64 {
        let fin = u64::from(self.directions[1 - side] == Direction::Done);
        written(&self.sockets[side]).saturating_sub(fin)
    }

    /// Bytes moved each way: what a side received and the other wrote, the
    /// lesser, so that bytes still on their way do not count as moved.
    fn transferred(&self) -> Transferred {
        let way = |from: usize| self.received(from).min(self.written(1 - from));
        Transferred {
            a_to_b: way(0),
            b_to_a: way(1),
        }
    }
}

impl Drop for Joined<'_> {
    fn drop(&mut self) {
        // Out of the program's sight before the sockets close, so that
        // nothing is redirected to a socket on its way out.
        self.splicer.leave(self.cookies);
    }
}

/// The events waiting in a watch's epoll set, without blocking.
fn wait(hangups: &AsyncFd<Hangups>, events: &mut [EpollEvent]) -> usize {
    hangups
        .get_ref()
        .0
        .wait(events, EpollTimeout::ZERO)
        .unwrap_or(0)
}

/// An epoll set as tokio registers it.
struct Hangups(Epoll);

impl AsRawFd for Hangups {
    fn as_raw_fd(&self) -> RawFd {
        self.0.0.as_raw_fd()
    }
}

/// The socket's cookie: the kernel's name for it, which the verdict
/// program looks its peer up by.
fn cookie(socket: &impl AsFd) -> io::Result<u64> {
    let mut cookie = 0u64;
    option(socket, libc::SO_COOKIE, &mut cookie)?;
    Ok(cookie)
}

/// Bytes the socket received (the connection's whole life).
fn received(socket: &impl AsFd) -> u64 {
    counters(socket).map_or(0, |(_, received)| received)
}

/// Bytes written to the socket: acknowledged by the peer, or still queued.
fn written(socket: &impl AsFd) -> u64 {
    // Acknowledged first: read the other way round, an acknowledgement
    // between the two reads would count its bytes twice.
    let Ok((acked, _)) = counters(socket) else {
        return 0;
    };
    let mut queued: libc::c_int = 0;
    // SAFETY: TIOCOUTQ (SIOCOUTQ) on a TCP socket writes one int, the bytes
    // written and not yet acknowledged, to the pointer it is given.
    let result = unsafe {
        libc::ioctl(
            socket.as_fd().as_raw_fd(),
            libc::TIOCOUTQ,
            std::ptr::from_mut(&mut queued),
        )
    };
    if result < 0 {
        return acked;
    }
    acked + u64::from(queued.unsigned_abs())
}

/// `tcpi_bytes_acked` and `tcpi_bytes_received` from `TCP_INFO` (Linux
/// 4.1 and later), at byte offsets 120 and 128 of `struct tcp_info`.
fn counters(socket: &impl AsFd) -> io::Result<(u64, u64)> {
    let mut info = [0u64; 17];
    option_at(socket, libc::IPPROTO_TCP, libc::TCP_INFO, &mut info)?;
    Ok((info[15], info[16]))
}

/// Sets the socket's receive low-water mark, which makes the kernel check
/// its receive queue at once and hand what is there to the verdict program.
fn kick(socket: &impl AsFd) {
    let low_water: libc::c_int = 1;
    // SAFETY: SO_RCVLOWAT reads one int from the pointer, of the size given.
    let _ = unsafe {
        libc::setsockopt(
            socket.as_fd().as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            std::ptr::from_ref(&low_water).cast(),
            socklen::<libc::c_int>(),
        )
    };
}

/// Shuts down the socket's write side: the peer reads EOF.
fn shutdown(socket: &impl AsFd) -> io::Result<()> {
    nix::sys::socket::shutdown(
        socket.as_fd().as_raw_fd(),
        nix::sys::socket::Shutdown::Write,
    )
    .map_err(io::Error::from)
}

/// The error pending on the socket (`SO_ERROR`).
fn socket_error(socket: &impl AsFd) -> io::Error {
    let mut code: libc::c_int = 0;
    match option(socket, libc::SO_ERROR, &mut code) {
        Ok(()) if code != 0 => io::Error::from_raw_os_error(code),
        Ok(()) => io::ErrorKind::ConnectionReset.into(),
        Err(error) => error,
    }
}

fn option<T>(socket: &impl AsFd, name: libc::c_int, value: &mut T) -> io::Result<()> {
    option_at(socket, libc::SOL_SOCKET, name, value)
}

/// Reads socket option `name` at `level` into `value`, which the kernel
/// fills as far as it has data.
fn option_at<T>(
    socket: &impl AsFd,
    level: libc::c_int,
    name: libc::c_int,
    value: &mut T,
) -> io::Result<()> {
    let mut length = socklen::<T>();
    // SAFETY: the kernel writes at most `length` bytes, the size of `value`,
    // to it, and the length it wrote to `length`; T is plain integers.
    let result = unsafe {
        libc::getsockopt(
            socket.as_fd().as_raw_fd(),
            level,
            name,
            std::ptr::from_mut(value).cast(),
            &mut length,
        )
    };
    if result < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn socklen<T>() -> libc::socklen_t {
    // Socket option values here are a few bytes to a few hundred.
    libc::socklen_t::try_from(std::mem::size_of::<T>()).unwrap_or(libc::socklen_t::MAX)
}

#[cfg(test)]
mod tests;
