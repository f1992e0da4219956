//! The client pods of the test: short-lived `ztunnel-loadgen` pods under
//! the `client` service account (or another one of the namespace), what they report, and what the server's
//! ztunnel logged of their connections.

use std::sync::atomic::{AtomicU32, Ordering};

use super::*;

/// Whether the node agent marked the pod captured.
pub(super) fn captured(pod: &PodStatus) -> bool {
    pod.annotations["ambient.istio.io/redirection"] == "enabled"
}

/// Runs a client pod named `name` on `node` under the service account
/// `client`, with `ztunnel-loadgen` and `args`; waits until it ends, and
/// returns it with its report (the last line of its output).
pub(super) fn run_client(
    cluster: &RealCluster,
    name: &str,
    node: &str,
    args: &[&str],
) -> (PodStatus, Value) {
    run_client_as(cluster, name, node, "client", args)
}

/// As [`run_client`], under `service_account`.
pub(super) fn run_client_as(
    cluster: &RealCluster,
    name: &str,
    node: &str,
    service_account: &str,
    args: &[&str],
) -> (PodStatus, Value) {
    run_client_in(cluster, APP_NAMESPACE, name, node, service_account, args)
}

/// As [`run_client_as`], in `namespace`.
pub(super) fn run_client_in(
    cluster: &RealCluster,
    namespace: &str,
    name: &str,
    node: &str,
    service_account: &str,
    args: &[&str],
) -> (PodStatus, Value) {
    let args: Vec<String> = args.iter().map(|arg| (*arg).to_owned()).collect();
    create_client_in(cluster, namespace, name, node, service_account, &args);
    let pod = wait_client_done_in(cluster, namespace, name);
    let output = cluster.pod_output(namespace, name, "client").unwrap();
    let report = output
        .iter()
        .rev()
        .find_map(|line| serde_json::from_str::<Value>(line).ok())
        .unwrap_or(Value::Null);
    (pod, report)
}

/// Creates a client pod named `name` on `node` under the service account
/// `client`, running `ztunnel-loadgen` with `args`.
pub(super) fn create_client(cluster: &RealCluster, name: &str, node: &str, args: &[String]) {
    create_client_in(cluster, APP_NAMESPACE, name, node, "client", args);
}

/// As [`create_client`], in `namespace` under `service_account`.
fn create_client_in(
    cluster: &RealCluster,
    namespace: &str,
    name: &str,
    node: &str,
    service_account: &str,
    args: &[String],
) {
    let pod = LoadgenPod {
        name,
        namespace,
        service_account,
        node,
        label: ("app", "client"),
        container: "client",
        args: &as_str(args),
    };
    let image = cluster.images().reference(real_cluster::APP);
    cluster
        .api()
        .unwrap()
        .apply_server_side(&pod.yaml(&image))
        .unwrap();
}

/// Waits until the client pod `name` has ended; its status.
pub(super) fn wait_client_done(cluster: &RealCluster, name: &str) -> PodStatus {
    wait_client_done_in(cluster, APP_NAMESPACE, name)
}

/// As [`wait_client_done`], in `namespace`.
fn wait_client_done_in(cluster: &RealCluster, namespace: &str, name: &str) -> PodStatus {
    let mut pod = PodStatus::default();
    let ended = wait::until(POD_WITHIN, || {
        pod = client_status_in(cluster, namespace, name);
        pod.phase == "Succeeded" || pod.phase == "Failed"
    });
    assert!(
        ended,
        "client pod {name} did not end: {pod:?}\n{}",
        pods_summary(cluster)
    );
    pod
}

/// The client pod `name`'s status (default when it is not there).
pub(super) fn client_status(cluster: &RealCluster, name: &str) -> PodStatus {
    client_status_in(cluster, APP_NAMESPACE, name)
}

/// As [`client_status`], in `namespace`.
fn client_status_in(cluster: &RealCluster, namespace: &str, name: &str) -> PodStatus {
    cluster
        .pods(namespace, "app=client")
        .unwrap_or_default()
        .into_iter()
        .find(|pod| pod.name == name)
        .unwrap_or_default()
}

/// The log lines of the ztunnel on `node`.
pub(super) fn ztunnel_log(cluster: &RealCluster, node: &str) -> Vec<String> {
    let pod = cluster
        .pods(MESH_NAMESPACE, "app=ztunnel")
        .unwrap()
        .into_iter()
        .find(|pod| pod.node.as_deref() == Some(node))
        .unwrap();
    cluster
        .pod_output(MESH_NAMESPACE, &pod.name, "istio-proxy")
        .unwrap()
}

/// The access log of the ztunnel on `node`.
pub(super) fn access_log(cluster: &RealCluster, node: &str) -> Vec<AccessEntry> {
    ztunnel_log(cluster, node)
        .iter()
        .filter_map(|line| AccessEntry::parse(line))
        .collect()
}

