//! Prometheus metrics with the names and labels of WIRE.md §10, and the
//! per-connection API the data path calls ([`Metrics::open`] →
//! [`ConnectionMetrics`]).
//!
//! Everything registers on one [`Registry`] at start-up; the stats server
//! (admin.rs) then encodes it. A module with metrics of its own (DNS, xDS)
//! registers them on the same registry, under [`istio_registry`] when the
//! names are Istio's or with a `ztunnel_` name when they are ours.
//! The traffic label set lives in `metrics/labels.rs`.

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::interner::Interner;

mod labels;
mod process;
mod workload_manager;

pub use labels::{
    LabelValue, OnDemandDnsLabels, PeerLabels, Reporter, SecurityPolicy, ServiceLabels,
    TrafficLabels,
};
pub use process::register_process_and_runtime;
pub use workload_manager::WorkloadManagerMetrics;

/// Why a connection failed, as the `response_flags` label shows it. The one
/// place an error is mapped to a flag is the data path's error type; this
/// only names the values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ResponseFlags {
    /// No failure.
    #[default]
    None,
    /// Refused by an authorization policy.
    Deny,
    /// Upstream connect failed, or another failure with no flag of its own.
    Connect,
    /// The TLS handshake with the peer failed.
    TlsFailure,
    /// The HTTP/2 handshake of an HBONE connection failed.
    H2HandshakeFailure,
    /// Refused by a network policy.
    NetworkPolicy,
    /// The peer's identity was not the one expected.
    IdentityError,
    /// The peer's certificate was revoked.
    CertRevoked,
}

impl ResponseFlags {
    /// The label value of WIRE.md §10.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "-",
            Self::Deny => "DENY",
            Self::Connect => "CONNECT",
            Self::TlsFailure => "TLS_FAILURE",
            Self::H2HandshakeFailure => "H2_HANDSHAKE_FAILURE",
            Self::NetworkPolicy => "NETWORK_POLICY",
            Self::IdentityError => "IDENTITY_ERROR",
            Self::CertRevoked => "CERT_REVOKED",
        }
    }
}

impl EncodeLabelValue for ResponseFlags {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        EncodeLabelValue::encode(&self.as_str(), encoder)
    }
}

/// Labels of the metrics that only tell the reporting side apart.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ReporterLabels {
    /// Which side of the connection counted it.
    pub reporter: Reporter,
}

/// Labels of `ztunnel_workload_waits`: who waited for its own workload,
/// and whether it came.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct WaitLabels {
    /// Outbound (source) or inbound (destination).
    pub reporter: Reporter,
    /// `arrived` or `timeout`.
    pub outcome: &'static str,
}

/// Labels of the ZDS metrics: why a request was NACKed, or why a
/// connection with the node agent ended.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ZdsLabels {
    /// A short, fixed word (`read`, `start`, `protocol`, `closed`, `io`).
    pub reason: &'static str,
}

/// Labels of `ztunnel_handshakes_refused`: why an HBONE connection was
/// closed before its handshake began.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct HandshakeLabels {
    /// `pending_limit`: the listener already had its most handshakes
    /// waiting.
    pub reason: &'static str,
}

/// Labels of `ztunnel_accept_errors`: which listener failed to accept, and
/// whether the error would repeat (`exhausted`) or was one connection's.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct AcceptLabels {
    /// `outbound`, `inbound_plaintext` or `hbone`.
    pub listener: &'static str,
    /// `exhausted` or `connection` (`accept.rs`).
    pub kind: &'static str,
}

/// Labels of `ztunnel_same_node_joins`: what became of a chatty same-node
/// connection the proxy asked the kernel to join.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct JoinLabels {
    /// `joined`, or `refused` (the kernel would not take the sockets, its
    /// maps full most likely: the proxy copies).
    pub outcome: &'static str,
}

/// Labels of `istio_build`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct BuildLabels {
    component: &'static str,
    tag: String,
}

