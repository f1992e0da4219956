//! Upstream selection tables.

use std::net::{IpAddr, SocketAddr};

use super::*;
use crate::state::{Cidr, NamespacedHostname, NetworkCidr, NetworkMode, Service, Workload};
use crate::state::{HealthPolicy, LoadBalancing};

const SVC: &str = "default/echo.default.svc.cluster.local";

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

fn addr(text: &str) -> SocketAddr {
    text.parse().unwrap()
}

fn key(text: &str) -> NamespacedHostname {
    text.parse().unwrap()
}

/// An endpoint of `SVC` with the given own port map.
fn endpoint(uid: &str, ips: &[&str], ports: &[(u16, u16)]) -> Workload {
    let ips: Vec<IpAddr> = ips.iter().map(|text| ip(text)).collect();
    let mut workload = Workload::for_test(uid, "default", &ips);
    workload
        .services
        .insert(key(SVC), ports.iter().copied().collect());
    workload
}

/// A mesh with:
/// - `pod-a` 10.0.0.1 and `pod-b` 10.0.0.2, healthy endpoints of `echo`
///   (80 → 8080; `pod-b` maps 80 → 9090 itself); `pod-u` 10.0.0.3 unhealthy;
/// - `pod-far` 10.0.0.4 on network `far`, an endpoint too;
/// - `echo` VIP 10.96.0.1 and fd00::1, ports 80→8080, 81→0, 90→9000;
/// - `host` 10.0.0.9 on the host network, `plain` 10.0.0.5 not in any service;
/// - `empty` VIP 10.96.0.2 with no endpoints; `lonely` VIP 10.96.0.3 with only `pod-u`;
/// - `range` CIDR VIP 10.128.0.0/16 with endpoint `pod-r` 10.0.1.1.
fn mesh() -> State {
    let mut state = State::new();
    state.insert_service(Service::for_test(
        "default",
        "echo.default.svc.cluster.local",
        &[ip("10.96.0.1"), ip("fd00::1")],
        &[(80, 8080), (81, 0), (90, 9000)],
    ));
    state.insert_service(Service::for_test(
        "default",
        "empty.default.svc.cluster.local",
        &[ip("10.96.0.2")],
        &[(80, 80)],
    ));
    state.insert_service(Service::for_test(
        "default",
        "lonely.default.svc.cluster.local",
        &[ip("10.96.0.3")],
        &[(80, 80)],
    ));
    let mut range = Service::for_test(
        "default",
        "range.default.svc.cluster.local",
        &[],
        &[(443, 8443)],
    );
    range.cidr_vips.push(NetworkCidr {
        network: "".into(),
        cidr: Cidr::new(ip("10.128.0.0"), 16).unwrap(),
    });
    state.insert_service(range);

    state.insert_workload(endpoint("pod-a", &["10.0.0.1", "fd00::a"], &[]));
    state.insert_workload(endpoint("pod-b", &["10.0.0.2"], &[(80, 9090), (90, 0)]));
    let mut unhealthy = endpoint("pod-u", &["10.0.0.3"], &[]);
    unhealthy.status = HealthStatus::Unhealthy;
    unhealthy.services.insert(
        key("default/lonely.default.svc.cluster.local"),
        Default::default(),
    );
    state.insert_workload(unhealthy);
    let mut far = endpoint("pod-far", &["10.0.0.4"], &[]);
    far.network = "far".into();
    state.insert_workload(far);
    let mut host = Workload::for_test("host", "default", &[ip("10.0.0.9")]);
    host.network_mode = NetworkMode::HostNetwork;
    state.insert_workload(host);
    state.insert_workload(Workload::for_test("plain", "default", &[ip("10.0.0.5")]));
    let mut ranged = Workload::for_test("pod-r", "default", &[ip("10.0.1.1")]);
    ranged.services.insert(
        key("default/range.default.svc.cluster.local"),
        Default::default(),
    );
    state.insert_workload(ranged);
    state
}

/// What a case expects, by names rather than whole values.
#[derive(Debug, PartialEq)]
enum Want {
    Workload {
        uid: String,
        addr: String,
        service: Option<String>,
    },
    NoHealthyEndpoint(String),
    UnknownServicePort(String, u16),
    Unknown,
}

fn to(uid: &str, addr: &str, service: Option<&str>) -> Want {
    Want::Workload {
        uid: uid.into(),
        addr: addr.into(),
        service: service.map(Into::into),
    }
}

fn summarize(destination: &Destination) -> Want {
    match destination {
        Destination::Workload(upstream) => Want::Workload {
            uid: upstream.workload.uid.to_string(),
            addr: upstream.addr.to_string(),
            service: upstream
                .service
                .as_ref()
                .map(|service| service.hostname.to_string()),
        },
        Destination::NoHealthyEndpoint { service } => {
            Want::NoHealthyEndpoint(service.hostname.to_string())
        }
        Destination::UnknownServicePort { service, port } => {
            Want::UnknownServicePort(service.hostname.to_string(), *port)
        }
        Destination::Unknown => Want::Unknown,
    }
}

