#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test
//! Waypoints end to end, on the two-node in-pod cluster whose control plane
//! reads a real kube-apiserver (as `kube_cluster.rs`): a Gateway API
//! Gateway of class `istio-waypoint` with its Service, a test-support
//! waypoint (`ztunnel_test_support::waypoint`, there being no Envoy here)
//! running in its pod, and a client namespace labelled
//! `istio.io/use-waypoint`. The client's ztunnel sends service traffic to
//! the waypoint, which applies a rule of its own and forwards it with its
//! own identity; the label removed, traffic goes direct again.
//!
//! Needs root, `ip`, `iptables`, containernetworking-plugins and the built
//! API server; skips with the reason otherwise.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};

use ztunnel_certs::identity::Identity;
use ztunnel_test_support::cluster::{self, Binaries, Cluster, PodSpec};
use ztunnel_test_support::kube::KubeApi;
use ztunnel_test_support::skip::skip;
use ztunnel_test_support::waypoint::{Outcome, Route, Waypoint};

use support::{APP_PORT, HBONE_PORT, delivered_over_mtls, eventually, logs};

#[path = "support/cluster.rs"]
mod support;

/// The namespace of the waypoint: not captured, as Istio's waypoint pods
/// are not.
const WAYPOINT_NAMESPACE: &str = "wp";

/// The waypoint's Gateway, attachable from every namespace, and its
/// Service; the echo Service of the server pods (label `app: server`).
const OBJECTS: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: waypoint, namespace: wp}
spec:
  gatewayClassName: istio-waypoint
  listeners:
  - name: mesh
    port: 15008
    protocol: HBONE
    allowedRoutes: {namespaces: {from: All}}
---
apiVersion: v1
kind: Service
metadata: {name: waypoint, namespace: wp}
spec:
  selector: {app: waypoint}
  ports:
  - {name: mesh, port: 15008, targetPort: 15008}
---
apiVersion: v1
kind: Service
metadata: {name: echo, namespace: default}
spec:
  selector: {app: server}
  ports:
  - {name: tcp-echo, port: 80, targetPort: 8080}
"#;

/// The service port clients dial.
const SERVICE_PORT: u16 = 80;

fn start(tag: &str) -> Option<Cluster> {
    if let Some(reason) = cluster::unavailable() {
        skip(format_args!("{tag}: {reason}"));
        return None;
    }
    let crds = match KubeApi::gateway_api_crds() {
        Ok(crds) => crds,
        Err(reason) => {
            skip(format_args!("{tag}: {reason}"));
            return None;
        }
    };
    let specs = [
        PodSpec::new("client", "default", "client", "node-a"),
        PodSpec::new("other", "default", "other", "node-a"),
        PodSpec::new("server-b", "default", "server", "node-b"),
        PodSpec::new("waypoint-0", WAYPOINT_NAMESPACE, "waypoint", "node-a"),
    ];
    let binaries = Binaries::from_target_dir().unwrap();
    let Some(mut cluster) =
        Cluster::start_on_kubernetes(&["node-a", "node-b"], &specs, &["default"], binaries)
            .unwrap()
    else {
        // Skipped by the API server's start, with the reason.
        return None;
    };
    for spec in &specs {
        let pod = cluster.add_pod(spec).unwrap();
        if spec.namespace == "default" {
            pod.serve_echo(APP_PORT).unwrap();
        }
    }
    let api = cluster.kube().unwrap().api();
    api.install_gateway_api_crds(&crds).unwrap();
    kubectl(&cluster, &["apply", "-f", "-"], Some(OBJECTS));
    cluster.wait_synced().unwrap();
    Some(cluster)
}

fn kubectl(cluster: &Cluster, args: &[&str], stdin: Option<&str>) -> String {
    cluster.kube().unwrap().api().kubectl(args, stdin).unwrap()
}

/// The ClusterIP of Service `default/echo`.
fn echo_vip(cluster: &Cluster) -> IpAddr {
    let ip = kubectl(
        cluster,
        &[
            "get",
            "service",
            "echo",
            "-n",
            "default",
            "-o",
            "jsonpath={.spec.clusterIP}",
        ],
        None,
    );
    ip.trim().parse().unwrap()
}

fn identity(cluster: &Cluster, pod: &str) -> Identity {
    cluster.pod(pod).unwrap().spec.identity().parse().unwrap()
}

/// Labels namespace `default` to use the waypoint, or takes the labels away.
fn use_waypoint(cluster: &Cluster, on: bool) {
    let labels: &[&str] = if on {
        &[
            "istio.io/use-waypoint=waypoint",
            "istio.io/use-waypoint-namespace=wp",
        ]
    } else {
        &["istio.io/use-waypoint-", "istio.io/use-waypoint-namespace-"]
    };
    let mut args = vec!["label", "namespace", "default", "--overwrite"];
    args.extend_from_slice(labels);
    kubectl(cluster, &args, None);
}

