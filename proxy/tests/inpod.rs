//! End-to-end tests of the shared (in-pod) mode on a real cluster layout:
//! two nodes with pod bridges made by the real CNI plugins, our CNI plugin
//! chained after them, a node agent and a shared-mode ztunnel per node, and
//! the control plane on its own (`ztunnel_test_support::cluster`). Needs
//! root, `ip`, `iptables` and containernetworking-plugins; skips with the
//! reason otherwise.
//!
//! The ztunnels are fed over xDS, as in a real cluster, except in the first
//! test: it runs on a local file (`LOCAL_XDS_PATH`), the source the
//! benchmark harness runs every ztunnel build on, so that source stays
//! covered end to end in shared mode. What changes over xDS at run time
//! (policies, workloads, a control-plane restart) is `xds_cluster.rs`'s.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test

use std::net::SocketAddr;
use std::time::Duration;

use ztunnel_proto::ports::HBONE_PORT as HBONE;
use ztunnel_test_support::cluster::{
    self, AccessEntry, Binaries, Cluster, ConfigSource, PodSpec, closed_by_peer, deny_policy,
    still_echoes, tail,
};
use ztunnel_test_support::skip::skip;
use ztunnel_test_support::wait;

const APP_PORT: u16 = 8080;

/// The standard cluster, fed over xDS: a client and a server on node a, a
/// server on node b, and a pod of a namespace that is not ambient-enabled
/// on node b. `None` (skipped, with the reason) where the cluster cannot
/// run.
fn start(tag: &str) -> Option<Cluster> {
    start_with(tag, ConfigSource::Xds)
}

/// The standard cluster, its ztunnels configured from `source`.
fn start_with(tag: &str, source: ConfigSource) -> Option<Cluster> {
    if let Some(reason) = cluster::unavailable() {
        skip(format_args!("{tag}: {reason}"));
        return None;
    }
    let specs = pod_specs();
    let binaries = Binaries::from_target_dir().unwrap();
    let mut cluster = Cluster::start_with(
        &["node-a", "node-b"],
        &specs,
        &["default"],
        binaries,
        source,
    )
    .unwrap();
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
    cluster.pod(from).unwrap().echoes(app(cluster, to))
}

/// Waits up to 20 s for `check`, polling.
fn eventually(check: impl FnMut() -> bool) -> bool {
    wait::until(Duration::from_secs(20), check)
}

/// The `connection complete` entries of `node`'s access log for
/// connections to `pod`, in `direction`.
fn entries_to(cluster: &Cluster, node: &str, pod: &str, direction: &str) -> Vec<AccessEntry> {
    cluster
        .node(node)
        .unwrap()
        .access_log()
        .into_iter()
        .filter(|entry| entry.direction == direction && entry.dst_workload.as_deref() == Some(pod))
        .collect()
}

/// Whether a node's ztunnel delivered a connection to `pod` under
/// `identity`, as its access log says.
fn delivered_as(cluster: &Cluster, node: &str, pod: &str, identity: &str) -> bool {
    cluster
        .node(node)
        .unwrap()
        .access_log()
        .iter()
        .any(|entry| {
            entry.direction == "inbound"
                && entry.dst_workload.as_deref() == Some(pod)
                && entry.src_identity.as_deref() == Some(identity)
        })
}

