//! The DNS proxy's listeners: a UDP loop and a TCP accept loop per pod (or
//! per dedicated proxy), each query taken through `wire::parse`,
//! `answer::decide` and, when the name is not the mesh's, the forwarder.
//!
//! Each pod's listeners have their own bound on work in flight, so that a
//! pod flooding its resolver fills only its own queue: a UDP query that
//! finds [`UDP_IN_FLIGHT`] queries of its pod pending is dropped (the
//! client's resolver retries), and a TCP connection past
//! [`TCP_CONNECTIONS`] is closed at once.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, ResponseCode};
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::Semaphore;
use ztunnel_certs::error_chain::ErrorChain;

use super::DnsError;
use super::answer::{self, Client, Decision, Settings};
use super::forward::{self, Forwarder};
use super::metrics::{DnsLabels, DnsMetrics, query_type_label};
use super::wire::{self, Transport};
use crate::accept;
use crate::config::{Config, DnsAddress, DnsUpstream, WorkloadInfo};
use crate::drain::DrainWatcher;
use crate::metrics::LabelValue;
use crate::socket::{self, Keepalive, SocketFactory};
use crate::state::{SharedState, State, Workload};

/// UDP queries of one pod answered or forwarded at once. A forwarded query
/// waits up to the upstream's timeout, so this is what one pod may have
/// pending at the upstream; 64 is well above what a pod's resolver sends
/// in one burst (glibc asks A and AAAA for each search suffix).
pub const UDP_IN_FLIGHT: usize = 64;

/// TCP connections one pod may hold open to its DNS proxy: TCP is the
/// retry after a truncated answer, rarely more than a few at once.
pub const TCP_CONNECTIONS: usize = 16;

/// What every DNS listener of the node shares.
#[derive(Debug)]
pub struct Dns {
    /// How answers are shaped.
    pub settings: Settings,
    /// Where other queries go.
    pub forwarder: Forwarder,
    /// `istio_dns_*`.
    pub metrics: DnsMetrics,
}

impl Dns {
    /// The DNS proxy of `config`, its metrics registered on `registry`;
    /// `None` when it is off. An upstream configuration that cannot be
    /// read is logged, and the proxy then answers the mesh's names and
    /// SERVFAIL to the rest.
    pub fn from_config(config: &Config, registry: &mut Registry) -> Option<Arc<Dns>> {
        let settings = &config.dns;
        if !settings.enabled {
            tracing::info!("DNS proxy off (ISTIO_META_DNS_CAPTURE)");
            return None;
        }
        let forwarder = match &settings.upstream {
            DnsUpstream::Servers(servers) => Forwarder::new(servers.clone()),
            DnsUpstream::ResolvConf(path) => {
                Forwarder::from_resolv_conf(path).unwrap_or_else(|error| {
                    tracing::error!(error = %ErrorChain(&error), "the DNS proxy forwards nothing: every name outside the mesh gets SERVFAIL");
                    Forwarder::new(Vec::new())
                })
            }
        };
        tracing::info!(address = %settings.address, upstreams = ?forwarder.upstreams(), "DNS proxy on");
        Some(Arc::new(Dns {
            settings: Settings {
                cluster_domain: Arc::clone(&settings.cluster_domain),
                ipv6: config.inpod.ipv6_enabled,
                preferred_namespace: settings.preferred_namespace.clone(),
            },
            forwarder,
            metrics: DnsMetrics::register(registry),
        }))
    }
}

/// The DNS side of one proxy: the node's DNS proxy, and what its
/// listeners read of the proxy they serve (the pod's workload in the
/// state, the sockets of its namespace, its drain). Answers in flight hold
/// it, and with it the drain watcher: a draining proxy waits for them.
pub struct Served {
    /// The node's DNS proxy.
    pub dns: Arc<Dns>,
    /// The configuration: the node's name and how long a query waits for
    /// a new pod's workload.
    pub config: Arc<Config>,
    /// Workloads and services, which answers are made of.
    pub state: SharedState,
    /// The pod whose queries these are.
    pub workload: WorkloadInfo,
    /// Where forwarded queries leave from: the pod's namespace.
    pub sockets: Arc<dyn SocketFactory>,
    /// Ends the listeners.
    pub drain: DrainWatcher,
}

