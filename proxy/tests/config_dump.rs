#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test
//! `/config_dump`'s `workloadState` of a shared-mode ztunnel with real
//! sockets: a pod holding a connection to another lists it as outbound,
//! and the other lists it as inbound, each with its addresses and how it
//! is carried (AMBIENT.md §6.6). The rendering itself is tested in
//! `app/dump/tests.rs`. Needs root, `ip`, `iptables` and
//! containernetworking-plugins; skips with the reason otherwise.

use std::net::{IpAddr, SocketAddr};

use serde_json::Value;
use ztunnel_test_support::cluster::Cluster;

use support::{APP_PORT, HBONE_PORT, eventually, hold, logs, one_node};

#[path = "support/cluster.rs"]
mod support;

/// `pod`'s connections in one direction, as node-a's `/config_dump` lists
/// them; empty when the dump or the pod's entry is missing.
fn listed(cluster: &Cluster, pod: &str, direction: &str) -> Vec<Value> {
    let uid = cluster.pod(pod).unwrap().spec.uid();
    let Ok((200, body)) = cluster
        .node("node-a")
        .unwrap()
        .http_get(15000, "/config_dump")
    else {
        return Vec::new();
    };
    let dump: Value = serde_json::from_str(&body).unwrap();
    match &dump["workloadState"][uid.as_str()]["connections"][direction] {
        Value::Array(items) => items.clone(),
        _ => Vec::new(),
    }
}

/// Whether `item` has these values; `src_ip` is compared without the port.
fn item_is(
    item: &Value,
    src_ip: IpAddr,
    original_dst: Option<SocketAddr>,
    actual_dst: SocketAddr,
    protocol: &str,
) -> bool {
    let src = item["src"]
        .as_str()
        .and_then(|src| src.parse::<SocketAddr>().ok());
    let original = original_dst.map_or(Value::Null, |addr| Value::from(addr.to_string()));
    src.is_some_and(|src| src.ip() == src_ip)
        && item["originalDst"] == original
        && item["actualDst"] == actual_dst.to_string()
        && item["protocol"] == protocol
}

#[test]
fn a_held_connection_is_listed_outbound_in_the_client_and_inbound_in_the_server() {
    let Some(cluster) = one_node(
        "the config_dump connections test",
        // Over HBONE between the node's two meshed pods, as between two
        // nodes, so that both ends show the tunnel.
        &[("SAME_NODE_SHORTCUT", "false")],
    ) else {
        return;
    };
    let client = IpAddr::from(cluster.pod("client").unwrap().ip);
    let server = cluster.pod("server").unwrap().ip;
    let app = SocketAddr::from((server, APP_PORT));
    let _held = hold(&cluster, "client", app);

    let tunnel = SocketAddr::from((server, HBONE_PORT));
    assert!(
        eventually(|| listed(&cluster, "client", "outbound")
            .iter()
            .any(|item| item_is(item, client, Some(app), tunnel, "HBONE"))),
        "the client lists its outbound HBONE connection: {:?}\n{}",
        listed(&cluster, "client", "outbound"),
        logs(&cluster)
    );
    assert!(
        eventually(|| listed(&cluster, "server", "inbound")
            .iter()
            .any(|item| item_is(item, client, Some(app), app, "HBONE"))),
        "the server lists its inbound HBONE connection: {:?}\n{}",
        listed(&cluster, "server", "inbound"),
        logs(&cluster)
    );
}
