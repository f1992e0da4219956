//! Gateway API Gateways → the waypoints services and pods are bound to, as
//! istiod derives them (AMBIENT.md
//! §1.2–1.4). Pure: from the objects the watches hold.
//!
//! A Gateway is a waypoint once its status lists an address, whatever its
//! class. An object binds by its own `istio.io/use-waypoint` label, else
//! its namespace's; an own label that cannot bind (no such waypoint,
//! attachment denied, wrong traffic type) leaves the object unbound and is
//! reported, with no fall-back to the namespace. Who writes the status
//! addresses of our own waypoints is the control plane's
//! `waypoint_status.rs`; what addresses it writes is [`status_addresses`].
//! Gateways into other networks are `network.rs`'s.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service as KubeService;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

use super::super::gateway_crd::{Gateway, GatewayClass, GatewayStatusAddress, Listener};
use super::ProblemReason;
use crate::{
    ApplicationTunnel, GatewayAddress, GatewayDestination, NetworkAddress, TunnelHeader,
    WAYPOINT_HBONE_PORT, WeightedWaypoint,
};

/// Names the waypoint an object (or every object of a namespace) uses;
/// `none` opts out.
const USE_WAYPOINT: &str = "istio.io/use-waypoint";
/// The waypoint's namespace, beside `USE_WAYPOINT`; absent, the object's.
const USE_WAYPOINT_NAMESPACE: &str = "istio.io/use-waypoint-namespace";
/// A canary waypoint beside the primary, its namespace, and its share
/// (an annotation, 0–100).
const CANARY: &str = "istio.io/use-waypoint-canary";
const CANARY_NAMESPACE: &str = "istio.io/use-waypoint-canary-namespace";
const CANARY_WEIGHT: &str = "istio.io/use-waypoint-canary-weight";
/// On a Gateway, else its GatewayClass: which traffic the waypoint takes.
const WAYPOINT_FOR: &str = "istio.io/waypoint-for";
/// On a Service, else its Namespace: ingress gateways use the waypoint.
const INGRESS_USE_WAYPOINT: &str = "istio.io/ingress-use-waypoint";
/// On a Gateway, else its GatewayClass: how the waypoint's own pods take
/// traffic (`NONE` or `PROXY`, optionally `/<port>`).
const INBOUND_BINDING: &str = "ambient.istio.io/waypoint-inbound-binding";
/// On a waypoint's pods: the Gateway they are an instance of.
const GATEWAY_NAME: &str = "gateway.networking.k8s.io/gateway-name";
/// On objects istiod deploys for a Gateway; such Services are never bound.
const MANAGED: &str = "gateway.istio.io/managed";
const MANAGED_VALUES: [&str; 2] = ["istio.io-mesh-controller", "istio.io-eastwest-controller"];

/// The class of the waypoints this control plane addresses.
const WAYPOINT_CLASS: &str = "istio-waypoint";

/// What a waypoint takes: `istio.io/waypoint-for`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TrafficType {
    Service,
    Workload,
    All,
    /// `none` or a value istiod does not know: binds nothing.
    Nothing,
}

impl TrafficType {
    fn parse(value: Option<&str>) -> Self {
        match value {
            None | Some("service") => TrafficType::Service,
            Some("workload") => TrafficType::Workload,
            Some("all") => TrafficType::All,
            Some(_) => TrafficType::Nothing,
        }
    }

    fn takes(self, target: Target) -> bool {
        matches!(
            (self, target),
            (TrafficType::All, _)
                | (TrafficType::Service, Target::Service)
                | (TrafficType::Workload, Target::Workload)
        )
    }
}

/// What is being bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    Service,
    Workload,
}

/// One addressed Gateway, as binding needs it.
#[derive(Debug, Clone)]
struct Waypoint {
    address: GatewayAddress,
    traffic: TrafficType,
    /// `allowedRoutes.namespaces` of its mesh listener.
    from: Attachment,
    inbound_binding: Option<ApplicationTunnel>,
    /// Of class `istio-waypoint`: its Service (named after it) is the one
    /// istiod would deploy, labelled managed, and is never bound.
    ours: bool,
}

/// Which namespaces may use a waypoint.
#[derive(Debug, Clone)]
enum Attachment {
    Same,
    All,
    Selector(LabelSelector),
}

