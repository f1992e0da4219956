//! Kubernetes objects → the mesh model, as one pure function ([`convert`])
//! over what the watches hold, following istiod's ambient index
//! (KUBERNETES.md E2–E10). The result always passes
//! [`MeshSnapshot::new`](crate::MeshSnapshot::new): an object that would
//! break it is left out and reported, never failing the rest.
//!
//! This file owns the whole-mesh part: ordering, the checks across objects
//! (duplicates, shared addresses) and the problems' vocabulary. One object
//! at a time is `pod.rs`, `service.rs`, `policy.rs`,
//! `peer_authentication.rs`, `workload_entry.rs` and `service_entry.rs`'s
//! (with the ServiceEntries' VIPs in `allocation.rs`). Watching is
//! `kube.rs`'s.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace, Node, Pod as KubePod, Service as KubeService};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::gateway_crd::{Gateway, GatewayClass};
use super::peer_authentication_crd::PeerAuthentication;
use super::policy_crd::AuthorizationPolicy;
use super::service_entry_crd::ServiceEntry;
use super::workload_entry_crd::WorkloadEntry;
use crate::peer_authentication::converted_policies;
use crate::{Labels, Locality, MeshFile, Pod, Policy};
use waypoint::Waypoints;

pub mod allocation;
pub mod export_to;
mod network;
mod peer_authentication;
mod pod;
mod policy;
mod service;
mod service_entry;
mod waypoint;
mod workload_entry;

pub use pod::{pod_addresses, service_account};
pub use service_entry::Resolution;
pub use waypoint::status_addresses;

/// What the watches currently hold. Order does not matter: the output is
/// sorted by namespace and name.
#[derive(Debug, Clone, Default)]
pub struct KubeObjects {
    /// Every pod, whichever its phase (the CA counts all but Failed ones).
    pub pods: Vec<Arc<KubePod>>,
    /// Namespaces: their waypoint labels and traffic distribution, and the
    /// system namespace's network label.
    pub namespaces: Vec<Arc<Namespace>>,
    /// Services.
    pub services: Vec<Arc<KubeService>>,
    /// EndpointSlices: the members of services without a selector.
    pub endpoint_slices: Vec<Arc<EndpointSlice>>,
    /// Nodes: the locality of their pods.
    pub nodes: Vec<Arc<Node>>,
    /// Istio AuthorizationPolicies.
    pub authorization_policies: Vec<Arc<AuthorizationPolicy>>,
    /// Istio PeerAuthentications.
    pub peer_authentications: Vec<Arc<PeerAuthentication>>,
    /// Gateway API Gateways: waypoints and network gateways.
    pub gateways: Vec<Arc<Gateway>>,
    /// Gateway API GatewayClasses: what their Gateways inherit.
    pub gateway_classes: Vec<Arc<GatewayClass>>,
    /// Istio ServiceEntries, with the addresses allocated in their status.
    pub service_entries: Vec<Arc<ServiceEntry>>,
    /// Istio WorkloadEntries.
    pub workload_entries: Vec<Arc<WorkloadEntry>>,
}

/// The mesh-wide settings istiod takes from its flags and mesh config.
#[derive(Debug, Clone, PartialEq)]
pub struct ConvertSettings {
    /// The cluster's name in workload uids and `Workload.cluster_id`
    /// (istiod `CLUSTER_ID`).
    pub cluster_id: String,
    /// The trust domain of workload identities (mesh config
    /// `trustDomain`).
    pub trust_domain: String,
    /// The DNS suffix of service hostnames (istiod `--domain`).
    pub cluster_domain: String,
    /// Where mesh-wide policies live (mesh config `rootNamespace`).
    pub root_namespace: String,
    /// The network of pod IPs and service VIPs when the system namespace
    /// has no `topology.istio.io/network` label; empty is the default one.
    pub network: String,
    /// The namespace the control plane runs in: its
    /// `topology.istio.io/network` label names the network.
    pub system_namespace: String,
    /// Whether dry-run policies are sent, marked dry-run, rather than
    /// left out (`AMBIENT_ENABLE_DRY_RUN_AUTHORIZATION_POLICY`).
    pub enable_dry_run_policies: bool,
    /// The mesh config's `serviceEntryVisibility`; `None`, every
    /// ServiceEntry is public.
    pub service_entry_visibility: Option<export_to::ServiceEntryVisibility>,
}

