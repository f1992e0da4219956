//! Upstream selection tables: the store's lookups, the candidates, the
//! port and address of the chosen endpoint. Ranking and the weighted pick
//! are tested on their own in `balance/tests.rs`; istio/ztunnel's
//! load-balancing scenarios and the locality scenario are in
//! `tests/istio.rs` and `tests/locality.rs`.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};

use super::*;
use crate::cidr::Cidr;
use crate::state::{HealthStatus, NamespacedHostname, NetworkCidr, NetworkMode, Service, Workload};

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
#[derive(Clone, Debug, PartialEq)]
enum Want {
    Workload {
        uid: String,
        addr: String,
        service: Option<String>,
    },
    NoHealthyEndpoint(String),
    Passthrough,
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
            addr: match upstream.address {
                EndpointAddress::Ip(ip) => SocketAddr::new(ip, upstream.port).to_string(),
                EndpointAddress::Hostname => format!("hostname:{}", upstream.port),
                EndpointAddress::NetworkGateway => format!("gateway:{}", upstream.port),
                EndpointAddress::Unreachable => "unreachable".into(),
            },
            service: upstream
                .service
                .as_ref()
                .map(|service| service.hostname.to_string()),
        },
        Destination::NoHealthyEndpoint { service } => {
            Want::NoHealthyEndpoint(service.hostname.to_string())
        }
        Destination::Passthrough => Want::Passthrough,
        Destination::Unknown => Want::Unknown,
    }
}

/// A client workload on `network`, with no locality.
fn client(network: &str) -> Workload {
    let mut client = Workload::for_test("client", "default", &[]);
    client.network = network.into();
    client
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
        ("standard mode keeps an endpoint on another network", "", "10.96.0.1:80", 2, to("pod-far", "10.0.0.4:8080", echo)),
        ("pick wraps around the endpoints", "", "10.96.0.1:80", 3, to("pod-a", "10.0.0.1:8080", echo)),
        ("large pick still lands on an endpoint", "", "10.96.0.1:80", u64::MAX, to("pod-a", "10.0.0.1:8080", echo)),
        ("endpoint's own mapping is taken as it came, even 0", "", "10.96.0.1:90", 1, to("pod-b", "10.0.0.2:0", echo)),
        ("an endpoint without its own mapping takes the service's", "", "10.96.0.1:90", 0, to("pod-a", "10.0.0.1:9000", echo)),
        ("named target port that no endpoint maps", "", "10.96.0.1:81", 0, NoHealthyEndpoint("echo.default.svc.cluster.local".into())),
        ("IPv6 VIP picks the endpoint's IPv6 address", "", "[fd00::1]:80", 0, to("pod-a", "[fd00::a]:8080", echo)),
        ("IPv6 VIP falls back to an IPv4-only endpoint", "", "[fd00::1]:80", 1, to("pod-b", "10.0.0.2:9090", echo)),
        ("port the service lacks", "", "10.96.0.1:22", 0, NoHealthyEndpoint("echo.default.svc.cluster.local".into())),
        ("service without endpoints", "", "10.96.0.2:80", 0, NoHealthyEndpoint("empty.default.svc.cluster.local".into())),
        ("service with only unhealthy endpoints", "", "10.96.0.3:80", 0, NoHealthyEndpoint("lonely.default.svc.cluster.local".into())),
        ("VIP on another network is unknown", "far", "10.96.0.1:80", 0, Unknown),
        ("CIDR VIP reaches its endpoint", "", "10.128.3.4:443", 0, to("pod-r", "10.0.1.1:8443", Some("range.default.svc.cluster.local"))),
        ("outside the CIDR VIP", "", "10.129.0.1:443", 0, Unknown),
    ];
    let state = mesh();
    for (name, network, dst, pick, want) in cases {
        let got = select_upstream(&state, &client(network), addr(dst), pick);
        assert_eq!(summarize(&got), want, "{name}");
    }
}

#[test]
fn every_endpoint_is_reached_by_some_pick_and_no_other_workload() {
    let state = mesh();
    let reached = reached(&state, &client(""), "10.96.0.1:80", 16);
    assert_eq!(reached, ["pod-a", "pod-b", "pod-far"]);
}

/// The uids the picks `0..picks` reach at `dst` from `source`, sorted.
fn reached(state: &State, source: &Workload, dst: &str, picks: u64) -> Vec<String> {
    let mut seen = BTreeSet::new();
    for pick in 0..picks {
        if let Destination::Workload(upstream) = select_upstream(state, source, addr(dst), pick) {
            seen.insert(upstream.workload.uid.to_string());
        }
    }
    seen.into_iter().collect()
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
    let Destination::Workload(upstream) =
        select_upstream(&state, &client(""), addr("10.96.0.1:80"), 0)
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

    let Destination::Workload(direct) =
        select_upstream(&state, &client(""), addr("10.0.0.5:80"), 0)
    else {
        panic!("expected a workload");
    };
    assert_eq!(direct.expected_identities().len(), 1);
}

mod istio;
mod locality;
