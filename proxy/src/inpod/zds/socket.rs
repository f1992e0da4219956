//! The node agent's SOCK_SEQPACKET socket, as tokio sees it: connect,
//! send one datagram, receive one datagram with its SCM_RIGHTS fds. What
//! the bytes mean lives in `message.rs`; whether an fd is a network
//! namespace, in `inpod/netns.rs`.
//!
//! The agent tells ztunnel which pods to serve, with which identities, in
//! which network namespaces, so a socket at the agent's path served by any
//! other process would have ztunnel ask the CA for identities on its word.
//! A connection is therefore used only when the listening process (its
//! `SO_PEERCRED`) runs as root, as istio-cni and our agent do in every
//! chart, or as ztunnel's own uid, as in tests and on a developer's
//! machine. istio's ztunnel does not check.

use std::io;
use std::io::IoSliceMut;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

use nix::sys::socket::{self, ControlMessageOwned, MsgFlags};
use socket2::{Domain, SockAddr, Socket, Type};
use tokio::io::unix::AsyncFd;

use super::message::Datagram;

/// The receive buffer, as in istio's ztunnel and agent (WIRE.md §5): a
/// request longer than this is a read error, never a partial read.
pub const RECEIVE_BUFFER: usize = 1024;

/// The most fds one datagram can carry (the kernel's `SCM_MAX_FD`). The
/// control buffer is sized for all of them so the kernel never has to cut
/// it (`MSG_CTRUNC`), which would leave fds we could not see and close.
const SCM_MAX_FD: usize = 253;

/// A connected SOCK_SEQPACKET socket to the node agent, non-blocking and
/// driven by tokio.
#[derive(Debug)]
pub struct ZdsSocket {
    fd: AsyncFd<OwnedFd>,
}

/// What one receive gave.
#[derive(Debug)]
pub enum Received {
    /// A datagram with at least one byte.
    Datagram(Datagram),
    /// A zero-length datagram or the peer's close: the end of the stream.
    End,
}

impl ZdsSocket {
    /// Connects to the agent's socket at `path`. Fails at once (the caller
    /// retries) when nothing listens there or the listener's queue is full.
    pub fn connect(path: &Path) -> io::Result<Self> {
        // socket2 sets SOCK_CLOEXEC on Linux.
        let socket = Socket::new(Domain::UNIX, Type::SEQPACKET, None)?;
        socket.set_nonblocking(true)?;
        socket.connect(&SockAddr::unix(path)?)?;
        let agent = socket::getsockopt(&socket, socket::sockopt::PeerCredentials)?.uid();
        if !trusted_agent(agent, nix::unistd::geteuid().as_raw()) {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("the socket is served by uid {agent}, neither root nor ztunnel's"),
            ));
        }
        Self::from_connected(socket)
    }

    /// Wraps an already connected SOCK_SEQPACKET socket, e.g. one end of a
    /// `socketpair` in tests. It is made non-blocking.
    pub fn from_fd(fd: OwnedFd) -> io::Result<Self> {
        let socket = Socket::from(fd);
        socket.set_nonblocking(true)?;
        Self::from_connected(socket)
    }

    fn from_connected(socket: Socket) -> io::Result<Self> {
        // SAFETY: an `OwnedFd` keeps its fd open, and always names the same
        // one, for as long as the `AsyncFd` that owns it lives.
        let fd = unsafe { AsyncFd::register(OwnedFd::from(socket)) }?;
        Ok(ZdsSocket { fd })
    }

    /// Sends one datagram.
    ///
    /// Cancel safe: the datagram is either sent whole or not at all.
    pub async fn send(&self, bytes: &[u8]) -> io::Result<()> {
        loop {
            let mut guard = self.fd.writable().await?;
            let sent = guard.try_io(|fd| {
                // MSG_NOSIGNAL: a closed peer is an error, not a SIGPIPE.
                socket::send(fd.as_raw_fd(), bytes, MsgFlags::MSG_NOSIGNAL).map_err(io::Error::from)
            });
            match sent {
                Ok(result) => return result.map(drop),
                Err(_would_block) => continue,
            }
        }
    }

    /// Receives one datagram with its fds.
    ///
    /// Cancel safe: the datagram is taken off the socket in one
    /// non-blocking call after readiness, so dropping the future while it
    /// waits loses nothing.
    pub async fn recv(&self) -> io::Result<Received> {
        loop {
            let mut guard = self.fd.readable().await?;
            match guard.try_io(|fd| receive_now(fd.as_raw_fd())) {
                Ok(result) => return result,
                Err(_would_block) => continue,
            }
        }
    }
}

/// Whether a node agent running as `agent` is believed, by a ztunnel
/// running as `own`.
fn trusted_agent(agent: u32, own: u32) -> bool {
    agent == 0 || agent == own
}

/// One non-blocking `recvmsg`.
fn receive_now(fd: RawFd) -> io::Result<Received> {
    let mut bytes = vec![0; RECEIVE_BUFFER];
    let mut control = nix::cmsg_space!([RawFd; SCM_MAX_FD]);
    let mut iov = [IoSliceMut::new(&mut bytes)];
    // MSG_CMSG_CLOEXEC: the fds never leak into a child process.
    let message =
        socket::recvmsg::<()>(fd, &mut iov, Some(&mut control), MsgFlags::MSG_CMSG_CLOEXEC)?;
    let mut truncated = message
        .flags
        .intersects(MsgFlags::MSG_TRUNC | MsgFlags::MSG_CTRUNC);
    let mut fds = Vec::new();
    match message.cmsgs() {
        Ok(cmsgs) => {
            for cmsg in cmsgs {
                if let ControlMessageOwned::ScmRights(raw_fds) = cmsg {
                    for raw in raw_fds {
                        // SAFETY: the kernel has just installed `raw` in our
                        // fd table for this SCM_RIGHTS message; nothing else
                        // refers to it, so this is its only owner.
                        fds.push(unsafe { OwnedFd::from_raw_fd(raw) });
                    }
                }
            }
        }
        // Only under MSG_CTRUNC, which the buffer size rules out for fds.
        Err(_) => truncated = true,
    }
    let length = message.bytes;
    if length == 0 && !truncated {
        return Ok(Received::End);
    }
    bytes.truncate(length);
    Ok(Received::Datagram(Datagram {
        bytes,
        fds,
        truncated,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_agent_running_as_root_or_as_ztunnel_is_believed() {
        // (reason, agent uid, ztunnel uid, believed)
        #[rustfmt::skip]
        let cases = [
            ("both root, as every chart runs them", 0, 0, true),
            ("a root agent and an unprivileged ztunnel", 0, 1337, true),
            ("one user runs both, as tests do", 1000, 1000, true),
            ("another user's socket at the agent's path", 65534, 0, false),
            ("another unprivileged user", 65534, 1000, false),
        ];
        for (reason, agent, own, believed) in cases {
            assert_eq!(trusted_agent(agent, own), believed, "{reason}");
        }
    }
}
