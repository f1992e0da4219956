//! What the cluster end-to-end tests (`xds_cluster.rs`, `kube_cluster.rs`)
//! ask of a running `Cluster`: whether a pod's bytes come back from
//! another's application, what a destination ztunnel logged, and the log
//! tails a failure message shows.

// Each test file uses its own part of this.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use ztunnel_test_support::cluster::{self, Binaries, Cluster, PodSpec, tail};
use ztunnel_test_support::skip::skip;
use ztunnel_test_support::wait;

/// The port every pod's application (an echo server) listens on.
pub const APP_PORT: u16 = 8080;
/// ztunnel's inbound HBONE port in each pod (WIRE.md §1).
pub const HBONE_PORT: u16 = 15008;

/// How long a test waits for something that should happen: generous, for
/// a loaded machine; passing tests never wait this long.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// The application address of `pod`.
pub fn app(cluster: &Cluster, pod: &str) -> SocketAddr {
    SocketAddr::from((cluster.pod(pod).unwrap().ip, APP_PORT))
}

/// Whether `from` gets its bytes echoed by `to`'s application.
pub fn echoes(cluster: &Cluster, from: &str, to: &str) -> bool {
    cluster.pod(from).unwrap().echoes(app(cluster, to))
}

/// Waits up to [`PATIENCE`] for `check`, polling.
pub fn eventually(check: impl FnMut() -> bool) -> bool {
    wait::until(PATIENCE, check)
}

/// How many connections `node`'s ztunnel delivered to `pod` with the
/// client identity of `from` verified over mTLS.
pub fn delivered_over_mtls(cluster: &Cluster, node: &str, pod: &str, from: &str) -> usize {
    let identity = cluster.pod(from).unwrap().spec.identity();
    cluster
        .node(node)
        .unwrap()
        .access_log()
        .iter()
        .filter(|entry| {
            entry.direction == "inbound"
                && entry.dst_workload.as_deref() == Some(pod)
                && entry.src_identity.as_deref() == Some(identity.as_str())
                && entry.error.is_none()
        })
        .count()
}

/// Whether `node`'s ztunnel logged an outbound connection tunnelled to
/// `pod`'s HBONE port.
pub fn tunnelled_to(cluster: &Cluster, node: &str, pod: &str) -> bool {
    let server = cluster.pod(pod).unwrap();
    let tunnel = SocketAddr::from((server.ip, HBONE_PORT)).to_string();
    cluster
        .node(node)
        .unwrap()
        .access_log()
        .iter()
        .any(|entry| {
            entry.direction == "outbound"
                && entry.dst_hbone_addr.as_deref() == Some(tunnel.as_str())
        })
}

/// The last lines of every ztunnel's log.
pub fn logs(cluster: &Cluster) -> String {
    cluster
        .nodes
        .iter()
        .map(|node| format!("--- {} ---\n{}\n", node.name, tail(&node.ztunnel_log(), 20)))
        .collect()
}

/// `name`'s value in `node`'s ztunnel's `/metrics` (summed over the lines
/// that carry every label in `labels`), 0 when absent.
pub fn metric(cluster: &Cluster, node: &str, name: &str, labels: &[&str]) -> f64 {
    metric_at(cluster, node, 15020, name, labels)
}

