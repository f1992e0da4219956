//! The node agent with its pods from a real API server (etcd and
//! kube-apiserver from `scripts/k8s-test-env.sh`), running as a service
//! account bound to exactly `deploy/rbac/node-agent.yaml`. Pods are
//! created through the API and added through the real CNI chain (bridge,
//! host-local, our plugin) in test network namespaces; a fake ztunnel on
//! the ZDS socket sees what the agent hands over. Needs root, `ip`,
//! `iptables` and the reference CNI plugins, and the API server binaries;
//! skips, with the reason, without them.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test

use ztunnel_proto::istio::workload::zds::workload_request::Payload;
use ztunnel_test_support::cni::{self, CniNetwork, PodSandbox};
use ztunnel_test_support::netns::NetNs;
use ztunnel_test_support::skip::skip;

use api::{Cluster, NODE, Node};
use rules::our_rules;
use running_agent::Agent;
use ztunnel::FakeZtunnel;

#[path = "support/api.rs"]
mod api;
#[path = "support/rules.rs"]
mod rules;
#[path = "support/running_agent.rs"]
mod running_agent;
#[path = "e2e/ztunnel.rs"]
mod ztunnel;

#[test]
fn the_agent_takes_pods_from_the_api_server() {
    if let Some(reason) = cni::unavailable() {
        skip(reason);
        return;
    }
    let Some(cluster) = Cluster::start() else {
        return;
    };
    eprintln!("API server ready in {:?}", cluster.api.started_in());
    let node = Node::new();
    let agent = Agent::start(node.config(&cluster.agent_kubeconfig));
    let ztunnel = FakeZtunnel::connect(&node.zds_socket());
    assert!(ztunnel.read_snapshot().is_empty());
    let network = node.network("198.18.30.0/24");

    an_ambient_pod_is_enrolled_with_its_api_identity_and_annotated(&cluster, &network, &ztunnel);
    a_pod_the_api_does_not_know_is_refused(&network);
    a_pod_outside_ambient_is_left_alone(&cluster, &network);
    a_pod_on_another_node_is_refused(&cluster, &network);
    the_del_of_a_sandbox_the_runtime_gave_up_on_leaves_the_pod_annotated(
        &cluster, &network, &ztunnel,
    );
    agent.stop();
}

/// (a) uid and service account come from the Pod object; rules go in; the
/// Pod is annotated `enabled`, and DEL removes the annotation.
fn an_ambient_pod_is_enrolled_with_its_api_identity_and_annotated(
    cluster: &Cluster,
    network: &CniNetwork,
    ztunnel: &FakeZtunnel,
) {
    let uid = cluster.create_pod("shop", "web-0", NODE);
    let pod_ns = NetNs::create("pod").unwrap();
    let pod = PodSandbox::new(&pod_ns, "shop", "web-0", &uid);
    let received = std::thread::scope(|scope| {
        let plugin = scope.spawn(|| network.add(&pod).unwrap());
        let received = ztunnel.receive_and_ack();
        let added = plugin.join().unwrap();
        assert!(
            added.plugin.success,
            "ADD failed: {} {}",
            added.plugin.stdout, added.plugin.stderr
        );
        received
    });
    let Payload::Add(add) = &received.payload else {
        panic!("expected an add")
    };
    assert_eq!(add.uid, uid, "the Pod's metadata.uid");
    assert_eq!(received.fds.len(), 1, "the pod's netns goes with the add");
    let info = add.workload_info.as_ref().unwrap();
    assert_eq!(
        (
            info.name.as_str(),
            info.namespace.as_str(),
            info.service_account.as_str()
        ),
        ("web-0", "shop", "web-0-account"),
        "the Pod's service account"
    );
    let rules = our_rules(&pod_ns);
    assert!(
        rules.iter().any(|rule| rule == "-A OUTPUT -j ISTIO_OUTPUT"),
        "{rules:#?}"
    );
    cluster.wait_for_redirection("shop", "web-0", Some("enabled"));

    let deleted = std::thread::scope(|scope| {
        let plugin = scope.spawn(|| network.del(&pod).unwrap());
        let received = ztunnel.receive_and_ack();
        assert!(plugin.join().unwrap().success);
        received
    });
    assert!(matches!(deleted.payload, Payload::Del(_)));
    cluster.wait_for_redirection("shop", "web-0", None);
}