/// The proxy's connection metrics. Cheap to clone: every family is shared.
#[derive(Debug, Clone)]
pub struct Metrics {
    opened: Family<TrafficLabels, Counter>,
    closed: Family<TrafficLabels, Counter>,
    sent_bytes: Family<TrafficLabels, Counter>,
    received_bytes: Family<TrafficLabels, Counter>,
    failed: Family<TrafficLabels, Counter>,
    sockets_open: Family<ReporterLabels, Gauge>,
    policy_closed: Family<ReporterLabels, Counter>,
    workload_waits: Family<WaitLabels, Counter>,
    zds_nacks: Family<ZdsLabels, Counter>,
    zds_errors: Family<ZdsLabels, Counter>,
    pending_handshakes: Gauge,
    handshakes_refused: Family<HandshakeLabels, Counter>,
    accept_errors: Family<AcceptLabels, Counter>,
    joins: Family<JoinLabels, Counter>,
    on_demand_dns: Family<OnDemandDnsLabels, Counter>,
    crl_rejections: Family<ReporterLabels, Counter>,
    crl_untracked: Family<ReporterLabels, Counter>,
    /// One shared copy of each label set that open connections carry (a
    /// set is ~400 bytes).
    labels: Interner<TrafficLabels>,
}

/// The `istio_` sub-registry, for other modules' Istio-named metrics (DNS,
/// xDS). prometheus-client adds `_total` to counters itself, so register
/// `dns_requests`, not `dns_requests_total`.
pub fn istio_registry(registry: &mut Registry) -> &mut Registry {
    registry.sub_registry_with_prefix("istio")
}

impl Metrics {
    /// Registers the connection metrics and `istio_build` (`tag` is our
    /// version) on `registry`.
    pub fn register(registry: &mut Registry, tag: &str) -> Self {
        let metrics = Self {
            opened: Family::default(),
            closed: Family::default(),
            sent_bytes: Family::default(),
            received_bytes: Family::default(),
            failed: Family::default(),
            sockets_open: Family::default(),
            policy_closed: Family::default(),
            workload_waits: Family::default(),
            zds_nacks: Family::default(),
            zds_errors: Family::default(),
            pending_handshakes: Gauge::default(),
            handshakes_refused: Family::default(),
            accept_errors: Family::default(),
            joins: Family::default(),
            on_demand_dns: Family::default(),
            crl_rejections: Family::default(),
            crl_untracked: Family::default(),
            labels: Interner::default(),
        };
        let build = Family::<BuildLabels, Gauge>::default();
        build
            .get_or_create(&BuildLabels {
                component: "ztunnel",
                tag: tag.to_owned(),
            })
            .set(1);

        let istio = istio_registry(registry);
        // Base names: prometheus-client adds the `_total` of WIRE.md itself.
        let traffic = [
            (
                "tcp_connections_opened",
                "Connections opened",
                &metrics.opened,
            ),
            (
                "tcp_connections_closed",
                "Connections closed",
                &metrics.closed,
            ),
            (
                "tcp_sent_bytes",
                "Bytes sent to the peer that opened the connection",
                &metrics.sent_bytes,
            ),
            (
                "tcp_received_bytes",
                "Bytes received from the peer that opened the connection",
                &metrics.received_bytes,
            ),
            (
                "tcp_connections_failed",
                "Connections closed with a response flag",
                &metrics.failed,
            ),
        ];
        for (name, help, family) in traffic {
            istio.register(name, help, family.clone());
        }
        istio.register(
            "tcp_sockets_open",
            "Connections open now",
            metrics.sockets_open.clone(),
        );
        istio.register("build", "Proxy build", build);
        istio.register(
            "on_demand_dns",
            "Lookups of the hostname of an endpoint that has no IP, one per connection",
            metrics.on_demand_dns.clone(),
        );
        istio_registry(registry).register(
            "crl_policy_rejections",
            "Connections refused at the handshake, or closed once open, because a revocation list (CRL_PATH) revokes the peer",
            metrics.crl_rejections.clone(),
        );
        istio_registry(registry).register(
            "crl_untracked_connections",
            "Connections left unwatched for revocation lists installed while they are open",
            metrics.crl_untracked.clone(),
        );
        registry.register(
            "ztunnel_policy_closed_connections",
            "Open connections closed because a policy change no longer allows them",
            metrics.policy_closed.clone(),
        );
        registry.register(
            "ztunnel_workload_waits",
            "Connections that arrived before the proxy knew its own workload, by whether it came in time",
            metrics.workload_waits.clone(),
        );
        registry.register(
            "ztunnel_zds_nacks",
            "ZDS requests of the node agent answered with a NACK, by reason",
            metrics.zds_nacks.clone(),
        );
        registry.register(
            "ztunnel_zds_connection_errors",
            "Connections with the node agent ended by an error, by reason",
            metrics.zds_errors.clone(),
        );
        registry.register(
            "ztunnel_pending_handshakes",
            "HBONE connections accepted whose TLS handshake has not finished, over all listeners",
            metrics.pending_handshakes.clone(),
        );
        registry.register(
            "ztunnel_handshakes_refused",
            "HBONE connections closed at once, before any handshake, by reason",
            metrics.handshakes_refused.clone(),
        );
        registry.register(
            "ztunnel_accept_errors",
            "Errors accepting a connection on a listener, by listener and kind",
            metrics.accept_errors.clone(),
        );
        registry.register(
            "ztunnel_same_node_joins",
            "Same-node connections handed to the kernel to be joined, by outcome",
            metrics.joins.clone(),
        );
        metrics
    }

