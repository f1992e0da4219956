#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test
//! The node agent with exactly the Helm chart's RBAC: `helm template`
//! (the pinned helm from `scripts/k8s-test-env.sh`) of
//! `deploy/charts/ztunnel-mesh` is applied to a real API server, and the
//! `ztunnel-agent` binary runs as a process with the rendered DaemonSet's
//! args and environment, authenticated by a TokenRequest token of the
//! chart's `istio-cni` account, in a network namespace of its own (the
//! chart's pod is not on the host network); only the host paths become the
//! test's directories, and the host's netns, which the chart has it enter
//! for the probe rules (`ALLOW_SWITCH_TO_HOST_NS`), a test "node" netns.
//!
//! Its job: chain its plugin into the node's CNI configuration, become
//! ready, find a pod that was already running in an ambient namespace
//! (procfs), install its rules, hand it to ztunnel (a fake one on the ZDS
//! socket), annotate it `enabled`, put its address in the node's probe
//! ipset, and log nothing forbidden. The same run
//! with `patch` on `pods/status` taken out of the chart's ClusterRole must
//! fail the check.
//!
//! Needs root, `ip`, `iptables`, cgroup v2 and the API server and helm
//! binaries; skips with the reason otherwise.

use std::fs::File;
use std::path::PathBuf;
use std::process::Child;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::runtime::Runtime;
use ztunnel_proto::istio::workload::zds::workload_request::Payload;
use ztunnel_test_support::cni;
use ztunnel_test_support::helm::{Helm, Rendered, permission_problems};
use ztunnel_test_support::kube::KubeApi;
use ztunnel_test_support::kube::objects::{PodSpecForTest, ensure_namespace, request_token};
use ztunnel_test_support::netns::{self, NetNs, PortForward};

use rules::our_rules;
use running_pod::RunningPod;
use ztunnel::FakeZtunnel;

#[path = "support/rules.rs"]
mod rules;
#[path = "support/running_pod.rs"]
mod running_pod;
#[path = "e2e/ztunnel.rs"]
#[allow(dead_code)] // its snapshot reader and the fds are not used here
mod ztunnel;

/// The chart's namespace, Istio's.
const NAMESPACE: &str = "istio-system";
/// The node the agent and the pods are on.
const NODE: &str = "node-a";
/// The ambient namespace of the running pods.
const APPS: &str = "apps";
/// The annotation the agent writes.
const REDIRECTION: &str = "ambient.istio.io/redirection";
/// The readiness port inside the agent's namespace.
const READINESS_PORT: u16 = 8000;
/// How long each step of the agent's job may take; passing runs take well
/// under a second per step.
const PATIENCE: Duration = Duration::from_secs(20);

/// A pod of `APPS` running on the node before the agent starts; `None`
/// (reason printed) when cgroup v2 cannot be used here.
fn start_pod(runtime: &Runtime, client: &kube::Client, name: &str, ip: &str) -> Option<RunningPod> {
    let spec = PodSpecForTest {
        namespace: APPS.into(),
        name: name.into(),
        service_account: "web".into(),
        node: NODE.into(),
        ..PodSpecForTest::default()
    };
    RunningPod::start(runtime, client, &spec, ip)
        .inspect_err(|error| eprintln!("SKIP: {error}"))
        .ok()
}

/// The agent as the chart's DaemonSet runs it, as a process in its pod's
/// namespace; stopped with SIGTERM (as the kubelet stops it) when dropped.
struct AgentProcess {
    child: Child,
    log: PathBuf,
    /// Uids of the pods handed to the fake ztunnel, as they arrive.
    added: mpsc::Receiver<String>,
}

