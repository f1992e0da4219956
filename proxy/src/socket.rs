//! Where the proxy's sockets come from. The data path asks a
//! [`SocketFactory`] for its outgoing sockets and never creates them itself,
//! so the same core serves a dedicated proxy (ordinary sockets here) and the
//! in-pod mode (sockets made inside each pod's network namespace,
//! `inpod/netns.rs`). Listeners are bound by each mode's start-up with
//! [`listen`], the one set-up both share. Also reads the original
//! destination of a redirected connection.
//!
//! Every data-plane socket carries the [`Keepalive`] settings (AMBIENT.md
//! §8.1): dials get them from their factory, and accepted connections from
//! their listener, whose TCP options the kernel copies onto each
//! connection it accepts (Linux's `tcp_create_openreq_child`), which saves
//! the five `setsockopt` calls per connection of setting them after accept.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use nix::sys::socket::{setsockopt, sockopt};
use socket2::{Domain, Protocol, SockRef, Socket, TcpKeepalive, Type};
use tokio::net::{TcpListener, TcpSocket, TcpStream, UdpSocket};

/// Backlog of each listener: enough for a burst of pod connections while
/// the accept loop is busy, the kernel caps it at `somaxconn` anyway.
const LISTEN_BACKLOG: i32 = 1024;

/// TCP keepalive and user timeout of the data plane's sockets, as Istio
/// sets them (AMBIENT.md §8.1): a peer that vanished without a FIN or RST
/// (a node gone, a NAT or conntrack entry expired) is found and its
/// connection closed, instead of holding a socket and its tunnel forever.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keepalive {
    /// Whether probes are sent at all (`KEEPALIVE_ENABLED`).
    pub enabled: bool,
    /// Idle time before the first probe (`KEEPALIVE_TIME`, TCP_KEEPIDLE).
    pub time: Duration,
    /// Time between unanswered probes (`KEEPALIVE_INTERVAL`, TCP_KEEPINTVL).
    pub interval: Duration,
    /// Unanswered probes before the connection is dropped
    /// (`KEEPALIVE_RETRIES`, TCP_KEEPCNT).
    pub retries: u32,
    /// Whether data left unacknowledged for as long as the probes would
    /// take also drops the connection (`USER_TIMEOUT_ENABLED`,
    /// TCP_USER_TIMEOUT): probes only run on an idle connection, so a peer
    /// that vanishes while we have data in flight is found only by this.
    pub user_timeout: bool,
}

impl Keepalive {
    /// Nothing set: the proxy's own endpoints (admin, metrics, readiness),
    /// which Istio leaves to the kernel's defaults.
    pub const OFF: Keepalive = Keepalive {
        enabled: false,
        time: Duration::ZERO,
        interval: Duration::ZERO,
        retries: 0,
        user_timeout: false,
    };

    /// TCP_USER_TIMEOUT, when enabled: as long as an idle connection's
    /// probes take to give up, `time + retries × interval` (30 min by
    /// default).
    pub fn user_timeout(&self) -> Option<Duration> {
        self.user_timeout.then(|| {
            self.time
                .saturating_add(self.interval.saturating_mul(self.retries))
        })
    }

    /// Sets these options on `socket`: a dialing socket, or a listener
    /// whose accepted connections inherit them.
    pub fn apply(&self, socket: &Socket) -> io::Result<()> {
        if self.enabled {
            let keepalive = TcpKeepalive::new()
                .with_time(self.time)
                .with_interval(self.interval)
                .with_retries(self.retries);
            socket.set_tcp_keepalive(&keepalive)?;
        }
        if let Some(timeout) = self.user_timeout() {
            socket.set_tcp_user_timeout(Some(timeout))?;
        }
        Ok(())
    }
}

/// Istio's defaults: probes after 180 s idle, every 180 s, 9 of them; no
/// user timeout.
impl Default for Keepalive {
    fn default() -> Keepalive {
        Keepalive {
            enabled: true,
            time: Duration::from_secs(180),
            interval: Duration::from_secs(180),
            retries: 9,
            user_timeout: false,
        }
    }
}

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

    /// A UDP socket for `destination`'s family, bound to an ephemeral port,
    /// for the DNS proxy's upstream queries. The caller connects it.
    fn udp_socket(&self, destination: SocketAddr) -> io::Result<UdpSocket>;
}

