//! Mesh snapshot → xDS resources, as pure functions (WIRE.md §8, §9):
//!
//! - each Running or Pending pod with an IP → `Address{workload}` named by
//!   its workload uid (else its uid), listing the services it serves (with
//!   named target ports resolved against its container ports) and the
//!   `WorkloadSelector` policies that pick it, then the policies its
//!   PeerAuthentications make it list;
//! - each workload entry (a WorkloadEntry, a ServiceEntry's endpoint) →
//!   `Address{workload}` named by its uid, with its address or hostname,
//!   capacity, the services that select or name it, and its policies as a
//!   pod's;
//! - each service → `Address{service}` named `<namespace>/<hostname>`;
//! - each policy, and each policy the PeerAuthentications make →
//!   `Authorization` named `<namespace>/<name>`.
//!
//! Also the canonical encoding of an `Address`: `Workload.services` is a
//! map, which prost encodes in hash order; resources are versioned by the
//! hash of their bytes, so the map is encoded here in key order instead.
//! Versions and sharing are `cache.rs`'s; which pods make workloads and
//! what selectors pick is `resources/index.rs`'s.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use prost::Message;
use ztunnel_proto::istio::security::{
    self as proto_security, Authorization, string_match::MatchType,
};
use ztunnel_proto::istio::workload::{
    self as proto_workload, Address, NetworkAddress as ProtoNetworkAddress, Port, PortList,
    Service as ProtoService, TunnelProtocol, Workload, WorkloadStatus, WorkloadType, address,
};

use ztunnel_mesh::{
    AppProtocol, Cidr, EntryAddress, HealthPolicy, IpFamilies, Labels, LoadBalancing,
    LoadBalancingMode, Locality, LocalityScope, MeshSnapshot, Pod, Policy, PolicyAction,
    PolicyMatch, PolicyScope, Service, ServiceAccountMatch, ServicePort, ServiceVisibility,
    StringMatch, TargetPort, WorkloadEntry, WorkloadProtocol, WorkloadType as MeshWorkloadType,
};

use gateway::{application_tunnel, gateway_address, network_gateway_workload};

use index::PodIndex;

mod gateway;
mod index;

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

