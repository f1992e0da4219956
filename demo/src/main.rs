//! `ztunnel-demo`: the local demo mesh. It builds two nodes with the real
//! CNI chain, a node agent and a shared-mode ztunnel each, and the control
//! plane on its own (`ztunnel_test_support::cluster`): the CA, which also
//! serves the ztunnels every workload and policy over delta xDS from its
//! mesh file. It runs a short scenario (allowed traffic within and across
//! nodes, a pod outside the mesh, a policy changed live through the control
//! plane, a pod deleted); prints what happened, from the ztunnels' own
//! access logs; and removes everything it made, also on Ctrl-C or failure.
//!
//! With `--kubernetes` the control plane reads only a real Kubernetes API
//! server started for the demo (etcd and kube-apiserver, built by
//! `scripts/k8s-test-env.sh`): pods are created there and get their status
//! as a kubelet would write it, and the live policy is a
//! `security.istio.io/v1` AuthorizationPolicy applied with kubectl.
//!
//! With `--cluster` the same scenario runs on a real two-node cluster with
//! the mesh installed by helm: `real_cluster.rs`; with `--cluster --istio`,
//! Istio's istiod, istio-cni and charts drive our ztunnel there.
//!
//! The report is `report.rs`, Ctrl-C `interrupt.rs`. Run it through
//! `demo/run.sh`, which builds the binaries and images it starts.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use ztunnel_certs::error_chain::ErrorChain;
use ztunnel_test_support::cluster::{self, Binaries, Cluster, PodSpec, still_echoes};
use ztunnel_test_support::kube::KubeApi;

use crate::interrupt::Interrupt;
use crate::report::{Steps, Traffic};

mod interrupt;
mod real_cluster;
mod report;

/// The application port every pod serves (an echo server).
const APP_PORT: u16 = 8080;

/// How long a policy change may take to reach the ztunnels: the control
/// plane reads its mesh file every 100 ms (or watches the API server) and
/// pushes a change at once; 10 s is for a loaded machine.
const POLICY_WITHIN: Duration = Duration::from_secs(10);

