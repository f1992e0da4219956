//! One Istio WorkloadEntry → one mesh [`WorkloadEntry`], as istiod's
//! ambient index builds its Workload (`workloadEntryWorkloadBuilder`):
//! uid `<cluster>/networking.istio.io/WorkloadEntry/<ns>/<name>`, the
//! address as an IP or else a hostname, `spec.labels` under the object's
//! own labels, the service account of its identity, `spec.network` over
//! the control plane's, `spec.locality` split at `/`, `spec.weight` as
//! capacity, and the tunnel from the same labels and annotations as a
//! pod's. A ServiceEntry's inline endpoints share the field mapping
//! ([`endpoint_fields`]); which services list them is
//! `service_entry.rs`'s and xDS's.
//!
//! Not converted, as with istiod's ambient index: health (a WorkloadEntry
//! is always healthy there).

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use super::pod::{WORKLOAD_NAME_LABEL, tunnel};
use super::{ConvertSettings, ObjectProblem, Outcome, ProblemReason, name_and_namespace, problem};
use crate::kube::workload_entry_crd::{WorkloadEntry as KubeWorkloadEntry, WorkloadEntrySpec};
use crate::{EntryAddress, Locality, WorkloadEntry};

/// Names the auto-registration group a WorkloadEntry was made for, which
/// is its workload's name.
const AUTO_REGISTRATION_GROUP_ANNOTATION: &str = "istio.io/autoRegistrationGroup";

/// Every WorkloadEntry that converts, in namespace/name order.
pub(super) fn workload_entries(
    objects: &[Arc<KubeWorkloadEntry>],
    settings: &ConvertSettings,
    problems: &mut Vec<ObjectProblem>,
) -> Vec<WorkloadEntry> {
    let mut converted = Vec::with_capacity(objects.len());
    let mut uids = HashSet::new();
    for object in super::sorted(objects, |entry| &entry.metadata) {
        let report = |reason| problem("WorkloadEntry", &object.metadata, reason);
        let outcome = workload_entry(object, settings);
        problems.extend(outcome.problems.into_iter().map(report));
        let Some(entry) = outcome.entry else {
            continue;
        };
        if !uids.insert(entry.uid.clone()) {
            problems.push(report(ProblemReason::Duplicate));
            continue;
        }
        converted.push(entry);
    }
    converted
}

/// The mesh workload of one WorkloadEntry, or why it is left out.
pub(super) fn workload_entry(
    object: &KubeWorkloadEntry,
    settings: &ConvertSettings,
) -> Outcome<WorkloadEntry> {
    let (name, namespace) = match name_and_namespace(&object.metadata) {
        Ok(names) => names,
        Err(reason) => return Outcome::left_out(reason),
    };
    let metadata = &object.metadata;
    let mut labels = object.spec.labels.clone();
    labels.extend(metadata.labels.clone().unwrap_or_default());
    // The tunnel label may be in either place; the merged set decides.
    let merged = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        labels: Some(labels.clone()),
        annotations: metadata.annotations.clone(),
        ..Default::default()
    };
    let (protocol, native_tunnel) = tunnel(&merged);
    let workload_name = super::value(&metadata.annotations, AUTO_REGISTRATION_GROUP_ANNOTATION)
        .or_else(|| labels.get(WORKLOAD_NAME_LABEL).map(String::as_str))
        .unwrap_or(&name)
        .to_owned();
    let mut problems = Vec::new();
    let fields = endpoint_fields(&object.spec, settings, &mut problems);
    Outcome {
        entry: Some(WorkloadEntry {
            uid: format!(
                "{}/networking.istio.io/WorkloadEntry/{namespace}/{name}",
                settings.cluster_id
            ),
            name,
            namespace,
            labels,
            protocol,
            native_tunnel,
            workload_name,
            service_entry: None,
            ..fields
        }),
        problems,
    }
}

/// What a WorkloadEntry's spec (or a ServiceEntry's endpoint) says of a
/// workload: address, service account, network, locality, weight, ports,
/// cluster and trust domain. Names, labels, tunnel and workload name are
/// the caller's, which know whose they are; they are left empty here.
pub(super) fn endpoint_fields(
    spec: &WorkloadEntrySpec,
    settings: &ConvertSettings,
    problems: &mut Vec<ProblemReason>,
) -> WorkloadEntry {
    let address = if spec.address.is_empty() {
        EntryAddress::None
    } else {
        match spec.address.parse::<IpAddr>() {
            Ok(ip) => EntryAddress::Ip(ip),
            Err(_) => EntryAddress::Hostname(spec.address.clone()),
        }
    };
    let mut ports = BTreeMap::new();
    for (port_name, number) in &spec.ports {
        match u16::try_from(*number) {
            Ok(port) if port != 0 => {
                ports.insert(port_name.clone(), port);
            }
            _ => problems.push(ProblemReason::BadPort {
                port: i64::from(*number),
            }),
        }
    }
    WorkloadEntry {
        name: String::new(),
        namespace: String::new(),
        uid: String::new(),
        address,
        labels: BTreeMap::new(),
        service_account: spec.service_account.clone(),
        network: if spec.network.is_empty() {
            settings.network.clone()
        } else {
            spec.network.clone()
        },
        locality: locality(&spec.locality),
        weight: (spec.weight > 0).then_some(spec.weight),
        ports,
        protocol: crate::WorkloadProtocol::Tcp,
        native_tunnel: false,
        workload_name: String::new(),
        cluster_id: Some(settings.cluster_id.clone()),
        trust_domain: Some(super::pod::wire_trust_domain(settings)),
        service_entry: None,
    }
}

/// `region/zone/subzone`, each part optional; none at all is no locality.
fn locality(text: &str) -> Option<Locality> {
    let mut parts = text.splitn(3, '/');
    let mut part = || parts.next().unwrap_or_default().to_owned();
    let locality = Locality {
        region: part(),
        zone: part(),
        subzone: part(),
    };
    (locality != Locality::default()).then_some(locality)
}

#[cfg(test)]
mod tests;
