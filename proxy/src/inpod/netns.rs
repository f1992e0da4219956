//! Network namespaces in the shared mode: the proxy's own ([`HostNetns`]),
//! a pod's ([`PodNetns`], from the fd the node agent passed), and the
//! [`SocketFactory`] that creates a pod's sockets inside the pod's namespace
//! ([`NetnsSockets`]).
//!
//! A socket belongs to the namespace its creating thread was in when it was
//! created, whatever thread uses it afterwards. So only `socket()` runs
//! inside the pod: listeners are made on a short-lived thread that enters
//! the pod and is then discarded; the per-connection dial sockets are made
//! on the calling thread, which enters the pod and comes straight back.

use std::fs::File;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use nix::sched::{CloneFlags, setns};
use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::{TcpSocket, UdpSocket};
use ztunnel_certs::error_chain::ErrorChain;

use crate::socket::{self, Keepalive, SocketFactory};

/// What tells two namespace handles apart: the nsfs device and inode. Two
/// handles on the same namespace (a `/proc/<pid>/ns/net` open and a
/// `/run/netns/<name>` bind mount) have the same id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NetnsId {
    device: u64,
    inode: u64,
}

impl NetnsId {
    /// The id of the namespace `fd` refers to.
    pub fn of(fd: impl AsFd) -> io::Result<NetnsId> {
        let stat = nix::sys::stat::fstat(fd)?;
        Ok(NetnsId {
            device: stat.st_dev,
            inode: stat.st_ino,
        })
    }
}

/// Whether `fd` is a handle on a network namespace: the kernel answers
/// `NS_GET_NSTYPE` with `CLONE_NEWNET` only for those. Any other file
/// (not a namespace, or another kind of namespace) is not.
pub fn is_network_namespace(fd: BorrowedFd<'_>) -> bool {
    // SAFETY: NS_GET_NSTYPE takes no argument and only reads the fd, which
    // `BorrowedFd` keeps open for the call; on a file that is not a
    // namespace the kernel answers ENOTTY.
    let kind = unsafe { nix::libc::ioctl(fd.as_fd().as_raw_fd(), nix::libc::NS_GET_NSTYPE) };
    kind == nix::libc::CLONE_NEWNET
}

/// The proxy's own network namespace, opened once at start, so that a
/// thread that entered a pod can come back.
#[derive(Debug, Clone)]
pub struct HostNetns {
    fd: Arc<OwnedFd>,
}

impl HostNetns {
    /// Opens the calling thread's namespace, and checks that the proxy may
    /// switch namespaces and mark sockets (WIRE.md §1): without
    /// CAP_SYS_ADMIN and CAP_NET_ADMIN the shared mode cannot work, so
    /// start-up fails here rather than at the first pod.
    pub fn open_and_probe(mark: Option<u32>) -> io::Result<HostNetns> {
        let file = File::open("/proc/thread-self/ns/net")?;
        let fd = OwnedFd::from(file);
        setns(&fd, CloneFlags::CLONE_NEWNET)
            .map_err(|error| io::Error::other(format!("setns into our own namespace: {error}")))?;
        if let Some(mark) = mark {
            let scratch = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))?;
            scratch
                .set_mark(mark)
                .map_err(|error| io::Error::other(format!("SO_MARK {mark}: {error}")))?;
        }
        Ok(HostNetns { fd: Arc::new(fd) })
    }
}

/// A pod's network namespace: our own duplicate of the agent's handle, kept
/// for as long as the pod is served.
#[derive(Debug, Clone)]
pub struct PodNetns {
    fd: Arc<OwnedFd>,
    id: NetnsId,
}

impl PodNetns {
    /// Duplicates `fd` and identifies its namespace. Fails if it is not a
    /// network namespace.
    pub fn new(fd: &OwnedFd) -> io::Result<PodNetns> {
        if !is_network_namespace(fd.as_fd()) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the handle is not a network namespace",
            ));
        }
        let fd = fd.try_clone()?;
        let id = NetnsId::of(&fd)?;
        Ok(PodNetns {
            fd: Arc::new(fd),
            id,
        })
    }

    /// Which namespace this is.
    pub fn id(&self) -> NetnsId {
        self.id
    }

    /// Runs `f` on a new thread that has entered the namespace; the thread
    /// ends with `f`, so nothing else ever runs in the pod by accident.
    pub fn run_on_thread<F, R>(&self, f: F) -> io::Result<R>
    where
        F: FnOnce() -> R + Send,
        R: Send,
    {
        std::thread::scope(|scope| {
            let entered = scope.spawn(|| {
                setns(self.fd.as_fd(), CloneFlags::CLONE_NEWNET)?;
                Ok(f())
            });
            entered
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("the namespace thread panicked")))
        })
    }

    /// Runs `f` on the calling thread inside the namespace, then returns the
    /// thread to `home`. `f` must not block or yield: it runs between two
    /// `setns` calls on a runtime thread.
    pub fn run_here<F, R>(&self, home: &HostNetns, f: F) -> io::Result<R>
    where
        F: FnOnce() -> R,
    {
        setns(self.fd.as_fd(), CloneFlags::CLONE_NEWNET)?;
        let result = f();
        if let Err(error) = setns(home.fd.as_fd(), CloneFlags::CLONE_NEWNET) {
            // A runtime thread stuck in a pod would create every later
            // socket, for every pod, in this one: never carry on like that.
            tracing::error!(error = %ErrorChain(&error), "cannot return to ztunnel's own network namespace; aborting");
            std::process::abort();
        }
        Ok(result)
    }
}