/// Why an object's own label binds nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Unbound {
    /// No such Gateway, or it has no status address yet.
    NotReady,
    /// The Gateway does not let the object's namespace attach.
    AttachmentDenied,
    /// The Gateway does not take this kind of traffic.
    UnsupportedTrafficType,
}

/// A service's waypoint fields.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct ServiceWaypoints {
    pub(super) waypoint: Option<GatewayAddress>,
    pub(super) weighted: Vec<WeightedWaypoint>,
    pub(super) ingress_use_waypoint: bool,
}

/// A pod's waypoint fields.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct PodWaypoints {
    pub(super) waypoint: Option<GatewayAddress>,
    pub(super) application_tunnel: Option<ApplicationTunnel>,
}

/// Every waypoint, and the namespaces' metadata binding reads.
pub(super) struct Waypoints<'a> {
    /// (namespace, name) → the waypoint.
    by_name: HashMap<(String, String), Waypoint>,
    namespaces: &'a HashMap<&'a str, &'a ObjectMeta>,
}

/// Where a binding comes from: the labels (and annotations) of the object
/// or of its namespace.
struct Level<'m> {
    labels: Option<&'m BTreeMap<String, String>>,
    annotations: Option<&'m BTreeMap<String, String>>,
    own: bool,
}

impl Level<'_> {
    fn label(&self, key: &str) -> Option<&str> {
        self.labels?.get(key).map(String::as_str)
    }
}

impl<'a> Waypoints<'a> {
    /// The addressed Gateways of `gateways` (of any class), with what
    /// their class adds. `network` is the one IP addresses are on.
    pub(super) fn new(
        gateways: &'a [std::sync::Arc<Gateway>],
        classes: &'a [std::sync::Arc<GatewayClass>],
        namespaces: &'a HashMap<&'a str, &'a ObjectMeta>,
        network: &str,
    ) -> Self {
        let classes: HashMap<&str, &ObjectMeta> = classes
            .iter()
            .filter_map(|class| Some((class.metadata.name.as_deref()?, &class.metadata)))
            .collect();
        let mut by_name = HashMap::new();
        for gateway in gateways {
            let (Some(name), Some(namespace)) = (
                gateway.metadata.name.as_deref(),
                gateway.metadata.namespace.as_deref(),
            ) else {
                continue;
            };
            let Some(address) = gateway_address(gateway, namespace, network) else {
                continue;
            };
            let class = classes.get(gateway.spec.gateway_class_name.as_str());
            let inherited = |key: &str| {
                value_of(&gateway.metadata.labels, key)
                    .or_else(|| class.and_then(|class| value_of(&class.labels, key)))
            };
            let inherited_annotation = |key: &str| {
                value_of(&gateway.metadata.annotations, key)
                    .or_else(|| class.and_then(|class| value_of(&class.annotations, key)))
            };
            let inbound_binding = inherited_annotation(INBOUND_BINDING).and_then(inbound_binding);
            let waypoint = Waypoint {
                address,
                traffic: TrafficType::parse(inherited(WAYPOINT_FOR)),
                from: attachment(&gateway.spec.listeners, inbound_binding),
                inbound_binding,
                ours: gateway.spec.gateway_class_name == WAYPOINT_CLASS,
            };
            by_name.insert((namespace.to_owned(), name.to_owned()), waypoint);
        }
        Waypoints {
            by_name,
            namespaces,
        }
    }

