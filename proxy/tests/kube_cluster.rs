#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test
//! End-to-end tests of the control plane on Kubernetes: the two-node in-pod
//! cluster (`ztunnel_test_support::cluster`: real namespaces, the CNI chain,
//! node agents, iptables capture) whose ztunnels get every workload and
//! policy over delta xDS from a control plane that reads only a real
//! kube-apiserver (`scripts/k8s-test-env.sh` builds it), as a service
//! account bound to the role in `deploy/rbac/`. Pods are created through
//! the API and get their status as a kubelet would write it; policies are
//! `security.istio.io/v1` AuthorizationPolicies applied with kubectl.
//!
//! Traffic across nodes with the pods' identities is `real_cluster.rs`'s,
//! on kubelets and containerd; these keep what that test does not cover:
//! policy re-checks of open connections, routability within
//! milliseconds of a pod's creation, the API server restarting under the
//! control plane.
//!
//! Needs root, `ip`, `iptables`, containernetworking-plugins and the built
//! API server; skips with the reason otherwise.

use std::time::{Duration, Instant};

use ztunnel_test_support::cluster::{Cluster, PodSpec, closed_by_peer, still_echoes};
use ztunnel_test_support::wait;

use support::{APP_PORT, MeshFrom, PATIENCE, app, delivered_over_mtls, echoes, eventually, logs};

#[path = "support/cluster.rs"]
mod support;

/// How long the control plane may take to come back after the API server
/// restarts: its watches retry with exponential backoff (kube-runtime's,
/// from 0.8 s), so a few seconds down can mean several seconds more.
const RELIST_PATIENCE: Duration = Duration::from_secs(60);

/// The bound on "a pod created is routable". The aim is under a second;
/// the bound leaves room for a loaded machine, and the time is printed.
const ROUTABLE_WITHIN: Duration = Duration::from_secs(5);

/// How often the time to routable is sampled.
const SAMPLE_EVERY: Duration = Duration::from_millis(20);

/// [`support::clients_and_server`] on a real API server; `late`, on node
/// b, exists in the API (and the node agents' registry) for a test to add.
fn start(tag: &str) -> Option<Cluster> {
    support::clients_and_server(tag, &[late()], MeshFrom::Kubernetes)
}

/// The pod a test adds at run time.
fn late() -> PodSpec {
    PodSpec::new("late", "default", "late", "node-b")
}

/// Whether `node`'s ztunnel has the workload of `pod` (namespace
/// `default`), named as the control plane names Kubernetes pods.
fn knows(cluster: &Cluster, node: &str, pod: &str) -> bool {
    let uid = format!("Kubernetes//Pod/default/{pod}");
    cluster.node(node).unwrap().known_workloads().contains(&uid)
}

fn kubectl(cluster: &Cluster, args: &[&str], stdin: Option<&str>) {
    cluster.kube().unwrap().api().kubectl(args, stdin).unwrap();
}

/// A DENY policy of namespace `default` refusing the `client` identity.
const DENY_CLIENT: &str = r#"
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-client, namespace: default}
spec:
  action: DENY
  rules:
  - from:
    - source: {principals: ["cluster.local/ns/default/sa/client"]}
"#;

/// An ALLOW policy on the server whose only rule needs L7 attributes: the
/// rule is dropped (KUBERNETES.md E9), leaving an ALLOW policy with no
/// rules, which denies everything to the server.
const ALLOW_L7_ONLY: &str = r#"
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: allow-get, namespace: default}
spec:
  selector: {matchLabels: {app: server}}
  action: ALLOW
  rules:
  - to:
    - operation: {methods: ["GET"]}
"#;

