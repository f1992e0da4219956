//! Mesh snapshot → xDS resources, as pure functions (WIRE.md §8, §9):
//!
//! - each Running or Pending pod with an IP → `Address{workload}` named by
//!   its uid, listing the services that select it and the
//!   `WorkloadSelector` policies that pick it;
//! - each service → `Address{service}` named `<namespace>/<hostname>`;
//! - each policy → `Authorization` named `<namespace>/<name>`.
//!
//! Also the canonical encoding of an `Address`: `Workload.services` is a
//! map, which prost encodes in hash order; resources are versioned by the
//! hash of their bytes, so the map is encoded here in key order instead.
//! Versions and sharing are `cache.rs`'s.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use prost::Message;
use ztunnel_proto::istio::security::{
    self as proto_security, Authorization, string_match::MatchType,
};
use ztunnel_proto::istio::workload::{
    Address, NetworkAddress as ProtoNetworkAddress, Port, PortList, Service as ProtoService,
    TunnelProtocol, Workload, WorkloadStatus, WorkloadType, address,
};

use ztunnel_mesh::{
    Cidr, Labels, MeshSnapshot, Pod, PodPhase, Policy, PolicyAction, PolicyMatch, PolicyScope,
    Service, ServiceAccountMatch, StringMatch, WorkloadProtocol,
};

/// The cluster of pods that name none (WIRE.md §8: empty means this too).
pub const DEFAULT_CLUSTER_ID: &str = "Kubernetes";

/// Labels the canonical service name is read from, first present wins.
const CANONICAL_NAME_LABELS: [&str; 3] = [
    "service.istio.io/canonical-name",
    "app.kubernetes.io/name",
    "app",
];

/// Labels the canonical revision is read from, first present wins.
const CANONICAL_REVISION_LABELS: [&str; 3] = [
    "service.istio.io/canonical-revision",
    "app.kubernetes.io/version",
    "version",
];

/// The revision of pods that carry none of the labels, as istiod says.
const DEFAULT_REVISION: &str = "latest";

/// Every `Address` resource of a snapshot (workloads, then services), with
/// its resource name. `trust_domain` is the CA's: the identities it issues.
pub fn addresses(snapshot: &MeshSnapshot, trust_domain: &str) -> Vec<(String, Address)> {
    let index = PodIndex::new(snapshot);
    let mut services_of: HashMap<usize, BTreeMap<String, PortList>> = HashMap::new();
    for service in snapshot.services() {
        let key = service.resource_name();
        let ports = port_list(service);
        for pod in index.endpoints(service) {
            services_of
                .entry(pod)
                .or_default()
                .insert(key.clone(), ports.clone());
        }
    }
    let mut policies_of: HashMap<usize, Vec<String>> = HashMap::new();
    for policy in snapshot.policies() {
        if let (PolicyScope::WorkloadSelector, Some(selector)) = (policy.scope, &policy.selector) {
            for (pod, _) in index.selected(&policy.namespace, selector) {
                policies_of
                    .entry(pod)
                    .or_default()
                    .push(policy.resource_name());
            }
        }
    }

    let mut resources = Vec::with_capacity(index.workloads.len() + snapshot.services().len());
    for &at in &index.workloads {
        let Some(pod) = snapshot.pods().get(at) else {
            continue;
        };
        let mut policies = policies_of.remove(&at).unwrap_or_default();
        policies.sort_unstable();
        let services = services_of.remove(&at).unwrap_or_default();
        let workload = workload(pod, trust_domain, services, policies);
        resources.push((
            pod.uid.clone(),
            Address {
                r#type: Some(address::Type::Workload(workload)),
            },
        ));
    }
    for service in snapshot.services() {
        resources.push((
            service.resource_name(),
            Address {
                r#type: Some(address::Type::Service(proto_service(service))),
            },
        ));
    }
    resources
}

/// Every `Authorization` resource of a snapshot, with its resource name.
pub fn authorizations(snapshot: &MeshSnapshot) -> Vec<(String, Authorization)> {
    snapshot
        .policies()
        .iter()
        .map(|policy| (policy.resource_name(), authorization(policy)))
        .collect()
}

/// The bytes of an `Address`, the same for the same content: a workload's
/// `services` map is encoded in key order. Protobuf lets a message's fields
/// come in any order, and a map entry is a repeated field, so appending the
/// sorted entries after the other fields decodes to the same message.
pub fn encode_address(mut resource: Address) -> Vec<u8> {
    let Some(address::Type::Workload(workload)) = &mut resource.r#type else {
        return resource.encode_to_vec();
    };
    let services: BTreeMap<String, PortList> =
        std::mem::take(&mut workload.services).into_iter().collect();
    let mut bytes = workload.encode_to_vec();
    // Encoding into a Vec cannot run out of room.
    let _ = WorkloadServices { services }.encode(&mut bytes);
    AddressWorkload { workload: bytes }.encode_to_vec()
}

