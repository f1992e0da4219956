//! Istio's own components drive our ztunnel: istiod (CA and xDS),
//! istio-cni (node agent and CNI plugin, talking ZDS to ztunnel) and
//! Istio's Helm charts, installed as Istio's documentation installs
//! ambient mode, with only the images pointed at ours and at the ones
//! built from the pinned istio/istio module
//! (`ztunnel_test_support::real_cluster::istio`).

use ztunnel_test_support::kube::KubeApi;
use ztunnel_test_support::real_cluster::istio::IstioChart;

use super::*;

/// `helm install` of Istio's four charts in the documented order, each
/// with no value beyond where its images are (and the ambient profile
/// where the documentation sets it): istiod available, the istio-cni and
/// ztunnel DaemonSets Ready on both nodes, and no component refused by the
/// API server's authorization.
pub(super) fn install(cluster: &RealCluster, helm: &Helm) {
    let started = Instant::now();
    for chart in IstioChart::ALL {
        let first_line = cluster.istio_install(helm, chart, &[]).unwrap();
        println!("helm install {}: {first_line}", chart.release());
    }
    let ready = wait::until(INSTALL_READY_WITHIN, || {
        cluster
            .istio_problems()
            .is_ok_and(|problems| problems.is_empty())
    });
    let problems = cluster.istio_problems();
    assert!(
        ready,
        "Istio's install was not Ready in {INSTALL_READY_WITHIN:?}: {problems:?}\n{}",
        pods_summary(cluster)
    );
    println!(
        "figure: helm install of Istio's base, istiod, istio-cni and ztunnel (ours) to all Ready: {:.1} s",
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

/// The drain deadline Istio's ztunnel chart's grace period (its default,
/// 30 s) gives our ztunnel: 25 s. The chart's comment says one second
/// less than the grace period; istio/ztunnel's code takes five off a
/// period over 10 s (AMBIENT.md), and ours does what the code does: the
/// first run of this test, expecting 29 s, saw every long-lived
/// connection closed at 25 s.
const ISTIO_ZTUNNEL_DRAIN_S: u64 = 25;
/// The node label Istio's ztunnel DaemonSet is pinned to from its rollout
/// on (`nodeSelector`), so that taking it off a node stops that node's
/// ztunnel, as a restart does, for as long as the test needs.
const SERVE_LABEL: &str = "ztunnel-test-serve";

/// An L4 DENY policy on the client's principal, then an ALLOW-only one
/// that names another service account, applied with kubectl: istiod
/// pushes each to our ztunnels, which refuse new connections and close
/// the open ones (a soak's long-lived connections) as the policy arrives;
/// once deleted, both are served again. A policy istiod's validation
/// refuses is refused by the API server through istiod's webhook.
pub(super) fn policies_from_istiod_hold_for_new_and_open_connections(
    cluster: &RealCluster,
    app: &App,
) {
    let (_, target) = app.echo_on("node-b");
    let api = cluster.api().unwrap();
    create_service_account(cluster, ALLOWED_SA);
    let invalid = format!(
        r#"apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {{name: invalid, namespace: {APP_NAMESPACE}}}
spec:
  action: DENY
  rules:
    - from: [{{source: {{principals: [""]}}}}]
"#
    );
    let refused = api.kubectl(&["apply", "-f", "-"], Some(&invalid));
    let message = format!("{refused:?}");
    assert!(
        refused.is_err() && message.contains("admission webhook"),
        "istiod's validating webhook did not refuse an empty principal: {message}"
    );
    println!(
        "istiod's webhook, called by the API server: {}",
        first_line(&message)
    );

    let held = HeldOpen::start(cluster, "held-open", "node-a", target);
    let client = Source::client("node-a");
    for (name, action, named) in [
        ("deny-client", "DENY", "client"),
        ("allow-other", "ALLOW", ALLOWED_SA),
    ] {
        apply(cluster, &echo_policy(name, action, named));
        let (took, _) = until_clients(cluster, client, target, false)
            .unwrap_or_else(|last| panic!("{name}: the client was not refused: {last}"));
        println!(
            "figure: {name} applied to every new connection refused: {:.1} s",
            took.as_secs_f64()
        );
        let closed = held.wait_closed(cluster);
        println!(
            "figure: {name} applied to the {} open connections closed: {:.1} s",
            HeldOpen::CONNECTIONS,
            closed.as_secs_f64()
        );
        if action == "ALLOW" {
            let allowed = Source {
                service_account: ALLOWED_SA,
                ..client
            };
            until_clients(cluster, allowed, target, true).unwrap_or_else(|last| {
                panic!("{name}: the service account it names was not served: {last}")
            });
        }
        delete_policy(cluster, name);
        let started = Instant::now();
        until_clients(cluster, client, target, true)
            .unwrap_or_else(|last| panic!("{name} deleted: the client was still refused: {last}"));
        held.wait_open(cluster);
        println!(
            "figure: {name} deleted to new and reopened connections served: {:.1} s",
            started.elapsed().as_secs_f64()
        );
    }
    held.stop(cluster);
}

/// The service account the ALLOW-only policy names.
const ALLOWED_SA: &str = "allowed";

/// The first line of a text.
fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or_default()
}

/// A soak pod holding long-lived connections open (and reopening them
/// when closed), with no new short ones unless asked.
struct HeldOpen {
    name: &'static str,
}

impl HeldOpen {
    const CONNECTIONS: u32 = 2;

    /// Starts it on `node` towards `target` and waits until its
    /// connections are open.
    fn start(cluster: &RealCluster, name: &'static str, node: &str, target: &str) -> HeldOpen {
        Self::start_with_rate(cluster, name, node, target, 0)
    }

    /// As [`HeldOpen::start`], opening `rate` new short connections a
    /// second besides.
    fn start_with_rate(
        cluster: &RealCluster,
        name: &'static str,
        node: &str,
        target: &str,
        rate: u32,
    ) -> HeldOpen {
        create_soak(cluster, name, node, target, Self::CONNECTIONS, rate);
        let held = HeldOpen { name };
        held.wait_open(cluster);
        held
    }

    /// Waits until every connection is open.
    fn wait_open(&self, cluster: &RealCluster) {
        let mut counts = None;
        let open = wait::until(POD_WITHIN, || {
            counts = soak_counts(cluster, self.name);
            counts
                .as_ref()
                .is_some_and(|c| c["long_lived"]["open"] == Self::CONNECTIONS)
        });
        assert!(open, "{}: connections not open: {counts:?}", self.name);
    }

    /// Waits until none of its connections is open; how long that took.
    fn wait_closed(&self, cluster: &RealCluster) -> Duration {
        let started = Instant::now();
        let mut counts = None;
        let closed = wait::until(POD_WITHIN, || {
            counts = soak_counts(cluster, self.name);
            counts
                .as_ref()
                .is_some_and(|c| c["long_lived"]["open"] == 0)
        });
        assert!(
            closed,
            "{}: open connections not closed by the policy: {counts:?}",
            self.name
        );
        started.elapsed()
    }

    fn stop(self, cluster: &RealCluster) {
        cluster
            .kubectl(&[
                "delete",
                "pod",
                "-n",
                APP_NAMESPACE,
                self.name,
                "--wait=false",
            ])
            .unwrap();
    }
}

/// The namespace of the clients outside the mesh (not labelled ambient).
const OUTSIDE_NAMESPACE: &str = "outside";

/// PeerAuthentication on the application's namespace, which istiod turns
/// into policy for ztunnel: a plaintext client outside the mesh reaches
/// the echo pod without it, is refused under STRICT, and is let in under
/// PERMISSIVE.
pub(super) fn peer_authentication_strict_refuses_plaintext_and_permissive_admits_it(
    cluster: &RealCluster,
    app: &App,
) {
    let (server, target) = app.echo_on("node-b");
    let api = cluster.api().unwrap();
    api.apply_server_side(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {OUTSIDE_NAMESPACE}}}\n"
    ))
    .unwrap();
    let plaintext = Source {
        namespace: OUTSIDE_NAMESPACE,
        service_account: "default",
        node: "node-a",
    };
    // The default service account appears shortly after the namespace.
    let (_, pod) = until_clients(cluster, plaintext, target, true)
        .unwrap_or_else(|last| panic!("a plaintext client was not served at first: {last}"));
    let plain: Vec<AccessEntry> = access_log(cluster, "node-b")
        .into_iter()
        .filter(|entry| {
            entry.direction == "inbound"
                && entry.dst_workload.as_deref() == Some(server)
                && pod
                    .ip
                    .as_deref()
                    .is_some_and(|ip| entry.src_addr.starts_with(&format!("{ip}:")))
        })
        .collect();
    assert!(
        plain.len() == 5 && plain.iter().all(|entry| entry.src_identity.is_none()),
        "the plaintext client's connections in node-b's access log: {plain:?}"
    );

    for (mode, served) in [("STRICT", false), ("PERMISSIVE", true)] {
        api.kubectl(
            &["apply", "-f", "-"],
            Some(&format!(
                r#"apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {{name: default, namespace: {APP_NAMESPACE}}}
spec: {{mtls: {{mode: {mode}}}}}
"#
            )),
        )
        .unwrap();
        let (took, _) = until_clients(cluster, plaintext, target, served).unwrap_or_else(|last| {
            panic!("PeerAuthentication {mode}: the plaintext client: {last}")
        });
        println!(
            "figure: PeerAuthentication {mode} applied to a plaintext client {}: {:.1} s",
            if served { "served" } else { "refused" },
            took.as_secs_f64()
        );
        // Meshed clients are served under either mode.
        until_clients(cluster, Source::client("node-a"), target, true)
            .unwrap_or_else(|last| panic!("PeerAuthentication {mode}: a meshed client: {last}"));
    }
    api.kubectl(
        &[
            "delete",
            "peerauthentication",
            "-n",
            APP_NAMESPACE,
            "default",
        ],
        None,
    )
    .unwrap();
}

