#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test
//! Ambient enrollment on Kubernetes, end to end: the two-node in-pod
//! cluster (`ztunnel_test_support::cluster`) on a real kube-apiserver,
//! with node agents that watch it. A namespace labelled ambient while its
//! pods run gets meshed without restarting them (the agents find each
//! pod's netns through procfs: every test pod runs a pause process in a
//! cgroup named after its uid), and plain again when the label goes; and
//! kubelet probes from the node reach a pod whose ALLOW policy admits one
//! identity only, through the node's probe SNAT (WIRE.md §6).
//!
//! Needs root, `ip`, `iptables`, `ipset`, containernetworking-plugins, a
//! writable cgroup v2 hierarchy and the built API server; skips with the
//! reason otherwise.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ztunnel_test_support::cluster::{self, Binaries, Cluster, PodSpec, still_echoes};
use ztunnel_test_support::skip::skip;

use support::{APP_PORT, app, delivered_over_mtls, echoes, eventually, logs, tunnelled_to};

#[path = "support/cluster.rs"]
mod support;

/// The namespace that joins the mesh while its pods run.
const LATE: &str = "late";

/// How long a probe from the node may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// A cluster on the API server with `specs` added and serving, the ztunnels
/// synced; `None`, skipped with the reason, where it cannot run.
fn start(tag: &str, specs: &[PodSpec], ambient: &[&str]) -> Option<Cluster> {
    if let Some(reason) = cluster::unavailable() {
        skip(format_args!("{tag}: {reason}"));
        return None;
    }
    let binaries = Binaries::from_target_dir().unwrap();
    let Some(mut cluster) =
        Cluster::start_on_kubernetes(&["node-a", "node-b"], specs, ambient, binaries).unwrap()
    else {
        // Skipped by the API server's start, with the reason.
        return None;
    };
    for spec in specs {
        let pod = cluster.add_pod(spec).unwrap();
        if let Some(reason) = pod.process_unavailable() {
            skip(format_args!("{tag}: {reason}"));
            return None;
        }
        pod.serve_echo(APP_PORT).unwrap();
    }
    cluster.wait_synced().unwrap();
    Some(cluster)
}

/// The `ambient.istio.io/redirection` annotation of pod `name` in `LATE`.
fn redirection(cluster: &Cluster, name: &str) -> Option<String> {
    cluster.pod_redirection(LATE, name).unwrap()
}

/// Whether pod `name`'s netns holds the agent's rules.
fn captured(cluster: &Cluster, name: &str) -> bool {
    cluster
        .pod(name)
        .unwrap()
        .iptables()
        .unwrap()
        .contains("ISTIO_OUTPUT")
}

#[test]
fn a_namespace_labelled_ambient_while_its_pods_run_is_meshed_and_plain_again_when_unlabelled() {
    let specs = [
        PodSpec::new("front", LATE, "front", "node-a"),
        PodSpec::new("back", LATE, "back", "node-b"),
    ];
    let Some(mut cluster) = start("running_pods", &specs, &[]) else {
        return;
    };
    let target = app(&cluster, "back");
    assert!(echoes(&cluster, "front", "back"), "plain before the label");
    assert!(!captured(&cluster, "front") && !captured(&cluster, "back"));
    let mut open = cluster.pod("front").unwrap().connect(target).unwrap();
    assert!(still_echoes(&mut open));

    let labelled = Instant::now();
    cluster.set_namespace_ambient(LATE, true).unwrap();
    assert!(
        eventually(|| ["front", "back"]
            .iter()
            .all(|pod| redirection(&cluster, pod).as_deref() == Some("enabled"))),
        "both running pods are enrolled:\n{}",
        agent_logs(&cluster)
    );
    eprintln!("label to both pods enrolled: {:?}", labelled.elapsed());
    assert!(captured(&cluster, "front") && captured(&cluster, "back"));
    assert!(
        eventually(|| echoes(&cluster, "front", "back")
            && delivered_over_mtls(&cluster, "node-b", "back", "front") > 0),
        "new connections go over HBONE with front's identity:\n{}",
        logs(&cluster)
    );
    eprintln!(
        "label to the first connection over HBONE: {:?}",
        labelled.elapsed()
    );
    assert!(
        eventually(|| tunnelled_to(&cluster, "node-a", "back")),
        "node-a tunnels to back's HBONE port"
    );
    assert!(
        still_echoes(&mut open),
        "the connection opened before the label is left alone"
    );

    cluster.set_namespace_ambient(LATE, false).unwrap();
    assert!(
        eventually(|| !captured(&cluster, "front")
            && !captured(&cluster, "back")
            && redirection(&cluster, "front").is_none()
            && redirection(&cluster, "back").is_none()),
        "rules and annotations are gone once the label is:\n{}",
        agent_logs(&cluster)
    );
    assert!(
        eventually(|| !cluster.pod("back").unwrap().listens_on(support::HBONE_PORT)),
        "ztunnel no longer serves the pods"
    );
    // Connections made while the pods were meshed are logged when they
    // close; settle, then new connections must not add to the count.
    std::thread::sleep(Duration::from_millis(500));
    let meshed = delivered_over_mtls(&cluster, "node-b", "back", "front");
    for _ in 0..3 {
        assert!(echoes(&cluster, "front", "back"), "plain traffic flows");
    }
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        delivered_over_mtls(&cluster, "node-b", "back", "front"),
        meshed,
        "no connection goes over HBONE once unlabelled"
    );
    assert!(still_echoes(&mut open));
}