/// Every `Address` resource of a snapshot (pods' workloads, then workload
/// entries', then network gateways', then services), with its resource
/// name. `trust_domain` is the CA's: the identities it issues.
pub fn addresses(snapshot: &MeshSnapshot, trust_domain: &str) -> Vec<(String, Address)> {
    let index = PodIndex::new(snapshot);
    let mut services_of: HashMap<usize, BTreeMap<String, PortList>> = HashMap::new();
    for service in snapshot.services() {
        let key = service.resource_name();
        for (at, pod) in index.endpoints(service) {
            services_of
                .entry(at)
                .or_default()
                .insert(key.clone(), endpoint_ports(service, &pod.container_ports));
        }
    }
    let mut policies_of: HashMap<usize, Vec<String>> = HashMap::new();
    for policy in snapshot.policies() {
        if let (PolicyScope::WorkloadSelector, Some(selector)) = (policy.scope, &policy.selector) {
            let namespace = (!policy.all_namespaces).then_some(policy.namespace.as_str());
            for (pod, _) in index.selected(namespace, selector) {
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
        // After the sorted selector policies, as istiod lists them.
        policies.extend(snapshot.peer_authentication_policies_of(pod));
        let services = services_of.remove(&at).unwrap_or_default();
        let mut workload = workload(pod, trust_domain, services, policies);
        workload.network_gateway = snapshot
            .network_gateway(&pod.network)
            .map(|gateway| gateway_address(&gateway.destination, gateway.hbone_mtls_port));
        resources.push((
            pod.resource_name().to_owned(),
            Address {
                r#type: Some(address::Type::Workload(workload)),
            },
        ));
    }
    resources.extend(entry_workloads(snapshot, trust_domain));
    for gateway in snapshot.network_gateways() {
        let workload = network_gateway_workload(gateway, trust_domain);
        resources.push((
            workload.uid.clone(),
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

/// The `Address` resources of the snapshot's workload entries: what
/// istiod sends for WorkloadEntries and ServiceEntries' endpoints.
fn entry_workloads(snapshot: &MeshSnapshot, trust_domain: &str) -> Vec<(String, Address)> {
    let entries = snapshot.workload_entries();
    let mut services_of: Vec<BTreeMap<String, PortList>> = vec![BTreeMap::new(); entries.len()];
    let by_uid: HashMap<&str, usize> = entries
        .iter()
        .enumerate()
        .map(|(at, entry)| (entry.uid.as_str(), at))
        .collect();
    for service in snapshot.services() {
        let members: Vec<usize> = match (&service.selector, &service.endpoints) {
            (Some(selector), _) => entries
                .iter()
                .enumerate()
                .filter(|(_, entry)| {
                    entry.namespace == service.namespace && entry.is_selected_by(selector)
                })
                .map(|(at, _)| at)
                .collect(),
            (None, Some(uids)) => uids
                .iter()
                .filter_map(|uid| by_uid.get(uid.as_str()).copied())
                .collect(),
            (None, None) => Vec::new(),
        };
        for at in members {
            if let (Some(services), Some(entry)) = (services_of.get_mut(at), entries.get(at)) {
                services.insert(
                    service.resource_name(),
                    endpoint_ports(service, &entry.ports),
                );
            }
        }
    }
    entries
        .iter()
        .zip(services_of)
        .map(|(entry, services)| {
            let mut policies: Vec<String> = snapshot
                .policies()
                .iter()
                .filter(|policy| {
                    policy.scope == PolicyScope::WorkloadSelector
                        && (policy.all_namespaces || policy.namespace == entry.namespace)
                        && policy
                            .selector
                            .as_ref()
                            .is_some_and(|selector| selects(selector, &entry.labels))
                })
                .map(Policy::resource_name)
                .collect();
            policies.sort_unstable();
            policies
                .extend(snapshot.peer_authentication_policies_for(&entry.namespace, &entry.labels));
            let mut workload = entry_workload(entry, trust_domain, services, policies);
            workload.network_gateway = snapshot
                .network_gateway(&entry.network)
                .map(|gateway| gateway_address(&gateway.destination, gateway.hbone_mtls_port));
            (
                entry.uid.clone(),
                Address {
                    r#type: Some(address::Type::Workload(workload)),
                },
            )
        })
        .collect()
}

fn selects(selector: &Labels, labels: &Labels) -> bool {
    selector
        .iter()
        .all(|(key, value)| labels.get(key) == Some(value))
}

/// A workload entry as istiod sends it: always healthy, of type POD, its
/// canonical name from its labels else its workload name.
fn entry_workload(
    entry: &WorkloadEntry,
    trust_domain: &str,
    services: BTreeMap<String, PortList>,
    authorization_policies: Vec<String>,
) -> Workload {
    let (addresses, hostname) = match &entry.address {
        EntryAddress::Ip(ip) => (vec![ip_bytes(*ip)], String::new()),
        EntryAddress::Hostname(hostname) => (Vec::new(), hostname.clone()),
        EntryAddress::None => (Vec::new(), String::new()),
    };
    Workload {
        uid: entry.uid.clone(),
        name: entry.name.clone(),
        namespace: entry.namespace.clone(),
        addresses,
        hostname,
        network: entry.network.clone(),
        tunnel_protocol: match entry.protocol {
            WorkloadProtocol::Hbone => TunnelProtocol::Hbone,
            WorkloadProtocol::Tcp => TunnelProtocol::None,
        } as i32,
        trust_domain: entry
            .trust_domain
            .clone()
            .unwrap_or_else(|| trust_domain.to_owned()),
        service_account: entry.service_account.clone(),
        canonical_name: first_label(&entry.labels, &CANONICAL_NAME_LABELS)
            .unwrap_or(&entry.workload_name)
            .to_owned(),
        canonical_revision: first_label(&entry.labels, &CANONICAL_REVISION_LABELS)
            .unwrap_or(DEFAULT_REVISION)
            .to_owned(),
        workload_type: WorkloadType::Pod as i32,
        workload_name: entry.workload_name.clone(),
        native_tunnel: entry.native_tunnel,
        authorization_policies,
        status: WorkloadStatus::Healthy as i32,
        cluster_id: entry
            .cluster_id
            .clone()
            .unwrap_or_else(|| DEFAULT_CLUSTER_ID.to_owned()),
        services: services.into_iter().collect(),
        locality: entry.locality.as_ref().map(proto_locality),
        capacity: entry.weight,
        ..Workload::default()
    }
}

/// Where an endpoint with these named ports receives a ServiceEntry's
/// port of the same name.
fn named(port: &ServicePort, endpoint_ports: &BTreeMap<String, u16>) -> Option<u16> {
    endpoint_ports.get(port.name.as_deref()?).copied()
}

fn proto_locality(locality: &Locality) -> proto_workload::Locality {
    proto_workload::Locality {
        region: locality.region.clone(),
        zone: locality.zone.clone(),
        subzone: locality.subzone.clone(),
    }
}

/// Every `Authorization` resource of a snapshot, with its resource name.
pub fn authorizations(snapshot: &MeshSnapshot) -> Vec<(String, Authorization)> {
    snapshot
        .policies()
        .iter()
        .chain(snapshot.peer_authentication_policies())
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

fn workload(
    pod: &Pod,
    trust_domain: &str,
    services: BTreeMap<String, PortList>,
    authorization_policies: Vec<String>,
) -> Workload {
    let (derived_type, workload_name) = match &pod.workload_name {
        Some(name) => (WorkloadType::Deployment, name.clone()),
        None => (WorkloadType::Pod, pod.name.clone()),
    };
    let workload_type = pod.workload_type.map_or(derived_type, |kind| match kind {
        MeshWorkloadType::Deployment => WorkloadType::Deployment,
        MeshWorkloadType::CronJob => WorkloadType::Cronjob,
        MeshWorkloadType::Pod => WorkloadType::Pod,
        MeshWorkloadType::Job => WorkloadType::Job,
    });
    let canonical_name = first_label(&pod.labels, &CANONICAL_NAME_LABELS)
        .unwrap_or(&workload_name)
        .to_owned();
    let canonical_revision = first_label(&pod.labels, &CANONICAL_REVISION_LABELS)
        .unwrap_or(DEFAULT_REVISION)
        .to_owned();
    Workload {
        uid: pod.resource_name().to_owned(),
        name: pod.name.clone(),
        namespace: pod.namespace.clone(),
        addresses: pod.ips.iter().map(|ip| ip_bytes(*ip)).collect(),
        network: pod.network.clone(),
        tunnel_protocol: match pod.protocol {
            WorkloadProtocol::Hbone => TunnelProtocol::Hbone,
            WorkloadProtocol::Tcp => TunnelProtocol::None,
        } as i32,
        trust_domain: pod
            .trust_domain
            .clone()
            .unwrap_or_else(|| trust_domain.to_owned()),
        service_account: pod.service_account.clone(),
        node: pod.node_name.clone().unwrap_or_default(),
        canonical_name,
        canonical_revision,
        workload_type: workload_type as i32,
        workload_name,
        native_tunnel: pod.native_tunnel,
        authorization_policies,
        status: if pod.is_healthy() {
            WorkloadStatus::Healthy
        } else {
            WorkloadStatus::Unhealthy
        } as i32,
        cluster_id: pod
            .cluster_id
            .clone()
            .unwrap_or_else(|| DEFAULT_CLUSTER_ID.to_owned()),
        services: services.into_iter().collect(),
        locality: pod.locality.as_ref().map(proto_locality),
        network_mode: if pod.host_network {
            proto_workload::NetworkMode::HostNetwork
        } else {
            proto_workload::NetworkMode::Standard
        } as i32,
        waypoint: pod
            .waypoint
            .as_ref()
            .map(|waypoint| gateway_address(&waypoint.destination, waypoint.hbone_mtls_port)),
        application_tunnel: pod.application_tunnel.map(application_tunnel),
        ..Workload::default()
    }
}

fn first_label<'a>(labels: &'a Labels, keys: &[&str]) -> Option<&'a str> {
    keys.iter()
        .find_map(|key| labels.get(*key))
        .map(String::as_str)
}

/// The service's ports as one endpoint (a pod, or a workload entry)
/// receives them, given its named ports (a pod's container ports, an
/// entry's ports): a named target port becomes the endpoint's port of
/// that name, and one the endpoint lacks is left out for it; a
/// ServiceEntry's port named like one of the endpoint's is received there.
fn endpoint_ports(service: &Service, named_ports: &BTreeMap<String, u16>) -> PortList {
    let ports = service
        .ports
        .iter()
        .filter_map(|(service_port, port)| {
            let target_port = match &port.target {
                TargetPort::Number(number) => named(port, named_ports).unwrap_or(*number),
                TargetPort::Name(name) => *named_ports.get(name)?,
            };
            Some(Port {
                service_port: u32::from(*service_port),
                target_port: u32::from(target_port),
                ..Port::default()
            })
        })
        .collect();
    PortList { ports }
}

/// The service's own ports: a named target port is 0, as it differs by
/// endpoint.
fn service_ports(service: &Service) -> Vec<Port> {
    service
        .ports
        .iter()
        .map(|(service_port, port)| Port {
            service_port: u32::from(*service_port),
            target_port: match port.target {
                TargetPort::Number(number) => u32::from(number),
                TargetPort::Name(_) => 0,
            },
            app_protocol: app_protocol(port.app_protocol) as i32,
        })
        .collect()
}

fn app_protocol(protocol: AppProtocol) -> proto_workload::AppProtocol {
    match protocol {
        AppProtocol::Unknown => proto_workload::AppProtocol::Unknown,
        AppProtocol::Http11 => proto_workload::AppProtocol::Http11,
        AppProtocol::Http2 => proto_workload::AppProtocol::Http2,
        AppProtocol::Grpc => proto_workload::AppProtocol::Grpc,
        AppProtocol::Tcp => proto_workload::AppProtocol::Tcp,
        AppProtocol::Tls => proto_workload::AppProtocol::Tls,
    }
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
        ports: service_ports(service),
        load_balancing: service.load_balancing.as_ref().map(load_balancing),
        ip_families: match service.ip_families {
            IpFamilies::Automatic => proto_workload::IpFamilies::Automatic,
            IpFamilies::IPv4Only => proto_workload::IpFamilies::Ipv4Only,
            IpFamilies::IPv6Only => proto_workload::IpFamilies::Ipv6Only,
            IpFamilies::Dual => proto_workload::IpFamilies::Dual,
        } as i32,
        canonical: service.canonical,
        waypoint: service
            .waypoint
            .as_ref()
            .map(|waypoint| gateway_address(&waypoint.destination, waypoint.hbone_mtls_port)),
        weighted_waypoints: service
            .weighted_waypoints
            .iter()
            .map(|weighted| proto_workload::WeightedWaypoint {
                destination: Some(gateway_address(
                    &weighted.waypoint.destination,
                    weighted.waypoint.hbone_mtls_port,
                )),
                weight: weighted.weight,
            })
            .collect(),
        ingress_use_waypoint: service.ingress_use_waypoint,
        subject_alt_names: service.subject_alt_names.clone(),
        visibility: match service.visibility {
            ServiceVisibility::Public => proto_workload::service::Visibility::Public,
            ServiceVisibility::Namespace => proto_workload::service::Visibility::Namespace,
        } as i32,
        ..ProtoService::default()
    }
}

fn load_balancing(balancing: &LoadBalancing) -> proto_workload::LoadBalancing {
    use proto_workload::load_balancing::{HealthPolicy as Health, Mode};
    proto_workload::LoadBalancing {
        routing_preference: balancing
            .routing_preference
            .iter()
            .map(|scope| scope_of(*scope) as i32)
            .collect(),
        mode: match balancing.mode {
            LoadBalancingMode::Unspecified => Mode::UnspecifiedMode,
            LoadBalancingMode::Strict => Mode::Strict,
            LoadBalancingMode::Failover => Mode::Failover,
            LoadBalancingMode::Passthrough => Mode::Passthrough,
        } as i32,
        health_policy: match balancing.health_policy {
            HealthPolicy::OnlyHealthy => Health::OnlyHealthy,
            HealthPolicy::AllowAll => Health::AllowAll,
        } as i32,
    }
}

fn scope_of(scope: LocalityScope) -> proto_workload::load_balancing::Scope {
    use proto_workload::load_balancing::Scope;
    match scope {
        LocalityScope::Region => Scope::Region,
        LocalityScope::Zone => Scope::Zone,
        LocalityScope::Subzone => Scope::Subzone,
        LocalityScope::Node => Scope::Node,
        LocalityScope::Cluster => Scope::Cluster,
        LocalityScope::Network => Scope::Network,
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
pub(super) fn ip_bytes(ip: IpAddr) -> Vec<u8> {
    match ip.to_canonical() {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    }
}

#[cfg(test)]
mod tests;
