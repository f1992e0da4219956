//! Istio's own components drive our ztunnel: istiod (CA and xDS),
//! istio-cni (node agent and CNI plugin, talking ZDS to ztunnel) and
//! Istio's Helm charts, installed as Istio's documentation installs
//! ambient mode, with only the images pointed at ours and at the ones
//! built from the pinned istio/istio module
//! (`ztunnel_test_support::real_cluster::istio`).
//!
//! Here: the install, istioctl, and our own agent beside istiod; the
//! phases on policy (`istio/policy.rs`), on istiod going away or refusing
//! (`istio/faults.rs`), and on our ztunnel restarting under istio-cni
//! (`istio/restarts.rs`) each have a file of their own.

use ztunnel_test_support::kube::KubeApi;
use ztunnel_test_support::real_cluster::istio::IstioChart;

use super::*;

#[path = "istio/faults.rs"]
mod faults;
#[path = "istio/policy.rs"]
mod policy;
#[path = "istio/restarts.rs"]
mod restarts;

pub(super) use faults::{
    a_refused_identity_is_logged_and_other_pods_keep_working,
    our_ztunnels_ride_out_an_istiod_outage,
};
pub(super) use policy::{
    peer_authentication_strict_refuses_plaintext_and_permissive_admits_it,
    policies_from_istiod_hold_for_new_and_open_connections,
};
pub(super) use restarts::{
    a_pod_created_while_ztunnel_is_away_is_served_once_it_is_back,
    a_rollout_under_istio_cni_drops_nothing,
};

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
    no_component_was_refused(cluster);
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
    no_component_was_refused(cluster);
    let app = App::deploy(cluster);
    traffic_goes_through_ztunnel_with_the_pods_identities(cluster, &app);
    a_policy_applied_with_kubectl_denies_and_removing_it_allows_again(cluster, &app);
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

/// istiod's Deployment, and the Service the ztunnel chart dials.
const ISTIOD: &str = "istiod";

/// The namespace of the clients outside the mesh (not labelled ambient).
const OUTSIDE_NAMESPACE: &str = "outside";