#[test]
fn a_pod_labelled_while_its_node_agent_is_down_is_enrolled_when_the_agent_restarts() {
    let specs = [
        PodSpec::new("front", LATE, "front", "node-a"),
        PodSpec::new("back", LATE, "back", "node-b"),
    ];
    let Some(mut cluster) = start("agent_down", &specs, &[]) else {
        return;
    };
    cluster.kill_agent("node-b").unwrap();
    cluster
        .set_pod_label(LATE, "back", "istio.io/dataplane-mode", Some("ambient"))
        .unwrap();
    assert_eq!(redirection(&cluster, "back"), None, "nobody enrolls it yet");
    assert!(!captured(&cluster, "back"));

    cluster.start_agent("node-b").unwrap();
    assert!(
        eventually(|| redirection(&cluster, "back").as_deref() == Some("enabled")),
        "the restarted agent enrolls it:\n{}",
        agent_logs(&cluster)
    );
    assert!(captured(&cluster, "back"));
    assert!(
        cluster
            .node("node-b")
            .unwrap()
            .agent_log()
            .contains("repair: enrolling a running pod found through procfs"),
        "and logs the repair:\n{}",
        agent_logs(&cluster)
    );
    let through_ztunnel = || {
        cluster
            .node("node-b")
            .unwrap()
            .access_log()
            .iter()
            .any(|entry| {
                entry.direction == "inbound" && entry.dst_workload.as_deref() == Some("back")
            })
    };
    assert!(
        eventually(|| echoes(&cluster, "front", "back") && through_ztunnel()),
        "front, outside the mesh, reaches back through back's ztunnel:\n{}",
        logs(&cluster)
    );
    assert!(!captured(&cluster, "front"), "the unlabelled pod stays out");
}

#[test]
fn an_open_connection_keeps_its_replies_while_the_node_agent_restarts_and_repairs_its_pods() {
    let specs = [
        PodSpec::new("client", "default", "client", "node-a"),
        PodSpec::new("server-b", "default", "server", "node-b"),
    ];
    let Some(mut cluster) = start("agent_restart_open", &specs, &["default"]) else {
        return;
    };
    let target = app(&cluster, "server-b");
    let stream = cluster.pod("client").unwrap().connect(target).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let traffic = std::thread::spawn({
        let stop = Arc::clone(&stop);
        move || ping_pong(stream, &stop)
    });
    // Each restarted agent re-applies the rules of server-b (its start-up
    // repair) while the server's replies flow: ztunnel dialled the server
    // from the client's address, so only the pod's policy routing brings
    // them back to ztunnel rather than out to the client's node.
    for _ in 0..3 {
        cluster.start_agent("node-b").unwrap();
        std::thread::sleep(Duration::from_secs(2));
    }
    stop.store(true, Ordering::Relaxed);
    let rounds = traffic.join().unwrap();
    assert!(
        rounds.is_ok(),
        "the connection broke: {rounds:?}\n{}",
        logs(&cluster)
    );
}

/// The most rounds [`ping_pong`] makes, whatever `stop` says: far more
/// than the agents' restarts take, a bound on the loop all the same.
const MAX_ROUNDS: u64 = 5_000_000;

