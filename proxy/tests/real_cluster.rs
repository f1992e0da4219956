#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test
//! The mesh installed as users install it, on a real two-node cluster
//! (`ztunnel_test_support::real_cluster`: kubelet, containerd and runc on
//! each node, kube-proxy, the controller-manager and scheduler, CoreDNS):
//! `helm install` of `deploy/charts/ztunnel-mesh` on nodes that start with
//! the `cni.istio.io/not-ready` taint, then what a user does next.
//!
//! One test runs the phases in order on one cluster, since a cluster takes
//! a minute to build; each phase is a function, and the figures (helm
//! install to all Ready, ...) are printed as it goes.
//!
//! Needs root, the binaries of `scripts/k8s-test-env.sh` and the images of
//! `scripts/build-images.sh --test-images` (`scripts/test.sh` builds both);
//! skips with the reason otherwise.

use std::time::{Duration, Instant};

use serde_json::Value;
use ztunnel_test_support::cluster::AccessEntry;
use ztunnel_test_support::helm::{self, Helm};
use ztunnel_test_support::real_cluster::{self, ClusterSpec, PodStatus, RealCluster};
use ztunnel_test_support::wait;

/// The namespace the chart is installed in, as Istio's is.
const MESH_NAMESPACE: &str = "istio-system";
/// The taint a node provisioner puts on new nodes, removed by the control
/// plane once the node's agent is Ready.
const NOT_READY_TAINT: &str = "cni.istio.io/not-ready";
/// The ambient namespace of the application.
const APP_NAMESPACE: &str = "demo";
/// The echo server's port.
const APP_PORT: u16 = 8080;
/// The trust domain the chart's default issues identities in.
const TRUST_DOMAIN: &str = "cluster.local";
/// The bound on pods turning Ready or a client pod finishing: seconds on a
/// warm machine.
const POD_WITHIN: Duration = Duration::from_secs(90);
/// The bound on the install becoming Ready: about a minute on a warm
/// machine; the figure is printed.
const INSTALL_READY_WITHIN: Duration = Duration::from_secs(300);

#[test]
fn the_chart_installs_on_a_real_cluster_and_meshes_its_pods() {
    if let Some(reason) = real_cluster::unavailable() {
        eprintln!("SKIP: no real cluster: {reason}");
        return;
    }
    let Some(helm) = Helm::find_or_skip() else {
        return;
    };
    let spec = ClusterSpec {
        nodes: vec!["node-a".to_owned(), "node-b".to_owned()],
        taints: vec![NOT_READY_TAINT.to_owned()],
        extra_tags: vec![],
    };
    let mut cluster = RealCluster::start(&spec).unwrap();
    println!(
        "figure: cluster start (API server to two nodes Ready): {:.1} s",
        cluster.started_in().as_secs_f64()
    );
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        install(&cluster, &helm);
        let app = App::deploy(&cluster);
        traffic_goes_through_ztunnel_with_the_pods_identities(&cluster, &app);
    }));
    if let Err(panic) = outcome {
        if std::env::var_os("ZTUNNEL_KEEP_CLUSTER_FILES").is_some() {
            eprintln!("cluster files kept at {:?}", cluster.keep_files());
        }
        std::panic::resume_unwind(panic);
    }
}

