#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test
//! The mesh installed as users install it, on a real two-node cluster
//! (`ztunnel_test_support::real_cluster`: kubelet, containerd and runc on
//! each node, kube-proxy, the controller-manager and scheduler, CoreDNS):
//! `helm install` of `deploy/charts/ztunnel-mesh` (with the operator's CA
//! plugged in as `cacerts`, and the Gateway API CRDs in the chart's
//! `crds/` when `scripts/k8s-test-env.sh --chart-crds` wrote them) on
//! nodes that start with the `cni.istio.io/not-ready` taint, then what a
//! user does next, a waypoint pod among it.
//!
//! A second test installs Istio's own charts instead (istiod, istio-cni,
//! and Istio's ztunnel chart running our image) on a cluster of its own:
//! `real_cluster/istio.rs`.
//!
//! Each test runs its phases in order on one cluster, since a cluster
//! takes a minute to build; each phase is a function, and the figures
//! (helm install to all Ready, ...) are printed as it goes. The tests take
//! turns: one cluster at a time.
//!
//! Needs root, the binaries of `scripts/k8s-test-env.sh` (with `--istio`
//! for the second test) and the images of `scripts/build-images.sh
//! --test-images` (and `--istio-images`); `scripts/test.sh` builds them
//! all. Skips with the reason otherwise.

use std::time::{Duration, Instant};

use serde_json::Value;
use ztunnel_test_support::ca::TestRoot;
use ztunnel_test_support::cluster::AccessEntry;
use ztunnel_test_support::helm::{self, Helm};
use ztunnel_test_support::real_cluster::{
    self, ClusterSpec, LoadgenPod, MESH_NAMESPACE, NOT_READY_TAINT, PodStatus, RealCluster,
};
use ztunnel_test_support::skip::skip;
use ztunnel_test_support::wait;

#[path = "real_cluster/clients.rs"]
mod clients;
#[path = "real_cluster/dns.rs"]
mod dns;
#[path = "real_cluster/enrollment.rs"]
mod enrollment;
#[path = "real_cluster/istio.rs"]
mod istio;
#[path = "real_cluster/lifecycle.rs"]
mod lifecycle;
#[path = "real_cluster/rollouts.rs"]
mod rollouts;
#[path = "real_cluster/waypoint.rs"]
mod waypoint;

use clients::*;
use rollouts::*;

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

/// One real cluster at a time: each takes both cores for its start-up,
/// and the tests of this file run in parallel by default.
static ONE_CLUSTER: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn the_chart_installs_on_a_real_cluster_and_meshes_its_pods() {
    let spec = ClusterSpec {
        nodes: vec!["node-a".to_owned(), "node-b".to_owned()],
        taints: vec![NOT_READY_TAINT.to_owned()],
        extra_tags: vec![second_tag()],
        istio: false,
    };
    on_a_cluster(&spec, |cluster, helm| {
        // The operator's CA: the waypoint pod's certificate is issued from
        // it by the test.
        let root = TestRoot::generate(TRUST_DOMAIN).unwrap();
        install(cluster, helm, &root);
        let app = App::deploy(cluster);
        traffic_goes_through_ztunnel_with_the_pods_identities(cluster, &app);
        a_service_name_resolved_for_every_connection_goes_through_ztunnel(cluster, &app);
        dns::a_meshed_pods_lookups_are_answered_by_its_ztunnel_or_forwarded_to_the_cluster_dns(
            cluster, &app,
        );
        ztunnels_metrics_show_the_identities(cluster);
        a_policy_applied_with_kubectl_denies_and_removing_it_allows_again(cluster, &app);
        enrollment::a_pod_scaled_up_later_is_meshed_before_its_first_connection(cluster, &app);
        enrollment::a_pod_created_while_its_agent_is_down_is_meshed_once_it_is_back(cluster, &app);
        enrollment::running_pods_join_when_their_namespace_is_labelled(cluster);
        waypoint::a_namespace_labelled_to_use_a_waypoint_pod_reaches_its_service_through_it(
            cluster, &app, &root,
        );
        let soaks = Soaks::start(cluster, &app);
        rollouts_drop_nothing(cluster, helm, &soaks);
    });
}

#[test]
fn istios_istiod_istio_cni_and_charts_drive_our_ztunnel_on_a_real_cluster() {
    if let Some(reason) = real_cluster::istio::unavailable() {
        skip(format_args!(
            "no Istio components for the real cluster: {reason}"
        ));
        return;
    }
    let spec = ClusterSpec {
        nodes: vec!["node-a".to_owned(), "node-b".to_owned()],
        taints: vec![],
        extra_tags: vec![second_tag()],
        istio: true,
    };
    on_a_cluster(&spec, |cluster, helm| {
        istio::install(cluster, helm);
        let app = App::deploy(cluster);
        traffic_goes_through_ztunnel_with_the_pods_identities(cluster, &app);
        a_service_name_resolved_for_every_connection_goes_through_ztunnel(cluster, &app);
        ztunnels_metrics_show_the_identities(cluster);
        istio::istioctl_reads_our_ztunnels(cluster);
        istio::policies_from_istiod_hold_for_new_and_open_connections(cluster, &app);
        istio::peer_authentication_strict_refuses_plaintext_and_permissive_admits_it(cluster, &app);
        istio::our_ztunnels_ride_out_an_istiod_outage(cluster, &app);
        istio::a_refused_identity_is_logged_and_other_pods_keep_working(cluster, helm, &app);
        istio::a_rollout_under_istio_cni_drops_nothing(cluster, helm, &app);
        istio::a_pod_created_while_ztunnel_is_away_is_served_once_it_is_back(cluster, &app);
        istio::our_agent_and_ztunnel_with_istiod(cluster, helm);
    });
}