    /// Counts a DNS lookup of a hostname endpoint's address, made for a
    /// connection whether the answer came from the cache or not.
    pub fn record_on_demand_dns(&self, labels: &OnDemandDnsLabels) {
        self.on_demand_dns.get_or_create(labels).inc();
    }

    /// Counts a same-node connection handed to the kernel, by `outcome`.
    pub fn record_join(&self, outcome: &'static str) {
        self.joins.get_or_create(&JoinLabels { outcome }).inc();
    }

    /// Counts an error of `listener`'s accept.
    pub fn record_accept_error(&self, listener: &'static str, kind: &'static str) {
        self.accept_errors
            .get_or_create(&AcceptLabels { listener, kind })
            .inc();
    }

    /// `ztunnel_pending_handshakes`, for the listeners to count up and down.
    pub fn pending_handshakes(&self) -> Gauge {
        self.pending_handshakes.clone()
    }

    /// Counts an HBONE connection closed before its handshake.
    pub fn record_handshake_refused(&self, reason: &'static str) {
        self.handshakes_refused
            .get_or_create(&HandshakeLabels { reason })
            .inc();
    }

    /// Counts a connection as opened and returns the handle that counts its
    /// bytes and its close. `labels.response_flags` should be `None` here;
    /// the outcome is given to [`ConnectionMetrics::close`].
    pub fn open(&self, labels: TrafficLabels) -> ConnectionMetrics {
        self.opened.get_or_create(&labels).inc();
        let sockets_open = self
            .sockets_open
            .get_or_create(&ReporterLabels {
                reporter: labels.reporter,
            })
            .clone();
        sockets_open.inc();
        // The byte counters are looked up once so the copy loop only does
        // an atomic add; they keep the labels of the open.
        let sent = self.sent_bytes.get_or_create(&labels).clone();
        let received = self.received_bytes.get_or_create(&labels).clone();
        let labels = self.labels.intern(labels);
        ConnectionMetrics {
            closed_family: self.closed.clone(),
            failed_family: self.failed.clone(),
            sockets_open,
            labels,
            sent,
            received,
            sent_total: AtomicU64::new(0),
            received_total: AtomicU64::new(0),
            closed: false,
        }
    }

    /// Counts a handshake refused, or an open connection closed, because
    /// the peer's chain is revoked.
    pub fn record_crl_rejection(&self, reporter: Reporter) {
        self.crl_rejections
            .get_or_create(&ReporterLabels { reporter })
            .inc();
    }

    /// Counts a connection that could not be watched for revocation lists
    /// installed while it is open.
    pub fn record_crl_untracked(&self, reporter: Reporter) {
        self.crl_untracked
            .get_or_create(&ReporterLabels { reporter })
            .inc();
    }

