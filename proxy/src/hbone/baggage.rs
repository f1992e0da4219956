//! `baggage` (WIRE.md §4): a workload's labels as an HBONE CONNECT carries
//! them, both ways. The client's ztunnel writes its source workload's on
//! every request; the server's writes its local workload's on the 200
//! (`ENABLE_RESPONSE_BAGGAGE`, on by default). Each side reads the
//! other's where the state cannot name that end: a receiver reached
//! through another network's gateway, which does not look its source up
//! by address, and a sender whose inner tunnel (double HBONE) ends in a
//! network it knows only through the gateway (AMBIENT.md §3.4, §3.5).
//!
//! Building and parsing are pure; which workload's labels go out, and
//! where the parsed ones are reported, is the caller's business.

use std::sync::Arc;

use http::header::{HeaderValue, InvalidHeaderValue};

/// The source workload's labels, as `baggage` reports them. Empty fields are
/// left out of the header.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkloadLabels<'a> {
    /// `CLUSTER_ID`.
    pub cluster_id: &'a str,
    /// The workload's namespace.
    pub namespace: &'a str,
    /// The lower-case `WorkloadType` name: `deployment`, `cronjob`, `pod` or `job`.
    pub workload_type: &'a str,
    /// The workload (controller) name.
    pub workload_name: &'a str,
    /// The canonical service name.
    pub canonical_name: &'a str,
    /// The canonical revision.
    pub canonical_revision: &'a str,
    /// The cloud region of the workload's node.
    pub region: &'a str,
    /// The availability zone of the workload's node.
    pub zone: &'a str,
}

/// `baggage`: comma-joined `key=value` in the WIRE.md §4 order, empty values
/// omitted.
pub fn baggage(labels: &WorkloadLabels<'_>) -> Result<HeaderValue, InvalidHeaderValue> {
    let mut value = String::with_capacity(160);
    push_pair(&mut value, &["k8s.cluster.name"], labels.cluster_id);
    push_pair(&mut value, &["k8s.namespace.name"], labels.namespace);
    // Without a type the workload name has no key to go under.
    if !labels.workload_type.is_empty() {
        let key = ["k8s.", labels.workload_type, ".name"];
        push_pair(&mut value, &key, labels.workload_name);
    }
    push_pair(&mut value, &["service.name"], labels.canonical_name);
    push_pair(&mut value, &["service.version"], labels.canonical_revision);
    push_pair(&mut value, &["cloud.region"], labels.region);
    push_pair(&mut value, &["cloud.availability_zone"], labels.zone);
    HeaderValue::try_from(value)
}

/// Appends `,key=item` (no comma first), unless `item` is empty.
fn push_pair(value: &mut String, key: &[&str], item: &str) {
    if item.is_empty() {
        return;
    }
    if !value.is_empty() {
        value.push(',');
    }
    key.iter().for_each(|part| value.push_str(part));
    value.push('=');
    value.push_str(item);
}

/// What a peer's `baggage` says of its workload: every field it names with
/// a value, as it named it. Nothing here is verified; the reports that use
/// it take the peer's identity from its certificate, never from here.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Baggage {
    /// `k8s.cluster.name`.
    pub cluster: Option<Arc<str>>,
    /// `k8s.namespace.name`.
    pub namespace: Option<Arc<str>>,
    /// `k8s.<type>.name`, for the four types a workload is named by.
    pub workload_name: Option<Arc<str>>,
    /// `service.name`: the canonical service.
    pub canonical_name: Option<Arc<str>>,
    /// `service.version`: the canonical revision.
    pub canonical_revision: Option<Arc<str>>,
    /// `cloud.region`.
    pub region: Option<Arc<str>>,
    /// `cloud.availability_zone`.
    pub zone: Option<Arc<str>>,
}

impl Baggage {
    /// Reads every `baggage` value in turn, a later key overriding an
    /// earlier one, as istio/ztunnel reads them. A value that is not
    /// visible ASCII makes the whole header unreadable: nothing is taken
    /// from it. Unknown keys, members without `=` and empty values are
    /// passed over; a member's value ends at its next `=` or `,`.
    pub fn parse<'a>(values: impl IntoIterator<Item = &'a HeaderValue>) -> Baggage {
        let mut baggage = Baggage::default();
        for value in values {
            let Ok(text) = value.to_str() else {
                return Baggage::default();
            };
            for member in text.split(',') {
                let mut parts = member.split('=');
                let (Some(key), Some(item)) = (parts.next(), parts.next()) else {
                    continue;
                };
                let Some(field) = baggage.field(key) else {
                    continue;
                };
                *field = (!item.is_empty()).then(|| Arc::from(item));
            }
        }
        baggage
    }

    /// The field `key` sets, if it is one of the keys read.
    fn field(&mut self, key: &str) -> Option<&mut Option<Arc<str>>> {
        Some(match key {
            "k8s.cluster.name" => &mut self.cluster,
            "k8s.namespace.name" => &mut self.namespace,
            "k8s.deployment.name" | "k8s.cronjob.name" | "k8s.pod.name" | "k8s.job.name" => {
                &mut self.workload_name
            }
            "service.name" => &mut self.canonical_name,
            "service.version" => &mut self.canonical_revision,
            "cloud.region" => &mut self.region,
            "cloud.availability_zone" => &mut self.zone,
            _ => return None,
        })
    }

    /// Whether it names nothing.
    pub fn is_empty(&self) -> bool {
        *self == Baggage::default()
    }
}

#[cfg(test)]
pub(super) mod tests;
