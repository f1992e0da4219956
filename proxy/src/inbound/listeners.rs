//! The inbound listeners' accept loops: HBONE on 15008 (TLS with the local
//! workload's certificate, then the HBONE server with our handler) and
//! plaintext on 15006 (original destination, authorization without an
//! identity). Both dial the application only after admission.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use prometheus_client::metrics::gauge::Gauge;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use ztunnel_certs::cert::WorkloadCertificate;
use ztunnel_certs::error_chain::ErrorChain;
use ztunnel_certs::identity::Identity;
use ztunnel_certs::tls::revocation::Revocation;

use crate::accept;
use crate::access_log::{self, Direction};
use crate::capacity::Slot;
use crate::context::{CONNECT_TIMEOUT, Proxy, TLS_HANDSHAKE_TIMEOUT};
use crate::copy::{CopyError, Transferred, copy_bidirectional_until};
use crate::hbone::{
    Authority, InboundHandler, InboundRefusal, InboundRequest, ServedClient, ServerError,
    X_FORWARDED_NETWORK, accept_tls, serve_connection,
};
use crate::inbound::decision::{Admitted, Arrival, Refusal, RefusalAnswer, admit, source_workload};
use crate::inbound::proxy_protocol::{self, HeaderError};
use crate::metrics::{Reporter, ResponseFlags};
use crate::rbac::DenyReason;
use crate::report::{End, Opening, Report};
use crate::revocation;
use crate::socket::{canonical, original_destination};
use crate::tracker::{Shown, ShownProtocol, TrackedGuard};

/// An admitted, connected application socket with what its close reports.
pub struct AppConnection {
    /// `None` once taken to be joined in the kernel (`splice.rs`).
    stream: Option<TcpStream>,
    report: Option<Report>,
    /// Cancelled when the copy must stop now: the drain is forced, or a
    /// policy re-check no longer allows the connection.
    stop: CancellationToken,
    tracked: TrackedGuard,
    /// An HBONE stream's slot in the process's connection bound; a
    /// connection accepted on a listener holds its own there instead.
    slot: Option<Slot>,
    /// Fires when the HBONE connection the stream came on is closed for
    /// its client's revocation, which the close then reports.
    revocation: Option<Revocation>,
}

impl AsyncRead for AppConnection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.stream()?.poll_read(cx, buf)
    }
}

impl AsyncWrite for AppConnection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.stream()?.poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.stream()?.poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.stream()?.poll_shutdown(cx)
    }
}

impl crate::copy::Side for AppConnection {}

/// Why an admitted connection could not reach the application.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    /// The connect failed or timed out.
    #[error("dialing the application at {addr}")]
    Connect {
        /// The address dialled.
        addr: SocketAddr,
        /// What failed.
        source: io::Error,
    },
    /// The PROXY header could not be built.
    #[error("building the PROXY header")]
    Header(#[source] HeaderError),
    /// The PROXY header could not be written.
    #[error("writing the PROXY header to {addr}")]
    WriteHeader {
        /// The address dialled.
        addr: SocketAddr,
        /// What failed.
        source: io::Error,
    },
}

impl AppConnection {
    /// Cancelled when the copy must stop now: the drain is forced, the pod
    /// left, or a policy re-check no longer allows the connection.
    pub fn stop(&self) -> &CancellationToken {
        &self.stop
    }

    /// The application socket to read and write; gone once taken.
    fn stream(self: Pin<&mut Self>) -> io::Result<Pin<&mut TcpStream>> {
        match &mut self.get_mut().stream {
            Some(stream) => Ok(Pin::new(stream)),
            None => Err(io::ErrorKind::NotConnected.into()),
        }
    }

    /// The application socket, to carry the connection by other means;
    /// the connection's report and policy tracking stay here.
    pub(crate) fn take_stream(&mut self) -> Option<TcpStream> {
        self.stream.take()
    }
}

/// Admits an arrival and dials the application: the inbound side of an
/// HBONE stream, a plaintext connection, or a same-node connection
/// (`same_node`, logged as such), decided and reported alike.
pub(crate) async fn open_upstream(
    proxy: &Proxy,
    arrival: &Arrival,
    direction_peer: Option<&Identity>,
    same_node: bool,
) -> Result<AppConnection, InboundRefusal> {
    let authority = Authority::Address(arrival.target);
    open_upstream_for(proxy, arrival, &authority, None, direction_peer, same_node).await
}

