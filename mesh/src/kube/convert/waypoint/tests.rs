//! The binding table (AMBIENT.md §1.3–1.4, §3.2), through the whole
//! conversion: one case per line, each with its reason.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace, Service as KubeService};
use serde_json::{Value, json};

use super::super::super::gateway_crd::GatewayStatus;
use super::super::tests::{kube_pod, merged, object};
use super::super::{Conversion, ConvertSettings, KubeObjects, ProblemReason, convert};
use super::*;

/// An addressed waypoint `namespace/name` of class `istio-waypoint` with
/// one HBONE listener, `patch` merged in.
pub(in super::super) fn gateway(namespace: &str, name: &str, patch: Value) -> Arc<Gateway> {
    Arc::new(object(merged(
        json!({
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"gatewayClassName": "istio-waypoint",
                     "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}]},
            "status": {"addresses": [
                {"type": "Hostname", "value": format!("{name}.{namespace}.svc.cluster.local")},
                {"type": "IPAddress", "value": "10.96.9.9"},
            ]},
        }),
        patch,
    )))
}

fn namespace(name: &str, labels: Value) -> Arc<Namespace> {
    Arc::new(object(
        json!({"metadata": {"name": name, "labels": labels}}),
    ))
}

/// Service `shop/web` selecting `app=web`, `patch` merged in.
fn web_service(patch: Value) -> Arc<KubeService> {
    Arc::new(object(merged(
        json!({
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {"clusterIP": "10.96.0.1", "selector": {"app": "web"},
                     "ports": [{"port": 80}]},
        }),
        patch,
    )))
}

/// Pod `shop/web-1` labelled `app=web`, `patch` merged in.
fn web_pod(patch: Value) -> Arc<KubePod> {
    let patch = merged(json!({"metadata": {"labels": {"app": "web"}}}), patch);
    Arc::new(kube_pod("shop", "web-1", "10.0.0.5", patch))
}

type KubePod = k8s_openapi::api::core::v1::Pod;

/// The hostname address of waypoint `namespace/name`.
fn hostname(namespace: &str, name: &str) -> GatewayAddress {
    GatewayAddress::waypoint(GatewayDestination::Hostname {
        namespace: namespace.to_owned(),
        hostname: format!("{name}.{namespace}.svc.cluster.local"),
    })
}

/// The world of most rows: namespaces `shop` (labels `shop_labels`) and
/// `infra` (label `team=infra`), waypoints `shop/wp`, `shop/wp2` and
/// `infra/shared` (Gateway patches by name), service `shop/web` and its
/// pod.
struct World {
    shop_labels: Value,
    gateway_patches: Vec<(&'static str, Value)>,
    service: Value,
    pod: Value,
    classes: Vec<Value>,
}

impl Default for World {
    fn default() -> Self {
        World {
            shop_labels: json!({}),
            gateway_patches: Vec::new(),
            service: json!({}),
            pod: json!({}),
            classes: Vec::new(),
        }
    }
}

impl World {
    fn convert(&self) -> Conversion {
        let patch = |name: &str| {
            self.gateway_patches
                .iter()
                .find(|(gateway, _)| *gateway == name)
                .map_or(json!({}), |(_, patch)| patch.clone())
        };
        let objects = KubeObjects {
            namespaces: vec![
                namespace("shop", self.shop_labels.clone()),
                namespace("infra", json!({"team": "infra"})),
            ],
            gateways: vec![
                gateway("shop", "wp", patch("wp")),
                gateway("shop", "wp2", patch("wp2")),
                gateway("infra", "shared", patch("shared")),
            ],
            gateway_classes: self
                .classes
                .iter()
                .cloned()
                .map(object)
                .map(Arc::new)
                .collect(),
            services: vec![web_service(self.service.clone())],
            pods: vec![web_pod(self.pod.clone())],
            ..KubeObjects::default()
        };
        convert(&objects, &ConvertSettings::default())
    }

