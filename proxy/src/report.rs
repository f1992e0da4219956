//! What a proxied connection reports: its metrics (WIRE.md §10 traffic
//! labels) and its access-log lines, built from the workloads at either end.
//! The data path opens a [`Report`] when a connection starts and closes it
//! with the outcome; the metric and log formats live in `metrics.rs` and
//! `access_log.rs`.

use std::net::SocketAddr;
use std::sync::LazyLock;
use std::time::Instant;

use ztunnel_certs::identity::Identity;

use crate::access_log::{self, ConnectionLog, Direction, Outcome, PeerLog, Peers};
use crate::copy::{CopyError, Transferred};
use crate::hbone::{Baggage, WorkloadLabels};
use crate::interner::Interner;
use crate::metrics::{
    ConnectionMetrics, Metrics, PeerLabels, Reporter, ResponseFlags, SecurityPolicy, ServiceLabels,
    TrafficLabels,
};
use crate::revocation::PeerRevoked;
use crate::state::{Service, Workload};

/// One end of a connection.
#[derive(Debug, Clone, Copy)]
pub struct End<'a> {
    /// Its address.
    pub addr: SocketAddr,
    /// The workload there, when known.
    pub workload: Option<&'a Workload>,
    /// Its verified identity (mTLS only).
    pub identity: Option<&'a Identity>,
    /// What the end's own `baggage` says of it, where that is the best
    /// word on it: a source that came through another network's gateway
    /// (the state cannot name it), a destination that answered through one
    /// (its answer names the workload the tunnel really ended at). Its
    /// labels replace the workload's.
    pub described: Option<&'a Baggage>,
}

/// The ends of open connections, shared by every connection between the
/// same two workloads (168 bytes each otherwise). Process-wide, like the
/// workloads it describes.
static PEERS: LazyLock<Interner<Peers>> = LazyLock::new(Interner::default);

/// A connection being reported.
pub struct Report {
    metrics: ConnectionMetrics,
    log: ConnectionLog,
    started: Instant,
}

/// Everything a report is opened with.
#[derive(Debug, Clone, Copy)]
pub struct Opening<'a> {
    /// Which proxy reports: the client's (`source`) or the server's.
    pub reporter: Reporter,
    /// Outbound or inbound.
    pub direction: Direction,
    /// The client end.
    pub source: End<'a>,
    /// The server end.
    pub destination: End<'a>,
    /// The service the client dialled, if any.
    pub service: Option<&'a Service>,
    /// The HBONE address the tunnel went to, when tunnelled.
    pub hbone_addr: Option<SocketAddr>,
    /// Whether the connection takes the same-node path (logged as
    /// `path="same-node"`).
    pub same_node: bool,
}

impl Report {
    /// Counts the connection as opened and logs it at DEBUG.
    pub fn open(metrics: &Metrics, opening: Opening<'_>) -> Report {
        let mut labels = TrafficLabels::new(opening.reporter);
        labels.source = peer_labels(&opening.source);
        labels.destination = peer_labels(&opening.destination);
        if let Some(service) = opening.service {
            labels.destination_service = ServiceLabels {
                service: service.hostname.clone().into(),
                namespace: service.namespace.clone().into(),
                name: service.name.clone().into(),
            };
        }
        let mtls = opening.source.identity.is_some() || opening.destination.identity.is_some();
        if mtls {
            labels.security_policy = SecurityPolicy::MutualTls;
        }
        let peers = Peers {
            src: peer_log(&opening.source),
            dst_service: opening.service.map(|service| service.hostname.clone()),
            dst: peer_log(&opening.destination),
        };
        let log = ConnectionLog {
            src_addr: opening.source.addr,
            dst_addr: opening.destination.addr,
            dst_hbone_addr: opening.hbone_addr,
            peers: PEERS.intern(peers),
            direction: opening.direction,
            same_node: opening.same_node,
        };
        access_log::opened(&log);
        Report {
            metrics: metrics.open(labels),
            log,
            started: Instant::now(),
        }
    }

    /// Dates the report from `started`: a connection reported only once
    /// what it is reported with was known (a tunnel's far end, named by its
    /// answer) lasted from then.
    pub fn since(mut self, started: Instant) -> Report {
        self.started = started;
        self
    }