impl Default for ConvertSettings {
    /// istiod's defaults.
    fn default() -> Self {
        ConvertSettings {
            cluster_id: "Kubernetes".to_owned(),
            trust_domain: "cluster.local".to_owned(),
            cluster_domain: "cluster.local".to_owned(),
            root_namespace: "istio-system".to_owned(),
            network: String::new(),
            system_namespace: "istio-system".to_owned(),
            enable_dry_run_policies: false,
            service_entry_visibility: None,
        }
    }
}

/// The mesh the objects make, and what was left out or trimmed on the way.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Conversion {
    /// Passes `MeshSnapshot::new`.
    pub mesh: MeshFile,
    /// One entry per object and reason, pods first, then services and
    /// EndpointSlices in namespace/name order, WorkloadEntries, then
    /// ServiceEntries oldest first, policies in namespace/name order, then
    /// PeerAuthentications, oldest first.
    pub problems: Vec<ObjectProblem>,
}

/// An object the conversion left out or trimmed, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectProblem {
    /// `Pod`, `Service`, `EndpointSlice`, `AuthorizationPolicy`,
    /// `PeerAuthentication`, `ServiceEntry` or `WorkloadEntry`.
    pub kind: &'static str,
    /// The object's namespace (empty if it has none).
    pub namespace: String,
    /// The object's name (empty if it has none).
    pub name: String,
    /// What happened to it.
    pub reason: ProblemReason,
}

impl fmt::Display for ObjectProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}/{}: {}",
            self.kind, self.namespace, self.name, self.reason
        )
    }
}

