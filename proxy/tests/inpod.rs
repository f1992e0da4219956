//! End-to-end tests of the shared (in-pod) mode on a real cluster layout:
//! two nodes with pod bridges made by the real CNI plugins, our CNI plugin
//! chained after them, a node agent and a shared-mode ztunnel per node, and
//! the CA on its own (`ztunnel_test_support::cluster`). Needs root, `ip`,
//! `iptables` and containernetworking-plugins; skips with the reason
//! otherwise.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use ztunnel_test_support::cluster::{self, Binaries, Cluster, PodSpec, tail};
use ztunnel_test_support::wait;

const APP_PORT: u16 = 8080;

const DENY_CLIENT: &str = "\
- name: deny-client
  namespace: default
  scope: Namespace
  action: Deny
  rules:
  - - - principals: [!Exact \"cluster.local/ns/default/sa/client\"]
";

/// The standard cluster: a client and a server on node a, a server on node
/// b, and a pod of a namespace that is not ambient-enabled on node b. `None`
/// (after printing why) where the cluster cannot run.
fn start(tag: &str) -> Option<Cluster> {
    if let Some(reason) = cluster::unavailable() {
        eprintln!("skipping {tag}: {reason}");
        return None;
    }
    let specs = pod_specs();
    let binaries = Binaries::from_target_dir().unwrap();
    let mut cluster =
        Cluster::start(&["node-a", "node-b"], &specs, &["default"], binaries).unwrap();
    for spec in &specs {
        let pod = cluster.add_pod(spec).unwrap();
        pod.serve_echo(APP_PORT).unwrap();
    }
    cluster.wait_synced().unwrap();
    Some(cluster)
}

fn pod_specs() -> Vec<PodSpec> {
    vec![
        PodSpec::new("client", "default", "client", "node-a"),
        PodSpec::new("server-a", "default", "server", "node-a"),
        PodSpec::new("server-b", "default", "server", "node-b"),
        PodSpec::new("plain-b", "legacy", "plain", "node-b"),
    ]
}

fn app(cluster: &Cluster, pod: &str) -> SocketAddr {
    SocketAddr::from((cluster.pod(pod).unwrap().ip, APP_PORT))
}

/// Whether `from` gets its bytes echoed by `to`'s application.
fn echoes(cluster: &Cluster, from: &str, to: &str) -> bool {
    let Ok(client) = cluster.pod(from) else {
        return false;
    };
    matches!(client.exchange(app(cluster, to), b"ping"), Ok(reply) if reply == b"ping")
}

/// Waits up to 20 s for `check`, polling.
fn eventually(check: impl FnMut() -> bool) -> bool {
    wait::until(Duration::from_secs(20), check)
}

/// The inbound "connection complete" access-log lines of a node's ztunnel
/// for traffic to `pod`.
fn inbound_logs(cluster: &Cluster, node: &str, pod: &str) -> Vec<String> {
    let log = cluster.node(node).unwrap().ztunnel_log();
    log.lines()
        .filter(|line| {
            line.contains("connection complete")
                && line.contains("\"direction\":\"inbound\"")
                && line.contains(&format!("\"dst.workload\":\"{pod}\""))
        })
        .map(str::to_owned)
        .collect()
}

/// Whether the connection is closed by the other side within `within`
/// (EOF or reset) without data arriving.
fn closed(stream: &mut TcpStream, within: Duration) -> bool {
    let _ = stream.set_read_timeout(Some(within));
    let mut byte = [0u8; 1];
    matches!(stream.read(&mut byte), Ok(0) | Err(_))
        && stream.read(&mut byte).map_or(true, |read| read == 0)
}

/// An open connection that still echoes.
fn still_echoes(stream: &mut TcpStream) -> bool {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let mut reply = [0u8; 4];
    stream.write_all(b"more").is_ok() && stream.read_exact(&mut reply).is_ok() && &reply == b"more"
}

#[test]
fn pods_talk_over_hbone_within_and_across_nodes_and_deny_policies_apply() {
    let Some(mut cluster) = start("pods_talk_over_hbone") else {
        return;
    };
    let client_identity = cluster.pod("client").unwrap().spec.identity();

    // Across nodes: node b's ztunnel admitted it with the client's identity.
    assert!(echoes(&cluster, "client", "server-b"));
    let logs = inbound_logs(&cluster, "node-b", "server-b");
    assert!(
        logs.iter().any(|line| line.contains(&client_identity)),
        "node-b access log shows the client identity:\n{}",
        tail(&cluster.node("node-b").unwrap().ztunnel_log(), 20)
    );
    let (status, metrics) = cluster
        .node("node-b")
        .unwrap()
        .http_get(15020, "/metrics")
        .unwrap();
    assert_eq!(status, 200);
    assert!(
        metrics.lines().any(|line| {
            line.starts_with("istio_tcp_connections_opened_total")
                && line.contains("reporter=\"destination\"")
                && line.contains(&format!("source_principal=\"{client_identity}\""))
                && line.contains("connection_security_policy=\"mutual_tls\"")
        }),
        "node-b metrics count the mTLS connection from the client"
    );

    // Within node a: through the same ztunnel, still over HBONE.
    assert!(echoes(&cluster, "client", "server-a"));
    assert!(
        inbound_logs(&cluster, "node-a", "server-a")
            .iter()
            .any(|line| line.contains(&client_identity)),
        "same-node traffic is tunnelled and admitted with the client identity"
    );

    // A deny policy closes the open connection and refuses new ones; the
    // server's own traffic is unaffected.
    let target = app(&cluster, "server-b");
    let mut open = cluster.pod("client").unwrap().connect(target).unwrap();
    assert!(still_echoes(&mut open));
    cluster.mesh().set_policies(DENY_CLIENT).unwrap();
    assert!(
        eventually(|| !echoes(&cluster, "client", "server-b")),
        "new connections are refused under the deny policy"
    );
    assert!(closed(&mut open, Duration::from_secs(10)));
    assert!(echoes(&cluster, "server-a", "server-b"));

    cluster.mesh().set_policies("").unwrap();
    assert!(eventually(|| echoes(&cluster, "client", "server-b")));
}

#[test]
fn deleting_a_pod_closes_its_connections_and_listeners_and_spares_the_others() {
    let Some(mut cluster) = start("deleting_a_pod") else {
        return;
    };
    let target = app(&cluster, "server-a");
    let mut open = cluster.pod("client").unwrap().connect(target).unwrap();
    assert!(still_echoes(&mut open));
    assert!(cluster.pod("server-a").unwrap().listens_on(15008));
    let uid = cluster.pod("server-a").unwrap().spec.uid();
    let node_a = |cluster: &Cluster| {
        let (_, dump) = cluster
            .node("node-a")
            .unwrap()
            .http_get(15000, "/config_dump")
            .unwrap();
        dump
    };
    assert!(node_a(&cluster).contains(&uid));

    cluster.delete_pod("server-a").unwrap();
    assert!(
        closed(&mut open, Duration::from_secs(10)),
        "the deleted pod's connection is closed"
    );
    assert!(
        eventually(|| !node_a(&cluster).contains(&uid)),
        "node-a no longer serves the pod"
    );
    let log = cluster.node("node-a").unwrap().ztunnel_log();
    assert!(log.contains("pod proxy stopped"), "{}", tail(&log, 20));
    // The other pods, on both nodes, are untouched.
    assert!(echoes(&cluster, "client", "server-b"));
    assert!(cluster.pod("client").unwrap().listens_on(15008));
}

#[test]
fn restarts_of_ztunnel_and_of_the_agent_keep_the_pods_served() {
    let Some(mut cluster) = start("restarts") else {
        return;
    };
    // ztunnel dies: the restarted one gets the snapshot and serves again.
    cluster.kill_ztunnel("node-a").unwrap();
    cluster.start_ztunnel("node-a").unwrap();
    cluster.node("node-a").unwrap().wait_ready().unwrap();
    assert!(
        eventually(|| echoes(&cluster, "client", "server-b")),
        "traffic flows again after the ztunnel restart:\n{}",
        tail(&cluster.node("node-a").unwrap().ztunnel_log(), 20)
    );

    // The agent restarts: ztunnel keeps serving through the reconnect,
    // open connections included, and reconnects to the new agent.
    let target = app(&cluster, "server-b");
    let mut open = cluster.pod("client").unwrap().connect(target).unwrap();
    assert!(still_echoes(&mut open));
    cluster.kill_agent("node-a").unwrap();
    assert!(echoes(&cluster, "client", "server-b"));
    assert!(still_echoes(&mut open));
    cluster.start_agent("node-a").unwrap();
    cluster.node("node-a").unwrap().wait_ready().unwrap();
    assert!(still_echoes(&mut open));
    assert!(echoes(&cluster, "client", "server-a"));
}

#[test]
fn a_pod_outside_ambient_namespaces_is_left_alone() {
    let Some(cluster) = start("left_alone") else {
        return;
    };
    let plain = cluster.pod("plain-b").unwrap();
    let rules = plain.iptables().unwrap();
    assert!(!rules.contains("ISTIO"), "no capture rules:\n{rules}");
    assert!(!plain.listens_on(15008), "no proxy in the pod");
    // It still talks to meshed pods, as plain TCP they accept on 15006.
    assert!(echoes(&cluster, "plain-b", "server-b"));
}
