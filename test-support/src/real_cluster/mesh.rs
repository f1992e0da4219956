//! The mesh on a real cluster, installed as users install it: `helm
//! install` of `deploy/charts/ztunnel-mesh` with the images the cluster
//! loaded, and what "installed" means: both DaemonSets Ready on every
//! node, the control plane available, and the not-ready taint gone; and,
//! before the install, the operator's CA (`cacerts`) when a test needs
//! certificates of its own that the mesh trusts.
//! The tests and `demo/run.sh --cluster` share it.

use std::path::Path;

use serde_json::{Value, json};
use ztunnel_control_plane::ca::signing_secret::{
    CA_CERT_KEY, CA_KEY_KEY, CERT_CHAIN_KEY, PLUGGED_SECRET, ROOT_CERT_KEY,
};

use super::RealCluster;
use crate::ca::TestRoot;
use crate::helm::{self, Helm};

/// The namespace the chart is installed in, as Istio's is.
pub const MESH_NAMESPACE: &str = "istio-system";
/// The Helm release.
pub const RELEASE: &str = "mesh";
/// The taint a node provisioner puts on new nodes, removed by the control
/// plane once the node's agent is Ready.
pub const NOT_READY_TAINT: &str = "cni.istio.io/not-ready";

impl RealCluster {
    /// `helm install` of the chart into [`MESH_NAMESPACE`], with the
    /// cluster's image tag, no pulls, the node untaint controller on and
    /// the control plane tolerating the not-ready taint (every node starts
    /// with it: the control plane must run for any taint to go), then
    /// `values` (`key=value`, as `--set` takes them). helm's first line.
    pub fn helm_install(&self, helm: &Helm, values: &[String]) -> anyhow::Result<String> {
        let mut sets = vec![
            format!("tag={}", self.images().tag),
            "imagePullPolicy=Never".to_owned(),
            "taint.enabled=true".to_owned(),
            format!("controlPlane.tolerations[0].key={NOT_READY_TAINT}"),
            "controlPlane.tolerations[0].operator=Exists".to_owned(),
        ];
        sets.extend_from_slice(values);
        self.helm(helm, "install", &["--create-namespace"], &sets)
    }

    /// Creates [`MESH_NAMESPACE`] and in it the Secret `cacerts` with
    /// `root` as signer, root and chain, as an operator plugs a CA in
    /// before installing Istio. The control plane reads `cacerts` first, so
    /// every replica and rollout signs with `root`, and a certificate the
    /// test issues from it ([`TestRoot::issue_pem`]) is one the mesh trusts.
    pub fn plug_in_ca(&self, root: &TestRoot) -> anyhow::Result<()> {
        let namespace = json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": MESH_NAMESPACE},
        });
        let secret = json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": PLUGGED_SECRET, "namespace": MESH_NAMESPACE},
            "stringData": {
                (CA_CERT_KEY): root.cert_pem(),
                (CA_KEY_KEY): root.key_pem(),
                (ROOT_CERT_KEY): root.cert_pem(),
                (CERT_CHAIN_KEY): root.cert_pem(),
            },
        });
        // JSON is YAML: the PEM texts need no quoting of our own.
        for object in [namespace, secret] {
            self.api()?.apply_server_side(&object.to_string())?;
        }
        Ok(())
    }

    /// `helm upgrade --reuse-values` of the release with `values`.
    pub fn helm_upgrade(&self, helm: &Helm, values: &[String]) -> anyhow::Result<String> {
        self.helm(helm, "upgrade", &["--reuse-values"], values)
    }

    fn helm(
        &self,
        helm: &Helm,
        verb: &str,
        flags: &[&str],
        values: &[String],
    ) -> anyhow::Result<String> {
        self.helm_release(helm, verb, RELEASE, &helm::chart_dir(), flags, values)
    }

    /// `helm <verb> <release> <chart>` into [`MESH_NAMESPACE`] with
    /// `flags` and each of `values` as a `--set`; helm's first line.
    pub(super) fn helm_release(
        &self,
        helm: &Helm,
        verb: &str,
        release: &str,
        chart: &Path,
        flags: &[&str],
        values: &[String],
    ) -> anyhow::Result<String> {
        let kubeconfig = self.api()?.admin_kubeconfig().display().to_string();
        let chart = chart.display().to_string();
        let mut args = vec![
            verb,
            release,
            &chart,
            "--kubeconfig",
            &kubeconfig,
            "--namespace",
            MESH_NAMESPACE,
        ];
        args.extend_from_slice(flags);
        for value in values {
            args.extend(["--set", value]);
        }
        let output = helm.run(&args)?;
        Ok(output.lines().next().unwrap_or_default().to_owned())
    }

    /// What is not yet as the install should leave it; empty once both
    /// DaemonSets are Ready on every node, the control plane is available
    /// and no node carries the not-ready taint.
    pub fn mesh_problems(&self) -> anyhow::Result<Vec<String>> {
        let mut problems = self.daemonset_problems(&["ztunnel", "istio-cni-node"])?;
        let deployment =
            self.get_json(&["get", "deployment", "-n", MESH_NAMESPACE, "ztunnel-ca"])?;
        if !has_condition(&deployment, "Available") {
            problems.push("deployment ztunnel-ca not available".to_owned());
        }
        let list = self.get_json(&["get", "nodes"])?;
        for node in list["items"].as_array().into_iter().flatten() {
            let tainted = node["spec"]["taints"]
                .as_array()
                .is_some_and(|taints| taints.iter().any(|t| t["key"] == NOT_READY_TAINT));
            if tainted {
                problems.push(format!("node {} still tainted", node["metadata"]["name"]));
            }
        }
        Ok(problems)
    }

    /// The DaemonSets of [`MESH_NAMESPACE`] among `names` that are not
    /// Ready on every node, each with its count.
    pub fn daemonset_problems(&self, names: &[&str]) -> anyhow::Result<Vec<String>> {
        let mut problems = vec![];
        let nodes = self.nodes.len() as u64;
        for daemonset in names {
            let object = self.get_json(&["get", "daemonset", "-n", MESH_NAMESPACE, daemonset])?;
            let status = &object["status"];
            let desired = status["desiredNumberScheduled"].as_u64().unwrap_or(0);
            let ready = status["numberReady"].as_u64().unwrap_or(0);
            if desired != nodes || ready != desired {
                problems.push(format!("daemonset {daemonset}: {ready} of {desired} ready"));
            }
        }
        Ok(problems)
    }

    /// Every container of the mesh's pods, as (pod, container).
    pub fn mesh_containers(&self) -> anyhow::Result<Vec<(String, String)>> {
        let pods = self.get_json(&["get", "pods", "-n", MESH_NAMESPACE])?;
        let mut out = vec![];
        for pod in pods["items"].as_array().into_iter().flatten() {
            let name = pod["metadata"]["name"].as_str().unwrap_or_default();
            for container in pod["spec"]["containers"].as_array().into_iter().flatten() {
                let container = container["name"].as_str().unwrap_or_default();
                out.push((name.to_owned(), container.to_owned()));
            }
        }
        Ok(out)
    }

    /// `kubectl <args> -o json`, parsed.
    pub fn get_json(&self, args: &[&str]) -> anyhow::Result<Value> {
        let mut args = args.to_vec();
        args.extend(["-o", "json"]);
        Ok(serde_json::from_str(&self.kubectl(&args)?)?)
    }
}

/// Whether an object's status has the condition `kind` True.
pub fn has_condition(object: &Value, kind: &str) -> bool {
    object["status"]["conditions"]
        .as_array()
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c["type"] == kind && c["status"] == "True")
        })
}