/// Why an object is left out of the mesh or only partly in it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProblemReason {
    /// A field the model needs is absent or empty; the object is left out.
    #[error("{field} is missing")]
    MissingField {
        /// The field, e.g. `metadata.uid`.
        field: &'static str,
    },
    /// A pod's namespace and service account make no SPIFFE identity
    /// (names the API server would not accept); the pod is left out.
    #[error("no valid identity: {0}")]
    InvalidIdentity(String),
    /// A pod uid with a `/`, which could collide with a service resource
    /// name; the pod is left out.
    #[error("uid {uid:?} contains '/'")]
    SlashInUid {
        /// The uid.
        uid: String,
    },
    /// Another object of the same kind has this namespace and name (for a
    /// policy, also one a PeerAuthentication makes); the later one is left
    /// out.
    #[error("appears twice")]
    Duplicate,
    /// Another pod has this uid; the later one (in namespace/name order) is
    /// left out.
    #[error("uid {uid} is also pod {other}'s")]
    DuplicateUid {
        /// The uid.
        uid: String,
        /// `namespace/name` of the pod kept.
        other: String,
    },
    /// Another live pod has this address; the later one (in namespace/name
    /// order) is kept without addresses, so it is no workload.
    #[error("address {address} is also pod {other}'s; the pod is kept without addresses")]
    AddressInUse {
        /// The address.
        address: IpAddr,
        /// `namespace/name` of the pod keeping it.
        other: String,
    },
    /// An address that does not parse; it is skipped.
    #[error("address {address:?} does not parse; skipped")]
    BadAddress {
        /// The text.
        address: String,
    },
    /// A service port or target port outside 1..=65535; the port is
    /// skipped.
    #[error("port {port} is out of range; skipped")]
    BadPort {
        /// The number.
        port: i64,
    },
    /// Endpoints with no Pod behind them; they are not converted (istiod
    /// makes workloads of them; the model has no such entry).
    #[error("{count} endpoint(s) without a Pod targetRef are not converted")]
    EndpointsWithoutPod {
        /// How many.
        count: usize,
    },
    /// A policy for a gateway or service (`targetRef`/`targetRefs`): waypoints
    /// enforce it, so it is not sent.
    #[error("policy with targetRef is for waypoints; not sent")]
    TargetRefNotSent,
    /// An action ztunnel does not enforce (`AUDIT`, `CUSTOM`); not sent.
    #[error("ztunnel does not support action {action}; not sent")]
    UnsupportedAction {
        /// The action as written.
        action: &'static str,
    },
    /// An object's own `istio.io/use-waypoint` label that binds nothing;
    /// it goes direct (no fall-back to its namespace's waypoint).
    #[error("waypoint {waypoint} not bound: {reason}")]
    WaypointNotBound {
        /// `namespace/name` of the Gateway named.
        waypoint: String,
        /// istiod's reason: `WaypointIsNotReady`, `AttachmentDenied` or
        /// `UnsupportedTrafficType`.
        reason: &'static str,
    },
    /// A canary waypoint that cannot be used; the primary alone applies.
    #[error("canary waypoint not used: {why}")]
    CanaryInvalid {
        /// Why.
        why: String,
    },
    /// A PeerAuthentication `portLevelMtls` key that is no port in
    /// 1..=65535; that port's mode is skipped.
    #[error("portLevelMtls key {key:?} is not a port; skipped")]
    BadPortKey {
        /// The key.
        key: String,
    },
    /// An mTLS mode that is not UNSET, DISABLE, PERMISSIVE or STRICT; the
    /// PeerAuthentication is left out.
    #[error("unknown mTLS mode {mode:?}")]
    UnknownMtlsMode {
        /// The mode as written.
        mode: String,
    },
    /// An enumerated field's value this Istio does not know; the object
    /// is left out (istiod cannot decode it either).
    #[error("unknown {field} {value:?}")]
    UnknownValue {
        /// The field, e.g. `spec.resolution`.
        field: &'static str,
        /// The value as written.
        value: String,
    },
    /// A ServiceEntry with both inline endpoints and a workload selector,
    /// which Istio's validation refuses; it is left out.
    #[error("spec.endpoints and spec.workloadSelector are both set")]
    EndpointsAndSelector,
    /// A ServiceEntry address that is no IP or CIDR; the ServiceEntry is
    /// left out, as istiod makes no services of it.
    #[error("spec.addresses entry {address:?} is no IP or CIDR")]
    BadServiceEntryAddress {
        /// The text.
        address: String,
    },
    /// A ServiceEntry address that is a CIDR of more than one address; it
    /// is skipped.
    #[error("CIDR address {address} is not converted; skipped")]
    CidrSkipped {
        /// The CIDR.
        address: String,
    },
    /// A ServiceEntry host that a Kubernetes Service of its namespace or an
    /// older ServiceEntry already has; that host is left out.
    #[error("host {host} is already {other}'s in this namespace; left out")]
    HostTaken {
        /// The host.
        host: String,
        /// `Service <name>` or `ServiceEntry <name>`.
        other: String,
    },
    /// A `subjectAltNames` entry that is no SPIFFE identity; it is
    /// skipped.
    #[error("subjectAltNames entry {san:?} is not a SPIFFE identity; skipped")]
    SubjectAltNameSkipped {
        /// The entry.
        san: String,
    },
    /// Two endpoints with one address (or uid), which would be one
    /// workload; the later is skipped.
    #[error("endpoint {address:?} appears twice; the second is skipped")]
    DuplicateEndpoint {
        /// The address.
        address: String,
    },
    /// A dry-run policy while dry-run policies are disabled; not sent.
    #[error("dry-run policy not sent (dry-run policies are disabled)")]
    DryRunNotSent,
    /// An `ALLOW` policy's rules using HTTP-only fields; those rules are
    /// left out (a policy left with none allows nothing).
    #[error("{rules} ALLOW rule(s) dropped: ztunnel does not support {}", .fields.join(", "))]
    AllowRulesDropped {
        /// How many rules.
        rules: usize,
        /// The fields, e.g. `to.operation.methods`.
        fields: Vec<String>,
    },
    /// A `DENY` policy's HTTP-only fields; they are left out of their rules
    /// (a match left empty never matches).
    #[error("DENY fields ignored: ztunnel does not support {}", .fields.join(", "))]
    DenyFieldsIgnored {
        /// The fields, e.g. `to.operation.methods`.
        fields: Vec<String>,
    },
}