/// `istioctl ztunnel-config` against each of our ztunnel pods, as an
/// operator runs it (istioctl reaches the admin port 15000 through the API
/// server's port-forward): `workloads`, `services`, `policies`,
/// `certificates` and `all`, as tables and as JSON, print without an
/// error and name the workloads the API holds and the identities of the
/// node's pods.
pub(super) fn istioctl_reads_our_ztunnels(cluster: &RealCluster) {
    let istioctl = KubeApi::binaries().unwrap().join("istioctl");
    let kubeconfig = cluster.api().unwrap().admin_kubeconfig().to_owned();
    let run = |args: &[&str]| -> String {
        let output = std::process::Command::new(&istioctl)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["--istioNamespace", MESH_NAMESPACE, "ztunnel-config"])
            .args(args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success(),
            "istioctl ztunnel-config {}: {}\n{stderr}",
            args.join(" "),
            output.status
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let json = |args: &[&str]| -> Value {
        let mut args = args.to_vec();
        args.extend(["-o", "json"]);
        let text = run(&args);
        serde_json::from_str(&text)
            .unwrap_or_else(|error| panic!("istioctl {args:?} -o json: {error}:\n{text}"))
    };
    let running: Vec<PodStatus> = cluster
        .pods(APP_NAMESPACE, "")
        .unwrap()
        .into_iter()
        .filter(|pod| pod.phase == "Running" && pod.ip.is_some())
        .collect();
    for node in ["node-a", "node-b"] {
        let started = Instant::now();
        let workloads = json(&["workloads", "--node", node]);
        let names: Vec<&str> = workloads
            .as_array()
            .into_iter()
            .flatten()
            .filter(|w| w["namespace"] == APP_NAMESPACE)
            .filter_map(|w| w["name"].as_str())
            .collect();
        for pod in &running {
            assert!(
                names.contains(&pod.name.as_str()),
                "istioctl workloads on {node} lacks the running pod {}: {names:?}",
                pod.name
            );
        }
        let table = run(&["workloads", "--node", node]);
        for pod in &running {
            assert!(
                table.contains(&pod.name),
                "istioctl's workloads table on {node} lacks {}:\n{table}",
                pod.name
            );
        }

        let services = json(&["services", "--node", node]);
        let echo = format!("echo.{APP_NAMESPACE}.svc.cluster.local");
        assert!(
            services
                .as_array()
                .into_iter()
                .flatten()
                .any(|s| s["hostname"] == echo.as_str()),
            "istioctl services on {node} lacks {echo}: {services}"
        );

        let policies = json(&["policies", "--node", node]);
        assert!(
            policies.is_array(),
            "istioctl policies on {node}: {policies}"
        );

        let certificates = json(&["certificates", "--node", node]);
        let identities: Vec<&str> = certificates
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| {
                c["certChain"]
                    .as_array()
                    .is_some_and(|chain| !chain.is_empty())
            })
            .filter_map(|c| c["identity"].as_str())
            .collect();
        let expected: Vec<String> = running
            .iter()
            .filter(|pod| pod.node.as_deref() == Some(node))
            .map(|pod| {
                let sa = cluster
                    .get_json(&["get", "pod", "-n", APP_NAMESPACE, &pod.name])
                    .unwrap()["spec"]["serviceAccountName"]
                    .as_str()
                    .unwrap()
                    .to_owned();
                format!("spiffe://{TRUST_DOMAIN}/ns/{APP_NAMESPACE}/sa/{sa}")
            })
            .collect();
        for identity in &expected {
            assert!(
                identities.contains(&identity.as_str()),
                "istioctl certificates on {node} lacks {identity}: {certificates}"
            );
        }

        let all = json(&["all", "--node", node]);
        for section in ["workloads", "services", "policies", "certificates"] {
            assert!(
                all.get(section).is_some(),
                "istioctl all on {node} lacks {section}: {all}"
            );
        }
        println!(
            "istioctl ztunnel-config on {node}'s ztunnel: {} workloads of {APP_NAMESPACE}, {} services, certificates for {identities:?}, {:.1} s for the five commands",
            names.len(),
            services.as_array().map_or(0, Vec::len),
            started.elapsed().as_secs_f64()
        );
    }
}

