//! The mesh file as a whole ([`MeshFile`]: `{pods, services, policies,
//! peerAuthentications, serviceEntries, workloadEntries, ...}`, or a bare
//! list of pods) and the immutable, validated, indexed
//! [`MeshSnapshot`] one load of it becomes. The CA's authorizer and the xDS
//! server read the same snapshot, so both see a pod on the same node.
//!
//! Checks across entries live here: duplicates, references, and the pairs
//! of keys that must or must not go together.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::net::IpAddr;

use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};
use serde::de::{self, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use ztunnel_certs::error_chain::ErrorChain;
use ztunnel_certs::identity::Identity;

use super::kube::convert::export_to::ServiceEntryVisibility;
use super::kube::convert::file_entries;
use super::kube::service_entry_crd::ServiceEntry as KubeServiceEntry;
use super::kube::workload_entry_crd::WorkloadEntry as KubeWorkloadEntry;
use super::peer_authentication::{PeerAuthentication, converted_policies, workload_policies};
use super::pod::{Labels, Pod};
use super::policy::{Policy, PolicyScope};
use super::service::{Service, TargetPort};
use super::waypoint::{GatewayAddress, GatewayDestination, NetworkGateway};
use super::workload_entry::WorkloadEntry;

/// The file's content, parsed but not yet checked as a whole.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MeshFile {
    /// Every pod, whichever its phase.
    pub pods: Vec<Pod>,
    /// Services over those pods.
    pub services: Vec<Service>,
    /// Authorization policies.
    pub policies: Vec<Policy>,
    /// Gateways into the networks of pods on other networks than a
    /// client's.
    pub network_gateways: Vec<NetworkGateway>,
    /// PeerAuthentications, oldest first: at each level the oldest applies.
    pub peer_authentications: Vec<PeerAuthentication>,
    /// The namespace whose PeerAuthentication without a selector applies
    /// to the mesh, and where the static STRICT policy lives; absent,
    /// [`DEFAULT_ROOT_NAMESPACE`].
    pub root_namespace: Option<String>,
    /// Workloads that are no pods: WorkloadEntries and the endpoints of
    /// ServiceEntries (whose hosts are among `services`).
    pub workload_entries: Vec<WorkloadEntry>,
}

/// Istio's default root namespace (mesh config `rootNamespace`).
pub const DEFAULT_ROOT_NAMESPACE: &str = "istio-system";

/// The map form of the file.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MeshFileMap {
    #[serde(default)]
    pods: Vec<Pod>,
    #[serde(default)]
    services: Vec<Service>,
    #[serde(default)]
    policies: Vec<Policy>,
    #[serde(default, rename = "networkGateways")]
    network_gateways: Vec<NetworkGateway>,
    #[serde(default, rename = "peerAuthentications")]
    peer_authentications: Vec<PeerAuthentication>,
    #[serde(default, rename = "rootNamespace")]
    root_namespace: Option<String>,
    /// Istio's objects as Kubernetes holds them (`metadata`, `spec`, and
    /// for a ServiceEntry `status`), converted as the API's are.
    #[serde(default, rename = "serviceEntries")]
    service_entries: Vec<KubeServiceEntry>,
    #[serde(default, rename = "workloadEntries")]
    workload_entries: Vec<KubeWorkloadEntry>,
    /// The mesh config's `serviceEntryVisibility`, for the ServiceEntries
    /// above (the file has no namespaces: their labels are none).
    #[serde(default, rename = "serviceEntryVisibility")]
    service_entry_visibility: Option<ServiceEntryVisibility>,
}

impl<'de> Deserialize<'de> for MeshFile {
    /// A map `{pods, services, policies}`, or a list (the pods-only form
    /// the registry started with). Entries are read by the YAML
    /// deserializer itself, so their errors keep their line.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(MeshFileVisitor)
    }
}

struct MeshFileVisitor;

