//! Kubernetes Services and EndpointSlices → mesh [`Service`]s
//! (KUBERNETES.md E5–E6): hostname, VIPs, ports with their target and
//! protocol, balancing, and the members: a selector for services that have
//! one, else the pods the service's EndpointSlices name. Resolving a named
//! target port against each member's container ports is
//! `xds/resources.rs`'s, which has both sides at hand.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    ObjectReference, Service as KubeService, ServicePort as KubeServicePort, ServiceSpec,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::waypoint::Waypoints;
use super::{
    ConvertSettings, KubeObjects, ObjectProblem, Outcome, ProblemReason, name_and_namespace,
    problem, sorted, value,
};
use crate::{
    AppProtocol, HealthPolicy, IpFamilies, LoadBalancing, LoadBalancingMode, LocalityScope,
    NetworkAddress, Pod, Service, ServicePort, TargetPort,
};

/// Names the Service an EndpointSlice belongs to.
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// Istio's traffic distribution, on a Service, else its Namespace; the
/// Service's `spec.trafficDistribution` wins over both.
pub(super) const TRAFFIC_DISTRIBUTION: &str = "networking.istio.io/traffic-distribution";

/// What a Service's conversion reads beside the Service.
pub(super) struct Context<'a> {
    /// The pods kept, so that every member named is one of them.
    pub(super) pods: &'a [Pod],
    /// Namespace name → metadata.
    pub(super) namespaces: &'a HashMap<&'a str, &'a ObjectMeta>,
    /// The waypoints services bind to.
    pub(super) waypoints: &'a Waypoints<'a>,
}

/// Every Service that converts, in namespace/name order, with the
/// EndpointSlice members of those without a selector and their waypoints.
pub(super) fn services(
    objects: &KubeObjects,
    context: &Context<'_>,
    settings: &ConvertSettings,
    problems: &mut Vec<ObjectProblem>,
) -> Vec<Service> {
    let mut slice_problems = Vec::new();
    let mut members = slice_members(&objects.endpoint_slices, context.pods, &mut slice_problems);
    let mut converted = Vec::new();
    let mut names = HashSet::new();
    for object in sorted(&objects.services, |service| &service.metadata) {
        let report = |reason| problem("Service", &object.metadata, reason);
        let namespace_metadata = object
            .metadata
            .namespace
            .as_deref()
            .and_then(|namespace| context.namespaces.get(namespace).copied());
        let mut outcome = service(object, namespace_metadata, settings);
        if let Some(service) = &mut outcome.entry {
            let bound = context.waypoints.for_service(
                &object.metadata,
                &service.namespace,
                &mut outcome.problems,
            );
            service.waypoint = bound.waypoint;
            service.weighted_waypoints = bound.weighted;
            service.ingress_use_waypoint = bound.ingress_use_waypoint;
        }
        problems.extend(outcome.problems.into_iter().map(report));
        let Some(mut service) = outcome.entry else {
            continue;
        };
        if !names.insert((service.namespace.clone(), service.name.clone())) {
            problems.push(report(ProblemReason::Duplicate));
            continue;
        }
        if service.selector.is_none() {
            let key = (service.namespace.clone(), service.name.clone());
            let uids = members.remove(&key).unwrap_or_default();
            service.endpoints = Some(uids.into_iter().collect());
        }
        converted.push(service);
    }
    problems.extend(slice_problems);
    converted
}