#[test]
fn selection_table() {
    use Want::*;
    let echo = Some("echo.default.svc.cluster.local");
    #[rustfmt::skip]
    let cases: Vec<(&str, &str, &str, u64, Want)> = vec![
        ("workload IP keeps the port", "", "10.0.0.5:7000", 0, to("plain", "10.0.0.5:7000", None)),
        ("endpoint IP is a workload too", "", "10.0.0.2:80", 0, to("pod-b", "10.0.0.2:80", None)),
        ("IPv4-mapped IPv6 finds the IPv4 workload", "", "[::ffff:10.0.0.5]:7000", 0, to("plain", "10.0.0.5:7000", None)),
        ("workload on another network is unknown here", "", "10.0.0.4:80", 0, Unknown),
        ("workload found on its own network", "far", "10.0.0.4:80", 0, to("pod-far", "10.0.0.4:80", None)),
        ("host-network workload is never looked up by IP", "", "10.0.0.9:80", 0, Unknown),
        ("unknown IP passes through", "", "192.0.2.1:443", 0, Unknown),
        ("VIP maps to the service target port", "", "10.96.0.1:80", 0, to("pod-a", "10.0.0.1:8080", echo)),
        ("endpoint's own port map wins", "", "10.96.0.1:80", 1, to("pod-b", "10.0.0.2:9090", echo)),
        ("pick wraps around the healthy endpoints", "", "10.96.0.1:80", 2, to("pod-a", "10.0.0.1:8080", echo)),
        ("large pick still lands on an endpoint", "", "10.96.0.1:80", u64::MAX, to("pod-b", "10.0.0.2:9090", echo)),
        ("endpoint mapping of 0 falls back to the service's", "", "10.96.0.1:90", 1, to("pod-b", "10.0.0.2:9000", echo)),
        ("target port 0 everywhere keeps the service port", "", "10.96.0.1:81", 0, to("pod-a", "10.0.0.1:81", echo)),
        ("IPv6 VIP picks the endpoint's IPv6 address", "", "[fd00::1]:80", 0, to("pod-a", "[fd00::a]:8080", echo)),
        ("IPv6 VIP falls back to an IPv4-only endpoint", "", "[fd00::1]:80", 1, to("pod-b", "10.0.0.2:9090", echo)),
        ("port the service lacks", "", "10.96.0.1:22", 0, UnknownServicePort("echo.default.svc.cluster.local".into(), 22)),
        ("service without endpoints", "", "10.96.0.2:80", 0, NoHealthyEndpoint("empty.default.svc.cluster.local".into())),
        ("service with only unhealthy endpoints", "", "10.96.0.3:80", 0, NoHealthyEndpoint("lonely.default.svc.cluster.local".into())),
        ("VIP on another network is unknown", "far", "10.96.0.1:80", 0, Unknown),
        ("CIDR VIP reaches its endpoint", "", "10.128.3.4:443", 0, to("pod-r", "10.0.1.1:8443", Some("range.default.svc.cluster.local"))),
        ("outside the CIDR VIP", "", "10.129.0.1:443", 0, Unknown),
    ];
    let state = mesh();
    for (name, network, dst, pick, want) in cases {
        let got = select_upstream(&state, network, addr(dst), pick);
        assert_eq!(summarize(&got), want, "{name}");
    }
}

#[test]
fn unhealthy_endpoints_are_picked_only_when_the_service_allows_all() {
    let mut state = mesh();
    let mut lonely = state
        .service(&key("default/lonely.default.svc.cluster.local"))
        .unwrap()
        .as_ref()
        .clone();
    lonely.load_balancing = Some(LoadBalancing {
        health_policy: HealthPolicy::AllowAll,
        ..Default::default()
    });
    state.insert_service(lonely);
    let got = select_upstream(&state, "", addr("10.96.0.3:80"), 7);
    assert_eq!(
        summarize(&got),
        to(
            "pod-u",
            "10.0.0.3:80",
            Some("lonely.default.svc.cluster.local")
        )
    );
}

#[test]
fn every_healthy_endpoint_gets_picked_and_no_other() {
    let state = mesh();
    let mut seen = std::collections::BTreeSet::new();
    for pick in 0..16 {
        if let Destination::Workload(upstream) =
            select_upstream(&state, "", addr("10.96.0.1:80"), pick)
        {
            seen.insert(upstream.workload.uid.to_string());
        }
    }
    assert_eq!(seen.into_iter().collect::<Vec<_>>(), ["pod-a", "pod-b"]);
}

#[test]
fn expected_identities_are_the_workload_then_the_service_sans() {
    let mut state = mesh();
    let mut echo = state.service(&key(SVC)).unwrap().as_ref().clone();
    echo.subject_alt_names = vec![
        "spiffe://cluster.local/ns/default/sa/default"
            .parse()
            .unwrap(),
        "spiffe://cluster.local/ns/default/sa/echo-canary"
            .parse()
            .unwrap(),
    ];
    state.insert_service(echo);
    let Destination::Workload(upstream) = select_upstream(&state, "", addr("10.96.0.1:80"), 0)
    else {
        panic!("expected a workload");
    };
    let identities: Vec<String> = upstream
        .expected_identities()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        identities,
        [
            "spiffe://cluster.local/ns/default/sa/default",
            "spiffe://cluster.local/ns/default/sa/echo-canary"
        ]
    );

    let Destination::Workload(direct) = select_upstream(&state, "", addr("10.0.0.5:80"), 0) else {
        panic!("expected a workload");
    };
    assert_eq!(direct.expected_identities().len(), 1);
}
