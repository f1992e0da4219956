//! The service table (KUBERNETES.md E5–E6): one case per line, each with
//! its reason.

use serde_json::{Value, json};

use super::super::tests::{kube_pod, merged, object};
use super::*;
use crate::Labels;

/// A service's name, selector and listed members.
type Members<'a> = (&'a str, Option<&'a Labels>, Option<&'a Vec<String>>);

fn kube_service(patch: Value) -> KubeService {
    object(merged(
        json!({
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {"clusterIP": "10.96.0.1", "clusterIPs": ["10.96.0.1"],
                     "selector": {"app": "web"}, "ports": [{"port": 80}]},
        }),
        patch,
    ))
}

fn convert(patch: Value) -> Service {
    convert_with(patch, &ConvertSettings::default())
}

fn convert_with(patch: Value, settings: &ConvertSettings) -> Service {
    let outcome = service(&kube_service(patch), None, settings);
    assert_eq!(outcome.problems, []);
    outcome.entry.unwrap()
}

#[test]
fn hostname_and_vips_follow_the_spec() {
    let other = ConvertSettings {
        cluster_domain: "corp.example".into(),
        network: "net-2".into(),
        ..ConvertSettings::default()
    };
    let default = ConvertSettings::default();
    let web = convert(json!({}));
    assert_eq!(web.hostname, "web.shop.svc.cluster.local");
    assert!(
        web.canonical,
        "a Kubernetes Service is canonical for its hostname"
    );
    assert_eq!(
        convert_with(json!({}), &other).hostname,
        "web.shop.svc.corp.example",
        "cluster domain from the settings"
    );
    // (case, settings, patch, VIPs)
    let cases = [
        ("one cluster IP", &default, json!({}), vec!["/10.96.0.1"]),
        (
            "dual stack: every cluster IP",
            &default,
            json!({"spec": {"clusterIPs": ["10.96.0.1", "fd00::1"]}}),
            vec!["/10.96.0.1", "/fd00::1"],
        ),
        (
            "clusterIP when clusterIPs is absent",
            &default,
            json!({"spec": {"clusterIPs": null, "clusterIP": "10.96.0.9"}}),
            vec!["/10.96.0.9"],
        ),
        (
            "headless: no VIP",
            &default,
            json!({"spec": {"clusterIPs": ["None"], "clusterIP": "None"}}),
            vec![],
        ),
        (
            "not allocated yet",
            &default,
            json!({"spec": {"clusterIPs": null, "clusterIP": null}}),
            vec![],
        ),
        (
            "network from the settings",
            &other,
            json!({}),
            vec!["net-2/10.96.0.1"],
        ),
    ];
    for (case, settings, patch, want) in cases {
        let vips: Vec<String> = convert_with(patch, settings)
            .vips
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(vips, want, "{case}");
    }
}

#[test]
fn external_name_services_are_not_sent_and_not_reported() {
    let object =
        kube_service(json!({"spec": {"type": "ExternalName", "externalName": "db.example"}}));
    let outcome = service(&object, None, &ConvertSettings::default());
    assert_eq!((outcome.entry, outcome.problems), (None, vec![]));
}

