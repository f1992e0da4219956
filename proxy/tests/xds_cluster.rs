#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test
//! End-to-end tests of the configuration path: the two-node in-pod cluster
//! (`ztunnel_test_support::cluster`: real namespaces, the CNI chain, node
//! agents, iptables capture) whose ztunnels get every workload and policy
//! from the control plane over delta xDS (gRPC over TLS on the CA's port),
//! with no local file. The tests edit the control plane's mesh file, as a
//! Kubernetes API change would, and watch the data path follow: traffic
//! over HBONE, a deny policy added and removed, a namespace's
//! PeerAuthentication turned STRICT and back to PERMISSIVE, a workload
//! added and removed, and a control-plane restart with changes made while
//! it was down. Needs root, `ip`, `iptables` and containernetworking-plugins;
//! skips with the reason otherwise.

use std::io::{Read, Write};
use std::net::Shutdown;
use std::time::{Duration, Instant};

use ztunnel_test_support::cluster::{
    Cluster, ConfigSource, PodSpec, closed_by_peer, deny_policy, peer_authentication, still_echoes,
};

use support::{
    APP_PORT, MeshFrom, PATIENCE, app, delivered_over_mtls, echoes, eventually, logs, metric,
    tunnelled_to,
};

#[path = "support/cluster.rs"]
mod support;

/// The bound on "a workload added is routable". The aim is about a second
/// (the control plane reads the file every 100 ms and pushes at once);
/// the bound leaves room for a loaded machine, and the time taken is
/// printed.
const ROUTABLE_WITHIN: Duration = Duration::from_secs(5);

/// How often the time to routable is sampled, and at most how many times.
const SAMPLE_EVERY: Duration = Duration::from_millis(20);
const MAX_SAMPLES: u32 = 500;

/// [`support::clients_and_server`] with the mesh from the control plane's
/// file over xDS; `late` and `never_pushed`, on node b, are only in the
/// registry, for a test to add.
fn start(tag: &str) -> Option<Cluster> {
    let cluster = support::clients_and_server(tag, &[late(), never_pushed()], MeshFrom::File)?;
    assert_eq!(cluster.config_source(), ConfigSource::Xds);
    Some(cluster)
}

/// The pod a test adds at run time.
fn late() -> PodSpec {
    PodSpec::new("late", "default", "late", "node-b")
}

/// A pod the control plane is never told about.
fn never_pushed() -> PodSpec {
    PodSpec::new("never-pushed", "default", "never", "node-b")
}

/// Whether `node`'s ztunnel has `pod`'s workload (`/config_dump`).
fn knows(cluster: &Cluster, node: &str, pod: &PodSpec) -> bool {
    cluster
        .node(node)
        .unwrap()
        .known_workloads()
        .contains(&pod.uid())
}

/// Whether `node`'s ztunnel says its xDS stream is open
/// (`ztunnel_xds_connected`).
fn xds_connected(cluster: &Cluster, node: &str) -> bool {
    matches!(
        cluster.node(node).unwrap().http_get(15020, "/metrics"),
        Ok((200, metrics)) if metrics.lines().any(|line| line == "ztunnel_xds_connected 1")
    )
}

#[test]
fn traffic_crosses_nodes_over_hbone_on_configuration_from_the_control_plane() {
    let Some(cluster) = start("traffic_crosses_nodes") else {
        return;
    };
    for node in ["node-a", "node-b"] {
        assert!(xds_connected(&cluster, node), "{node} has its xDS stream");
    }

    assert!(echoes(&cluster, "client", "server-b"));
    // The client's ztunnel tunnelled it to the server pod's HBONE port
    // (each side logs the connection as it finishes with it: poll)...
    assert!(
        eventually(|| tunnelled_to(&cluster, "node-a", "server-b")),
        "node-a tunnels to server-b's HBONE port:\n{}",
        logs(&cluster)
    );
    // ...and the server's ztunnel delivered it under the client's identity.
    assert!(
        eventually(|| delivered_over_mtls(&cluster, "node-b", "server-b", "client") > 0),
        "node-b delivers with the client identity:\n{}",
        logs(&cluster)
    );
}

#[test]
fn a_deny_policy_added_at_run_time_closes_matching_connections_until_removed() {
    let Some(mut cluster) = start("deny_policy") else {
        return;
    };
    let target = app(&cluster, "server-b");
    let mut open = cluster.pod("client").unwrap().connect(target).unwrap();
    assert!(still_echoes(&mut open));

    cluster
        .mesh()
        .set_policies(&deny_policy("default", "client"))
        .unwrap();
    assert!(
        closed_by_peer(&mut open, PATIENCE),
        "the open connection is closed on the policy re-check:\n{}",
        logs(&cluster)
    );
    // The server's ztunnel reports the policy's reason, not the copy's.
    assert!(
        eventually(|| {
            cluster
                .node("node-b")
                .unwrap()
                .access_log()
                .iter()
                .any(|entry| {
                    entry.direction == "inbound"
                        && entry.error.as_deref().is_some_and(|error| {
                            error.starts_with("closed on a policy re-check: explicitly denied by")
                        })
                })
        }),
        "the close names the policy:\n{}",
        logs(&cluster)
    );
    assert!(
        eventually(|| !echoes(&cluster, "client", "server-b")),
        "new connections from the client are refused"
    );
    assert!(
        echoes(&cluster, "other", "server-b"),
        "another identity still passes"
    );

    cluster.mesh().set_policies("").unwrap();
    assert!(
        eventually(|| echoes(&cluster, "client", "server-b")),
        "the client passes again once the policy is removed:\n{}",
        logs(&cluster)
    );
}

