//! Reaching the application once an arrival is admitted: the admission,
//! the dial (a PROXY tunnel on loopback, or the upstream from the client's
//! IP), the connection's report and its policy tracking. The HBONE side
//! (`hbone.rs`), the plaintext side (`plaintext.rs`) and the same-node path
//! (`outbound/same_node.rs`) all come here.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::HeaderMap;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;
use ztunnel_certs::identity::Identity;
use ztunnel_certs::tls::revocation::Revocation;

use crate::access_log::{self, Direction};
use crate::capacity::Slot;
use crate::context::{CONNECT_TIMEOUT, Proxy};
use crate::copy::{CopyError, Transferred};
use crate::hbone::{Authority, BAGGAGE, Baggage, InboundRefusal};
use crate::inbound::decision::{
    Admitted, Arrival, Refusal, RefusalAnswer, admit, inbound_service, source_workload,
};
use crate::inbound::proxy_protocol::{self, HeaderError};
use crate::metrics::{Reporter, ResponseFlags};
use crate::rbac::DenyReason;
use crate::report::{End, Opening, Report};
use crate::revocation;
use crate::state::Workload;
use crate::tracker::{Shown, ShownProtocol, TrackedGuard};

/// An admitted, connected application socket with what its close reports.
pub struct AppConnection {
    /// `None` once taken to be joined in the kernel (`splice.rs`).
    stream: Option<TcpStream>,
    report: Option<Report>,
    /// Cancelled when the copy must stop now: the drain is forced, or a
    /// policy re-check no longer allows the connection.
    pub(super) stop: CancellationToken,
    tracked: TrackedGuard,
    /// An HBONE stream's or a same-node connection's slot of the
    /// destination pod's share of the connection bound; a connection
    /// accepted on a listener holds its own there instead.
    pub(super) slot: Option<Slot>,
    /// Fires when the HBONE connection the stream came on is closed for
    /// its client's revocation, which the close then reports.
    pub(super) revocation: Option<Revocation>,
    /// The admitted local workload, which an HBONE stream's 200 describes.
    pub(super) workload: Arc<Workload>,
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

    /// Reports the connection as closed for its client's revocation once
    /// `revocation` fires: the same-node path's client, which had no
    /// handshake to keep its chain.
    pub(crate) fn watch_revocation(&mut self, revocation: Revocation) {
        self.revocation = Some(revocation);
    }

    /// Keeps `slot` of the connection bound while the connection is open.
    pub(crate) fn hold(&mut self, slot: Slot) {
        self.slot = Some(slot);
    }

    /// The application socket, to carry the connection by other means;
    /// the connection's report and policy tracking stay here.
    pub(crate) fn take_stream(&mut self) -> Option<TcpStream> {
        self.stream.take()
    }
}

/// What the client's side says about where a connection comes from and
/// what it was for.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Forwarded<'a> {
    /// The CONNECT's `x-forwarded-network`: another network than ours
    /// leaves the source workload unknown.
    pub network: Option<&'a str>,
    /// The Service the client dialled: the `forwarded` header's `host`, a
    /// CONNECT to a hostname, or the same-node route's service. It picks
    /// the `destination_service` reported when the workload has several.
    pub host: Option<&'a str>,
    /// The CONNECT's headers, whose `baggage` is the word on a source the
    /// state cannot name; read only then, and only with
    /// `ENABLE_RESPONSE_BAGGAGE`.
    pub baggage: Option<&'a HeaderMap>,
}

impl Forwarded<'_> {
    /// What the client's `baggage` says of it, if anything.
    fn described(&self) -> Option<Baggage> {
        let headers = self.baggage?;
        Some(Baggage::parse(headers.get_all(BAGGAGE))).filter(|described| !described.is_empty())
    }
}

/// Admits an arrival and dials the application: the inbound side of an
/// HBONE stream, a plaintext connection, or a same-node connection
/// (`same_node`, logged as such), decided and reported alike.
pub(crate) async fn open_upstream(
    proxy: &Proxy,
    arrival: &Arrival,
    forwarded: Forwarded<'_>,
    direction_peer: Option<&Identity>,
    same_node: bool,
) -> Result<AppConnection, InboundRefusal> {
    let authority = Authority::Address(arrival.target);
    open_upstream_for(
        proxy,
        arrival,
        &authority,
        forwarded,
        direction_peer,
        same_node,
    )
    .await
}

/// [`open_upstream`] for a connection asking for `authority`, which an
/// HBONE CONNECT names (an address the connection may not have arrived
/// on, or a service hostname).
pub(super) async fn open_upstream_for(
    proxy: &Proxy,
    arrival: &Arrival,
    authority: &Authority,
    forwarded: Forwarded<'_>,
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
            if let Refusal::Denied(reason) = &refusal {
                log_policy(proxy, format_args!("{reason}"));
            }
            let src = SocketAddr::new(arrival.source_ip, arrival.source_port);
            access_log::failed(src, arrival.target, Direction::Inbound, &refusal);
            let answer = refusal.answer();
            let ends = Ends {
                workload: None,
                peer: direction_peer,
                forwarded,
            };
            let report = open_report(proxy, arrival, ends, same_node);
            report.refused(answer.flags, &refusal);
            return Err(answer.refusal);
        }
    };
    for matched in &admitted.dry_run {
        tracing::info!(?matched, "dry-run policy matched");
    }
    match &admitted.allowed_by {
        Some(policy) => log_policy(proxy, format_args!("allowed by: {policy}")),
        None => log_policy(proxy, format_args!("no allow policies: allowed")),
    }
    let ends = Ends {
        workload: Some(&admitted.workload),
        peer: direction_peer,
        forwarded,
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
        workload: admitted.workload,
    })
}

/// The authorization decision for one connection, at info with
/// `AUTHZ_POLICY_INFO_LOGGING=true` (istio/ztunnel's switch), else at debug.
fn log_policy(proxy: &Proxy, decision: std::fmt::Arguments<'_>) {
    if proxy.node.config.authz_policy_info_logging {
        tracing::info!(target: "authorization", %decision, "policy decision");
    } else {
        tracing::debug!(target: "authorization", %decision, "policy decision");
    }
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
    /// What the client's side says.
    forwarded: Forwarded<'a>,
}

fn open_report(proxy: &Proxy, arrival: &Arrival, ends: Ends<'_>, same_node: bool) -> Report {
    let Ends {
        workload,
        peer,
        forwarded,
    } = ends;
    let state = proxy.node.state.read();
    let network = &proxy.node.config.network;
    let source = source_workload(&state, network, arrival.source_ip, forwarded.network);
    let described = match source {
        Some(_) => None,
        None => forwarded.described(),
    };
    let local = proxy.local_workload_in(&state);
    let service = workload.and_then(|workload| {
        inbound_service(&state, workload, forwarded.host, arrival.target.port())
    });
    Report::open(
        &proxy.node.metrics,
        Opening {
            reporter: Reporter::Destination,
            direction: Direction::Inbound,
            source: End {
                addr: SocketAddr::new(arrival.source_ip, arrival.source_port),
                workload: source.as_deref(),
                identity: peer,
                described: described.as_ref(),
            },
            destination: End {
                addr: arrival.target,
                workload: workload.or(local.as_deref()),
                identity: peer.and(local.as_ref().map(|workload| &workload.identity)),
                described: None,
            },
            service: service.map(|service| &**service),
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