impl ProblemReason {
    /// What the problem did to the object.
    pub fn effect(&self) -> Effect {
        match self {
            ProblemReason::MissingField { .. }
            | ProblemReason::SlashInUid { .. }
            | ProblemReason::InvalidIdentity(_)
            | ProblemReason::Duplicate
            | ProblemReason::DuplicateUid { .. }
            | ProblemReason::UnknownMtlsMode { .. }
            | ProblemReason::UnknownValue { .. }
            | ProblemReason::EndpointsAndSelector
            | ProblemReason::BadServiceEntryAddress { .. } => Effect::Dropped,
            ProblemReason::TargetRefNotSent
            | ProblemReason::UnsupportedAction { .. }
            | ProblemReason::DryRunNotSent => Effect::NotSent,
            ProblemReason::AddressInUse { .. }
            | ProblemReason::BadAddress { .. }
            | ProblemReason::BadPort { .. }
            | ProblemReason::BadPortKey { .. }
            | ProblemReason::EndpointsWithoutPod { .. }
            | ProblemReason::AllowRulesDropped { .. }
            | ProblemReason::DenyFieldsIgnored { .. }
            | ProblemReason::WaypointNotBound { .. }
            | ProblemReason::CanaryInvalid { .. }
            | ProblemReason::CidrSkipped { .. }
            | ProblemReason::HostTaken { .. }
            | ProblemReason::SubjectAltNameSkipped { .. }
            | ProblemReason::DuplicateEndpoint { .. } => Effect::Trimmed,
        }
    }
}

/// What a problem did to its object, for choosing how loudly to say it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// The object is malformed or contradicts another: it is not in the
    /// mesh.
    Dropped,
    /// The object asks for what ztunnel does not do: it is not in the mesh,
    /// as with istiod (which writes a status condition).
    NotSent,
    /// The object is in the mesh with a part left out.
    Trimmed,
}

/// The mesh the objects make. Pure: the same objects give the same result.
pub fn convert(objects: &KubeObjects, settings: &ConvertSettings) -> Conversion {
    let mut problems = Vec::new();
    let namespaces: HashMap<&str, &ObjectMeta> = objects
        .namespaces
        .iter()
        .filter_map(|ns| Some((ns.metadata.name.as_deref()?, &ns.metadata)))
        .collect();
    let network = namespaces
        .get(settings.system_namespace.as_str())
        .and_then(|ns| value(&ns.labels, network::NETWORK_LABEL));
    let settings = &ConvertSettings {
        network: network.map_or_else(|| settings.network.clone(), str::to_owned),
        ..settings.clone()
    };
    let waypoints = Waypoints::new(
        &objects.gateways,
        &objects.gateway_classes,
        &namespaces,
        &settings.network,
    );
    let localities = pod::localities(&objects.nodes);
    let pods = pods(objects, &localities, &waypoints, settings, &mut problems);
    let context = service::Context {
        pods: &pods,
        namespaces: &namespaces,
        waypoints: &waypoints,
    };
    let mut services = service::services(objects, &context, settings, &mut problems);
    let mut workload_entries =
        workload_entry::workload_entries(&objects.workload_entries, settings, &mut problems);
    let from_service_entries = service_entry::service_entries(
        &objects.service_entries,
        &services,
        &namespaces,
        &waypoints,
        settings,
        &mut problems,
    );
    services.extend(from_service_entries.services);
    workload_entries.extend(from_service_entries.endpoints);
    let peer_authentications =
        peer_authentication::peer_authentications(&objects.peer_authentications, &mut problems);
    let reserved: HashSet<(String, String)> =
        converted_policies(&peer_authentications, &settings.root_namespace)
            .into_iter()
            .map(|policy| (policy.namespace, policy.name))
            .collect();
    let policies = policies(objects, settings, &reserved, &mut problems);
    Conversion {
        mesh: MeshFile {
            pods,
            services,
            policies,
            network_gateways: network::network_gateways(&objects.gateways),
            peer_authentications,
            root_namespace: Some(settings.root_namespace.clone()),
            workload_entries,
        },
        problems,
    }
}