#[test]
fn peer_auth_strict_on_a_namespace_refuses_plaintext_from_outside_the_mesh_and_permissive_lets_it_in()
 {
    // `outsider` (namespace `plain`, not in the mesh) sends plaintext;
    // `client` and `server` (namespace `default`) are meshed, on one node.
    let Some(mut cluster) = support::one_node("peer_auth_strict", &[]) else {
        return;
    };
    assert_eq!(cluster.config_source(), ConfigSource::Xds);
    assert!(
        echoes(&cluster, "outsider", "server"),
        "without a PeerAuthentication plaintext is let in (PERMISSIVE by default)"
    );

    cluster
        .mesh()
        .set_peer_authentications(&peer_authentication("default", "Strict"))
        .unwrap();
    assert!(
        eventually(|| !echoes(&cluster, "outsider", "server")),
        "STRICT: plaintext from outside the mesh is refused:\n{}",
        logs(&cluster)
    );
    assert!(
        echoes(&cluster, "client", "server"),
        "STRICT: a meshed client (mTLS, with an identity) still passes:\n{}",
        logs(&cluster)
    );
    assert!(
        cluster
            .node("node-a")
            .unwrap()
            .access_log()
            .iter()
            .any(|entry| {
                entry.direction == "inbound"
                    && entry.dst_workload.as_deref() == Some("server")
                    && entry.src_identity.is_none()
                    && entry.error.as_deref().is_some_and(|error| {
                        error.contains("istio-system/istio_converted_static_strict")
                    })
            }),
        "the refusal names istiod's static STRICT policy:\n{}",
        logs(&cluster)
    );

    cluster
        .mesh()
        .set_peer_authentications(&peer_authentication("default", "Permissive"))
        .unwrap();
    assert!(
        eventually(|| echoes(&cluster, "outsider", "server")),
        "PERMISSIVE: plaintext is let in again:\n{}",
        logs(&cluster)
    );
    assert!(echoes(&cluster, "client", "server"), "and mTLS still is");
}

#[test]
fn a_workload_added_at_run_time_is_routable_over_hbone_at_once_and_removing_it_stops_routing() {
    let Some(mut cluster) = start("workload_added") else {
        return;
    };
    let late = late();
    // The pod runs, captured, but the mesh file has no address for it yet.
    cluster
        .add_pod_unpublished(&late)
        .unwrap()
        .serve_echo(APP_PORT)
        .unwrap();
    assert!(!knows(&cluster, "node-a", &late));

    let published = Instant::now();
    cluster.publish_pod("late").unwrap();
    let mut samples = 0;
    let over_hbone = loop {
        if echoes(&cluster, "client", "late")
            && delivered_over_mtls(&cluster, "node-b", "late", "client") > 0
        {
            break Some(published.elapsed());
        }
        samples += 1;
        if samples >= MAX_SAMPLES || published.elapsed() >= ROUTABLE_WITHIN {
            break None;
        }
        std::thread::sleep(SAMPLE_EVERY);
    };
    let Some(took) = over_hbone else {
        panic!(
            "the client's traffic to the new workload did not go over HBONE within {ROUTABLE_WITHIN:?}:\n{}",
            logs(&cluster)
        );
    };
    eprintln!("workload routable over HBONE {took:?} after the mesh file write");
    assert!(knows(&cluster, "node-a", &late));

    cluster.unpublish_pod("late").unwrap();
    assert!(
        eventually(|| !knows(&cluster, "node-a", &late) && !knows(&cluster, "node-b", &late)),
        "both ztunnels forget the removed workload"
    );
    // The client's ztunnel no longer tunnels to it: the connection goes out
    // as plain TCP, and nothing more arrives over mTLS.
    let delivered = delivered_over_mtls(&cluster, "node-b", "late", "client");
    let before = cluster.node("node-a").unwrap().access_log().len();
    let target = app(&cluster, "late");
    let _ = cluster.pod("client").unwrap().exchange(target, b"ping");
    let went_plain = eventually(|| {
        let log = cluster.node("node-a").unwrap().access_log();
        log.iter().skip(before).any(|entry| {
            entry.direction == "outbound"
                && entry.dst_addr == target.to_string()
                && entry.dst_hbone_addr.is_none()
        })
    });
    assert!(
        went_plain,
        "the client's ztunnel sends plain TCP:\n{}",
        logs(&cluster)
    );
    assert_eq!(
        delivered_over_mtls(&cluster, "node-b", "late", "client"),
        delivered
    );
}

