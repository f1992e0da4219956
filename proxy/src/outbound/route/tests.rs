//! The outbound decision, row by row of AMBIENT.md §2.1, with istio/ztunnel's
//! outbound cases (`build_request_*`, AMBIENT.md §2.5 and §3.5) and its
//! weighted waypoint sampling test. A route is written as one line of text,
//! so that each case reads as what the proxy would do.

use std::collections::BTreeMap;
use std::path::Path;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::config::local;
use crate::state::{NetworkAddress, WeightedWaypoint};

mod hostnames;
mod networks;

/// One network (the default one) with the client, plain destinations,
/// workload and service waypoints.
const LOCAL: &str = r#"
workloads:
- uid: client
  name: client
  namespace: default
  serviceAccount: client
  workloadIps: [10.0.0.1]
  protocol: HBONE
  services: {}
- uid: waypoint
  name: waypoint
  namespace: default
  serviceAccount: waypoint
  workloadIps: [10.0.0.10, "fd00::10"]
  protocol: HBONE
  services:
    default/waypoint.default.svc.cluster.local: {15008: 15008}
- uid: canary
  name: canary
  namespace: default
  serviceAccount: canary
  workloadIps: [10.0.0.11]
  protocol: HBONE
  services: {}
- uid: sandwich
  name: sandwich
  namespace: default
  serviceAccount: sandwich
  workloadIps: [10.0.0.12]
  protocol: HBONE
  applicationTunnel: {protocol: PROXY, port: 15088}
  services:
    default/sandwich.default.svc.cluster.local: {}
- uid: behind
  name: behind
  namespace: default
  serviceAccount: behind
  workloadIps: [10.0.0.2]
  protocol: HBONE
  waypoint: {destination: /10.0.0.10}
  services:
    default/waypointed.default.svc.cluster.local: {80: 8080}
- uid: behind-v6
  name: behind-v6
  namespace: default
  serviceAccount: behind
  workloadIps: ["ff06::c3"]
  protocol: HBONE
  waypoint: {destination: /10.0.0.10}
  services: {}
- uid: behind-named
  name: behind-named
  namespace: default
  serviceAccount: behind
  workloadIps: [10.0.0.3, "fd00::3"]
  protocol: HBONE
  waypoint:
    destination: {namespace: default, hostname: waypoint.default.svc.cluster.local}
  services: {}
- uid: behind-lost
  name: behind-lost
  namespace: default
  workloadIps: [10.0.0.4]
  protocol: HBONE
  waypoint: {destination: /10.9.9.9}
  services: {}
- uid: plain
  name: plain
  namespace: default
  serviceAccount: plain
  workloadIps: [10.0.0.5]
  protocol: HBONE
  services:
    default/plain.default.svc.cluster.local: {80: 8080}
- uid: legacy
  name: legacy
  namespace: default
  workloadIps: [10.0.0.6]
  protocol: TCP
  services: {}
- uid: twin
  name: twin
  namespace: default
  workloadIps: [10.0.0.13]
  protocol: TCP
  services: {}
- uid: named
  name: named
  namespace: default
  hostname: db.example
  workloadIps: []
  protocol: HBONE
  services:
    default/named.default.svc.cluster.local: {80: 8080}
- uid: named-tcp
  name: named-tcp
  namespace: default
  hostname: legacy.example
  workloadIps: []
  protocol: TCP
  services:
    default/named-tcp.default.svc.cluster.local: {80: 8080}
services:
- name: shadow
  namespace: default
  hostname: shadow.default.svc.cluster.local
  vips: [/10.0.0.13]
  ports: {80: 8080}
  waypoint: {destination: /10.0.0.10}
- name: named
  namespace: default
  hostname: named.default.svc.cluster.local
  vips: [/10.96.0.11]
  ports: {80: 8080}
- name: named-tcp
  namespace: default
  hostname: named-tcp.default.svc.cluster.local
  vips: [/10.96.0.14, "/fd00:96::14"]
  ports: {80: 8080}
- name: waypoint
  namespace: default
  hostname: waypoint.default.svc.cluster.local
  vips: [/10.96.0.10]
  ports: {15008: 15008}
  subjectAltNames: ["spiffe://cluster.local/ns/default/sa/waypoint-alias"]
- name: sandwich
  namespace: default
  hostname: sandwich.default.svc.cluster.local
  vips: [/10.96.0.12]
  ports: {}
