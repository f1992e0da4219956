//! Istio ServiceEntries → mesh [`Service`]s and the [`WorkloadEntry`]s of
//! their endpoints, as istiod's ambient index builds them
//! (`serviceEntriesInfo`, `serviceEntryWorkloadBuilder`):
//!
//! - one Service per host, named after the ServiceEntry, with its
//!   `spec.addresses` as VIPs, else (not for `resolution: NONE`, nor a
//!   wildcard host short of `DYNAMIC_DNS`) the addresses allocated to the
//!   host in its status (`allocation.rs` decides them); its ports with
//!   their target (the service port when unset) and name, and the protocol
//!   as the app protocol; `resolution: NONE` balances as PASSTHROUGH with
//!   every endpoint allowed, other resolutions by the traffic
//!   distribution of the ServiceEntry, else of its namespace;
//! - its members: the pods and WorkloadEntries of its namespace that
//!   `workloadSelector` picks, or its inline `endpoints`, each a workload
//!   `<cluster>/networking.istio.io/ServiceEntry/<ns>/<name>/<address>`
//!   serving every host; or, for a DNS resolution (`DNS`,
//!   `DNS_ROUND_ROBIN`, `DYNAMIC_DNS`) with neither, one workload per host
//!   whose hostname is the host, serving that host alone;
//! - per namespace a hostname belongs to a Kubernetes Service first, else
//!   to the oldest ServiceEntry; across namespaces the same one is
//!   canonical.
//!
//! `location` changes nothing here: istiod's ambient index does not read
//! it (MESH_INTERNAL and MESH_EXTERNAL entries reach ztunnel alike).
//! Workload-level waypoints of inline endpoints and CIDR addresses are not
//! converted (ztunnel's `NetworkAddress.length` has no place in the model
//! yet); both are reported.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use ztunnel_certs::identity::Identity;

use super::allocation::{allocated_addresses, host_takes_allocation, wants_allocation};
use super::export_to::{self, Visibility};
use super::pod::tunnel;
use super::service::{TRAFFIC_DISTRIBUTION, load_balancing};
use super::waypoint::Waypoints;
use super::workload_entry::endpoint_fields;
use super::{
    ConvertSettings, ObjectProblem, Outcome, ProblemReason, name_and_namespace, problem, value,
};
use crate::kube::service_entry_crd::{ServiceEntry as KubeServiceEntry, ServiceEntryPort};
use crate::{
    AppProtocol, EntryAddress, HealthPolicy, LoadBalancing, LoadBalancingMode, NetworkAddress,
    Service, ServicePort, ServiceVisibility, TargetPort, WorkloadEntry,
};

/// `spec.resolution`: how a ServiceEntry's endpoints are found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// The client's destination address is used as is.
    None,
    /// The endpoints' addresses are IPs.
    Static,
    /// The endpoints (or the hosts) are names resolved by DNS.
    Dns,
    /// As `Dns`, one address at a time.
    DnsRoundRobin,
    /// Resolved by a waypoint per request; the hosts may be wildcards.
    DynamicDns,
}

impl Resolution {
    /// The resolution as written; absent is `NONE`.
    pub fn parse(text: Option<&str>) -> Result<Self, ProblemReason> {
        match text {
            None | Some("NONE") => Ok(Resolution::None),
            Some("STATIC") => Ok(Resolution::Static),
            Some("DNS") => Ok(Resolution::Dns),
            Some("DNS_ROUND_ROBIN") => Ok(Resolution::DnsRoundRobin),
            Some("DYNAMIC_DNS") => Ok(Resolution::DynamicDns),
            Some(other) => Err(ProblemReason::UnknownValue {
                field: "spec.resolution",
                value: other.to_owned(),
            }),
        }
    }

    /// Whether hosts without endpoints are their own endpoints.
    fn resolves_hosts(self) -> bool {
        matches!(
            self,
            Resolution::Dns | Resolution::DnsRoundRobin | Resolution::DynamicDns
        )
    }
}

/// What the ServiceEntries make.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Converted {
    /// One per host kept.
    pub(super) services: Vec<Service>,
    /// Their inline or implicit endpoints.
    pub(super) endpoints: Vec<WorkloadEntry>,
}