/// [`open_upstream`] for a connection asking for `authority`, which an
/// HBONE CONNECT names (an address the connection may not have arrived
/// on, or a service hostname), with the network it says it was forwarded
/// from (`x-forwarded-network`).
async fn open_upstream_for(
    proxy: &Proxy,
    arrival: &Arrival,
    authority: &Authority,
    forwarded_network: Option<&str>,
    direction_peer: Option<&Identity>,
    same_node: bool,
) -> Result<AppConnection, InboundRefusal> {
    let admit_now = || {
        let state = proxy.node.state.read();
        admit(
            &state,
            &proxy.node.config.network,
            |workload| proxy.is_local(workload),
            arrival,
            authority,
        )
    };
    let mut admitted = admit_now();
    // A connection to a new pod may come before the push describing it:
    // only then it waits for the pod's workload and is admitted again.
    if matches!(admitted, Err(Refusal::UnknownWorkload(_))) && proxy.local_workload().is_none() {
        proxy.wait_for_local_workload(Reporter::Destination).await;
        admitted = admit_now();
    }
    let admitted = match admitted {
        Ok(admitted) => admitted,
        Err(refusal) => {
            let src = SocketAddr::new(arrival.source_ip, arrival.source_port);
            access_log::failed(src, arrival.target, Direction::Inbound, &refusal);
            let answer = refusal.answer();
            let ends = Ends {
                workload: None,
                peer: direction_peer,
                forwarded_network,
            };
            let report = open_report(proxy, arrival, ends, same_node);
            report.refused(answer.flags, &refusal);
            return Err(answer.refusal);
        }
    };
    for matched in &admitted.dry_run {
        tracing::info!(?matched, "dry-run policy matched");
    }
    let ends = Ends {
        workload: Some(&admitted.workload),
        peer: direction_peer,
        forwarded_network,
    };
    let report = open_report(proxy, arrival, ends, same_node);
    let stream = match dial(proxy, arrival, &admitted).await {
        Ok(stream) => stream,
        Err(error) => {
            let answer = RefusalAnswer::UNREACHABLE;
            report.refused(answer.flags, &error);
            return Err(answer.refusal);
        }
    };
    let shown = Shown {
        src: SocketAddr::new(arrival.source_ip, arrival.source_port),
        original_dst: arrival.peer_identity.as_ref().map(|_| arrival.target),
        actual_dst: admitted.upstream,
        protocol: match arrival.peer_identity {
            Some(_) => ShownProtocol::Hbone,
            None => ShownProtocol::Tcp,
        },
    };
    let connection = admitted.connection;
    let stop = proxy.drain.stop_token();
    let tracked = proxy.tracker.track(connection, shown, stop.clone());
    Ok(AppConnection {
        stream: Some(stream),
        report: Some(report),
        stop,
        tracked,
        slot: None,
        revocation: None,
    })
}

/// Connects the admitted connection's application: a PROXY tunnel on
/// loopback (`LOCALHOST_APP_TUNNEL`) from loopback, else the upstream from
/// the client's IP where the sockets allow. A PROXY tunnel is sent its
/// header at once, before the client's 200 and so before any tunnelled
/// byte: the application reads the same bytes as if it came after, and a
/// header that cannot be written is answered 503 rather than cut after a 200.
async fn dial(
    proxy: &Proxy,
    arrival: &Arrival,
    admitted: &Admitted,
) -> Result<TcpStream, DialError> {
    let loopback = admitted.loopback_dial(proxy.node.config.localhost_app_tunnel);
    let addr = loopback.unwrap_or(admitted.upstream);
    let connect = async {
        let socket = match loopback {
            Some(loopback) => proxy.sockets.tcp_socket(loopback, Some(loopback.ip()))?,
            None => proxy.sockets.upstream_socket(addr, arrival.source_ip)?,
        };
        socket.connect(addr).await
    };
    let mut stream = tokio::time::timeout(CONNECT_TIMEOUT, connect)
        .await
        .unwrap_or_else(|_elapsed| Err(io::ErrorKind::TimedOut.into()))
        .map_err(|source| DialError::Connect { addr, source })?;
    if let Some(destination) = admitted.proxy_destination {
        let source = SocketAddr::new(arrival.source_ip, arrival.source_port);
        let identity = arrival.peer_identity.as_ref().map(Identity::as_str);
        let mut header = Vec::new();
        proxy_protocol::encode(&mut header, source, destination, identity)
            .map_err(DialError::Header)?;
        tokio::time::timeout(CONNECT_TIMEOUT, stream.write_all(&header))
            .await
            .unwrap_or_else(|_elapsed| Err(io::ErrorKind::TimedOut.into()))
            .map_err(|source| DialError::WriteHeader { addr, source })?;
    }
    Ok(stream)
}