/// The workloads the mesh file's ServiceEntries and WorkloadEntries make,
/// converted as the API's are with istiod's default settings, the
/// ServiceEntries' hosts added to `services` (the file's own, which keep
/// their hostnames). The file has no status to write, so addresses are
/// allocated in memory on each load (`allocation.rs`); an address written
/// in a ServiceEntry's `status` pins it. Any problem refuses the file:
/// it is the operator's to correct.
pub fn file_entries(
    service_entries: Vec<ServiceEntry>,
    workload_entries: Vec<WorkloadEntry>,
    visibility: Option<export_to::ServiceEntryVisibility>,
    services: &mut Vec<crate::Service>,
) -> Result<Vec<crate::WorkloadEntry>, ObjectProblem> {
    if service_entries.is_empty() && workload_entries.is_empty() {
        return Ok(Vec::new());
    }
    let settings = ConvertSettings {
        service_entry_visibility: visibility,
        ..ConvertSettings::default()
    };
    let mut problems = Vec::new();
    let workload_entries: Vec<Arc<WorkloadEntry>> =
        workload_entries.into_iter().map(Arc::new).collect();
    let mut converted =
        workload_entry::workload_entries(&workload_entries, &settings, &mut problems);
    let service_entries: Vec<Arc<ServiceEntry>> =
        service_entries.into_iter().map(Arc::new).collect();
    let namespaces = HashMap::new();
    let waypoints = Waypoints::new(&[], &[], &namespaces, &settings.network);
    let from_service_entries = service_entry::service_entries(
        &allocation::with_allocations(&service_entries),
        services,
        &namespaces,
        &waypoints,
        &settings,
        &mut problems,
    );
    if let Some(problem) = problems.into_iter().next() {
        return Err(problem);
    }
    services.extend(from_service_entries.services);
    converted.extend(from_service_entries.endpoints);
    Ok(converted)
}

/// Every pod that converts, in namespace/name order, with the checks the
/// snapshot makes across pods.
fn pods(
    objects: &KubeObjects,
    localities: &HashMap<&str, Locality>,
    waypoints: &Waypoints<'_>,
    settings: &ConvertSettings,
    problems: &mut Vec<ObjectProblem>,
) -> Vec<Pod> {
    let mut converted = Vec::with_capacity(objects.pods.len());
    let mut claims = PodClaims::default();
    for object in sorted(&objects.pods, |pod| &pod.metadata) {
        let report = |reason| problem("Pod", &object.metadata, reason);
        let mut outcome = pod::pod(object, localities, settings);
        if let Some(pod) = &mut outcome.entry {
            let bound = waypoints.for_pod(&object.metadata, &pod.namespace, &mut outcome.problems);
            pod.waypoint = bound.waypoint;
            pod.application_tunnel = bound.application_tunnel;
        }
        problems.extend(outcome.problems.into_iter().map(report));
        let Some(mut pod) = outcome.entry else {
            continue;
        };
        match claims.admit(&mut pod) {
            Ok(None) => converted.push(pod),
            Ok(Some(trimmed)) => {
                problems.push(report(trimmed));
                converted.push(pod);
            }
            Err(dropped) => problems.push(report(dropped)),
        }
    }
    converted
}

/// What the pods kept so far hold, each with the `namespace/name` of the
/// pod holding it: names, uids, and the addresses of live pods.
#[derive(Default)]
struct PodClaims {
    names: HashSet<String>,
    uids: HashMap<String, String>,
    addresses: HashMap<(String, IpAddr), String>,
}

