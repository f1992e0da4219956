//! istio/ztunnel's own load-balancing scenarios (AMBIENT.md §4's list),
//! one row each: `state.rs` `test_load_balance`, and from
//! `proxy/outbound.rs` `build_request_target_port`, `service_ip_families`,
//! `multiple_address_workload`, `build_request_passthrough_svc` and the
//! endpoint choice of `build_request_failover_to_remote`.
//!
//! Where istio/ztunnel samples randomly many times and compares the set of
//! endpoints seen, these walk every pick up to a bound instead, so the set
//! is exact.

use std::sync::Arc;

use super::*;
use crate::state::workload::{Locality, WorkloadGroup};
use crate::state::{
    ApplicationTunnel, ApplicationTunnelProtocol, GatewayAddress, GatewayDestination, IpFamilies,
    LoadBalancing, LoadBalancingMode, NetworkAddress, PortMap, RoutingScope,
};

const EXAMPLE: &str = "/example.com";

/// A workload endpoint of `/example.com` with the ports `80 → 80`.
fn member(uid: &str, ips: &[&str], network: &str, locality: [&str; 2]) -> Workload {
    let ips: Vec<IpAddr> = ips.iter().map(|text| ip(text)).collect();
    let mut workload = Workload::for_test(uid, "default", &ips);
    workload.network = network.into();
    workload.group = Arc::new(WorkloadGroup {
        locality: Locality {
            region: locality[0].into(),
            zone: locality[1].into(),
            subzone: "".into(),
        },
        ..WorkloadGroup::default()
    });
    workload
        .services
        .insert(key(EXAMPLE), [(80, 80)].into_iter().collect());
    workload
}

/// `example.com` at VIP 127.0.0.3 (and ::3), port 80 → `target`.
fn example(target: u16, balancing: Option<LoadBalancing>) -> Service {
    let mut service = Service::for_test(
        "",
        "example.com",
        &[ip("127.0.0.3"), ip("::3")],
        &[(80, target)],
    );
    service.load_balancing = balancing;
    service
}

fn preferring(mode: LoadBalancingMode, scopes: &[RoutingScope]) -> Option<LoadBalancing> {
    Some(LoadBalancing {
        routing_preferences: scopes.to_vec(),
        mode,
        ..LoadBalancing::default()
    })
}

fn source(network: &str, locality: [&str; 2]) -> Workload {
    member("source", &[], network, locality)
}

#[test]
fn test_load_balance() {
    use LoadBalancingMode::{Failover, Strict};
    use RoutingScope::{Network, Region, Zone};
    let endpoints = [
        member("wl_no_locality", &["192.168.0.1"], "network", ["", ""]),
        member("wl_match", &["192.168.0.2"], "network", ["reg", "zone"]),
        member(
            "wl_almost",
            &["192.168.0.3"],
            "network",
            ["reg", "not-zone"],
        ),
        member("wl_other", &["192.168.0.5"], "other", ["reg", "zone"]),
        member("wl_empty_ip", &[], "network", ["reg", "zone"]),
    ];
    let state_with = |mode| {
        let mut state = State::new();
        let mut service = example(80, preferring(mode, &[Network, Region, Zone]));
        // istio/ztunnel calls its balancer with the service in hand; here
        // the VIP is looked up on the client's network, so it is on each.
        for network in ["network", "no-match"] {
            service.vips.push(NetworkAddress {
                network: network.into(),
                address: ip("127.0.0.3"),
            });
        }
        state.insert_service(service);
        for endpoint in &endpoints {
            state.insert_workload(endpoint.clone());
        }
        state
    };
    // istio/ztunnel's list also names an endpoint uid with no workload
    // ("ep_almost"); here endpoints are the stored workloads that name the
    // service, so such an entry cannot exist.
    #[rustfmt::skip]
    let cases: &[(&str, LoadBalancingMode, Workload, &[&str])] = &[
        ("strict no match should not select", Strict, source("", ["", ""]), &[]),
        ("strict match", Strict, source("network", ["reg", "zone"]), &["wl_match"]),
        ("failover no match can select any endpoint", Failover, source("no-match", ["no-match", "no-match"]),
            &["wl_almost", "wl_match", "wl_no_locality", "wl_other"]),
        ("failover matches network+region+zone", Failover, source("network", ["reg", "zone"]), &["wl_match"]),
        ("failover matches network+region", Failover, source("network", ["reg", ""]), &["wl_almost", "wl_match"]),
        ("failover matches network", Failover, source("network", ["no-match", "no-match"]),
            &["wl_almost", "wl_match", "wl_no_locality"]),
        ("failover matches region+zone", Failover, source("no-match", ["reg", "zone"]), &["wl_match", "wl_other"]),
        ("failover never selects missing ip", Failover, source("", ["", ""]), &["wl_no_locality"]),
    ];
    for (why, mode, source, want) in cases {
        let state = state_with(*mode);
        assert_eq!(reached(&state, source, "127.0.0.3:80", 64), *want, "{why}");
    }
}