impl Served {
    /// The served pod's workload in `state`, among the node's (`NODE_NAME`).
    fn local_workload_in(&self, state: &State) -> Option<Arc<Workload>> {
        let workload = &self.workload;
        state
            .local_workload(
                &workload.namespace,
                &workload.name,
                &workload.service_account,
                self.config.node_name.as_deref(),
            )
            .cloned()
    }

    /// The served pod's workload as the state knows it now.
    fn local_workload(&self) -> Option<Arc<Workload>> {
        self.local_workload_in(&self.state.read())
    }
}

/// The DNS proxy's sockets in one network namespace, still plain std
/// sockets: the caller registers them with the data-plane runtime.
#[derive(Debug)]
pub struct Listeners {
    /// The address asked for; for `localhost`, 127.0.0.1 then ::1 when
    /// bound.
    pub udp: Vec<std::net::UdpSocket>,
    /// The same addresses.
    pub tcp: Vec<std::net::TcpListener>,
}

/// Binds UDP and TCP at `address` in the calling thread's namespace, each
/// socket with `mark` and, when `reuse_port`, SO_REUSEPORT (WIRE.md §1).
/// `localhost:<port>` is 127.0.0.1, and ::1 when `ipv6` is on and the
/// namespace's loopback has it.
pub fn bind_listeners(
    address: DnsAddress,
    ipv6: bool,
    mark: Option<u32>,
    reuse_port: bool,
) -> std::io::Result<Listeners> {
    let mut listeners = Listeners {
        udp: Vec::new(),
        tcp: Vec::new(),
    };
    let options = |socket: &socket2::Socket| socket.set_reuse_port(reuse_port);
    let (first, port) = match address {
        DnsAddress::Localhost(port) => (SocketAddr::from((Ipv4Addr::LOCALHOST, port)), port),
        DnsAddress::Socket(address) => (address, address.port()),
    };
    listeners
        .udp
        .push(socket::udp_listen(first, mark, options)?);
    listeners
        .tcp
        .push(socket::listen(first, mark, Keepalive::OFF, options)?);
    if ipv6 && matches!(address, DnsAddress::Localhost(_)) {
        let v6 = SocketAddr::from((Ipv6Addr::LOCALHOST, port));
        match socket::udp_listen(v6, mark, options) {
            Ok(udp) => {
                listeners.udp.push(udp);
                let tcp = socket::listen(v6, mark, Keepalive::OFF, |socket| {
                    socket.set_only_v6(true)?;
                    options(socket)
                })?;
                listeners.tcp.push(tcp);
            }
            // A loopback without IPv6: the pod has no ::1 to ask.
            Err(error) if error.kind() == std::io::ErrorKind::AddrNotAvailable => {}
            Err(error) => return Err(error),
        }
    }
    Ok(listeners)
}

/// Serves `listeners` for `served`'s pod on the current runtime until
/// the drain.
pub fn serve(served: &Arc<Served>, listeners: Listeners) -> std::io::Result<()> {
    for udp in listeners.udp {
        let udp = UdpSocket::from_std(udp)?;
        tokio::spawn(serve_udp(Arc::clone(served), udp));
    }
    for tcp in listeners.tcp {
        let tcp = TcpListener::from_std(tcp)?;
        tokio::spawn(serve_tcp(Arc::clone(served), tcp));
    }
    Ok(())
}

