//! A container runtime's CNI calls, for tests: the real `bridge` plugin
//! with `host-local` IPAM (Debian's containernetworking-plugins in
//! `/usr/lib/cni`) run inside a test "node" namespace, then a chained
//! plugin under test (e.g. `ztunnel-cni`) with the bridge's result as
//! `prevResult`, the CNI environment and `CNI_ARGS` of a Kubernetes pod.
//!
//! The bridge lives in the node namespace and each pod gets a veth into
//! it, with an address from the network's subnet (inside 198.18.0.0/15)
//! and the bridge as gateway. IPAM leases are kept in a temporary
//! directory owned by the [`CniNetwork`], never in /var/lib/cni.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::{Value, json};

use crate::netns::NetNs;

/// Where Debian installs the reference plugins.
pub const CNI_BIN_DIR: &str = "/usr/lib/cni";
/// The CNI spec version the runtime speaks.
pub const CNI_VERSION: &str = "1.0.0";
/// Longest a plugin may run before the test gives up on it (and kills it).
const PLUGIN_TIMEOUT: Duration = Duration::from_secs(30);

/// Tells why CNI tests cannot run here, if they cannot: everything
/// [`crate::netns::unavailable`] needs, plus the bridge and host-local
/// plugins and iptables-restore.
pub fn unavailable() -> Option<String> {
    if let Some(reason) = crate::netns::unavailable() {
        return Some(reason);
    }
    for plugin in ["bridge", "host-local"] {
        if !Path::new(CNI_BIN_DIR).join(plugin).exists() {
            return Some(format!(
                "{CNI_BIN_DIR}/{plugin} is missing (apt-get install containernetworking-plugins)"
            ));
        }
    }
    let restore = Command::new("iptables-restore")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if restore.is_err() {
        return Some("`iptables-restore` is not installed (apt-get install iptables)".into());
    }
    None
}

/// A pod sandbox as the runtime describes it to plugins.
#[derive(Debug, Clone, Copy)]
pub struct PodSandbox<'a> {
    /// The pod's network namespace (`CNI_NETNS` is its /run/netns path).
    pub netns: &'a NetNs,
    /// `K8S_POD_NAMESPACE`.
    pub namespace: &'a str,
    /// `K8S_POD_NAME`.
    pub name: &'a str,
    /// `K8S_POD_UID`.
    pub uid: &'a str,
    /// `CNI_IFNAME`, the interface inside the pod.
    pub ifname: &'a str,
}

impl<'a> PodSandbox<'a> {
    /// A pod whose interface is `eth0`.
    pub fn new(netns: &'a NetNs, namespace: &'a str, name: &'a str, uid: &'a str) -> Self {
        PodSandbox {
            netns,
            namespace,
            name,
            uid,
            ifname: "eth0",
        }
    }

    /// `CNI_NETNS`.
    pub fn netns_path(&self) -> PathBuf {
        self.netns.path()
    }

    /// `CNI_CONTAINERID`: the namespace name, unique per sandbox.
    pub fn container_id(&self) -> &str {
        self.netns.name()
    }

    /// `CNI_ARGS`, as kubelet's runtimes write it.
    pub fn cni_args(&self) -> String {
        format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={};K8S_POD_INFRA_CONTAINER_ID={};K8S_POD_UID={}",
            self.namespace,
            self.name,
            self.container_id(),
            self.uid
        )
    }
}

/// One run of a plugin binary.
#[derive(Debug, Clone)]
pub struct PluginRun {
    /// Exit status zero.
    pub success: bool,
    /// Result, or error JSON.
    pub stdout: String,
    /// Diagnostics.
    pub stderr: String,
}

impl PluginRun {
    /// Stdout as JSON.
    pub fn json(&self) -> anyhow::Result<Value> {
        serde_json::from_str(&self.stdout)
            .with_context(|| format!("plugin stdout is not JSON: {:?}", self.stdout))
    }
}