impl PodClaims {
    /// Admits a pod whose name and uid are free (else the error says why
    /// it is left out). A live pod with an address another holds is
    /// admitted without its addresses, and the reason returned.
    fn admit(&mut self, pod: &mut Pod) -> Result<Option<ProblemReason>, ProblemReason> {
        let item = format!("{}/{}", pod.namespace, pod.name);
        if self.names.contains(&item) {
            return Err(ProblemReason::Duplicate);
        }
        if let Some(other) = self.uids.get(&pod.uid) {
            return Err(ProblemReason::DuplicateUid {
                uid: pod.uid.clone(),
                other: other.clone(),
            });
        }
        self.names.insert(item.clone());
        self.uids.insert(pod.uid.clone(), item.clone());
        // Pods on their node's network share its address by design.
        if !pod.is_live() || pod.host_network {
            return Ok(None);
        }
        let key = |ip: &IpAddr| (pod.network.clone(), ip.to_canonical());
        let taken = pod.ips.iter().find_map(|ip| {
            let other = self.addresses.get(&key(ip))?;
            Some(ProblemReason::AddressInUse {
                address: *ip,
                other: other.clone(),
            })
        });
        if taken.is_none() {
            for ip in &pod.ips {
                self.addresses.insert(key(ip), item.clone());
            }
        } else {
            pod.ips.clear();
        }
        Ok(taken)
    }
}

/// Every policy that converts and is sent, in namespace/name order; none
/// may take a name in `reserved` (the policies the PeerAuthentications
/// make, whose `_` the API server refuses in a name anyway).
fn policies(
    objects: &KubeObjects,
    settings: &ConvertSettings,
    reserved: &HashSet<(String, String)>,
    problems: &mut Vec<ObjectProblem>,
) -> Vec<Policy> {
    let mut converted = Vec::new();
    let mut names = reserved.clone();
    for object in sorted(&objects.authorization_policies, |policy| &policy.metadata) {
        let report = |reason| problem("AuthorizationPolicy", &object.metadata, reason);
        let outcome = policy::policy(object, settings);
        problems.extend(outcome.problems.into_iter().map(report));
        let Some(policy) = outcome.entry else {
            continue;
        };
        if !names.insert((policy.namespace.clone(), policy.name.clone())) {
            problems.push(report(ProblemReason::Duplicate));
            continue;
        }
        converted.push(policy);
    }
    converted
}

/// What one object becomes: its model entry, if any, and the problems met.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Outcome<T> {
    /// `None` when the object is left out.
    entry: Option<T>,
    /// Why it is left out or trimmed.
    problems: Vec<ProblemReason>,
}

impl<T> Outcome<T> {
    /// The object is left out, for this reason.
    fn left_out(reason: ProblemReason) -> Self {
        Outcome {
            entry: None,
            problems: vec![reason],
        }
    }
}

/// The objects in namespace/name order.
fn sorted<T>(objects: &[Arc<T>], metadata: impl Fn(&T) -> &ObjectMeta) -> Vec<&T> {
    let mut sorted: Vec<&T> = objects.iter().map(Arc::as_ref).collect();
    sorted.sort_by(|a, b| {
        let (a, b) = (metadata(a), metadata(b));
        (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name))
    });
    sorted
}

fn problem(kind: &'static str, metadata: &ObjectMeta, reason: ProblemReason) -> ObjectProblem {
    ObjectProblem {
        kind,
        namespace: metadata.namespace.clone().unwrap_or_default(),
        name: metadata.name.clone().unwrap_or_default(),
        reason,
    }
}

/// `metadata.name` and `metadata.namespace`, both non-empty.
fn name_and_namespace(metadata: &ObjectMeta) -> Result<(String, String), ProblemReason> {
    let present = |value: &Option<String>, field| match value.as_deref() {
        Some(value) if !value.is_empty() => Ok(value.to_owned()),
        _ => Err(ProblemReason::MissingField { field }),
    };
    Ok((
        present(&metadata.name, "metadata.name")?,
        present(&metadata.namespace, "metadata.namespace")?,
    ))
}

/// An object's labels (none when absent).
fn labels(metadata: &ObjectMeta) -> Labels {
    metadata.labels.clone().unwrap_or_default()
}

/// The object's label or annotation `key`.
fn value<'a>(map: &'a Option<BTreeMap<String, String>>, key: &str) -> Option<&'a str> {
    map.as_ref()?.get(key).map(String::as_str)
}

#[cfg(test)]
mod tests;