/// Serves UDP queries on `socket` for `served`'s pod until the drain,
/// then hands off: the kernel stops choosing this socket for new queries
/// ([`stop_receiving`]), and the queries already queued on it are
/// answered before it closes. Closing it at once would lose them: in a
/// rollout the new ztunnel's socket beside it (SO_REUSEPORT) shares the
/// pod's queries with it until then, and the pod's resolver waits out its
/// timeout (glibc's 5 s) for each one lost.
pub async fn serve_udp(served: Arc<Served>, socket: UdpSocket) {
    let socket = Arc::new(socket);
    let in_flight = Arc::new(Semaphore::new(UDP_IN_FLIGHT));
    // A datagram is at most 64 KiB; a DNS query is far less, but reading
    // into a smaller buffer would cut a large one and answer it wrongly.
    let mut buffer = vec![0; forward::MAX_MESSAGE];
    loop {
        let received = tokio::select! {
            // Cancel safe: `recv_from` loses nothing when dropped.
            received = socket.recv_from(&mut buffer) => received,
            () = served.drain.signaled() => break,
        };
        answer_datagram(&served, &socket, &in_flight, &buffer, received);
    }
    if let Err(error) = stop_receiving(&socket) {
        tracing::warn!(target: "dns", error = %error, "a draining DNS listener could not stop taking new queries; the few it has queued when it closes are lost");
    }
    for _ in 0..HAND_OFF_MOST {
        let received = tokio::select! {
            received = tokio::time::timeout(HAND_OFF_QUIET, socket.recv_from(&mut buffer)) => match received {
                Ok(received) => received,
                Err(_quiet) => return,
            },
            () = served.drain.forced() => return,
        };
        answer_datagram(&served, &socket, &in_flight, &buffer, received);
    }
}

/// How long a draining UDP listener reads on once it no longer receives
/// new queries: a query the kernel routed to it just before (on another
/// CPU, or in a softirq thread preempted on a busy node) is queued within
/// microseconds, so a tenth of a second covers it many times over; it
/// costs only drain time, which open connections take anyway.
pub const HAND_OFF_QUIET: Duration = Duration::from_millis(100);

/// The most queries a draining UDP listener answers after it stopped
/// receiving new ones: more than its receive buffer holds (a few hundred
/// small datagrams at the default 208 KiB), so the bound only stops a
/// socket that keeps returning errors.
const HAND_OFF_MOST: usize = 4096;

/// Stops the kernel from giving `socket` new datagrams while it keeps what
/// it has queued, by connecting it to its own address. A connected UDP
/// socket takes only datagrams from its peer, and a SO_REUSEPORT group
/// passes it over when it picks a socket for anyone else (Linux 5.6 and
/// later): new queries go to the other sockets of the group, the new
/// ztunnel's in a rollout. With no other socket they are refused (ICMP
/// port unreachable), so the client's resolver moves on at once instead of
/// waiting out its timeout on a queue nobody reads. Responses still go out
/// to each client's address, which `send_to` names.
pub fn stop_receiving(socket: &impl AsFd) -> std::io::Result<()> {
    let socket = socket2::SockRef::from(socket);
    let own = socket.local_addr()?;
    socket.connect(&own)
}

/// Answers one received datagram in a task of its own, or drops it when
/// `in_flight` is full; a receive error is logged and skipped.
fn answer_datagram(
    served: &Arc<Served>,
    socket: &Arc<UdpSocket>,
    in_flight: &Arc<Semaphore>,
    buffer: &[u8],
    received: std::io::Result<(usize, SocketAddr)>,
) {
    let (length, source) = match received {
        Ok(received) => received,
        Err(error) => {
            tracing::debug!(target: "dns", error = %error, "receiving a DNS query");
            return;
        }
    };
    let Ok(permit) = Arc::clone(in_flight).try_acquire_owned() else {
        tracing::debug!(target: "dns", %source, "too many DNS queries in flight; one dropped");
        return;
    };
    let query = buffer[..length].to_vec();
    let (served, socket) = (Arc::clone(served), Arc::clone(socket));
    // The task holds `served`, and with it the drain watcher: a draining
    // proxy waits for its answers to go out.
    tokio::spawn(async move {
        if let Some(response) = respond(&served, &query, source, Transport::Udp).await
            && let Err(error) = socket.send_to(&response, source).await
        {
            tracing::debug!(target: "dns", error = %error, "sending a DNS response");
        }
        drop(permit);
    });
}