#[test]
fn ztunnels_serve_through_a_control_plane_restart_and_converge_on_changes_made_meanwhile() {
    let Some(mut cluster) = start("control_plane_restart") else {
        return;
    };
    assert!(xds_connected(&cluster, "node-a") && xds_connected(&cluster, "node-b"));
    cluster.stop_control_plane();
    assert!(
        eventually(|| !xds_connected(&cluster, "node-a") && !xds_connected(&cluster, "node-b")),
        "the ztunnels see their xDS streams end"
    );

    // While it is down the ztunnels serve on their last state, whatever
    // the mesh file now says.
    let other = cluster.pod("other").unwrap().spec.clone();
    cluster
        .mesh()
        .set_policies(&deny_policy("default", "client"))
        .unwrap();
    cluster.unpublish_pod("other").unwrap();
    let delivered = delivered_over_mtls(&cluster, "node-b", "server-b", "client");
    assert!(echoes(&cluster, "client", "server-b"));
    assert!(
        eventually(|| delivered_over_mtls(&cluster, "node-b", "server-b", "client") > delivered),
        "still over HBONE with the client identity"
    );
    for node in ["node-a", "node-b"] {
        assert!(cluster.node(node).unwrap().is_ready(), "{node} stays ready");
        assert!(knows(&cluster, node, &other));
    }

    cluster.start_control_plane().unwrap();
    assert!(
        eventually(|| xds_connected(&cluster, "node-a") && xds_connected(&cluster, "node-b")),
        "the ztunnels reconnect:\n{}",
        logs(&cluster)
    );
    assert!(
        eventually(|| !knows(&cluster, "node-a", &other) && !knows(&cluster, "node-b", &other)),
        "the workload removed meanwhile is gone from both ztunnels"
    );
    assert!(
        eventually(|| !echoes(&cluster, "client", "server-b")),
        "the policy added meanwhile applies:\n{}",
        logs(&cluster)
    );
}

/// A pod sends as soon as its network is up, which can be before the
/// control plane's push that describes it reaches ztunnel. Its first
/// connection, started at once, waits for its workload and goes through
/// over HBONE once it is pushed a second later; a pod never pushed has
/// its connection refused after the wait (`LOCAL_WORKLOAD_WAIT`, 5 s),
/// with a log line, and both are counted in `ztunnel_workload_waits`.
#[test]
fn a_new_pods_first_connection_waits_for_its_workload_and_fails_only_without_it() {
    let Some(mut cluster) = start("workload_wait") else {
        return;
    };
    let target = app(&cluster, "client");
    let late = late();
    cluster.add_pod_unpublished(&late).unwrap();
    let started = Instant::now();
    let mut first = cluster.pod("late").unwrap().connect(target).unwrap();
    first.write_all(b"ping").unwrap();
    first.shutdown(Shutdown::Write).unwrap();
    std::thread::sleep(Duration::from_secs(1));
    cluster.publish_pod("late").unwrap();
    let mut reply = Vec::new();
    first.read_to_end(&mut reply).unwrap();
    eprintln!(
        "first connection answered {:?} after it started",
        started.elapsed()
    );
    assert_eq!(
        reply,
        b"ping",
        "the first connection went through:\n{}",
        logs(&cluster)
    );
    assert!(started.elapsed() >= Duration::from_secs(1));
    assert!(
        eventually(|| delivered_over_mtls(&cluster, "node-a", "client", "late") > 0),
        "over HBONE, with the new pod's identity:\n{}",
        logs(&cluster)
    );
    // The server's side logs the client's address with its port.
    let inbound = cluster.node("node-a").unwrap().access_log();
    let from_late: Vec<_> = inbound
        .iter()
        .filter(|entry| {
            entry.direction == "inbound" && entry.dst_workload.as_deref() == Some("client")
        })
        .collect();
    assert!(!from_late.is_empty());
    for entry in from_late {
        let src: std::net::SocketAddr = entry.src_addr.parse().unwrap();
        assert_ne!(src.port(), 0, "{entry:?}");
    }
    let arrived = ["reporter=\"source\"", "outcome=\"arrived\""];
    assert!(metric(&cluster, "node-b", "ztunnel_workload_waits_total", &arrived) >= 1.0);

    cluster.add_pod_unpublished(&never_pushed()).unwrap();
    let started = Instant::now();
    let reply = cluster
        .pod("never-pushed")
        .unwrap()
        .exchange(target, b"ping");
    let waited = started.elapsed();
    eprintln!("connection of a pod never pushed ended after {waited:?}: {reply:?}");
    assert!(
        !matches!(&reply, Ok(bytes) if bytes == b"ping"),
        "a pod the control plane never described gets nowhere"
    );
    assert!(
        waited >= Duration::from_millis(4500),
        "only after the wait: {waited:?}"
    );
    let log = cluster.node("node-b").unwrap().ztunnel_log();
    assert!(
        log.contains("has not described this pod's workload yet"),
        "a clear log line:\n{log}"
    );
    let timeout = ["reporter=\"source\"", "outcome=\"timeout\""];
    assert!(metric(&cluster, "node-b", "ztunnel_workload_waits_total", &timeout) >= 1.0);
}