/// `helm upgrade` of Istio's ztunnel chart to our image under a second tag
/// (and pinned to nodes labelled [`SERVE_LABEL`], which both are), while
/// the soaks run under istio-cni: no new connection fails, and no
/// long-lived one breaks before the old ztunnel's drain deadline
/// ([`ISTIO_ZTUNNEL_DRAIN_S`]).
pub(super) fn a_rollout_under_istio_cni_drops_nothing(
    cluster: &RealCluster,
    helm: &Helm,
    app: &App,
) {
    for node in ["node-a", "node-b"] {
        cluster
            .kubectl(&["label", "node", node, &format!("{SERVE_LABEL}=yes")])
            .unwrap();
    }
    let soaks = Soaks::start(cluster, app);
    let rollout = Rollout {
        what: "ztunnel (Istio's chart, under istio-cni)",
        upgrade: Upgrade::Istio(
            IstioChart::Ztunnel,
            vec![
                format!("tag={}", second_tag()),
                format!("nodeSelector.{SERVE_LABEL}=yes"),
            ],
        ),
        kind: "daemonset",
        name: "ztunnel",
        selector: "app=ztunnel",
        drain_s: ISTIO_ZTUNNEL_DRAIN_S,
    };
    let dropped = rollout.run(cluster, helm, &soaks, &|| {});
    assert_eq!(
        dropped,
        Dropped::default(),
        "the ztunnel rollout under istio-cni dropped connections"
    );
    soaks.stop(cluster);
}

