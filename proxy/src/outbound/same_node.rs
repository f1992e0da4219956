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
//!
//! Both ends' certificates are watched against the revocation lists as
//! the HBONE path's two handshakes would watch each other's chains: a
//! revoked end is refused at open, and an open connection closes when a
//! list installed later revokes either end.
//!
//! The proxy copies between the two sockets at first. A connection that
//! keeps exchanging messages is then joined in the kernel (`splice.rs`),
//! so that each further request and response skips the proxy.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpStream;
use ztunnel_certs::cert::WorkloadCertificate;
use ztunnel_certs::identity::Identity;
use ztunnel_certs::tls::revocation::{self as crl, PeerRole, Revocation, Tracked};

use crate::capacity::Listener;
use crate::context::Proxy;
use crate::copy::{CopyError, Transferred};
use crate::hbone::InboundRefusal;
use crate::inbound::application::{self, AppConnection, Forwarded};
use crate::inbound::decision::Arrival;
use crate::metrics::Reporter;
use crate::outbound::OutboundError;
use crate::outbound::route::HboneRoute;
use crate::revocation::until_revoked;
use crate::splice::Splicer;
use crate::state::{Service, Workload};

/// Reads each direction makes in the proxy before the connection is
/// joined in the kernel. Joining costs about ten system calls, what a
/// copy spends on two or three round trips; a connection that made four
/// each way is past a single request and likely to make many more, and
/// one that streams one way only never waits in both directions at once
/// and stays with the proxy, whose large reads suit it.
const JOIN_AFTER_READS: u8 = 4;

/// The proxy of the pod `route` goes to, when the connection can take the
/// same-node path: the path is on, the pod is served by this process and
/// not draining, and [`eligible`].
pub(super) fn destination(proxy: &Proxy, route: &HboneRoute) -> Option<Arc<Proxy>> {
    let pods = proxy.node.local_pods.as_ref()?;
    let node = proxy.node.config.node_name.as_deref();
    if !eligible(route, node) {
        return None;
    }
    pods.get(&route.workload.namespace, &route.workload.name)
        .filter(|destination| !destination.drain.is_draining())
}

/// Whether a connection routed as `route` may skip the network: it goes
/// to the destination's own ztunnel, not to a waypoint; the destination is
/// on `node` (any node when the proxy has none configured); and neither it
/// nor the service dialled sends its traffic through a waypoint, which only
/// the network reaches.
pub fn eligible(route: &HboneRoute, node: Option<&str>) -> bool {
    let destination = &route.workload;
    let on_node = node.is_none_or(|node| *destination.node == *node);
    let waypoint = route.waypoint.is_some()
        || destination.waypoint.is_some()
        || route.service.as_deref().is_some_and(has_waypoint);
    on_node && !waypoint
}

/// Whether `service` sends its traffic through a waypoint.
fn has_waypoint(service: &Service) -> bool {
    service.waypoint.is_some() || !service.weighted_waypoints.is_empty()
}

/// An open same-node connection: the destination's application socket,
/// and both ends watched for revocation until it is dropped.
pub(super) struct SameNodeUpstream {
    /// The destination's application, admitted by its inbound side.
    pub app: AppConnection,
    /// Both ends' revocations, to stop the copy with.
    pub ends: EndsRevoked,
    /// Keeps both ends tracked while the connection is open.
    _tracked: [Option<Tracked>; 2],
}