/// Ordinary sockets in the current network namespace, each carrying the
/// packet mark so that capture rules skip the proxy's own traffic.
#[derive(Debug, Clone, Copy, Default)]
pub struct LocalSockets {
    /// SO_MARK for every socket; `None` sets none.
    pub mark: Option<u32>,
    /// On every socket, listeners included.
    pub keepalive: Keepalive,
}

impl LocalSockets {
    /// A bound, listening TCP socket in the current namespace.
    pub fn tcp_listener(&self, addr: SocketAddr) -> io::Result<TcpListener> {
        TcpListener::from_std(listen(addr, self.mark, self.keepalive, |_| Ok(()))?)
    }
}

impl SocketFactory for LocalSockets {
    fn tcp_socket(&self, destination: SocketAddr, source: Option<IpAddr>) -> io::Result<TcpSocket> {
        let socket = new_dial_socket(destination)?;
        let socket = dial_socket(socket, self.mark, self.keepalive)?;
        if let Some(source) = source {
            bind_source(&socket, source)?;
        }
        Ok(TcpSocket::from_std_stream(socket.into()))
    }

    fn udp_socket(&self, destination: SocketAddr) -> io::Result<UdpSocket> {
        udp_dial_socket(new_udp_socket(destination)?, destination, self.mark)
    }
}

/// A listening TCP socket on `addr`, set up as every proxy listener is:
/// one dual-stack socket on `[::]` (IPv4 peers show as ::ffff:a.b.c.d),
/// SO_REUSEADDR, non-blocking, no Nagle, `mark` as SO_MARK, and
/// `keepalive`, which accepted connections inherit with the no-Nagle flag.
/// `before_bind` adds the caller's own options (SO_REUSEPORT,
/// IP_TRANSPARENT).
pub fn listen(
    addr: SocketAddr,
    mark: Option<u32>,
    keepalive: Keepalive,
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
    keepalive.apply(&socket)?;
    before_bind(&socket)?;
    socket.bind(&addr.into())?;
    socket.listen(LISTEN_BACKLOG)?;
    Ok(socket.into())
}

/// A bound UDP socket on `addr`, set up as the DNS proxy's listeners are:
/// non-blocking, `mark` as SO_MARK, `before_bind` adding the caller's own
/// options (SO_REUSEPORT). An IPv6 address is v6-only: the IPv4 side has a
/// socket of its own on 127.0.0.1.
pub fn udp_listen(
    addr: SocketAddr,
    mark: Option<u32>,
    before_bind: impl FnOnce(&Socket) -> io::Result<()>,
) -> io::Result<std::net::UdpSocket> {
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.set_nonblocking(true)?;
    if let Some(mark) = mark {
        socket.set_mark(mark)?;
    }
    before_bind(&socket)?;
    socket.bind(&addr.into())?;
    Ok(socket.into())
}

/// A new UDP socket for `destination`'s family, in the calling thread's
/// namespace, non-blocking from its creation.
pub fn new_udp_socket(destination: SocketAddr) -> io::Result<Socket> {
    let domain = Domain::for_address(destination);
    Socket::new(domain, Type::DGRAM.nonblocking(), Some(Protocol::UDP))
}

