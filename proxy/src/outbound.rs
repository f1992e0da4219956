//! Outbound: connections a workload makes, captured on 15001. Each is routed
//! (`outbound/route.rs`) and then tunnelled over HBONE, through the pool, to
//! the destination's ztunnel or a waypoint; tunnelled twice, through another
//! network's gateway (`hbone/double.rs`); handed to another pod this proxy
//! serves (`outbound/same_node.rs`); or passed through as plain TCP. An
//! endpoint known by hostname is first looked up (`resolve.rs`), then
//! reached as one known by IP. One function (`flags`) decides what a
//! failure means for metrics.

use std::io;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::Arc;
use std::time::Instant;

use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use ztunnel_certs::error_chain::ErrorChain;
use ztunnel_certs::tls::revocation::Revocation;

use crate::accept;
use crate::access_log::{self, Direction};
use crate::capacity::Listener;
use crate::context::{CONNECT_TIMEOUT, Proxy};
use crate::copy::{Ended, copy_bidirectional_until_quiet};
use crate::hbone::{self, Baggage, HboneError, InboundRefusal};
use crate::identity::manager::FetchError;
use crate::inbound::application;
use crate::metrics::{OnDemandDnsLabels, Reporter, ResponseFlags};
use crate::pool::PoolError;
use crate::report::{self, End, Opening, Report};
use crate::resolve::ResolveError;
use crate::revocation;
use crate::socket::{canonical, original_destination};
use crate::state::{Service, Workload};
use crate::tracker::{Shown, ShownProtocol};
use crate::xds::demand;

pub mod route;
mod same_node;
pub mod socks5;
#[cfg(test)]
mod test_proxy;
mod tunnel;
mod upstream;

use route::{Direct, HboneRoute, ResolveRoute, Route};
use tunnel::Tunnel;
use upstream::Upstream;

