//! The ServiceEntry table: istiod's own cases (`services_test.go`
//! `TestServiceEntryServices`, `workloads_test.go`
//! `TestServiceEntryWorkloads`, `ambientindex_serviceentry_test.go`), one
//! per row, each service and endpoint summarised on one line.

use serde_json::{Value, json};

use super::super::tests::{merged, object};
use super::*;

fn kube_service_entry(name: &str, created: &str, patch: Value) -> Arc<KubeServiceEntry> {
    Arc::new(object(merged(
        json!({
            "metadata": {"name": name, "namespace": "ns", "creationTimestamp": created},
            "spec": {"ports": [{"number": 80, "name": "http"}]},
        }),
        patch,
    )))
}

/// `host vips ports balancing members`, one service per line.
fn service_line(service: &Service) -> String {
    let vips: Vec<String> = service
        .vips
        .iter()
        .map(|vip| vip.address.to_string())
        .collect();
    let ports: Vec<String> = service
        .ports
        .iter()
        .map(|(number, port)| match &port.target {
            TargetPort::Number(target) => format!("{number}->{target}"),
            TargetPort::Name(name) => format!("{number}->{name}"),
        })
        .collect();
    let balancing = match &service.load_balancing {
        None => "-".to_owned(),
        Some(balancing) => format!("{:?}{:?}", balancing.mode, balancing.routing_preference),
    };
    let members = match (&service.selector, &service.endpoints) {
        (Some(selector), _) => format!("selector{selector:?}"),
        (None, Some(uids)) => format!("{} endpoint(s)", uids.len()),
        (None, None) => "none".to_owned(),
    };
    format!(
        "{} [{}] [{}] {balancing} {members}{}",
        service.hostname,
        vips.join(","),
        ports.join(","),
        if service.canonical { " canonical" } else { "" }
    )
}

/// `uid address`, one endpoint per line.
fn endpoint_line(endpoint: &WorkloadEntry) -> String {
    let address = match &endpoint.address {
        EntryAddress::Ip(ip) => ip.to_string(),
        EntryAddress::Hostname(hostname) => format!("hostname {hostname}"),
        EntryAddress::None => "none".to_owned(),
    };
    format!("{} {address}", endpoint.uid)
}

fn convert_entries(
    objects: &[Arc<KubeServiceEntry>],
    kube_services: &[Service],
) -> (Vec<String>, Vec<String>, Vec<ObjectProblem>) {
    let settings = ConvertSettings {
        cluster_id: "cluster0".to_owned(),
        ..ConvertSettings::default()
    };
    let namespaces = HashMap::new();
    let waypoints = Waypoints::new(&[], &[], &namespaces, "");
    let mut problems = Vec::new();
    let converted = service_entries(
        objects,
        kube_services,
        &namespaces,
        &waypoints,
        &settings,
        &mut problems,
    );
    (
        converted.services.iter().map(service_line).collect(),
        converted.endpoints.iter().map(endpoint_line).collect(),
        problems,
    )
}

const T0: &str = "2026-01-01T00:00:00Z";