/// The Gateway as the API server has it, and node-a's services, for a
/// failure's message.
fn debug_state(cluster: &Cluster) -> String {
    let gateway = cluster
        .kube()
        .unwrap()
        .api()
        .kubectl(&["get", "gateway", "-A", "-o", "yaml"], None)
        .unwrap_or_else(|error| error.to_string());
    let dump = cluster
        .node("node-a")
        .unwrap()
        .http_get(15000, "/config_dump")
        .map(|(_, body)| body)
        .unwrap_or_else(|error| error.to_string());
    format!("--- gateways ---\n{gateway}\n--- node-a config_dump ---\n{dump}")
}

/// Whether `from`'s bytes to `target` come back.
fn echoes_at(cluster: &Cluster, from: &str, target: SocketAddr) -> bool {
    cluster.pod(from).unwrap().echoes(target)
}

#[test]
fn a_namespace_labelled_to_use_a_waypoint_reaches_its_service_only_through_it() {
    let Some(cluster) = start("waypoint") else {
        return;
    };
    let vip = SocketAddr::new(echo_vip(&cluster), SERVICE_PORT);
    let server = cluster.pod("server-b").unwrap();
    let server_app = SocketAddr::new(server.ip.into(), APP_PORT);
    let waypoint_pod = cluster.pod("waypoint-0").unwrap();
    let routes = HashMap::from([(
        vip.to_string(),
        Route {
            dial: SocketAddr::new(server.ip.into(), HBONE_PORT),
            authority: server_app.to_string(),
            identities: vec![identity(&cluster, "server-b")],
        },
    )]);
    let waypoint = Waypoint::start_in(
        &waypoint_pod.ns,
        SocketAddr::new(waypoint_pod.ip.into(), HBONE_PORT),
        cluster
            .ca()
            .issue(&identity(&cluster, "waypoint-0"))
            .unwrap(),
        routes,
    )
    .unwrap();
    let client = identity(&cluster, "client");

    // Without the label the service is reached directly.
    assert!(
        eventually(|| echoes_at(&cluster, "client", vip)),
        "the service echoes without a waypoint:\n{}",
        logs(&cluster)
    );
    assert!(delivered_over_mtls(&cluster, "node-b", "server-b", "client") > 0);
    assert!(
        waypoint.records().is_empty(),
        "nothing went to the waypoint"
    );

    use_waypoint(&cluster, true);
    assert!(
        eventually(|| echoes_at(&cluster, "client", vip) && !waypoint.records().is_empty()),
        "service traffic goes through the waypoint once the namespace is labelled:\n{}\n{}",
        logs(&cluster),
        debug_state(&cluster)
    );
    let through = waypoint.records();
    let record = through.last().unwrap();
    assert_eq!(record.identity, client, "the waypoint saw the client");
    assert_eq!(record.authority, vip.to_string(), "the original VIP:port");
    assert_eq!(record.outcome, Outcome::Forwarded);
    assert!(
        delivered_over_mtls(&cluster, "node-b", "server-b", "waypoint-0") > 0,
        "the server's ztunnel saw the waypoint's identity:\n{}",
        logs(&cluster)
    );

    // From now on every connection to the service goes through it.
    let direct_before = delivered_over_mtls(&cluster, "node-b", "server-b", "client");
    let records_before = waypoint.records().len();
    for _ in 0..3 {
        assert!(echoes_at(&cluster, "client", vip));
    }
    assert_eq!(waypoint.records().len(), records_before + 3);
    assert_eq!(
        delivered_over_mtls(&cluster, "node-b", "server-b", "client"),
        direct_before,
        "no connection from the client reached the server directly"
    );

    // The waypoint binds the service only (waypoint-for defaults to
    // service): the server's pod IP is reached directly.
    assert!(echoes_at(&cluster, "client", server_app));
    assert_eq!(waypoint.records().len(), records_before + 3);
    assert_eq!(
        delivered_over_mtls(&cluster, "node-b", "server-b", "client"),
        direct_before + 1
    );

    // The waypoint's own rule is honoured.
    waypoint.deny(client.clone());
    assert!(
        !echoes_at(&cluster, "client", vip),
        "the waypoint denied the client"
    );
    assert_eq!(
        waypoint.records().last().unwrap().outcome,
        Outcome::Denied,
        "the waypoint recorded the denial"
    );
    assert!(
        echoes_at(&cluster, "other", vip),
        "another identity still passes the waypoint"
    );
    waypoint.allow(&client);

    // The label removed, traffic goes direct again.
    use_waypoint(&cluster, false);
    assert!(
        eventually(|| {
            let records = waypoint.records().len();
            echoes_at(&cluster, "client", vip) && waypoint.records().len() == records
        }),
        "service traffic goes direct once the label is removed:\n{}",
        logs(&cluster)
    );
    assert!(
        delivered_over_mtls(&cluster, "node-b", "server-b", "client") > direct_before + 1,
        "the server saw the client itself again"
    );
}