- name: waypointed
  namespace: default
  hostname: waypointed.default.svc.cluster.local
  vips: [/10.96.0.1, "/fd00:96::1"]
  ports: {80: 8080}
  waypoint: {destination: /10.96.0.10}
- name: by-name
  namespace: default
  hostname: by-name.default.svc.cluster.local
  vips: ["/fd00:96::2"]
  ports: {80: 8080}
  waypoint:
    destination: {namespace: default, hostname: waypoint.default.svc.cluster.local}
- name: open
  namespace: default
  hostname: open.default.svc.cluster.local
  vips: [/10.96.0.3]
  ports: {80: 80}
  loadBalancer: {mode: Passthrough}
  waypoint: {destination: /10.0.0.10}
- name: open-plain
  namespace: default
  hostname: open-plain.default.svc.cluster.local
  vips: [/10.96.0.4]
  ports: {80: 80}
  loadBalancer: {mode: Passthrough}
- name: empty
  namespace: default
  hostname: empty.default.svc.cluster.local
  vips: [/10.96.0.5]
  ports: {80: 8080}
- name: split
  namespace: default
  hostname: split.default.svc.cluster.local
  vips: [/10.96.0.6]
  ports: {80: 8080}
  weightedWaypoints:
  - {destination: {destination: /10.0.0.10}, weight: 75}
  - {destination: {destination: /10.0.0.11}, weight: 25}
- name: lost
  namespace: default
  hostname: lost.default.svc.cluster.local
  vips: [/10.96.0.7]
  ports: {80: 8080}
  waypoint: {destination: /10.96.9.9}
- name: plain
  namespace: default
  hostname: plain.default.svc.cluster.local
  vips: [/10.96.0.8]
  ports: {80: 8080}
  subjectAltNames: ["spiffe://cluster.local/ns/default/sa/plain-alias"]
- name: to-sandwich
  namespace: default
  hostname: to-sandwich.default.svc.cluster.local
  vips: [/10.96.0.9]
  ports: {80: 8080}
  waypoint:
    destination: {namespace: default, hostname: sandwich.default.svc.cluster.local}
"#;

fn state(yaml: &str) -> State {
    local::parse(yaml, Path::new("test.yaml"))
        .unwrap()
        .into_state()
}

/// An identity as `namespace/service-account`, the part a case varies.
fn short(identity: &Identity) -> String {
    let uri = identity.to_string();
    uri.trim_start_matches("spiffe://cluster.local/ns/")
        .replacen("/sa/", "/", 1)
}

fn identities(identities: &[Identity]) -> String {
    identities.iter().map(short).collect::<Vec<_>>().join(",")
}

/// A route as one line: what is dialled, with which `:authority`, expecting
/// whom, and through which waypoint or gateway.
fn describe(route: &Route) -> String {
    match route {
        Route::Hbone(hbone) => {
            let via = match &hbone.waypoint {
                Some(waypoint) => format!(" waypoint={waypoint}"),
                None => String::new(),
            };
            format!(
                "hbone {} authority={} expect={} to={}{via}",
                hbone.dial,
                hbone.authority,
                identities(&hbone.expected),
                hbone.workload.uid,
            )
        }
        Route::DoubleHbone(double) => format!(
            "double {} expect={} authority={} inner-expect={} to={}",
            double.dial,
            identities(&double.gateway_expected),
            double.authority,
            identities(&double.expected),
            double.workload.uid,
        ),
        Route::Passthrough {
            target, workload, ..
        } => match workload {
            Some(workload) => format!("tcp {target} to={}", workload.uid),
            None => format!("tcp {target}"),
        },
        Route::Resolve(pending) => format!(
            "resolve {} port={} family-of={} to={}",
            pending.hostname,
            pending.endpoint.port,
            pending.original,
            pending.endpoint.workload.uid,
        ),
        Route::Refuse(refusal) => format!("refuse: {refusal}"),
    }
}

/// Checks each case `(why, source, destination, route)`: the route from
/// the store's workload `source`, its client at its first IP, with pick 0.
fn check(state: &State, cases: &[(&str, &str, &str, &str)]) {
    for (why, source, dst, want) in cases {
        let got = describe(&route_from(state, source, None, dst, 0));
        assert_eq!(got, one_line(want), "{why}");
    }
}