    /// The waypoint fields of a Service (`namespace` is its own).
    pub(super) fn for_service(
        &self,
        metadata: &ObjectMeta,
        namespace: &str,
        problems: &mut Vec<ProblemReason>,
    ) -> ServiceWaypoints {
        let managed = value_of(&metadata.labels, MANAGED)
            .is_some_and(|value| MANAGED_VALUES.contains(&value));
        // The Service of one of our waypoints stands for the one istiod
        // deploys with the managed label: binding it would send the
        // waypoint's own traffic back to itself.
        let waypoints_own = metadata
            .name
            .as_deref()
            .and_then(|name| self.waypoint(namespace, name))
            .is_some_and(|waypoint| waypoint.ours);
        if managed || waypoints_own {
            return ServiceWaypoints::default();
        }
        let Some((level, name)) = self.level(metadata, namespace) else {
            return ServiceWaypoints::default();
        };
        let primary_namespace = level.label(USE_WAYPOINT_NAMESPACE).unwrap_or(namespace);
        let waypoint = match self.bind(name, primary_namespace, namespace, Target::Service) {
            Ok(waypoint) => waypoint,
            Err(unbound) => {
                if level.own {
                    problems.push(not_bound(primary_namespace, name, unbound));
                }
                return ServiceWaypoints::default();
            }
        };
        let ingress = value_of(&metadata.labels, INGRESS_USE_WAYPOINT)
            .or_else(|| {
                self.namespaces
                    .get(namespace)
                    .and_then(|ns| value_of(&ns.labels, INGRESS_USE_WAYPOINT))
            })
            .is_some_and(parse_bool);
        let weighted = match self.canary(&level, (primary_namespace, name), namespace) {
            Ok(weighted) => weighted,
            Err(reason) => {
                problems.push(reason);
                Vec::new()
            }
        };
        ServiceWaypoints {
            waypoint: Some(waypoint.address.clone()),
            weighted,
            ingress_use_waypoint: ingress,
        }
    }

    /// The waypoint fields of a Pod (`namespace` is its own): an instance
    /// of a waypoint gets its inbound binding and no waypoint.
    pub(super) fn for_pod(
        &self,
        metadata: &ObjectMeta,
        namespace: &str,
        problems: &mut Vec<ProblemReason>,
    ) -> PodWaypoints {
        let instance_of = value_of(&metadata.labels, GATEWAY_NAME)
            .and_then(|gateway| self.waypoint(namespace, gateway));
        if let Some(waypoint) = instance_of {
            return PodWaypoints {
                waypoint: None,
                application_tunnel: waypoint.inbound_binding,
            };
        }
        let Some((level, name)) = self.level(metadata, namespace) else {
            return PodWaypoints::default();
        };
        let waypoint_namespace = level.label(USE_WAYPOINT_NAMESPACE).unwrap_or(namespace);
        match self.bind(name, waypoint_namespace, namespace, Target::Workload) {
            Ok(waypoint) => PodWaypoints {
                waypoint: Some(waypoint.address.clone()),
                application_tunnel: None,
            },
            Err(unbound) => {
                // An inherited binding of the wrong traffic type is dropped
                // silently, as istiod does: most namespaces' waypoints are
                // for services only.
                if level.own {
                    problems.push(not_bound(waypoint_namespace, name, unbound));
                }
                PodWaypoints::default()
            }
        }
    }