#[test]
fn ports_keep_their_target_and_protocol() {
    let port = |spec: Value| {
        let web = convert(json!({"spec": {"ports": [merged(json!({"port": 80}), spec)]}}));
        let ports: Vec<(u16, ServicePort)> = web.ports.into_iter().collect();
        let [(80, port)] = &ports[..] else {
            panic!("{ports:?}")
        };
        port.clone()
    };
    // (case, spec port, target)
    let targets = [
        (
            "numeric target",
            json!({"targetPort": 8080}),
            TargetPort::Number(8080),
        ),
        (
            "no target: the port itself",
            json!({}),
            TargetPort::Number(80),
        ),
        (
            "named target: resolved per pod",
            json!({"targetPort": "http"}),
            TargetPort::Name("http".into()),
        ),
    ];
    for (case, spec, want) in targets {
        assert_eq!(port(spec).target, want, "{case}");
    }
    // (case, spec port, protocol)
    let protocols = [
        ("unnamed", json!({}), AppProtocol::Unknown),
        ("name http", json!({"name": "http"}), AppProtocol::Http11),
        (
            "name http-<suffix>",
            json!({"name": "http-web"}),
            AppProtocol::Http11,
        ),
        (
            "name HTTP, any case",
            json!({"name": "HTTP"}),
            AppProtocol::Http11,
        ),
        ("name http2", json!({"name": "http2"}), AppProtocol::Http2),
        (
            "name grpc-<suffix>",
            json!({"name": "grpc-api"}),
            AppProtocol::Grpc,
        ),
        ("name https", json!({"name": "https"}), AppProtocol::Tls),
        ("name tls", json!({"name": "tls-db"}), AppProtocol::Tls),
        ("name tcp", json!({"name": "tcp"}), AppProtocol::Tcp),
        (
            "name of no protocol",
            json!({"name": "mongo"}),
            AppProtocol::Unknown,
        ),
        (
            "name with the protocol later",
            json!({"name": "web-http"}),
            AppProtocol::Unknown,
        ),
        (
            "appProtocol wins over the name",
            json!({"name": "tcp", "appProtocol": "http2"}),
            AppProtocol::Http2,
        ),
        (
            "appProtocol kubernetes.io/h2c",
            json!({"appProtocol": "kubernetes.io/h2c"}),
            AppProtocol::Http2,
        ),
        (
            "appProtocol kubernetes.io/ws",
            json!({"appProtocol": "kubernetes.io/ws"}),
            AppProtocol::Http11,
        ),
        (
            "appProtocol kubernetes.io/wss",
            json!({"appProtocol": "kubernetes.io/wss"}),
            AppProtocol::Tls,
        ),
        (
            "unknown appProtocol: not the name",
            json!({"name": "http", "appProtocol": "x"}),
            AppProtocol::Unknown,
        ),
        (
            "UDP carries no app protocol",
            json!({"name": "http", "protocol": "UDP"}),
            AppProtocol::Unknown,
        ),
    ];
    for (case, spec, want) in protocols {
        assert_eq!(port(spec).app_protocol, want, "{case}");
    }
}

#[test]
fn a_port_number_shared_by_tcp_and_udp_keeps_the_tcp_one() {
    let web = convert(json!({"spec": {"ports": [
        {"name": "dns-udp", "port": 53, "protocol": "UDP", "targetPort": 5353},
        {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 5354},
    ]}}));
    let ports: Vec<(u16, TargetPort)> = web
        .ports
        .into_iter()
        .map(|(port, to)| (port, to.target))
        .collect();
    assert_eq!(ports, [(53, TargetPort::Number(5354))]);
}

#[test]
fn out_of_range_ports_are_skipped_and_reported() {
    let object = kube_service(json!({"spec": {"ports": [
        {"port": 70000},
        {"port": 81, "targetPort": 0},
        {"port": 82, "targetPort": -1},
        {"port": 83},
    ]}}));
    let outcome = service(&object, None, &ConvertSettings::default());
    let ports: Vec<u16> = outcome.entry.unwrap().ports.into_keys().collect();
    assert_eq!(ports, [83]);
    let bad = [70000, 0, -1].map(|port| ProblemReason::BadPort { port });
    assert_eq!(outcome.problems, bad);
}

#[test]
fn ip_families_and_load_balancing_follow_the_spec() {
    // (case, ipFamilies, want)
    let families = [
        ("both", json!(["IPv4", "IPv6"]), IpFamilies::Dual),
        ("IPv4", json!(["IPv4"]), IpFamilies::IPv4Only),
        ("IPv6", json!(["IPv6"]), IpFamilies::IPv6Only),
        ("unsaid", Value::Null, IpFamilies::Automatic),
    ];
    for (case, spec, want) in families {
        assert_eq!(
            convert(json!({"spec": {"ipFamilies": spec}})).ip_families,
            want,
            "{case}"
        );
    }
    use LocalityScope::{Network, Node, Region, Subzone, Zone};
    let balancing = |routing_preference: Vec<LocalityScope>, mode, health_policy| {
        Some(LoadBalancing {
            routing_preference,
            mode,
            health_policy,
        })
    };
    let (strict, failover) = (LoadBalancingMode::Strict, LoadBalancingMode::Failover);
    // (case, spec, load balancing)
    let cases = [
        ("nothing said", json!({}), None),
        (
            "node-local traffic only",
            json!({"internalTrafficPolicy": "Local"}),
            balancing(vec![Node], strict, HealthPolicy::OnlyHealthy),
        ),
        (
            "cluster-wide traffic",
            json!({"internalTrafficPolicy": "Cluster"}),
            None,
        ),
        (
            "same zone preferred",
            json!({"trafficDistribution": "PreferSameZone"}),
            balancing(
                vec![Network, Region, Zone],
                failover,
                HealthPolicy::OnlyHealthy,
            ),
        ),
        (
            "PreferClose is PreferSameZone",
            json!({"trafficDistribution": "PreferClose"}),
            balancing(
                vec![Network, Region, Zone],
                failover,
                HealthPolicy::OnlyHealthy,
            ),
        ),
        (
            "same node preferred",
            json!({"trafficDistribution": "PreferSameNode"}),
            balancing(
                vec![Network, Region, Zone, Subzone, Node],
                failover,
                HealthPolicy::OnlyHealthy,
            ),
        ),
        (
            "Local wins over a distribution",
            json!({"internalTrafficPolicy": "Local", "trafficDistribution": "PreferSameZone"}),
            balancing(vec![Node], strict, HealthPolicy::OnlyHealthy),
        ),
        (
            "not-ready endpoints published",
            json!({"publishNotReadyAddresses": true}),
            balancing(
                vec![],
                LoadBalancingMode::Unspecified,
                HealthPolicy::AllowAll,
            ),
        ),
    ];
    for (case, spec, want) in cases {
        assert_eq!(
            convert(json!({"spec": spec})).load_balancing,
            want,
            "{case}"
        );
    }
}

