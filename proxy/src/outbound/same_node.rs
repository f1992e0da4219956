//! The same-node path: a captured connection whose destination is another
//! pod this proxy serves is handed to that pod's inbound side in the
//! process, without the HBONE tunnel. The proxy holds both identities,
//! captured the client's connection itself and evaluates the destination's
//! policy itself, so the tunnel's TLS and HTTP/2 endpoints would only
//! repeat, across the pod network, what one process already knows.
//!
//! What the destination decides is what its HBONE server would: the same
//! admission (`inbound::decision::admit`) with the source workload's
//! identity as the peer's, the application dialled from the client's
//! address inside the destination's namespace, and the same reports on
//! both sides, marked `path="same-node"` in the access log.

use std::net::SocketAddr;

use tokio::net::TcpStream;

use crate::context::Proxy;
use crate::copy::copy_bidirectional_until;
use crate::inbound::decision::Arrival;
use crate::inbound::listeners::{self, AppConnection};
use crate::outbound::OutboundError;
use crate::outbound::route::HboneRoute;
use crate::report::Report;
use crate::socket::canonical;
use crate::state::Workload;

/// Admits a connection from `source` (its client at `client`) at
/// `destination`, the proxy of the pod `route` goes to, and dials its
/// application.
pub(super) async fn open(
    proxy: &Proxy,
    destination: &Proxy,
    source: Option<&Workload>,
    client: SocketAddr,
    route: &HboneRoute,
) -> Result<AppConnection, OutboundError> {
    let source = source.ok_or(OutboundError::UnknownSource)?;
    // The tunnel could not be opened without both ends' certificates: a
    // pod whose identity the CA does not issue here gets no connection
    // with it on this path either.
    proxy
        .identities
        .fetch_certificate(&source.identity)
        .await
        .map_err(OutboundError::Certificate)?;
    proxy
        .identities
        .fetch_certificate(&route.workload.identity)
        .await
        .map_err(OutboundError::Certificate)?;
    let client = canonical(client);
    let arrival = Arrival {
        peer_identity: Some(source.identity.clone()),
        source_ip: client.ip(),
        source_port: client.port(),
        local_ip: route.dial.ip(),
        target: route.authority,
    };
    listeners::open_upstream(destination, &arrival, Some(&source.identity), true)
        .await
        .map_err(OutboundError::SameNode)
}

/// Copies between the client and the destination's application until both
/// close, the client's proxy drain is forced, or the destination stops the
/// connection (its pod left, its drain was forced, or a policy re-check no
/// longer allows it); then closes both sides' reports.
pub(super) async fn copy(
    proxy: &Proxy,
    report: Report,
    tcp: &mut TcpStream,
    mut app: AppConnection,
) {
    let stop = app.stop().clone();
    let stopped = async {
        tokio::select! {
            () = proxy.drain.forced() => {}
            () = stop.cancelled() => {}
        }
    };
    let result = copy_bidirectional_until(tcp, &mut app, stopped).await;
    report.close_with(&result);
    listeners::close_report(&mut app, &result);
}