impl<'de> Visitor<'de> for MeshFileVisitor {
    type Value = MeshFile;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "a map {pods, services, policies, networkGateways, peerAuthentications, \
             rootNamespace, serviceEntries, workloadEntries, serviceEntryVisibility} \
             or a list of pods",
        )
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        let pods = Vec::<Pod>::deserialize(SeqAccessDeserializer::new(seq))?;
        Ok(MeshFile {
            pods,
            ..MeshFile::default()
        })
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        let form = MeshFileMap::deserialize(MapAccessDeserializer::new(map))?;
        let mut services = form.services;
        let workload_entries = file_entries(
            form.service_entries,
            form.workload_entries,
            form.service_entry_visibility,
            &mut services,
        )
        .map_err(|problem| de::Error::custom(format_args!("{problem}")))?;
        Ok(MeshFile {
            pods: form.pods,
            services,
            workload_entries,
            policies: form.policies,
            network_gateways: form.network_gateways,
            peer_authentications: form.peer_authentications,
            root_namespace: form.root_namespace,
        })
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(MeshFile::default())
    }
}

/// An immutable, checked view of the mesh file, indexed for the authorizer
/// and for xDS.
#[derive(Debug, Default)]
pub struct MeshSnapshot {
    /// Every pod, in file order.
    pods: Vec<Pod>,
    /// Index into `pods` by (namespace, name).
    by_name: HashMap<(String, String), usize>,
    /// Index into `pods` by uid.
    by_uid: HashMap<String, usize>,
    /// (node, namespace, service account) of every live pod
    /// ([`Pod::is_live`]): the identities each node may be issued.
    live_on_node: HashMap<(String, String, String), usize>,
    /// Services, in file order.
    services: Vec<Service>,
    /// Policies, in file order.
    policies: Vec<Policy>,
    /// Network gateways, in file order.
    network_gateways: Vec<NetworkGateway>,
    /// PeerAuthentications, oldest first.
    peer_authentications: Vec<PeerAuthentication>,
    /// The root namespace the PeerAuthentications are read under.
    root_namespace: String,
    /// The policies the PeerAuthentications make, kept beside them: every
    /// xDS push sends them.
    peer_authentication_policies: Vec<Policy>,
    /// Workloads that are no pods, in file order.
    workload_entries: Vec<WorkloadEntry>,
}

impl MeshSnapshot {
    /// Checks and indexes a file's content.
    pub fn new(mut file: MeshFile) -> Result<Self, MeshError> {
        resolve_waypoints(&mut file)?;
        let mut snapshot = MeshSnapshot::default();
        snapshot.add_pods(file.pods)?;
        let entry_uids = snapshot.check_workload_entries(&file.workload_entries)?;
        snapshot.check_services(&file.services, &entry_uids)?;
        check_policies(&file.policies)?;
        let root_namespace = file
            .root_namespace
            .unwrap_or_else(|| DEFAULT_ROOT_NAMESPACE.to_owned());
        non_empty(&root_namespace, "rootNamespace", || "the file".to_owned())?;
        let converted = converted_policies(&file.peer_authentications, &root_namespace);
        check_peer_authentications(&file.peer_authentications, &file.policies, &converted)?;
        snapshot.services = file.services;
        snapshot.policies = file.policies;
        snapshot.network_gateways = file.network_gateways;
        snapshot.peer_authentications = file.peer_authentications;
        snapshot.root_namespace = root_namespace;
        snapshot.peer_authentication_policies = converted;
        snapshot.workload_entries = file.workload_entries;
        Ok(snapshot)
    }

    /// A snapshot of pods only.
    pub fn from_pods(pods: Vec<Pod>) -> Result<Self, MeshError> {
        Self::new(MeshFile {
            pods,
            ..MeshFile::default()
        })
    }

