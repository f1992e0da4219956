//! The traffic label set of WIRE.md §10, in its fixed order. Values are
//! `Arc<str>` taken from the proxy's state, so building labels for a
//! connection clones reference counts and never formats a string.

use std::sync::Arc;

use prometheus_client::encoding::{
    EncodeLabelSet, EncodeLabelValue, LabelSetEncoder, LabelValueEncoder,
};

use super::ResponseFlags;

/// The text of a missing label value.
const UNKNOWN: &str = "unknown";

/// One label value; missing (or empty) values read `unknown`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct LabelValue(Option<Arc<str>>);

impl LabelValue {
    /// A missing value.
    pub const fn unknown() -> Self {
        Self(None)
    }

    /// The value as exposed.
    pub fn as_str(&self) -> &str {
        match self.0.as_deref() {
            Some(value) if !value.is_empty() => value,
            _ => UNKNOWN,
        }
    }
}

impl From<Arc<str>> for LabelValue {
    fn from(value: Arc<str>) -> Self {
        Self(Some(value))
    }
}

impl From<Option<Arc<str>>> for LabelValue {
    fn from(value: Option<Arc<str>>) -> Self {
        Self(value)
    }
}

impl From<&str> for LabelValue {
    /// Allocates; for values built once (start-up, tests), not per connection.
    fn from(value: &str) -> Self {
        Self(Some(Arc::from(value)))
    }
}

impl EncodeLabelValue for LabelValue {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        EncodeLabelValue::encode(&self.as_str(), encoder)
    }
}

/// Which proxy counted the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reporter {
    /// The client's proxy (outbound).
    Source,
    /// The server's proxy (inbound).
    Destination,
}

impl Reporter {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Source => "source",
            Self::Destination => "destination",
        }
    }
}

impl EncodeLabelValue for Reporter {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        EncodeLabelValue::encode(&self.as_str(), encoder)
    }
}

/// Whether the connection was carried over mutual TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SecurityPolicy {
    /// HBONE, with both identities verified.
    MutualTls,
    /// Plain TCP, or not known.
    #[default]
    Unknown,
}

impl SecurityPolicy {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MutualTls => "mutual_tls",
            Self::Unknown => UNKNOWN,
        }
    }
}

/// The workload labels of one side of a connection.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct PeerLabels {
    /// The workload's name (e.g. its Deployment).
    pub workload: LabelValue,
    /// `service.istio.io/canonical-name`.
    pub canonical_service: LabelValue,
    /// `service.istio.io/canonical-revision`.
    pub canonical_revision: LabelValue,
    /// The workload's namespace.
    pub workload_namespace: LabelValue,
    /// The full `spiffe://…` identity.
    pub principal: LabelValue,
    /// The `app` label.
    pub app: LabelValue,
    /// The `version` label.
    pub version: LabelValue,
    /// The workload's cluster.
    pub cluster: LabelValue,
    /// The workload's region; Istio's dashboards group by it.
    pub region: LabelValue,
    /// The workload's zone.
    pub zone: LabelValue,
}

/// The destination service labels.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct ServiceLabels {
    /// The service hostname.
    pub service: LabelValue,
    /// The service's namespace.
    pub namespace: LabelValue,
    /// The service's short name.
    pub name: LabelValue,
}

/// The traffic labels of WIRE.md §10. Encoded by hand so the order is the
/// one written in [`EncodeLabelSet::encode`] below, in one place.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TrafficLabels {
    /// Which proxy counts.
    pub reporter: Reporter,
    /// The client workload.
    pub source: PeerLabels,
    /// The service the client asked for.
    pub destination_service: ServiceLabels,
    /// The server workload.
    pub destination: PeerLabels,
    /// The outcome; set by [`super::ConnectionMetrics::close`].
    pub response_flags: ResponseFlags,
    /// mTLS or not.
    pub security_policy: SecurityPolicy,
}

impl TrafficLabels {
    /// Every value unknown, no flag; the caller fills in what it knows.
    pub fn new(reporter: Reporter) -> Self {
        Self {
            reporter,
            source: PeerLabels::default(),
            destination_service: ServiceLabels::default(),
            destination: PeerLabels::default(),
            response_flags: ResponseFlags::None,
            security_policy: SecurityPolicy::Unknown,
        }
    }
}

impl EncodeLabelSet for TrafficLabels {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        let (source, service, destination) =
            (&self.source, &self.destination_service, &self.destination);
        [("reporter", self.reporter.as_str())]
            .as_slice()
            .encode(encoder)?;
        source_labels(source).as_slice().encode(encoder)?;
        let labels: [(&str, &str); 18] = [
            ("destination_service", service.service.as_str()),
            ("destination_service_namespace", service.namespace.as_str()),
            ("destination_service_name", service.name.as_str()),
            ("destination_workload", destination.workload.as_str()),
            (
                "destination_canonical_service",
                destination.canonical_service.as_str(),
            ),
            (
                "destination_canonical_revision",
                destination.canonical_revision.as_str(),
            ),
            (
                "destination_workload_namespace",
                destination.workload_namespace.as_str(),
            ),
            ("destination_principal", destination.principal.as_str()),
            ("destination_app", destination.app.as_str()),
            ("destination_version", destination.version.as_str()),
            ("destination_cluster", destination.cluster.as_str()),
            ("request_protocol", "tcp"),
            ("response_flags", self.response_flags.as_str()),
            ("connection_security_policy", self.security_policy.as_str()),
            // Always present and last, `unknown` without a locality, as
            // istio/ztunnel writes them.
            ("source_region", source.region.as_str()),
            ("source_zone", source.zone.as_str()),
            ("destination_region", destination.region.as_str()),
            ("destination_zone", destination.zone.as_str()),
        ];
        labels.as_slice().encode(encoder)
    }
}

/// The `source_*` labels of a client workload, in WIRE.md §10's order.
fn source_labels(source: &PeerLabels) -> [(&'static str, &str); 8] {
    [
        ("source_workload", source.workload.as_str()),
        (
            "source_canonical_service",
            source.canonical_service.as_str(),
        ),
        (
            "source_canonical_revision",
            source.canonical_revision.as_str(),
        ),
        (
            "source_workload_namespace",
            source.workload_namespace.as_str(),
        ),
        ("source_principal", source.principal.as_str()),
        ("source_app", source.app.as_str()),
        ("source_version", source.version.as_str()),
        ("source_cluster", source.cluster.as_str()),
    ]
}

/// Labels of `istio_on_demand_dns_total` (WIRE.md §10): the client
/// workload whose connection needed the lookup, and the hostname looked up.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OnDemandDnsLabels {
    /// The client workload.
    pub source: PeerLabels,
    /// The endpoint's hostname.
    pub hostname: LabelValue,
}

impl EncodeLabelSet for OnDemandDnsLabels {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        source_labels(&self.source).as_slice().encode(encoder)?;
        [("hostname", self.hostname.as_str())]
            .as_slice()
            .encode(encoder)
    }
}