/// The mesh service of a Kubernetes Service; ExternalName services are
/// not sent (silently: that is what they are), nameless ones are left out.
fn service(
    object: &KubeService,
    namespace_metadata: Option<&ObjectMeta>,
    settings: &ConvertSettings,
) -> Outcome<Service> {
    let (name, namespace) = match name_and_namespace(&object.metadata) {
        Ok(names) => names,
        Err(reason) => return Outcome::left_out(reason),
    };
    let unset = ServiceSpec::default();
    let spec = object.spec.as_ref().unwrap_or(&unset);
    if spec.type_.as_deref() == Some("ExternalName") {
        return Outcome {
            entry: None,
            problems: Vec::new(),
        };
    }
    let mut problems = Vec::new();
    let listed = match &spec.cluster_ips {
        Some(ips) if !ips.is_empty() => ips.clone(),
        _ => spec.cluster_ip.iter().cloned().collect(),
    };
    let mut vips = Vec::new();
    for text in listed.iter().filter(|ip| !ip.is_empty() && *ip != "None") {
        match text.parse::<IpAddr>() {
            Ok(address) => vips.push(NetworkAddress {
                network: settings.network.clone(),
                address,
            }),
            Err(_) => problems.push(ProblemReason::BadAddress {
                address: text.clone(),
            }),
        }
    }
    let (ports, port_problems) = ports(spec.ports.as_deref().unwrap_or_default());
    problems.extend(port_problems);
    let selector = spec.selector.clone().filter(|labels| !labels.is_empty());
    let traffic_distribution = spec
        .traffic_distribution
        .as_deref()
        .or_else(|| value(&object.metadata.annotations, TRAFFIC_DISTRIBUTION))
        .or_else(|| namespace_metadata.and_then(|ns| value(&ns.annotations, TRAFFIC_DISTRIBUTION)));
    let service = Service {
        hostname: format!("{name}.{namespace}.svc.{}", settings.cluster_domain),
        vips,
        ports,
        endpoints: None,
        selector,
        ip_families: ip_families(spec.ip_families.as_deref().unwrap_or_default()),
        load_balancing: load_balancing(
            spec.internal_traffic_policy.as_deref(),
            traffic_distribution,
            spec.publish_not_ready_addresses == Some(true),
        ),
        canonical: true,
        waypoint: None,
        weighted_waypoints: Vec::new(),
        ingress_use_waypoint: false,
        subject_alt_names: Vec::new(),
        visibility: crate::ServiceVisibility::Public,
        name,
        namespace,
    };
    Outcome {
        entry: Some(service),
        problems,
    }
}

/// Service port → target and protocol. Two spec ports may share a number
/// (TCP and UDP): the TCP one is kept, as the mesh carries TCP.
fn ports(spec: &[KubeServicePort]) -> (BTreeMap<u16, ServicePort>, Vec<ProblemReason>) {
    let mut ports = BTreeMap::new();
    let mut problems = Vec::new();
    let is_tcp = |port: &KubeServicePort| matches!(port.protocol.as_deref(), None | Some("TCP"));
    let (tcp, other): (Vec<_>, Vec<_>) = spec.iter().partition(|port| is_tcp(port));
    for port in tcp.into_iter().chain(other) {
        let Some(number) = port_number(port.port) else {
            problems.push(ProblemReason::BadPort {
                port: i64::from(port.port),
            });
            continue;
        };
        let target = match &port.target_port {
            None => TargetPort::Number(number),
            Some(IntOrString::Int(target)) => match port_number(*target) {
                Some(target) => TargetPort::Number(target),
                None => {
                    problems.push(ProblemReason::BadPort {
                        port: i64::from(*target),
                    });
                    continue;
                }
            },
            Some(IntOrString::String(name)) if name.is_empty() => TargetPort::Number(number),
            Some(IntOrString::String(name)) => TargetPort::Name(name.clone()),
        };
        let app_protocol = if is_tcp(port) {
            app_protocol(port.app_protocol.as_deref(), port.name.as_deref())
        } else {
            AppProtocol::Unknown
        };
        ports.entry(number).or_insert(ServicePort {
            target,
            app_protocol,
            name: None,
        });
    }
    (ports, problems)
}

fn port_number(port: i32) -> Option<u16> {
    u16::try_from(port).ok().filter(|port| *port != 0)
}

/// What a port speaks: its `appProtocol` if set, else the protocol its name
/// starts with (`<protocol>[-<suffix>]`, Istio's port naming).
fn app_protocol(app_protocol: Option<&str>, name: Option<&str>) -> AppProtocol {
    let declared = match app_protocol {
        Some(declared) => declared,
        None => {
            let name = name.unwrap_or_default();
            name.split_once('-').map_or(name, |(prefix, _)| prefix)
        }
    };
    match declared.to_ascii_lowercase().as_str() {
        "http" | "kubernetes.io/ws" => AppProtocol::Http11,
        "http2" | "kubernetes.io/h2c" => AppProtocol::Http2,
        "grpc" => AppProtocol::Grpc,
        "https" | "tls" | "kubernetes.io/wss" => AppProtocol::Tls,
        "tcp" => AppProtocol::Tcp,
        _ => AppProtocol::Unknown,
    }
}

