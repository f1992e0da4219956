//! The DNS proxy's metrics, with istio/ztunnel's names and labels
//! (AMBIENT.md §5.7), registered on the proxy's registry under `istio_`.
//! A forwarded query counts in both `requests` and `upstream_requests`.

use hickory_proto::rr::RecordType;
use prometheus_client::encoding::{EncodeLabelSet, LabelSetEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::wire::Transport;
use crate::metrics::{LabelValue, istio_registry};

/// Buckets of `istio_dns_upstream_request_duration_seconds`, istio/ztunnel's:
/// from a cache hit on the node (0.5 ms) to the resolver's timeout (5 s).
const DURATION_BUCKETS: [f64; 6] = [0.0005, 0.001, 0.01, 0.1, 1.0, 5.0];

/// The `request_query_type` of a query for `record_type`: its name in lower
/// case for the types resolvers ask for, `other` for the rest. A pod can
/// ask for any of 65,536 types, and each would otherwise be a series of
/// its own in every family; this way a pod makes at most 18.
pub fn query_type_label(record_type: RecordType) -> &'static str {
    match record_type {
        RecordType::A => "a",
        RecordType::AAAA => "aaaa",
        RecordType::ANY => "any",
        RecordType::CAA => "caa",
        RecordType::CNAME => "cname",
        RecordType::DS => "ds",
        RecordType::DNSKEY => "dnskey",
        RecordType::HTTPS => "https",
        RecordType::MX => "mx",
        RecordType::NAPTR => "naptr",
        RecordType::NS => "ns",
        RecordType::PTR => "ptr",
        RecordType::SOA => "soa",
        RecordType::SRV => "srv",
        RecordType::SVCB => "svcb",
        RecordType::TLSA => "tlsa",
        RecordType::TXT => "txt",
        _ => "other",
    }
}

/// The labels of every DNS metric.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DnsLabels {
    /// The record type asked ([`query_type_label`]).
    pub query_type: &'static str,
    /// The transport the query came on.
    pub protocol: Transport,
    /// The client workload's canonical service.
    pub canonical_service: LabelValue,
    /// The client workload's canonical revision.
    pub canonical_revision: LabelValue,
}

impl EncodeLabelSet for DnsLabels {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        [
            ("request_query_type", self.query_type),
            ("request_protocol", self.protocol.as_str()),
            ("source_canonical_service", self.canonical_service.as_str()),
            (
                "source_canonical_revision",
                self.canonical_revision.as_str(),
            ),
        ]
        .as_slice()
        .encode(encoder)
    }
}

/// The DNS metrics; cheap to clone, clones count into the same series.
#[derive(Debug, Clone)]
pub struct DnsMetrics {
    /// `istio_dns_requests_total`: every query received.
    pub requests: Family<DnsLabels, Counter>,
    /// `istio_dns_upstream_requests_total`: queries forwarded.
    pub upstream_requests: Family<DnsLabels, Counter>,
    /// `istio_dns_upstream_failures_total`: forwarded queries that got no
    /// response (answered SERVFAIL).
    pub upstream_failures: Family<DnsLabels, Counter>,
    /// `istio_dns_upstream_request_duration_seconds`.
    pub upstream_duration: Family<DnsLabels, Histogram>,
}

impl DnsMetrics {
    /// Registers the DNS metrics on `registry`.
    pub fn register(registry: &mut Registry) -> DnsMetrics {
        let metrics = DnsMetrics::unregistered();
        let istio = istio_registry(registry);
        // prometheus-client adds the counters' `_total`.
        istio.register(
            "dns_requests",
            "Total number of DNS requests",
            metrics.requests.clone(),
        );
        istio.register(
            "dns_upstream_requests",
            "Total number of DNS requests forwarded to the upstream",
            metrics.upstream_requests.clone(),
        );
        istio.register(
            "dns_upstream_failures",
            "Total number of DNS requests the upstream did not answer",
            metrics.upstream_failures.clone(),
        );
        istio.register(
            "dns_upstream_request_duration_seconds",
            "Time to get a response from the upstream",
            metrics.upstream_duration.clone(),
        );
        metrics
    }

    /// Metrics that count but are exposed nowhere (tests, benches).
    pub fn unregistered() -> DnsMetrics {
        DnsMetrics {
            requests: Family::default(),
            upstream_requests: Family::default(),
            upstream_failures: Family::default(),
            upstream_duration: Family::new_with_constructor(|| Histogram::new(DURATION_BUCKETS)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_metrics_have_istios_names_and_labels() {
        let mut registry = Registry::default();
        let metrics = DnsMetrics::register(&mut registry);
        let labels = DnsLabels {
            query_type: query_type_label(RecordType::AAAA),
            protocol: Transport::Tcp,
            canonical_service: LabelValue::from(std::sync::Arc::from("client")),
            canonical_revision: LabelValue::unknown(),
        };
        metrics.requests.get_or_create(&labels).inc();
        metrics.upstream_requests.get_or_create(&labels).inc();
        metrics.upstream_failures.get_or_create(&labels).inc();
        metrics
            .upstream_duration
            .get_or_create(&labels)
            .observe(0.002);
        let text = crate::metrics::encode(&registry).unwrap();
        let series = r#"{request_query_type="aaaa",request_protocol="tcp",source_canonical_service="client",source_canonical_revision="unknown"}"#;
        for name in [
            "istio_dns_requests_total",
            "istio_dns_upstream_requests_total",
            "istio_dns_upstream_failures_total",
        ] {
            assert!(
                text.contains(&format!("{name}{series} 1")),
                "{name} in\n{text}"
            );
        }
        let bucket = r#"istio_dns_upstream_request_duration_seconds_bucket{le="0.01",request_query_type="aaaa""#;
        assert!(text.contains(bucket), "{text}");
    }

    #[test]
    fn every_record_type_has_one_of_eighteen_labels() {
        let cases = [
            (RecordType::A, "a"),
            (RecordType::AAAA, "aaaa"),
            (RecordType::SRV, "srv"),
            (RecordType::HTTPS, "https"),
            (RecordType::NULL, "other"),
            (RecordType::Unknown(65280), "other"),
        ];
        for (record_type, label) in cases {
            assert_eq!(query_type_label(record_type), label, "{record_type:?}");
        }
        let labels: std::collections::BTreeSet<&str> = (0..=u16::MAX)
            .map(|code| query_type_label(RecordType::from(code)))
            .collect();
        assert_eq!(labels.len(), 18, "{labels:?}");
    }
}