/// What an ADD through the chain produced.
#[derive(Debug, Clone)]
pub struct AddOutcome {
    /// The bridge plugin's result, which the chained plugin got as
    /// `prevResult`.
    pub bridge_result: Value,
    /// The chained plugin's run.
    pub plugin: PluginRun,
}

/// A node's pod network: a bridge in the node namespace, host-local IPAM
/// over one subnet, and the chained plugin after it.
#[derive(Debug)]
pub struct CniNetwork {
    /// The node namespace's name; plugins run inside it.
    node: String,
    /// The chained plugin binary.
    plugin: PathBuf,
    /// `agent_socket` in the chained plugin's configuration.
    agent_socket: PathBuf,
    /// The pod subnet, inside 198.18.0.0/15.
    subnet: String,
    /// `ambient_namespaces` of the chained plugin.
    ambient_namespaces: Vec<String>,
    /// host-local's `dataDir`.
    ipam_dir: tempfile::TempDir,
}

impl CniNetwork {
    /// A network in `node` over `subnet` (e.g. `198.18.10.0/24`), chaining
    /// `plugin` configured to reach its agent at `agent_socket`. Pods of no
    /// namespace are ambient until [`CniNetwork::ambient_namespaces`] says.
    pub fn new(
        node: &NetNs,
        subnet: &str,
        plugin: &Path,
        agent_socket: &Path,
    ) -> anyhow::Result<CniNetwork> {
        Ok(CniNetwork {
            node: node.name().to_owned(),
            plugin: plugin.to_owned(),
            agent_socket: agent_socket.to_owned(),
            subnet: subnet.to_owned(),
            ambient_namespaces: Vec::new(),
            ipam_dir: tempfile::tempdir()?,
        })
    }

    /// Sets the plugin's `ambient_namespaces` (`"*"` for all).
    pub fn ambient_namespaces(mut self, namespaces: &[&str]) -> Self {
        self.ambient_namespaces = namespaces.iter().map(|ns| (*ns).to_owned()).collect();
        self
    }

    /// The bridge plugin's configuration.
    pub fn bridge_config(&self) -> Value {
        json!({
            "cniVersion": CNI_VERSION,
            "name": "zt-test",
            "type": "bridge",
            "bridge": "ztbr0",
            "isGateway": true,
            "ipMasq": false,
            "ipam": {
                "type": "host-local",
                "subnet": self.subnet,
                "dataDir": self.ipam_dir.path(),
            },
        })
    }

    /// The chained plugin's configuration, with `prev_result` if given.
    pub fn plugin_config(&self, prev_result: Option<&Value>) -> Value {
        let mut config = json!({
            "cniVersion": CNI_VERSION,
            "name": "zt-test",
            "type": "ztunnel-cni",
            "agent_socket": self.agent_socket,
            "ambient_namespaces": self.ambient_namespaces,
        });
        if let Some(prev) = prev_result {
            config["prevResult"] = prev.clone();
        }
        config
    }

    /// ADD: the bridge (which must succeed), then the chained plugin with
    /// the bridge's result.
    pub fn add(&self, pod: &PodSandbox<'_>) -> anyhow::Result<AddOutcome> {
        let bridge = self.run(
            Path::new(CNI_BIN_DIR).join("bridge").as_path(),
            "ADD",
            pod,
            &self.bridge_config(),
        )?;
        if !bridge.success {
            bail!("bridge ADD failed: {} {}", bridge.stdout, bridge.stderr);
        }
        let bridge_result = bridge.json()?;
        let plugin = self.run(
            &self.plugin,
            "ADD",
            pod,
            &self.plugin_config(Some(&bridge_result)),
        )?;
        Ok(AddOutcome {
            bridge_result,
            plugin,
        })
    }