/// `Workload.services` (field 22), encoded from an ordered map.
#[derive(Clone, PartialEq, Message)]
struct WorkloadServices {
    #[prost(btree_map = "string, message", tag = "22")]
    services: BTreeMap<String, PortList>,
}

/// `Address.workload` (field 1) as already encoded bytes: a bytes field and
/// a message field have the same wire form.
#[derive(Clone, PartialEq, Message)]
struct AddressWorkload {
    #[prost(bytes = "vec", tag = "1")]
    workload: Vec<u8>,
}

/// The pods that make workloads, indexed for selectors.
struct PodIndex<'a> {
    /// Every pod of the snapshot.
    pods: &'a [Pod],
    /// Positions in `pods` of those that make workloads, in file order.
    workloads: Vec<usize>,
    /// uid → workload position.
    by_uid: HashMap<&'a str, usize>,
    /// (namespace, label key, label value) → workload positions.
    by_label: HashMap<(&'a str, &'a str, &'a str), Vec<usize>>,
    /// namespace → workload positions.
    by_namespace: HashMap<&'a str, Vec<usize>>,
}

impl<'a> PodIndex<'a> {
    fn new(snapshot: &'a MeshSnapshot) -> Self {
        let mut index = PodIndex {
            pods: snapshot.pods(),
            workloads: Vec::new(),
            by_uid: HashMap::new(),
            by_label: HashMap::new(),
            by_namespace: HashMap::new(),
        };
        for (at, pod) in snapshot.pods().iter().enumerate() {
            if !makes_workload(pod) {
                continue;
            }
            index.workloads.push(at);
            index.by_uid.insert(pod.uid.as_str(), at);
            index
                .by_namespace
                .entry(pod.namespace.as_str())
                .or_default()
                .push(at);
            for (key, value) in &pod.labels {
                index
                    .by_label
                    .entry((pod.namespace.as_str(), key.as_str(), value.as_str()))
                    .or_default()
                    .push(at);
            }
        }
        index
    }

    /// Workloads in `namespace` that `selector` matches (all of the
    /// namespace for an empty selector). Only the pods carrying the
    /// selector's first label are compared.
    fn selected(&self, namespace: &str, selector: &Labels) -> Vec<(usize, &'a Pod)> {
        let candidates = match selector.iter().next() {
            None => self.by_namespace.get(namespace),
            Some((key, value)) => self
                .by_label
                .get(&(namespace, key.as_str(), value.as_str())),
        };
        let pods = self.pods;
        candidates
            .into_iter()
            .flatten()
            .filter_map(|at| Some((*at, pods.get(*at)?)))
            .filter(|(_, pod)| pod.is_selected_by(selector))
            .collect()
    }

    /// Workloads that are endpoints of `service`: Running pods of its
    /// namespace matching its selector, or the pods its endpoints name.
    fn endpoints(&self, service: &Service) -> Vec<usize> {
        match (&service.selector, &service.endpoints) {
            (Some(selector), _) => self
                .selected(&service.namespace, selector)
                .into_iter()
                .filter(|(_, pod)| pod.phase == PodPhase::Running)
                .map(|(at, _)| at)
                .collect(),
            (None, Some(uids)) => uids
                .iter()
                .filter_map(|uid| self.by_uid.get(uid.as_str()).copied())
                .collect(),
            (None, None) => Vec::new(),
        }
    }
}

/// Whether a pod is a workload: it runs or is about to, and has an address.
fn makes_workload(pod: &Pod) -> bool {
    pod.is_live() && !pod.ips.is_empty()
}

fn workload(
    pod: &Pod,
    trust_domain: &str,
    services: BTreeMap<String, PortList>,
    authorization_policies: Vec<String>,
) -> Workload {
    let (workload_type, workload_name) = match &pod.workload_name {
        Some(name) => (WorkloadType::Deployment, name.clone()),
        None => (WorkloadType::Pod, pod.name.clone()),
    };
    let canonical_name = first_label(&pod.labels, &CANONICAL_NAME_LABELS)
        .unwrap_or(&workload_name)
        .to_owned();
    let canonical_revision = first_label(&pod.labels, &CANONICAL_REVISION_LABELS)
        .unwrap_or(DEFAULT_REVISION)
        .to_owned();
    Workload {
        uid: pod.uid.clone(),
        name: pod.name.clone(),
        namespace: pod.namespace.clone(),
        addresses: pod.ips.iter().map(|ip| ip_bytes(*ip)).collect(),
        network: pod.network.clone(),
        tunnel_protocol: match pod.protocol {
            WorkloadProtocol::Hbone => TunnelProtocol::Hbone,
            WorkloadProtocol::Tcp => TunnelProtocol::None,
        } as i32,
        trust_domain: trust_domain.to_owned(),
        service_account: pod.service_account.clone(),
        node: pod.node_name.clone().unwrap_or_default(),
        canonical_name,
        canonical_revision,
        workload_type: workload_type as i32,
        workload_name,
        authorization_policies,
        // A Pending pod is not ready: peers may address it, but services
        // do not balance to it.
        status: match pod.phase {
            PodPhase::Running => WorkloadStatus::Healthy,
            _ => WorkloadStatus::Unhealthy,
        } as i32,
        cluster_id: pod
            .cluster_id
            .clone()
            .unwrap_or_else(|| DEFAULT_CLUSTER_ID.to_owned()),
        services: services.into_iter().collect(),
        ..Workload::default()
    }
}

