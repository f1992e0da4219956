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
use ztunnel_test_support::real_cluster::{
    self, ClusterSpec, MESH_NAMESPACE, NOT_READY_TAINT, PodStatus, RealCluster,
};
use ztunnel_test_support::wait;

/// The ambient namespace of the application.
const APP_NAMESPACE: &str = "demo";
/// The echo server's port.
const APP_PORT: u16 = 8080;
/// The trust domain the chart's default issues identities in.
const TRUST_DOMAIN: &str = "cluster.local";
/// The bound on pods turning Ready or a client pod finishing: seconds on a
/// warm machine.
const POD_WITHIN: Duration = Duration::from_secs(90);
/// ztunnel's grace period in the install: its drain deadline is 1 s less
/// (Istio's rule at 10 s or under), so a rollout takes seconds, not the
/// default's 25 s per node.
const ZTUNNEL_GRACE_S: u64 = 8;
/// The drain deadline that grace period gives.
const ZTUNNEL_DRAIN_S: u64 = ZTUNNEL_GRACE_S - 1;
/// The certificates' lifetime ztunnel asks for: short, so renewals happen
/// while the test runs, the control plane's rollout among them.
const SECRET_TTL: &str = "60s";
/// The bound on a rollout: its pods replaced one node at a time, each old
/// one drained.
const ROLLOUT_WITHIN: Duration = Duration::from_secs(240);
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
        extra_tags: vec![second_tag()],
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
        a_service_name_resolved_by_the_cluster_dns_goes_through_ztunnel(&cluster, &app);
        ztunnels_metrics_show_the_identities(&cluster);
        a_policy_applied_with_kubectl_denies_and_removing_it_allows_again(&cluster, &app);
        a_pod_scaled_up_later_is_meshed_before_its_first_connection(&cluster, &app);
        a_pod_created_while_its_agent_is_down_is_meshed_once_it_is_back(&cluster, &app);
        running_pods_join_when_their_namespace_is_labelled(&cluster);
        let soaks = Soaks::start(&cluster, &app);
        rollouts_drop_nothing(&cluster, &helm, &soaks);
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
    let first_line = cluster
        .helm_install(
            helm,
            &[
                // Access log lines the tests parse.
                "ztunnel.logAsJson=true".to_owned(),
                format!("ztunnel.terminationGracePeriodSeconds={ZTUNNEL_GRACE_S}"),
                format!("ztunnel.env.SECRET_TTL={SECRET_TTL}"),
            ],
        )
        .unwrap();
    println!("helm install: {first_line}");

    let ready = wait::until(INSTALL_READY_WITHIN, || {
        cluster
            .mesh_problems()
            .is_ok_and(|problems| problems.is_empty())
    });
    let problems = cluster.mesh_problems().unwrap();
    assert!(
        ready,
        "the install was not Ready in {INSTALL_READY_WITHIN:?}: {problems:?}\n{}",
        pods_summary(cluster)
    );
    println!(
        "figure: helm install to all Ready (DaemonSets on both nodes, control plane available, taints gone): {:.1} s",
        started.elapsed().as_secs_f64()
    );

    for (pod, container) in cluster.mesh_containers().unwrap() {
        let log = cluster.pod_log(MESH_NAMESPACE, &pod, &container).unwrap();
        let refused = helm::permission_problems(&log);
        assert!(
            refused.is_empty(),
            "{pod}/{container} was refused: {refused:?}"
        );
    }
}