    /// Where the binding comes from and the waypoint it names: the
    /// object's own label, else its namespace's; `none` at either binds
    /// nothing (an own `none` hides the namespace's).
    fn level<'m>(
        &'m self,
        metadata: &'m ObjectMeta,
        namespace: &str,
    ) -> Option<(Level<'m>, &'m str)> {
        if let Some(name) = value_of(&metadata.labels, USE_WAYPOINT) {
            let level = Level {
                labels: metadata.labels.as_ref(),
                annotations: metadata.annotations.as_ref(),
                own: true,
            };
            return (name != "none").then_some((level, name));
        }
        let ns = self.namespaces.get(namespace)?;
        let name = value_of(&ns.labels, USE_WAYPOINT)?;
        let level = Level {
            labels: ns.labels.as_ref(),
            annotations: ns.annotations.as_ref(),
            own: false,
        };
        (name != "none").then_some((level, name))
    }

    fn waypoint(&self, namespace: &str, name: &str) -> Option<&Waypoint> {
        self.by_name.get(&(namespace.to_owned(), name.to_owned()))
    }

    /// The waypoint `namespace/name`, if an object of `from` may use it for
    /// `target`.
    fn bind(
        &self,
        name: &str,
        namespace: &str,
        from: &str,
        target: Target,
    ) -> Result<&Waypoint, Unbound> {
        let waypoint = self.waypoint(namespace, name).ok_or(Unbound::NotReady)?;
        let allowed = match &waypoint.from {
            Attachment::Same => from == namespace,
            Attachment::All => true,
            Attachment::Selector(selector) => {
                let labels = self.namespaces.get(from).and_then(|ns| ns.labels.as_ref());
                selects(selector, labels)
            }
        };
        if !allowed {
            return Err(Unbound::AttachmentDenied);
        }
        if !waypoint.traffic.takes(target) {
            return Err(Unbound::UnsupportedTrafficType);
        }
        Ok(waypoint)
    }

    /// `[primary, canary]` with their weights, when the level names a
    /// canary; empty without one.
    fn canary(
        &self,
        level: &Level<'_>,
        (primary_namespace, primary): (&str, &str),
        namespace: &str,
    ) -> Result<Vec<WeightedWaypoint>, ProblemReason> {
        let Some(name) = level.label(CANARY) else {
            return Ok(Vec::new());
        };
        let canary_namespace = level.label(CANARY_NAMESPACE).unwrap_or(namespace);
        let invalid = |why: String| ProblemReason::CanaryInvalid { why };
        if (canary_namespace, name) == (primary_namespace, primary) {
            return Err(invalid(format!(
                "canary {canary_namespace}/{name} is the primary"
            )));
        }
        let weight = match level.annotations.and_then(|map| map.get(CANARY_WEIGHT)) {
            None => 0,
            Some(text) => text
                .parse::<u32>()
                .ok()
                .filter(|weight| *weight <= 100)
                .ok_or_else(|| invalid(format!("weight {text:?} is not 0 to 100")))?,
        };
        let canary = self
            .bind(name, canary_namespace, namespace, Target::Service)
            .map_err(|unbound| {
                invalid(format!("{canary_namespace}/{name}: {}", unbound.reason()))
            })?;
        let primary = self
            .waypoint(primary_namespace, primary)
            .map(|waypoint| waypoint.address.clone())
            .ok_or_else(|| invalid("primary not found".to_owned()))?;
        Ok(vec![
            WeightedWaypoint {
                waypoint: primary,
                weight: 100 - weight,
            },
            WeightedWaypoint {
                waypoint: canary.address.clone(),
                weight,
            },
        ])
    }
}

impl Unbound {
    /// istiod's reason, as its status condition spells it.
    pub(super) fn reason(self) -> &'static str {
        match self {
            Unbound::NotReady => "WaypointIsNotReady",
            Unbound::AttachmentDenied => "AttachmentDenied",
            Unbound::UnsupportedTrafficType => "UnsupportedTrafficType",
        }
    }
}

fn not_bound(namespace: &str, name: &str, unbound: Unbound) -> ProblemReason {
    ProblemReason::WaypointNotBound {
        waypoint: format!("{namespace}/{name}"),
        reason: unbound.reason(),
    }
}

/// The GatewayAddress istiod sends for a Gateway: its first Hostname
/// status address, else its first IP address; none without either.
fn gateway_address(gateway: &Gateway, namespace: &str, network: &str) -> Option<GatewayAddress> {
    let addresses = &gateway.status.as_ref()?.addresses;
    let hostname = addresses
        .iter()
        .find(|address| address.type_.as_deref() == Some("Hostname"))
        .map(|address| GatewayDestination::Hostname {
            namespace: namespace.to_owned(),
            hostname: address.value.clone(),
        });
    let destination = hostname.or_else(|| {
        addresses
            .iter()
            .filter(|address| is_ip_address(address))
            .find_map(|address| address.value.parse::<IpAddr>().ok())
            .map(|address| {
                GatewayDestination::Address(NetworkAddress {
                    network: network.to_owned(),
                    address,
                })
            })
    })?;
    Some(GatewayAddress::waypoint(destination))
}

fn is_ip_address(address: &GatewayStatusAddress) -> bool {
    matches!(address.type_.as_deref(), None | Some("IPAddress"))
}

/// `NONE` or `PROXY`, optionally `/<port>`; anything else is ignored.
fn inbound_binding(text: &str) -> Option<ApplicationTunnel> {
    let (protocol, port) = match text.split_once('/') {
        Some((protocol, port)) => (protocol, port.parse::<u16>().ok()?),
        None => (text, 0),
    };
    let protocol = match protocol {
        "NONE" => TunnelHeader::None,
        "PROXY" => TunnelHeader::Proxy,
        _ => return None,
    };
    Some(ApplicationTunnel { protocol, port })
}

