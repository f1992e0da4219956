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

use support::{APP_PORT, HBONE_PORT, PATIENCE, delivered_over_mtls, eventually, logs, metric};

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

/// The east-west gateway of net-b, in its pod, passing the service's
/// inner tunnels to the server's ztunnel.
fn start_gateway(cluster: &Cluster) -> EastWestGateway {
    let gateway_pod = cluster.pod("eastwest-0").unwrap();
    let server = cluster.pod("server-b").unwrap();
    EastWestGateway::start_in(
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
    .unwrap()
}

/// Names the gateway pod as net-b's gateway, and waits until the
/// service is reached through it.
fn open_the_gateway(cluster: &mut Cluster) {
    let entry = gateway_entry(cluster);
    cluster.mesh().set_network_gateways(&entry).unwrap();
    assert!(
        eventually(|| echoes(cluster)),
        "the service is reached through the gateway:\n{}",
        logs(cluster)
    );
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
    let gateway = start_gateway(&cluster);
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

    open_the_gateway(&mut cluster);
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

#[test]
fn baggage_names_both_ends_of_a_connection_through_an_east_west_gateway() {
    let Some(mut cluster) = start("networks-baggage") else {
        return;
    };
    let _gateway = start_gateway(&cluster);
    open_the_gateway(&mut cluster);
    let opened = "istio_tcp_connections_opened_total";
    let client = cluster.pod("client").unwrap().spec.identity();
    let gateway_ip = cluster.pod("eastwest-0").unwrap().ip.to_string();

    // The receiver does not look the source up by address (it is the
    // gateway's): the client's baggage names it, beside the identity its
    // certificate proved.
    let principal = format!("source_principal=\"{client}\"");
    let named_by_baggage = [
        "reporter=\"destination\"",
        "source_workload=\"client\"",
        "source_workload_namespace=\"default\"",
        "source_canonical_service=\"client\"",
        &principal,
        "destination_workload=\"server-b\"",
    ];
    assert!(
        metric(&cluster, "node-b", opened, &named_by_baggage) > 0.0,
        "node-b names the client from its baggage:\n{}",
        cluster
            .node("node-b")
            .unwrap()
            .http_get(15020, "/metrics")
            .unwrap()
            .1
    );
    let gateway_ip = format!("{gateway_ip}:");
    let entries = cluster.node("node-b").unwrap().access_log();
    assert!(
        entries.iter().any(|entry| entry.direction == "inbound"
            && entry.src_workload.as_deref() == Some("client")
            && entry.src_addr.starts_with(&gateway_ip)),
        "the access log names the client by its baggage, at the gateway's address: {entries:?}"
    );

    // The sender names the far end by what its 200 said through the
    // gateway.
    let named_by_answer = [
        "reporter=\"source\"",
        "source_workload=\"client\"",
        "destination_workload=\"server-b\"",
        "destination_workload_namespace=\"default\"",
    ];
    assert!(metric(&cluster, "node-a", opened, &named_by_answer) > 0.0);
}
