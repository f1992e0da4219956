#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test
//! Two networks on the two-node in-pod cluster (control plane on its mesh
//! file): node-a's pods on `net-a`, node-b's on `net-b`, each ztunnel with
//! its `NETWORK`. A client on net-a reaches a service whose only endpoint
//! is on net-b through double HBONE (AMBIENT.md §3.4): the outer tunnel
//! ends at an east-west gateway (test-support's, in a pod of net-b), which
//! pipes the inner one, the client's own mTLS, to the endpoint's ztunnel.
//! Without a gateway for net-b the connection is refused with Istio's
//! error.
//!
//! Needs root, `ip`, `iptables` and containernetworking-plugins; skips with
//! the reason otherwise.

use std::collections::HashMap;
use std::net::SocketAddr;

use ztunnel_test_support::cluster::{self, Binaries, Cluster, PodSpec};
use ztunnel_test_support::skip::skip;
use ztunnel_test_support::wait;
use ztunnel_test_support::waypoint::EastWestGateway;

use support::{APP_PORT, HBONE_PORT, PATIENCE, delivered_over_mtls, eventually, logs};

#[path = "support/cluster.rs"]
mod support;

/// The echo service's VIP on the client's network, and its port.
const VIP: &str = "198.19.0.10";
const SERVICE_PORT: u16 = 80;
const HOSTNAME: &str = "echo.default.svc.cluster.local";

fn start(tag: &str) -> Option<Cluster> {
    if let Some(reason) = cluster::unavailable() {
        skip(format_args!("{tag}: {reason}"));
        return None;
    }
    let specs = [
        PodSpec::new("client", "default", "client", "node-a"),
        PodSpec::new("server-b", "default", "server", "node-b"),
        PodSpec::new("eastwest-0", "gw", "eastwest", "node-b"),
    ];
    let binaries = Binaries::from_target_dir().unwrap();
    let mut cluster =
        Cluster::start(&["node-a", "node-b"], &specs, &["default"], binaries).unwrap();
    for (node, network) in [("node-a", "net-a"), ("node-b", "net-b")] {
        cluster.mesh().set_node_network(node, network).unwrap();
        cluster.start_ztunnel(node).unwrap();
    }
    for spec in &specs {
        let pod = cluster.add_pod(spec).unwrap();
        if spec.namespace == "default" {
            pod.serve_echo(APP_PORT).unwrap();
        }
    }
    let server = cluster.pod("server-b").unwrap();
    let services = format!(
        "- name: echo\n  namespace: default\n  hostname: {HOSTNAME}\n  vips: [\"net-a/{VIP}\"]\n  ports: {{{SERVICE_PORT}: {APP_PORT}}}\n  endpoints: [{uid}]\n  subjectAltNames: [\"{identity}\"]\n",
        uid = server.spec.uid(),
        identity = server.spec.identity(),
    );
    cluster.mesh().set_services(&services).unwrap();
    cluster.wait_synced().unwrap();
    Some(cluster)
}

/// The `networkGateways:` entry of the gateway pod, for net-b.
fn gateway_entry(cluster: &Cluster) -> String {
    let gateway = cluster.pod("eastwest-0").unwrap();
    format!(
        "- {{network: net-b, namespace: gw, serviceAccount: eastwest, address: {}, port: {HBONE_PORT}}}\n",
        gateway.ip
    )
}

/// Whether the client's bytes to the service come back.
fn echoes(cluster: &Cluster) -> bool {
    let vip = SocketAddr::new(VIP.parse().unwrap(), SERVICE_PORT);
    cluster.pod("client").unwrap().echoes(vip)
}

#[test]
fn a_service_on_another_network_is_reached_through_its_gateway_and_refused_without_one() {
    let Some(mut cluster) = start("networks") else {
        return;
    };
    let gateway_pod = cluster.pod("eastwest-0").unwrap();
    let server = cluster.pod("server-b").unwrap();
    let gateway = EastWestGateway::start_in(
        &gateway_pod.ns,
        SocketAddr::new(gateway_pod.ip.into(), HBONE_PORT),
        cluster
            .ca()
            .issue(&gateway_pod.spec.identity().parse().unwrap())
            .unwrap(),
        HashMap::from([(
            format!("{HOSTNAME}:{SERVICE_PORT}"),
            SocketAddr::new(server.ip.into(), HBONE_PORT),
        )]),
    )
    .unwrap();
    let client_identity = cluster.pod("client").unwrap().spec.identity();

    // No gateway into net-b yet: the endpoint cannot be reached, and the
    // client's ztunnel says so as istio/ztunnel does.
    assert!(!echoes(&cluster), "no path into net-b without a gateway");
    assert!(
        wait::until(PATIENCE, || cluster
            .node("node-a")
            .unwrap()
            .ztunnel_log()
            .contains("no valid routing destination")),
        "the refusal is logged with Istio's error:\n{}",
        logs(&cluster)
    );
    assert!(gateway.records().is_empty());

    let entry = gateway_entry(&cluster);
    cluster.mesh().set_network_gateways(&entry).unwrap();
    assert!(
        eventually(|| echoes(&cluster)),
        "the service is reached through the gateway:\n{}",
        logs(&cluster)
    );
    let records = gateway.records();
    let record = records.last().unwrap();
    assert_eq!(
        record.authority,
        format!("{HOSTNAME}:{SERVICE_PORT}"),
        "the outer CONNECT names the service"
    );
    assert_eq!(
        record.identity.to_string(),
        client_identity,
        "the outer tunnel carries the client's identity"
    );
    assert!(
        delivered_over_mtls(&cluster, "node-b", "server-b", "client") > 0,
        "the endpoint's ztunnel verified the client itself through the gateway:\n{}",
        logs(&cluster)
    );
    assert_eq!(
        delivered_over_mtls(&cluster, "node-b", "server-b", "eastwest-0"),
        0,
        "the gateway never terminated the inner mTLS"
    );

    // Gone again: refused again.
    cluster.mesh().set_network_gateways("").unwrap();
    assert!(
        eventually(|| !echoes(&cluster)),
        "without the gateway the service is unreachable again"
    );
}