    /// Counts a connection that a policy re-check closed.
    pub fn record_policy_close(&self, reporter: Reporter) {
        self.policy_closed
            .get_or_create(&ReporterLabels { reporter })
            .inc();
    }

    /// Counts a NACK sent to the node agent.
    pub fn record_zds_nack(&self, reason: &'static str) {
        self.zds_nacks.get_or_create(&ZdsLabels { reason }).inc();
    }

    /// Counts a connection with the node agent that ended with an error.
    pub fn record_zds_error(&self, reason: &'static str) {
        self.zds_errors.get_or_create(&ZdsLabels { reason }).inc();
    }

    /// Counts a connection that waited for the proxy's own workload;
    /// `arrived` says whether it came within the wait.
    pub fn record_workload_wait(&self, reporter: Reporter, arrived: bool) {
        let outcome = if arrived { "arrived" } else { "timeout" };
        self.workload_waits
            .get_or_create(&WaitLabels { reporter, outcome })
            .inc();
    }
}

/// One connection's metrics, from open to close. `Sync`, so the two copy
/// directions can count through a shared reference. Dropping it without
/// [`ConnectionMetrics::close`] (a cancelled task) still counts the close,
/// with no response flag.
#[derive(Debug)]
pub struct ConnectionMetrics {
    /// What the close counts into; only these, not every family, so that
    /// an open connection carries three handles rather than eight.
    closed_family: Family<TrafficLabels, Counter>,
    failed_family: Family<TrafficLabels, Counter>,
    /// `istio_tcp_sockets_open` of the connection's reporter.
    sockets_open: Gauge,
    /// Shared with every open connection of the same labels.
    labels: Arc<TrafficLabels>,
    sent: Counter,
    received: Counter,
    /// Per-connection totals for the access log; the counters above are
    /// shared with every connection of the same labels.
    sent_total: AtomicU64,
    received_total: AtomicU64,
    closed: bool,
}

/// Bytes moved by one connection, as reported at its close.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ByteTotals {
    /// Bytes sent towards the side that opened the connection.
    pub sent: u64,
    /// Bytes received from the side that opened the connection.
    pub received: u64,
}

impl ConnectionMetrics {
    /// Counts bytes sent towards the side that opened the connection.
    pub fn add_sent(&self, bytes: u64) {
        self.sent.inc_by(bytes);
        self.sent_total.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Counts bytes received from the side that opened the connection.
    pub fn add_received(&self, bytes: u64) {
        self.received.inc_by(bytes);
        self.received_total.fetch_add(bytes, Ordering::Relaxed);
    }

    /// The labels the connection was opened with.
    pub fn labels(&self) -> &TrafficLabels {
        &self.labels
    }

    /// Bytes so far.
    pub fn totals(&self) -> ByteTotals {
        ByteTotals {
            sent: self.sent_total.load(Ordering::Relaxed),
            received: self.received_total.load(Ordering::Relaxed),
        }
    }

    /// Counts the close with its outcome, and the failure when `flags` is
    /// not `None`. Returns the connection's byte totals for the access log.
    pub fn close(mut self, flags: ResponseFlags) -> ByteTotals {
        self.record_close(flags);
        self.totals()
    }

    fn record_close(&mut self, flags: ResponseFlags) {
        if self.closed {
            return;
        }
        self.closed = true;
        // The shared set as it is, or a copy carrying the close's flags.
        let mut labels = Cow::Borrowed(&*self.labels);
        if flags != labels.response_flags {
            labels.to_mut().response_flags = flags;
        }
        self.closed_family.get_or_create(&labels).inc();
        if flags != ResponseFlags::None {
            self.failed_family.get_or_create(&labels).inc();
        }
        self.sockets_open.dec();
    }
}

impl Drop for ConnectionMetrics {
    fn drop(&mut self) {
        self.record_close(ResponseFlags::None);
    }
}

/// The registry in the Prometheus text format (OpenMetrics flavour), for
/// the stats server.
pub fn encode(registry: &Registry) -> Result<String, std::fmt::Error> {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry)?;
    Ok(text)
}

#[cfg(test)]
mod tests;