#[test]
fn build_request_target_port() {
    let mut state = State::new();
    // Both ports named: no target port on the service.
    let mut service = example(0, None);
    service.ports.insert(8080, 0);
    state.insert_service(service);
    let mut matching = member("matching-pod", &["127.0.0.2"], "", ["", ""]);
    matching.services = [(key(EXAMPLE), [(80, 1234)].into_iter().collect())]
        .into_iter()
        .collect();
    state.insert_workload(matching);
    // This pod does not have a port 80 defined at all.
    let mut unmatching = member("unmatching-pod", &["127.0.0.4"], "", ["", ""]);
    unmatching.services = [(key(EXAMPLE), [(8080, 9999)].into_iter().collect())]
        .into_iter()
        .collect();
    state.insert_workload(unmatching);
    for pick in 0..8 {
        let got = select_upstream(&state, &client(""), addr("127.0.0.3:80"), pick);
        assert_eq!(
            summarize(&got),
            to("matching-pod", "127.0.0.2:1234", Some("example.com")),
            "pick {pick}"
        );
    }
}

#[test]
fn service_ip_families() {
    let families = |families: IpFamilies| {
        let mut state = State::new();
        let mut service = example(80, None);
        service.ip_families = families;
        state.insert_service(service);
        state.insert_workload(member("dual", &["127.0.0.2", "ff06::c3"], "", ["", ""]));
        state
    };
    #[rustfmt::skip]
    let cases = [
        ("V6 only should always use V6 IP", IpFamilies::Ipv6Only, "127.0.0.3:80", "[ff06::c3]:80"),
        ("V4 only should always use V4 IP", IpFamilies::Ipv4Only, "127.0.0.3:80", "127.0.0.2:80"),
        ("dual stack prefers the original family (IPv4)", IpFamilies::Dual, "127.0.0.3:80", "127.0.0.2:80"),
        ("dual stack prefers the original family (IPv6)", IpFamilies::Dual, "[::3]:80", "[ff06::c3]:80"),
        ("V4 only from an IPv6 VIP", IpFamilies::Ipv4Only, "[::3]:80", "127.0.0.2:80"),
        ("automatic prefers the original family", IpFamilies::Automatic, "[::3]:80", "[ff06::c3]:80"),
    ];
    for (why, family, dst, want) in cases {
        let got = select_upstream(&families(family), &client(""), addr(dst), 0);
        assert_eq!(
            summarize(&got),
            to("dual", want, Some("example.com")),
            "{why}"
        );
    }
}

#[test]
fn multiple_address_workload() {
    let mut state = State::new();
    state.insert_workload(Workload::for_test(
        "test-tcp",
        "ns",
        &[ip("127.0.0.2"), ip("ff06::c3")],
    ));
    for (why, dst) in [
        ("v4 goes to v4", "127.0.0.2:80"),
        ("v6 goes to v6", "[ff06::c3]:80"),
    ] {
        let got = select_upstream(&state, &client(""), addr(dst), 0);
        assert_eq!(summarize(&got), to("test-tcp", dst, None), "{why}");
    }
}

#[test]
fn build_request_passthrough_svc() {
    let mut state = State::new();
    let mut service = Service::for_test(
        "",
        "example.com",
        &[ip("1.2.3.4"), ip("1.5.6.7")],
        &[(80, 80)],
    );
    service.load_balancing = preferring(LoadBalancingMode::Passthrough, &[]);
    state.insert_service(service);
    // An endpoint is never picked for a passthrough service, not even a
    // healthy one.
    state.insert_workload(member("ignored", &["10.0.0.1"], "", ["", ""]));
    for dst in ["1.2.3.4:80", "1.5.6.7:80", "1.2.3.4:22"] {
        let got = select_upstream(&state, &client(""), addr(dst), 0);
        assert_eq!(summarize(&got), Want::Passthrough, "{dst}");
    }
}