#[test]
fn members_come_from_the_selector_or_the_endpoint_slices() {
    let pods: Vec<Pod> = ["db-0", "db-1", "web"]
        .into_iter()
        .enumerate()
        .map(|(at, name)| {
            let object = kube_pod("shop", name, &format!("10.0.0.{at}"), json!({}));
            super::super::pod::pod(&object, &HashMap::new(), &ConvertSettings::default())
                .entry
                .unwrap()
        })
        .collect();
    let endpoint = |name: &str, uid: Value| {
        json!({"addresses": ["10.0.0.1"],
               "targetRef": {"kind": "Pod", "namespace": "shop", "name": name, "uid": uid}})
    };
    let slice =
        |name: &str, service: &str, address_type: &str, endpoints: Value| -> Arc<EndpointSlice> {
            Arc::new(object(json!({
                "metadata": {"name": name, "namespace": "shop",
                             "labels": {SERVICE_NAME_LABEL: service}},
                "addressType": address_type,
                "endpoints": endpoints,
            })))
        };
    let objects = KubeObjects {
        services: vec![
            Arc::new(kube_service(json!({}))),
            Arc::new(kube_service(
                json!({"metadata": {"name": "db"}, "spec": {"selector": null}}),
            )),
            Arc::new(kube_service(
                json!({"metadata": {"name": "empty"}, "spec": {"selector": {"app": null}}}),
            )),
        ],
        endpoint_slices: vec![
            slice(
                "db-a",
                "db",
                "IPv4",
                json!([
                    endpoint("db-0", json!("u-db-0")),
                    endpoint("gone", Value::Null)
                ]),
            ),
            slice(
                "db-b",
                "db",
                "IPv4",
                json!([
                    endpoint("db-1", Value::Null),               // no uid: the name decides
                    endpoint("web", json!("u-old")),             // another pod of that name
                    {"addresses": ["10.0.9.9"], "targetRef": {"kind": "Node", "name": "node-a"}},
                    {"addresses": ["10.0.9.8"]},
                ]),
            ),
            slice(
                "db-fqdn",
                "db",
                "FQDN",
                json!([{"addresses": ["db.example"]}]),
            ),
            slice(
                "web-a",
                "web",
                "IPv4",
                json!([endpoint("db-0", json!("u-db-0"))]),
            ),
        ],
        ..KubeObjects::default()
    };
    let mut problems = Vec::new();
    let namespaces = HashMap::new();
    let waypoints = Waypoints::new(&[], &[], &namespaces, "");
    let context = Context {
        pods: &pods,
        namespaces: &namespaces,
        waypoints: &waypoints,
    };
    let services = services(
        &objects,
        &context,
        &ConvertSettings::default(),
        &mut problems,
    );
    // (service, selector, members)
    let got: Vec<Members> = services
        .iter()
        .map(|service| {
            (
                service.name.as_str(),
                service.selector.as_ref(),
                service.endpoints.as_ref(),
            )
        })
        .collect();
    let web_selector = Labels::from([("app".to_owned(), "web".to_owned())]);
    let db_members = vec!["u-db-0".to_owned(), "u-db-1".to_owned()];
    assert_eq!(
        got,
        [
            ("db", None, Some(&db_members)), // selector-less: slices' Pod targets
            ("empty", None, Some(&vec![])),  // an empty selector selects nothing
            ("web", Some(&web_selector), None), // slices of selector services are not read
        ]
    );
    let reported: Vec<(&str, &ProblemReason)> = problems
        .iter()
        .map(|problem| (problem.name.as_str(), &problem.reason))
        .collect();
    assert_eq!(
        reported,
        [("db-b", &ProblemReason::EndpointsWithoutPod { count: 2 })],
        "endpoints without a Pod are not converted"
    );
}