/// What a report of an inbound connection says of its ends beyond the
/// arrival.
struct Ends<'a> {
    /// The admitted local workload; `None` when refused before it was found.
    workload: Option<&'a crate::state::Workload>,
    /// The peer's identity, reported on both ends.
    peer: Option<&'a Identity>,
    /// The CONNECT's `x-forwarded-network`: another network than ours
    /// leaves the source workload unknown.
    forwarded_network: Option<&'a str>,
}

fn open_report(proxy: &Proxy, arrival: &Arrival, ends: Ends<'_>, same_node: bool) -> Report {
    let Ends {
        workload,
        peer,
        forwarded_network,
    } = ends;
    let state = proxy.node.state.read();
    let network = &proxy.node.config.network;
    let source = source_workload(&state, network, arrival.source_ip, forwarded_network);
    let local = proxy.local_workload_in(&state);
    Report::open(
        &proxy.node.metrics,
        Opening {
            reporter: Reporter::Destination,
            direction: Direction::Inbound,
            source: End {
                addr: SocketAddr::new(arrival.source_ip, arrival.source_port),
                workload: source.as_deref(),
                identity: peer,
            },
            destination: End {
                addr: arrival.target,
                workload: workload.or(local.as_deref()),
                identity: peer.and(local.as_ref().map(|workload| &workload.identity)),
            },
            service: None,
            hbone_addr: None,
            same_node,
        },
    )
}

/// Closes a report with the copy's outcome; client to server is received.
pub(crate) fn close_report(upstream: &mut AppConnection, result: &Result<Transferred, CopyError>) {
    let Some(report) = upstream.report.take() else {
        return;
    };
    if revocation::revoked_while_open(upstream.revocation.as_ref()) {
        report.close_revoked(result);
        return;
    }
    // Closed by a policy re-check: the policy's reason, not the broken
    // copy it caused.
    if let Some(reason) = upstream.tracked.closed_by_policy() {
        let moved = match result {
            Ok(moved) => *moved,
            Err(error) => error.transferred(),
        };
        let error = PolicyClosed(reason.clone());
        report.close(moved, ResponseFlags::Deny, Some(&error));
        return;
    }
    report.close_with(result);
}

/// An open connection a policy re-check no longer allows.
#[derive(Debug, thiserror::Error)]
#[error("closed on a policy re-check: {0}")]
struct PolicyClosed(DenyReason);

/// The HBONE server's handler.
pub struct HboneInbound {
    proxy: Arc<Proxy>,
}

impl InboundHandler for HboneInbound {
    type Upstream = AppConnection;

    async fn open(&self, request: &InboundRequest) -> Result<AppConnection, InboundRefusal> {
        let local_ip = canonical(request.local_addr).ip();
        let (authority, target) = match &request.authority {
            Authority::Address(address) => {
                let address = canonical(*address);
                (Authority::Address(address), address)
            }
            Authority::Hostname { port, .. } => {
                (request.authority.clone(), SocketAddr::new(local_ip, *port))
            }
        };
        let arrival = Arrival {
            peer_identity: Some(request.peer_identity.clone()),
            source_ip: canonical(request.peer_addr).ip(),
            source_port: request.peer_addr.port(),
            local_ip,
            target,
        };
        let peer = Some(&request.peer_identity);
        // Not visible ASCII: no network we could be named by, as if absent.
        let forwarded_network = request
            .headers
            .get(X_FORWARDED_NETWORK)
            .and_then(|value| value.to_str().ok());
        let proxy = &self.proxy;
        let Some(slot) = proxy.node.capacity.admit("hbone_stream") else {
            return Err(InboundRefusal::Unavailable("connection limit reached"));
        };
        let mut upstream =
            open_upstream_for(proxy, &arrival, &authority, forwarded_network, peer, false).await?;
        upstream.slot = Some(slot);
        upstream.revocation = request.revocation.clone();
        Ok(upstream)
    }