#[test]
fn build_request_failover_to_remote() {
    let mut state = State::new();
    state.insert_service(example(
        8080,
        preferring(LoadBalancingMode::Failover, &[RoutingScope::Network]),
    ));
    let mut remote = member("remote-example.com-pod", &[], "remote", ["", ""]);
    remote.network_gateway = Some(Box::new(GatewayAddress {
        destination: GatewayDestination::Address(NetworkAddress {
            network: "remote".into(),
            address: ip("10.22.1.1"),
        }),
        hbone_mtls_port: 15009,
    }));
    state.insert_workload(remote);
    let local = member("local-example.com-pod", &["127.0.0.2"], "", ["", ""]);
    state.insert_workload(local.clone());
    for pick in 0..4 {
        let got = select_upstream(&state, &client(""), addr("127.0.0.3:80"), pick);
        assert_eq!(
            summarize(&got),
            to("local-example.com-pod", "127.0.0.2:80", Some("example.com")),
            "healthy local endpoint first"
        );
    }
    let mut unhealthy = local;
    unhealthy.status = HealthStatus::Unhealthy;
    state.insert_workload(unhealthy);
    for pick in 0..4 {
        let got = select_upstream(&state, &client(""), addr("127.0.0.3:80"), pick);
        assert_eq!(
            summarize(&got),
            to("remote-example.com-pod", "gateway:80", Some("example.com")),
            "local unhealthy: the remote endpoint, through its gateway"
        );
    }
}

#[test]
fn the_chosen_endpoints_address_and_port() {
    let tunnel = |port| {
        Some(ApplicationTunnel {
            protocol: ApplicationTunnelProtocol::Proxy,
            port,
        })
    };
    let mut named = member("named", &["10.0.0.1"], "", ["", ""]);
    named.services = [(key(EXAMPLE), PortMap::new())].into_iter().collect();
    #[rustfmt::skip]
    let cases: Vec<(&str, u16, Workload, Want)> = vec![
        ("the original destination if it is the endpoint's own", 80,
            member("own", &["127.0.0.3"], "", ["", ""]), to("own", "127.0.0.3:80", Some("example.com"))),
        ("a hostname endpoint is resolved by DNS", 80,
            { let mut w = member("dns", &[], "", ["", ""]); w.hostname = "db.example".into(); w },
            to("dns", "hostname:80", Some("example.com"))),
        ("a named port the endpoint does not map, app tunnel or not", 0,
            { let mut w = named.clone(); w.application_tunnel = tunnel(Some(15088)); w },
            Want::NoHealthyEndpoint("example.com".into())),
        ("no IP of a family the service serves", 80,
            member("v4", &["10.0.0.4"], "", ["", ""]), to("v4", "unreachable", Some("example.com"))),
        ("an endpoint with no address at all is no candidate", 80,
            member("nothing", &[], "", ["", ""]), Want::NoHealthyEndpoint("example.com".into())),
    ];
    for (why, target, workload, want) in cases {
        let mut state = State::new();
        let mut service = example(target, None);
        if workload.uid.as_ref() == "v4" {
            service.ip_families = IpFamilies::Ipv6Only;
        }
        state.insert_service(service);
        state.insert_workload(workload);
        let got = select_upstream(&state, &client(""), addr("127.0.0.3:80"), 0);
        assert_eq!(summarize(&got), want, "{why}");
    }
}

#[test]
fn waypoint_resolution_table() {
    let with_tunnel = |port: Option<Option<u16>>| {
        let mut workload = member("waypoint-pod", &["10.0.0.9"], "", ["", ""]);
        workload.services = [(key(EXAMPLE), PortMap::new())].into_iter().collect();
        workload.application_tunnel = port.map(|port| ApplicationTunnel {
            protocol: ApplicationTunnelProtocol::None,
            port,
        });
        workload
    };
    let found = to("waypoint-pod", "10.0.0.9:15008", Some("example.com"));
    let none = Want::NoHealthyEndpoint("example.com".into());
    #[rustfmt::skip]
    let cases: Vec<(&str, bool, Workload, Resolution, Want)> = vec![
        ("a declared port is used as the service's", true, with_tunnel(None), Resolution::Waypoint, found.clone()),
        ("an undeclared port reaches an app tunnel with a port", false, with_tunnel(Some(Some(15088))), Resolution::Waypoint, found.clone()),
        ("an app tunnel without a port has no port to give", false, with_tunnel(Some(None)), Resolution::Waypoint, none.clone()),
        ("no app tunnel, no undeclared port", false, with_tunnel(None), Resolution::Waypoint, none.clone()),
        ("standard resolution never takes an undeclared port", false, with_tunnel(Some(Some(15088))), Resolution::Standard, none),
    ];
    for (why, declared, workload, resolution, want) in cases {
        let mut state = State::new();
        let ports: &[(u16, u16)] = if declared { &[(15008, 15008)] } else { &[] };
        let service = Service::for_test("", "example.com", &[ip("127.0.0.3")], ports);
        state.insert_service(service.clone());
        state.insert_workload(workload);
        let service = Arc::new(service);
        let got = service_endpoint(
            &state,
            &client(""),
            &service,
            addr("127.0.0.3:15008"),
            resolution,
            0,
        );
        assert_eq!(summarize(&got), want, "{why}");
    }
}
