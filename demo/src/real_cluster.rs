//! `--cluster`: the demo's scenario on a real two-node cluster
//! (`ztunnel_test_support::real_cluster`: kubelet, containerd and runc on
//! each node, kube-proxy, the controller-manager, the scheduler and
//! CoreDNS), with the mesh installed as users install it: `helm install`
//! of `deploy/charts/ztunnel-mesh`, on nodes that start with the
//! `cni.istio.io/not-ready` taint.
//!
//! The pods run `ztunnel-loadgen` from the test application image. `db`
//! and `web` serve the echo application, as in the other modes. The
//! connections of each step come from a short-lived pod under the source's
//! service account (`client` on node-a, `web` on node-b, `legacy` in a
//! namespace left out of the mesh), as a Job's pod would make them; the pod
//! prints what it got and the demo reads it from the container's log. The
//! live policy is an AuthorizationPolicy applied with kubectl, and the
//! table comes from both ztunnel pods' access logs.
//!
//! With `--istio` the mesh around our ztunnel is Istio's own: the charts
//! `base`, `istiod`, `istio-cni` and `ztunnel` (with our image) installed
//! as Istio's documentation installs ambient mode, on nodes without the
//! taint (istiod's untaint controller is off by default). The scenario and
//! the table are the same; the table is read from ztunnel's default text
//! log.
//!
//! How the cluster is built and torn down is test-support's; the pods,
//! the steps and their timing are here.

use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::Value;
use ztunnel_test_support::cluster::AccessEntry;
use ztunnel_test_support::helm::Helm;
use ztunnel_test_support::real_cluster::istio::IstioChart;
use ztunnel_test_support::real_cluster::{
    self, ClusterSpec, MESH_NAMESPACE, NOT_READY_TAINT, PodStatus, RealCluster,
};

use crate::interrupt::Interrupt;
use crate::report::{Phases, Steps, Traffic};
use crate::{APP_PORT, set_deny_policy_in};

mod objects;

/// The bound on the install becoming Ready: under 20 s on a warm machine;
/// the bound only keeps a broken install from hanging the demo.
const INSTALL_WITHIN: Duration = Duration::from_secs(300);
/// The bound on a pod turning Ready or a client pod finishing: seconds on
/// a warm machine.
const POD_WITHIN: Duration = Duration::from_secs(90);
/// How long a policy change may take to show in new connections: the
/// control plane watches the API server and pushes at once, but each try
/// is a new pod of a few seconds.
const POLICY_WITHIN: Duration = Duration::from_secs(60);
/// Connections each step's pod opens: enough to add up in the table, few
/// enough that a step takes about as long as its pod's start.
const CONNECTIONS: u64 = 5;

/// Where a step's connections come from.
#[derive(Clone, Copy)]
struct Source {
    namespace: &'static str,
    service_account: &'static str,
    node: &'static str,
}

/// The client identity of the other modes, on node-a with `db`.
const CLIENT: Source = Source {
    namespace: "default",
    service_account: "client",
    node: "node-a",
};
/// `web`'s identity, from `web`'s node.
const WEB: Source = Source {
    namespace: "default",
    service_account: "web",
    node: "node-b",
};
/// A pod outside the mesh, on `web`'s node.
const LEGACY: Source = Source {
    namespace: "legacy",
    service_account: "legacy",
    node: "node-b",
};

/// Runs the scenario on a cluster of its own, tears the cluster down, and
/// prints how long each phase took.
pub fn run(interrupt: &Interrupt, istio: bool) -> anyhow::Result<()> {
    let helm = Helm::find().map_err(anyhow::Error::msg)?;
    let taints = if istio {
        println!(
            "demo: starting a real cluster: the API server, controller-manager and scheduler; two nodes (containerd, runc, kubelet, kube-proxy); CoreDNS; Istio's istiod and istio-cni images loaded"
        );
        vec![]
    } else {
        println!(
            "demo: starting a real cluster: the API server, controller-manager and scheduler; two nodes (containerd, runc, kubelet, kube-proxy) tainted {NOT_READY_TAINT}; CoreDNS"
        );
        vec![NOT_READY_TAINT.to_owned()]
    };
    let mut cluster = RealCluster::start(&ClusterSpec {
        nodes: vec!["node-a".to_owned(), "node-b".to_owned()],
        taints,
        extra_tags: vec![],
        istio,
    })?;
    let mut phases = Phases::default();
    phases.record(
        "cluster start: API server to both nodes Ready",
        cluster.started_in(),
    );
    println!(
        "demo:   both nodes Ready in {:.1} s (admin kubeconfig: {})",
        cluster.started_in().as_secs_f64(),
        cluster.api()?.admin_kubeconfig().display()
    );
    let mut scenario = Scenario {
        cluster: &cluster,
        istio,
        interrupt,
        phases: &mut phases,
        steps: Steps::default(),
        pods_made: 0,
    };
    let outcome = scenario.run(&helm);
    if outcome.is_err()
        && !interrupt.asked()
        && let Some(kept) = cluster.keep_files()
    {
        eprintln!(
            "demo: the cluster's configuration and logs are kept in {}",
            kept.display()
        );
    }
    let teardown = Instant::now();
    drop(cluster);
    phases.record(
        "teardown: every process, mount, cgroup and namespace",
        teardown.elapsed(),
    );
    phases.print();
    outcome
}