    fn stop(upstream: &AppConnection) -> CancellationToken {
        upstream.stop.clone()
    }

    fn closed(&self, mut upstream: AppConnection, result: Result<Transferred, CopyError>) {
        close_report(&mut upstream, &result);
    }
}

/// A connection counted against its listener's handshake limit until it
/// is dropped, after the TLS handshake (or its failure).
struct PendingHandshake {
    _permit: OwnedSemaphorePermit,
    gauge: Gauge,
}

/// Pending handshakes (over all listeners, as the gauge counts them) from
/// which their end counts as the end of a flood, whose memory is then given
/// back to the system.
const FLOOD: i64 = 256;

/// Whether the pending handshakes reached [`FLOOD`] since they were last
/// all done.
static FLOODED: AtomicBool = AtomicBool::new(false);

impl PendingHandshake {
    fn new(permit: OwnedSemaphorePermit, gauge: Gauge) -> Self {
        if gauge.inc() + 1 >= FLOOD {
            FLOODED.store(true, Ordering::Relaxed);
        }
        Self {
            _permit: permit,
            gauge,
        }
    }
}

impl Drop for PendingHandshake {
    fn drop(&mut self) {
        // The last pending handshake of a flood: the tasks of thousands of
        // silent connections were freed on this worker, and the allocator
        // would keep their pages until it needs them again.
        if self.gauge.dec() == 1 && FLOODED.swap(false, Ordering::Relaxed) {
            crate::memory::give_back();
        }
    }
}

/// Accepts HBONE connections until the drain; each is served on its own
/// task. At most `max_pending_handshakes` wait for their TLS handshake at
/// once; beyond that a new connection is closed at once and counted.
pub async fn serve_hbone(proxy: Arc<Proxy>, listener: TcpListener) {
    let handler = Arc::new(HboneInbound {
        proxy: Arc::clone(&proxy),
    });
    let drain = proxy.drain.clone();
    let limit = proxy.node.config.max_pending_handshakes;
    let pending = Arc::new(Semaphore::new(limit));
    let gauge = proxy.node.metrics.pending_handshakes();
    // Whether the limit was hit since the last connection it let in: one
    // warning per episode, not one per connection of a flood.
    let mut at_limit = false;
    let (metrics, capacity) = (
        Arc::clone(&proxy.node.metrics),
        Arc::clone(&proxy.node.capacity),
    );
    accept::serve(listener, "hbone", drain, (&metrics, &capacity), |tcp, peer, slot| {
        let Ok(permit) = Arc::clone(&pending).try_acquire_owned() else {
            proxy.node.metrics.record_handshake_refused("pending_limit");
            if !at_limit {
                at_limit = true;
                tracing::warn!(
                    %peer,
                    limit,
                    "too many HBONE handshakes pending on this listener; closing new connections until some finish"
                );
            }
            drop(tcp);
            return;
        };
        at_limit = false;
        let waiting = PendingHandshake::new(permit, gauge.clone());
        let proxy = Arc::clone(&proxy);
        let handler = Arc::clone(&handler);
        tokio::spawn(async move {
            // Nothing of the handshake (workload lookup, certificate, TLS
            // state and its buffers) exists until the client has sent a
            // byte: a silent connection costs this small task only. A peek,
            // not a readiness wait, which can wake without data.
            let mut first = [0u8; 1];
            match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, tcp.peek(&mut first)).await {
                Ok(Ok(0)) => {
                    tracing::debug!(%peer, "HBONE client closed before sending anything");
                    return;
                }
                Ok(Ok(_)) => {}
                Ok(Err(error)) => {
                    tracing::debug!(%peer, %error, "HBONE connection failed before its first byte");
                    return;
                }
                Err(_) => {
                    // Debug only: a flood of these would be a flood of lines.
                    tracing::debug!(%peer, timeout = ?TLS_HANDSHAKE_TIMEOUT, "HBONE client sent nothing; closed");
                    return;
                }
            }
            Box::pin(handshake_and_serve(proxy, handler, tcp, peer, waiting)).await;
            drop(slot);
        });
    })
    .await;
}