/// Why an outbound connection failed before its bytes flowed: every step
/// of connecting it, in one flat type.
#[derive(Debug, thiserror::Error)]
pub enum OutboundError {
    /// The local workload is not in the state.
    #[error("unknown source workload")]
    UnknownSource,
    /// The source identity's certificate is not available.
    #[error("no certificate for the source workload")]
    Certificate(#[source] FetchError),
    /// The TCP connection to a passthrough destination failed or timed out.
    #[error("connecting to {addr}")]
    Connect {
        /// The destination.
        addr: SocketAddr,
        /// What failed; `TimedOut` after [`CONNECT_TIMEOUT`].
        source: io::Error,
    },
    /// The pooled HBONE connection could not be dialled (by this
    /// connection or by the one it waited for, hence shared), or its
    /// CONNECT failed.
    #[error("HBONE")]
    Tunnel(#[source] Arc<HboneError>),
    /// Other connections' dials kept filling the pool before this one got
    /// a stream.
    #[error("no pooled HBONE connection had room")]
    PoolContended,
    /// The destination endpoint, known by hostname, gave no address.
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    /// The CONNECT headers could not be built.
    #[error("CONNECT headers")]
    Headers(#[from] hbone::HeaderError),
    /// The destination, a pod this proxy serves, refused the connection on
    /// the same-node path, as its HBONE server would have answered.
    #[error("refused by the destination on the same node")]
    SameNode(#[source] InboundRefusal),
    /// On the same-node path, a revocation list revokes an end's
    /// certificate: refused where that end's handshake would have been,
    /// by the side that would have refused it.
    #[error("an end's certificate is revoked (refused on the {} side)", .0.as_str())]
    Revoked(Reporter),
}

impl From<PoolError> for OutboundError {
    fn from(error: PoolError) -> Self {
        match error {
            PoolError::Dial(error) => OutboundError::Tunnel(error),
            PoolError::Contended => OutboundError::PoolContended,
        }
    }
}

/// The `response_flags` of a failure: the one place that maps errors.
fn flags(error: &OutboundError) -> ResponseFlags {
    match error {
        OutboundError::UnknownSource | OutboundError::Certificate(_) => {
            ResponseFlags::IdentityError
        }
        OutboundError::Tunnel(error) => match error.as_ref() {
            HboneError::Tls(error) if revocation::revoked(error) => ResponseFlags::CertRevoked,
            HboneError::Tls(_) => ResponseFlags::TlsFailure,
            HboneError::H2(_) => ResponseFlags::H2HandshakeFailure,
            HboneError::Status(status) if status.as_u16() == 401 => ResponseFlags::Deny,
            _ => ResponseFlags::Connect,
        },
        OutboundError::Revoked(_) => ResponseFlags::CertRevoked,
        OutboundError::SameNode(refusal) => match refusal {
            InboundRefusal::Denied => ResponseFlags::Deny,
            InboundRefusal::BadRequest(_) | InboundRefusal::Unavailable(_) => {
                ResponseFlags::Connect
            }
        },
        OutboundError::Connect { .. }
        | OutboundError::PoolContended
        | OutboundError::Resolve(_)
        | OutboundError::Headers(_) => ResponseFlags::Connect,
    }
}

/// Accepts captured connections until the drain.
pub async fn serve(proxy: Arc<Proxy>, listener: TcpListener) {
    let (drain, metrics) = (proxy.drain.clone(), Arc::clone(&proxy.node.metrics));
    let admit = || proxy.share.admit(Listener::Outbound);
    accept::serve(
        listener,
        "outbound",
        drain,
        &metrics,
        admit,
        |tcp, peer, slot| {
            let proxy = Arc::clone(&proxy);
            tokio::spawn(async move {
                handle(&proxy, tcp, canonical(peer)).await;
                drop(slot);
            });
        },
    )
    .await;
}

/// One captured connection: set up, then copy until both sides close.
async fn handle(proxy: &Proxy, tcp: TcpStream, peer: SocketAddr) {
    // Boxed and gone before the copy: the set-up (routing, a TLS and h2
    // dial for a new pooled connection, the CONNECT exchange) needs far more
    // state than the copy, and an unboxed future would carry it in every
    // open connection's task for the connection's whole life.
    let Some(opened) = Box::pin(open(proxy, &tcp, peer)).await else {
        return;
    };
    carry(proxy, tcp, opened).await;
}

/// Copies an opened connection until both sides close or it must stop,
/// then closes its reports.
async fn carry(proxy: &Proxy, mut tcp: TcpStream, opened: Opened) {
    let (report, mut upstream, shown) = opened;
    let _listed = proxy.outbound_tracker.track_listed(shown);
    // One copy for every kind of upstream, so that an open connection's
    // task holds one copy's state whichever path it took. A same-node
    // connection may leave it, quiet, to be joined in the kernel.
    let (destination, join_after) = match &upstream {
        Upstream::SameNode(same) => (
            Some((same.app.stop().clone(), same.ends.clone())),
            same_node::join_after(proxy),
        ),
        Upstream::Tcp(_) | Upstream::Hbone(_) => (None, None),
    };
    let revocation = match &upstream {
        Upstream::Hbone(stream) => stream.revocation().cloned(),
        Upstream::SameNode(same) => same.ends.server().cloned(),
        Upstream::Tcp(_) => None,
    };
    let mut stop = pin!(stopped(proxy, destination, revocation.as_ref()));
    let copied =
        copy_bidirectional_until_quiet(&mut tcp, &mut upstream, stop.as_mut(), join_after).await;
    let result = match (copied, &mut upstream) {
        (Ok(Ended::Quiet(before)), Upstream::SameNode(same)) => {
            // Boxed: only joined connections hold the join's state.
            Box::pin(same_node::join(proxy, tcp, &mut same.app, before, stop)).await
        }
        (Ok(Ended::Closed(moved) | Ended::Quiet(moved)), _) => Ok(moved),
        (Err(error), _) => Err(error),
    };
    if revocation::revoked_while_open(revocation.as_ref()) {
        report.close_revoked(&result);
    } else {
        report.close_with(&result);
    }
    if let Upstream::SameNode(same) = &mut upstream {
        application::close_report(&mut same.app, &result);
    }
}

/// Resolves when a connection's copy must stop: the proxy's drain is
/// forced; on the same-node path, the destination stops it (its pod left,
/// its drain was forced, or a policy re-check no longer allows it) or a
/// revocation list revokes either end; over HBONE, the server of the
/// tunnel's connection is revoked.
async fn stopped(
    proxy: &Proxy,
    destination: Option<(CancellationToken, same_node::EndsRevoked)>,
    revocation: Option<&Revocation>,
) {
    match destination {
        None => tokio::select! {
            () = proxy.drain.forced() => {}
            () = revocation::until_revoked(revocation) => {}
        },
        Some((destination, ends)) => tokio::select! {
            () = proxy.drain.forced() => {}
            () = destination.cancelled() => {}
            () = ends.revoked(proxy) => {}
        },
    }
}

/// An opened connection: its report, its upstream, and what `/config_dump`
/// lists of it.
type Opened = (Report, Upstream, Shown);

/// Routes a captured connection and connects its upstream. `None` when it
/// failed; the failure is logged and its report closed already.
async fn open(proxy: &Proxy, tcp: &TcpStream, peer: SocketAddr) -> Option<Opened> {
    let target = match original_destination(tcp) {
        Ok(target) => target,
        Err(error) => {
            tracing::warn!(%peer, error = %ErrorChain(&error), "no original destination on 15001");
            return None;
        }
    };
    open_to(proxy, peer, target).await
}

/// Routes a connection from `peer` to the original destination `target`
/// and connects its upstream; [`open`] once the destination is known.
async fn open_to(proxy: &Proxy, peer: SocketAddr, target: SocketAddr) -> Option<Opened> {
    // The route depends on the source workload (its network and locality
    // rank a service's endpoints). A new pod may send before the control
    // plane's push describing it arrives: its first connections wait for
    // it, and are routed on the state that has it. A known pod pays
    // nothing more.
    let decide =
        |state: &_, source: &Workload| route::route(state, source, peer.ip(), target, proxy.pick());
    let known = {
        let state = proxy.node.state.read();
        proxy
            .local_workload_in(&state)
            .map(|source| (decide(&state, &source), source))
    };
    let (route, source) = match known {
        Some(known) => known,
        None => {
            let source = proxy.wait_for_local_workload(Reporter::Source).await?;
            let route = decide(&proxy.node.state.read(), &source);
            (route, source)
        }
    };
    let route = match (route, &proxy.node.demand) {
        (
            Route::Passthrough {
                workload: None,
                service: None,
                ..
            },
            Some(demand),
        ) => {
            // Not in the state: on demand, asked for by address and routed
            // again on what the answer brought (or on what there is after
            // the wait).
            let name = format!("{}/{}", proxy.node.config.network, target.ip());
            let answered = demand.fetch(&name, demand::WAIT).await;
            tracing::debug!(%name, answered, "destination fetched on demand");
            decide(&proxy.node.state.read(), &source)
        }
        (route, _) => route,
    };
    log_route(&route, peer, target);
    let source = Some(&*source);
    let mut shown = Shown {
        src: peer,
        original_dst: Some(target),
        actual_dst: target,
        protocol: ShownProtocol::Tcp,
    };
    let (report, connected) = match route {
        Route::Refuse(refusal) => {
            access_log::failed(peer, target, Direction::Outbound, &refusal);
            return None;
        }
        Route::Passthrough {
            target,
            workload,
            service,
        } => {
            shown.actual_dst = target;
            open_tcp(
                proxy,
                peer,
                source,
                target,
                workload.as_deref(),
                service.as_deref(),
            )
            .await
        }
        Route::Hbone(route) => {
            (shown.actual_dst, shown.protocol) = (route.dial, ShownProtocol::Hbone);
            open_hbone(proxy, peer, source, &route).await
        }
        Route::DoubleHbone(route) => {
            (shown.actual_dst, shown.protocol) = (route.dial, ShownProtocol::DoubleHbone);
            open_tunnel(proxy, peer, source, &Tunnel::double(&route, target)).await
        }
        Route::Resolve(pending) => match resolve(proxy, peer, source, &pending).await {
            Ok(Direct::Hbone(route)) => {
                (shown.actual_dst, shown.protocol) = (route.dial, ShownProtocol::Hbone);
                open_hbone(proxy, peer, source, &route).await
            }
            Ok(Direct::Tcp {
                target,
                workload,
                service,
            }) => {
                shown.actual_dst = target;
                open_tcp(
                    proxy,
                    peer,
                    source,
                    target,
                    Some(&workload),
                    service.as_deref(),
                )
                .await
            }
            Err(error) => {
                // Reported as a connection to the original destination
                // that failed before any dial.
                let destination = End {
                    addr: target,
                    workload: Some(&pending.endpoint.workload),
                    identity: None,
                    described: None,
                };
                let service = pending.endpoint.service.as_deref();
                let report = open_report(proxy, peer, source, destination, service, None, false);
                (report, Err(error))
            }
        },
    };
    match connected {
        Ok(upstream) => Some((report, upstream, shown)),
        Err(error) => {
            let flags = flags(&error);
            match &error {
                OutboundError::Revoked(reporter) => {
                    proxy.node.metrics.record_crl_rejection(*reporter);
                }
                _ if flags == ResponseFlags::CertRevoked => {
                    proxy.node.metrics.record_crl_rejection(Reporter::Source);
                }
                _ => {}
            }
            report.refused(flags, &error);
            None
        }
    }
}

/// A plain TCP connection to `target`, reported as a connection to
/// `workload` (when known) through `service`.
async fn open_tcp(
    proxy: &Proxy,
    peer: SocketAddr,
    source: Option<&Workload>,
    target: SocketAddr,
    workload: Option<&Workload>,
    service: Option<&Service>,
) -> (Report, Result<Upstream, OutboundError>) {
    let destination = End {
        addr: target,
        workload,
        identity: None,
        described: None,
    };
    let report = open_report(proxy, peer, source, destination, service, None, false);
    let connected = dial(proxy, target)
        .await
        .map(Upstream::Tcp)
        .map_err(|source| OutboundError::Connect {
            addr: target,
            source,
        });
    (report, connected)
}

/// The HBONE stream of `route`, or the same-node path when the
/// destination is a pod this proxy serves.
async fn open_hbone(
    proxy: &Proxy,
    peer: SocketAddr,
    source: Option<&Workload>,
    route: &HboneRoute,
) -> (Report, Result<Upstream, OutboundError>) {
    let tunnel = Tunnel::single(route);
    let Some(destination) = same_node::destination(proxy, route) else {
        return open_tunnel(proxy, peer, source, &tunnel).await;
    };
    let report = tunnel_report(proxy, peer, source, &tunnel, true, None);
    let connected = same_node::open(proxy, &destination, source, peer, route)
        .await
        .map(|same| Upstream::SameNode(Box::new(same)));
    (report, connected)
}

/// The HBONE stream of `tunnel`, over one hop or two. Reported once the
/// far end has answered (from when it was asked): through a gateway, its
/// answer's `baggage` names the workload it ended at.
async fn open_tunnel(
    proxy: &Proxy,
    peer: SocketAddr,
    source: Option<&Workload>,
    tunnel: &Tunnel<'_>,
) -> (Report, Result<Upstream, OutboundError>) {
    let started = Instant::now();
    let (connected, described) = match tunnel::open(proxy, source, peer, tunnel).await {
        Ok((stream, described)) => (Ok(Upstream::Hbone(stream)), described),
        Err(error) => (Err(error), None),
    };
    let described = described.filter(|described| !described.is_empty());
    let report = tunnel_report(proxy, peer, source, tunnel, false, described.as_ref());
    (report.since(started), connected)
}

/// Opens the report of a connection through `tunnel`, or, `same_node`,
/// handed over in-process to its destination; `described` is what the far
/// end's answer said of it.
fn tunnel_report(
    proxy: &Proxy,
    peer: SocketAddr,
    source: Option<&Workload>,
    tunnel: &Tunnel<'_>,
    same_node: bool,
    described: Option<&Baggage>,
) -> Report {
    let destination = End {
        addr: tunnel.destination,
        workload: Some(tunnel.workload),
        identity: tunnel.far_end_expected().first(),
        described,
    };
    let hbone_addr = Some(tunnel.dial);
    open_report(
        proxy,
        peer,
        source,
        destination,
        tunnel.service,
        hbone_addr,
        same_node,
    )
}

/// Looks up the address of the endpoint of `pending`, known by hostname,
/// for one connection from `peer` (AMBIENT.md §4.6), and says how to reach
/// it there. Every lookup is counted, answered from the cache or not.
async fn resolve(
    proxy: &Proxy,
    peer: SocketAddr,
    source: Option<&Workload>,
    pending: &ResolveRoute,
) -> Result<Direct, OutboundError> {
    let client = End {
        addr: peer,
        workload: source,
        identity: source.map(|workload| &workload.identity),
        described: None,
    };
    proxy.node.metrics.record_on_demand_dns(&OnDemandDnsLabels {
        source: report::peer_labels(&client),
        hostname: pending.hostname.clone().into(),
    });
    let addresses = proxy.node.resolver.lookup(&pending.hostname).await?;
    let resolved = pending.resolved(&addresses, proxy.pick());
    resolved.ok_or_else(|| ResolveError::NoAddress(pending.hostname.clone()).into())
}

/// Opens the report of a connection from `peer`, of the workload `source`,
/// to `destination`. A tunnelled connection (`hbone_addr`: the address
/// dialled) carries the source's identity; plain TCP carries none.
fn open_report(
    proxy: &Proxy,
    peer: SocketAddr,
    source: Option<&Workload>,
    destination: End<'_>,
    service: Option<&Service>,
    hbone_addr: Option<SocketAddr>,
    same_node: bool,
) -> Report {
    let identity = source
        .map(|workload| &workload.identity)
        .filter(|_| hbone_addr.is_some());
    Report::open(
        &proxy.node.metrics,
        Opening {
            reporter: Reporter::Source,
            direction: Direction::Outbound,
            source: End {
                addr: peer,
                workload: source,
                identity,
                described: None,
            },
            destination,
            service,
            hbone_addr,
            same_node,
        },
    )
}

/// A marked TCP connection to `target`; a connect that takes longer than
/// [`CONNECT_TIMEOUT`] fails as `TimedOut`.
async fn dial(proxy: &Proxy, target: SocketAddr) -> io::Result<TcpStream> {
    let socket = proxy.sockets.tcp_socket(target, None)?;
    tokio::time::timeout(CONNECT_TIMEOUT, socket.connect(target))
        .await
        .unwrap_or_else(|_elapsed| Err(io::ErrorKind::TimedOut.into()))
}

/// Says at debug which waypoint or network gateway a connection goes
/// through; direct routes are in the access log already.
fn log_route(route: &Route, peer: SocketAddr, target: SocketAddr) {
    match route {
        Route::Hbone(HboneRoute {
            waypoint: Some(waypoint),
            dial,
            ..
        }) => tracing::debug!(%peer, %target, %waypoint, %dial, "outbound through a waypoint"),
        Route::DoubleHbone(double) => tracing::debug!(
            %peer,
            %target,
            gateway = %double.gateway,
            dial = %double.dial,
            authority = %double.authority,
            "outbound through a network gateway (double HBONE)"
        ),
        Route::Resolve(pending) => tracing::debug!(
            %peer,
            %target,
            hostname = %pending.hostname,
            "outbound to an endpoint known by hostname: looking up its address"
        ),
        Route::Hbone(_) | Route::Passthrough { .. } | Route::Refuse(_) => {}
    }
}

#[cfg(test)]
mod tests;