/// Sets up a socket from [`new_udp_socket`]: `mark` as SO_MARK so that the
/// DNS capture rules skip it, bound to an ephemeral port of the
/// unspecified address of `destination`'s family.
pub fn udp_dial_socket(
    socket: Socket,
    destination: SocketAddr,
    mark: Option<u32>,
) -> io::Result<UdpSocket> {
    if let Some(mark) = mark {
        socket.set_mark(mark)?;
    }
    let any: SocketAddr = match destination {
        SocketAddr::V4(_) => (std::net::Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    socket.bind(&any.into())?;
    UdpSocket::from_std(socket.into())
}

/// A new TCP socket for dialing `destination`'s family, in the calling
/// thread's namespace: non-blocking from its creation, which saves the two
/// `fcntl` calls of setting it afterwards on every dial.
pub fn new_dial_socket(destination: SocketAddr) -> io::Result<Socket> {
    let domain = Domain::for_address(destination);
    Socket::new(domain, Type::STREAM.nonblocking(), Some(Protocol::TCP))
}

/// Sets up a socket from [`new_dial_socket`] as every proxy dial is: no
/// Nagle, `mark` as SO_MARK so that capture rules skip it, and
/// `keepalive`.
pub fn dial_socket(socket: Socket, mark: Option<u32>, keepalive: Keepalive) -> io::Result<Socket> {
    socket.set_tcp_nodelay(true)?;
    if let Some(mark) = mark {
        socket.set_mark(mark)?;
    }
    keepalive.apply(&socket)?;
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

    /// The keepalive options as the kernel holds them on `socket`:
    /// (SO_KEEPALIVE, idle, interval, probes, user timeout).
    fn keepalive_of(socket: SockRef<'_>) -> (bool, Duration, Duration, u32, Option<Duration>) {
        (
            socket.keepalive().unwrap(),
            socket.tcp_keepalive_time().unwrap(),
            socket.tcp_keepalive_interval().unwrap(),
            socket.tcp_keepalive_retries().unwrap(),
            socket.tcp_user_timeout().unwrap(),
        )
    }

    /// A connection through a listener and a dial both made by `sockets`:
    /// the dialled stream and the accepted one.
    async fn connect_through(sockets: &LocalSockets) -> (TcpStream, TcpStream) {
        let listener = sockets
            .tcp_listener("127.0.0.1:0".parse().unwrap())
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let client = sockets.tcp_socket(addr, None).unwrap().connect(addr);
        let (client, accepted) = tokio::join!(client, listener.accept());
        (client.unwrap(), accepted.unwrap().0)
    }

    #[tokio::test]
    async fn dialled_and_accepted_connections_carry_istios_keepalive() {
        let sockets = LocalSockets::default();
        let (dialled, accepted) = connect_through(&sockets).await;
        let istio = (
            true,
            Duration::from_secs(180),
            Duration::from_secs(180),
            9,
            None,
        );
        assert_eq!(keepalive_of(SockRef::from(&dialled)), istio, "dialled");
        assert_eq!(keepalive_of(SockRef::from(&accepted)), istio, "accepted");
        assert!(accepted.nodelay().unwrap(), "accepted without Nagle");
    }

    #[tokio::test]
    async fn the_user_timeout_is_as_long_as_the_probes_take() {
        let keepalive = Keepalive {
            time: Duration::from_secs(10),
            interval: Duration::from_secs(3),
            retries: 4,
            user_timeout: true,
            ..Keepalive::default()
        };
        let sockets = LocalSockets {
            mark: None,
            keepalive,
        };
        let (dialled, accepted) = connect_through(&sockets).await;
        let want = (
            true,
            Duration::from_secs(10),
            Duration::from_secs(3),
            4,
            Some(Duration::from_secs(22)),
        );
        assert_eq!(keepalive_of(SockRef::from(&dialled)), want, "dialled");
        assert_eq!(keepalive_of(SockRef::from(&accepted)), want, "accepted");
        let default = Keepalive {
            user_timeout: true,
            ..Keepalive::default()
        };
        assert_eq!(default.user_timeout(), Some(Duration::from_secs(30 * 60)));
    }

    #[tokio::test]
    async fn keepalive_off_leaves_the_kernels_defaults() {
        let sockets = LocalSockets {
            mark: None,
            keepalive: Keepalive::OFF,
        };
        let (dialled, accepted) = connect_through(&sockets).await;
        for socket in [SockRef::from(&dialled), SockRef::from(&accepted)] {
            assert!(!socket.keepalive().unwrap());
            assert_eq!(socket.tcp_user_timeout().unwrap(), None);
        }
    }

    #[tokio::test]
    async fn a_connection_that_was_not_redirected_has_no_original_destination() {
        let (_client, server) = connect_through(&LocalSockets::default()).await;
        assert!(original_destination(&server).is_err());
    }
}