/// (b) A pod the API server has never heard of fails ADD, saying so.
fn a_pod_the_api_does_not_know_is_refused(network: &CniNetwork) {
    let pod_ns = NetNs::create("pod").unwrap();
    let pod = PodSandbox::new(&pod_ns, "shop", "ghost", "");
    let added = network.add(&pod).unwrap();
    assert!(!added.plugin.success, "ADD of an unknown pod succeeded");
    assert!(
        added
            .plugin
            .stdout
            .contains("pod shop/ghost is not known to the API server"),
        "{}",
        added.plugin.stdout
    );
    assert!(our_rules(&pod_ns).is_empty());
    network.del(&pod).unwrap();
}

/// (c) A pod in a namespace without the ambient label starts as it is:
/// the ADD succeeds (the plugin reports every pod, and the agent decides),
/// and nothing is installed, handed to ztunnel or annotated.
fn a_pod_outside_ambient_is_left_alone(cluster: &Cluster, network: &CniNetwork) {
    let uid = cluster.create_pod("plain", "app-0", NODE);
    let pod_ns = NetNs::create("pod").unwrap();
    let pod = PodSandbox::new(&pod_ns, "plain", "app-0", &uid);
    let added = network.add(&pod).unwrap();
    assert!(
        added.plugin.success,
        "ADD outside ambient failed: {} {}",
        added.plugin.stdout, added.plugin.stderr
    );
    assert!(our_rules(&pod_ns).is_empty());
    assert_eq!(cluster.redirection("plain", "app-0"), None);
    network.del(&pod).unwrap();
}

/// (d) A pod scheduled on another node is refused by this node's agent.
fn a_pod_on_another_node_is_refused(cluster: &Cluster, network: &CniNetwork) {
    let uid = cluster.create_pod("shop", "web-b", "node-b");
    let pod_ns = NetNs::create("pod").unwrap();
    let pod = PodSandbox::new(&pod_ns, "shop", "web-b", &uid);
    let added = network.add(&pod).unwrap();
    assert!(!added.plugin.success, "ADD of another node's pod succeeded");
    assert!(
        added
            .plugin
            .stdout
            .contains("pod shop/web-b is on node node-b, not this one"),
        "{}",
        added.plugin.stdout
    );
    assert!(our_rules(&pod_ns).is_empty());
    assert_eq!(cluster.redirection("shop", "web-b"), None);
    network.del(&pod).unwrap();
}

/// (e) The DEL of a sandbox the runtime gave up on (its ADD was not
/// answered in time), handled after the ADD of the sandbox that replaced
/// it, leaves the pod in the mesh and its annotation `enabled`; the
/// replacement's own DEL removes both.
fn the_del_of_a_sandbox_the_runtime_gave_up_on_leaves_the_pod_annotated(
    cluster: &Cluster,
    network: &CniNetwork,
    ztunnel: &FakeZtunnel,
) {
    let uid = cluster.create_pod("shop", "web-r", NODE);
    let first_ns = NetNs::create("pod").unwrap();
    let first = PodSandbox::new(&first_ns, "shop", "web-r", &uid);
    let second_ns = NetNs::create("pod").unwrap();
    let second = PodSandbox::new(&second_ns, "shop", "web-r", &uid);
    std::thread::scope(|scope| {
        let plugin = scope.spawn(|| network.add(&second).unwrap());
        assert!(matches!(ztunnel.receive_and_ack().payload, Payload::Add(_)));
        assert!(plugin.join().unwrap().plugin.success);
    });
    cluster.wait_for_redirection("shop", "web-r", Some("enabled"));

    let deleted = network.del(&first).unwrap();
    assert!(deleted.success, "{}", deleted.stdout);
    assert_eq!(
        cluster.redirection("shop", "web-r").as_deref(),
        Some("enabled")
    );
    assert!(!our_rules(&second_ns).is_empty());

    let deleted = std::thread::scope(|scope| {
        let plugin = scope.spawn(|| network.del(&second).unwrap());
        let received = ztunnel.receive_and_ack();
        assert!(plugin.join().unwrap().success);
        received
    });
    let Payload::Del(del) = &deleted.payload else {
        panic!("expected a del, got {:?}", deleted.payload)
    };
    assert_eq!(del.uid, uid);
    cluster.wait_for_redirection("shop", "web-r", None);
}
