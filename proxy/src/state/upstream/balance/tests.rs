//! Ranking, the modes' cut and the weighted pick, one table each.

use super::*;
use crate::state::workload::{Locality, WorkloadGroup};

use LoadBalancingMode::{Failover, Passthrough, Standard, Strict};
use RoutingScope::{Cluster, Network, Node, Region, Subzone, Zone};

/// A workload at `network`/`region`/`zone`/`subzone`, on `node` of
/// `cluster` ("" keeps the default cluster), with `capacity`.
fn at(uid: &str, place: [&str; 6], capacity: u32) -> Arc<Workload> {
    let [network, region, zone, subzone, node, cluster] = place;
    let mut workload = Workload::for_test(uid, "default", &[]);
    workload.network = network.into();
    workload.node = node.into();
    let mut group = WorkloadGroup {
        locality: Locality {
            region: region.into(),
            zone: zone.into(),
            subzone: subzone.into(),
        },
        ..WorkloadGroup::default()
    };
    if !cluster.is_empty() {
        group.cluster_id = cluster.into();
    }
    workload.group = Arc::new(group);
    workload.capacity = capacity;
    Arc::new(workload)
}

const CLIENT: [&str; 6] = ["net", "reg", "zone", "sub", "node", "c1"];

/// Why; preferences; the endpoint's place; scopes matched; total rank.
type RankRow<'a> = (&'a str, &'a [RoutingScope], [&'a str; 6], usize, usize);
/// Why; mode; preferences; candidates; the uids kept.
type PreferredRow<'a> = (
    &'a str,
    LoadBalancingMode,
    &'a [RoutingScope],
    &'a [&'a Arc<Workload>],
    &'a [&'a str],
);
/// Why; candidates; pick; the uid picked.
type WeightedRow<'a> = (&'a str, &'a [&'a Arc<Workload>], u64, Option<&'a str>);

#[test]
fn rank_table() {
    let preferred_close = [Network, Region, Zone];
    #[rustfmt::skip]
    let cases: &[RankRow] = &[
        ("network first: all match = len + len-1", &preferred_close, CLIENT, 3, 5),
        ("network first: network and region = 4", &preferred_close, ["net", "reg", "other", "sub", "node", "c1"], 2, 4),
        ("network first: network only = 3", &preferred_close, ["net", "other", "zone", "sub", "node", "c1"], 1, 3),
        ("network first: a remote region and zone = 2", &preferred_close, ["far", "reg", "zone", "sub", "node", "c1"], 2, 2),
        ("network first: a remote region = 1", &preferred_close, ["far", "reg", "other", "sub", "node", "c1"], 1, 1),
        ("network first: nothing = 0", &preferred_close, ["far", "other", "zone", "sub", "node", "c1"], 0, 0),
        ("network elsewhere is an ordinary scope that stops the walk", &[Region, Network, Zone], ["far", "reg", "zone", "sub", "node", "c1"], 1, 1),
        ("network elsewhere matching counts 1, no bonus", &[Region, Network, Zone], CLIENT, 3, 3),
        ("the first mismatch stops the walk", &[Region, Zone, Subzone], ["net", "other", "zone", "sub", "node", "c1"], 0, 0),
        ("a later mismatch keeps what matched before it", &[Region, Zone, Subzone], ["net", "reg", "zone", "other", "node", "c1"], 2, 2),
        ("node", &[Node], CLIENT, 1, 1),
        ("another node", &[Node], ["net", "reg", "zone", "sub", "node-2", "c1"], 0, 0),
        ("cluster", &[Cluster], CLIENT, 1, 1),
        ("another cluster", &[Cluster], ["net", "reg", "zone", "sub", "node", "c2"], 0, 0),
        ("no scopes rank everything 0", &[], ["far", "x", "y", "z", "n", "c9"], 0, 0),
        ("network alone first, matching: 1 + 0", &[Network], CLIENT, 1, 1),
        ("network alone first, not matching", &[Network], ["far", "reg", "zone", "sub", "node", "c1"], 0, 0),
    ];
    let client = at("client", CLIENT, 1);
    for (why, preferences, place, matched, total) in cases {
        let endpoint = at("endpoint", *place, 1);
        let got = rank(preferences, &client, &endpoint);
        assert_eq!((got.matched, got.total()), (*matched, *total), "{why}");
    }
}

