//! The ZDS transport: a unix SOCK_SEQPACKET listener and its connections,
//! non-blocking and driven by tokio's [`AsyncFd`] (no thread per
//! connection; readiness comes from the runtime's epoll). One message per
//! datagram; the netns travels as one SCM_RIGHTS fd.
//!
//! A connection from a process the peer policy does not admit is closed
//! at accept, before anything is sent on it.
//!
//! Datagrams are received without room for control messages, so an fd a
//! peer sends by mistake is discarded by the kernel instead of leaking
//! into the agent. `MSG_NOSIGNAL` keeps a closed peer from raising SIGPIPE.

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;

use nix::sys::socket::{
    AddressFamily, Backlog, ControlMessage, MsgFlags, SockFlag, SockType, UnixAddr, accept4, bind,
    listen, recvmsg, sendmsg, socket,
};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use ztunnel_certs::error_chain::ErrorChain;

use crate::agent::peer::PeerPolicy;
use crate::agent::socket_file::SocketFile;

/// Pending connections the kernel queues; ztunnel instances per node are
/// one or two (during a rollout).
const BACKLOG: i32 = 16;

/// A listening SOCK_SEQPACKET socket; the path is removed on drop while
/// it is still this socket's.
#[derive(Debug)]
pub struct SeqPacketListener {
    fd: AsyncFd<OwnedFd>,
    /// Who is served.
    peers: PeerPolicy,
    /// Removes the path on drop, unless another agent has bound it since.
    _file: SocketFile,
}

/// One accepted connection.
#[derive(Debug)]
pub struct SeqPacket {
    fd: AsyncFd<OwnedFd>,
}

/// What one receive returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Datagram {
    /// Bytes in the buffer; zero means the peer closed.
    pub len: usize,
    /// The datagram was longer than the buffer.
    pub truncated: bool,
}

impl SeqPacketListener {
    /// Binds and listens at `path` (mode 0600, replacing a stale socket,
    /// creating the directory if needed), to serve the peers `peers`
    /// admits. Must be called inside a tokio runtime.
    pub fn bind(path: &Path, peers: PeerPolicy) -> io::Result<SeqPacketListener> {
        let fd = socket(
            AddressFamily::Unix,
            SockType::SeqPacket,
            SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
            None,
        )?;
        let ((), file) = SocketFile::bind(path, |staged| {
            Ok(bind(fd.as_raw_fd(), &UnixAddr::new(staged)?)?)
        })?;
        listen(&fd, Backlog::new(BACKLOG)?)?;
        Ok(SeqPacketListener {
            fd: register(fd)?,
            peers,
            _file: file,
        })
    }

    /// Waits for the next connection from an admitted peer; others are
    /// closed as they come. Cancel safe: a connection not yet accepted
    /// stays queued in the kernel, and none is held between accepts.
    pub async fn accept(&self) -> io::Result<SeqPacket> {
        loop {
            let fd = self
                .fd
                .async_io(Interest::READABLE, |listener| {
                    Ok(accept4(
                        listener,
                        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
                    )?)
                })
                .await?;
            match self.peers.check(&fd) {
                Ok(_) => return Ok(SeqPacket { fd: register(fd)? }),
                Err(refused) => {
                    tracing::warn!(error = %ErrorChain(&refused), "closed a ZDS connection")
                }
            }
        }
    }
}

impl SeqPacket {
    /// Sends one datagram, with `netns` attached as SCM_RIGHTS when given.
    /// A short send cannot happen on SOCK_SEQPACKET: the datagram goes
    /// whole or not at all.
    pub async fn send(&self, bytes: &[u8], netns: Option<BorrowedFd<'_>>) -> io::Result<()> {
        let fds = netns.map(|fd| [fd.as_raw_fd()]);
        let rights: Vec<ControlMessage<'_>> = fds
            .as_ref()
            .map(|fds| ControlMessage::ScmRights(fds))
            .into_iter()
            .collect();
        self.fd
            .async_io(Interest::WRITABLE, |socket| {
                let iov = [IoSlice::new(bytes)];
                Ok(sendmsg::<UnixAddr>(
                    socket.as_raw_fd(),
                    &iov,
                    &rights,
                    MsgFlags::MSG_NOSIGNAL,
                    None,
                )?)
            })
            .await
            .map(drop)
    }

    /// Receives one datagram into `buf`. Cancel safe: a datagram is either
    /// taken whole by a completed call or left in the socket.
    pub async fn recv(&self, buf: &mut [u8]) -> io::Result<Datagram> {
        self.fd
            .async_io(Interest::READABLE, |socket| {
                let mut iov = [IoSliceMut::new(buf)];
                let message = recvmsg::<UnixAddr>(
                    socket.as_raw_fd(),
                    &mut iov,
                    None,
                    MsgFlags::MSG_CMSG_CLOEXEC,
                )?;
                Ok(Datagram {
                    len: message.bytes,
                    truncated: message
                        .flags
                        .intersects(MsgFlags::MSG_TRUNC | MsgFlags::MSG_CTRUNC),
                })
            })
            .await
    }
}

/// Hands a socket to the runtime's reactor.
#[allow(unsafe_code)] // tokio's only registration API is unsafe; see SAFETY.
fn register(fd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: `register` needs the raw fd to stay open and refer to the same
    // socket while registered. The `OwnedFd` owns it, is moved into the
    // `AsyncFd`, and is closed only when the `AsyncFd` (and with it the
    // registration) is dropped; nothing else closes it.
    unsafe { AsyncFd::register(fd) }.map_err(|error| error.into_parts().1)
}