/// A deny policy for the `client` identity, added and removed live.
const DENY_CLIENT_TO_DB: &str = "\
- name: db-deny-client
  namespace: default
  scope: Namespace
  action: Deny
  rules:
  - - - principals: [!Exact \"cluster.local/ns/default/sa/client\"]
        destinationIps: [\"198.18.10.0/24\"]
";

/// The same policy as a Kubernetes object, for `--kubernetes` and
/// `--cluster`.
const DENY_CLIENT_TO_DB_KUBERNETES: &str = r#"
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: db-deny-client, namespace: default}
spec:
  selector: {matchLabels: {app: db}}
  action: DENY
  rules:
  - from:
    - source: {principals: ["cluster.local/ns/default/sa/client"]}
"#;

/// The local demo mesh.
#[derive(Debug, Parser)]
#[command(name = "ztunnel-demo")]
struct Cli {
    /// Run the control plane on a real Kubernetes API server started for
    /// the demo (built by scripts/k8s-test-env.sh), instead of its mesh
    /// file.
    #[arg(long, conflicts_with = "cluster")]
    kubernetes: bool,
    /// Run the scenario on a real two-node cluster (kubelet, containerd,
    /// runc) with the mesh installed by helm from the images of
    /// scripts/build-images.sh --test-images.
    #[arg(long)]
    cluster: bool,
    /// With --cluster: Istio's own components instead of ours around our
    /// ztunnel: istiod, istio-cni and Istio's charts (base, istiod,
    /// istio-cni, ztunnel), built from the pinned istio/istio module by
    /// scripts/k8s-test-env.sh --istio and scripts/build-images.sh
    /// --istio-images.
    #[arg(long, requires = "cluster")]
    istio: bool,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let unavailable = if cli.cluster {
        ztunnel_test_support::real_cluster::unavailable().or_else(|| {
            cli.istio
                .then(ztunnel_test_support::real_cluster::istio::unavailable)
                .flatten()
        })
    } else {
        cluster::unavailable()
    };
    if let Some(missing) = unavailable {
        eprintln!("ztunnel-demo: cannot run here: {missing}");
        return std::process::ExitCode::from(2);
    }
    let interrupt = Interrupt::watch();
    let started = Instant::now();
    // Each mode owns its cluster and has torn it down when it returns,
    // interrupted or not: processes by PID, then namespaces.
    let outcome = if cli.cluster {
        real_cluster::run(&interrupt, cli.istio)
    } else {
        run(&interrupt, cli.kubernetes)
    };
    if interrupt.asked() {
        eprintln!("demo: interrupted; every namespace and process it made is gone");
        return std::process::ExitCode::from(130);
    }
    match outcome {
        Ok(()) => {
            println!(
                "\ndemo: finished in {:.1}s; every namespace and process it made is gone",
                started.elapsed().as_secs_f64()
            );
            std::process::ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("\nztunnel-demo: {}", ErrorChain(&*error));
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(interrupt: &Interrupt, kubernetes: bool) -> anyhow::Result<()> {
    let binaries = Binaries::from_target_dir()
        .context("run the demo through demo/run.sh, which builds every binary first")?;
    let specs = [
        PodSpec::new("client", "default", "client", "node-a"),
        PodSpec::new("db", "default", "db", "node-a"),
        PodSpec::new("web", "default", "web", "node-b"),
        PodSpec::new("legacy", "legacy", "legacy", "node-b"),
    ];
    println!(
        "demo: starting the control plane (CA + xDS), two nodes (agent + ztunnel each) and four pods via CNI"
    );
    let nodes = ["node-a", "node-b"];
    let mut cluster = if kubernetes {
        let cluster = Cluster::start_on_kubernetes(&nodes, &specs, &["default"], binaries)?
            .context("no Kubernetes API server: run demo/run.sh --kubernetes, which builds it")?;
        if let Some(api) = cluster.kube() {
            println!(
                "demo:   the ztunnels are fed over xDS by the control plane, which reads only the Kubernetes API at {} (admin kubeconfig: {})",
                api.api().server(),
                api.api().admin_kubeconfig().display()
            );
        }
        cluster
    } else {
        let mut cluster = Cluster::start(&nodes, &specs, &["default"], binaries)?;
        println!(
            "demo:   the ztunnels are fed over xDS by the control plane, from its mesh file {}",
            cluster.mesh().path().display()
        );
        cluster
    };
    interrupt.check()?;
    for spec in &specs {
        let pod = cluster.add_pod(spec)?;
        pod.serve_echo(APP_PORT)?;
        println!(
            "demo:   pod {:<7} {:<8} on {} at {:<12} {}",
            spec.name,
            spec.namespace,
            spec.node,
            pod.ip.to_string(),
            if spec.namespace == "default" {
                "meshed (HBONE)"
            } else {
                "not ambient: left alone"
            }
        );
    }
    cluster.wait_synced()?;
    println!("demo:   both ztunnels have every workload, pushed over xDS");
    interrupt.check()?;

    let c = &mut cluster;
    let mut steps = Steps::default();
    steps.record(
        "client -> web (across nodes)",
        true,
        echoes(c, "client", "web"),
    );
    steps.record("client -> db (same node)", true, echoes(c, "client", "db"));
    steps.record("web -> db (across nodes)", true, echoes(c, "web", "db"));
    steps.record(
        "legacy (outside the mesh) -> web, plain TCP",
        true,
        echoes(c, "legacy", "web"),
    );
    interrupt.check()?;

    println!(
        "demo: applying a live policy: deny client -> db, {} and pushed over xDS",
        if kubernetes {
            "an AuthorizationPolicy applied to the API server"
        } else {
            "written to the mesh file"
        }
    );
    let target = app(c, "db")?;
    let mut open = c.pod("client")?.connect(target)?;
    set_deny_policy(c, true)?;
    let denied = interrupt.wait_until(POLICY_WITHIN, || !echoes(c, "client", "db"))?;
    steps.record("client -> db under the deny policy", false, !denied);
    steps.record(
        "client's connection to db opened before the policy (closed on re-check)",
        false,
        still_echoes(&mut open),
    );
    steps.record(
        "web -> db under the deny policy",
        true,
        echoes(c, "web", "db"),
    );
    set_deny_policy(c, false)?;
    let allowed = interrupt.wait_until(POLICY_WITHIN, || echoes(c, "client", "db"))?;
    steps.record("client -> db after the policy is removed", true, allowed);

    println!("demo: deleting pod web (CNI DEL through the chain)");
    c.delete_pod("web")?;
    steps.record(
        "client -> db after web is gone",
        true,
        echoes(c, "client", "db"),
    );

    let mut traffic = Traffic::default();
    for node in &c.nodes {
        traffic.add(&node.name, node.access_log());
    }
    traffic.print();
    steps.verdict()
}

/// Puts the deny policy in place, or takes it away: in the API server when
/// the control plane reads Kubernetes, in its mesh file otherwise.
fn set_deny_policy(cluster: &mut Cluster, deny: bool) -> anyhow::Result<()> {
    if let Some(api) = cluster.kube() {
        return set_deny_policy_in(api.api(), deny);
    }
    cluster
        .mesh()
        .set_policies(if deny { DENY_CLIENT_TO_DB } else { "" })
}

/// Applies the deny policy with kubectl, or deletes it.
fn set_deny_policy_in(api: &KubeApi, deny: bool) -> anyhow::Result<()> {
    if deny {
        api.kubectl(&["apply", "-f", "-"], Some(DENY_CLIENT_TO_DB_KUBERNETES))?;
    } else {
        api.kubectl(
            &[
                "delete",
                "authorizationpolicy",
                "db-deny-client",
                "-n",
                "default",
            ],
            None,
        )?;
    }
    Ok(())
}

fn app(cluster: &Cluster, pod: &str) -> anyhow::Result<SocketAddr> {
    Ok(SocketAddr::from((cluster.pod(pod)?.ip, APP_PORT)))
}

/// Whether `from` gets its bytes echoed back by `to`'s application.
fn echoes(cluster: &Cluster, from: &str, to: &str) -> bool {
    let (Ok(client), Ok(target)) = (cluster.pod(from), app(cluster, to)) else {
        return false;
    };
    client.echoes(target)
}