/// The TLS handshake of an HBONE connection whose client has started
/// talking, then the HBONE server on it.
async fn handshake_and_serve(
    proxy: Arc<Proxy>,
    handler: Arc<HboneInbound>,
    tcp: TcpStream,
    peer: SocketAddr,
    waiting: PendingHandshake,
) {
    let local = match tcp.local_addr() {
        Ok(local) => local,
        Err(_) => return,
    };
    let Some(workload) = proxy.wait_for_local_workload(Reporter::Destination).await else {
        tracing::warn!(%peer, "HBONE connection before the local workload is known");
        return;
    };
    let certificate = proxy
        .node
        .identities
        .fetch_certificate(&workload.identity)
        .await;
    let watch =
        |cert: &WorkloadCertificate| proxy.revocation_watch(Reporter::Destination, cert.roots());
    let (config, watch) = match certificate.map(|cert| (cert.server_config(), watch(&cert))) {
        Ok((Ok(config), watch)) => (config, watch),
        Ok((Err(error), _)) => {
            tracing::warn!(error = %ErrorChain(&error), "cannot build the HBONE server TLS config");
            return;
        }
        Err(error) => {
            tracing::warn!(error = %ErrorChain(&error), "no certificate for the local workload");
            return;
        }
    };
    let accepted = accept_tls(tcp, config, TLS_HANDSHAKE_TIMEOUT).await;
    drop(waiting);
    let (tls, client) = match accepted {
        Ok(accepted) => accepted,
        Err(error) => {
            if let ServerError::Tls(handshake) = &error
                && revocation::revoked(handshake)
            {
                proxy
                    .node
                    .metrics
                    .record_crl_rejection(Reporter::Destination);
            }
            tracing::warn!(%peer, error = %ErrorChain(&error), "HBONE TLS handshake failed");
            return;
        }
    };
    let watched = watch.and_then(|watch| watch.watch(client.chain, &client.identity));
    let client = ServedClient {
        identity: client.identity,
        watched,
    };
    let drain = proxy.drain.clone();
    if let Err(error) =
        serve_connection(tls, client, (peer, local), &proxy.node.h2, handler, drain).await
    {
        tracing::debug!(%peer, error = %ErrorChain(&error), "HBONE connection ended with an error");
    }
}

/// Accepts captured plaintext connections until the drain.
pub async fn serve_plaintext(proxy: Arc<Proxy>, listener: TcpListener) {
    let (drain, metrics) = (proxy.drain.clone(), Arc::clone(&proxy.node.metrics));
    let capacity = Arc::clone(&proxy.node.capacity);
    accept::serve(
        listener,
        "inbound_plaintext",
        drain,
        (&metrics, &capacity),
        |mut tcp, peer, slot| {
            let proxy = Arc::clone(&proxy);
            tokio::spawn(async move {
                let target = match original_destination(&tcp) {
                    Ok(target) => target,
                    Err(error) => {
                        tracing::warn!(%peer, %error, "no original destination on 15006");
                        return;
                    }
                };
                let arrival = Arrival {
                    peer_identity: None,
                    source_ip: canonical(peer).ip(),
                    source_port: peer.port(),
                    local_ip: target.ip(),
                    target,
                };
                // A refusal closes the connection (dropping it), as istio does.
                // Boxed: the admission and dial state is freed before the copy,
                // not carried in the task for the connection's life.
                let Ok(mut upstream) = Box::pin(open_upstream(&proxy, &arrival, None, false)).await
                else {
                    return;
                };
                let stop = upstream.stop.clone();
                let result =
                    copy_bidirectional_until(&mut tcp, &mut upstream, stop.cancelled()).await;
                close_report(&mut upstream, &result);
                drop(slot);
            });
        },
    )
    .await;
}
