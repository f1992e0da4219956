//! The API server and a node for the agent's Kubernetes tests: etcd and
//! kube-apiserver (from `scripts/k8s-test-env.sh`) with the agent's
//! service account bound to exactly `deploy/rbac/node-agent.yaml`, an
//! ambient and a plain namespace, an admin client; and a node network
//! namespace with a temporary directory for the agent's sockets and state.

#![allow(dead_code)] // each test crate that includes this uses part of it

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use tokio::runtime::Runtime;
use ztunnel_cni::agent::{AgentConfig, KubeCredentials};
use ztunnel_test_support::cni::CniNetwork;
use ztunnel_test_support::kube::KubeApi;
use ztunnel_test_support::kube::objects::{
    PodSpecForTest, create_pod, ensure_namespace, service_account_with_role,
};
use ztunnel_test_support::netns::NetNs;

pub const PLUGIN: &str = env!("CARGO_BIN_EXE_ztunnel-cni");

/// The role the agent ships with.
pub const ROLE: &str = include_str!("../../../deploy/rbac/node-agent.yaml");

/// The annotation the agent writes.
pub const REDIRECTION: &str = "ambient.istio.io/redirection";

/// The node the agent under test runs on.
pub const NODE: &str = "node-a";

/// How long an annotation may take to show: the agent writes it before it
/// answers the plugin; the bound is generous for a busy machine.
pub const CONVERGE: Duration = Duration::from_secs(10);

/// The API server with the agent's service account bound to the shipped
/// role, an ambient and a plain namespace, and an admin client.
pub struct Cluster {
    pub runtime: Runtime,
    pub api: KubeApi,
    pub admin: kube::Client,
    pub agent_kubeconfig: PathBuf,
}

impl Cluster {
    pub fn start() -> Option<Cluster> {
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
    pub fn create_pod(&self, namespace: &str, name: &str, node: &str) -> String {
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
    pub fn redirection(&self, namespace: &str, name: &str) -> Option<String> {
        let api: Api<Pod> = Api::namespaced(self.admin.clone(), namespace);
        let pod = self.runtime.block_on(api.get(name)).unwrap();
        pod.metadata
            .annotations
            .unwrap_or_default()
            .get(REDIRECTION)
            .cloned()
    }

    /// Waits until the annotation is `expected`, or panics with the last.
    pub fn wait_for_redirection(&self, namespace: &str, name: &str, expected: Option<&str>) {
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
pub struct Node {
    pub dir: tempfile::TempDir,
    pub netns: NetNs,
}

impl Node {
    pub fn new() -> Node {
        Node {
            dir: tempfile::tempdir().unwrap(),
            netns: NetNs::create("node").unwrap(),
        }
    }

    pub fn plugin_socket(&self) -> PathBuf {
        self.dir.path().join("run/pluginevent.sock")
    }

    pub fn zds_socket(&self) -> PathBuf {
        self.dir.path().join("ztunnel/ztunnel.sock")
    }

    pub fn config(&self, kubeconfig: &Path) -> AgentConfig {
        let credentials = KubeCredentials::Kubeconfig(kubeconfig.to_owned());
        let mut config = AgentConfig::with_kubernetes(credentials, NODE.to_owned());
        config.plugin_socket = self.plugin_socket();
        config.zds_socket = self.zds_socket();
        config.state_dir = self.dir.path().join("state");
        config
    }

    /// The CNI chain with a plugin that posts every pod: what the agent
    /// accepts is the agent's decision under test.
    pub fn network(&self, subnet: &str) -> CniNetwork {
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