impl AgentProcess {
    fn start(
        api: &KubeApi,
        rendered: &Rendered,
        token: &str,
        (pod, node): (&NetNs, &NetNs),
        run: &str,
    ) -> AgentProcess {
        let container = rendered
            .container("DaemonSet", "istio-cni-node", "install-cni")
            .unwrap();
        assert_eq!(container.command, ["ztunnel-agent"]);
        let dir = api.dir().join(run);
        let bin_dir = dir.join("opt/cni/bin");
        let conf_dir = dir.join("etc/cni/net.d");
        std::fs::create_dir_all(&bin_dir).unwrap();
        std::fs::create_dir_all(&conf_dir).unwrap();
        // The node's network plugin, as the runtime left it.
        std::fs::write(
            conf_dir.join("10-node.conflist"),
            r#"{"cniVersion": "1.0.0", "name": "node", "plugins": [{"type": "bridge", "bridge": "cni0"}]}"#,
        )
        .unwrap();
        let kubeconfig = api.kubeconfig_for_token(run, token).unwrap();
        let args = container
            .args_replacing(&[
                (
                    "--in-cluster",
                    &format!("--kubeconfig={}", kubeconfig.display()),
                ),
                (
                    "--cni-bin-dir",
                    &format!("--cni-bin-dir={}", bin_dir.display()),
                ),
                (
                    "--cni-conf-dir",
                    &format!("--cni-conf-dir={}", conf_dir.display()),
                ),
                // The test's processes are the host's.
                ("--procfs", "--procfs=/proc"),
                ("--host-root", "--host-root=/"),
                (
                    "--readiness-listen",
                    &format!("--readiness-listen=127.0.0.1:{READINESS_PORT}"),
                ),
            ])
            .unwrap();
        let log = dir.join("agent.log");
        let sockets = dir.join("run");
        assert!(
            container
                .env
                .contains(&("ALLOW_SWITCH_TO_HOST_NS".to_owned(), "true".to_owned())),
            "the chart has the agent enter the host's netns: {:?}",
            container.env
        );
        let mut command = pod.command(env!("CARGO_BIN_EXE_ztunnel-agent"));
        command
            .args(&args)
            // The host's netns (`/host/proc/1/ns/net` in the pod) is the
            // test's node.
            .arg(format!("--host-netns={}", node.path().display()))
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs(container.env.iter().map(|(name, value)| (name, value)))
            // The downward API's values.
            .env("NODE_NAME", NODE)
            .env("POD_NAMESPACE", NAMESPACE)
            // The host paths the chart mounts (/var/run/istio-cni,
            // /var/run/ztunnel), here the test's own.
            .env(
                "ZTUNNEL_AGENT_PLUGIN_SOCKET",
                sockets.join("pluginevent.sock"),
            )
            .env("ZTUNNEL_AGENT_ZDS_SOCKET", sockets.join("ztunnel.sock"))
            .env("ZTUNNEL_AGENT_STATE_DIR", dir.join("state"))
            .current_dir(&dir);
        // Both streams in one log.
        let file = File::create(&log).unwrap();
        command.stdout(file.try_clone().unwrap()).stderr(file);
        let child = command.spawn().unwrap();

        // ztunnel: acks whatever the agent hands over and reports the adds.
        let zds = sockets.join("ztunnel.sock");
        let (added_tx, added) = mpsc::channel();
        std::thread::spawn(move || {
            let ztunnel = FakeZtunnel::connect(&zds);
            let started = Instant::now();
            for _ in 0..100 {
                if started.elapsed() > PATIENCE * 3 {
                    break;
                }
                // Until the agent stops.
                let Some(received) = ztunnel.receive_until_closed() else {
                    break;
                };
                ztunnel.answer("");
                if let Payload::Add(add) = received.payload
                    && added_tx.send(add.uid).is_err()
                {
                    break;
                }
            }
        });
        AgentProcess { child, log, added }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn conf_dir(&self) -> PathBuf {
        self.log.with_file_name("etc/cni/net.d")
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let pid = Pid::from_raw(self.child.id() as i32);
        let _ = kill(pid, Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits for `what`, up to `PATIENCE`.
fn within(what: &str, mut check: impl FnMut() -> bool) -> Result<(), String> {
    let started = Instant::now();
    while !check() {
        if started.elapsed() > PATIENCE {
            return Err(format!("{what}: not within {PATIENCE:?}"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("{what}: {:?}", started.elapsed());
    Ok(())
}

/// The agent's job, each step bounded; the first failure.
fn does_its_job(
    agent: &AgentProcess,
    (agent_pod, node): (&NetNs, &NetNs),
    runtime: &Runtime,
    client: &kube::Client,
    pod: &RunningPod,
) -> Result<(), String> {
    within("plugin chained into the node's configuration", || {
        std::fs::read_to_string(agent.conf_dir().join("10-node.conflist"))
            .is_ok_and(|text| text.contains("ztunnel-cni"))
    })?;
    within("ready", || {
        agent_pod
            .http_get(READINESS_PORT, "/readyz")
            .is_ok_and(|(status, _)| status == 200)
    })?;
    let pods: kube::Api<Pod> = kube::Api::namespaced(client.clone(), APPS);
    within("running pod annotated enabled", || {
        runtime
            .block_on(pods.get(&pod.name))
            .ok()
            .and_then(|pod| pod.metadata.annotations)
            .and_then(|annotations| annotations.get(REDIRECTION).cloned())
            .as_deref()
            == Some("enabled")
    })?;
    let handed_over = agent
        .added
        .recv_timeout(PATIENCE)
        .map_err(|_| "the pod was not handed to ztunnel".to_owned())?;
    if handed_over != pod.uid {
        return Err(format!("ztunnel got {handed_over}, not {}", pod.uid));
    }
    if our_rules(&pod.netns).is_empty() {
        return Err("no redirection rules in the pod".to_owned());
    }
    if netns::installed("ipset") {
        within("the pod's address in the node's probe set", || {
            node.exec(&["ipset", "list", "istio-inpod-probes-v4"])
                .is_ok_and(|listed| String::from_utf8_lossy(&listed.stdout).contains(&pod.ip))
        })?;
    }
    let problems = permission_problems(&agent.log());
    if !problems.is_empty() {
        return Err(format!(
            "refused by the API server:\n{}",
            problems.join("\n")
        ));
    }
    Ok(())
}

#[test]
fn the_node_agent_does_its_job_with_exactly_the_charts_rbac() {
    if let Some(reason) = cni::unavailable() {
        eprintln!("SKIP: {reason}");
        return;
    }
    let Some(helm) = Helm::find_or_skip() else {
        return;
    };
    let Some(api) = KubeApi::start().unwrap() else {
        return;
    };
    let runtime = Runtime::new().unwrap();
    let client = runtime.block_on(api.admin_client()).unwrap();
    runtime.block_on(async {
        ensure_namespace(&client, NAMESPACE, &[]).await.unwrap();
        ensure_namespace(&client, APPS, &[("istio.io/dataplane-mode", "ambient")])
            .await
            .unwrap();
    });
    let mut rendered = helm.template("ztunnel-mesh", NAMESPACE, &[]).unwrap();
    api.apply_server_side(&rendered.to_yaml().unwrap()).unwrap();
    let token = runtime
        .block_on(request_token(&client, NAMESPACE, "istio-cni", None, None))
        .unwrap();

    let Some(pod) = start_pod(&runtime, &client, "web-0", "198.18.60.2") else {
        return;
    };
    let node = NetNs::create("chart-node").unwrap();
    let agent_pod = NetNs::create("chart-agent").unwrap();
    agent_pod.exec(&["ip", "link", "set", "lo", "up"]).unwrap();
    // The API server, at the address its certificate names, from the
    // agent's pod.
    let _api_route = PortForward::to_host(&agent_pod, api.address().unwrap()).unwrap();
    let namespaces = (&agent_pod, &node);
    let agent = AgentProcess::start(&api, &rendered, &token, namespaces, "chart-rbac");
    let result = does_its_job(&agent, namespaces, &runtime, &client, &pod);
    assert_eq!(
        result,
        Ok(()),
        "with the chart's RBAC; the agent's log:\n{}",
        agent.log()
    );
    drop(agent);

    // The check can fail: a second running pod, and an agent whose role
    // lost `patch` on pods/status.
    rendered
        .remove_verb(
            "ClusterRole",
            &format!("ztunnel-node-agent-{NAMESPACE}"),
            "pods/status",
            "patch",
        )
        .unwrap();
    api.apply_server_side(&rendered.to_yaml().unwrap()).unwrap();
    let Some(second) = start_pod(&runtime, &client, "web-1", "198.18.61.2") else {
        return;
    };
    let agent = AgentProcess::start(&api, &rendered, &token, namespaces, "broken-rbac");
    let error = does_its_job(&agent, namespaces, &runtime, &client, &second)
        .expect_err("an agent that may not patch pods/status must fail the check");
    eprintln!("with a verb removed: {error}");
    assert!(
        permission_problems(&agent.log())
            .iter()
            .any(|line| line.contains("pods")),
        "the log shows the refusal:\n{}",
        agent.log()
    );
}