    /// The pod `namespace/name`, if it exists.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<&Pod> {
        let index = self.by_name.get(&(namespace.to_owned(), name.to_owned()))?;
        self.pods.get(*index)
    }

    /// The pod with this uid, if it exists.
    pub fn pod_by_uid(&self, uid: &str) -> Option<&Pod> {
        self.pods.get(*self.by_uid.get(uid)?)
    }

    /// Every pod, in file order.
    pub fn pods(&self) -> &[Pod] {
        &self.pods
    }

    /// Every service, in file order.
    pub fn services(&self) -> &[Service] {
        &self.services
    }

    /// Every workload that is no pod, in file order.
    pub fn workload_entries(&self) -> &[WorkloadEntry] {
        &self.workload_entries
    }

    /// Every policy, in file order.
    pub fn policies(&self) -> &[Policy] {
        &self.policies
    }

    /// Every network gateway, in file order.
    pub fn network_gateways(&self) -> &[NetworkGateway] {
        &self.network_gateways
    }

    /// Every PeerAuthentication, oldest first.
    pub fn peer_authentications(&self) -> &[PeerAuthentication] {
        &self.peer_authentications
    }

    /// The root namespace: its PeerAuthentication without a selector
    /// applies to the mesh.
    pub fn root_namespace(&self) -> &str {
        &self.root_namespace
    }

    /// The policies istiod makes of the PeerAuthentications for ztunnel,
    /// sent beside [`policies`](Self::policies).
    pub fn peer_authentication_policies(&self) -> &[Policy] {
        &self.peer_authentication_policies
    }

    /// The names (`<namespace>/<name>`, sorted) of the policies of
    /// [`peer_authentication_policies`](Self::peer_authentication_policies)
    /// a pod lists: they apply only to the workloads that name them.
    pub fn peer_authentication_policies_of(&self, pod: &Pod) -> Vec<String> {
        self.peer_authentication_policies_for(&pod.namespace, &pod.labels)
    }

    /// As [`peer_authentication_policies_of`](Self::peer_authentication_policies_of),
    /// for any workload of `namespace` with these labels (a WorkloadEntry).
    pub fn peer_authentication_policies_for(
        &self,
        namespace: &str,
        labels: &Labels,
    ) -> Vec<String> {
        workload_policies(
            &self.peer_authentications,
            &self.root_namespace,
            namespace,
            labels,
        )
    }

    /// The gateway of `network` that workloads of that network are reached
    /// through from others: the first one with a known HBONE port.
    pub fn network_gateway(&self, network: &str) -> Option<&NetworkGateway> {
        self.network_gateways
            .iter()
            .find(|gateway| gateway.network == network && gateway.hbone_mtls_port != 0)
    }

    /// Whether some live pod ([`Pod::is_live`]: pending or running) with
    /// this namespace and service account is on `node`.
    pub fn has_live_pod(&self, node: &str, namespace: &str, service_account: &str) -> bool {
        let key = (
            node.to_owned(),
            namespace.to_owned(),
            service_account.to_owned(),
        );
        self.live_on_node.get(&key).is_some_and(|count| *count > 0)
    }

    /// How many pods there are.
    pub fn len(&self) -> usize {
        self.pods.len()
    }

    /// Whether there are no pods.
    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }

    fn add_pods(&mut self, pods: Vec<Pod>) -> Result<(), MeshError> {
        // (network, IP) → pod, over the pods that make workloads: two of
        // them on one address would make the address ambiguous. Pods on
        // their node's network share its address and are never looked up
        // by it.
        let mut addresses: HashMap<(&str, IpAddr), String> = HashMap::new();
        // Workload resource names: a pod's `workloadUid`, or its uid.
        let mut resource_names: HashSet<&str> = HashSet::new();
        for (index, pod) in pods.iter().enumerate() {
            let item = || format!("pod {}/{}", pod.namespace, pod.name);
            for (field, value) in [
                ("name", &pod.name),
                ("namespace", &pod.namespace),
                ("uid", &pod.uid),
                ("serviceAccount", &pod.service_account),
            ] {
                non_empty(value, field, item)?;
            }
            // Every pod becomes a workload with this identity: a proxy
            // rejects one whose parts make none.
            if let Err(error) = Identity::check_parts(&pod.namespace, &pod.service_account) {
                return Err(MeshError::Identity {
                    pod: item(),
                    reason: ErrorChain(&error).to_string(),
                });
            }
            if pod.uid.contains('/') {
                return Err(MeshError::SlashInUid {
                    uid: pod.uid.clone(),
                });
            }
            if let Some(workload_uid) = &pod.workload_uid {
                non_empty(workload_uid, "workloadUid", item)?;
            }
            let key = (pod.namespace.clone(), pod.name.clone());
            if self.by_name.insert(key, index).is_some() {
                return Err(MeshError::DuplicatePod {
                    namespace: pod.namespace.clone(),
                    name: pod.name.clone(),
                });
            }
            if self.by_uid.insert(pod.uid.clone(), index).is_some() {
                return Err(MeshError::DuplicateUid {
                    uid: pod.uid.clone(),
                });
            }
            if !resource_names.insert(pod.resource_name()) {
                return Err(MeshError::DuplicateUid {
                    uid: pod.resource_name().to_owned(),
                });
            }
            if pod.is_live() && !pod.host_network {
                for ip in &pod.ips {
                    let key = (pod.network.as_str(), ip.to_canonical());
                    if let Some(first) = addresses.insert(key, item()) {
                        return Err(MeshError::DuplicateIp {
                            address: *ip,
                            first,
                            second: item(),
                        });
                    }
                }
            }
            if pod.is_live()
                && let Some(node) = &pod.node_name
            {
                let key = (
                    node.clone(),
                    pod.namespace.clone(),
                    pod.service_account.clone(),
                );
                *self.live_on_node.entry(key).or_default() += 1;
            }
        }
        self.pods = pods;
        Ok(())
    }

    /// Workload entries against each other and against the pods (already
    /// added): their uids, which name their resources, are the workloads'
    /// own. Returns them.
    fn check_workload_entries<'a>(
        &self,
        entries: &'a [WorkloadEntry],
    ) -> Result<HashSet<&'a str>, MeshError> {
        let mut uids = HashSet::with_capacity(entries.len());
        let pod_names: HashSet<&str> = self.pods.iter().map(Pod::resource_name).collect();
        for entry in entries {
            let item = || format!("workload entry {}/{}", entry.namespace, entry.name);
            non_empty(&entry.name, "name", item)?;
            non_empty(&entry.namespace, "namespace", item)?;
            non_empty(&entry.uid, "uid", item)?;
            if pod_names.contains(entry.uid.as_str()) || !uids.insert(entry.uid.as_str()) {
                return Err(MeshError::DuplicateUid {
                    uid: entry.uid.clone(),
                });
            }
        }
        Ok(uids)
    }

    /// Services against each other and against the pods (already added)
    /// and workload entries (`entry_uids`).
    fn check_services(
        &self,
        services: &[Service],
        entry_uids: &HashSet<&str>,
    ) -> Result<(), MeshError> {
        let mut hostnames: HashMap<(&str, &str), &str> = HashMap::new();
        for service in services {
            let item = || format!("service {}/{}", service.namespace, service.name);
            non_empty(&service.name, "name", item)?;
            non_empty(&service.namespace, "namespace", item)?;
            non_empty(&service.hostname, "hostname", item)?;
            for san in &service.subject_alt_names {
                if let Err(error) = san.parse::<Identity>() {
                    return Err(MeshError::BadSubjectAltName {
                        service: item(),
                        san: san.clone(),
                        reason: ErrorChain(&error).to_string(),
                    });
                }
            }
            match hostnames.entry((&service.namespace, &service.hostname)) {
                Entry::Occupied(first) => {
                    return Err(MeshError::DuplicateHostname {
                        hostname: service.resource_name(),
                        first: (*first.get()).to_owned(),
                        second: service.name.clone(),
                    });
                }
                Entry::Vacant(slot) => {
                    slot.insert(&service.name);
                }
            }
            for (port, endpoint_port) in &service.ports {
                if *port == 0 || endpoint_port.target == TargetPort::Number(0) {
                    return Err(MeshError::ZeroPort { service: item() });
                }
                if let TargetPort::Name(name) = &endpoint_port.target {
                    non_empty(name, "targetPort", item)?;
                }
            }
            match (&service.selector, &service.endpoints) {
                (Some(_), Some(_)) => {
                    return Err(MeshError::SelectorAndEndpoints { service: item() });
                }
                (Some(selector), None) if selector.is_empty() => {
                    return Err(MeshError::EmptySelector { service: item() });
                }
                (_, Some(endpoints)) => {
                    let known = |uid: &String| {
                        self.by_uid.contains_key(uid) || entry_uids.contains(uid.as_str())
                    };
                    if let Some(uid) = endpoints.iter().find(|uid| !known(uid)) {
                        return Err(MeshError::UnknownEndpoint {
                            service: item(),
                            uid: uid.clone(),
                        });
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// Turns every waypoint that names a service of the file into that
/// service's hostname; an unknown name is an error.
fn resolve_waypoints(file: &mut MeshFile) -> Result<(), MeshError> {
    // A ServiceEntry's hosts share its name: a waypoint named so is
    // ambiguous, and refused.
    let mut hostnames: HashMap<(String, String), Option<String>> = HashMap::new();
    for service in &file.services {
        let key = (service.namespace.clone(), service.name.clone());
        hostnames
            .entry(key)
            .and_modify(|hostname| *hostname = None)
            .or_insert_with(|| Some(service.hostname.clone()));
    }
    let resolve = |waypoint: &mut GatewayAddress, referrer: &str, item: &dyn Fn() -> String| {
        let GatewayDestination::Service { namespace, name } = &waypoint.destination else {
            return Ok(());
        };
        let namespace = namespace.clone().unwrap_or_else(|| referrer.to_owned());
        let hostname = match hostnames.get(&(namespace.clone(), name.clone())) {
            Some(Some(hostname)) => hostname,
            Some(None) => {
                return Err(MeshError::DuplicateService {
                    service: format!("service {namespace}/{name}"),
                });
            }
            None => {
                return Err(MeshError::UnknownWaypoint {
                    item: item(),
                    service: format!("{namespace}/{name}"),
                });
            }
        };
        waypoint.destination = GatewayDestination::Hostname {
            hostname: hostname.clone(),
            namespace,
        };
        Ok(())
    };
    for pod in &mut file.pods {
        let item = || format!("pod {}/{}", pod.namespace, pod.name);
        if let Some(waypoint) = &mut pod.waypoint {
            resolve(waypoint, &pod.namespace, &item)?;
        }
    }
    for service in &mut file.services {
        let item = || format!("service {}/{}", service.namespace, service.name);
        let weighted = service
            .weighted_waypoints
            .iter_mut()
            .map(|w| &mut w.waypoint);
        for waypoint in service.waypoint.iter_mut().chain(weighted) {
            resolve(waypoint, &service.namespace, &item)?;
        }
    }
    for gateway in &file.network_gateways {
        if let GatewayDestination::Service { .. } = gateway.destination {
            return Err(MeshError::UnknownWaypoint {
                item: format!("network gateway {}", gateway.workload_uid()),
                service: gateway.destination.to_string(),
            });
        }
    }
    Ok(())
}

/// Policies against each other, and scope against selector.
fn check_policies(policies: &[Policy]) -> Result<(), MeshError> {
    let mut names = HashMap::new();
    for policy in policies {
        let item = || format!("policy {}/{}", policy.namespace, policy.name);
        non_empty(&policy.name, "name", item)?;
        non_empty(&policy.namespace, "namespace", item)?;
        if names
            .insert((&policy.namespace, &policy.name), ())
            .is_some()
        {
            return Err(MeshError::DuplicatePolicy { policy: item() });
        }
        match (policy.scope, &policy.selector) {
            (PolicyScope::WorkloadSelector, None) => {
                return Err(MeshError::MissingSelector { policy: item() });
            }
            (PolicyScope::Global | PolicyScope::Namespace, Some(_)) => {
                return Err(MeshError::UnexpectedSelector { policy: item() });
            }
            _ => {}
        }
        if policy.all_namespaces && policy.scope != PolicyScope::WorkloadSelector {
            return Err(MeshError::UnexpectedAllNamespaces { policy: item() });
        }
    }
    Ok(())
}

/// PeerAuthentications against each other, and the names of the policies
/// they make against the file's policies.
fn check_peer_authentications(
    peer_authentications: &[PeerAuthentication],
    policies: &[Policy],
    converted: &[Policy],
) -> Result<(), MeshError> {
    let mut names = HashSet::new();
    for peer_authentication in peer_authentications {
        let item = || {
            format!(
                "peer authentication {}/{}",
                peer_authentication.namespace, peer_authentication.name
            )
        };
        non_empty(&peer_authentication.name, "name", item)?;
        non_empty(&peer_authentication.namespace, "namespace", item)?;
        if !names.insert((&peer_authentication.namespace, &peer_authentication.name)) {
            return Err(MeshError::DuplicatePeerAuthentication {
                peer_authentication: item(),
            });
        }
    }
    let taken: HashSet<_> = policies
        .iter()
        .map(|policy| (&policy.namespace, &policy.name))
        .collect();
    if let Some(policy) = converted
        .iter()
        .find(|policy| taken.contains(&(&policy.namespace, &policy.name)))
    {
        return Err(MeshError::DuplicatePolicy {
            policy: format!("policy {}/{}", policy.namespace, policy.name),
        });
    }
    Ok(())
}

fn non_empty(
    value: &str,
    field: &'static str,
    item: impl FnOnce() -> String,
) -> Result<(), MeshError> {
    if value.is_empty() {
        return Err(MeshError::Empty {
            item: item(),
            field,
        });
    }
    Ok(())
}

/// Why a mesh file that parses is still refused: entries that contradict
/// each other or name what does not exist.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MeshError {
    /// A name, namespace, uid, hostname, service account, workload uid or
    /// target port name is empty.
    #[error("{item}: {field} is empty")]
    Empty {
        /// The entry.
        item: String,
        /// The empty key.
        field: &'static str,
    },
    /// Two pods share a namespace and name.
    #[error("pod {namespace}/{name} appears twice")]
    DuplicatePod {
        /// Namespace of the pod.
        namespace: String,
        /// Name of the pod.
        name: String,
    },
    /// Two pods share a uid, or a workload resource name (`workloadUid`,
    /// else uid).
    #[error("pod uid {uid} appears twice")]
    DuplicateUid {
        /// The uid.
        uid: String,
    },
    /// A pod's namespace and service account make no SPIFFE identity.
    #[error("{pod}: no valid identity: {reason}")]
    Identity {
        /// The pod.
        pod: String,
        /// Why.
        reason: String,
    },
    /// A uid with a `/`: it could collide with a service's resource name,
    /// `namespace/hostname`, among the same type's resources.
    #[error("pod uid {uid} contains '/'")]
    SlashInUid {
        /// The uid.
        uid: String,
    },
    /// Two Running or Pending pods, neither on its node's network, have the
    /// same IP on the same network.
    #[error("{first} and {second} both have IP {address}")]
    DuplicateIp {
        /// The address.
        address: IpAddr,
        /// The first pod with it.
        first: String,
        /// The second.
        second: String,
    },
    /// A service's subject alt name is no SPIFFE identity.
    #[error("{service}: subjectAltNames entry {san:?} is not a SPIFFE identity: {reason}")]
    BadSubjectAltName {
        /// The service.
        service: String,
        /// The entry.
        san: String,
        /// Why it does not parse.
        reason: String,
    },
    /// A waypoint names a service whose namespace and name several
    /// services share (a ServiceEntry's hosts).
    #[error("{service} names several services; a waypoint must name one")]
    DuplicateService {
        /// The service.
        service: String,
    },
    /// Two services of a namespace share a hostname: it names the resource.
    #[error("services {first} and {second} both have hostname {hostname}")]
    DuplicateHostname {
        /// `namespace/hostname`.
        hostname: String,
        /// Name of the first service.
        first: String,
        /// Name of the second.
        second: String,
    },
    /// A service or target port is 0.
    #[error("{service}: port 0")]
    ZeroPort {
        /// The service.
        service: String,
    },
    /// A service has both ways of naming its endpoints.
    #[error("{service}: selector and endpoints are both set; use one")]
    SelectorAndEndpoints {
        /// The service.
        service: String,
    },
    /// A service selector with no labels; a service without endpoints
    /// leaves both keys out or writes `endpoints: []`.
    #[error("{service}: selector is empty")]
    EmptySelector {
        /// The service.
        service: String,
    },
    /// A service endpoint names no pod.
    #[error("{service}: endpoint {uid} is not the uid of any pod")]
    UnknownEndpoint {
        /// The service.
        service: String,
        /// The unknown uid.
        uid: String,
    },
    /// A waypoint names a service the file does not have.
    #[error("{item}: waypoint {service} is not a service of the file")]
    UnknownWaypoint {
        /// The pod or service naming it.
        item: String,
        /// `namespace/name` of the service named.
        service: String,
    },
    /// Two policies share a namespace and name (a policy of the file may
    /// also meet one a PeerAuthentication makes).
    #[error("{policy} appears twice")]
    DuplicatePolicy {
        /// The policy.
        policy: String,
    },
    /// Two PeerAuthentications share a namespace and name.
    #[error("{peer_authentication} appears twice")]
    DuplicatePeerAuthentication {
        /// The PeerAuthentication.
        peer_authentication: String,
    },
    /// A `WorkloadSelector` policy without `selector`.
    #[error("{policy}: scope WorkloadSelector needs a selector")]
    MissingSelector {
        /// The policy.
        policy: String,
    },
    /// A `selector` on a `Global` or `Namespace` policy, where it would be
    /// silently ignored.
    #[error("{policy}: selector is only for scope WorkloadSelector")]
    UnexpectedSelector {
        /// The policy.
        policy: String,
    },
    /// `allNamespaces` on a `Global` or `Namespace` policy, where it would
    /// be silently ignored.
    #[error("{policy}: allNamespaces is only for scope WorkloadSelector")]
    UnexpectedAllNamespaces {
        /// The policy.
        policy: String,
    },
}