    /// Closes the report of a connection that ended before its bytes
    /// flowed: refused, or its upstream not reached.
    pub fn refused(self, flags: ResponseFlags, error: &(dyn std::error::Error + '_)) {
        self.close(Transferred::default(), flags, Some(error));
    }

    /// Closes the report with the outcome of the connection's copy, the
    /// client side being the copy's `a`: a clean end, or the copy's error.
    pub fn close_with(self, result: &Result<Transferred, CopyError>) {
        match result {
            Ok(moved) => self.close(*moved, ResponseFlags::None, None),
            Err(error) => self.close(error.transferred(), ResponseFlags::None, Some(error)),
        }
    }

    /// Closes the report of a connection stopped because a revocation list
    /// revokes the peer of the HBONE connection it ran on: `CERT_REVOKED`,
    /// whatever the copy saw as it was cut.
    pub fn close_revoked(self, result: &Result<Transferred, CopyError>) {
        let moved = match result {
            Ok(moved) => *moved,
            Err(error) => error.transferred(),
        };
        self.close(moved, ResponseFlags::CertRevoked, Some(&PeerRevoked));
    }

    /// Counts the bytes (`moved.a_to_b` is what the client sent, received
    /// by the server), closes the connection's metrics with `flags`, and
    /// writes the `connection complete` line.
    pub fn close(
        self,
        moved: Transferred,
        flags: ResponseFlags,
        error: Option<&(dyn std::error::Error + '_)>,
    ) {
        let (sent, received) = (moved.b_to_a, moved.a_to_b);
        self.metrics.add_sent(sent);
        self.metrics.add_received(received);
        self.metrics.close(flags);
        access_log::complete(
            &self.log,
            &Outcome {
                bytes_sent: sent,
                bytes_recv: received,
                duration: self.started.elapsed(),
                error,
            },
        );
    }
}

/// The labels `workload`'s `baggage` gives its peers: on each CONNECT its
/// proxy sends for it, and on each 200 answered for it.
pub(crate) fn baggage_labels(workload: &Workload) -> WorkloadLabels<'_> {
    let group = &workload.group;
    WorkloadLabels {
        cluster_id: &group.cluster_id,
        namespace: &workload.namespace,
        workload_type: group.workload_type.as_str(),
        workload_name: &group.workload_name,
        canonical_name: &group.canonical_name,
        canonical_revision: &group.canonical_revision,
        region: &group.locality.region,
        zone: &group.locality.zone,
    }
}

/// The metric labels of one end: its workload's, or what it said of
/// itself; and its identity when verified.
pub(crate) fn peer_labels(end: &End<'_>) -> PeerLabels {
    let mut labels = PeerLabels::default();
    if let Some(described) = end.described {
        labels.workload = described.workload_name.clone().into();
        labels.canonical_service = described.canonical_name.clone().into();
        labels.canonical_revision = described.canonical_revision.clone().into();
        labels.workload_namespace = described.namespace.clone().into();
        // istio/ztunnel reports a described end's app as its workload name
        // (and a known workload's as its canonical name); dashboards that
        // group by `*_app` see the same series from both proxies.
        labels.app = described.workload_name.clone().into();
        labels.version = described.canonical_revision.clone().into();
        labels.cluster = described.cluster.clone().into();
        labels.region = described.region.clone().into();
        labels.zone = described.zone.clone().into();
    } else if let Some(workload) = end.workload {
        let group = &workload.group;
        let workload_name = if group.workload_name.is_empty() {
            workload.name.clone()
        } else {
            group.workload_name.clone()
        };
        labels.workload = workload_name.into();
        labels.canonical_service = group.canonical_name.clone().into();
        labels.canonical_revision = group.canonical_revision.clone().into();
        labels.workload_namespace = workload.namespace.clone().into();
        labels.app = group.canonical_name.clone().into();
        labels.version = group.canonical_revision.clone().into();
        labels.cluster = group.cluster_id.clone().into();
        labels.region = group.locality.region.clone().into();
        labels.zone = group.locality.zone.clone().into();
    }
    if let Some(identity) = end.identity {
        labels.principal = identity.shared_str().into();
    }
    labels
}

fn peer_log(end: &End<'_>) -> PeerLog {
    let identity = end.identity.map(Identity::shared_str);
    if let Some(described) = end.described {
        return PeerLog {
            workload: described.workload_name.clone(),
            namespace: described.namespace.clone(),
            identity,
            cluster: described.cluster.clone(),
        };
    }
    PeerLog {
        workload: end.workload.map(|workload| workload.name.clone()),
        namespace: end.workload.map(|workload| workload.namespace.clone()),
        identity,
        cluster: end
            .workload
            .map(|workload| workload.group.cluster_id.clone()),
    }
}