#[test]
fn authorization_policies_from_the_api_apply_at_run_time() {
    let Some(cluster) = start("policies") else {
        return;
    };
    let target = app(&cluster, "server-b");
    let mut open = cluster.pod("client").unwrap().connect(target).unwrap();
    assert!(still_echoes(&mut open));

    kubectl(&cluster, &["apply", "-f", "-"], Some(DENY_CLIENT));
    assert!(
        closed_by_peer(&mut open, PATIENCE),
        "the open connection is closed on the policy re-check:\n{}",
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
    kubectl(
        &cluster,
        &[
            "delete",
            "authorizationpolicy",
            "deny-client",
            "-n",
            "default",
        ],
        None,
    );
    assert!(
        eventually(|| echoes(&cluster, "client", "server-b")),
        "the client passes again once the policy is deleted:\n{}",
        logs(&cluster)
    );

    kubectl(&cluster, &["apply", "-f", "-"], Some(ALLOW_L7_ONLY));
    assert!(
        eventually(
            || !echoes(&cluster, "client", "server-b") && !echoes(&cluster, "other", "server-b")
        ),
        "an ALLOW policy whose rules all need L7 denies everything:\n{}",
        logs(&cluster)
    );
    kubectl(
        &cluster,
        &[
            "delete",
            "authorizationpolicy",
            "allow-get",
            "-n",
            "default",
        ],
        None,
    );
    assert!(
        eventually(|| echoes(&cluster, "other", "server-b")),
        "allowed again once it is deleted"
    );
}

#[test]
fn a_pod_created_through_the_api_is_routable_at_once_and_deleting_it_stops_routing() {
    let Some(mut cluster) = start("pod_lifecycle") else {
        return;
    };
    let late = late();
    cluster
        .add_pod_unpublished(&late)
        .unwrap()
        .serve_echo(APP_PORT)
        .unwrap();
    assert!(!knows(&cluster, "node-a", "late"));

    let published = Instant::now();
    cluster.publish_pod("late").unwrap();
    let took = loop {
        if knows(&cluster, "node-a", "late") && knows(&cluster, "node-b", "late") {
            break published.elapsed();
        }
        assert!(
            published.elapsed() < ROUTABLE_WITHIN,
            "the ztunnels did not learn the pod within {ROUTABLE_WITHIN:?}:\n{}",
            logs(&cluster)
        );
        std::thread::sleep(SAMPLE_EVERY);
    };
    eprintln!("pod status written → both ztunnels have the workload: {took:?}");
    assert!(
        eventually(|| echoes(&cluster, "client", "late")
            && delivered_over_mtls(&cluster, "node-b", "late", "client") > 0),
        "routable over HBONE:\n{}",
        logs(&cluster)
    );

    let deleted = Instant::now();
    cluster.delete_pod("late").unwrap();
    assert!(
        eventually(|| !knows(&cluster, "node-a", "late") && !knows(&cluster, "node-b", "late")),
        "both ztunnels forget the deleted pod"
    );
    eprintln!(
        "pod deleted → both ztunnels forgot it: {:?}",
        deleted.elapsed()
    );
}

#[test]
fn the_control_plane_rides_out_an_api_server_restart_and_converges_after() {
    let Some(mut cluster) = start("apiserver_restart") else {
        return;
    };
    cluster.kube_mut().unwrap().api_mut().stop_apiserver();
    // The API server is down: the control plane keeps serving its last
    // state, so traffic keeps flowing over HBONE with the client identity.
    let delivered = delivered_over_mtls(&cluster, "node-b", "server-b", "client");
    assert!(echoes(&cluster, "client", "server-b"));
    assert!(
        eventually(|| delivered_over_mtls(&cluster, "node-b", "server-b", "client") > delivered),
        "still over HBONE with the client identity while the API server is down"
    );
    for node in ["node-a", "node-b"] {
        assert!(cluster.node(node).unwrap().is_ready(), "{node} stays ready");
        assert!(
            knows(&cluster, node, "server-b"),
            "{node} keeps its workloads"
        );
    }

    cluster
        .kube_mut()
        .unwrap()
        .api_mut()
        .start_apiserver()
        .unwrap();
    kubectl(&cluster, &["apply", "-f", "-"], Some(DENY_CLIENT));
    let relisted = Instant::now();
    assert!(
        wait::until(RELIST_PATIENCE, || !echoes(&cluster, "client", "server-b")),
        "a policy applied after the restart reaches the ztunnels:\n{}",
        logs(&cluster)
    );
    eprintln!(
        "API server back → policy enforced: {:?}",
        relisted.elapsed()
    );
    assert!(echoes(&cluster, "other", "server-b"));
}
