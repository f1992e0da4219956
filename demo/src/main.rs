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
//! Run it through `demo/run.sh`, which builds the binaries it starts.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use ztunnel_certs::error_chain::ErrorChain;
use ztunnel_test_support::cluster::{self, Binaries, Cluster, PodSpec, still_echoes};
use ztunnel_test_support::wait;

/// The application port every pod serves (an echo server).
const APP_PORT: u16 = 8080;

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

/// The same policy as a Kubernetes object, for `--kubernetes`.
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

/// The cluster, shared with the Ctrl-C handler so that it can tear it down.
type Shared = Arc<Mutex<Option<Cluster>>>;

/// The local demo mesh.
#[derive(Debug, Parser)]
#[command(name = "ztunnel-demo")]
struct Cli {
    /// Run the control plane on a real Kubernetes API server started for
    /// the demo (built by scripts/k8s-test-env.sh), instead of its mesh
    /// file.
    #[arg(long)]
    kubernetes: bool,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    if let Some(missing) = cluster::unavailable() {
        eprintln!("ztunnel-demo: cannot run here: {missing}");
        return std::process::ExitCode::from(2);
    }
    let shared: Shared = Arc::default();
    watch_for_interrupt(Arc::clone(&shared));
    let started = Instant::now();
    let outcome = run(&shared, cli.kubernetes);
    // Tear down before printing the verdict: processes by PID, namespaces.
    let cluster = lock(&shared).take();
    drop(cluster);
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

fn lock(shared: &Shared) -> std::sync::MutexGuard<'_, Option<Cluster>> {
    // A step that panicked leaves the cluster usable for the tear-down.
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

/// On SIGINT or SIGTERM, tears the cluster down and exits.
fn watch_for_interrupt(shared: Shared) {
    let spawned = std::thread::Builder::new()
        .name("interrupt".into())
        .spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async {
                use tokio::signal::unix::{SignalKind, signal};
                let (Ok(mut int), Ok(mut term)) = (
                    signal(SignalKind::interrupt()),
                    signal(SignalKind::terminate()),
                ) else {
                    return;
                };
                tokio::select! {
                    _ = int.recv() => {}
                    _ = term.recv() => {}
                }
                eprintln!("\ndemo: interrupted; removing everything");
                drop(lock(&shared).take());
                std::process::exit(130);
            });
        });
    if let Err(error) = spawned {
        eprintln!("demo: Ctrl-C will not clean up: {error}");
    }
}

/// One line of the scenario's outcome.
struct Step {
    what: String,
    expected: bool,
    happened: bool,
}

fn run(shared: &Shared, kubernetes: bool) -> anyhow::Result<()> {
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
    *lock(shared) = Some(cluster);

    let mut steps = Vec::new();
    let mut step = |what: &str, expected: bool, happened: bool| {
        let mark = if expected == happened { "ok " } else { "BAD" };
        println!(
            "demo: [{mark}] {what}: {}",
            if happened { "works" } else { "refused" }
        );
        steps.push(Step {
            what: what.to_owned(),
            expected,
            happened,
        });
    };
    with(shared, |c| {
        step(
            "client -> web (across nodes)",
            true,
            echoes(c, "client", "web"),
        );
        step("client -> db (same node)", true, echoes(c, "client", "db"));
        step("web -> db (across nodes)", true, echoes(c, "web", "db"));
        step(
            "legacy (outside the mesh) -> web, plain TCP",
            true,
            echoes(c, "legacy", "web"),
        );
        Ok(())
    })?;

    println!(
        "demo: applying a live policy: deny client -> db, {} and pushed over xDS",
        if kubernetes {
            "an AuthorizationPolicy applied to the API server"
        } else {
            "written to the mesh file"
        }
    );
    let mut open = with(shared, |c| {
        let target = app(c, "db")?;
        c.pod("client")?.connect(target)
    })?;
    with(shared, |c| set_deny_policy(c, true))?;
    let denied = wait_until(|| with(shared, |c| Ok(!echoes(c, "client", "db"))).unwrap_or(false));
    step("client -> db under the deny policy", false, !denied);
    step(
        "client's connection to db opened before the policy (closed on re-check)",
        false,
        still_echoes(&mut open),
    );
    with(shared, |c| {
        step(
            "web -> db under the deny policy",
            true,
            echoes(c, "web", "db"),
        );
        Ok(())
    })?;
    with(shared, |c| set_deny_policy(c, false))?;
    let allowed = wait_until(|| with(shared, |c| Ok(echoes(c, "client", "db"))).unwrap_or(false));
    step("client -> db after the policy is removed", true, allowed);

    println!("demo: deleting pod web (CNI DEL through the chain)");
    with(shared, |c| c.delete_pod("web"))?;
    with(shared, |c| {
        step(
            "client -> db after web is gone",
            true,
            echoes(c, "client", "db"),
        );
        Ok(())
    })?;

    with(shared, |c| {
        print_report(c);
        Ok(())
    })?;
    let wrong: Vec<&Step> = steps
        .iter()
        .filter(|step| step.expected != step.happened)
        .collect();
    if !wrong.is_empty() {
        let names: Vec<&str> = wrong.iter().map(|step| step.what.as_str()).collect();
        bail!("unexpected outcomes: {}", names.join("; "));
    }
    Ok(())
}