/// Every ServiceEntry that converts, oldest first (creation time, then
/// namespace and name), each host left out where a Kubernetes Service of
/// the namespace or an older ServiceEntry has it. `kube_services` are the
/// Services already converted.
pub(super) fn service_entries(
    objects: &[Arc<KubeServiceEntry>],
    kube_services: &[Service],
    namespaces: &HashMap<&str, &ObjectMeta>,
    waypoints: &Waypoints<'_>,
    settings: &ConvertSettings,
    problems: &mut Vec<ObjectProblem>,
) -> Converted {
    let mut owners: HashMap<(String, String), String> = kube_services
        .iter()
        .map(|service| {
            let key = (service.namespace.clone(), service.hostname.clone());
            (key, format!("Service {}", service.name))
        })
        .collect();
    let mut canonical: HashSet<String> = kube_services
        .iter()
        .map(|service| service.hostname.clone())
        .collect();
    let mut converted = Converted::default();
    let mut names = HashSet::new();
    // Endpoint uids join name and address with `/`, so two entries could
    // spell one; the later gives it up.
    let mut uids = HashSet::new();
    for object in oldest_first(objects) {
        let report = |reason| problem("ServiceEntry", &object.metadata, reason);
        let namespace_metadata = object
            .metadata
            .namespace
            .as_deref()
            .and_then(|namespace| namespaces.get(namespace).copied());
        let mut outcome = service_entry(object, namespace_metadata, settings);
        let Some(mut entry) = outcome.entry.take() else {
            problems.extend(outcome.problems.into_iter().map(report));
            continue;
        };
        let Some(first) = entry.services.first() else {
            problems.extend(outcome.problems.into_iter().map(report));
            continue;
        };
        if !names.insert((first.namespace.clone(), first.name.clone())) {
            problems.push(report(ProblemReason::Duplicate));
            continue;
        }
        let owner = format!("ServiceEntry {}", first.name);
        entry.services.retain_mut(|service| {
            let key = (service.namespace.clone(), service.hostname.clone());
            if let Some(other) = owners.get(&key) {
                outcome.problems.push(ProblemReason::HostTaken {
                    host: service.hostname.clone(),
                    other: other.clone(),
                });
                return false;
            }
            owners.insert(key, owner.clone());
            service.canonical = canonical.insert(service.hostname.clone());
            let bound =
                waypoints.for_service(&object.metadata, &service.namespace, &mut outcome.problems);
            service.waypoint = bound.waypoint;
            service.weighted_waypoints = bound.weighted;
            service.ingress_use_waypoint = bound.ingress_use_waypoint;
            true
        });
        // Endpoints no kept host lists go with their hosts, as istiod
        // sends no workload for a ServiceEntry its services all lost.
        let listed: HashSet<&str> = entry
            .services
            .iter()
            .filter_map(|service| service.endpoints.as_ref())
            .flatten()
            .map(String::as_str)
            .collect();
        let mut endpoints = Vec::with_capacity(entry.endpoints.len());
        for endpoint in entry.endpoints {
            if !listed.contains(endpoint.uid.as_str()) {
                continue;
            }
            if !uids.insert(endpoint.uid.clone()) {
                outcome.problems.push(ProblemReason::DuplicateEndpoint {
                    address: endpoint.uid.clone(),
                });
                continue;
            }
            endpoints.push(endpoint);
        }
        // A waypoint bound once per host says its problem once.
        outcome.problems.dedup();
        problems.extend(outcome.problems.into_iter().map(report));
        converted.services.append(&mut entry.services);
        converted.endpoints.extend(endpoints);
    }
    converted
}

/// The objects by creation time, then namespace and name.
fn oldest_first(objects: &[Arc<KubeServiceEntry>]) -> Vec<&KubeServiceEntry> {
    let mut sorted: Vec<&KubeServiceEntry> = objects.iter().map(Arc::as_ref).collect();
    sorted.sort_by(|a, b| {
        let key = |object: &KubeServiceEntry| {
            let metadata = &object.metadata;
            (
                metadata.creation_timestamp.as_ref().map(|time| time.0),
                metadata.namespace.clone(),
                metadata.name.clone(),
            )
        };
        key(a).cmp(&key(b))
    });
    sorted
}