/// A wrapped expectation as the one line [`describe`] writes.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Routes `dst` from the store's workload `source`, its client at its
/// first IP, or at `client_ip` when given.
fn route_from(state: &State, source: &str, client_ip: Option<&str>, dst: &str, pick: u64) -> Route {
    let source = state.workload(source).unwrap();
    let client_ip = match client_ip {
        Some(ip) => ip.parse().unwrap(),
        None => source.addresses[0],
    };
    route(state, source, client_ip, dst.parse().unwrap(), pick)
}

/// Every row of AMBIENT.md §2.1 on one network, each case with its reason.
#[test]
fn each_row_of_the_decision_order_routes_as_istio_does() {
    let state = state(LOCAL);
    let cases: &[(&str, &str, &str, &str)] = &[
        // (why, source, destination, route)
        (
            "row 0: a ztunnel port on loopback is never dialled",
            "client",
            "127.0.0.1:15008",
            "refuse: attempted recursive call to ourselves",
        ),
        (
            "row 0: the outbound listener on IPv6 loopback neither",
            "client",
            "[::1]:15001",
            "refuse: attempted recursive call to ourselves",
        ),
        (
            "row 1: an IP that is both a pod's and a VIP is workload-addressed, so the VIP's \
             waypoint is skipped; row 3 then looks the VIP up first",
            "client",
            "10.0.0.13:80",
            "refuse: no healthy endpoint for service shadow.default.svc.cluster.local",
        ),
        (
            "row 2 (build_request_destination_svc_waypoint): a service's waypoint named by VIP; \
             its endpoint's own workload waypoint is ignored",
            "client",
            "10.96.0.1:80",
            "hbone 10.0.0.10:15008 authority=10.96.0.1:80 \
             expect=default/waypoint,default/waypoint-alias to=waypoint \
             waypoint=/10.96.0.10:15008",
        ),
        (
            "row 2: by hostname, the waypoint's IP family follows the original destination",
            "client",
            "[fd00:96::2]:80",
            "hbone [fd00::10]:15008 authority=[fd00:96::2]:80 \
             expect=default/waypoint,default/waypoint-alias to=waypoint \
             waypoint=default/waypoint.default.svc.cluster.local:15008",
        ),
        (
            "row 2: by VIP, the family is the VIP's, whatever the original's",
            "client",
            "[fd00:96::1]:80",
            "hbone 10.0.0.10:15008 authority=[fd00:96::1]:80 \
             expect=default/waypoint,default/waypoint-alias to=waypoint \
             waypoint=/10.96.0.10:15008",
        ),
        (
            "row 2 (build_request_passthrough_svc_with_waypoint): a Passthrough service's \
             waypoint still takes its traffic",
            "client",
            "10.96.0.3:80",
            "hbone 10.0.0.10:15008 authority=10.96.0.3:80 expect=default/waypoint \
             to=waypoint waypoint=/10.0.0.10:15008",
        ),
        (
            "row 2 (sandwich_waypoint_proxy_protocol): a waypoint service without ports keeps \
             an endpoint with an application tunnel, dialled on the HBONE port",
            "client",
            "10.96.0.9:80",
            "hbone 10.0.0.12:15008 authority=10.96.0.9:80 expect=default/sandwich \
             to=sandwich waypoint=default/sandwich.default.svc.cluster.local:15008",
        ),
        (
            "row 2: a waypoint that names nothing refuses the connection",
            "client",
            "10.96.0.7:80",
            "refuse: unknown waypoint: /10.96.9.9:15008 not found",
        ),
        (
            "row 2: a service sends its waypoint's own traffic back to the waypoint",
            "waypoint",
            "10.96.0.1:80",
            "hbone 10.0.0.10:15008 authority=10.96.0.1:80 \
             expect=default/waypoint,default/waypoint-alias to=waypoint \
             waypoint=/10.96.0.10:15008",
        ),
        (
            "row 3 (build_request_empty_service): a service with no endpoint is refused",
            "client",
            "10.96.0.5:80",
            "refuse: no healthy endpoint for service empty.default.svc.cluster.local",
        ),
        (
            "row 3: a Passthrough service without waypoint goes to its VIP as it is",
            "client",
            "10.96.0.4:80",
            "tcp 10.96.0.4:80",
        ),
        (
            "row 3: an address nothing knows goes through as plain TCP",
            "client",
            "192.0.2.1:443",
            "tcp 192.0.2.1:443",
        ),
        (
            "row 3: so does loopback on any other port",
            "client",
            "127.0.0.1:8080",
            "tcp 127.0.0.1:8080",
        ),
        (
            "row 5 (build_request_destination_waypoint): a pod IP goes to its workload waypoint",
            "client",
            "10.0.0.2:80",
            "hbone 10.0.0.10:15008 authority=10.0.0.2:80 expect=default/waypoint \
             to=waypoint waypoint=/10.0.0.10:15008",
        ),
        (
            "row 5 (build_request_destination_waypoint_mismatch_ip): an IPv6 pod behind a \
             waypoint named by IPv4 is reached over IPv4",
            "client",
            "[ff06::c3]:80",
            "hbone 10.0.0.10:15008 authority=[ff06::c3]:80 expect=default/waypoint \
             to=waypoint waypoint=/10.0.0.10:15008",
        ),
        (
            "row 5: a waypoint named by service: its endpoint, SANs and identity",
            "client",
            "10.0.0.3:80",
            "hbone 10.0.0.10:15008 authority=10.0.0.3:80 \
             expect=default/waypoint,default/waypoint-alias to=waypoint \
             waypoint=default/waypoint.default.svc.cluster.local:15008",
        ),
        (
            "row 5: a workload waypoint that names nothing refuses the connection",
            "client",
            "10.0.0.4:80",
            "refuse: unknown waypoint: /10.9.9.9:15008 not found",
        ),
        (
            "row 5 (build_request_source_waypoint): the waypoint sends on to the pod itself",
            "waypoint",
            "10.0.0.2:80",
            "hbone 10.0.0.2:15008 authority=10.0.0.2:80 expect=default/behind to=behind",
        ),
        (
            "row 5: the waypoint named by service, too, through its endpoints",
            "waypoint",
            "10.0.0.3:80",
            "hbone 10.0.0.3:15008 authority=10.0.0.3:80 expect=default/behind to=behind-named",
        ),
        (
            "row 6: a pod IP without waypoint: its ztunnel, its identity",
            "client",
            "10.0.0.5:8080",
            "hbone 10.0.0.5:15008 authority=10.0.0.5:8080 expect=default/plain to=plain",
        ),
        (
            "row 6: a VIP without waypoint: an endpoint at its target port, \
             identity and service SANs",
            "client",
            "10.96.0.8:80",
            "hbone 10.0.0.5:15008 authority=10.0.0.5:8080 \
             expect=default/plain,default/plain-alias to=plain",
        ),
        (
            "row 6: a workload outside the mesh gets plain TCP",
            "client",
            "10.0.0.6:9000",
            "tcp 10.0.0.6:9000 to=legacy",
        ),
        (
            "row 6: an endpoint known by hostname only is looked up first, at its target port",
            "client",
            "10.96.0.11:80",
            "resolve db.example port=8080 family-of=10.96.0.11 to=named",
        ),
        (
            "row 6: so is one that takes plain TCP, the family the original's",
            "client",
            "[fd00:96::14]:80",
            "resolve legacy.example port=8080 family-of=fd00:96::14 to=named-tcp",
        ),
        (
            "row 6: a non-loopback address on a ztunnel port is tunnelled; the peer refuses it",
            "client",
            "10.0.0.5:15008",
            "hbone 10.0.0.5:15008 authority=10.0.0.5:15008 expect=default/plain to=plain",
        ),
    ];
    check(&state, cases);
}

