//! The agent installing its plugin (KUBERNETES.md B6), in-process, into
//! temporary CNI directories: the binary and chained entry put in place at
//! start, readiness on `/readyz` following them, a removed entry put back,
//! and both taken out on exit unless an upgrade keeps them. Needs no root.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ztunnel_cni::agent::AgentConfig;
use ztunnel_cni::agent::install::InstallConfig;

use running_agent::Agent;

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

    fn config(&self, plugin: &Path, keep_cni_on_exit: bool) -> AgentConfig {
        let mut config = AgentConfig::with_registry(self.path("pods.yaml"));
        config.plugin_socket = self.path("run/pluginevent.sock");
        config.zds_socket = self.path("ztunnel/ztunnel.sock");
        config.state_dir = self.path("state");
        let mut install = InstallConfig::new(plugin.to_owned());
        install.bin_dir = self.path("bin");
        install.conf_dir = self.path("net.d");
        install.entry.ambient_namespaces = vec!["*".into()];
        config.install = Some(install);
        config.keep_cni_on_exit = keep_cni_on_exit;
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
    let config = node.config(Path::new(PLUGIN), false);
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
    let agent = Agent::start(node.config(Path::new(PLUGIN), false));
    node.wait_for_readiness(200);

    std::fs::write(node.conf(), BRIDGE).unwrap();
    node.wait_for_readiness(503);
    node.wait_for_readiness(200);
    assert_eq!(node.chain(), ["bridge", "portmap", "ztunnel-cni"]);
    agent.stop();
}

#[test]
fn a_stopped_agent_takes_its_entry_and_binary_out() {
    let node = Node::new();
    let agent = Agent::start(node.config(Path::new(PLUGIN), false));
    node.wait_for_readiness(200);
    agent.stop();

    assert_eq!(node.chain(), ["bridge", "portmap"]);
    assert!(!node.installed_binary().exists());
}

#[test]
fn an_agent_stopped_for_an_upgrade_leaves_its_entry_and_binary() {
    let node = Node::new();
    let agent = Agent::start(node.config(Path::new(PLUGIN), true));
    node.wait_for_readiness(200);
    agent.stop();

    assert_eq!(node.chain(), ["bridge", "portmap", "ztunnel-cni"]);
    assert!(node.installed_binary().exists());
}

#[test]
fn an_agent_that_cannot_install_keeps_serving_unready() {
    let node = Node::new();
    let missing = node.path("no-such-plugin");
    let agent = Agent::start(node.config(&missing, false));
    assert_eq!(node.probe("/readyz"), 503);
    assert_eq!(node.probe("/healthz"), 200);
    assert_eq!(node.chain(), ["bridge", "portmap"]);

    std::fs::copy(PLUGIN, &missing).unwrap();
    // The watcher checks again when it starts and after each failure.
    node.wait_for_readiness(200);
    assert_eq!(node.chain(), ["bridge", "portmap", "ztunnel-cni"]);
    agent.stop();
}