/// `helm install` with the taint controller on: both DaemonSets Ready on
/// both nodes, the control plane available, the taint gone from every
/// node, and no component refused by the API server's authorization.
fn install(cluster: &RealCluster, helm: &Helm) {
    let started = Instant::now();
    let kubeconfig = cluster
        .api()
        .unwrap()
        .admin_kubeconfig()
        .display()
        .to_string();
    let tag = cluster.images().tag.clone();
    let output = helm
        .run(&[
            "install",
            "mesh",
            &helm::chart_dir().display().to_string(),
            "--kubeconfig",
            &kubeconfig,
            "--namespace",
            MESH_NAMESPACE,
            "--create-namespace",
            "--set",
            &format!("tag={tag}"),
            "--set",
            "imagePullPolicy=Never",
            "--set",
            "taint.enabled=true",
            // Access log lines the tests parse.
            "--set",
            "ztunnel.logAsJson=true",
            // Every node starts tainted: the control plane must run for
            // any taint to go (values.yaml says so).
            "--set",
            &format!("controlPlane.tolerations[0].key={NOT_READY_TAINT}"),
            "--set",
            "controlPlane.tolerations[0].operator=Exists",
        ])
        .unwrap();
    println!(
        "helm install: {}",
        output.lines().next().unwrap_or_default()
    );

    let ready = wait::until(INSTALL_READY_WITHIN, || {
        install_ready(cluster).is_ok_and(|problems| problems.is_empty())
    });
    let problems = install_ready(cluster).unwrap();
    assert!(
        ready,
        "the install was not Ready in {INSTALL_READY_WITHIN:?}: {problems:?}\n{}",
        pods_summary(cluster)
    );
    println!(
        "figure: helm install to all Ready (DaemonSets on both nodes, control plane available, taints gone): {:.1} s",
        started.elapsed().as_secs_f64()
    );

    for (pod, container) in mesh_pods(cluster) {
        let log = cluster.pod_log(MESH_NAMESPACE, &pod, &container).unwrap();
        let refused = helm::permission_problems(&log);
        assert!(
            refused.is_empty(),
            "{pod}/{container} was refused: {refused:?}"
        );
    }
}

/// What is not yet as the install should leave it; empty once it is.
fn install_ready(cluster: &RealCluster) -> anyhow::Result<Vec<String>> {
    let mut problems = vec![];
    for daemonset in ["ztunnel", "istio-cni-node"] {
        let object = get_json(
            cluster,
            &["get", "daemonset", "-n", MESH_NAMESPACE, daemonset],
        )?;
        let status = &object["status"];
        let desired = status["desiredNumberScheduled"].as_u64().unwrap_or(0);
        let ready = status["numberReady"].as_u64().unwrap_or(0);
        if desired != 2 || ready != desired {
            problems.push(format!("daemonset {daemonset}: {ready} of {desired} ready"));
        }
    }
    let deployment = get_json(
        cluster,
        &["get", "deployment", "-n", MESH_NAMESPACE, "ztunnel-ca"],
    )?;
    let available = deployment["status"]["conditions"]
        .as_array()
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c["type"] == "Available" && c["status"] == "True")
        });
    if !available {
        problems.push("deployment ztunnel-ca not available".to_owned());
    }
    let nodes = get_json(cluster, &["get", "nodes"])?;
    for node in nodes["items"].as_array().into_iter().flatten() {
        let tainted = node["spec"]["taints"]
            .as_array()
            .is_some_and(|taints| taints.iter().any(|t| t["key"] == NOT_READY_TAINT));
        if tainted {
            problems.push(format!("node {} still tainted", node["metadata"]["name"]));
        }
    }
    Ok(problems)
}

/// Every container of the mesh's pods, as (pod, container).
fn mesh_pods(cluster: &RealCluster) -> Vec<(String, String)> {
    let pods = get_json(cluster, &["get", "pods", "-n", MESH_NAMESPACE]).unwrap();
    let mut out = vec![];
    for pod in pods["items"].as_array().into_iter().flatten() {
        let name = pod["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        for container in pod["spec"]["containers"].as_array().into_iter().flatten() {
            let container = container["name"].as_str().unwrap_or_default().to_owned();
            out.push((name.clone(), container));
        }
    }
    out
}

/// `kubectl get ... -o json`, parsed.
fn get_json(cluster: &RealCluster, args: &[&str]) -> anyhow::Result<Value> {
    let mut args = args.to_vec();
    args.extend(["-o", "json"]);
    Ok(serde_json::from_str(&cluster.kubectl(&args)?)?)
}

/// Every pod of the cluster with its node and phase, for failure messages.
fn pods_summary(cluster: &RealCluster) -> String {
    cluster
        .kubectl(&["get", "pods", "-A", "-o", "wide"])
        .unwrap_or_else(|error| error.to_string())
}

/// The application in the ambient namespace: an echo server on each node
/// behind the Service `echo`.
struct App {
    /// Echo pods by node name: (pod name, pod IP).
    echo: Vec<(String, String, String)>,
    /// The Service's ClusterIP.
    cluster_ip: String,
}