#[test]
fn a_client_is_its_destinations_waypoint_only_with_both_its_identity_and_its_ip() {
    let state = state(LOCAL);
    // The waypoint's identity from another IP (another pod of its service
    // account, say) is an ordinary client, sent to the waypoint.
    let stranger = route_from(&state, "waypoint", Some("10.0.0.99"), "10.0.0.2:80", 0);
    let Route::Hbone(hop) = &stranger else {
        panic!("{stranger:?}");
    };
    assert_eq!(hop.dial, "10.0.0.10:15008".parse().unwrap());
    assert!(hop.waypoint.is_some());
    // The waypoint's IP with another identity is no waypoint either.
    let impostor = route_from(&state, "client", Some("10.0.0.10"), "10.0.0.2:80", 0);
    assert_eq!(describe(&impostor), describe(&stranger));
    // Its own IPv6 address counts as its own.
    let own = route_from(&state, "waypoint", Some("fd00::10"), "10.0.0.2:80", 0);
    assert_eq!(
        describe(&own),
        "hbone 10.0.0.2:15008 authority=10.0.0.2:80 expect=default/behind to=behind"
    );
}

#[test]
fn a_split_service_sends_each_connection_to_one_of_its_weighted_waypoints() {
    let state = state(LOCAL);
    let mut seen = BTreeMap::new();
    let mut rng = StdRng::seed_from_u64(27);
    for _ in 0..1000 {
        let Route::Hbone(hop) = route_from(&state, "client", None, "10.96.0.6:80", rng.random())
        else {
            panic!("a split service tunnels to a waypoint");
        };
        assert_eq!(hop.authority, "10.96.0.6:80".parse().unwrap());
        *seen.entry(hop.dial.to_string()).or_insert(0) += 1;
    }
    let dials: Vec<_> = seen.keys().map(String::as_str).collect();
    assert_eq!(dials, ["10.0.0.10:15008", "10.0.0.11:15008"]);
}