/// Serves TCP connections on `listener` for `served`'s pod until the
/// drain; then the connections the kernel queued for it are served too,
/// since closing it would reset them (as the capture listeners do, see
/// `accept.rs`).
pub async fn serve_tcp(served: Arc<Served>, listener: TcpListener) {
    let connections = Arc::new(Semaphore::new(TCP_CONNECTIONS));
    loop {
        let accepted = tokio::select! {
            // Cancel safe: a connection not yet accepted stays queued.
            accepted = listener.accept() => accepted,
            () = served.drain.signaled() => break,
        };
        match accepted {
            Ok((stream, source)) => serve_later(&served, &connections, stream, source),
            Err(error) => {
                tracing::debug!(target: "dns", error = %error, "accepting a DNS connection");
            }
        }
    }
    for (stream, source) in accept::queued(&listener, "dns") {
        serve_later(&served, &connections, stream, source);
    }
}

/// Serves one TCP connection in a task of its own, or closes it when the
/// pod already has [`TCP_CONNECTIONS`].
fn serve_later(
    served: &Arc<Served>,
    connections: &Arc<Semaphore>,
    stream: TcpStream,
    source: SocketAddr,
) {
    let Ok(permit) = Arc::clone(connections).try_acquire_owned() else {
        tracing::debug!(target: "dns", %source, "too many DNS connections; one closed");
        return;
    };
    let served = Arc::clone(served);
    tokio::spawn(async move {
        let served = tokio::select! {
            served = serve_connection(&served, stream, source) => served,
            () = served.drain.forced() => Ok(()),
        };
        if let Err(error) = served {
            tracing::debug!(target: "dns", error = %error, "DNS connection ended");
        }
        drop(permit);
    });
}

/// Answers the length-prefixed queries of one connection, one at a time,
/// each to arrive, and its response to be taken, within the forwarder's
/// timeout. Once the proxy drains, the query in progress (or the first,
/// for a connection taken from the queue) is answered and the connection
/// closed; the client's resolver asks its next question on a new one,
/// which the new ztunnel takes.
async fn serve_connection(
    served: &Served,
    mut stream: TcpStream,
    source: SocketAddr,
) -> std::io::Result<()> {
    let mut answered = 0u64;
    loop {
        let next = tokio::time::timeout(forward::TIMEOUT, stream.read_u16());
        let length = tokio::select! {
            biased;
            length = next => match length {
                Ok(Ok(length)) => length,
                // A closed or idle connection is the client's to end.
                Ok(Err(_)) | Err(_) => return Ok(()),
            },
            // Waiting for a further query when the drain starts; a query
            // already there is taken first (biased).
            () = served.drain.signaled(), if answered > 0 => return Ok(()),
        };
        let mut query = vec![0; usize::from(length)];
        match tokio::time::timeout(forward::TIMEOUT, stream.read_exact(&mut query)).await {
            Ok(read) => read?,
            Err(_) => return Ok(()),
        };
        let Some(response) = respond(served, &query, source, Transport::Tcp).await else {
            return Ok(());
        };
        let Ok(length) = u16::try_from(response.len()) else {
            return Ok(());
        };
        let mut framed = Vec::with_capacity(response.len() + 2);
        framed.extend_from_slice(&length.to_be_bytes());
        framed.extend_from_slice(&response);
        // A client that stops reading gives its slot back like an idle one.
        match tokio::time::timeout(forward::TIMEOUT, stream.write_all(&framed)).await {
            Ok(written) => written?,
            Err(_) => return Ok(()),
        }
        answered += 1;
    }
}

