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
use ztunnel_test_support::helm::{self, Helm};
use ztunnel_test_support::real_cluster::{self, ClusterSpec, RealCluster};
use ztunnel_test_support::wait;

/// The namespace the chart is installed in, as Istio's is.
const MESH_NAMESPACE: &str = "istio-system";
/// The taint a node provisioner puts on new nodes, removed by the control
/// plane once the node's agent is Ready.
const NOT_READY_TAINT: &str = "cni.istio.io/not-ready";
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