#[test]
fn pods_talk_over_hbone_within_and_across_nodes_and_deny_policies_apply_from_a_local_file() {
    let Some(mut cluster) = start_with("pods_talk_over_hbone", ConfigSource::LocalFile) else {
        return;
    };
    let client_identity = cluster.pod("client").unwrap().spec.identity();

    // Across nodes: node b's ztunnel admitted it with the client's identity.
    assert!(echoes(&cluster, "client", "server-b"));
    assert!(
        eventually(|| delivered_as(&cluster, "node-b", "server-b", &client_identity)),
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

    // Within node a: through the same ztunnel, on the same-node path.
    assert!(echoes(&cluster, "client", "server-a"));
    assert!(
        eventually(|| delivered_as(&cluster, "node-a", "server-a", &client_identity)),
        "same-node traffic is admitted with the client identity"
    );

    // A deny policy closes the open connection and refuses new ones; the
    // server's own traffic is unaffected.
    let target = app(&cluster, "server-b");
    let mut open = cluster.pod("client").unwrap().connect(target).unwrap();
    assert!(still_echoes(&mut open));
    cluster
        .mesh()
        .set_policies(&deny_policy("default", "client"))
        .unwrap();
    assert!(
        eventually(|| !echoes(&cluster, "client", "server-b")),
        "new connections are refused under the deny policy"
    );
    assert!(closed_by_peer(&mut open, Duration::from_secs(10)));
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
    // And one chatty enough to be joined in the kernel: 40 bytes each way.
    let mut chatty = cluster.pod("client").unwrap().connect(target).unwrap();
    for round in 0..10 {
        assert!(still_echoes(&mut chatty), "round trip {round}");
    }
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
        closed_by_peer(&mut open, Duration::from_secs(10)),
        "the deleted pod's connection is closed"
    );
    assert!(
        closed_by_peer(&mut chatty, Duration::from_secs(10)),
        "the deleted pod's joined connection is closed"
    );
    // Same-node connections: both of node-a's sides report their ends,
    // the joined one with every byte it carried.
    for direction in ["outbound", "inbound"] {
        assert!(
            eventually(|| {
                let ended = entries_to(&cluster, "node-a", "server-a", direction);
                let same_node = |entry: &&AccessEntry| entry.path.as_deref() == Some("same-node");
                ended
                    .iter()
                    .filter(same_node)
                    .any(|entry| entry.bytes_recv > 0)
                    && ended
                        .iter()
                        .filter(same_node)
                        .any(|entry| entry.bytes_recv == 40 && entry.bytes_sent == 40)
            }),
            "node-a reports the closed {direction} side:\n{}",
            tail(&cluster.node("node-a").unwrap().ztunnel_log(), 20)
        );
    }
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

/// `name`'s value in `node`'s ztunnel's `/metrics`; `None` when absent.
fn gauge(cluster: &Cluster, node: &str, name: &str) -> Option<f64> {
    let (_, body) = cluster.node(node).ok()?.http_get(15020, "/metrics").ok()?;
    body.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn pending_pod_proxies_are_retried_after_a_ztunnel_restart_and_counted() {
    let Some(mut cluster) = start("pending pod proxy") else {
        return;
    };
    // While ztunnel is down, something in the pod takes its HBONE port
    // without SO_REUSEPORT: the restarted ztunnel cannot start the pod's
    // proxy.
    cluster.kill_ztunnel("node-a").unwrap();
    let squatter = cluster
        .pod("server-a")
        .unwrap()
        .ns
        .run(|| std::net::TcpListener::bind(("0.0.0.0", HBONE)))
        .unwrap()
        .unwrap();
    cluster.start_ztunnel("node-a").unwrap();
    let pending = || gauge(&cluster, "node-a", "workload_manager_pending_proxy_count");
    assert!(
        eventually(|| pending() == Some(1.0)),
        "pending: {:?}\n{}",
        pending(),
        tail(&cluster.node("node-a").unwrap().ztunnel_log(), 20)
    );
    let (status, _) = cluster
        .node("node-a")
        .unwrap()
        .http_get(15021, "/healthz/ready")
        .unwrap();
    assert_ne!(status, 200, "not ready while a pod waits for its proxy");
    assert!(
        echoes(&cluster, "client", "server-b"),
        "the other pods are served"
    );

    // The port is free again: the next retry starts the proxy.
    drop(squatter);
    assert!(
        eventually(|| pending() == Some(0.0)),
        "pending: {:?}",
        pending()
    );
    cluster.node("node-a").unwrap().wait_ready().unwrap();
    assert!(
        eventually(|| echoes(&cluster, "client", "server-a")),
        "{}",
        tail(&cluster.node("node-a").unwrap().ztunnel_log(), 20)
    );
    assert!(
        cluster
            .node("node-a")
            .unwrap()
            .ztunnel_log()
            .contains("pod proxy started on retry")
    );
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

#[test]
fn same_node_pods_talk_without_the_tunnel_under_the_same_policy_logs_and_metrics() {
    let Some(mut cluster) = start("same_node_path") else {
        return;
    };
    let client_identity = cluster.pod("client").unwrap().spec.identity();
    let server_a = cluster.pod("server-a").unwrap();
    let mut open = cluster
        .pod("client")
        .unwrap()
        .connect(app(&cluster, "server-a"))
        .unwrap();
    // Chatty enough to be joined in the kernel (SAME_NODE_SPLICE, on by
    // default), where it goes on echoing.
    for round in 0..12 {
        assert!(still_echoes(&mut open), "round trip {round}");
    }
    assert_eq!(
        server_a.established_on(HBONE).unwrap(),
        0,
        "no tunnel reaches the server pod's 15008"
    );
    assert!(echoes(&cluster, "client", "server-a"));
    let same_node = |entry: &AccessEntry| entry.path.as_deref() == Some("same-node");
    assert!(
        eventually(|| entries_to(&cluster, "node-a", "server-a", "inbound")
            .iter()
            .any(|entry| same_node(entry)
                && entry.src_identity.as_deref() == Some(client_identity.as_str()))),
        "the destination side admits the client identity on the same-node path:\n{}",
        tail(&cluster.node("node-a").unwrap().ztunnel_log(), 20)
    );
    assert!(
        entries_to(&cluster, "node-a", "server-a", "outbound")
            .iter()
            .any(|entry| same_node(entry) && entry.dst_hbone_addr.is_some()),
        "the source side logs the same-node path"
    );
    let (_, metrics) = cluster
        .node("node-a")
        .unwrap()
        .http_get(15020, "/metrics")
        .unwrap();
    for reporter in ["source", "destination"] {
        assert!(
            metrics.lines().any(|line| {
                line.starts_with("istio_tcp_connections_opened_total")
                    && line.contains(&format!("reporter=\"{reporter}\""))
                    && line.contains(&format!("source_principal=\"{client_identity}\""))
                    && line.contains("destination_workload=\"server-a\"")
                    && line.contains("connection_security_policy=\"mutual_tls\"")
            }),
            "node-a counts the connection as {reporter}, over mTLS as a tunnel would"
        );
    }
    assert!(
        metrics.lines().any(|line| {
            line.starts_with("ztunnel_same_node_joins_total{outcome=\"joined\"}")
                && line
                    .rsplit(' ')
                    .next()
                    .and_then(|count| count.parse::<f64>().ok())
                    .is_some_and(|count| count >= 1.0)
        }),
        "node-a counts the chatty connection as joined in the kernel"
    );

    // A destination on the other node still goes over HBONE.
    assert!(echoes(&cluster, "client", "server-b"));
    assert!(
        eventually(|| !entries_to(&cluster, "node-b", "server-b", "inbound").is_empty()),
        "node-b admits the cross-node connection"
    );
    assert!(
        eventually(|| !entries_to(&cluster, "node-a", "server-b", "outbound").is_empty()),
        "node-a reports the cross-node connection"
    );
    let crossed = entries_to(&cluster, "node-a", "server-b", "outbound");
    assert!(
        crossed
            .iter()
            .all(|entry| !same_node(entry) && entry.dst_hbone_addr.is_some()),
        "tunnelled over HBONE: {crossed:?}"
    );

    // A deny policy closes the open same-node connection, joined in the
    // kernel by now, on its re-check and refuses new ones; another pod
    // still reaches the server.
    assert!(still_echoes(&mut open));
    cluster
        .mesh()
        .set_policies(&deny_policy("default", "client"))
        .unwrap();
    assert!(
        closed_by_peer(&mut open, Duration::from_secs(10)),
        "the re-check closes the open same-node connection"
    );
    assert!(!echoes(&cluster, "client", "server-a"));
    assert!(
        eventually(|| entries_to(&cluster, "node-a", "server-a", "outbound")
            .iter()
            .any(|entry| same_node(entry)
                && entry
                    .error
                    .as_deref()
                    .is_some_and(|error| error.contains("refused")))),
        "the refused connection is logged on the source side:\n{}",
        tail(&cluster.node("node-a").unwrap().ztunnel_log(), 20)
    );
    assert!(echoes(&cluster, "server-b", "server-a"));
}

#[test]
fn with_the_shortcut_off_same_node_traffic_goes_over_hbone() {
    let Some(mut cluster) = start("same_node_off") else {
        return;
    };
    cluster.set_ztunnel_env("SAME_NODE_SHORTCUT", "false");
    cluster.kill_ztunnel("node-a").unwrap();
    cluster.start_ztunnel("node-a").unwrap();
    cluster.node("node-a").unwrap().wait_ready().unwrap();
    let client_identity = cluster.pod("client").unwrap().spec.identity();
    let target = app(&cluster, "server-a");
    let mut open = None;
    assert!(
        eventually(|| {
            open = cluster.pod("client").unwrap().connect(target).ok();
            open.as_mut().is_some_and(still_echoes)
        }),
        "the restarted ztunnel serves the pods again:\n{}",
        tail(&cluster.node("node-a").unwrap().ztunnel_log(), 20)
    );
    assert!(
        cluster
            .pod("server-a")
            .unwrap()
            .established_on(HBONE)
            .unwrap()
            >= 1,
        "the connection is tunnelled to the server pod's 15008"
    );
    drop(open);
    assert!(
        eventually(|| delivered_as(&cluster, "node-a", "server-a", &client_identity)),
        "admitted with the client identity over mTLS"
    );
    let logged = entries_to(&cluster, "node-a", "server-a", "inbound");
    assert!(logged.iter().all(|entry| entry.path.is_none()));
}