/// The services and endpoints of one ServiceEntry, before the hosts are
/// compared with other objects', or why it is left out. Waypoints and
/// `canonical` are the caller's.
pub(super) fn service_entry(
    object: &KubeServiceEntry,
    namespace_metadata: Option<&ObjectMeta>,
    settings: &ConvertSettings,
) -> Outcome<Converted> {
    let (name, namespace) = match name_and_namespace(&object.metadata) {
        Ok(names) => names,
        Err(reason) => return Outcome::left_out(reason),
    };
    let spec = &object.spec;
    let resolution = match Resolution::parse(spec.resolution.as_deref()) {
        Ok(resolution) => resolution,
        Err(reason) => return Outcome::left_out(reason),
    };
    if spec.hosts.is_empty() || spec.hosts.iter().any(String::is_empty) {
        return Outcome::left_out(ProblemReason::MissingField {
            field: "spec.hosts",
        });
    }
    let selector = spec
        .workload_selector
        .as_ref()
        .map(|selector| selector.labels.clone());
    if selector.is_some() && !spec.endpoints.is_empty() {
        return Outcome::left_out(ProblemReason::EndpointsAndSelector);
    }
    let mut problems = Vec::new();
    let vips = match spec_addresses(&spec.addresses, &settings.network, &mut problems) {
        Ok(vips) => vips,
        Err(reason) => return Outcome::left_out(reason),
    };
    let allocated = if wants_allocation(object) {
        allocated_addresses(object)
    } else {
        BTreeMap::new()
    };
    let visibility = match export_to::service_entry_visibility(
        settings.service_entry_visibility.as_ref(),
        namespace_metadata.and_then(|ns| ns.labels.as_ref()),
    ) {
        // istiod configures no dataplane for it: its services are not sent.
        Visibility::Hidden => {
            return Outcome {
                entry: Some(Converted::default()),
                problems,
            };
        }
        Visibility::Namespace => ServiceVisibility::Namespace,
        Visibility::Public => ServiceVisibility::Public,
    };
    let ports = ports(&spec.ports, &mut problems);
    let balancing = if resolution == Resolution::None {
        Some(LoadBalancing {
            routing_preference: Vec::new(),
            mode: LoadBalancingMode::Passthrough,
            health_policy: HealthPolicy::AllowAll,
        })
    } else {
        let distribution =
            value(&object.metadata.annotations, TRAFFIC_DISTRIBUTION).or_else(|| {
                namespace_metadata.and_then(|ns| value(&ns.annotations, TRAFFIC_DISTRIBUTION))
            });
        load_balancing(None, distribution, false)
    };
    let subject_alt_names = spec
        .subject_alt_names
        .iter()
        .filter(|san| {
            let valid = san.parse::<Identity>().is_ok();
            if !valid {
                problems.push(ProblemReason::SubjectAltNameSkipped {
                    san: (*san).clone(),
                });
            }
            valid
        })
        .cloned()
        .collect::<Vec<_>>();
    let (protocol, native_tunnel) = tunnel(&object.metadata);
    let endpoint = |address: &str, fields: WorkloadEntry| WorkloadEntry {
        name: name.clone(),
        namespace: namespace.clone(),
        uid: format!(
            "{}/networking.istio.io/ServiceEntry/{namespace}/{name}/{address}",
            settings.cluster_id
        ),
        labels: object.metadata.labels.clone().unwrap_or_default(),
        protocol,
        native_tunnel,
        workload_name: name.clone(),
        service_entry: Some(name.clone()),
        ..fields
    };
    let mut endpoints = Vec::new();
    let mut addresses = HashSet::new();
    for written in &spec.endpoints {
        if !addresses.insert(written.address.as_str()) {
            problems.push(ProblemReason::DuplicateEndpoint {
                address: written.address.clone(),
            });
            continue;
        }
        let fields = endpoint_fields(written, settings, &mut problems);
        endpoints.push(endpoint(&written.address, fields));
    }
    let inline: Vec<String> = endpoints.iter().map(|entry| entry.uid.clone()).collect();
    let implicit = spec.endpoints.is_empty() && selector.is_none() && resolution.resolves_hosts();
    let mut services = Vec::with_capacity(spec.hosts.len());
    for host in &spec.hosts {
        let members = if implicit {
            let fields = endpoint_fields(&Default::default(), settings, &mut problems);
            let own = endpoint(
                host,
                WorkloadEntry {
                    address: EntryAddress::Hostname(host.clone()),
                    ..fields
                },
            );
            let uids = vec![own.uid.clone()];
            endpoints.push(own);
            uids
        } else {
            inline.clone()
        };
        let host_vips = if vips.is_empty() && host_takes_allocation(host, resolution) {
            allocated
                .get(host.as_str())
                .into_iter()
                .flatten()
                .map(|address| NetworkAddress {
                    network: settings.network.clone(),
                    address: *address,
                })
                .collect()
        } else {
            vips.clone()
        };
        let (selector, members) = match &selector {
            Some(labels) if !labels.is_empty() => (Some(labels.clone()), None),
            _ => (None, Some(members)),
        };
        services.push(Service {
            name: name.clone(),
            namespace: namespace.clone(),
            hostname: host.clone(),
            vips: host_vips,
            ports: ports.clone(),
            selector,
            endpoints: members,
            ip_families: crate::IpFamilies::Automatic,
            load_balancing: balancing.clone(),
            canonical: false,
            waypoint: None,
            weighted_waypoints: Vec::new(),
            ingress_use_waypoint: false,
            subject_alt_names: subject_alt_names.clone(),
            visibility,
        });
    }
    Outcome {
        entry: Some(Converted {
            services,
            endpoints,
        }),
        problems,
    }
}