/// node-b's ztunnel goes away (its node loses [`SERVE_LABEL`]) and a pod
/// is created there meanwhile. istio-cni keeps it pending, as its ZDS
/// contract says: it sets up the pod's redirection, marks it
/// `ambient.istio.io/redirection: pending`, and fails the CNI ADD ("no
/// ztunnel connection"), so kubelet retries the sandbox and the pod does
/// not start unserved. Once our ztunnel is back, istio-cni hands it the
/// pod, and every one of the pod's connections reaches the server through
/// ztunnel under its identity.
pub(super) fn a_pod_created_while_ztunnel_is_away_is_served_once_it_is_back(
    cluster: &RealCluster,
    app: &App,
) {
    cluster
        .kubectl(&["label", "node", "node-b", &format!("{SERVE_LABEL}-")])
        .unwrap();
    let gone = wait::until(ROLLOUT_WITHIN, || {
        cluster
            .pods(MESH_NAMESPACE, "app=ztunnel")
            .is_ok_and(|pods| pods.iter().all(|pod| pod.node.as_deref() != Some("node-b")))
    });
    assert!(
        gone,
        "node-b's ztunnel did not go:\n{}",
        pods_summary(cluster)
    );
    let away = Instant::now();

    let (server, target) = app.echo_on("node-a");
    let name = "while-ztunnel-away";
    create_client(cluster, name, "node-b", &connect_args(target, 20));
    let mut status = PodStatus::default();
    let held = wait::until(POD_WITHIN, || {
        status = client_status(cluster, name);
        let refused = enrollment::sandbox_refused(cluster, name);
        refused && status.annotations["ambient.istio.io/redirection"] == "pending"
    });
    assert!(
        held && status.phase == "Pending",
        "{name} was not held pending by istio-cni while node-b had no ztunnel: {status:?}"
    );
    println!(
        "{name}: held Pending by istio-cni while node-b has no ztunnel (sandbox refused, annotation pending)"
    );

    cluster
        .kubectl(&["label", "node", "node-b", &format!("{SERVE_LABEL}=yes")])
        .unwrap();
    let back = wait::until(ROLLOUT_WITHIN, || {
        cluster
            .pods(MESH_NAMESPACE, "app=ztunnel")
            .is_ok_and(|pods| {
                pods.iter()
                    .any(|pod| pod.node.as_deref() == Some("node-b") && pod.ready)
            })
    });
    assert!(
        back,
        "node-b's ztunnel did not come back:\n{}",
        pods_summary(cluster)
    );
    println!(
        "figure: node-b's ztunnel gone to its new one Ready, the pod held meanwhile: {:.1} s",
        away.elapsed().as_secs_f64()
    );
    let back_at = Instant::now();
    let pod = wait_client_done(cluster, name);
    let report = cluster
        .pod_output(APP_NAMESPACE, name, "client")
        .unwrap()
        .iter()
        .rev()
        .find_map(|line| serde_json::from_str::<Value>(line).ok())
        .unwrap_or(Value::Null);
    assert_eq!(
        (
            report["connections_made"].as_u64(),
            report["errors"].as_u64()
        ),
        (Some(20), Some(0)),
        "{name}, once its ztunnel was back: {report}"
    );
    let delivered = delivered_as_client(cluster, "node-a", server, &pod);
    assert_eq!(
        delivered,
        20,
        "{name}: of 20 connections, {delivered} reached {server} through ztunnel as {}\n{}",
        client_identity(),
        traces_of(cluster, &pod)
    );
    println!(
        "figure: ztunnel back to the pod created meanwhile done: {:.1} s, 20 connections through ztunnel as {}",
        back_at.elapsed().as_secs_f64(),
        client_identity(),
    );
}

