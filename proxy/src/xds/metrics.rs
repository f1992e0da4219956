//! The xDS client's metrics, on the proxy's one registry (see `metrics.rs`):
//! Istio's names of WIRE.md §10 under `istio_`, and ours under `ztunnel_`.
//!
//! - `istio_xds_connection_terminations_total{reason}`: streams that ended
//!   (`ConnectionError`, `Error`, `Reconnect`, `Complete`), i.e. reconnects;
//! - `istio_xds_message_total{url}` / `istio_xds_message_bytes_total{url}`:
//!   responses received, by type URL;
//! - `ztunnel_xds_connected`: 1 while a stream is open;
//! - `ztunnel_xds_nacks_total{url}`: responses NACKed;
//! - `ztunnel_xds_resources_total{url,change}`: resources `updated`,
//!   `removed` or `rejected`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::metrics::istio_registry;

/// Labels of the stream terminations.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct TerminationLabels {
    reason: &'static str,
}

/// Labels of the per-type counters.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct TypeLabels {
    url: String,
}

/// Labels of the resource counter.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ResourceLabels {
    url: String,
    change: &'static str,
}

/// The xDS client's metrics. Cheap to clone: every family is shared.
#[derive(Debug, Clone, Default)]
pub struct XdsMetrics {
    terminations: Family<TerminationLabels, Counter>,
    messages: Family<TypeLabels, Counter>,
    message_bytes: Family<TypeLabels, Counter>,
    connected: Gauge,
    nacks: Family<TypeLabels, Counter>,
    resources: Family<ResourceLabels, Counter>,
}

impl XdsMetrics {
    /// Registers the metrics on `registry`.
    pub fn register(registry: &mut Registry) -> XdsMetrics {
        let metrics = XdsMetrics::default();
        let istio = istio_registry(registry);
        istio.register(
            "xds_connection_terminations",
            "xDS streams that ended, by reason",
            metrics.terminations.clone(),
        );
        istio.register(
            "xds_message",
            "xDS responses received, by type URL",
            metrics.messages.clone(),
        );
        istio.register(
            "xds_message_bytes",
            "Bytes of xDS responses received, by type URL",
            metrics.message_bytes.clone(),
        );
        registry.register(
            "ztunnel_xds_connected",
            "1 while the xDS stream is open",
            metrics.connected.clone(),
        );
        registry.register(
            "ztunnel_xds_nacks",
            "xDS responses NACKed, by type URL",
            metrics.nacks.clone(),
        );
        registry.register(
            "ztunnel_xds_resources",
            "xDS resources updated, removed or rejected, by type URL",
            metrics.resources.clone(),
        );
        metrics
    }

    /// The stream is open, or no longer.
    pub fn set_connected(&self, connected: bool) {
        self.connected.set(i64::from(connected));
    }

    /// A stream attempt ended for `reason`.
    pub fn record_termination(&self, reason: &'static str) {
        self.terminations
            .get_or_create(&TerminationLabels { reason })
            .inc();
    }

    /// A response of `type_url` and `bytes` arrived.
    pub fn record_message(&self, type_url: &str, bytes: usize) {
        let labels = TypeLabels {
            url: type_url.to_owned(),
        };
        self.messages.get_or_create(&labels).inc();
        self.message_bytes
            .get_or_create(&labels)
            .inc_by(u64::try_from(bytes).unwrap_or(u64::MAX));
    }

    /// What a response did to the resources of `type_url`.
    pub fn record_resources(
        &self,
        type_url: &str,
        updated: usize,
        removed: usize,
        rejected: usize,
    ) {
        for (change, count) in [
            ("updated", updated),
            ("removed", removed),
            ("rejected", rejected),
        ] {
            if count == 0 {
                continue;
            }
            self.resources
                .get_or_create(&ResourceLabels {
                    url: type_url.to_owned(),
                    change,
                })
                .inc_by(u64::try_from(count).unwrap_or(u64::MAX));
        }
        if rejected > 0 {
            self.nacks
                .get_or_create(&TypeLabels {
                    url: type_url.to_owned(),
                })
                .inc();
        }
    }
}