/// Who may attach: `allowedRoutes.namespaces` of the inbound binding's
/// listener (by port), else of the HBONE listener; `Same` by default.
fn attachment(listeners: &[Listener], binding: Option<ApplicationTunnel>) -> Attachment {
    let by_port = binding
        .map(|binding| i32::from(binding.port))
        .filter(|port| *port != 0)
        .and_then(|port| listeners.iter().find(|listener| listener.port == port));
    let listener = by_port.or_else(|| {
        listeners.iter().find(|listener| {
            listener.protocol == "HBONE" || listener.port == i32::from(WAYPOINT_HBONE_PORT)
        })
    });
    let namespaces = listener
        .and_then(|listener| listener.allowed_routes.as_ref())
        .and_then(|routes| routes.namespaces.as_ref());
    match namespaces.map(|ns| (ns.from.as_deref(), &ns.selector)) {
        Some((Some("All"), _)) => Attachment::All,
        Some((Some("Selector"), Some(selector))) => Attachment::Selector(selector.clone()),
        _ => Attachment::Same,
    }
}

/// Whether a label selector picks these labels (an empty selector picks
/// everything; an operator it does not know picks nothing).
pub(super) fn selects(selector: &LabelSelector, labels: Option<&BTreeMap<String, String>>) -> bool {
    let label = |key: &str| labels.and_then(|labels| labels.get(key));
    let exact = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(key, value)| label(key) == Some(value));
    exact
        && selector
            .match_expressions
            .iter()
            .flatten()
            .all(|requirement| {
                let values = requirement.values.as_deref().unwrap_or_default();
                let value = label(&requirement.key);
                match requirement.operator.as_str() {
                    "In" => value.is_some_and(|value| values.contains(value)),
                    "NotIn" => value.is_none_or(|value| !values.contains(value)),
                    "Exists" => value.is_some(),
                    "DoesNotExist" => value.is_none(),
                    _ => false,
                }
            })
}

/// Go's `strconv.ParseBool`; anything else is false.
fn parse_bool(text: &str) -> bool {
    matches!(text, "1" | "t" | "T" | "true" | "TRUE" | "True")
}

pub(super) fn value_of<'m>(
    map: &'m Option<BTreeMap<String, String>>,
    key: &str,
) -> Option<&'m str> {
    map.as_ref()?.get(key).map(String::as_str)
}

/// The status addresses the control plane writes for one of its
/// waypoints (class `istio-waypoint`) once its Service (named after it, in
/// its namespace) has a cluster IP: the Service's hostname, then each
/// cluster IP, after what the status already lists (nothing is ever
/// removed). `None` when there is nothing to add.
pub fn status_addresses(
    gateway: &Gateway,
    service: Option<&KubeService>,
    cluster_domain: &str,
) -> Option<Vec<GatewayStatusAddress>> {
    if gateway.spec.gateway_class_name != WAYPOINT_CLASS {
        return None;
    }
    let name = gateway.metadata.name.as_deref()?;
    let namespace = gateway.metadata.namespace.as_deref()?;
    let spec = service?.spec.as_ref()?;
    let listed = match &spec.cluster_ips {
        Some(ips) if !ips.is_empty() => ips.clone(),
        _ => spec.cluster_ip.iter().cloned().collect(),
    };
    let ips: Vec<String> = listed
        .into_iter()
        .filter(|ip| ip.parse::<IpAddr>().is_ok())
        .collect();
    if ips.is_empty() {
        return None;
    }
    let mut addresses = gateway
        .status
        .as_ref()
        .map(|status| status.addresses.clone())
        .unwrap_or_default();
    let before = addresses.len();
    let wanted = std::iter::once((
        "Hostname",
        format!("{name}.{namespace}.svc.{cluster_domain}"),
    ))
    .chain(ips.into_iter().map(|ip| ("IPAddress", ip)));
    for (kind, value) in wanted {
        let present = addresses.iter().any(|address| {
            address.value == value
                && (address.type_.as_deref() == Some(kind)
                    || (kind == "IPAddress" && is_ip_address(address)))
        });
        if !present {
            addresses.push(GatewayStatusAddress {
                type_: Some(kind.to_owned()),
                value,
            });
        }
    }
    (addresses.len() > before).then_some(addresses)
}

#[cfg(test)]
pub(super) mod tests;