/// The identity of the client pods' service account.
pub(super) fn client_identity() -> String {
    format!("spiffe://{TRUST_DOMAIN}/ns/{APP_NAMESPACE}/sa/client")
}

/// How many connections from the client pod `client` reached the echo pod
/// `server` through the ztunnel of `server_node` over mTLS, under the
/// client's identity, and were served.
pub(super) fn delivered_as_client(
    cluster: &RealCluster,
    server_node: &str,
    server: &str,
    client: &PodStatus,
) -> usize {
    let identity = client_identity();
    let source = format!("{}:", client.ip.as_deref().unwrap_or("none"));
    access_log(cluster, server_node)
        .iter()
        .filter(|entry| {
            entry.direction == "inbound"
                && entry.src_identity.as_deref() == Some(identity.as_str())
                && entry.src_addr.starts_with(&source)
                && entry.dst_workload.as_deref() == Some(server)
                && entry.error.is_none()
        })
        .count()
}

/// For a failure message: every access-log entry of either ztunnel that
/// names `client`'s address, and node-a's and node-b's ztunnel log lines
/// that name the pod (its enrollment), so that a connection that went
/// around ztunnel, or under another identity, shows how.
pub(super) fn traces_of(cluster: &RealCluster, client: &PodStatus) -> String {
    let address = format!("{}:", client.ip.as_deref().unwrap_or("none"));
    let mut trace = format!("pod {} ({address}) on {:?}:\n", client.name, client.node);
    for node in ["node-a", "node-b"] {
        for line in ztunnel_log(cluster, node) {
            match AccessEntry::parse(&line) {
                Some(entry) if entry.src_addr.starts_with(&address) => {
                    trace.push_str(&format!("{node} access: {entry:?}\n"));
                }
                Some(_) => {}
                None if line.contains(&client.name) => {
                    trace.push_str(&format!("{node} log: {line}\n"));
                }
                None => {}
            }
        }
    }
    trace
}

/// Where a client pod runs, and as whom.
#[derive(Debug, Clone, Copy)]
pub(super) struct Source<'a> {
    pub(super) namespace: &'a str,
    pub(super) service_account: &'a str,
    pub(super) node: &'a str,
}

impl Source<'static> {
    /// The application's `client` service account, on `node`.
    pub(super) fn client(node: &'static str) -> Source<'static> {
        Source {
            namespace: APP_NAMESPACE,
            service_account: "client",
            node,
        }
    }
}

/// Client pods [`until_clients`] made: each gets a name of its own.
static CLIENTS_MADE: AtomicU32 = AtomicU32::new(0);

/// Runs one client pod after another from `source`, each opening 5
/// connections to `target`'s echo port, until one has every connection
/// served (`served`) or every one refused: how long that took and that
/// pod, or the last report when it did not happen within [`POD_WITHIN`].
/// Every run is printed. Once one run shows the expected state, one more
/// must show it too: a state that flaps back (a policy on one node only, a
/// ztunnel that missed an update) fails rather than passing on one run.
pub(super) fn until_clients(
    cluster: &RealCluster,
    source: Source<'_>,
    target: &str,
    served: bool,
) -> Result<(Duration, PodStatus), Value> {
    let started = Instant::now();
    let expected = if served { "served" } else { "refused" };
    let run = |what: &str| {
        let made = CLIENTS_MADE.fetch_add(1, Ordering::Relaxed);
        let (pod, report) = run_client_in(
            cluster,
            source.namespace,
            &format!("{}-{made}", source.service_account),
            source.node,
            source.service_account,
            &as_str(&connect_args(target, 5)),
        );
        let reached = if served {
            report["connections_made"] == 5 && report["errors"] == 0
        } else {
            report["connections_made"] == 0 && report["errors"] == 5
        };
        eprintln!(
            "clients {}/{} on {} to {target}, {what} (expecting {expected}): made {}, errors {}",
            source.namespace,
            source.service_account,
            source.node,
            report["connections_made"],
            report["errors"]
        );
        (reached, pod, report)
    };
    let mut last = (PodStatus::default(), Value::Null);
    let happened = wait::until(POD_WITHIN, || {
        let (reached, pod, report) = run("until");
        last = (pod, report);
        reached
    });
    if !happened {
        return Err(last.1);
    }
    let took = started.elapsed();
    let (confirmed, _, report) = run("confirming");
    if !confirmed {
        return Err(serde_json::json!({
            "expected": expected,
            "reached_then_lost": report,
        }));
    }
    Ok((took, last.0))
}

/// The arguments of a client that opens `count` connections to `target`.
pub(super) fn connect_args(target: &str, count: u32) -> Vec<String> {
    [
        "connect",
        "--target",
        &format!("{target}:{APP_PORT}"),
        "--max-connections",
        &count.to_string(),
        "--duration",
        "10",
    ]
    .map(str::to_owned)
    .to_vec()
}

pub(super) fn as_str(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}
