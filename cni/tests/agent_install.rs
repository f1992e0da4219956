//! The agent installing its plugin (KUBERNETES.md B6), in-process, into
//! temporary CNI directories: the binary and chained entry put in place at
//! start, readiness on `/readyz` following them, a removed entry put back,
//! and both taken out on exit unless kept for the next agent, when the
//! plugin left behind fails the pods it would capture. Needs no root.
//!
//! Whether they are kept is asked of a real API server (etcd and
//! kube-apiserver from `scripts/k8s-test-env.sh`, the agent bound to
//! exactly `deploy/rbac/node-agent.yaml`): that test skips, with the
//! reason, without the binaries.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetSpec};
use k8s_openapi::api::core::v1::{
    Affinity, Container, Node as NodeObject, NodeAffinity, NodeSelector, NodeSelectorRequirement,
    NodeSelectorTerm, Pod, PodSpec, PodTemplateSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use ztunnel_cni::agent::install::InstallConfig;
use ztunnel_cni::agent::upgrade::{AgentPod, ExitPolicy};
use ztunnel_cni::agent::{AgentConfig, KubeCredentials};

use api::Cluster;
use running_agent::Agent;

#[path = "support/api.rs"]
mod api;
#[path = "support/running_agent.rs"]
mod running_agent;

const PLUGIN: &str = env!("CARGO_BIN_EXE_ztunnel-cni");

/// The primary network's configuration, as a runtime's installer leaves it.
const BRIDGE: &str = r#"{
  "cniVersion": "1.0.0",
  "name": "pods",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "ipam": {"type": "host-local", "subnet": "10.88.0.0/16"}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
"#;

/// The file the bridge network is in.
const CONF_NAME: &str = "10-bridge.conflist";

/// How long a state the agent reaches on its own may take to show: a
/// repair waits for events to settle first; the bound is generous for a
/// busy machine.
const CONVERGE: Duration = Duration::from_secs(10);

/// One agent's directories, sockets and readiness address.
struct Node {
    dir: tempfile::TempDir,
    readiness: SocketAddr,
}

impl Node {
    fn new() -> Node {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("pods.yaml"), "[]\n").unwrap();
        std::fs::create_dir_all(dir.path().join("net.d")).unwrap();
        std::fs::write(dir.path().join("net.d").join(CONF_NAME), BRIDGE).unwrap();
        let readiness = ztunnel_test_support::ports::unused_loopback_port().unwrap();
        Node { dir, readiness }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn conf(&self) -> PathBuf {
        self.path("net.d").join(CONF_NAME)
    }

    fn installed_binary(&self) -> PathBuf {
        self.path("bin").join("ztunnel-cni")
    }

    fn config(&self, plugin: &Path, on_exit: ExitPolicy) -> AgentConfig {
        self.config_with(
            AgentConfig::with_registry(self.path("pods.yaml")),
            plugin,
            on_exit,
        )
    }

    /// An agent of the API server's node `api::NODE`, as its pod `pod_name`
    /// in `istio-system`, with Istio's safe upgrade.
    fn kube_config(&self, cluster: &Cluster, pod_name: Option<&str>) -> AgentConfig {
        let credentials = KubeCredentials::Kubeconfig(cluster.agent_kubeconfig.clone());
        let mut config = AgentConfig::with_kubernetes(credentials, api::NODE.to_owned());
        config.agent_pod = AgentPod {
            namespace: SYSTEM.to_owned(),
            name: pod_name.map(str::to_owned),
        };
        self.config_with(config, Path::new(PLUGIN), ExitPolicy::SafeUpgrade)
    }

    fn config_with(
        &self,
        mut config: AgentConfig,
        plugin: &Path,
        on_exit: ExitPolicy,
    ) -> AgentConfig {
        config.plugin_socket = self.path("run/pluginevent.sock");
        config.zds_socket = self.path("ztunnel/ztunnel.sock");
        config.state_dir = self.path("state");
        let mut install = InstallConfig::new(plugin.to_owned());
        install.bin_dir = self.path("bin");
        install.conf_dir = self.path("net.d");
        // As the chart has the agent write it: every pod reported but
        // kube-system's, the agent's own namespace included.
        install.entry.ambient_namespaces = vec!["*".into()];
        install.entry.exclude_namespaces = vec!["kube-system".into()];
        config.install = Some(install);
        config.on_exit = on_exit;
        config.readiness_listen = Some(self.readiness);
        config
    }

    /// The status of `GET path` on the readiness address.
    fn probe(&self, path: &str) -> u16 {
        let mut stream = TcpStream::connect(self.readiness).unwrap();
        stream.set_read_timeout(Some(CONVERGE)).unwrap();
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        response
            .split(' ')
            .nth(1)
            .and_then(|status| status.parse().ok())
            .unwrap_or_else(|| panic!("not an HTTP response: {response:?}"))
    }

    fn wait_for_readiness(&self, status: u16) {
        let deadline = Instant::now() + CONVERGE;
        while self.probe("/readyz") != status {
            assert!(Instant::now() < deadline, "/readyz never answered {status}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Runs the installed binary with its installed entry as a runtime
    /// would for an ADD of `namespace/name` after the bridge plugin: whether
    /// it succeeded, and what it printed.
    fn add_through_installed_plugin(
        &self,
        namespace: &str,
        name: &str,
    ) -> (bool, serde_json::Value) {
        let list: serde_json::Value =
            serde_json::from_slice(&std::fs::read(self.conf()).unwrap()).unwrap();
        let mut config = list["plugins"][2].clone();
        config["cniVersion"] = list["cniVersion"].clone();
        config["name"] = list["name"].clone();
        config["prevResult"] = serde_json::json!({
            "cniVersion": "1.0.0",
            "interfaces": [{"name": "eth0", "sandbox": "/var/run/netns/pod"}],
            "ips": [{"address": "10.88.0.7/16", "interface": 0}],
        });
        let mut child = Command::new(self.installed_binary())
            .env_clear()
            .env("CNI_COMMAND", "ADD")
            .env("CNI_CONTAINERID", "c1")
            .env("CNI_NETNS", "/var/run/netns/pod")
            .env("CNI_IFNAME", "eth0")
            .env(
                "CNI_ARGS",
                format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name}"),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(config.to_string().as_bytes())
            .unwrap();
        let output = child.wait_with_output().unwrap();
        let printed = serde_json::from_slice(&output.stdout).unwrap_or(serde_json::Value::Null);
        (output.status.success(), printed)
    }

    /// The `type` of each plugin in the bridge network's list.
    fn chain(&self) -> Vec<String> {
        let conf: serde_json::Value =
            serde_json::from_slice(&std::fs::read(self.conf()).unwrap()).unwrap();
        conf["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .map(|plugin| plugin["type"].as_str().unwrap().to_owned())
            .collect()
    }
}

#[test]
fn the_agent_installs_its_plugin_and_is_ready_once_it_is_in_place() {
    let node = Node::new();
    let config = node.config(Path::new(PLUGIN), ExitPolicy::SafeUpgrade);
    let plugin_socket = config.plugin_socket.clone();
    let agent = Agent::start(config);
    node.wait_for_readiness(200);
    assert_eq!(node.probe("/healthz"), 200);

    assert_eq!(node.chain(), ["bridge", "portmap", "ztunnel-cni"]);
    let conf: serde_json::Value =
        serde_json::from_slice(&std::fs::read(node.conf()).unwrap()).unwrap();
    assert_eq!(
        conf["plugins"][2]["agent_socket"]
            .as_str()
            .map(PathBuf::from),
        Some(plugin_socket),
        "the entry names the agent's own socket"
    );
    assert_eq!(
        std::fs::read(node.installed_binary()).unwrap(),
        std::fs::read(PLUGIN).unwrap()
    );
    agent.stop();
}

#[test]
fn a_removed_entry_makes_the_agent_unready_until_it_is_put_back() {
    let node = Node::new();
    let agent = Agent::start(node.config(Path::new(PLUGIN), ExitPolicy::SafeUpgrade));
    node.wait_for_readiness(200);

    std::fs::write(node.conf(), BRIDGE).unwrap();
    node.wait_for_readiness(503);
    node.wait_for_readiness(200);
    assert_eq!(node.chain(), ["bridge", "portmap", "ztunnel-cni"]);
    agent.stop();
}

#[test]
fn a_stopped_agent_without_the_api_takes_its_entry_and_binary_out() {
    let node = Node::new();
    let agent = Agent::start(node.config(Path::new(PLUGIN), ExitPolicy::SafeUpgrade));
    node.wait_for_readiness(200);
    agent.stop();

    assert_eq!(node.chain(), ["bridge", "portmap"]);
    assert!(!node.installed_binary().exists());
}

/// Between an agent that left its entry and the next one: the installed
/// plugin fails the ADD of a pod it would capture, so the kubelet retries
/// it until the next agent answers, and lets the next agent's own pod
/// start, which would otherwise wait for itself.
#[test]
fn an_agent_told_to_keep_its_entry_leaves_a_plugin_that_fails_pods_but_the_next_agents() {
    let node = Node::new();
    let agent = Agent::start(node.config(Path::new(PLUGIN), ExitPolicy::Keep));
    node.wait_for_readiness(200);
    agent.stop();

    assert_eq!(node.chain(), ["bridge", "portmap", "ztunnel-cni"]);
    assert!(node.installed_binary().exists());
    let (added, error) = node.add_through_installed_plugin("shop", "web-0");
    assert!(!added, "an ambient pod started with no agent: {error}");
    assert_eq!(error["code"], 11, "try again later: {error}");
    let (added, result) = node.add_through_installed_plugin("istio-system", "istio-cni-node-x7k2p");
    assert!(added, "the next agent's pod could not start: {result}");
    assert_eq!(
        result["ips"][0]["address"], "10.88.0.7/16",
        "passed through"
    );
    let (added, error) = node.add_through_installed_plugin("istio-system", "ztunnel-x7k2p");
    assert!(!added, "only the agent's own pods pass: {error}");
}

#[test]
fn an_agent_that_cannot_install_keeps_serving_unready() {
    let node = Node::new();
    let missing = node.path("no-such-plugin");
    let agent = Agent::start(node.config(&missing, ExitPolicy::SafeUpgrade));
    assert_eq!(node.probe("/readyz"), 503);
    assert_eq!(node.probe("/healthz"), 200);
    assert_eq!(node.chain(), ["bridge", "portmap"]);

    std::fs::copy(PLUGIN, &missing).unwrap();
    // The watcher checks again when it starts and after each failure.
    node.wait_for_readiness(200);
    assert_eq!(node.chain(), ["bridge", "portmap", "ztunnel-cni"]);
    agent.stop();
}

/// The agents' namespace, where their DaemonSet is.
const SYSTEM: &str = "istio-system";
/// The agent's DaemonSet, by the charts' name.
const DAEMON_SET: &str = "istio-cni-node";
/// The DaemonSet's pod that plays the stopping agent.
const AGENT_POD: &str = "istio-cni-node-x7k2p";
/// Holds the DaemonSet while it is being deleted, as a garbage collector
/// deleting its pods first would.
const HOLD: &str = "ztunnel.test/hold";

/// What a stopped agent left: the bridge network's chain, and whether the
/// installed binary is still there.
type Left = (Vec<String>, bool);

/// Istio's safe upgrade, asked of the API as the agent's shipped role
/// allows: at exit, the plugin, its entry and the binary stay only while
/// the DaemonSet of the agent's pod exists, is not being deleted and still
/// places a pod on this node.
#[test]
fn at_exit_the_entry_stays_only_while_the_agents_daemon_set_will_start_another_on_its_node() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let admin = cluster.admin.clone();
    let daemon_sets: Api<DaemonSet> = Api::namespaced(admin.clone(), SYSTEM);
    cluster.runtime.block_on(async {
        let node = NodeObject {
            metadata: ObjectMeta {
                name: Some(api::NODE.to_owned()),
                labels: Some([("kubernetes.io/os".to_owned(), "linux".to_owned())].into()),
                ..ObjectMeta::default()
            },
            ..NodeObject::default()
        };
        Api::<NodeObject>::all(admin.clone())
            .create(&PostParams::default(), &node)
            .await
            .unwrap();
        let created = daemon_sets
            .create(&PostParams::default(), &agent_daemon_set())
            .await
            .unwrap();
        Api::<Pod>::namespaced(admin.clone(), SYSTEM)
            .create(&PostParams::default(), &agent_pod(&created))
            .await
            .unwrap();
    });
    let stop_an_agent = |pod_name: Option<&str>| -> Left {
        let node = Node::new();
        let agent = Agent::start(node.kube_config(&cluster, pod_name));
        node.wait_for_readiness(200);
        agent.stop();
        (node.chain(), node.installed_binary().exists())
    };
    let kept: Left = (
        vec!["bridge".into(), "portmap".into(), "ztunnel-cni".into()],
        true,
    );
    let removed: Left = (vec!["bridge".into(), "portmap".into()], false);
    let change = |patch: serde_json::Value| {
        cluster
            .runtime
            .block_on(daemon_sets.patch(DAEMON_SET, &PatchParams::default(), &Patch::Merge(patch)))
            .unwrap();
    };

    assert_eq!(
        stop_an_agent(Some(AGENT_POD)),
        kept,
        "an upgrade or a reboot: the pod's DaemonSet still places an agent here"
    );
    assert_eq!(
        stop_an_agent(None),
        kept,
        "the same DaemonSet found by the charts' name, without the pod's name"
    );

    let zone_b = Affinity {
        node_affinity: Some(NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_expressions: Some(vec![NodeSelectorRequirement {
                        key: "zone".into(),
                        operator: "In".into(),
                        values: Some(vec!["b".into()]),
                    }]),
                    match_fields: None,
                }],
            }),
            ..NodeAffinity::default()
        }),
        ..Affinity::default()
    };
    change(serde_json::json!({"spec": {"template": {"spec": {"affinity": zone_b}}}}));
    assert_eq!(
        stop_an_agent(Some(AGENT_POD)),
        removed,
        "the DaemonSet's required node affinity no longer selects this node"
    );
    change(serde_json::json!({"spec": {"template": {"spec": {"affinity": null}}}}));

    cluster
        .runtime
        .block_on(daemon_sets.delete(DAEMON_SET, &DeleteParams::default()))
        .unwrap();
    assert_eq!(
        stop_an_agent(Some(AGENT_POD)),
        removed,
        "helm uninstall under way: the DaemonSet is being deleted"
    );

    change(serde_json::json!({"metadata": {"finalizers": null}}));
    let gone = cluster
        .runtime
        .block_on(daemon_sets.get_opt(DAEMON_SET))
        .unwrap();
    assert!(gone.is_none(), "released, the DaemonSet is deleted");
    assert_eq!(
        stop_an_agent(Some(AGENT_POD)),
        removed,
        "helm uninstall: the DaemonSet is gone"
    );
}