/// Admits a connection from `source` (its client at `client`, canonical
/// already: the accept loop made it so) at
/// `destination`, the proxy of the pod `route` goes to, and dials its
/// application.
pub(super) async fn open(
    proxy: &Proxy,
    destination: &Proxy,
    source: Option<&Workload>,
    client: SocketAddr,
    route: &HboneRoute,
) -> Result<SameNodeUpstream, OutboundError> {
    let source = source.ok_or(OutboundError::UnknownSource)?;
    // The tunnel could not be opened without both ends' certificates: a
    // pod whose identity the CA does not issue here gets no connection
    // with it on this path either.
    let source_certificate = proxy
        .node
        .identities
        .fetch_certificate(&source.identity)
        .await
        .map_err(OutboundError::Certificate)?;
    let destination_certificate = proxy
        .node
        .identities
        .fetch_certificate(&route.workload.identity)
        .await
        .map_err(OutboundError::Certificate)?;
    // Each chain is judged by the other end's roots, as its verifier
    // would judge it in a handshake.
    let tracked = [
        track(
            &source_certificate,
            &destination_certificate,
            PeerRole::Client,
        ),
        track(
            &destination_certificate,
            &source_certificate,
            PeerRole::Server,
        ),
    ];
    let [client_end, server_end] = tracked
        .each_ref()
        .map(|tracked| tracked.as_ref().map(|tracked| tracked.revocation().clone()));
    let ends = EndsRevoked {
        client: client_end,
        server: server_end,
        source: source.identity.clone(),
        destination: route.workload.identity.clone(),
    };
    if let Some(reporter) = ends.revoked_now() {
        return Err(OutboundError::Revoked(reporter));
    }
    let arrival = Arrival {
        peer_identity: Some(source.identity.clone()),
        source_ip: client.ip(),
        source_port: client.port(),
        local_ip: route.dial.ip(),
        target: route.authority,
    };
    // Charged to the destination, as its HBONE stream would be.
    let slot = destination
        .share
        .admit(Listener::SameNode)
        .ok_or(OutboundError::SameNode(InboundRefusal::Unavailable(
            "connection limit reached",
        )))?;
    let forwarded = Forwarded {
        network: None,
        host: route.service.as_deref().map(|service| &*service.hostname),
        baggage: None,
    };
    let mut app = application::open_upstream(
        destination,
        &arrival,
        forwarded,
        Some(&source.identity),
        true,
    )
    .await
    .map_err(OutboundError::SameNode)?;
    app.hold(slot);
    // The destination's report says the connection closed for its client's
    // revocation, as its HBONE server's would.
    if let Some(revocation) = &ends.client {
        app.watch_revocation(revocation.clone());
    }
    Ok(SameNodeUpstream {
        app,
        ends,
        _tracked: tracked,
    })
}

/// `presented`'s chain watched as a peer in `role` verified against
/// `verifier`'s roots; `None` without `CRL_PATH`.
fn track(
    presented: &WorkloadCertificate,
    verifier: &WorkloadCertificate,
    role: PeerRole,
) -> Option<Tracked> {
    crl::track_in_process(presented.presented(), verifier.roots().clone(), role)
}

/// Both ends' revocations of a same-node connection, and who they are.
#[derive(Clone)]
pub(super) struct EndsRevoked {
    /// The source's certificate, as the destination's side watches it.
    client: Option<Revocation>,
    /// The destination's certificate, as the source's side watches it.
    server: Option<Revocation>,
    /// The source's identity, for the log.
    source: Identity,
    /// The destination's identity, for the log.
    destination: Identity,
}

impl EndsRevoked {
    /// Which side of the HBONE path would have refused the handshake: the
    /// destination's for a revoked source, the source's for a revoked
    /// destination; `None` when neither end is revoked.
    fn revoked_now(&self) -> Option<Reporter> {
        let revoked = |end: &Option<Revocation>| end.as_ref().is_some_and(Revocation::is_revoked);
        if revoked(&self.client) {
            Some(Reporter::Destination)
        } else if revoked(&self.server) {
            Some(Reporter::Source)
        } else {
            None
        }
    }

    /// The destination's certificate's revocation, for the source's report.
    pub(super) fn server(&self) -> Option<&Revocation> {
        self.server.as_ref()
    }

    /// Resolves once a list revokes either end, warned and counted by the
    /// side of the HBONE path that would have watched it.
    ///
    /// Cancel safe: the waits hold nothing of their own, and the warning
    /// and the count follow them with no await between.
    pub(super) async fn revoked(&self, proxy: &Proxy) {
        let (reporter, peer) = tokio::select! {
            () = until_revoked(self.client.as_ref()) => (Reporter::Destination, &self.source),
            () = until_revoked(self.server.as_ref()) => (Reporter::Source, &self.destination),
        };
        tracing::warn!(
            %peer,
            reporter = reporter.as_str(),
            "closing a same-node connection: a revocation list now revokes an end's certificate"
        );
        proxy.node.metrics.record_crl_rejection(reporter);
    }
}