/// `spec.ipFamilies`: both, one, or unsaid.
fn ip_families(families: &[String]) -> IpFamilies {
    match families {
        [_, _] => IpFamilies::Dual,
        [family] if family == "IPv4" => IpFamilies::IPv4Only,
        [family] if family == "IPv6" => IpFamilies::IPv6Only,
        _ => IpFamilies::Automatic,
    }
}

/// Locality and health preferences: node-local traffic policy first, else
/// the traffic distribution; not-ready endpoints published → all used.
pub(super) fn load_balancing(
    internal_traffic_policy: Option<&str>,
    traffic_distribution: Option<&str>,
    publish_not_ready: bool,
) -> Option<LoadBalancing> {
    use LocalityScope::{Network, Node, Region, Subzone, Zone};
    let (routing_preference, mode) = match (internal_traffic_policy, traffic_distribution) {
        (Some("Local"), _) => (vec![Node], LoadBalancingMode::Strict),
        // `PreferClose` is the older name of `PreferSameZone`.
        (_, Some("PreferSameZone" | "PreferClose")) => {
            (vec![Network, Region, Zone], LoadBalancingMode::Failover)
        }
        (_, Some("PreferSameNode")) => (
            vec![Network, Region, Zone, Subzone, Node],
            LoadBalancingMode::Failover,
        ),
        _ => (Vec::new(), LoadBalancingMode::Unspecified),
    };
    let health_policy = if publish_not_ready {
        HealthPolicy::AllowAll
    } else {
        HealthPolicy::OnlyHealthy
    };
    let balancing = LoadBalancing {
        routing_preference,
        mode,
        health_policy,
    };
    (balancing != LoadBalancing::default()).then_some(balancing)
}

/// (namespace, service name) → uids of the kept pods its EndpointSlices
/// name through a Pod targetRef. Endpoints without one are reported, once
/// per slice; FQDN slices are ignored.
fn slice_members(
    slices: &[Arc<EndpointSlice>],
    pods: &[Pod],
    problems: &mut Vec<ObjectProblem>,
) -> HashMap<(String, String), BTreeSet<String>> {
    let by_name: HashMap<(&str, &str), &Pod> = pods
        .iter()
        .map(|pod| ((pod.namespace.as_str(), pod.name.as_str()), pod))
        .collect();
    let mut members: HashMap<(String, String), BTreeSet<String>> = HashMap::new();
    for slice in sorted(slices, |slice| &slice.metadata) {
        let (Some(namespace), Some(service)) = (
            slice.metadata.namespace.as_deref(),
            value(&slice.metadata.labels, SERVICE_NAME_LABEL),
        ) else {
            continue;
        };
        if slice.address_type == "FQDN" {
            continue;
        }
        let mut without_pod = 0;
        let uids = members
            .entry((namespace.to_owned(), service.to_owned()))
            .or_default();
        for endpoint in slice.endpoints.iter().flatten() {
            let target = endpoint
                .target_ref
                .as_ref()
                .filter(|target| target.kind.as_deref() == Some("Pod"));
            let Some(target) = target else {
                without_pod += 1;
                continue;
            };
            if let Some(pod) = target_pod(target, namespace, &by_name) {
                uids.insert(pod.uid.clone());
            }
        }
        if without_pod > 0 {
            problems.push(problem(
                "EndpointSlice",
                &slice.metadata,
                ProblemReason::EndpointsWithoutPod { count: without_pod },
            ));
        }
    }
    members
}

/// The kept pod a Pod targetRef names: by namespace (the slice's when
/// absent) and name, and by uid when it has one, so that a reference to a
/// deleted pod does not name its successor.
fn target_pod<'a>(
    target: &ObjectReference,
    slice_namespace: &str,
    by_name: &HashMap<(&str, &str), &'a Pod>,
) -> Option<&'a Pod> {
    let namespace = target.namespace.as_deref().unwrap_or(slice_namespace);
    let pod = *by_name.get(&(namespace, target.name.as_deref()?))?;
    target
        .uid
        .as_deref()
        .is_none_or(|uid| uid == pod.uid)
        .then_some(pod)
}

#[cfg(test)]
mod tests;