#[test]
fn service_entry_objects_convert_as_istiod_converts_them() {
    // (istiod's case, patch, services, endpoints)
    let cases: [(&str, Value, &[&str], &[&str]); 13] = [
        (
            "DNS service entry with address",
            json!({"spec": {"hosts": ["a.example.com", "b.example.com"], "addresses": ["1.2.3.4"],
                "resolution": "DNS"}}),
            &[
                "a.example.com [1.2.3.4] [80->80] - 1 endpoint(s) canonical",
                "b.example.com [1.2.3.4] [80->80] - 1 endpoint(s) canonical",
            ],
            &[
                "cluster0/networking.istio.io/ServiceEntry/ns/se/a.example.com hostname a.example.com",
                "cluster0/networking.istio.io/ServiceEntry/ns/se/b.example.com hostname b.example.com",
            ],
        ),
        (
            "Uses auto-assigned addresses",
            json!({"spec": {"hosts": ["assign-me.example.com"], "resolution": "DNS"},
                "status": {"addresses": [{"value": "240.240.0.1", "host": "assign-me.example.com"},
                    {"value": "2001:2::1", "host": "assign-me.example.com"}]}}),
            &["assign-me.example.com [240.240.0.1,2001:2::1] [80->80] - 1 endpoint(s) canonical"],
            &[
                "cluster0/networking.istio.io/ServiceEntry/ns/se/assign-me.example.com hostname assign-me.example.com",
            ],
        ),
        (
            "Uses multiple auto-assigned addresses",
            json!({"spec": {"hosts": ["multi-host-assign-me.example.com", "second-host-assign-me.example.com"],
                    "resolution": "STATIC", "workloadSelector": {"labels": {"app": "foo"}}},
                "status": {"addresses": [
                    {"value": "240.240.0.1", "host": "multi-host-assign-me.example.com"},
                    {"value": "240.240.0.2", "host": "second-host-assign-me.example.com"}]}}),
            &[
                "multi-host-assign-me.example.com [240.240.0.1] [80->80] - selector{\"app\": \"foo\"} canonical",
                "second-host-assign-me.example.com [240.240.0.2] [80->80] - selector{\"app\": \"foo\"} canonical",
            ],
            &[],
        ),
        (
            "Does not use auto-assigned addresses user provided address",
            json!({"spec": {"hosts": ["user-provided.example.com"], "addresses": ["1.2.3.4"],
                    "resolution": "STATIC", "endpoints": [{"address": "2.3.4.5"}]},
                "status": {"addresses": [{"value": "240.240.0.1", "host": "user-provided.example.com"}]}}),
            &["user-provided.example.com [1.2.3.4] [80->80] - 1 endpoint(s) canonical"],
            &["cluster0/networking.istio.io/ServiceEntry/ns/se/2.3.4.5 2.3.4.5"],
        ),
        (
            "Does not use auto-assigned addresses none resolution",
            json!({"spec": {"hosts": ["none-resolution.example.com"], "resolution": "NONE"},
                "status": {"addresses": [{"value": "240.240.0.1", "host": "none-resolution.example.com"}]}}),
            &["none-resolution.example.com [] [80->80] Passthrough[] 0 endpoint(s) canonical"],
            &[],
        ),
        (
            "Does not use auto-assigned addresses user opted out",
            json!({"metadata": {"labels": {"networking.istio.io/enable-autoallocate-ip": "false"}},
                "spec": {"hosts": ["user-opt-out.example.com"], "resolution": "DNS"},
                "status": {"addresses": [{"value": "240.240.0.1", "host": "user-opt-out.example.com"}]}}),
            &["user-opt-out.example.com [] [80->80] - 1 endpoint(s) canonical"],
            &[
                "cluster0/networking.istio.io/ServiceEntry/ns/se/user-opt-out.example.com hostname user-opt-out.example.com",
            ],
        ),
        (
            "Does not use auto-assigned addresses for wildcard host with DNS resolution",
            json!({"spec": {"hosts": ["*.wildcard.example.com", "this-is-ok.example.com"], "resolution": "DNS",
                    "endpoints": [{"address": "2.3.4.5"}]},
                "status": {"addresses": [
                    {"value": "240.240.0.1", "host": "*.wildcard.example.com"},
                    {"value": "240.240.0.2", "host": "this-is-ok.example.com"}]}}),
            &[
                "*.wildcard.example.com [] [80->80] - 1 endpoint(s) canonical",
                "this-is-ok.example.com [240.240.0.2] [80->80] - 1 endpoint(s) canonical",
            ],
            &["cluster0/networking.istio.io/ServiceEntry/ns/se/2.3.4.5 2.3.4.5"],
        ),
        (
            "Uses auto assigned addresses for wildcard host",
            json!({"spec": {"hosts": ["*.wildcard.example.com"], "resolution": "DYNAMIC_DNS"},
                "status": {"addresses": [{"value": "240.240.0.1", "host": "*.wildcard.example.com"}]}}),
            &["*.wildcard.example.com [240.240.0.1] [80->80] - 1 endpoint(s) canonical"],
            &[
                "cluster0/networking.istio.io/ServiceEntry/ns/se/*.wildcard.example.com hostname *.wildcard.example.com",
            ],
        ),
        (
            "prefer same node traffic distribution",
            json!({"metadata": {"annotations": {"networking.istio.io/traffic-distribution": "PreferSameNode"}},
                "spec": {"hosts": ["a.example.com"], "addresses": ["1.2.3.4"], "resolution": "STATIC"}}),
            &[
                "a.example.com [1.2.3.4] [80->80] Failover[Network, Region, Zone, Subzone, Node] 0 endpoint(s) canonical",
            ],
            &[],
        ),
        (
            "prefer close traffic distribution",
            json!({"metadata": {"annotations": {"networking.istio.io/traffic-distribution": "PreferClose"}},
                "spec": {"hosts": ["a.example.com"], "addresses": ["1.2.3.4"], "resolution": "STATIC"}}),
            &[
                "a.example.com [1.2.3.4] [80->80] Failover[Network, Region, Zone] 0 endpoint(s) canonical",
            ],
            &[],
        ),
        (
            "Service entry with single-IP CIDR address",
            json!({"spec": {"hosts": ["single.example.com"], "addresses": ["1.2.3.4/32"], "resolution": "STATIC"}}),
            &["single.example.com [1.2.3.4] [80->80] - 0 endpoint(s) canonical"],
            &[],
        ),
        (
            "static: target ports default to the service port; location changes nothing",
            json!({"spec": {"hosts": ["a.example.com"], "addresses": ["1.2.3.4"], "resolution": "STATIC",
                "location": "MESH_INTERNAL",
                "ports": [{"number": 80, "name": "http"}, {"number": 443, "targetPort": 8443, "protocol": "TLS"}],
                "endpoints": [{"address": "2.3.4.5"}, {"address": "3.4.5.6"}]}}),
            &["a.example.com [1.2.3.4] [80->80,443->8443] - 2 endpoint(s) canonical"],
            &[
                "cluster0/networking.istio.io/ServiceEntry/ns/se/2.3.4.5 2.3.4.5",
                "cluster0/networking.istio.io/ServiceEntry/ns/se/3.4.5.6 3.4.5.6",
            ],
        ),
        (
            "dns with endpoints: a non-IP endpoint address is a hostname",
            json!({"spec": {"hosts": ["a.example.com"], "resolution": "DNS",
                "endpoints": [{"address": "backend.example.com", "weight": 3}]}}),
            &["a.example.com [] [80->80] - 1 endpoint(s) canonical"],
            &[
                "cluster0/networking.istio.io/ServiceEntry/ns/se/backend.example.com hostname backend.example.com",
            ],
        ),
    ];
    for (case, patch, services, endpoints) in cases {
        let (got_services, got_endpoints, problems) =
            convert_entries(&[kube_service_entry("se", T0, patch)], &[]);
        assert_eq!(got_services, services, "{case}: services");
        assert_eq!(got_endpoints, endpoints, "{case}: endpoints");
        assert_eq!(problems, [], "{case}: problems");
    }
}