impl App {
    /// The namespace (labelled ambient), two service accounts, the echo
    /// Deployment (one pod per node) and its Service; waits until both
    /// pods are Ready and captured.
    fn deploy(cluster: &RealCluster) -> App {
        let image = cluster.images().reference(real_cluster::APP);
        cluster
            .api()
            .unwrap()
            .apply_server_side(&format!(
                r#"apiVersion: v1
kind: Namespace
metadata: {{name: {APP_NAMESPACE}, labels: {{istio.io/dataplane-mode: ambient}}}}
---
apiVersion: v1
kind: ServiceAccount
metadata: {{name: echo, namespace: {APP_NAMESPACE}}}
---
apiVersion: v1
kind: ServiceAccount
metadata: {{name: client, namespace: {APP_NAMESPACE}}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: echo, namespace: {APP_NAMESPACE}}}
spec:
  replicas: 2
  selector: {{matchLabels: {{app: echo}}}}
  template:
    metadata: {{labels: {{app: echo}}}}
    spec:
      serviceAccountName: echo
      affinity:
        podAntiAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            - {{labelSelector: {{matchLabels: {{app: echo}}}}, topologyKey: kubernetes.io/hostname}}
      containers:
        - name: echo
          image: {image}
          imagePullPolicy: Never
          command: [ztunnel-loadgen, --quiet, serve, --listen, "0.0.0.0:{APP_PORT}"]
          ports: [{{containerPort: {APP_PORT}}}]
          # A kubelet probe of a meshed pod: it must pass the probe SNAT.
          readinessProbe: {{tcpSocket: {{port: {APP_PORT}}}, periodSeconds: 1}}
---
apiVersion: v1
kind: Service
metadata: {{name: echo, namespace: {APP_NAMESPACE}}}
spec:
  selector: {{app: echo}}
  ports: [{{port: {APP_PORT}, targetPort: {APP_PORT}}}]
"#
            ))
            .unwrap();
        let ready = wait::until(POD_WITHIN, || {
            cluster.pods(APP_NAMESPACE, "app=echo").is_ok_and(|pods| {
                pods.len() == 2 && pods.iter().all(|pod| pod.ready && captured(pod))
            })
        });
        assert!(
            ready,
            "the echo pods were not Ready and captured in {POD_WITHIN:?}:\n{}",
            pods_summary(cluster)
        );
        let echo = cluster
            .pods(APP_NAMESPACE, "app=echo")
            .unwrap()
            .into_iter()
            .map(|pod| (pod.node.unwrap(), pod.name, pod.ip.unwrap()))
            .collect();
        let service = get_json(cluster, &["get", "service", "-n", APP_NAMESPACE, "echo"]).unwrap();
        let cluster_ip = service["spec"]["clusterIP"].as_str().unwrap().to_owned();
        App { echo, cluster_ip }
    }

    /// The echo pod on `node`: (name, IP).
    fn echo_on(&self, node: &str) -> (&str, &str) {
        self.echo
            .iter()
            .find(|(on, _, _)| on == node)
            .map(|(_, name, ip)| (name.as_str(), ip.as_str()))
            .unwrap()
    }
}

/// Whether the node agent marked the pod captured.
fn captured(pod: &PodStatus) -> bool {
    pod.annotations["ambient.istio.io/redirection"] == "enabled"
}