/// The response to one query, or `None` when nothing should be sent back
/// (bytes without a DNS header, a failure to encode).
pub async fn respond(
    served: &Served,
    query: &[u8],
    source: SocketAddr,
    transport: Transport,
) -> Option<Vec<u8>> {
    let request = match wire::parse(query) {
        Ok(request) => request,
        Err(error) => {
            tracing::debug!(target: "dns", %source, error = %ErrorChain(&error), "FORMERR");
            return wire::format_error(query);
        }
    };
    // A new pod asks for names as soon as its network is up, which can be
    // before the push that describes it: the query waits for it as a
    // connection does (LOCAL_WORKLOAD_WAIT, Istio's 5 s), then is answered
    // SERVFAIL if it is still unknown.
    let unknown = served.local_workload().is_none()
        && served
            .state
            .read()
            .workload_by_address("", source.ip())
            .is_none();
    if unknown {
        served
            .state
            .first_within(served.config.local_workload_wait, |state| {
                served.local_workload_in(state)
            })
            .await;
    }
    let (decision, labels) = {
        let state = served.state.read();
        let workload = served
            .local_workload_in(&state)
            .or_else(|| state.workload_by_address("", source.ip()).cloned());
        let client = workload.as_deref().map(client_of);
        let decision = answer::decide(
            &request,
            client.as_ref(),
            &served.dns.settings,
            &state,
            &mut rand::rng(),
        );
        (decision, labels(&request, workload.as_deref(), transport))
    };
    served.dns.metrics.requests.get_or_create(&labels).inc();
    log_query(&request, source, &decision);
    let result = match decision {
        Decision::Answer(response) => wire::encode(response, &request, transport),
        Decision::Forward => forward(served, &request, query, transport, &labels).await,
    };
    match result {
        Ok(bytes) => Some(bytes),
        Err(error) => {
            tracing::debug!(target: "dns", %source, error = %ErrorChain(&error), "SERVFAIL");
            let failure = answer::response(&request, ResponseCode::ServFail);
            wire::encode(failure, &request, transport).ok()
        }
    }
}

/// One line per query at debug (`RUST_LOG=dns=debug`): who asked what,
/// and whether the proxy answered it (with which code and how many
/// records) or forwarded it. Nothing is formatted unless the line is on.
fn log_query(request: &Message, source: SocketAddr, decision: &Decision) {
    let Some(query) = request.queries.first() else {
        return;
    };
    match decision {
        Decision::Answer(response) => tracing::debug!(
            target: "dns",
            %source,
            name = %query.name(),
            record_type = %query.query_type(),
            code = %response.metadata.response_code,
            records = response.answers.len(),
            "DNS query answered"
        ),
        Decision::Forward => tracing::debug!(
            target: "dns",
            %source,
            name = %query.name(),
            record_type = %query.query_type(),
            "DNS query forwarded"
        ),
    }
}

/// Relays `query` to the upstream, timing and counting it.
async fn forward(
    served: &Served,
    request: &Message,
    query: &[u8],
    transport: Transport,
    labels: &DnsLabels,
) -> Result<Vec<u8>, DnsError> {
    served
        .dns
        .metrics
        .upstream_requests
        .get_or_create(labels)
        .inc();
    let started = Instant::now();
    let forwarded = served
        .dns
        .forwarder
        .forward(&*served.sockets, query, request.metadata.id, transport)
        .await;
    served
        .dns
        .metrics
        .upstream_duration
        .get_or_create(labels)
        .observe(started.elapsed().as_secs_f64());
    if forwarded.is_err() {
        served
            .dns
            .metrics
            .upstream_failures
            .get_or_create(labels)
            .inc();
    }
    forwarded
}

fn client_of(workload: &Workload) -> Client {
    Client {
        namespace: Arc::clone(&workload.namespace),
        network: Arc::clone(&workload.network),
    }
}

fn labels(request: &Message, workload: Option<&Workload>, transport: Transport) -> DnsLabels {
    let value = |pick: fn(&Workload) -> &Arc<str>| {
        workload.map_or(LabelValue::unknown(), |workload| {
            LabelValue::from(Arc::clone(pick(workload)))
        })
    };
    DnsLabels {
        query_type: request
            .queries
            .first()
            .map_or("other", |query| query_type_label(query.query_type())),
        protocol: transport,
        canonical_service: value(|workload| &workload.group.canonical_name),
        canonical_revision: value(|workload| &workload.group.canonical_revision),
    }
}

#[cfg(test)]
mod tests;