/// The scenario's state on one cluster.
struct Scenario<'a> {
    cluster: &'a RealCluster,
    /// Istio's charts, not ours, around our ztunnel.
    istio: bool,
    interrupt: &'a Interrupt,
    phases: &'a mut Phases,
    steps: Steps,
    /// Client pods made so far: each gets a name of its own.
    pods_made: u32,
}

impl Scenario<'_> {
    fn run(&mut self, helm: &Helm) -> anyhow::Result<()> {
        self.interrupt.check()?;
        self.install(helm)?;
        self.deploy()?;
        self.step("client -> web (across nodes)", true, CLIENT, "web")?;
        self.step("client -> db (same node)", true, CLIENT, "db")?;
        self.step("web -> db (across nodes)", true, WEB, "db")?;
        self.step(
            "legacy (outside the mesh) -> web, plain TCP",
            true,
            LEGACY,
            "web",
        )?;

        self.live_policy()?;

        println!("demo: deleting pod web (kubelet stops it: CNI DEL through the chain)");
        let started = Instant::now();
        self.cluster
            .kubectl(&["delete", "pod", "-n", "default", "web"])?;
        self.phases
            .record("pod web deleted to gone", started.elapsed());
        self.step("client -> db after web is gone", true, CLIENT, "db")?;

        self.traffic()?.print();
        self.steps.verdict()
    }

    /// The deny policy for client -> db, applied with kubectl while a
    /// connection from client to db is open, then deleted.
    fn live_policy(&mut self) -> anyhow::Result<()> {
        let control_plane = if self.istio {
            "istiod"
        } else {
            "the control plane"
        };
        println!(
            "demo: applying a live policy: deny client -> db, an AuthorizationPolicy applied with kubectl, read by {control_plane} from the API server and pushed over xDS"
        );
        let started = Instant::now();
        let held = self.hold_connection(CLIENT, "db")?;
        self.phases.record(
            "a connection client -> db held open (its pod started)",
            started.elapsed(),
        );
        let api = self.cluster.api()?;
        let started = Instant::now();
        set_deny_policy_in(api, true)?;
        let broken = self.interrupt.wait_until(POLICY_WITHIN, || {
            self.held_counts(CLIENT, &held)
                .is_some_and(|counts| counts["long_lived"]["breaks"][0].is_object())
        })?;
        self.record(
            "client's connection to db opened before the policy (closed on re-check)",
            false,
            !broken,
            started.elapsed(),
        );
        // It would go on trying to reopen, ten times a second.
        self.cluster.kubectl(&[
            "delete",
            "pod",
            "-n",
            CLIENT.namespace,
            &held,
            "--wait=false",
        ])?;
        let started = Instant::now();
        let denied = self.until(CLIENT, "db", false)?;
        self.record(
            "client -> db under the deny policy",
            false,
            !denied,
            started.elapsed(),
        );
        self.step("web -> db under the deny policy", true, WEB, "db")?;
        let started = Instant::now();
        set_deny_policy_in(api, false)?;
        let allowed = self.until(CLIENT, "db", true)?;
        self.record(
            "client -> db after the policy is removed",
            true,
            allowed,
            started.elapsed(),
        );
        Ok(())
    }

    /// `helm install` with ztunnel's access log as JSON, then waits until
    /// both DaemonSets are Ready on both nodes, the control plane is
    /// available and the taints are gone; or, with `--istio`, Istio's
    /// charts.
    fn install(&mut self, helm: &Helm) -> anyhow::Result<()> {
        if self.istio {
            return self.install_istio(helm);
        }
        println!("demo: helm install of deploy/charts/ztunnel-mesh into {MESH_NAMESPACE}");
        let started = Instant::now();
        let first_line = self
            .cluster
            .helm_install(helm, &["ztunnel.logAsJson=true".to_owned()])?;
        println!("demo:   helm: {first_line}");
        self.wait_installed(
            started,
            || self.cluster.mesh_problems(),
            "a ztunnel and a node agent on each node, the control plane available, both taints gone",
            "helm install to Ready (DaemonSets, control plane, taints gone)",
        )
    }

    /// `helm install` of Istio's charts, each with only where its images
    /// are (and the ambient profile where Istio's documentation sets it),
    /// then waits until istiod is available and the istio-cni and ztunnel
    /// DaemonSets are Ready on both nodes.
    fn install_istio(&mut self, helm: &Helm) -> anyhow::Result<()> {
        let started = Instant::now();
        for chart in IstioChart::ALL {
            println!(
                "demo: helm install {} (Istio's chart{}) into {MESH_NAMESPACE}",
                chart.release(),
                if chart == IstioChart::Ztunnel {
                    ", our ztunnel image"
                } else {
                    ""
                }
            );
            let first_line = self.cluster.istio_install(helm, chart, &[])?;
            println!("demo:   helm: {first_line}");
        }
        self.wait_installed(
            started,
            || self.cluster.istio_problems(),
            "istiod available, istio-cni and our ztunnel on each node",
            "helm install of Istio's charts to Ready (istiod, istio-cni, ztunnel)",
        )
    }

    /// Waits until `problems` finds none, then prints `ready` and records
    /// the time since `started` as the phase `phase`.
    fn wait_installed(
        &mut self,
        started: Instant,
        problems: impl Fn() -> anyhow::Result<Vec<String>>,
        ready: &str,
        phase: &str,
    ) -> anyhow::Result<()> {
        let done = self.interrupt.wait_until(INSTALL_WITHIN, || {
            problems().is_ok_and(|problems| problems.is_empty())
        })?;
        if !done {
            anyhow::bail!(
                "the install was not Ready in {INSTALL_WITHIN:?}: {:?}",
                problems()?
            );
        }
        let took = started.elapsed();
        println!("demo:   Ready in {:.1} s: {ready}", took.as_secs_f64());
        self.phases.record(phase, took);
        Ok(())
    }

    /// The ambient namespace `default`, the namespace `legacy` left out of
    /// the mesh, the service accounts, and the echo pods `db` (node-a) and
    /// `web` (node-b); waits until both are Ready and captured.
    fn deploy(&mut self) -> anyhow::Result<()> {
        let started = Instant::now();
        let image = self.cluster.images().reference(real_cluster::APP);
        let mut objects = objects::namespaces_and_accounts();
        for (name, node) in [("db", "node-a"), ("web", "node-b")] {
            objects.push_str(&objects::echo_pod(&image, name, node));
        }
        self.cluster.api()?.apply_server_side(&objects)?;
        let mut pods = vec![];
        let ready = self.interrupt.wait_until(POD_WITHIN, || {
            pods = self
                .cluster
                .pods("default", "role=echo")
                .unwrap_or_default();
            pods.len() == 2 && pods.iter().all(|pod| pod.ready && captured(pod))
        })?;
        if !ready {
            anyhow::bail!("the echo pods were not Ready and captured in {POD_WITHIN:?}: {pods:?}");
        }
        pods.sort_by(|a, b| a.name.cmp(&b.name));
        for pod in &pods {
            println!(
                "demo:   pod {:<7} {:<8} on {} at {:<12} meshed (HBONE), serving the echo application",
                pod.name,
                "default",
                pod.node.as_deref().unwrap_or("?"),
                pod.ip.as_deref().unwrap_or("?"),
            );
        }
        println!(
            "demo:   each step's connections come from a new pod under the service account client (node-a), web (node-b), or legacy (namespace legacy, not ambient: left alone, node-b)"
        );
        self.phases.record(
            "pods db and web created to Ready and meshed",
            started.elapsed(),
        );
        Ok(())
    }

    /// One step: a pod under `from` opens [`CONNECTIONS`] connections to
    /// the echo pod `to`; it works when every one is answered.
    fn step(&mut self, what: &str, expected: bool, from: Source, to: &str) -> anyhow::Result<()> {
        let started = Instant::now();
        let works = self.connect(from, to)?;
        self.record(what, expected, works, started.elapsed());
        Ok(())
    }

    /// Records a step and its time.
    fn record(&mut self, what: &str, expected: bool, happened: bool, took: Duration) {
        self.steps.record(what, expected, happened);
        self.phases.record(what, took);
    }

    /// Tries `from` -> `to` with a new pod each time until it `works` (or
    /// is refused, for `false`), for up to [`POLICY_WITHIN`]; whether it
    /// did.
    fn until(&mut self, from: Source, to: &str, works: bool) -> anyhow::Result<bool> {
        let started = Instant::now();
        while started.elapsed() < POLICY_WITHIN {
            if self.connect(from, to)? == works {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Runs a pod under `from` that opens [`CONNECTIONS`] connections to
    /// `to`'s echo application, waits until it ends, and reads its report:
    /// whether every connection was answered (false when none was, or only
    /// some).
    fn connect(&mut self, from: Source, to: &str) -> anyhow::Result<bool> {
        let target = format!("{}:{APP_PORT}", self.echo_ip(to)?);
        let args = [
            "connect",
            "--target",
            &target,
            "--max-connections",
            &CONNECTIONS.to_string(),
            "--duration",
            "10",
        ];
        let name = self.client_pod(from, to, &args)?;
        let mut pod = PodStatus::default();
        let ended = self.interrupt.wait_until(POD_WITHIN, || {
            pod = self
                .cluster
                .pods(from.namespace, &format!("run={name}"))
                .ok()
                .and_then(|pods| pods.into_iter().next())
                .unwrap_or_default();
            pod.phase == "Succeeded" || pod.phase == "Failed"
        })?;
        if !ended {
            anyhow::bail!("client pod {name} did not end in {POD_WITHIN:?}: {pod:?}");
        }
        let report = self
            .cluster
            .pod_output(from.namespace, &name, "client")?
            .iter()
            .rev()
            .find_map(|line| serde_json::from_str::<Value>(line).ok())
            .unwrap_or(Value::Null);
        Ok(report["connections_made"].as_u64() == Some(CONNECTIONS)
            && report["errors"].as_u64() == Some(0))
    }

    /// Starts a pod under `from` that keeps one connection to `to` open,
    /// exchanging an echo every 200 ms (`ztunnel-loadgen soak`), and waits
    /// until it does; the pod's name.
    fn hold_connection(&mut self, from: Source, to: &str) -> anyhow::Result<String> {
        let target = format!("{}:{APP_PORT}", self.echo_ip(to)?);
        let args = [
            "soak",
            "--target",
            &target,
            "--connections",
            "1",
            "--rate",
            "0",
            "--duration",
            "600",
        ];
        let name = self.client_pod(from, to, &args)?;
        let open = self.interrupt.wait_until(POD_WITHIN, || {
            self.held_counts(from, &name).is_some_and(|counts| {
                counts["long_lived"]["open"] == 1
                    && counts["long_lived"]["exchanges"].as_u64() > Some(0)
            })
        })?;
        if !open {
            anyhow::bail!("{name} did not open its connection to {to} in {POD_WITHIN:?}");
        }
        println!("demo:   pod {name} holds a connection to {to}, an echo every 200 ms");
        Ok(name)
    }

    /// The last counts the holding pod `name` under `from` printed.
    fn held_counts(&self, from: Source, name: &str) -> Option<Value> {
        self.cluster
            .pod_output(from.namespace, name, "client")
            .ok()?
            .iter()
            .rev()
            .find_map(|line| {
                serde_json::from_str::<Value>(line)
                    .ok()
                    .filter(|value| value.get("long_lived").is_some())
            })
    }

    /// Creates a pod under `from` running `ztunnel-loadgen` with `args`
    /// once (its container is named `client`); its name.
    fn client_pod(&mut self, from: Source, to: &str, args: &[&str]) -> anyhow::Result<String> {
        self.interrupt.check()?;
        self.pods_made += 1;
        let name = format!("{}-to-{to}-{}", from.service_account, self.pods_made);
        let image = self.cluster.images().reference(real_cluster::APP);
        self.cluster
            .api()?
            .apply_server_side(&objects::client_pod(&image, &name, from, args))?;
        Ok(name)
    }

    /// The address of the echo pod `name`.
    fn echo_ip(&self, name: &str) -> anyhow::Result<String> {
        self.cluster
            .pods("default", &format!("app={name}"))?
            .into_iter()
            .find_map(|pod| pod.ip)
            .with_context(|| format!("pod {name} has no address"))
    }

    /// Who talked to whom, from the access log of the ztunnel pod on each
    /// node.
    fn traffic(&self) -> anyhow::Result<Traffic> {
        let mut traffic = Traffic::default();
        let mut ztunnels = self.cluster.pods(MESH_NAMESPACE, "app=ztunnel")?;
        ztunnels.sort_by(|a, b| a.node.cmp(&b.node));
        for ztunnel in ztunnels {
            let node = ztunnel.node.as_deref().unwrap_or("?");
            let log = self
                .cluster
                .pod_output(MESH_NAMESPACE, &ztunnel.name, "istio-proxy")?;
            traffic.add(node, log.iter().filter_map(|line| AccessEntry::parse(line)));
        }
        Ok(traffic)
    }
}

/// Whether the node agent marked the pod captured.
fn captured(pod: &PodStatus) -> bool {
    pod.annotations["ambient.istio.io/redirection"] == "enabled"
}