/// The agents' DaemonSet as the chart places it (Linux nodes), held by
/// [`HOLD`] once deleted.
fn agent_daemon_set() -> DaemonSet {
    let labels = || Some([("k8s-app".to_owned(), DAEMON_SET.to_owned())].into());
    DaemonSet {
        metadata: ObjectMeta {
            name: Some(DAEMON_SET.to_owned()),
            namespace: Some(SYSTEM.to_owned()),
            finalizers: Some(vec![HOLD.to_owned()]),
            ..ObjectMeta::default()
        },
        spec: DaemonSetSpec {
            selector: LabelSelector {
                match_labels: labels(),
                ..LabelSelector::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: labels(),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    node_selector: Some(
                        [("kubernetes.io/os".to_owned(), "linux".to_owned())].into(),
                    ),
                    containers: vec![agent_container()],
                    ..PodSpec::default()
                }),
            },
            ..DaemonSetSpec::default()
        },
        ..DaemonSet::default()
    }
}

/// The stopping agent's pod on `api::NODE`, controlled by `daemon_set`, as
/// the DaemonSet controller would have made it.
fn agent_pod(daemon_set: &DaemonSet) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(AGENT_POD.to_owned()),
            namespace: Some(SYSTEM.to_owned()),
            owner_references: Some(vec![OwnerReference {
                api_version: "apps/v1".to_owned(),
                kind: "DaemonSet".to_owned(),
                name: DAEMON_SET.to_owned(),
                uid: daemon_set.metadata.uid.clone().unwrap(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: Some(api::NODE.to_owned()),
            // The account `Cluster` binds to the shipped role.
            service_account_name: Some("ztunnel-node-agent".to_owned()),
            containers: vec![agent_container()],
            ..PodSpec::default()
        }),
        ..Pod::default()
    }
}

/// A container no kubelet runs; the image is never pulled.
fn agent_container() -> Container {
    Container {
        name: "install-cni".to_owned(),
        image: Some("registry.invalid/ztunnel-agent:test".to_owned()),
        ..Container::default()
    }
}