/// The client pod `name`'s status (default when it is not there).
fn client_status(cluster: &RealCluster, name: &str) -> PodStatus {
    cluster
        .pods(APP_NAMESPACE, "app=client")
        .unwrap_or_default()
        .into_iter()
        .find(|pod| pod.name == name)
        .unwrap_or_default()
}

/// A user who keeps istiod but runs our node agent and plugin: Istio's
/// istio-cni and ztunnel releases are uninstalled (the application's
/// namespaces deleted first), and our chart is installed beside istiod
/// with `controlPlane.enabled=false`, so its ztunnel dials istiod (the
/// chart's default address, `istiod.<namespace>.svc:15012`) for
/// certificates and xDS. The application is deployed again: traffic goes
/// through our ztunnels under identities istiod issued, and a policy
/// applied with kubectl, pushed by istiod, is enforced.
pub(super) fn our_agent_and_ztunnel_with_istiod(cluster: &RealCluster, helm: &Helm) {
    let started = Instant::now();
    cluster
        .kubectl(&[
            "delete",
            "namespace",
            APP_NAMESPACE,
            OUTSIDE_NAMESPACE,
            "--wait",
            "--timeout=180s",
        ])
        .unwrap();
    for chart in [IstioChart::Ztunnel, IstioChart::Cni] {
        let first_line = cluster.istio_uninstall(helm, chart).unwrap();
        println!("helm uninstall {}: {first_line}", chart.release());
    }
    let gone = wait::until(INSTALL_READY_WITHIN, || {
        cluster
            .pods(MESH_NAMESPACE, "")
            .is_ok_and(|pods| pods.iter().all(|pod| pod.name.starts_with("istiod")))
    });
    assert!(
        gone,
        "Istio's node components did not go:\n{}",
        pods_summary(cluster)
    );
    println!(
        "figure: application deleted and Istio's istio-cni and ztunnel uninstalled: {:.1} s",
        started.elapsed().as_secs_f64()
    );

    let started = Instant::now();
    let first_line = cluster
        .helm_install(
            helm,
            &[
                "controlPlane.enabled=false".to_owned(),
                "taint.enabled=false".to_owned(),
            ],
        )
        .unwrap();
    println!("helm install (ours, controlPlane.enabled=false): {first_line}");
    let ready = wait::until(INSTALL_READY_WITHIN, || {
        cluster
            .daemonset_problems(&["ztunnel", "istio-cni-node"])
            .is_ok_and(|problems| problems.is_empty())
    });
    assert!(
        ready,
        "our node agent and ztunnel were not Ready with istiod: {:?}\n{}",
        cluster.daemonset_problems(&["ztunnel", "istio-cni-node"]),
        pods_summary(cluster)
    );
    println!(
        "figure: helm install of our agent and ztunnel beside istiod to both DaemonSets Ready: {:.1} s",
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
    let app = App::deploy(cluster);
    traffic_goes_through_ztunnel_with_the_pods_identities(cluster, &app);
    a_policy_applied_with_kubectl_denies_and_removing_it_allows_again(cluster, &app);
}

/// istiod goes away (scaled to 0) and comes back as a new pod. Meanwhile
/// our running ztunnels keep serving with what they have: a soak's new and
/// long-lived connections across nodes go on without a failure, and both
/// ztunnels stay Ready, as Istio's do. A ztunnel that starts while istiod
/// is away (node-b's, deleted) is not Ready, as Istio's is not, and becomes
/// Ready once istiod is back; the running one (node-a's) reconnects: a
/// policy applied afterwards is enforced by it.
pub(super) fn our_ztunnels_ride_out_an_istiod_outage(cluster: &RealCluster, app: &App) {
    let (_, echo_b) = app.echo_on("node-b");
    let soak = HeldOpen::start_with_rate(cluster, "through-outage", "node-a", echo_b, 10);
    std::thread::sleep(Duration::from_secs(2));
    let before = soak_counts(cluster, soak.name).unwrap();

    let scale = |replicas: &str| {
        cluster
            .kubectl(&[
                "scale",
                "deployment",
                "-n",
                MESH_NAMESPACE,
                ISTIOD,
                &format!("--replicas={replicas}"),
            ])
            .unwrap();
    };
    let istiod_pods = || {
        cluster
            .pods(MESH_NAMESPACE, "app=istiod")
            .unwrap_or_default()
    };
    scale("0");
    let gone = wait::until(POD_WITHIN, || istiod_pods().is_empty());
    assert!(gone, "istiod did not go:\n{}", pods_summary(cluster));
    let outage = Instant::now();
    std::thread::sleep(Duration::from_secs(10));
    let during = soak_counts(cluster, soak.name).unwrap();
    let new_ok =
        during["new"]["ok"].as_u64().unwrap_or(0) - before["new"]["ok"].as_u64().unwrap_or(0);
    let new_failed = failures(&during["new"]["failed"]) - failures(&before["new"]["failed"]);
    let breaks = during["long_lived"]["breaks"]
        .as_array()
        .map_or(0, Vec::len)
        - before["long_lived"]["breaks"]
            .as_array()
            .map_or(0, Vec::len);
    assert!(
        new_ok > 0 && new_failed == 0 && breaks == 0,
        "with istiod away, across nodes: {new_ok} new connections served, {new_failed} failed, {breaks} long-lived broken\n{during}"
    );
    let ztunnels = cluster.pods(MESH_NAMESPACE, "app=ztunnel").unwrap();
    assert!(
        ztunnels.len() == 2 && ztunnels.iter().all(|pod| pod.ready),
        "running ztunnels turned unready with istiod away: {ztunnels:?}"
    );
    println!(
        "figure: istiod away {:.1} s: {new_ok} new connections across nodes served, 0 failed, 0 long-lived broken; both ztunnels Ready",
        outage.elapsed().as_secs_f64()
    );
    soak.stop(cluster);

    // A ztunnel starting with istiod away.
    let old_b = ztunnels
        .iter()
        .find(|pod| pod.node.as_deref() == Some("node-b"))
        .unwrap()
        .name
        .clone();
    cluster
        .kubectl(&["delete", "pod", "-n", MESH_NAMESPACE, &old_b])
        .unwrap();
    let mut new_b = PodStatus::default();
    let started = wait::until(POD_WITHIN, || {
        new_b = cluster
            .pods(MESH_NAMESPACE, "app=ztunnel")
            .unwrap_or_default()
            .into_iter()
            .find(|pod| pod.node.as_deref() == Some("node-b") && pod.name != old_b)
            .unwrap_or_default();
        new_b.phase == "Running" && new_b.ip.is_some()
    });
    assert!(started, "node-b's new ztunnel did not start: {new_b:?}");
    let node_b = cluster.node("node-b").unwrap();
    let readiness = format!("{}:15021", new_b.ip.as_deref().unwrap())
        .parse()
        .unwrap();
    std::thread::sleep(Duration::from_secs(5));
    let (status, body) = node_b
        .netns()
        .http_get_from(readiness, "/healthz/ready")
        .unwrap();
    assert_ne!(
        status, 200,
        "a ztunnel started with istiod away reports ready: {body}"
    );
    println!(
        "a ztunnel started with istiod away: /healthz/ready {status} {}",
        body.trim()
    );

    scale("1");
    let back = Instant::now();
    let available = wait::until(POD_WITHIN, || istiod_pods().iter().any(|pod| pod.ready));
    assert!(
        available,
        "istiod did not come back:\n{}",
        pods_summary(cluster)
    );
    let istiod_ready = back.elapsed();
    let ready = wait::until(POD_WITHIN, || {
        node_b
            .netns()
            .http_get_from(readiness, "/healthz/ready")
            .is_ok_and(|(status, _)| status == 200)
    });
    assert!(ready, "node-b's ztunnel was not ready once istiod was back");
    println!(
        "figure: istiod scaled back to Ready: {:.1} s; to the ztunnel started meanwhile ready: {:.1} s",
        istiod_ready.as_secs_f64(),
        back.elapsed().as_secs_f64()
    );

    // node-a's ztunnel, which ran through the outage, gets policy from the
    // new istiod: a DENY on the echo pod of node-a, enforced there.
    let (echo_a_name, echo_a) = app.echo_on("node-a");
    apply(cluster, &echo_policy("deny-after-outage", "DENY", "client"));
    let (took, _) =
        until_clients(cluster, Source::client("node-b"), echo_a, false).unwrap_or_else(|last| {
            panic!("node-a's ztunnel did not enforce a policy from the new istiod: {last}")
        });
    println!(
        "figure: policy from the new istiod enforced by the ztunnel that ran through the outage: {:.1} s",
        took.as_secs_f64()
    );
    delete_policy(cluster, "deny-after-outage");
    let (_, pod) = until_clients(cluster, Source::client("node-b"), echo_a, true)
        .unwrap_or_else(|last| panic!("after the outage, node-b to node-a: {last}"));
    let delivered = delivered_as_client(cluster, "node-a", echo_a_name, &pod);
    assert_eq!(
        delivered,
        5,
        "after the outage: {delivered} of 5 connections through ztunnel\n{}",
        traces_of(cluster, &pod)
    );
}

/// istiod's Deployment, and the Service the ztunnel chart dials.
const ISTIOD: &str = "istiod";

/// istiod's CA refuses our ztunnels' impersonation (its chart's
/// `trustedZtunnelName` set to another account, as when the two charts
/// disagree): the ztunnel on node-a logs the refusal of a new pod's
/// identity with the identity and istiod's answer, while pods whose
/// certificates it already holds go on being served; once istiod trusts
/// it again, the refused identity is issued and served.
pub(super) fn a_refused_identity_is_logged_and_other_pods_keep_working(
    cluster: &RealCluster,
    helm: &Helm,
    app: &App,
) {
    let (_, echo_b) = app.echo_on("node-b");
    let soak = HeldOpen::start_with_rate(cluster, "through-refusal", "node-a", echo_b, 5);
    create_service_account(cluster, REFUSED_SA);
    let rolled = |trusted: &str| {
        let first_line = cluster
            .istio_upgrade(
                helm,
                IstioChart::Istiod,
                &[format!("trustedZtunnelName={trusted}")],
            )
            .unwrap();
        println!("helm upgrade istiod trustedZtunnelName={trusted}: {first_line}");
        let done = wait::until(ROLLOUT_WITHIN, || {
            let Ok(deployment) =
                cluster.get_json(&["get", "deployment", "-n", MESH_NAMESPACE, ISTIOD])
            else {
                return false;
            };
            let status = &deployment["status"];
            deployment["metadata"]["generation"] == status["observedGeneration"]
                && status["replicas"] == status["updatedReplicas"]
                && status["replicas"] == status["readyReplicas"]
        });
        assert!(done, "istiod did not roll:\n{}", pods_summary(cluster));
    };
    rolled("ztunnel-elsewhere");
    let before = soak_counts(cluster, soak.name).unwrap();

    let identity = format!("spiffe://{TRUST_DOMAIN}/ns/{APP_NAMESPACE}/sa/{REFUSED_SA}");
    let (pod, report) = run_client_as(
        cluster,
        "refused-1",
        "node-a",
        REFUSED_SA,
        &as_str(&connect_args(echo_b, 5)),
    );
    assert_eq!(
        report["connections_made"].as_u64(),
        Some(0),
        "a pod whose identity istiod refuses was served: {report}"
    );
    let mut line = None;
    let logged = wait::until(POD_WITHIN, || {
        line = ztunnel_log(cluster, "node-a").into_iter().find(|line| {
            line.contains("certificate fetch failed")
                && line.contains(&identity)
                && line.contains("impersonation")
        });
        line.is_some()
    });
    assert!(
        logged,
        "node-a's ztunnel logged no refusal naming {identity} and istiod's answer:\n{}",
        traces_of(cluster, &pod)
    );
    println!("node-a's ztunnel: {}", line.unwrap_or_default());
    std::thread::sleep(Duration::from_secs(2));
    let after = soak_counts(cluster, soak.name).unwrap();
    let new_ok =
        after["new"]["ok"].as_u64().unwrap_or(0) - before["new"]["ok"].as_u64().unwrap_or(0);
    let new_failed = failures(&after["new"]["failed"]) - failures(&before["new"]["failed"]);
    let breaks = after["long_lived"]["breaks"].as_array().map_or(0, Vec::len)
        - before["long_lived"]["breaks"]
            .as_array()
            .map_or(0, Vec::len);
    assert!(
        new_ok > 0 && new_failed == 0 && breaks == 0,
        "while istiod refused node-a's ztunnel, a pod it already served: {new_ok} new connections served, {new_failed} failed, {breaks} long-lived broken\n{after}"
    );
    println!(
        "figure: istiod refusing node-a's ztunnel: {new_ok} new connections of a pod already served, 0 failed, 0 long-lived broken"
    );
    soak.stop(cluster);

    rolled("ztunnel");
    let refused = Source {
        service_account: REFUSED_SA,
        ..Source::client("node-a")
    };
    let (took, _) = until_clients(cluster, refused, echo_b, true)
        .unwrap_or_else(|last| panic!("once istiod trusted node-a's ztunnel again: {last}"));
    println!(
        "figure: istiod trusting our ztunnel again to the refused identity served: {:.1} s",
        took.as_secs_f64()
    );
}

/// The service account whose identity istiod refuses to node-a's ztunnel.
const REFUSED_SA: &str = "refused";