/// `spec.addresses` as VIPs on `network`. A CIDR of one address is that
/// address; a wider one is skipped and reported; text that is neither
/// leaves the whole ServiceEntry out, as istiod drops its services.
fn spec_addresses(
    written: &[String],
    network: &str,
    problems: &mut Vec<ProblemReason>,
) -> Result<Vec<NetworkAddress>, ProblemReason> {
    let mut vips = Vec::with_capacity(written.len());
    for text in written {
        let unparsable = || ProblemReason::BadServiceEntryAddress {
            address: text.clone(),
        };
        let (ip, length) = match text.split_once('/') {
            None => (text.as_str(), None),
            Some((ip, length)) => (ip, Some(length.parse::<u8>().map_err(|_| unparsable())?)),
        };
        let address: IpAddr = ip.parse().map_err(|_| unparsable())?;
        let full = if address.is_ipv4() { 32 } else { 128 };
        match length {
            Some(length) if length > full => return Err(unparsable()),
            Some(length) if length < full => {
                problems.push(ProblemReason::CidrSkipped {
                    address: text.clone(),
                });
            }
            _ => vips.push(NetworkAddress {
                network: network.to_owned(),
                address,
            }),
        }
    }
    Ok(vips)
}

/// `spec.ports` by number (the first of a number wins): the target is the
/// written one, else the service port; the name lets endpoints say where
/// they receive it.
fn ports(
    written: &[ServiceEntryPort],
    problems: &mut Vec<ProblemReason>,
) -> BTreeMap<u16, ServicePort> {
    let mut ports = BTreeMap::new();
    for port in written {
        let Some(number) = u16::try_from(port.number).ok().filter(|n| *n != 0) else {
            problems.push(ProblemReason::BadPort {
                port: i64::from(port.number),
            });
            continue;
        };
        let target = match u16::try_from(port.target_port) {
            Ok(0) => number,
            Ok(target) => target,
            Err(_) => {
                problems.push(ProblemReason::BadPort {
                    port: i64::from(port.target_port),
                });
                continue;
            }
        };
        ports.entry(number).or_insert(ServicePort {
            target: TargetPort::Number(target),
            app_protocol: app_protocol(&port.protocol),
            name: (!port.name.is_empty()).then(|| port.name.clone()),
        });
    }
    ports
}

/// Istio's port protocol (any case) as ztunnel's app protocol.
fn app_protocol(protocol: &str) -> AppProtocol {
    match protocol.to_ascii_uppercase().as_str() {
        "HTTP" => AppProtocol::Http11,
        "HTTP2" => AppProtocol::Http2,
        "GRPC" => AppProtocol::Grpc,
        "TLS" | "HTTPS" => AppProtocol::Tls,
        "TCP" => AppProtocol::Tcp,
        _ => AppProtocol::Unknown,
    }
}

#[cfg(test)]
mod tests;
