//! Endpoints known by hostname only (AMBIENT.md §4.6): the route names
//! the hostname to look up, and which of the answered addresses a
//! connection dials, and how, is [`ResolveRoute::resolved`].

use super::*;

/// The route pending the lookup of `dst`'s endpoint, known by hostname.
fn pending(state: &State, dst: &str) -> ResolveRoute {
    match route_from(state, "client", None, dst, 0) {
        Route::Resolve(pending) => pending,
        other => panic!("{dst}: {other:?}"),
    }
}

/// What a connection to an endpoint known by hostname does with the
/// addresses the lookup gave (AMBIENT.md §4.6): one of the original
/// destination's family, else one of the other family, then as an IP
/// endpoint would be dialled.
#[test]
fn a_resolved_hostname_is_dialled_in_the_original_family_as_its_ip_would_be() {
    let state = state(LOCAL);
    let cases: &[(&str, &str, &[&str], u64, &str)] = &[
        // (why, destination, addresses, pick, route)
        (
            "HBONE: the IPv4 address to an IPv4 VIP; its ztunnel, authority ip:target port",
            "10.96.0.11:80",
            &["fd00::1", "10.1.0.1"],
            0,
            "hbone 10.1.0.1:15008 authority=10.1.0.1:8080 expect=default/default to=named",
        ),
        (
            "TCP: the IPv6 address to an IPv6 VIP, dialled at the target port",
            "[fd00:96::14]:80",
            &["10.1.0.2", "fd00::2"],
            0,
            "tcp [fd00::2]:8080 to=named-tcp",
        ),
        (
            "TCP: no address of the original's family, one of the other",
            "[fd00:96::14]:80",
            &["10.1.0.2"],
            7,
            "tcp 10.1.0.2:8080 to=named-tcp",
        ),
        (
            "HBONE: only IPv6 for an IPv4 VIP",
            "10.96.0.11:80",
            &["fd00::1"],
            3,
            "hbone [fd00::1]:15008 authority=[fd00::1]:8080 expect=default/default to=named",
        ),
        (
            "the pick chooses among those of the family: the second IPv4 address",
            "10.96.0.14:80",
            &["10.1.0.3", "fd00::3", "10.1.0.4"],
            1,
            "tcp 10.1.0.4:8080 to=named-tcp",
        ),
        (
            "and wraps around",
            "10.96.0.14:80",
            &["10.1.0.3", "fd00::3", "10.1.0.4"],
            2,
            "tcp 10.1.0.3:8080 to=named-tcp",
        ),
    ];
    for (why, dst, addresses, pick, want) in cases {
        let addresses: Vec<std::net::IpAddr> =
            addresses.iter().map(|ip| ip.parse().unwrap()).collect();
        let direct = pending(&state, dst).resolved(&addresses, *pick);
        let got = direct.map(|direct| describe(&Route::from(direct)));
        assert_eq!(got.as_deref(), Some(*want), "{why}");
    }
    assert_eq!(
        pending(&state, "10.96.0.11:80").resolved(&[], 0),
        None,
        "no address, nothing to dial"
    );
}

#[test]
fn connections_spread_over_every_resolved_address_of_the_family() {
    let state = state(LOCAL);
    let pending = pending(&state, "10.96.0.14:80");
    let addresses: Vec<std::net::IpAddr> = ["10.1.0.1", "fd00::1", "10.1.0.2", "10.1.0.3"]
        .iter()
        .map(|ip| ip.parse().unwrap())
        .collect();
    let mut rng = StdRng::seed_from_u64(46);
    let mut seen = BTreeMap::new();
    for _ in 0..300 {
        let Some(Direct::Tcp { target, .. }) = pending.resolved(&addresses, rng.random()) else {
            panic!("a TCP workload is dialled directly");
        };
        *seen.entry(target.to_string()).or_insert(0) += 1;
    }
    let targets: Vec<_> = seen.keys().map(String::as_str).collect();
    assert_eq!(
        targets,
        ["10.1.0.1:8080", "10.1.0.2:8080", "10.1.0.3:8080"],
        "IPv4 only, each of them"
    );
    assert!(seen.values().all(|count| *count > 50), "{seen:?}");
}