#[test]
fn empty_equals_empty_counts_as_a_match() {
    let client = at("client", ["", "", "", "", "", ""], 1);
    let endpoint = at("endpoint", ["", "", "", "", "", ""], 1);
    let all = rank(
        &[Network, Region, Zone, Subzone, Node, Cluster],
        &client,
        &endpoint,
    );
    assert_eq!((all.matched, all.total()), (6, 11));
    let located = at("located", ["", "reg", "", "", "", ""], 1);
    assert_eq!(rank(&[Region], &client, &located).matched, 0);
}

#[test]
fn preferred_table() {
    let same_zone = at("same-zone", CLIENT, 1);
    let same_region = at(
        "same-region",
        ["net", "reg", "other", "sub", "node", "c1"],
        1,
    );
    let same_network = at(
        "same-network",
        ["net", "other", "x", "sub", "node", "c1"],
        1,
    );
    let remote_zone = at(
        "remote-zone",
        ["far", "reg", "zone", "sub", "node", "c1"],
        1,
    );
    let all = [&same_zone, &same_region, &same_network, &remote_zone];
    let close: &[RoutingScope] = &[Network, Region, Zone];
    #[rustfmt::skip]
    let cases: &[PreferredRow] = &[
        ("standard ignores preferences", Standard, close, &all, &["same-zone", "same-region", "same-network", "remote-zone"]),
        ("strict keeps only full matches", Strict, close, &all, &["same-zone"]),
        ("strict with no full match keeps nothing", Strict, close, &[&same_region, &remote_zone], &[]),
        ("failover keeps the best rank", Failover, close, &all, &["same-zone"]),
        ("failover falls back to the next rank", Failover, close, &[&same_region, &same_network, &remote_zone], &["same-region"]),
        ("failover prefers the own network over a remote zone match", Failover, close, &[&same_network, &remote_zone], &["same-network"]),
        ("failover leaves the network last", Failover, close, &[&remote_zone], &["remote-zone"]),
        ("failover with no scopes keeps all", Failover, &[], &all, &["same-zone", "same-region", "same-network", "remote-zone"]),
        ("strict with no scopes keeps all", Strict, &[], &all, &["same-zone", "same-region", "same-network", "remote-zone"]),
        ("passthrough, reached by hostname, ranks as failover", Passthrough, close, &all, &["same-zone"]),
        ("no candidates, none kept", Failover, close, &[], &[]),
    ];
    let client = at("client", CLIENT, 1);
    for (why, mode, preferences, candidates, want) in cases {
        let kept = preferred(*mode, preferences, &client, candidates.to_vec());
        let kept: Vec<&str> = kept.iter().map(|endpoint| &*endpoint.uid).collect();
        assert_eq!(kept, *want, "{why}");
    }
}

#[test]
fn weighted_table() {
    let one = at("one", CLIENT, 1);
    let three = at("three", CLIENT, 3);
    let zero = at("zero", CLIENT, 0);
    #[rustfmt::skip]
    let cases: &[WeightedRow] = &[
        ("first unit of weight", &[&one, &three], 0, Some("one")),
        ("the rest belongs to the heavier one", &[&one, &three], 1, Some("three")),
        ("its last unit", &[&one, &three], 3, Some("three")),
        ("the pick wraps around the total", &[&one, &three], 4, Some("one")),
        ("a weight of 0 is skipped", &[&zero, &one], 0, Some("one")),
        ("a weight of 0 is never picked", &[&one, &zero], 1, Some("one")),
        ("all weights 0, none", &[&zero, &zero], 5, None),
        ("no candidates, none", &[], 0, None),
        ("the largest pick still lands", &[&one, &three], u64::MAX, Some("three")),
    ];
    for (why, candidates, pick, want) in cases {
        let got = weighted(candidates, *pick).map(|endpoint| &*endpoint.uid);
        assert_eq!(got, *want, "{why}");
    }
}