/// `kubectl get ... -o json`, parsed.
fn get_json(cluster: &RealCluster, args: &[&str]) -> anyhow::Result<Value> {
    cluster.get_json(args)
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
        let created = Instant::now();
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
        println!(
            "figure: pod creation to meshed (both echo pods Ready and captured): {:.1} s",
            created.elapsed().as_secs_f64()
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
    let client_identity = client_identity();
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
            let (pod, report) =
                run_client(cluster, &name, node, &as_str(&connect_args(&target, 20)));
            let made = report["connections_made"].as_u64().unwrap_or(0);
            assert_eq!(
                (made, report["errors"].as_u64()),
                (20, Some(0)),
                "{what} from {node}: {report}"
            );
            let tunnelled: usize = servers
                .iter()
                .map(|(server_node, server)| {
                    delivered_as_client(cluster, server_node, server, &pod)
                })
                .sum();
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
    let args: Vec<String> = args.iter().map(|arg| (*arg).to_owned()).collect();
    create_client(cluster, name, node, &args);
    let pod = wait_client_done(cluster, name);
    let output = cluster.pod_output(APP_NAMESPACE, name, "client").unwrap();
    let report = output
        .iter()
        .rev()
        .find_map(|line| serde_json::from_str::<Value>(line).ok())
        .unwrap_or(Value::Null);
    (pod, report)
}

/// Creates a client pod named `name` on `node` under the service account
/// `client`, running `ztunnel-loadgen` with `args`.
fn create_client(cluster: &RealCluster, name: &str, node: &str, args: &[String]) {
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
}

/// Waits until the client pod `name` has ended; its status.
fn wait_client_done(cluster: &RealCluster, name: &str) -> PodStatus {
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
    pod
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

/// The identity of the client pods' service account.
fn client_identity() -> String {
    format!("spiffe://{TRUST_DOMAIN}/ns/{APP_NAMESPACE}/sa/client")
}

/// How many connections from the client pod `client` reached the echo pod
/// `server` through the ztunnel of `server_node` over mTLS, under the
/// client's identity, and were served.
fn delivered_as_client(
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

/// The arguments of a client that opens `count` connections to `target`.
fn connect_args(target: &str, count: u32) -> Vec<String> {
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

/// A DENY policy for the client's identity on the echo pods, applied with
/// kubectl: new connections from client pods are refused at the server's
/// ztunnel; once deleted, they are served again.
fn a_policy_applied_with_kubectl_denies_and_removing_it_allows_again(
    cluster: &RealCluster,
    app: &App,
) {
    let (_, target) = app.echo_on("node-b");
    let policy = format!(
        r#"apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {{name: deny-client, namespace: {APP_NAMESPACE}}}
spec:
  selector: {{matchLabels: {{app: echo}}}}
  action: DENY
  rules:
    - from: [{{source: {{principals: ["{TRUST_DOMAIN}/ns/{APP_NAMESPACE}/sa/client"]}}}}]
"#
    );
    let api = cluster.api().unwrap();
    api.kubectl(&["apply", "-f", "-"], Some(&policy)).unwrap();
    let started = Instant::now();
    let mut attempt = 0;
    let mut last = Value::Null;
    let denied = wait::until(POD_WITHIN, || {
        attempt += 1;
        let (_, report) = run_client(
            cluster,
            &format!("denied-{attempt}"),
            "node-a",
            &as_str(&connect_args(target, 5)),
        );
        last = report;
        last["connections_made"] == 0 && last["errors"] == 5
    });
    assert!(denied, "the DENY policy did not refuse the client: {last}");
    println!(
        "figure: policy applied to every connection refused: {:.1} s",
        started.elapsed().as_secs_f64()
    );

    api.kubectl(
        &[
            "delete",
            "authorizationpolicy",
            "-n",
            APP_NAMESPACE,
            "deny-client",
        ],
        None,
    )
    .unwrap();
    let started = Instant::now();
    let allowed = wait::until(POD_WITHIN, || {
        attempt += 1;
        let (_, report) = run_client(
            cluster,
            &format!("allowed-{attempt}"),
            "node-a",
            &as_str(&connect_args(target, 5)),
        );
        last = report;
        last["connections_made"] == 5 && last["errors"] == 0
    });
    assert!(
        allowed,
        "the client was still refused after the policy went: {last}"
    );
    println!(
        "figure: policy deleted to every connection served: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// A Deployment scaled from 0 to 1 after everything runs: its pod's first
/// run of connections (the first thing it does) all reach the server over
/// ztunnel under its identity.
fn a_pod_scaled_up_later_is_meshed_before_its_first_connection(cluster: &RealCluster, app: &App) {
    let (server, target) = app.echo_on("node-b");
    let image = cluster.images().reference(real_cluster::APP);
    let args = serde_json::to_string(&connect_args(target, 20)).unwrap();
    cluster
        .api()
        .unwrap()
        .apply_server_side(&format!(
            r#"apiVersion: apps/v1
kind: Deployment
metadata: {{name: late, namespace: {APP_NAMESPACE}}}
spec:
  replicas: 0
  selector: {{matchLabels: {{app: late}}}}
  template:
    metadata: {{labels: {{app: late}}}}
    spec:
      serviceAccountName: client
      nodeSelector: {{kubernetes.io/hostname: node-a}}
      containers:
        - name: client
          image: {image}
          imagePullPolicy: Never
          command: [ztunnel-loadgen, --quiet]
          args: {args}
"#
        ))
        .unwrap();
    let started = Instant::now();
    cluster
        .kubectl(&[
            "scale",
            "deployment",
            "-n",
            APP_NAMESPACE,
            "late",
            "--replicas=1",
        ])
        .unwrap();
    let mut pod = PodStatus::default();
    let mut report = Value::Null;
    let reported = wait::until(POD_WITHIN, || {
        let Some(found) = cluster
            .pods(APP_NAMESPACE, "app=late")
            .unwrap_or_default()
            .into_iter()
            .next()
        else {
            return false;
        };
        pod = found;
        // The first report: the container restarts once it is done.
        report = cluster
            .pod_output(APP_NAMESPACE, &pod.name, "client")
            .unwrap_or_default()
            .iter()
            .find_map(|line| {
                serde_json::from_str::<Value>(line)
                    .ok()
                    .filter(|value| value.get("mode").is_some())
            })
            .unwrap_or(Value::Null);
        !report.is_null()
    });
    assert!(reported, "the scaled-up pod reported nothing: {pod:?}");
    assert_eq!(
        (
            report["connections_made"].as_u64(),
            report["errors"].as_u64()
        ),
        (Some(20), Some(0)),
        "{report}"
    );
    let delivered = delivered_as_client(cluster, "node-b", server, &pod);
    assert!(
        delivered >= 20,
        "of the scaled-up pod's first 20 connections, {delivered} reached the server through ztunnel"
    );
    println!(
        "figure: scale-up to the new pod's 20 connections served through ztunnel: {:.1} s",
        started.elapsed().as_secs_f64()
    );
    cluster
        .kubectl(&[
            "scale",
            "deployment",
            "-n",
            APP_NAMESPACE,
            "late",
            "--replicas=0",
        ])
        .unwrap();
}

/// node-b's agent stopped (SIGSTOP, so it neither answers the CNI plugin
/// nor exits): a pod created there cannot get its sandbox (the plugin
/// fails the ADD) until the agent is back, and then starts meshed: every
/// connection it makes reaches the server through ztunnel.
fn a_pod_created_while_its_agent_is_down_is_meshed_once_it_is_back(
    cluster: &RealCluster,
    app: &App,
) {
    let node = cluster.node("node-b").unwrap();
    let agent = get_json(
        cluster,
        &[
            "get",
            "pods",
            "-n",
            MESH_NAMESPACE,
            "-l",
            "k8s-app=istio-cni-node",
            "--field-selector",
            "spec.nodeName=node-b",
        ],
    )
    .unwrap();
    let container = agent["items"][0]["status"]["containerStatuses"][0]["containerID"]
        .as_str()
        .unwrap()
        .trim_start_matches("containerd://")
        .to_owned();
    let pid = cluster
        .crictl(
            node,
            &[
                "inspect",
                "-o",
                "go-template",
                "--template",
                "{{.info.pid}}",
                &container,
            ],
        )
        .unwrap()
        .trim()
        .to_owned();
    node.run(std::path::Path::new("/bin/kill"), &["-STOP", &pid])
        .unwrap();
    let stopped = Instant::now();

    let (server, target) = app.echo_on("node-a");
    let name = "while-agent-down";
    let image = cluster.images().reference(real_cluster::APP);
    let args = serde_json::to_string(&connect_args(target, 20)).unwrap();
    let created = cluster.api().unwrap().apply_server_side(&format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: {APP_NAMESPACE}, labels: {{app: client}}}}
spec:
  serviceAccountName: client
  restartPolicy: Never
  nodeSelector: {{kubernetes.io/hostname: node-b}}
  containers:
    - name: client
      image: {image}
      imagePullPolicy: Never
      command: [ztunnel-loadgen, --quiet]
      args: {args}
"#
    ));
    let refused = wait::until(POD_WITHIN, || {
        cluster
            .kubectl(&[
                "get",
                "events",
                "-n",
                APP_NAMESPACE,
                "--field-selector",
                &format!("involvedObject.name={name},reason=FailedCreatePodSandBox"),
                "-o",
                "name",
            ])
            .is_ok_and(|events| !events.trim().is_empty())
    });
    let pod_before = cluster
        .pods(APP_NAMESPACE, "app=client")
        .unwrap_or_default();
    node.run(std::path::Path::new("/bin/kill"), &["-CONT", &pid])
        .unwrap();
    println!(
        "agent on node-b stopped for {:.1} s",
        stopped.elapsed().as_secs_f64()
    );
    created.unwrap();
    assert!(
        refused,
        "no failed sandbox while the agent was stopped: {pod_before:?}"
    );
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
        "{name} did not end after the agent came back: {pod:?}"
    );
    let delivered = delivered_as_client(cluster, "node-a", server, &pod);
    assert_eq!(
        delivered, 20,
        "of the 20 connections of a pod created while its agent was down, {delivered} reached the server through ztunnel"
    );
    // Its annotation is gone by now: a pod that has ended leaves the mesh
    // with its sandbox. The connections it made are the proof.
}

fn as_str(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

/// Load generators that run through every rollout (`ztunnel-loadgen
/// soak`): four long-lived connections each exchanging a message every
/// 200 ms, and 20 new connections a second; across nodes, on one node, and
/// to the Service by its name (resolved by the cluster DNS for every
/// connection).
struct Soaks {
    /// (pod name, what it covers).
    pods: Vec<(&'static str, &'static str)>,
}

/// The bound on one soak run; the test ends them well before.
const SOAK_DURATION_S: u32 = 1200;

impl Soaks {
    fn start(cluster: &RealCluster, app: &App) -> Soaks {
        let (_, echo_a) = app.echo_on("node-a");
        let (_, echo_b) = app.echo_on("node-b");
        let service = format!("echo.{APP_NAMESPACE}.svc.cluster.local");
        let pods = vec![
            (
                "soak-cross-node",
                "node-a",
                echo_b.to_owned(),
                "across nodes",
            ),
            ("soak-same-node", "node-a", echo_a.to_owned(), "on one node"),
            (
                "soak-service-name",
                "node-b",
                service,
                "to the Service by name",
            ),
        ];
        let image = cluster.images().reference(real_cluster::APP);
        for (name, node, target, _) in &pods {
            let args = serde_json::to_string(&[
                "soak",
                "--target",
                &format!("{target}:{APP_PORT}"),
                "--connections",
                "4",
                "--rate",
                "20",
                "--duration",
                &SOAK_DURATION_S.to_string(),
            ])
            .unwrap();
            cluster
                .api()
                .unwrap()
                .apply_server_side(&format!(
                    r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: {APP_NAMESPACE}, labels: {{app: soak}}}}
spec:
  serviceAccountName: client
  restartPolicy: Never
  nodeSelector: {{kubernetes.io/hostname: {node}}}
  containers:
    - name: soak
      image: {image}
      imagePullPolicy: Never
      command: [ztunnel-loadgen, --quiet]
      args: {args}
"#
                ))
                .unwrap();
        }
        let soaks = Soaks {
            pods: pods
                .iter()
                .map(|(name, _, _, what)| (*name, *what))
                .collect(),
        };
        let running = wait::until(POD_WITHIN, || {
            soaks.pods.iter().all(|(name, _)| {
                soak_counts(cluster, name).is_some_and(|counts| {
                    counts["long_lived"]["open"] == 4 && counts["new"]["ok"].as_u64() > Some(20)
                })
            })
        });
        let counts: Vec<_> = soaks
            .pods
            .iter()
            .map(|(name, _)| soak_counts(cluster, name))
            .collect();
        assert!(running, "the soak clients did not get going: {counts:?}");
        soaks
    }

    /// Each soak's latest counts.
    fn counts(&self, cluster: &RealCluster) -> Vec<Value> {
        self.pods
            .iter()
            .map(|(name, _)| soak_counts(cluster, name).unwrap_or(Value::Null))
            .collect()
    }
}

/// The last line of counts a soak pod printed.
fn soak_counts(cluster: &RealCluster, pod: &str) -> Option<Value> {
    cluster
        .pod_output(APP_NAMESPACE, pod, "soak")
        .ok()?
        .iter()
        .rev()
        .find_map(|line| {
            serde_json::from_str::<Value>(line)
                .ok()
                .filter(|value| value.get("long_lived").is_some())
        })
}

/// Failures of every kind in a soak's failure counts.
fn failures(counts: &Value) -> u64 {
    counts
        .as_object()
        .map(|kinds| kinds.values().filter_map(Value::as_u64).sum())
        .unwrap_or(0)
}

/// `helm upgrade` of ztunnel, of the node agent, and of the control plane,
/// each to the same image under a second tag, while the soaks run: no new
/// connection fails, and no long-lived one breaks before the drain
/// deadline of the ztunnel that carried it.
fn rollouts_drop_nothing(cluster: &RealCluster, helm: &Helm, soaks: &Soaks) {
    let second = second_tag();
    let ztunnel = Rollout {
        what: "ztunnel",
        set: format!("ztunnel.image=docker.io/library/ztunnel:{second}"),
        kind: "daemonset",
        name: "ztunnel",
        selector: "app=ztunnel",
    };
    let dropped = ztunnel.run(cluster, helm, soaks, &|| {});
    assert_eq!(
        dropped,
        Dropped::default(),
        "the ztunnel rollout dropped connections"
    );

    let mut created = vec![];
    let agent = Rollout {
        what: "node agent",
        set: format!("nodeAgent.image=docker.io/library/ztunnel-agent:{second}"),
        kind: "daemonset",
        name: "istio-cni-node",
        selector: "k8s-app=istio-cni-node",
    };
    let created_cell = std::cell::RefCell::new(&mut created);
    let dropped = agent.run(cluster, helm, soaks, &|| {
        // Pods created while the agents roll: each must be meshed from its
        // first connection.
        let mut created = created_cell.borrow_mut();
        if created.len() < 6 {
            let node = if created.len() % 2 == 0 {
                "node-a"
            } else {
                "node-b"
            };
            let name = format!("during-agent-rollout-{}", created.len());
            create_client(
                cluster,
                &name,
                node,
                &connect_args(&target_on_other(cluster, node), 20),
            );
            created.push((name, node));
        }
    });
    assert_eq!(
        dropped,
        Dropped::default(),
        "the node agent's rollout dropped connections"
    );
    for (name, node) in created {
        let pod = wait_client_done(cluster, &name);
        let other = if node == "node-a" { "node-b" } else { "node-a" };
        let server = echo_pod_on(cluster, other);
        let delivered = delivered_as_client(cluster, other, &server, &pod);
        assert_eq!(
            delivered, 20,
            "{name}, created during the agents' rollout on {node}: {delivered} of 20 connections reached the server through ztunnel"
        );
    }
    println!("pods created during the agents' rollout: 6, every connection through ztunnel");

    let control_plane = Rollout {
        what: "control plane",
        set: format!("controlPlane.image=docker.io/library/ztunnel-ca:{second}"),
        kind: "deployment",
        name: "ztunnel-ca",
        selector: "app=ztunnel-ca",
    };
    let dropped = control_plane.run(cluster, helm, soaks, &|| {});
    assert_eq!(
        dropped,
        Dropped::default(),
        "the control plane's rollout dropped connections"
    );
    certificates_are_renewed_by_the_new_control_plane(cluster);
}

/// What a rollout dropped, summed over the soaks.
#[derive(Debug, Default, PartialEq, Eq)]
struct Dropped {
    /// New connections (short ones, and long-lived ones being reopened)
    /// refused or failed.
    new: u64,
    /// Long-lived connections broken before the drain deadline of the
    /// ztunnel that carried them.
    long_lived: u64,
}

/// One `helm upgrade` and what it replaces.
struct Rollout {
    what: &'static str,
    /// The `--set` that changes the image.
    set: String,
    kind: &'static str,
    name: &'static str,
    selector: &'static str,
}

impl Rollout {
    /// Upgrades, calls `during` every half second until the rollout is
    /// done and every old pod gone, and returns the number of connections
    /// it dropped (printing the figures).
    fn run(&self, cluster: &RealCluster, helm: &Helm, soaks: &Soaks, during: &dyn Fn()) -> Dropped {
        let before = soaks.counts(cluster);
        let old: Vec<String> = cluster
            .pods(MESH_NAMESPACE, self.selector)
            .unwrap()
            .into_iter()
            .map(|pod| pod.name)
            .collect();
        let started = Instant::now();
        cluster
            .helm_upgrade(helm, std::slice::from_ref(&self.set))
            .unwrap();
        // When each old pod was asked to stop (its deletionTimestamp less
        // its grace period), as first seen.
        let mut stopping: Vec<(String, f64)> = vec![];
        let done = wait::until(ROLLOUT_WITHIN, || {
            during();
            let pods = get_json(
                cluster,
                &["get", "pods", "-n", MESH_NAMESPACE, "-l", self.selector],
            )
            .unwrap_or(Value::Null);
            let items = pods["items"].as_array().cloned().unwrap_or_default();
            for pod in &items {
                let name = pod["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                if let (Some(deletion), Some(grace)) = (
                    pod["metadata"]["deletionTimestamp"].as_str(),
                    pod["metadata"]["deletionGracePeriodSeconds"].as_f64(),
                ) && !stopping.iter().any(|(seen, _)| *seen == name)
                {
                    stopping.push((name, unix_seconds(deletion) - grace));
                }
            }
            let old_left = items.iter().any(|pod| {
                old.iter()
                    .any(|name| pod["metadata"]["name"].as_str() == Some(name.as_str()))
            });
            !old_left && self.complete(cluster)
        });
        assert!(
            done,
            "the {} rollout did not finish in {ROLLOUT_WITHIN:?}:\n{}",
            self.what,
            pods_summary(cluster)
        );
        let rollout_s = started.elapsed().as_secs_f64();
        // Counts printed after the last old pod is gone.
        std::thread::sleep(Duration::from_secs(2));
        let after = soaks.counts(cluster);
        let first_stop = stopping
            .iter()
            .map(|(_, at)| *at)
            .fold(f64::INFINITY, f64::min);
        let mut dropped = Dropped::default();
        for (((pod, what), before), after) in soaks.pods.iter().zip(&before).zip(&after) {
            let new_failed = failures(&after["new"]["failed"]) - failures(&before["new"]["failed"]);
            let open_failed = failures(&after["long_lived"]["open_failed"])
                - failures(&before["long_lived"]["open_failed"]);
            let started_at = after["started_unix_s"].as_f64().unwrap_or(0.0);
            let since = before["elapsed_s"].as_f64().unwrap_or(0.0);
            let breaks: Vec<f64> = after["long_lived"]["breaks"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|b| b["at_s"].as_f64())
                .filter(|at| *at > since)
                .map(|at| started_at + at)
                .collect();
            // Allowed: the old ztunnel's forced close at its deadline, and
            // anything after; half a second of slack for the timestamps'
            // rounding.
            let deadline = first_stop + ZTUNNEL_DRAIN_S as f64 - 0.5;
            let early = breaks.iter().filter(|at| **at < deadline).count() as u64;
            let new_ok = after["new"]["ok"].as_u64().unwrap_or(0)
                - before["new"]["ok"].as_u64().unwrap_or(0);
            println!(
                "figure: {} rollout, {what} ({pod}): {new_ok} new connections served, {new_failed} refused or failed; {} long-lived broken before the drain deadline, {} at or after it; {open_failed} reopenings failed",
                self.what,
                early,
                breaks.len() as u64 - early,
            );
            dropped.new += new_failed + open_failed;
            dropped.long_lived += early;
        }
        println!(
            "figure: {} rollout done (every old pod gone) in {rollout_s:.1} s",
            self.what
        );
        dropped
    }

    /// Whether the workload reports every replica updated and available.
    fn complete(&self, cluster: &RealCluster) -> bool {
        let Ok(object) = get_json(
            cluster,
            &["get", self.kind, "-n", MESH_NAMESPACE, self.name],
        ) else {
            return false;
        };
        let status = &object["status"];
        let generation = object["metadata"]["generation"].as_u64();
        let observed = status["observedGeneration"].as_u64();
        if generation != observed {
            return false;
        }
        match self.kind {
            "daemonset" => {
                let desired = status["desiredNumberScheduled"].as_u64();
                desired == status["updatedNumberScheduled"].as_u64()
                    && desired == status["numberAvailable"].as_u64()
            }
            _ => {
                let replicas = status["replicas"].as_u64();
                replicas == status["updatedReplicas"].as_u64()
                    && replicas == status["availableReplicas"].as_u64()
            }
        }
    }
}

/// Seconds since the epoch of an RFC 3339 time as the API writes it
/// (`2026-12-06T02:00:00Z`).
fn unix_seconds(rfc3339: &str) -> f64 {
    let output = std::process::Command::new("date")
        .args(["-d", rfc3339, "+%s"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .unwrap()
}

/// The echo pod's IP on the node other than `node`.
fn target_on_other(cluster: &RealCluster, node: &str) -> String {
    let other = if node == "node-a" { "node-b" } else { "node-a" };
    cluster
        .pods(APP_NAMESPACE, "app=echo")
        .unwrap()
        .into_iter()
        .find(|pod| pod.node.as_deref() == Some(other))
        .and_then(|pod| pod.ip)
        .unwrap()
}

/// The echo pod's name on `node`.
fn echo_pod_on(cluster: &RealCluster, node: &str) -> String {
    cluster
        .pods(APP_NAMESPACE, "app=echo")
        .unwrap()
        .into_iter()
        .find(|pod| pod.node.as_deref() == Some(node))
        .unwrap()
        .name
}

/// After the control plane's rollout, the new control plane pod has
/// issued certificates (ztunnels renew every half `SECRET_TTL`) and serves
/// xDS to both ztunnels.
fn certificates_are_renewed_by_the_new_control_plane(cluster: &RealCluster) {
    let pod = cluster
        .pods(MESH_NAMESPACE, "app=ztunnel-ca")
        .unwrap()
        .remove(0);
    let address: std::net::SocketAddr = format!("{}:15014", pod.ip.clone().unwrap())
        .parse()
        .unwrap();
    let node = cluster.node(pod.node.as_deref().unwrap()).unwrap();
    let started = Instant::now();
    let mut metrics = String::new();
    let renewed = wait::until(Duration::from_secs(90), || {
        metrics = node
            .netns()
            .http_get_from(address, "/metrics")
            .map(|(_, body)| body)
            .unwrap_or_default();
        metric_sum(&metrics, "ca_certificates_issued") >= 2.0
    });
    assert!(
        renewed,
        "the new control plane issued no certificates in 90 s:\n{metrics}"
    );
    println!(
        "figure: control plane rolled to certificates renewed by the new one: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// The sum of every sample of a metric family in Prometheus text.
fn metric_sum(text: &str, family: &str) -> f64 {
    text.lines()
        .filter(|line| line.starts_with(family))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The second tag every project image is loaded under: the same image, for
/// upgrades that change nothing but the tag.
fn second_tag() -> String {
    format!("{}-b", env!("CARGO_PKG_VERSION"))
}

/// A client that dials the Service by its name (the pod's resolver asks
/// the cluster DNS for every connection): every connection it made reached
/// an echo pod through ztunnel under its identity.
fn a_service_name_resolved_by_the_cluster_dns_goes_through_ztunnel(
    cluster: &RealCluster,
    app: &App,
) {
    let name = "client-service-name";
    let target = format!("echo.{APP_NAMESPACE}.svc.cluster.local:{APP_PORT}");
    let (pod, report) = run_client(
        cluster,
        name,
        "node-a",
        &[
            "soak",
            "--target",
            &target,
            "--connections",
            "0",
            "--rate",
            "10",
            "--duration",
            "3",
        ],
    );
    let ok = report["new"]["ok"].as_u64().unwrap_or(0);
    assert!(
        ok > 0 && failures(&report["new"]["failed"]) == 0,
        "dialing {target}: {report}"
    );
    let delivered: usize = ["node-a", "node-b"]
        .iter()
        .map(|node| delivered_as_client(cluster, node, app.echo_on(node).0, &pod))
        .sum();
    assert_eq!(
        delivered as u64, ok,
        "of {ok} connections to {target}, {delivered} reached an echo pod through ztunnel"
    );
    println!(
        "Service by name from node-a: {ok} connections through ztunnel as {}",
        client_identity()
    );
}

/// Each ztunnel's Prometheus endpoint (15020, scraped from its node as
/// Prometheus would from the pod network) counts the connections it
/// received with the client's and the server's SPIFFE identities.
fn ztunnels_metrics_show_the_identities(cluster: &RealCluster) {
    let client = client_identity();
    let server = format!("spiffe://{TRUST_DOMAIN}/ns/{APP_NAMESPACE}/sa/echo");
    for ztunnel in cluster.pods(MESH_NAMESPACE, "app=ztunnel").unwrap() {
        let node = cluster.node(ztunnel.node.as_deref().unwrap()).unwrap();
        let address = format!("{}:15020", ztunnel.ip.as_deref().unwrap())
            .parse()
            .unwrap();
        let (status, text) = node.netns().http_get_from(address, "/metrics").unwrap();
        assert_eq!(status, 200, "{text}");
        let opened: f64 = text
            .lines()
            .filter(|line| {
                line.starts_with("istio_tcp_connections_opened_total{")
                    && line.contains("reporter=\"destination\"")
                    && line.contains(&format!("source_principal=\"{client}\""))
                    && line.contains(&format!("destination_principal=\"{server}\""))
            })
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        assert!(
            opened >= 20.0,
            "{}'s ztunnel counts {opened} connections from {client} to {server}",
            ztunnel.node.as_deref().unwrap_or_default()
        );
        println!(
            "{}'s ztunnel metrics: {opened} connections from {client} to {server}",
            ztunnel.node.as_deref().unwrap_or_default()
        );
    }
}

/// A server started in a namespace that is not ambient, then the
/// namespace labelled: the node agent finds the running pod through the
/// node's procfs (its cgroup path in cgroupfs form, kubelet's
/// `.../kubepods/besteffort/pod<uid>/<container>`), meshes it without a
/// restart, and a client's connections reach it through ztunnel.
fn running_pods_join_when_their_namespace_is_labelled(cluster: &RealCluster) {
    let namespace = "joins-later";
    let image = cluster.images().reference(real_cluster::APP);
    cluster
        .api()
        .unwrap()
        .apply_server_side(&format!(
            r#"apiVersion: v1
kind: Namespace
metadata: {{name: {namespace}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: server, namespace: {namespace}, labels: {{app: server}}}}
spec:
  nodeSelector: {{kubernetes.io/hostname: node-b}}
  containers:
    - name: server
      image: {image}
      imagePullPolicy: Never
      command: [ztunnel-loadgen, --quiet, serve, --listen, "0.0.0.0:{APP_PORT}"]
      readinessProbe: {{tcpSocket: {{port: {APP_PORT}}}, periodSeconds: 1}}
"#
        ))
        .unwrap();
    let mut server = PodStatus::default();
    let running = wait::until(POD_WITHIN, || {
        server = cluster
            .pods(namespace, "app=server")
            .unwrap_or_default()
            .into_iter()
            .next()
            .unwrap_or_default();
        server.ready
    });
    assert!(running, "the plain server did not start: {server:?}");
    assert!(
        !captured(&server),
        "a pod of a plain namespace was captured: {server:?}"
    );

    let started = Instant::now();
    cluster
        .kubectl(&[
            "label",
            "namespace",
            namespace,
            "istio.io/dataplane-mode=ambient",
        ])
        .unwrap();
    let joined = wait::until(POD_WITHIN, || {
        cluster
            .pods(namespace, "app=server")
            .is_ok_and(|pods| pods.iter().any(captured))
    });
    assert!(
        joined,
        "the running pod was not meshed after its namespace was labelled"
    );
    println!(
        "figure: namespace labelled to its running pod meshed (found through procfs): {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let target = server.ip.clone().unwrap();
    let (client, report) = run_client(
        cluster,
        "client-joins-later",
        "node-a",
        &as_str(&connect_args(&target, 20)),
    );
    assert_eq!(
        (
            report["connections_made"].as_u64(),
            report["errors"].as_u64()
        ),
        (Some(20), Some(0)),
        "{report}"
    );
    let delivered = delivered_as_client(cluster, "node-b", "server", &client);
    assert_eq!(
        delivered, 20,
        "of 20 connections to the pod meshed while running, {delivered} reached it through ztunnel"
    );
}
