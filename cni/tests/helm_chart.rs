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
//! ipset, and log nothing forbidden; then, stopped with SIGTERM while the
//! chart's DaemonSet still places it on its node, leave the plugin's entry
//! for the next agent (Istio's safe upgrade), again with nothing forbidden.
//! The same run with `patch` on `pods/status` taken out of the chart's
//! ClusterRole must fail the check.
//!
//! Needs root, `ip`, `iptables`, cgroup v2 and the API server and helm
//! binaries; skips with the reason otherwise. The chart's exit values
//! (`nodeAgent.keepCniOnExit`, `nodeAgent.disableSafeUpgrade`) are checked
//! on the rendering alone, with helm.

use std::fs::File;
use std::path::PathBuf;
use std::process::Child;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Container, Node, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::PostParams;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::runtime::Runtime;
use ztunnel_proto::istio::workload::zds::workload_request::Payload;
use ztunnel_test_support::cni;
use ztunnel_test_support::helm::{Helm, Rendered, permission_problems};
use ztunnel_test_support::kube::KubeApi;
use ztunnel_test_support::kube::objects::{PodSpecForTest, ensure_namespace, request_token};
use ztunnel_test_support::netns::{self, NetNs, PortForward};
use ztunnel_test_support::skip::skip;

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
/// The agent's pod, as the chart's DaemonSet would name it.
const AGENT_POD: &str = "istio-cni-node-chart";
/// How long each step of the agent's job may take; passing runs take well
/// under a second per step.
const PATIENCE: Duration = Duration::from_secs(20);

/// A pod of `APPS` running on the node before the agent starts; `None`
/// (skipped, with the reason) when cgroup v2 cannot be used here.
fn start_pod(runtime: &Runtime, client: &kube::Client, name: &str, ip: &str) -> Option<RunningPod> {
    let spec = PodSpecForTest {
        namespace: APPS.into(),
        name: name.into(),
        service_account: "web".into(),
        node: NODE.into(),
        ..PodSpecForTest::default()
    };
    RunningPod::start(runtime, client, &spec, ip)
        .inspect_err(|reason| skip(reason))
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
            .env("POD_NAME", AGENT_POD)
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

    /// Stops the agent with SIGTERM, as the kubelet does, and waits for it:
    /// its whole log.
    fn terminate(self) -> String {
        let log = self.log.clone();
        drop(self);
        std::fs::read_to_string(log).unwrap_or_default()
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
        skip(reason);
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
    runtime.block_on(agent_pod_on_a_linux_node(&client));
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
    let conf = agent.conf_dir().join("10-node.conflist");
    let log = agent.terminate();
    assert!(
        std::fs::read_to_string(&conf).is_ok_and(|text| text.contains("ztunnel-cni")),
        "the DaemonSet still places an agent on the node: the entry stays; the agent's log:\n{log}"
    );
    assert!(
        log.contains("for the next agent") && permission_problems(&log).is_empty(),
        "the API said so, as the chart's role allows; the agent's log:\n{log}"
    );

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

/// The node, labelled as the chart's nodeSelector wants, and the agent's
/// pod on it, controlled by the chart's DaemonSet as the DaemonSet
/// controller would make it: what the agent reads at SIGTERM.
async fn agent_pod_on_a_linux_node(client: &kube::Client) {
    let node = Node {
        metadata: ObjectMeta {
            name: Some(NODE.to_owned()),
            labels: Some([("kubernetes.io/os".to_owned(), "linux".to_owned())].into()),
            ..ObjectMeta::default()
        },
        ..Node::default()
    };
    kube::Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
    let daemon_set = kube::Api::<DaemonSet>::namespaced(client.clone(), NAMESPACE)
        .get("istio-cni-node")
        .await
        .unwrap();
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some(AGENT_POD.to_owned()),
            owner_references: Some(vec![OwnerReference {
                api_version: "apps/v1".to_owned(),
                kind: "DaemonSet".to_owned(),
                name: "istio-cni-node".to_owned(),
                uid: daemon_set.metadata.uid.unwrap(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: Some(NODE.to_owned()),
            service_account_name: Some("istio-cni".to_owned()),
            // No kubelet runs it; the image is never pulled.
            containers: vec![Container {
                name: "install-cni".to_owned(),
                image: Some("registry.invalid/ztunnel-agent:test".to_owned()),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        ..Pod::default()
    };
    kube::Api::<Pod>::namespaced(client.clone(), NAMESPACE)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
}

#[test]
fn the_charts_exit_values_become_the_agents_switches_and_exclude_each_other() {
    let Some(helm) = Helm::find_or_skip() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let render = |yaml: &str| {
        let values = dir.path().join("values.yaml");
        std::fs::write(&values, yaml).unwrap();
        helm.template("ztunnel-mesh", NAMESPACE, &[values.as_path()])
    };
    let agent = |rendered: &Rendered| {
        rendered
            .container("DaemonSet", "istio-cni-node", "install-cni")
            .unwrap()
    };
    let disabled = ("AMBIENT_DISABLE_SAFE_UPGRADE".to_owned(), "true".to_owned());

    let safe_upgrade = render("{}").unwrap();
    let container = agent(&safe_upgrade);
    assert!(!container.args.contains(&"--keep-cni-on-exit".to_owned()));
    assert!(!container.env.contains(&disabled));
    let daemon_set = safe_upgrade.get("DaemonSet", "istio-cni-node").unwrap();
    let env = &daemon_set["spec"]["template"]["spec"]["containers"][0]["env"];
    let pod_name = env
        .as_sequence()
        .unwrap()
        .iter()
        .find(|item| item["name"].as_str() == Some("POD_NAME"))
        .expect("POD_NAME from the downward API, which leads the agent to its DaemonSet");
    assert_eq!(
        pod_name["valueFrom"]["fieldRef"]["fieldPath"].as_str(),
        Some("metadata.name")
    );

    let keep = render("nodeAgent: {keepCniOnExit: true}").unwrap();
    assert!(agent(&keep).args.contains(&"--keep-cni-on-exit".to_owned()));
    let remove = render("nodeAgent: {disableSafeUpgrade: true}").unwrap();
    assert!(agent(&remove).env.contains(&disabled));
    let both = render("nodeAgent: {keepCniOnExit: true, disableSafeUpgrade: true}")
        .expect_err("both switches at once");
    assert!(
        both.to_string().contains("opposite things on exit"),
        "{both}"
    );
}