    /// DEL in the runtime's order: the chained plugin, then the bridge
    /// (which must succeed). Returns the chained plugin's run.
    pub fn del(&self, pod: &PodSandbox<'_>) -> anyhow::Result<PluginRun> {
        let plugin = self.run(&self.plugin, "DEL", pod, &self.plugin_config(None))?;
        let bridge = self.run(
            Path::new(CNI_BIN_DIR).join("bridge").as_path(),
            "DEL",
            pod,
            &self.bridge_config(),
        )?;
        if !bridge.success {
            bail!("bridge DEL failed: {} {}", bridge.stdout, bridge.stderr);
        }
        Ok(plugin)
    }

    /// CHECK of the chained plugin alone, with the result of the ADD.
    pub fn check(&self, pod: &PodSandbox<'_>, prev_result: &Value) -> anyhow::Result<PluginRun> {
        self.run(
            &self.plugin,
            "CHECK",
            pod,
            &self.plugin_config(Some(prev_result)),
        )
    }

    /// Runs the chained plugin with any command and configuration.
    pub fn run_plugin(
        &self,
        command: &str,
        pod: &PodSandbox<'_>,
        config: &Value,
    ) -> anyhow::Result<PluginRun> {
        self.run(&self.plugin, command, pod, config)
    }

    /// Runs `binary` inside the node namespace with a runtime's environment
    /// (and nothing else from ours) and `config` on stdin.
    fn run(
        &self,
        binary: &Path,
        command: &str,
        pod: &PodSandbox<'_>,
        config: &Value,
    ) -> anyhow::Result<PluginRun> {
        let plugin_dir = self.plugin.parent().map(Path::to_owned).unwrap_or_default();
        let cni_path = format!("{CNI_BIN_DIR}:{}", plugin_dir.display());
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.node])
            .arg(binary)
            .env_clear()
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", pod.container_id())
            .env("CNI_NETNS", pod.netns_path())
            .env("CNI_IFNAME", pod.ifname)
            .env("CNI_ARGS", pod.cni_args())
            .env("CNI_PATH", cni_path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let output = match finish(&mut child, config.to_string()) {
            Ok(output) => output,
            Err(error) => {
                // Whatever went wrong, the child is reaped, not left behind.
                let _ = child.kill();
                let _ = child.wait();
                return Err(error.context(format!("{} {command}", binary.display())));
            }
        };
        Ok(PluginRun {
            success: output.status.success(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        })
    }
}

/// What a finished plugin wrote, and how it exited.
struct Output {
    status: ExitStatus,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

/// Writes `input` to the child's stdin and collects its stdout and stderr,
/// each on a thread of its own so that no pipe can stall the others, then
/// reaps it. An error (a pipe failing, or the child outliving
/// [`PLUGIN_TIMEOUT`]) leaves the child to the caller to kill and reap.
fn finish(child: &mut Child, input: String) -> anyhow::Result<Output> {
    let (Some(mut stdin), Some(mut stdout), Some(mut stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        bail!("the plugin's stdio is not piped");
    };
    let (done, finished) = mpsc::channel();
    std::thread::spawn(move || {
        let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
        let errors = std::thread::spawn(move || {
            let mut bytes = Vec::new();
            stderr.read_to_end(&mut bytes).map(|_| bytes)
        });
        let mut out = Vec::new();
        let out = stdout.read_to_end(&mut out).map(|_| out);
        let _ = done.send((joined(writer), out, joined(errors)));
    });
    let (written, stdout, stderr) = finished
        .recv_timeout(PLUGIN_TIMEOUT)
        .map_err(|_| anyhow::anyhow!("did not finish within {PLUGIN_TIMEOUT:?}"))?;
    written.context("writing the configuration to stdin")?;
    Ok(Output {
        stdout: stdout.context("reading stdout")?,
        stderr: stderr.context("reading stderr")?,
        status: child.wait().context("waiting for the plugin")?,
    })
}

/// The result of a pipe thread; a panic counts as an I/O error.
fn joined<T>(thread: std::thread::JoinHandle<std::io::Result<T>>) -> std::io::Result<T> {
    thread
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("pipe thread panicked")))
}
