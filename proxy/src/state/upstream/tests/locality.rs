//! Three endpoints in two zones, seen from a client in the first zone:
//! `Failover` keeps traffic in the client's zone until its endpoints are
//! unhealthy, `Strict` never leaves it, and capacities share the traffic
//! over 10,000 picks.
//!
//! The picks come from a seeded generator, so every run sees the same
//! numbers and no test can flake; the statistical bounds say that the
//! shares are right, not merely that this seed happens to pass.

use std::collections::BTreeMap;
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::state::workload::{Locality, WorkloadGroup};
use crate::state::{LoadBalancing, LoadBalancingMode, RoutingScope};

const PICKS: usize = 10_000;
const VIP: &str = "10.96.0.1:80";

/// An endpoint of the service in `zone` of region `eu`, with `capacity`.
fn endpoint_in(uid: &str, ip_text: &str, zone: &str, capacity: u32) -> Workload {
    let mut workload = endpoint(uid, &[ip_text], &[]);
    workload.group = Arc::new(WorkloadGroup {
        locality: Locality {
            region: "eu".into(),
            zone: zone.into(),
            subzone: "".into(),
        },
        ..WorkloadGroup::default()
    });
    workload.capacity = capacity;
    workload
}

/// `a1` (capacity 1) and `a2` (capacity 3) in zone `a`, `b1` in zone `b`,
/// behind a service with `[NETWORK, REGION, ZONE]` preferences in `mode`
/// (istiod's `PreferClose`).
fn two_zones(mode: LoadBalancingMode) -> State {
    let mut state = State::new();
    let mut service = Service::for_test(
        "default",
        "echo.default.svc.cluster.local",
        &[ip("10.96.0.1")],
        &[(80, 8080)],
    );
    service.load_balancing = Some(LoadBalancing {
        routing_preferences: vec![
            RoutingScope::Network,
            RoutingScope::Region,
            RoutingScope::Zone,
        ],
        mode,
        ..LoadBalancing::default()
    });
    state.insert_service(service);
    for workload in endpoints() {
        state.insert_workload(workload);
    }
    state
}

fn endpoints() -> [Workload; 3] {
    [
        endpoint_in("a1", "10.0.0.1", "a", 1),
        endpoint_in("a2", "10.0.0.2", "a", 3),
        endpoint_in("b1", "10.0.0.3", "b", 1),
    ]
}

/// The client, in zone `a`.
fn client_in_zone_a() -> Workload {
    let mut client = client("");
    client.group = Arc::new(WorkloadGroup {
        locality: Locality {
            region: "eu".into(),
            zone: "a".into(),
            subzone: "".into(),
        },
        ..WorkloadGroup::default()
    });
    client
}

/// Pushes `uid` again as unhealthy.
fn make_unhealthy(state: &mut State, uid: &str) {
    let mut workload = endpoints()
        .into_iter()
        .find(|workload| &*workload.uid == uid)
        .unwrap();
    workload.status = HealthStatus::Unhealthy;
    state.insert_workload(workload);
}

/// How many of `PICKS` seeded picks went to each uid; refusals count
/// under "none".
fn tally(state: &State, seed: u64) -> BTreeMap<String, usize> {
    let mut rng = StdRng::seed_from_u64(seed);
    let client = client_in_zone_a();
    let mut counts = BTreeMap::new();
    for _ in 0..PICKS {
        let uid = match select_upstream(state, &client, addr(VIP), rng.random()) {
            Destination::Workload(upstream) => upstream.workload.uid.to_string(),
            _ => "none".to_string(),
        };
        *counts.entry(uid).or_insert(0) += 1;
    }
    counts
}

fn uids(counts: &BTreeMap<String, usize>) -> Vec<&str> {
    counts.keys().map(String::as_str).collect()
}

#[test]
fn failover_keeps_traffic_in_the_clients_zone_until_its_endpoints_are_unhealthy() {
    let mut state = two_zones(LoadBalancingMode::Failover);
    assert_eq!(uids(&tally(&state, 1)), ["a1", "a2"]);
    make_unhealthy(&mut state, "a1");
    assert_eq!(uids(&tally(&state, 2)), ["a2"]);
    make_unhealthy(&mut state, "a2");
    assert_eq!(uids(&tally(&state, 3)), ["b1"], "zone a is gone: zone b");
    // a2 recovers: traffic comes back to the client's zone.
    state.insert_workload(endpoints()[1].clone());
    assert_eq!(uids(&tally(&state, 4)), ["a2"]);
}

#[test]
fn strict_never_leaves_the_clients_zone() {
    let mut state = two_zones(LoadBalancingMode::Strict);
    assert_eq!(uids(&tally(&state, 5)), ["a1", "a2"]);
    make_unhealthy(&mut state, "a1");
    make_unhealthy(&mut state, "a2");
    assert_eq!(
        uids(&tally(&state, 6)),
        ["none"],
        "refused rather than zone b"
    );
}

#[test]
fn standard_mode_ignores_zones() {
    let state = two_zones(LoadBalancingMode::Standard);
    assert_eq!(uids(&tally(&state, 7)), ["a1", "a2", "b1"]);
}

#[test]
fn capacity_weights_hold_over_10000_picks() {
    // Failover within zone a: a1 : a2 = 1 : 3.
    let counts = tally(&two_zones(LoadBalancingMode::Failover), 8);
    assert_within_six_sigma(counts.get("a1").copied().unwrap_or(0), 0.25);
    assert_within_six_sigma(counts.get("a2").copied().unwrap_or(0), 0.75);

    // Standard across both zones: 1 : 3 : 1, checked by chi-square.
    let counts = tally(&two_zones(LoadBalancingMode::Standard), 9);
    let shares = [("a1", 0.2), ("a2", 0.6), ("b1", 0.2)];
    let chi_square: f64 = shares
        .iter()
        .map(|(uid, share)| {
            let expected = share * PICKS as f64;
            let seen = counts.get(*uid).copied().unwrap_or(0) as f64;
            (seen - expected).powi(2) / expected
        })
        .sum();
    // With 2 degrees of freedom, P(chi-square > 30) = e^-15, about 3e-7:
    // a generator that shares by capacity passes for almost every seed.
    assert!(chi_square < 30.0, "chi-square {chi_square} for {counts:?}");

    // An endpoint of capacity 0 takes nothing.
    let mut state = two_zones(LoadBalancingMode::Failover);
    let mut idle = endpoints()[0].clone();
    idle.capacity = 0;
    state.insert_workload(idle);
    assert_eq!(uids(&tally(&state, 10)), ["a2"]);
}

/// `count` of `PICKS` is within six standard deviations of a binomial
/// share `p`: a correct pick fails this with probability about 2e-9.
fn assert_within_six_sigma(count: usize, p: f64) {
    let n = PICKS as f64;
    let sigma = (n * p * (1.0 - p)).sqrt();
    let deviation = (count as f64 - n * p).abs();
    assert!(
        deviation <= 6.0 * sigma,
        "{count} of {PICKS} for a share of {p}: {deviation} > 6 sigma ({sigma})"
    );
}