/// How the in-pod listeners are made (WIRE.md §1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenerOptions {
    /// SO_MARK on every socket.
    pub mark: Option<u32>,
    /// SO_REUSEPORT, so that an old and a new ztunnel share the ports.
    pub reuse_port: bool,
    /// IP_TRANSPARENT: `None` best effort, `Some(true)` required,
    /// `Some(false)` off.
    pub transparent: Option<bool>,
    /// TCP keepalive, which accepted connections inherit.
    pub keepalive: Keepalive,
}

/// The listeners of one pod, still plain std sockets: the caller registers
/// them with the data-plane runtime.
#[derive(Debug)]
pub struct PodListeners {
    /// 15001.
    pub outbound: std::net::TcpListener,
    /// 15006.
    pub inbound_plaintext: std::net::TcpListener,
    /// 15008.
    pub inbound: std::net::TcpListener,
    /// Whether IP_TRANSPARENT took on the inbound listeners, which decides
    /// whether the application dial keeps the client's IP.
    pub transparent: bool,
}

/// One failed listener.
#[derive(Debug)]
pub struct BindError {
    /// Which listener.
    pub what: &'static str,
    /// What the kernel said.
    pub source: io::Error,
}

/// Binds the three capture listeners inside `netns`, on a thread of its own.
pub fn bind_pod_listeners(
    netns: &PodNetns,
    addrs: [(SocketAddr, &'static str); 3],
    options: ListenerOptions,
) -> io::Result<Result<PodListeners, BindError>> {
    netns.run_on_thread(move || {
        let mut transparent = options.transparent != Some(false);
        let mut bind = |(addr, what)| {
            listener(addr, options, &mut transparent).map_err(|source| BindError { what, source })
        };
        let [outbound, inbound_plaintext, inbound] = addrs;
        let (outbound, inbound_plaintext, inbound) =
            (bind(outbound)?, bind(inbound_plaintext)?, bind(inbound)?);
        Ok(PodListeners {
            outbound,
            inbound_plaintext,
            inbound,
            transparent,
        })
    })
}

/// One in-pod listener. `transparent` goes in as "try it" and comes out as
/// "it worked everywhere so far".
fn listener(
    addr: SocketAddr,
    options: ListenerOptions,
    transparent: &mut bool,
) -> io::Result<std::net::TcpListener> {
    socket::listen(addr, options.mark, options.keepalive, |socket| {
        if options.reuse_port {
            socket.set_reuse_port(true)?;
        }
        if *transparent && let Err(error) = set_transparent(socket, addr) {
            if options.transparent == Some(true) {
                return Err(error);
            }
            tracing::debug!(error = %ErrorChain(&error), "IP_TRANSPARENT unavailable; the app sees ztunnel's address");
            *transparent = false;
        }
        Ok(())
    })
}

fn set_transparent(socket: &Socket, addr: SocketAddr) -> io::Result<()> {
    match addr {
        SocketAddr::V4(_) => socket.set_ip_transparent_v4(true),
        // The same flag as IP_TRANSPARENT, so it covers the IPv4
        // connections of a dual-stack socket too.
        SocketAddr::V6(_) => socket.set_ip_transparent_v6(true),
    }
}

/// The sockets of one pod: created inside its namespace, marked, and for the
/// application dial, from the client's own IP when the listeners are
/// transparent.
#[derive(Debug, Clone)]
pub struct NetnsSockets {
    /// The pod.
    pub netns: PodNetns,
    /// Where runtime threads return after creating a socket.
    pub home: HostNetns,
    /// SO_MARK for every socket.
    pub mark: Option<u32>,
    /// TCP keepalive on every socket.
    pub keepalive: Keepalive,
    /// Whether the application dial binds the client's IP (IP_TRANSPARENT).
    pub transparent: bool,
}

impl NetnsSockets {
    fn socket(&self, destination: SocketAddr) -> io::Result<Socket> {
        let socket = self
            .netns
            .run_here(&self.home, || socket::new_dial_socket(destination))??;
        socket::dial_socket(socket, self.mark, self.keepalive)
    }
}

impl SocketFactory for NetnsSockets {
    fn tcp_socket(&self, destination: SocketAddr, source: Option<IpAddr>) -> io::Result<TcpSocket> {
        let socket = self.socket(destination)?;
        if let Some(source) = source {
            socket::bind_source(&socket, source)?;
        }
        Ok(TcpSocket::from_std_stream(socket.into()))
    }

    fn upstream_socket(&self, destination: SocketAddr, client: IpAddr) -> io::Result<TcpSocket> {
        let socket = self.socket(destination)?;
        // Only a same-family client can be the source; otherwise the pod's
        // own address is, as without IP_TRANSPARENT.
        let same_family = client.is_ipv4() == destination.is_ipv4();
        if self.transparent && same_family {
            set_transparent(&socket, destination)?;
            socket::bind_source(&socket, client)?;
        }
        Ok(TcpSocket::from_std_stream(socket.into()))
    }

    fn udp_socket(&self, destination: SocketAddr) -> io::Result<UdpSocket> {
        let socket = self
            .netns
            .run_here(&self.home, || socket::new_udp_socket(destination))??;
        socket::udp_dial_socket(socket, destination, self.mark)
    }
}

#[cfg(test)]
mod tests;