/// Starts a cluster of `spec` (one at a time), prints its start-up figure
/// and runs `phases` on it; on a failure, keeps the cluster's files when
/// `ZTUNNEL_KEEP_CLUSTER_FILES` is set. Skips, with the reason, where a
/// real cluster cannot run.
fn on_a_cluster(spec: &ClusterSpec, phases: impl FnOnce(&RealCluster, &Helm)) {
    if let Some(reason) = real_cluster::unavailable() {
        skip(format_args!("no real cluster: {reason}"));
        return;
    }
    let Some(helm) = Helm::find_or_skip() else {
        return;
    };
    let _one = ONE_CLUSTER
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let mut cluster = RealCluster::start(spec).unwrap();
    println!(
        "figure: cluster start (API server to two nodes Ready): {:.1} s",
        cluster.started_in().as_secs_f64()
    );
    let outcome =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| phases(&cluster, &helm)));
    if let Err(panic) = outcome {
        if std::env::var_os("ZTUNNEL_KEEP_CLUSTER_FILES").is_some() {
            eprintln!("cluster files kept at {:?}", cluster.keep_files());
        }
        std::panic::resume_unwind(panic);
    }
}

/// `helm install` with the taint controller on, `root` plugged in as the
/// operator's CA (`cacerts`): both DaemonSets Ready on both nodes, the
/// control plane available and publishing `root`, the taint gone from
/// every node, and no component refused by the API server's
/// authorization.
fn install(cluster: &RealCluster, helm: &Helm, root: &TestRoot) {
    cluster.plug_in_ca(root).unwrap();
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

    let published = get_json(
        cluster,
        &[
            "get",
            "configmap",
            "-n",
            MESH_NAMESPACE,
            "istio-ca-root-cert",
        ],
    )
    .unwrap();
    let published = published["data"]["root-cert.pem"]
        .as_str()
        .unwrap_or_default();
    assert!(
        published.contains(root.cert_pem().trim()),
        "the control plane publishes the root of cacerts, not:\n{published}"
    );

    no_component_was_refused(cluster);
}

/// No container of the mesh's namespace logged a refusal by the API
/// server's authorization.
fn no_component_was_refused(cluster: &RealCluster) {
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

/// A DENY policy for the client's identity on the echo pods, applied with
/// kubectl: new connections from client pods are refused at the server's
/// ztunnel; once deleted, they are served again.
fn a_policy_applied_with_kubectl_denies_and_removing_it_allows_again(
    cluster: &RealCluster,
    app: &App,
) {
    let (_, target) = app.echo_on("node-b");
    apply(cluster, &echo_policy("deny-client", "DENY", "client"));
    let (took, _) = until_clients(cluster, Source::client("node-a"), target, false)
        .unwrap_or_else(|last| panic!("the DENY policy did not refuse the client: {last}"));
    println!(
        "figure: policy applied to every connection refused: {:.1} s",
        took.as_secs_f64()
    );

    delete_policy(cluster, "deny-client");
    let (took, _) =
        until_clients(cluster, Source::client("node-a"), target, true).unwrap_or_else(|last| {
            panic!("the client was still refused after the policy went: {last}")
        });
    println!(
        "figure: policy deleted to every connection served: {:.1} s",
        took.as_secs_f64()
    );
}

/// `kubectl apply` of `yaml`.
fn apply(cluster: &RealCluster, yaml: &str) {
    cluster
        .api()
        .unwrap()
        .kubectl(&["apply", "-f", "-"], Some(yaml))
        .unwrap();
}

/// Deletes the application namespace's AuthorizationPolicy `name`.
fn delete_policy(cluster: &RealCluster, name: &str) {
    cluster
        .kubectl(&["delete", "authorizationpolicy", "-n", APP_NAMESPACE, name])
        .unwrap();
}

/// Creates the application namespace's service account `name`.
fn create_service_account(cluster: &RealCluster, name: &str) {
    cluster
        .api()
        .unwrap()
        .apply_server_side(&format!(
            "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: {name}, namespace: {APP_NAMESPACE}}}\n"
        ))
        .unwrap();
}

/// An AuthorizationPolicy `name` on the echo pods: `action` (`DENY`,
/// `ALLOW`) for connections under the application namespace's service
/// account `service_account`.
fn echo_policy(name: &str, action: &str, service_account: &str) -> String {
    format!(
        r#"apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {{name: {name}, namespace: {APP_NAMESPACE}}}
spec:
  selector: {{matchLabels: {{app: echo}}}}
  action: {action}
  rules:
    - from: [{{source: {{principals: ["{TRUST_DOMAIN}/ns/{APP_NAMESPACE}/sa/{service_account}"]}}}}]
"#
    )
}

/// A client that dials the Service by its name (the pod's resolver asks
/// for every connection; node-a's ztunnel answers, `real_cluster/dns.rs`):
/// every connection it made reached an echo pod through ztunnel under its
/// identity.
fn a_service_name_resolved_for_every_connection_goes_through_ztunnel(
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