/// Sends 32 bytes and reads their echo, over and over until `stop` (or
/// [`MAX_ROUNDS`]): how many rounds went through, or what ended the
/// connection after how many.
fn ping_pong(mut stream: TcpStream, stop: &AtomicBool) -> Result<u64, String> {
    let message = [7u8; 32];
    let mut reply = [0u8; 32];
    let mut rounds = 0;
    while !stop.load(Ordering::Relaxed) && rounds < MAX_ROUNDS {
        let exchanged = stream
            .write_all(&message)
            .and_then(|()| stream.read_exact(&mut reply));
        if let Err(error) = exchanged {
            return Err(format!("{error} after {rounds} rounds"));
        }
        rounds += 1;
    }
    Ok(rounds)
}

/// An ALLOW policy of namespace `default`: only the `client` identity may
/// reach the `server` pods.
const ALLOW_CLIENT_ONLY: &str = r#"
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: allow-client, namespace: default}
spec:
  selector: {matchLabels: {app: server}}
  action: ALLOW
  rules:
  - from:
    - source: {principals: ["cluster.local/ns/default/sa/client"]}
"#;

#[test]
fn a_kubelet_probe_from_the_node_passes_an_allow_policy_that_admits_one_identity() {
    let specs = [
        PodSpec::new("client", "default", "client", "node-a"),
        PodSpec::new("other", "default", "other", "node-a"),
        PodSpec::new("server-b", "default", "server", "node-b"),
    ];
    let Some(mut cluster) = start("probes", &specs, &["default"]) else {
        return;
    };
    cluster
        .kube()
        .unwrap()
        .api()
        .kubectl(&["apply", "-f", "-"], Some(ALLOW_CLIENT_ONLY))
        .unwrap();
    assert!(
        eventually(|| !echoes(&cluster, "other", "server-b")),
        "another pod's identity is denied:\n{}",
        logs(&cluster)
    );
    assert!(
        echoes(&cluster, "client", "server-b"),
        "the admitted one passes"
    );
    assert!(
        probe(&cluster, "node-b", "server-b"),
        "the node's probe passes:\n{}",
        logs(&cluster)
    );

    // Without its probe-set entry the node's probe is just another
    // unmeshed client, and the policy refuses it...
    let server_ip = cluster.pod("server-b").unwrap().ip.to_string();
    let node_b = cluster.node("node-b").unwrap();
    node_b
        .ns
        .exec(&["ipset", "del", "istio-inpod-probes-v4", &server_ip])
        .unwrap();
    assert!(
        !probe(&cluster, "node-b", "server-b"),
        "a probe that is not SNATed is captured and denied"
    );
    // ...until the restarted agent rebuilds the set from its pods.
    cluster.start_agent("node-b").unwrap();
    assert!(
        eventually(|| probe(&cluster, "node-b", "server-b")),
        "the restarted agent puts the entry back:\n{}",
        agent_logs(&cluster)
    );
    assert!(
        cluster
            .node("node-b")
            .unwrap()
            .agent_log()
            .contains("repaired the node's probe sets"),
        "and says so"
    );
    assert!(!echoes(&cluster, "other", "server-b"), "still denied");
}

/// Whether a connection from `node`'s own netns, as the kubelet's probe
/// makes it, gets its bytes echoed by `pod`'s application.
fn probe(cluster: &Cluster, node: &str, pod: &str) -> bool {
    let target = app(cluster, pod);
    let exchange = move || -> std::io::Result<bool> {
        let mut stream = TcpStream::connect_timeout(&target, PROBE_TIMEOUT)?;
        stream.set_read_timeout(Some(PROBE_TIMEOUT))?;
        stream.write_all(b"probe")?;
        stream.shutdown(Shutdown::Write)?;
        let mut reply = Vec::new();
        stream.read_to_end(&mut reply)?;
        Ok(reply == b"probe")
    };
    let node = cluster.node(node).unwrap();
    matches!(node.ns.run(exchange), Ok(Ok(true)))
}

/// The last lines of every node agent's log.
fn agent_logs(cluster: &Cluster) -> String {
    cluster
        .nodes
        .iter()
        .map(|node| {
            format!(
                "--- agent {} ---\n{}\n",
                node.name,
                cluster::tail(&node.agent_log(), 20)
            )
        })
        .collect()
}