fn first_label<'a>(labels: &'a Labels, keys: &[&str]) -> Option<&'a str> {
    keys.iter()
        .find_map(|key| labels.get(*key))
        .map(String::as_str)
}

fn port_list(service: &Service) -> PortList {
    PortList {
        ports: ports(service),
    }
}

fn ports(service: &Service) -> Vec<Port> {
    service
        .ports
        .iter()
        .map(|(service_port, target_port)| Port {
            service_port: u32::from(*service_port),
            target_port: u32::from(*target_port),
            ..Port::default()
        })
        .collect()
}

fn proto_service(service: &Service) -> ProtoService {
    ProtoService {
        name: service.name.clone(),
        namespace: service.namespace.clone(),
        hostname: service.hostname.clone(),
        addresses: service
            .vips
            .iter()
            .map(|vip| ProtoNetworkAddress {
                network: vip.network.clone(),
                address: ip_bytes(vip.address),
                length: None,
            })
            .collect(),
        ports: ports(service),
        ..ProtoService::default()
    }
}

fn authorization(policy: &Policy) -> Authorization {
    Authorization {
        name: policy.name.clone(),
        namespace: policy.namespace.clone(),
        scope: match policy.scope {
            PolicyScope::Global => proto_security::Scope::Global,
            PolicyScope::Namespace => proto_security::Scope::Namespace,
            PolicyScope::WorkloadSelector => proto_security::Scope::WorkloadSelector,
        } as i32,
        action: match policy.action {
            PolicyAction::Allow => proto_security::Action::Allow,
            PolicyAction::Deny => proto_security::Action::Deny,
        } as i32,
        dry_run: policy.dry_run,
        rules: policy
            .rules
            .iter()
            .map(|clauses| proto_security::Rule {
                clauses: clauses
                    .iter()
                    .map(|matches| proto_security::Clause {
                        matches: matches.iter().map(policy_match).collect(),
                    })
                    .collect(),
            })
            .collect(),
        ..Authorization::default()
    }
}

fn policy_match(form: &PolicyMatch) -> proto_security::Match {
    let strings = |list: &[StringMatch]| list.iter().map(string_match).collect();
    let cidrs = |list: &[Cidr]| list.iter().map(cidr).collect();
    let ports = |list: &[u16]| list.iter().copied().map(u32::from).collect();
    let accounts = |list: &[ServiceAccountMatch]| {
        list.iter()
            .map(|account| proto_security::ServiceAccountMatch {
                namespace: account.namespace.clone(),
                service_account: account.service_account.clone(),
            })
            .collect()
    };
    proto_security::Match {
        namespaces: strings(&form.namespaces),
        not_namespaces: strings(&form.not_namespaces),
        principals: strings(&form.principals),
        not_principals: strings(&form.not_principals),
        source_ips: cidrs(&form.source_ips),
        not_source_ips: cidrs(&form.not_source_ips),
        destination_ips: cidrs(&form.destination_ips),
        not_destination_ips: cidrs(&form.not_destination_ips),
        destination_ports: ports(&form.destination_ports),
        not_destination_ports: ports(&form.not_destination_ports),
        service_accounts: accounts(&form.service_accounts),
        not_service_accounts: accounts(&form.not_service_accounts),
        ..proto_security::Match::default()
    }
}

fn string_match(form: &StringMatch) -> proto_security::StringMatch {
    let match_type = match form {
        StringMatch::Exact(text) => MatchType::Exact(text.clone()),
        StringMatch::Prefix(text) => MatchType::Prefix(text.clone()),
        StringMatch::Suffix(text) => MatchType::Suffix(text.clone()),
        StringMatch::Presence => MatchType::Presence(()),
    };
    proto_security::StringMatch {
        match_type: Some(match_type),
    }
}

fn cidr(form: &Cidr) -> proto_security::Address {
    proto_security::Address {
        address: ip_bytes(form.address),
        length: u32::from(form.prefix_len),
    }
}

/// 4 bytes for IPv4 (IPv4-mapped IPv6 included), 16 for IPv6.
fn ip_bytes(ip: IpAddr) -> Vec<u8> {
    match ip.to_canonical() {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    }
}

#[cfg(test)]
mod tests;