/// Puts the deny policy in place, or takes it away: in the API server when
/// the control plane reads Kubernetes, in its mesh file otherwise.
fn set_deny_policy(cluster: &mut Cluster, deny: bool) -> anyhow::Result<()> {
    if let Some(api) = cluster.kube() {
        let api = api.api();
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
        return Ok(());
    }
    cluster
        .mesh()
        .set_policies(if deny { DENY_CLIENT_TO_DB } else { "" })
}

/// Runs `f` on the cluster, if it is still there.
fn with<T>(
    shared: &Shared,
    f: impl FnOnce(&mut Cluster) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    let mut guard = lock(shared);
    let cluster = guard.as_mut().context("the cluster is gone")?;
    f(cluster)
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

/// Polls `check` for up to 10 s (the control plane reads its mesh file
/// every 100 ms and pushes a change at once; 10 s is for a loaded
/// machine).
fn wait_until(check: impl FnMut() -> bool) -> bool {
    wait::until(Duration::from_secs(10), check)
}

/// Who talked to whom, from the destination ztunnels' access logs: the
/// verified identity, the path the connection took (`hbone` between
/// nodes, `same-node` within one, `tcp` for plain TCP), the connections and
/// bytes, and the decision. Lines with the same source, destination, path
/// and outcome are added up.
fn print_report(cluster: &Cluster) {
    /// One line of the table.
    struct Row {
        key: [String; 5],
        connections: u64,
        received: u64,
        sent: u64,
    }
    let mut rows: Vec<Row> = Vec::new();
    for node in &cluster.nodes {
        for entry in node.access_log() {
            if entry.direction != "inbound" {
                continue;
            }
            let path = match (&entry.path, &entry.src_identity) {
                (Some(path), _) => path.clone(),
                (None, Some(_)) => "hbone".to_owned(),
                (None, None) => "tcp".to_owned(),
            };
            let key = [
                node.name.clone(),
                entry
                    .src_identity
                    .unwrap_or_else(|| "(none: plain TCP)".to_owned()),
                entry.dst_workload.unwrap_or_else(|| "?".to_owned()),
                path,
                match entry.error {
                    Some(error) if error.contains("denied") => format!("denied: {error}"),
                    Some(error) => format!("closed: {error}"),
                    None => "allowed".to_owned(),
                },
            ];
            match rows.iter_mut().find(|row| row.key == key) {
                Some(row) => {
                    row.connections += 1;
                    row.received += entry.bytes_recv;
                    row.sent += entry.bytes_sent;
                }
                None => rows.push(Row {
                    key,
                    connections: 1,
                    received: entry.bytes_recv,
                    sent: entry.bytes_sent,
                }),
            }
        }
    }
    println!("\nWho talked to whom, as each destination ztunnel logged it");
    println!(
        "{:<7} {:<42} {:<7} {:<9} {:>5} {:>6} {:>6}  decision",
        "node", "source identity (verified)", "to pod", "path", "conns", "bytes>", "bytes<"
    );
    for row in rows {
        let [node, source, pod, path, outcome] = row.key;
        println!(
            "{node:<7} {source:<42} {pod:<7} {path:<9} {:>5} {:>6} {:>6}  {outcome}",
            row.connections, row.received, row.sent
        );
    }
}
