//! The node agent with its pods from a real API server (etcd and
//! kube-apiserver from `scripts/k8s-test-env.sh`), running as a service
//! account bound to exactly `deploy/rbac/node-agent.yaml`. Pods are
//! created through the API and added through the real CNI chain (bridge,
//! host-local, our plugin) in test network namespaces; a fake ztunnel on
//! the ZDS socket sees what the agent hands over. Needs root, `ip`,
//! `iptables` and the reference CNI plugins, and the API server binaries;
//! skips, with the reason, without them.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use tokio::runtime::Runtime;
use ztunnel_cni::agent::{AgentConfig, KubeCredentials};
use ztunnel_proto::istio::workload::zds::workload_request::Payload;
use ztunnel_test_support::cni::{self, CniNetwork, PodSandbox};
use ztunnel_test_support::kube::KubeApi;
use ztunnel_test_support::kube::objects::{
    PodSpecForTest, create_pod, ensure_namespace, service_account_with_role,
};
use ztunnel_test_support::netns::NetNs;

use rules::our_rules;
use running_agent::Agent;
use ztunnel::FakeZtunnel;

#[path = "support/rules.rs"]
mod rules;
#[path = "support/running_agent.rs"]
mod running_agent;
#[path = "e2e/ztunnel.rs"]
mod ztunnel;

const PLUGIN: &str = env!("CARGO_BIN_EXE_ztunnel-cni");

/// The role the agent ships with.
const ROLE: &str = include_str!("../../deploy/rbac/node-agent.yaml");

/// The annotation the agent writes.
const REDIRECTION: &str = "ambient.istio.io/redirection";

/// The node the agent under test runs on.
const NODE: &str = "node-a";

/// How long an annotation may take to show: the agent writes it before it
/// answers the plugin; the bound is generous for a busy machine.
const CONVERGE: Duration = Duration::from_secs(10);

/// The API server with the agent's service account bound to the shipped
/// role, an ambient and a plain namespace, and an admin client.
struct Cluster {
    runtime: Runtime,
    api: KubeApi,
    admin: kube::Client,
    agent_kubeconfig: PathBuf,
}

impl Cluster {
    fn start() -> Option<Cluster> {
        let runtime = Runtime::new().unwrap();
        let api = KubeApi::start().unwrap()?;
        api.kubectl(&["apply", "-f", "-"], Some(ROLE)).unwrap();
        let (admin, token) = runtime.block_on(async {
            let admin = api.admin_client().await.unwrap();
            ensure_namespace(&admin, "istio-system", &[]).await.unwrap();
            ensure_namespace(&admin, "shop", &[("istio.io/dataplane-mode", "ambient")])
                .await
                .unwrap();
            ensure_namespace(&admin, "plain", &[]).await.unwrap();
            let token = service_account_with_role(
                &admin,
                "istio-system",
                "ztunnel-node-agent",
                "ztunnel-node-agent",
            )
            .await
            .unwrap();
            (admin, token)
        });
        let agent_kubeconfig = api.kubeconfig_for_token("node-agent", &token).unwrap();
        Some(Cluster {
            runtime,
            api,
            admin,
            agent_kubeconfig,
        })
    }

    /// Creates a pod bound to `node`; returns its uid.
    fn create_pod(&self, namespace: &str, name: &str, node: &str) -> String {
        let spec = PodSpecForTest {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            service_account: format!("{name}-account"),
            node: node.to_owned(),
            ..PodSpecForTest::default()
        };
        self.runtime
            .block_on(create_pod(&self.admin, &spec))
            .unwrap()
    }

    /// The pod's redirection annotation, as the API server has it.
    fn redirection(&self, namespace: &str, name: &str) -> Option<String> {
        let api: Api<Pod> = Api::namespaced(self.admin.clone(), namespace);
        let pod = self.runtime.block_on(api.get(name)).unwrap();
        pod.metadata
            .annotations
            .unwrap_or_default()
            .get(REDIRECTION)
            .cloned()
    }

    /// Waits until the annotation is `expected`, or panics with the last.
    fn wait_for_redirection(&self, namespace: &str, name: &str, expected: Option<&str>) {
        let deadline = Instant::now() + CONVERGE;
        loop {
            let got = self.redirection(namespace, name);
            if got.as_deref() == expected {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{namespace}/{name}: annotation {got:?}, expected {expected:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A node network namespace and a temp dir for sockets and state.
struct Node {
    dir: tempfile::TempDir,
    netns: NetNs,
}

impl Node {
    fn new() -> Node {
        Node {
            dir: tempfile::tempdir().unwrap(),
            netns: NetNs::create("node").unwrap(),
        }
    }

    fn plugin_socket(&self) -> PathBuf {
        self.dir.path().join("run/pluginevent.sock")
    }

    fn zds_socket(&self) -> PathBuf {
        self.dir.path().join("ztunnel/ztunnel.sock")
    }

    fn config(&self, kubeconfig: &Path) -> AgentConfig {
        let credentials = KubeCredentials::Kubeconfig(kubeconfig.to_owned());
        let mut config = AgentConfig::with_kubernetes(credentials, NODE.to_owned());
        config.plugin_socket = self.plugin_socket();
        config.zds_socket = self.zds_socket();
        config.state_dir = self.dir.path().join("state");
        config
    }

    /// The CNI chain with a plugin that posts every pod: what the agent
    /// accepts is the agent's decision under test.
    fn network(&self, subnet: &str) -> CniNetwork {
        CniNetwork::new(
            &self.netns,
            subnet,
            Path::new(PLUGIN),
            &self.plugin_socket(),
        )
        .unwrap()
        .ambient_namespaces(&["*"])
    }
}

#[test]
fn the_agent_takes_pods_from_the_api_server() {
    if let Some(reason) = cni::unavailable() {
        eprintln!("skipping: {reason}");
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
    a_pod_outside_ambient_is_not_enrolled(&cluster, &network);
    a_pod_on_another_node_is_refused(&cluster, &network);
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

/// (c) A pod in a namespace without the ambient label is refused, and
/// nothing is installed or annotated.
fn a_pod_outside_ambient_is_not_enrolled(cluster: &Cluster, network: &CniNetwork) {
    let uid = cluster.create_pod("plain", "app-0", NODE);
    let pod_ns = NetNs::create("pod").unwrap();
    let pod = PodSandbox::new(&pod_ns, "plain", "app-0", &uid);
    let added = network.add(&pod).unwrap();
    assert!(!added.plugin.success, "ADD outside ambient succeeded");
    assert!(
        added
            .plugin
            .stdout
            .contains("pod plain/app-0 is not enrolled in ambient"),
        "{}",
        added.plugin.stdout
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