/// From a new client pod on each node, connections to the echo pod on the
/// same node, to the one on the other node, and to the Service's
/// ClusterIP all succeed, and every one of them reached the server's
/// ztunnel over mTLS under the client's identity: the pod was meshed
/// before its first connection.
fn traffic_goes_through_ztunnel_with_the_pods_identities(cluster: &RealCluster, app: &App) {
    let client_identity = format!("spiffe://{TRUST_DOMAIN}/ns/{APP_NAMESPACE}/sa/client");
    for node in ["node-a", "node-b"] {
        let other = if node == "node-a" { "node-b" } else { "node-a" };
        let (same_name, same_ip) = app.echo_on(node);
        let (other_name, other_ip) = app.echo_on(other);
        for (what, target, servers) in [
            ("same node", same_ip.to_owned(), vec![(node, same_name)]),
            ("cross node", other_ip.to_owned(), vec![(other, other_name)]),
            (
                "ClusterIP",
                app.cluster_ip.clone(),
                vec![(node, same_name), (other, other_name)],
            ),
        ] {
            let started = Instant::now();
            let name = format!("client-{node}-{}", what.replace(' ', "-").to_lowercase());
            let (pod, report) = run_client(
                cluster,
                &name,
                node,
                &[
                    "connect",
                    "--target",
                    &format!("{target}:{APP_PORT}"),
                    "--max-connections",
                    "20",
                    "--duration",
                    "10",
                ],
            );
            let made = report["connections_made"].as_u64().unwrap_or(0);
            assert_eq!(
                (made, report["errors"].as_u64()),
                (20, Some(0)),
                "{what} from {node}: {report}"
            );
            let client_ip = pod.ip.clone().unwrap_or_default();
            let tunnelled = servers
                .iter()
                .map(|(server_node, server)| {
                    access_log(cluster, server_node)
                        .iter()
                        .filter(|entry| {
                            entry.direction == "inbound"
                                && entry.src_identity.as_deref() == Some(client_identity.as_str())
                                && entry.src_addr.starts_with(&format!("{client_ip}:"))
                                && entry.dst_workload.as_deref() == Some(*server)
                                && entry.error.is_none()
                        })
                        .count()
                })
                .sum::<usize>();
            assert_eq!(
                tunnelled, 20,
                "{what} from {node}: of 20 connections, {tunnelled} reached the server's ztunnel as {client_identity}"
            );
            println!(
                "{what} from {node}: 20 connections through ztunnel as {client_identity} (client pod created to done: {:.1} s)",
                started.elapsed().as_secs_f64()
            );
        }
    }
}

/// Runs a client pod named `name` on `node` under the service account
/// `client`, with `ztunnel-loadgen` and `args`; waits until it ends, and
/// returns it with its report (the last line of its output).
fn run_client(cluster: &RealCluster, name: &str, node: &str, args: &[&str]) -> (PodStatus, Value) {
    let image = cluster.images().reference(real_cluster::APP);
    let args = serde_json::to_string(args).unwrap();
    cluster
        .api()
        .unwrap()
        .apply_server_side(&format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: {APP_NAMESPACE}, labels: {{app: client}}}}
spec:
  serviceAccountName: client
  restartPolicy: Never
  nodeSelector: {{kubernetes.io/hostname: {node}}}
  containers:
    - name: client
      image: {image}
      imagePullPolicy: Never
      command: [ztunnel-loadgen, --quiet]
      args: {args}
"#
        ))
        .unwrap();
    let mut pod = PodStatus::default();
    let ended = wait::until(POD_WITHIN, || {
        pod = cluster
            .pods(APP_NAMESPACE, "app=client")
            .unwrap_or_default()
            .into_iter()
            .find(|pod| pod.name == name)
            .unwrap_or_default();
        pod.phase == "Succeeded" || pod.phase == "Failed"
    });
    assert!(
        ended,
        "client pod {name} did not end: {pod:?}\n{}",
        pods_summary(cluster)
    );
    let output = cluster.pod_output(APP_NAMESPACE, name, "client").unwrap();
    let report = output
        .iter()
        .rev()
        .find_map(|line| serde_json::from_str::<Value>(line).ok())
        .unwrap_or(Value::Null);
    (pod, report)
}

/// The access log of the ztunnel on `node`.
fn access_log(cluster: &RealCluster, node: &str) -> Vec<AccessEntry> {
    let pod = cluster
        .pods(MESH_NAMESPACE, "app=ztunnel")
        .unwrap()
        .into_iter()
        .find(|pod| pod.node.as_deref() == Some(node))
        .unwrap();
    cluster
        .pod_output(MESH_NAMESPACE, &pod.name, "istio-proxy")
        .unwrap()
        .iter()
        .filter_map(|line| AccessEntry::parse(line))
        .collect()
}