#[test]
fn service_entry_objects_that_istiod_refuses_are_left_out_with_their_reason() {
    // (case, patch, reason)
    let cases: [(&str, Value, ProblemReason); 4] = [
        (
            "no hosts",
            json!({"spec": {"hosts": []}}),
            ProblemReason::MissingField {
                field: "spec.hosts",
            },
        ),
        (
            "an unknown resolution",
            json!({"spec": {"hosts": ["a.example.com"], "resolution": "MAGIC"}}),
            ProblemReason::UnknownValue {
                field: "spec.resolution",
                value: "MAGIC".to_owned(),
            },
        ),
        (
            "endpoints and a selector (Istio's validation refuses it)",
            json!({"spec": {"hosts": ["a.example.com"], "workloadSelector": {"labels": {"app": "a"}},
                "endpoints": [{"address": "1.1.1.1"}]}}),
            ProblemReason::EndpointsAndSelector,
        ),
        (
            "an address that does not parse drops every service, as istiod's constructServiceEntries",
            json!({"spec": {"hosts": ["a.example.com"], "addresses": ["not-an-ip"]}}),
            ProblemReason::BadServiceEntryAddress {
                address: "not-an-ip".to_owned(),
            },
        ),
    ];
    for (case, patch, reason) in cases {
        let (services, endpoints, problems) =
            convert_entries(&[kube_service_entry("se", T0, patch)], &[]);
        assert_eq!((services.len(), endpoints.len()), (0, 0), "{case}");
        let reasons: Vec<ProblemReason> = problems.into_iter().map(|p| p.reason).collect();
        assert_eq!(reasons, [reason], "{case}");
    }
}