    fn service_waypoint(&self) -> Option<GatewayAddress> {
        self.convert().mesh.services[0].waypoint.clone()
    }

    fn pod_waypoint(&self) -> Option<GatewayAddress> {
        self.convert().mesh.pods[0].waypoint.clone()
    }
}

/// (case, namespace labels, service labels, a Gateway's patch, waypoint)
type BindingCase = (
    &'static str,
    Value,
    Value,
    Option<(&'static str, Value)>,
    Option<GatewayAddress>,
);

fn labels(labels: Value) -> Value {
    json!({"metadata": {"labels": labels}})
}

#[test]
fn services_bind_by_their_own_label_else_their_namespaces() {
    let shared_from = |from: Value| {
        (
            "shared",
            json!({"spec": {"listeners": [
                {"name": "mesh", "port": 15008, "protocol": "HBONE", "allowedRoutes": {"namespaces": from}}
            ]}}),
        )
    };
    let wp = Some(hostname("shop", "wp"));
    let wp2 = Some(hostname("shop", "wp2"));
    let shared = Some(hostname("infra", "shared"));
    // (case, namespace labels, service labels, gateway patch, waypoint)
    let cases: Vec<BindingCase> = vec![
        (
            "no label anywhere: direct",
            json!({}),
            json!({}),
            None,
            None,
        ),
        (
            "own label",
            json!({}),
            json!({"istio.io/use-waypoint": "wp"}),
            None,
            wp.clone(),
        ),
        (
            "namespace label",
            json!({"istio.io/use-waypoint": "wp"}),
            json!({}),
            None,
            wp.clone(),
        ),
        (
            "own label wins over the namespace's",
            json!({"istio.io/use-waypoint": "wp"}),
            json!({"istio.io/use-waypoint": "wp2"}),
            None,
            wp2.clone(),
        ),
        (
            "own none hides the namespace's",
            json!({"istio.io/use-waypoint": "wp"}),
            json!({"istio.io/use-waypoint": "none"}),
            None,
            None,
        ),
        (
            "namespace none",
            json!({"istio.io/use-waypoint": "none"}),
            json!({}),
            None,
            None,
        ),
        (
            "own label naming no Gateway: unbound, no fall-back",
            json!({"istio.io/use-waypoint": "wp"}),
            json!({"istio.io/use-waypoint": "missing"}),
            None,
            None,
        ),
        (
            "a Gateway without status addresses is no waypoint",
            json!({}),
            json!({"istio.io/use-waypoint": "wp"}),
            Some(("wp", json!({"status": null}))),
            None,
        ),
        (
            "another namespace's waypoint, default Same: denied",
            json!({}),
            json!({"istio.io/use-waypoint": "shared", "istio.io/use-waypoint-namespace": "infra"}),
            None,
            None,
        ),
        (
            "another namespace's waypoint from All",
            json!({}),
            json!({"istio.io/use-waypoint": "shared", "istio.io/use-waypoint-namespace": "infra"}),
            Some(shared_from(json!({"from": "All"}))),
            shared.clone(),
        ),
        (
            "namespace label with its use-waypoint-namespace",
            json!({"istio.io/use-waypoint": "shared", "istio.io/use-waypoint-namespace": "infra"}),
            json!({}),
            Some(shared_from(json!({"from": "All"}))),
            shared.clone(),
        ),
        (
            "from Selector matching the service's namespace",
            json!({"mesh": "yes"}),
            json!({"istio.io/use-waypoint": "shared", "istio.io/use-waypoint-namespace": "infra"}),
            Some(shared_from(
                json!({"from": "Selector", "selector": {"matchLabels": {"mesh": "yes"}}}),
            )),
            shared.clone(),
        ),
        (
            "from Selector not matching: denied",
            json!({"mesh": "no"}),
            json!({"istio.io/use-waypoint": "shared", "istio.io/use-waypoint-namespace": "infra"}),
            Some(shared_from(
                json!({"from": "Selector", "selector": {"matchLabels": {"mesh": "yes"}}}),
            )),
            None,
        ),
        (
            "waypoint for workloads only: a service is not bound",
            json!({}),
            json!({"istio.io/use-waypoint": "wp"}),
            Some(("wp", labels(json!({"istio.io/waypoint-for": "workload"})))),
            None,
        ),
        (
            "waypoint for all",
            json!({}),
            json!({"istio.io/use-waypoint": "wp"}),
            Some(("wp", labels(json!({"istio.io/waypoint-for": "all"})))),
            wp.clone(),
        ),
        (
            "waypoint for none",
            json!({"istio.io/use-waypoint": "wp"}),
            json!({}),
            Some(("wp", labels(json!({"istio.io/waypoint-for": "none"})))),
            None,
        ),
        (
            "an unknown waypoint-for binds nothing",
            json!({}),
            json!({"istio.io/use-waypoint": "wp"}),
            Some(("wp", labels(json!({"istio.io/waypoint-for": "everything"})))),
            None,
        ),
        (
            "a Service istiod manages for a gateway is never bound",
            json!({"istio.io/use-waypoint": "wp"}),
            json!({"gateway.istio.io/managed": "istio.io-mesh-controller"}),
            None,
            None,
        ),
    ];
    for (case, shop_labels, service_labels, gateway_patch, expected) in cases {
        let world = World {
            shop_labels,
            gateway_patches: gateway_patch.into_iter().collect(),
            service: labels(service_labels),
            ..World::default()
        };
        assert_eq!(world.service_waypoint(), expected, "{case}");
    }
}

#[test]
fn the_service_of_one_of_our_waypoints_is_never_bound() {
    let named = |name: &str| json!({"metadata": {"name": name}});
    let world = |service: Value, class: &str| World {
        shop_labels: json!({"istio.io/use-waypoint": "wp"}),
        gateway_patches: vec![("wp2", json!({"spec": {"gatewayClassName": class}}))],
        service,
        ..World::default()
    };
    assert_eq!(
        world(named("wp2"), "istio-waypoint").service_waypoint(),
        None
    );
    assert_eq!(
        world(named("wp2"), "other-waypoints").service_waypoint(),
        Some(hostname("shop", "wp")),
        "another class's Service is an ordinary one"
    );
}

#[test]
fn an_own_label_that_cannot_bind_is_reported_and_an_inherited_one_is_not() {
    let reasons = |world: &World| -> Vec<ProblemReason> {
        world
            .convert()
            .problems
            .into_iter()
            .map(|problem| problem.reason)
            .collect()
    };
    let own = World {
        service: labels(json!({"istio.io/use-waypoint": "missing"})),
        ..World::default()
    };
    assert_eq!(
        reasons(&own),
        [ProblemReason::WaypointNotBound {
            waypoint: "shop/missing".into(),
            reason: "WaypointIsNotReady",
        }]
    );
    let denied = World {
        service: labels(
            json!({"istio.io/use-waypoint": "shared", "istio.io/use-waypoint-namespace": "infra"}),
        ),
        ..World::default()
    };
    assert_eq!(
        reasons(&denied),
        [ProblemReason::WaypointNotBound {
            waypoint: "infra/shared".into(),
            reason: "AttachmentDenied",
        }]
    );
    let inherited = World {
        shop_labels: json!({"istio.io/use-waypoint": "missing"}),
        ..World::default()
    };
    assert_eq!(reasons(&inherited), [], "a namespace's label binds quietly");
}

#[test]
fn pods_bind_only_to_waypoints_for_workloads() {
    let for_workloads = ("wp", labels(json!({"istio.io/waypoint-for": "workload"})));
    let namespace_bound = json!({"istio.io/use-waypoint": "wp"});
    // (case, gateway patch, pod labels, pod waypoint)
    let cases = [
        (
            "default waypoint-for is service: the pod goes direct",
            None,
            json!({}),
            None,
        ),
        (
            "for workloads",
            Some(for_workloads.clone()),
            json!({}),
            Some(hostname("shop", "wp")),
        ),
        (
            "for all",
            Some(("wp", labels(json!({"istio.io/waypoint-for": "all"})))),
            json!({}),
            Some(hostname("shop", "wp")),
        ),
        (
            "own none",
            Some(for_workloads.clone()),
            json!({"istio.io/use-waypoint": "none"}),
            None,
        ),
    ];
    for (case, gateway_patch, pod_labels, expected) in cases {
        let world = World {
            shop_labels: namespace_bound.clone(),
            gateway_patches: gateway_patch.into_iter().collect(),
            pod: labels(pod_labels),
            ..World::default()
        };
        assert_eq!(world.pod_waypoint(), expected, "{case}");
    }
    let services_only = World {
        pod: labels(json!({"app": "web", "istio.io/use-waypoint": "wp"})),
        ..World::default()
    };
    let conversion = services_only.convert();
    assert_eq!(conversion.mesh.pods[0].waypoint, None);
    assert_eq!(
        conversion.problems[0].reason,
        ProblemReason::WaypointNotBound {
            waypoint: "shop/wp".into(),
            reason: "UnsupportedTrafficType",
        },
        "an own label of the wrong traffic type is reported"
    );
}

#[test]
fn waypoint_for_comes_from_the_gateway_else_its_class() {
    let class = |labels: Value| json!({"metadata": {"name": "istio-waypoint", "labels": labels}});
    let world = |class_labels: Value, gateway_labels: Value| World {
        shop_labels: json!({"istio.io/use-waypoint": "wp"}),
        gateway_patches: vec![("wp", labels(gateway_labels))],
        classes: vec![class(class_labels)],
        ..World::default()
    };
    let for_workload = json!({"istio.io/waypoint-for": "workload"});
    let for_service = json!({"istio.io/waypoint-for": "service"});
    assert_eq!(
        world(for_workload.clone(), json!({})).pod_waypoint(),
        Some(hostname("shop", "wp")),
        "the class's label applies"
    );
    assert_eq!(
        world(for_workload, for_service).pod_waypoint(),
        None,
        "the Gateway's label wins"
    );
}

#[test]
fn a_waypoints_own_pods_get_no_waypoint_and_its_inbound_binding() {
    let proxy = ApplicationTunnel {
        protocol: TunnelHeader::Proxy,
        port: 15088,
    };
    let annotated = |binding: &str| {
        json!({"metadata": {"labels": {"istio.io/waypoint-for": "all"},
                            "annotations": {"ambient.istio.io/waypoint-inbound-binding": binding}}})
    };
    let class_annotated = json!({"metadata": {"name": "istio-waypoint",
        "annotations": {"ambient.istio.io/waypoint-inbound-binding": "NONE"}}});
    // (case, gateway patch, classes, application tunnel)
    let cases = [
        (
            "no binding anywhere",
            labels(json!({"istio.io/waypoint-for": "all"})),
            vec![],
            None,
        ),
        (
            "the Gateway's annotation",
            annotated("PROXY/15088"),
            vec![],
            Some(proxy),
        ),
        (
            "the class's annotation",
            labels(json!({"istio.io/waypoint-for": "all"})),
            vec![class_annotated.clone()],
            Some(ApplicationTunnel {
                protocol: TunnelHeader::None,
                port: 0,
            }),
        ),
        (
            "the Gateway's wins over the class's",
            annotated("PROXY/15088"),
            vec![class_annotated],
            Some(proxy),
        ),
        (
            "an unknown protocol is ignored",
            annotated("SOCKS"),
            vec![],
            None,
        ),
    ];
    for (case, gateway_patch, classes, expected) in cases {
        let world = World {
            shop_labels: json!({"istio.io/use-waypoint": "wp"}),
            gateway_patches: vec![("wp", gateway_patch)],
            pod: labels(json!({"gateway.networking.k8s.io/gateway-name": "wp"})),
            classes,
            ..World::default()
        };
        let pod = &world.convert().mesh.pods[0];
        assert_eq!(pod.waypoint, None, "{case}: an instance has no waypoint");
        assert_eq!(pod.application_tunnel, expected, "{case}");
    }
}

#[test]
fn a_canary_splits_by_its_weight_and_the_primary_stays_the_waypoint() {
    let annotated = |weight: &str| {
        json!({"metadata": {
            "labels": {"istio.io/use-waypoint": "wp", "istio.io/use-waypoint-canary": "wp2"},
            "annotations": {"istio.io/use-waypoint-canary-weight": weight}}})
    };
    let weights = |service: Value| {
        let world = World {
            service,
            ..World::default()
        };
        let service = &world.convert().mesh.services[0];
        assert_eq!(service.waypoint, Some(hostname("shop", "wp")));
        service
            .weighted_waypoints
            .iter()
            .map(|weighted| (weighted.waypoint.clone(), weighted.weight))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        weights(annotated("25")),
        [(hostname("shop", "wp"), 75), (hostname("shop", "wp2"), 25)]
    );
    assert_eq!(
        weights(labels(
            json!({"istio.io/use-waypoint": "wp", "istio.io/use-waypoint-canary": "wp2"})
        )),
        [(hostname("shop", "wp"), 100), (hostname("shop", "wp2"), 0)],
        "no weight is 0"
    );
    assert_eq!(
        weights(annotated("101")),
        [],
        "a weight over 100 is invalid"
    );
    assert_eq!(
        weights(annotated("x")),
        [],
        "a weight that is no number is invalid"
    );
    assert_eq!(
        weights(labels(
            json!({"istio.io/use-waypoint": "wp", "istio.io/use-waypoint-canary": "wp"})
        )),
        [],
        "the canary is the primary"
    );
    assert_eq!(
        weights(labels(
            json!({"istio.io/use-waypoint": "wp", "istio.io/use-waypoint-canary": "nope"})
        )),
        [],
        "the canary is no waypoint"
    );
}

#[test]
fn ingress_use_waypoint_is_read_only_when_bound() {
    let ingress = |shop_labels: Value, service_labels: Value| {
        let world = World {
            shop_labels,
            service: labels(service_labels),
            ..World::default()
        };
        world.convert().mesh.services[0].ingress_use_waypoint
    };
    let bound = json!({"istio.io/use-waypoint": "wp"});
    let bound_with = |value: &str| json!({"istio.io/use-waypoint": "wp", "istio.io/ingress-use-waypoint": value});
    assert!(ingress(json!({}), bound_with("true")));
    assert!(ingress(json!({}), bound_with("1")), "Go's ParseBool");
    assert!(
        !ingress(json!({}), bound_with("yes")),
        "not a Go bool: false"
    );
    assert!(
        ingress(json!({"istio.io/ingress-use-waypoint": "T"}), bound),
        "the namespace's label"
    );
    assert!(
        !ingress(json!({}), json!({"istio.io/ingress-use-waypoint": "true"})),
        "unbound"
    );
}

#[test]
fn a_waypoint_with_only_ip_addresses_is_named_by_its_first_on_the_network() {
    let ip_only = json!({"status": {"addresses": [
        {"type": "IPAddress", "value": "not-an-ip"},
        {"value": "10.96.9.9"},
    ]}});
    let objects = KubeObjects {
        namespaces: vec![namespace(
            "istio-system",
            json!({"topology.istio.io/network": "net-1"}),
        )],
        gateways: vec![gateway("shop", "wp", ip_only)],
        services: vec![web_service(labels(json!({"istio.io/use-waypoint": "wp"})))],
        ..KubeObjects::default()
    };
    let conversion = convert(&objects, &ConvertSettings::default());
    let service = &conversion.mesh.services[0];
    assert_eq!(
        service.waypoint,
        Some(GatewayAddress::waypoint(GatewayDestination::Address(
            NetworkAddress {
                network: "net-1".into(),
                address: "10.96.9.9".parse().unwrap(),
            }
        )))
    );
    assert_eq!(
        service.vips[0].network, "net-1",
        "VIPs are on the system namespace's network"
    );
}

#[test]
fn status_addresses_are_the_services_hostname_and_cluster_ips_added_once() {
    let unaddressed = gateway("shop", "wp", json!({"status": null}));
    let service: KubeService = object(json!({
        "metadata": {"name": "wp", "namespace": "shop"},
        "spec": {"clusterIP": "10.96.3.3", "clusterIPs": ["10.96.3.3", "fd00::3"]},
    }));
    let written = status_addresses(&unaddressed, Some(&service), "cluster.local").unwrap();
    let pairs: Vec<(Option<&str>, &str)> = written
        .iter()
        .map(|address| (address.type_.as_deref(), address.value.as_str()))
        .collect();
    assert_eq!(
        pairs,
        [
            (Some("Hostname"), "wp.shop.svc.cluster.local"),
            (Some("IPAddress"), "10.96.3.3"),
            (Some("IPAddress"), "fd00::3"),
        ]
    );
    let addressed: Gateway = Gateway {
        status: Some(GatewayStatus { addresses: written }),
        ..(*unaddressed).clone()
    };
    assert_eq!(
        status_addresses(&addressed, Some(&service), "cluster.local"),
        None,
        "nothing to add"
    );
    let headless: KubeService = object(
        json!({"metadata": {"name": "wp", "namespace": "shop"}, "spec": {"clusterIP": "None"}}),
    );
    assert_eq!(
        status_addresses(&unaddressed, Some(&headless), "cluster.local"),
        None
    );
    assert_eq!(
        status_addresses(&unaddressed, None, "cluster.local"),
        None,
        "no Service yet"
    );
    let remote = gateway(
        "shop",
        "wp",
        json!({"spec": {"gatewayClassName": "istio-remote"}, "status": null}),
    );
    assert_eq!(
        status_addresses(&remote, Some(&service), "cluster.local"),
        None,
        "only our class is ours to address"
    );
}

#[test]
fn traffic_distribution_comes_from_the_spec_then_the_service_then_the_namespace() {
    use crate::LoadBalancingMode;
    let annotation = |value: &str| json!({"networking.istio.io/traffic-distribution": value});
    let balancing = |namespace_annotations: Value, service: Value| {
        let objects = KubeObjects {
            namespaces: vec![Arc::new(object(
                json!({"metadata": {"name": "shop", "annotations": namespace_annotations}}),
            ))],
            services: vec![web_service(service)],
            ..KubeObjects::default()
        };
        let conversion = convert(&objects, &ConvertSettings::default());
        conversion.mesh.services[0]
            .load_balancing
            .as_ref()
            .map(|balancing| (balancing.routing_preference.len(), balancing.mode))
    };
    let zone = Some((3, LoadBalancingMode::Failover));
    let node = Some((5, LoadBalancingMode::Failover));
    assert_eq!(
        balancing(annotation("PreferClose"), json!({})),
        zone,
        "namespace"
    );
    assert_eq!(
        balancing(
            annotation("PreferClose"),
            json!({"metadata": {"annotations": annotation("PreferSameNode")}})
        ),
        node,
        "the service's annotation wins"
    );
    assert_eq!(
        balancing(
            json!({}),
            json!({"metadata": {"annotations": annotation("PreferSameNode")},
                   "spec": {"trafficDistribution": "PreferSameZone"}})
        ),
        zone,
        "the spec wins"
    );
    assert_eq!(balancing(json!({}), json!({})), None);
}