fn weighted(weights: &[u32]) -> Service {
    let ip = |last: u8| std::net::IpAddr::from([10, 0, 0, last]);
    let by_address = |last: u8| GatewayAddress {
        destination: GatewayDestination::Address(NetworkAddress {
            network: "".into(),
            address: ip(last),
        }),
        hbone_mtls_port: HBONE_PORT,
    };
    let mut service = Service::for_test("default", "split", &[ip(200)], &[(80, 8080)]);
    service.waypoint = Some(by_address(100));
    service.weighted_waypoints = weights
        .iter()
        .zip(1..)
        .map(|(weight, last)| WeightedWaypoint {
            destination: by_address(last),
            weight: *weight,
        })
        .collect();
    service
}

/// Which waypoint (the last byte of its address) `pick` samples.
fn sampled(service: &Service, pick: u64) -> Option<u8> {
    sample_waypoint(service, pick).map(|waypoint| match &waypoint.destination {
        GatewayDestination::Address(address) => match address.address {
            std::net::IpAddr::V4(v4) => v4.octets()[3],
            std::net::IpAddr::V6(_) => unreachable!(),
        },
        GatewayDestination::Hostname(_) => unreachable!(),
    })
}

/// istio/ztunnel's `test_sample_weighted_waypoint`.
#[test]
fn weighted_waypoints_are_sampled_in_proportion_to_their_weights() {
    let mut rng = StdRng::seed_from_u64(75);
    let picks: Vec<u64> = (0..10_000).map(|_| rng.random()).collect();
    let always = |service: &Service, want: Option<u8>, why: &str| {
        for pick in &picks {
            assert_eq!(sampled(service, *pick), want, "{why}, pick {pick}");
        }
    };
    always(
        &weighted(&[100, 0]),
        Some(1),
        "[100, 0]: always the primary",
    );
    always(&weighted(&[0, 100]), Some(2), "[0, 100]: always the canary");
    always(
        &weighted(&[0, 0]),
        Some(100),
        "all 0: the service's waypoint",
    );
    always(&weighted(&[]), Some(100), "none: the service's waypoint");
    let mut bare = weighted(&[0, 0]);
    bare.waypoint = None;
    always(&bare, None, "all 0 and no waypoint: none");

    let split = weighted(&[75, 25]);
    let primary = picks
        .iter()
        .filter(|pick| sampled(&split, **pick) == Some(1))
        .count();
    // 75 % of 10,000 draws: 7,500, with a standard deviation of 43; the
    // bounds are over 4.5 deviations away, so a fair sampler fails them
    // about once in 100,000 seeds.
    assert!((7_300..=7_700).contains(&primary), "{primary} of 10000");
}

#[test]
fn the_draw_for_an_endpoint_does_not_follow_the_draw_for_a_waypoint() {
    // Consecutive picks land far apart, and never on themselves.
    let draws: Vec<u64> = (0..64).map(second_draw).collect();
    for (pick, draw) in draws.iter().enumerate() {
        assert_ne!(*draw, pick as u64);
        assert_eq!(draws.iter().filter(|other| *other == draw).count(), 1);
    }
    // Even and odd picks give both parities: a two-endpoint waypoint
    // service behind a 50/50 split gets both halves of each.
    let parity = |start: u64| {
        (start..1000)
            .step_by(2)
            .map(|pick| second_draw(pick) % 2)
            .sum::<u64>()
    };
    assert!((200..=300).contains(&parity(0)), "{}", parity(0));
    assert!((200..=300).contains(&parity(1)), "{}", parity(1));
}