#[test]
fn service_entry_hosts_go_to_a_kubernetes_service_first_then_to_the_oldest_entry() {
    // istiod's selectWorkloadServices: per namespace a Service wins, else
    // the oldest ServiceEntry; the canonical one is the Service's, else the
    // oldest of all namespaces.
    let spec = json!({"spec": {"hosts": ["shared.example.com", "own.example.com"], "addresses": ["1.2.3.4"],
        "resolution": "STATIC"}});
    let older = kube_service_entry("older", T0, spec.clone());
    let newer = kube_service_entry("newer", "2026-02-01T00:00:00Z", spec);
    let (services, endpoints, problems) = convert_entries(&[newer, older], &[]);
    assert_eq!(
        services,
        [
            "shared.example.com [1.2.3.4] [80->80] - 0 endpoint(s) canonical",
            "own.example.com [1.2.3.4] [80->80] - 0 endpoint(s) canonical",
        ],
        "the older keeps both hosts; the newer none"
    );
    assert_eq!(endpoints.len(), 0);
    let reasons: Vec<String> = problems.iter().map(ToString::to_string).collect();
    assert_eq!(
        reasons,
        [
            "ServiceEntry ns/newer: host shared.example.com is already ServiceEntry older's in this namespace; left out",
            "ServiceEntry ns/newer: host own.example.com is already ServiceEntry older's in this namespace; left out",
        ]
    );

    let kube = Service {
        name: "svc".to_owned(),
        namespace: "other".to_owned(),
        hostname: "shared.example.com".to_owned(),
        vips: Vec::new(),
        ports: BTreeMap::new(),
        selector: None,
        endpoints: None,
        ip_families: crate::IpFamilies::Automatic,
        load_balancing: None,
        canonical: true,
        waypoint: None,
        weighted_waypoints: Vec::new(),
        ingress_use_waypoint: false,
        subject_alt_names: Vec::new(),
        visibility: crate::ServiceVisibility::Public,
    };
    let (services, _, problems) = convert_entries(
        &[kube_service_entry(
            "se",
            T0,
            json!({"spec": {"hosts": ["shared.example.com"], "resolution": "DNS"}}),
        )],
        &[kube],
    );
    assert_eq!(
        services,
        ["shared.example.com [] [80->80] - 1 endpoint(s)"],
        "kept in its own namespace, not canonical: another namespace's Service is"
    );
    assert_eq!(problems, []);
}

#[test]
fn service_entry_endpoints_carry_the_entry_labels_and_their_own_fields() {
    let object = kube_service_entry(
        "se",
        T0,
        json!({"metadata": {"labels": {"app": "ext", "networking.istio.io/tunnel": "http"}},
            "spec": {"hosts": ["a.example.com"], "resolution": "STATIC",
            "endpoints": [{"address": "2.3.4.5", "network": "remote", "locality": "r1/z1",
                "weight": 5, "serviceAccount": "vm", "ports": {"http": 8080}, "labels": {"ignored": "x"}}]}}),
    );
    let outcome = service_entry(&object, None, &ConvertSettings::default());
    let endpoint = &outcome.entry.unwrap().endpoints[0];
    assert_eq!(endpoint.name, "se");
    assert_eq!(endpoint.workload_name, "se");
    assert_eq!(endpoint.labels.get("app").map(String::as_str), Some("ext"));
    assert_eq!(
        endpoint.labels.get("ignored"),
        None,
        "istiod takes the entry's labels"
    );
    assert_eq!(endpoint.protocol, crate::WorkloadProtocol::Hbone);
    assert!(endpoint.native_tunnel);
    assert_eq!(endpoint.network, "remote");
    assert_eq!(endpoint.weight, Some(5));
    assert_eq!(endpoint.service_account, "vm");
    assert_eq!(endpoint.ports.get("http"), Some(&8080));
    assert_eq!(
        endpoint
            .locality
            .as_ref()
            .map(|l| (l.region.as_str(), l.zone.as_str())),
        Some(("r1", "z1"))
    );
    assert_eq!(endpoint.service_entry.as_deref(), Some("se"));
}