/// Reads each direction of a same-node connection makes in the proxy's
/// copy before it is joined in the kernel; `None` when it is not: the
/// setting is off, or the kernel refused the socket maps.
pub(super) fn join_after(proxy: &Proxy) -> Option<u8> {
    let on = proxy.node.config.inpod.same_node_splice && Splicer::shared().is_some();
    on.then_some(JOIN_AFTER_READS)
}

/// Joins a same-node connection whose copy ended quiet in the kernel and
/// carries it until both sides close or `stop` resolves. `before` is what
/// the copy moved.
pub(super) async fn join<S: Future<Output = ()>>(
    proxy: &Proxy,
    client: TcpStream,
    app: &mut AppConnection,
    before: Transferred,
    stop: S,
) -> Result<Transferred, CopyError> {
    let counted = |joined| {
        proxy
            .node
            .metrics
            .record_join(if joined { "joined" } else { "refused" })
    };
    match (Splicer::shared(), app.take_stream()) {
        (Some(splicer), Some(stream)) => splicer.run(client, stream, before, stop, counted).await,
        // Asked to join only where both are there.
        _ => Ok(before),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::local;
    use crate::outbound::route::{Route, route};

    const STATE: &str = r#"
workloads:
- uid: uid-here
  name: here-0
  namespace: default
  node: node-a
  workloadIps: [198.18.1.10]
  protocol: HBONE
  services:
    default/plain.default.svc.cluster.local: {80: 8080}
    default/waypointed.default.svc.cluster.local: {81: 8080}
- uid: uid-there
  name: there-0
  namespace: default
  node: node-b
  workloadIps: [198.18.1.20]
  protocol: HBONE
  services: {}
- uid: uid-behind
  name: behind-0
  namespace: default
  node: node-a
  workloadIps: [198.18.1.30]
  protocol: HBONE
  services: {}
  waypoint:
    destination: {namespace: default, hostname: waypoint.default.svc.cluster.local}
- uid: uid-waypoint
  name: waypoint-0
  namespace: default
  node: node-a
  workloadIps: [198.18.1.40]
  protocol: HBONE
  services:
    default/waypoint.default.svc.cluster.local: {15008: 15008}
services:
- name: waypoint
  namespace: default
  hostname: waypoint.default.svc.cluster.local
  vips: ["/198.19.0.40"]
  ports: {15008: 15008}
- name: plain
  namespace: default
  hostname: plain.default.svc.cluster.local
  vips: ["/198.19.0.10"]
  ports: {80: 8080}
- name: waypointed
  namespace: default
  hostname: waypointed.default.svc.cluster.local
  vips: ["/198.19.0.20"]
  ports: {81: 8080}
  waypoint:
    destination: {namespace: default, hostname: waypoint.default.svc.cluster.local}
"#;

    #[test]
    fn only_a_pod_of_this_node_reached_without_a_waypoint_skips_the_network() {
        let state = local::parse(STATE, Path::new("test.yaml"))
            .unwrap()
            .into_state();
        let cases = [
            ("198.18.1.10:8080", Some("node-a"), true),
            ("198.19.0.10:80", Some("node-a"), true),
            ("198.18.1.10:8080", None, true),
            ("198.18.1.20:8080", Some("node-a"), false),
            ("198.18.1.10:8080", Some("node-b"), false),
            ("198.18.1.30:8080", Some("node-a"), false),
            ("198.19.0.20:81", Some("node-a"), false),
        ];
        let client = crate::state::Workload::for_test("uid-client", "default", &[]);
        for (dst, node, expected) in cases {
            let dst = dst.parse().unwrap();
            let Route::Hbone(hbone) = route(&state, &client, "198.18.1.1".parse().unwrap(), dst, 0)
            else {
                panic!("{dst} must tunnel");
            };
            assert_eq!(eligible(&hbone, node), expected, "{dst} from {node:?}");
        }
    }
}
