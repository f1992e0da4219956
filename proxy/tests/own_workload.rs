#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test
//! ztunnel's own HBONE listener, end to end on the two-node in-pod cluster
//! (`support/cluster.rs`, mesh over xDS): node b's ztunnel, given its pod's
//! service account (`SERVICE_ACCOUNT`, as Istio's chart passes it, beside
//! `POD_NAME` and `POD_NAMESPACE`), serves its own pod, published as an
//! HBONE workload at its address, on 15008 of its own namespace. A meshed
//! client on node a scrapes its 15020 through the mesh: the tunnel ends at
//! that listener with the client's identity verified, and the policies
//! that select the ztunnel pod hold there. Needs root, `ip`, `iptables`
//! and containernetworking-plugins; skips with the reason otherwise.

use std::net::SocketAddr;

use ztunnel_test_support::cluster::Cluster;

use support::{MeshFrom, eventually, logs};

#[path = "support/cluster.rs"]
mod support;

/// ztunnel's metrics port.
const STATS_PORT: u16 = 15020;

/// Whether `pod`'s scrape of node b's ztunnel metrics answers.
fn scraped(cluster: &Cluster, pod: &str) -> bool {
    let stats = SocketAddr::from((cluster.node("node-b").unwrap().ip, STATS_PORT));
    let scrape = cluster
        .pod(pod)
        .unwrap()
        .ns
        .http_get_from(stats, "/metrics");
    scrape.is_ok_and(|(status, body)| status == 200 && body.contains("istio_build"))
}

/// How many of node b's inbound connections reached its own stats port
/// from `pod`'s verified identity.
fn served_as_itself(cluster: &Cluster, pod: &str) -> usize {
    let identity = cluster.pod(pod).unwrap().spec.identity();
    let stats = format!(":{STATS_PORT}");
    cluster
        .node("node-b")
        .unwrap()
        .access_log()
        .iter()
        .filter(|entry| {
            entry.direction == "inbound"
                && entry.dst_workload.as_deref() == Some("ztunnel-node-b")
                && entry.src_identity.as_deref() == Some(identity.as_str())
                && entry.dst_addr.ends_with(&stats)
                && entry.error.is_none()
        })
        .count()
}

#[test]
fn ztunnels_own_workload_is_served_over_hbone_with_its_identity_and_policies() {
    let Some(mut cluster) = support::clients_and_server("own-workload", &[], MeshFrom::File) else {
        return;
    };
    let node_b = cluster.node("node-b").unwrap().ip;
    cluster.set_ztunnel_env("SERVICE_ACCOUNT", "ztunnel");
    cluster.start_ztunnel("node-b").unwrap();
    cluster.node("node-b").unwrap().wait_ready().unwrap();
    cluster
        .mesh()
        .set_ztunnel_workload("node-b", node_b)
        .unwrap();

    // Through the client's ztunnel, over HBONE to node b's own listener,
    // which verified the client and dialled its own stats port.
    assert!(
        eventually(|| scraped(&cluster, "client") && served_as_itself(&cluster, "client") > 0),
        "the client scrapes node b's ztunnel through the mesh:\n{}",
        logs(&cluster)
    );
    let log = cluster.node("node-b").unwrap().ztunnel_log();
    assert!(
        log.contains("serving ztunnel's own workload over HBONE"),
        "{log}"
    );

    // A policy of the ztunnel's namespace denying the client holds at that
    // listener; another identity still scrapes.
    let deny_client = "- name: deny-client\n  namespace: istio-system\n  scope: Namespace\n  action: Deny\n  rules:\n  - - - principals: [!Exact \"cluster.local/ns/default/sa/client\"]\n";
    cluster.mesh().set_policies(deny_client).unwrap();
    assert!(
        eventually(|| !scraped(&cluster, "client")),
        "the DENY policy of istio-system refuses the client at ztunnel's own listener:\n{}",
        logs(&cluster)
    );
    assert!(
        eventually(|| scraped(&cluster, "other") && served_as_itself(&cluster, "other") > 0),
        "another identity is still served:\n{}",
        logs(&cluster)
    );
}