/// [`metric`] from the stats server on `port` of `node`'s namespace (a
/// second ztunnel there has its own).
pub fn metric_at(cluster: &Cluster, node: &str, port: u16, name: &str, labels: &[&str]) -> f64 {
    let (_, body) = cluster
        .node(node)
        .unwrap()
        .http_get(port, "/metrics")
        .unwrap();
    body.lines()
        .filter(|line| line.starts_with(name) && labels.iter().all(|label| line.contains(label)))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// One node with a pod outside the mesh (`outsider`, namespace `plain`)
/// and two meshed ones (`client`, `server`), each serving its echo
/// application; `env` is set on the node's ztunnel (restarted with it)
/// before the pods are added. `None`, skipped with the reason, where the
/// cluster cannot run.
pub fn one_node(tag: &str, env: &[(&str, &str)]) -> Option<Cluster> {
    one_node_with(tag, env, &[])
}

/// [`one_node`] with the meshed pods `also` (their names, in namespace
/// `default` on node a, each its own service account) besides.
pub fn one_node_with(tag: &str, env: &[(&str, &str)], also: &[&str]) -> Option<Cluster> {
    if let Some(reason) = cluster::unavailable() {
        skip(format_args!("{tag}: {reason}"));
        return None;
    }
    let mut specs = vec![
        PodSpec::new("outsider", "plain", "outsider", "node-a"),
        PodSpec::new("client", "default", "client", "node-a"),
        PodSpec::new("server", "default", "server", "node-a"),
    ];
    specs.extend(
        also.iter()
            .map(|name| PodSpec::new(name, "default", name, "node-a")),
    );
    let binaries = Binaries::from_target_dir().unwrap();
    let mut cluster = Cluster::start(&["node-a"], &specs, &["default"], binaries).unwrap();
    if !env.is_empty() {
        for (key, value) in env {
            cluster.set_ztunnel_env(key, value);
        }
        cluster.start_ztunnel("node-a").unwrap();
    }
    for spec in &specs {
        cluster.add_pod(spec).unwrap().serve_echo(APP_PORT).unwrap();
    }
    cluster.wait_synced().unwrap();
    Some(cluster)
}

/// Where a cluster's control plane reads the mesh.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MeshFrom {
    /// Its mesh file.
    File,
    /// A real Kubernetes API server ([`Cluster::start_on_kubernetes`]).
    Kubernetes,
}

/// Two nodes: two clients on node a (`client`, and `other` under another
/// identity) and a server on node b (`server-b`), added and each serving
/// its echo application, with `also` known to the mesh but not added (for
/// a test to add, or never to push); the ztunnels synced. `None`, skipped
/// with the reason, where the cluster (or the API server) cannot run.
pub fn clients_and_server(tag: &str, also: &[PodSpec], from: MeshFrom) -> Option<Cluster> {
    if let Some(reason) = cluster::unavailable() {
        skip(format_args!("{tag}: {reason}"));
        return None;
    }
    let specs = [
        PodSpec::new("client", "default", "client", "node-a"),
        PodSpec::new("other", "default", "other", "node-a"),
        PodSpec::new("server-b", "default", "server", "node-b"),
    ];
    let mut known = specs.to_vec();
    known.extend_from_slice(also);
    let binaries = Binaries::from_target_dir().unwrap();
    let nodes = ["node-a", "node-b"];
    let mut cluster = match from {
        MeshFrom::File => Cluster::start(&nodes, &known, &["default"], binaries).unwrap(),
        MeshFrom::Kubernetes => {
            let Some(cluster) =
                Cluster::start_on_kubernetes(&nodes, &known, &["default"], binaries).unwrap()
            else {
                // Skipped by the API server's start, with the reason.
                return None;
            };
            cluster
        }
    };
    for spec in &specs {
        cluster.add_pod(spec).unwrap().serve_echo(APP_PORT).unwrap();
    }
    cluster.wait_synced().unwrap();
    Some(cluster)
}

/// Opens `count` connections to `target` from `pod` and sends nothing.
pub fn open_silent(
    cluster: &Cluster,
    pod: &str,
    target: SocketAddr,
    count: usize,
) -> Vec<TcpStream> {
    let pod = cluster.pod(pod).unwrap();
    pod.ns
        .run(move || {
            (0..count)
                .map(|_| TcpStream::connect_timeout(&target, Duration::from_secs(3)).unwrap())
                .collect::<Vec<_>>()
        })
        .unwrap()
}

/// Opens a connection from `pod` to `target`, proven carried by one echoed
/// exchange, and returns it open.
pub fn hold(cluster: &Cluster, pod: &str, target: SocketAddr) -> TcpStream {
    let pod = cluster.pod(pod).unwrap();
    pod.ns
        .run(move || {
            let mut stream = TcpStream::connect_timeout(&target, Duration::from_secs(3)).unwrap();
            stream.set_read_timeout(Some(PATIENCE)).unwrap();
            stream.write_all(b"held").unwrap();
            let mut reply = [0u8; 4];
            stream.read_exact(&mut reply).unwrap();
            assert_eq!(&reply, b"held");
            stream
        })
        .unwrap()
}
