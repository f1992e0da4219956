//! Where the proxy's sockets come from. The data path asks a
//! [`SocketFactory`] for its outgoing sockets and never creates them itself,
//! so the same core serves a dedicated proxy (ordinary sockets here) and the
//! in-pod mode (sockets made inside each pod's network namespace,
//! `inpod/netns.rs`). Listeners are bound by each mode's start-up with
//! [`listen`], the one set-up both share. Also reads the original
//! destination of a redirected connection.

use std::io;
use std::net::{IpAddr, SocketAddr};

use nix::sys::socket::{setsockopt, sockopt};
use socket2::{Domain, Protocol, SockRef, Socket, Type};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

/// Backlog of each listener: enough for a burst of pod connections while
/// the accept loop is busy, the kernel caps it at `somaxconn` anyway.
const LISTEN_BACKLOG: i32 = 1024;

/// Makes the sockets of one proxied workload.
pub trait SocketFactory: Send + Sync + 'static {
    /// An unconnected TCP socket for `destination`'s family, optionally bound
    /// to `source` (port 0). The caller connects it.
    fn tcp_socket(&self, destination: SocketAddr, source: Option<IpAddr>) -> io::Result<TcpSocket>;

    /// An unconnected socket for dialing the application on behalf of
    /// `client`. A factory that can keep the client's IP as the source
    /// (IP_TRANSPARENT inside a pod) does; the default dials from our own.
    fn upstream_socket(&self, destination: SocketAddr, client: IpAddr) -> io::Result<TcpSocket> {
        let _ = client;
        self.tcp_socket(destination, None)
    }
}

/// Ordinary sockets in the current network namespace, each carrying the
/// packet mark so that capture rules skip the proxy's own traffic.
#[derive(Debug, Clone, Copy, Default)]
pub struct LocalSockets {
    /// SO_MARK for every socket; `None` sets none.
    pub mark: Option<u32>,
}

impl LocalSockets {
    /// A bound, listening TCP socket in the current namespace.
    pub fn tcp_listener(&self, addr: SocketAddr) -> io::Result<TcpListener> {
        TcpListener::from_std(listen(addr, self.mark, |_| Ok(()))?)
    }
}

impl SocketFactory for LocalSockets {
    fn tcp_socket(&self, destination: SocketAddr, source: Option<IpAddr>) -> io::Result<TcpSocket> {
        let socket = dial_socket(new_dial_socket(destination)?, self.mark)?;
        if let Some(source) = source {
            bind_source(&socket, source)?;
        }
        Ok(TcpSocket::from_std_stream(socket.into()))
    }
}

/// A listening TCP socket on `addr`, set up as every proxy listener is:
/// one dual-stack socket on `[::]` (IPv4 peers show as ::ffff:a.b.c.d),
/// SO_REUSEADDR, non-blocking, no Nagle, and `mark` as SO_MARK.
/// `before_bind` adds the caller's own options (SO_REUSEPORT,
/// IP_TRANSPARENT).
pub fn listen(
    addr: SocketAddr,
    mark: Option<u32>,
    before_bind: impl FnOnce(&Socket) -> io::Result<()>,
) -> io::Result<std::net::TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    if addr.is_ipv6() {
        socket.set_only_v6(false)?;
    }
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.set_tcp_nodelay(true)?;
    if let Some(mark) = mark {
        socket.set_mark(mark)?;
    }
    before_bind(&socket)?;
    socket.bind(&addr.into())?;
    socket.listen(LISTEN_BACKLOG)?;
    Ok(socket.into())
}

/// A new TCP socket for dialing `destination`'s family, in the calling
/// thread's namespace: non-blocking from its creation, which saves the two
/// `fcntl` calls of setting it afterwards on every dial.
pub fn new_dial_socket(destination: SocketAddr) -> io::Result<Socket> {
    let domain = Domain::for_address(destination);
    Socket::new(domain, Type::STREAM.nonblocking(), Some(Protocol::TCP))
}

/// Sets up a socket from [`new_dial_socket`] as every proxy dial is: no
/// Nagle, and `mark` as SO_MARK so that capture rules skip it.
pub fn dial_socket(socket: Socket, mark: Option<u32>) -> io::Result<Socket> {
    socket.set_tcp_nodelay(true)?;
    if let Some(mark) = mark {
        socket.set_mark(mark)?;
    }
    Ok(socket)
}

/// Binds a dialing socket to `source` with the port left to `connect`.
///
/// A plain bind to port 0 picks the port at bind time, without knowing the
/// destination, so a port bound once to `source` is taken for every
/// destination: the inbound dial keeps the client's IP, so one client IP
/// could hold at most one ephemeral range's worth (~28,000) of connections
/// to all the pod's ports together, and each bind searched the ports bound
/// so far (perf: 96 % of the server proxy's CPU in `bind` while 10,000
/// connections opened). IP_BIND_ADDRESS_NO_PORT defers the choice to
/// `connect`, which only needs the full four-tuple to be unique.
pub fn bind_source(socket: &Socket, source: IpAddr) -> io::Result<()> {
    // Without the option (a kernel older than 4.2) the bind below still
    // works, only with the slow port search; so a failure here is not one.
    if let Err(error) = setsockopt(socket, sockopt::IpBindAddressNoPort, &true) {
        tracing::debug!(%error, "IP_BIND_ADDRESS_NO_PORT not set");
    }
    socket.bind(&SocketAddr::new(source, 0).into())
}

/// The destination a REDIRECT rule rewrote: `SO_ORIGINAL_DST` for IPv4,
/// `IP6T_SO_ORIGINAL_DST` for IPv6. On a connection that was not redirected
/// the kernel answers ENOENT.
pub fn original_destination(stream: &TcpStream) -> io::Result<SocketAddr> {
    let socket = SockRef::from(stream);
    let local = stream.local_addr()?;
    let is_v4 = match local.ip() {
        IpAddr::V4(_) => true,
        IpAddr::V6(ip) => ip.to_ipv4_mapped().is_some(),
    };
    let original = if is_v4 {
        socket.original_dst_v4()?
    } else {
        socket.original_dst_v6()?
    };
    let original = original.as_socket().ok_or_else(|| {
        io::Error::new(io::ErrorKind::InvalidData, "original destination is not IP")
    })?;
    Ok(canonical(original))
}

/// Maps `::ffff:a.b.c.d` to `a.b.c.d`, so that lookups see one form.
pub fn canonical(addr: SocketAddr) -> SocketAddr {
    match addr {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), v6.port()),
            None => addr,
        },
        SocketAddr::V4(_) => addr,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapped_addresses_become_ipv4() {
        let cases = [
            ("[::ffff:198.18.0.1]:80", "198.18.0.1:80"),
            ("198.18.0.1:80", "198.18.0.1:80"),
            ("[::1]:80", "[::1]:80"),
        ];
        for (input, want) in cases {
            let input: SocketAddr = input.parse().unwrap();
            assert_eq!(canonical(input), want.parse().unwrap());
        }
    }

    #[tokio::test]
    async fn a_connection_that_was_not_redirected_has_no_original_destination() {
        let sockets = LocalSockets::default();
        let listener = sockets
            .tcp_listener("127.0.0.1:0".parse().unwrap())
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let client = sockets.tcp_socket(addr, None).unwrap().connect(addr);
        let (client, accepted) = tokio::join!(client, listener.accept());
        let (_client, (server, _)) = (client.unwrap(), accepted.unwrap());
        assert!(original_destination(&server).is_err());
    }
}
