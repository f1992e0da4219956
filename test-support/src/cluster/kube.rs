//! The cluster on a real Kubernetes API server (`crate::kube`): what a
//! kubelet, a scheduler and an operator would write there, done with
//! `kubectl` as the admin. The control plane reads only the API: the CRD
//! and its role are installed, it runs as a service account bound to that
//! role, each node's ztunnel pod exists there with a token from the
//! TokenRequest API bound to it, and each application pod is created
//! before its sandbox and gets its address, phase, readiness and
//! redirection annotation once the CNI chain has run.
//!
//! The node agents still take pods from the cluster's registry file (their
//! Kubernetes source is another step); the workloads, services and
//! policies the ztunnels see come from the API alone.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::cluster::PodSpec;
use crate::cluster::files::ztunnel_pod;
use crate::kube::KubeApi;

/// The AuthorizationPolicy CRD the control plane watches.
const CRD: &str = include_str!("../../../deploy/crds/authorizationpolicies.security.istio.io.yaml");

/// The control plane's ClusterRole.
const CONTROL_PLANE_ROLE: &str = include_str!("../../../deploy/rbac/control-plane.yaml");

/// The cluster id the control plane stamps into workload uids.
const CLUSTER_ID: &str = "Kubernetes";

/// The cluster's view of the API server it runs on.
pub struct ClusterApi {
    api: KubeApi,
    /// The control plane's kubeconfig (its service account's token).
    control_plane_kubeconfig: PathBuf,
}

impl ClusterApi {
    /// Installs what the control plane needs on `api`: the CRD, its role
    /// and service account, the namespaces (ambient ones labelled), the
    /// ztunnel pod of each node, and the application pods (not running
    /// yet).
    pub(super) fn prepare(
        api: KubeApi,
        nodes: &[&str],
        pods: &[PodSpec],
        ambient_namespaces: &[&str],
    ) -> anyhow::Result<ClusterApi> {
        api.kubectl(&["apply", "-f", "-"], Some(CRD))?;
        api.kubectl(&["apply", "-f", "-"], Some(CONTROL_PLANE_ROLE))?;
        let mut namespaces: Vec<&str> = vec!["istio-system"];
        namespaces.extend(pods.iter().map(|pod| pod.namespace.as_str()));
        namespaces.sort_unstable();
        namespaces.dedup();
        for namespace in namespaces {
            let ambient = ambient_namespaces
                .iter()
                .any(|ambient| *ambient == "*" || *ambient == namespace);
            apply_namespace(&api, namespace, ambient)?;
        }
        api.kubectl(
            &[
                "create",
                "serviceaccount",
                "ztunnel-control-plane",
                "-n",
                "istio-system",
            ],
            None,
        )?;
        api.kubectl(
            &[
                "create",
                "clusterrolebinding",
                "ztunnel-control-plane",
                "--clusterrole=ztunnel-control-plane",
                "--serviceaccount=istio-system:ztunnel-control-plane",
            ],
            None,
        )?;
        let token = api.kubectl(
            &[
                "create",
                "token",
                "ztunnel-control-plane",
                "-n",
                "istio-system",
                "--duration=2h",
            ],
            None,
        )?;
        let control_plane_kubeconfig = api.kubeconfig_for_token("control-plane", token.trim())?;
        let cluster = ClusterApi {
            api,
            control_plane_kubeconfig,
        };
        for node in nodes {
            cluster.create_pod(&PodSpec::new(
                &ztunnel_pod(node),
                "istio-system",
                "ztunnel",
                node,
            ))?;
            // Running, without an address of its own on the pod network:
            // the control plane checks the pod, and no peer routes to it.
            cluster.patch_status(
                "istio-system",
                &ztunnel_pod(node),
                &serde_json::json!({"status": {"phase": "Running"}}),
            )?;
        }
        for pod in pods {
            cluster.create_pod(pod)?;
        }
        Ok(cluster)
    }

    /// The API server.
    pub fn api(&self) -> &KubeApi {
        &self.api
    }

    /// The API server, to stop and start it.
    pub fn api_mut(&mut self) -> &mut KubeApi {
        &mut self.api
    }

    /// The control plane's kubeconfig.
    pub(super) fn control_plane_kubeconfig(&self) -> &Path {
        &self.control_plane_kubeconfig
    }

    /// Writes a token of the ztunnel of `node`, bound to its pod, for the
    /// CA's audience.
    pub(super) fn write_ztunnel_token(&self, node: &str, path: &Path) -> anyhow::Result<()> {
        let token = self.api.kubectl(
            &[
                "create",
                "token",
                "ztunnel",
                "-n",
                "istio-system",
                "--audience=istio-ca",
                "--bound-object-kind=Pod",
                &format!("--bound-object-name={}", ztunnel_pod(node)),
                "--duration=2h",
            ],
            None,
        )?;
        std::fs::write(path, token.trim())?;
        Ok(())
    }

    /// Creates the pod object of `spec`, bound to its node, unless it
    /// exists.
    pub(super) fn create_pod(&self, spec: &PodSpec) -> anyhow::Result<()> {
        let exists = self
            .api
            .kubectl(&["get", "pod", &spec.name, "-n", &spec.namespace], None)
            .is_ok();
        if exists {
            return Ok(());
        }
        let account = serde_json::json!({
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": spec.service_account, "namespace": spec.namespace},
        });
        self.api
            .kubectl(&["apply", "-f", "-"], Some(&account.to_string()))?;
        let pod = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": spec.name,
                "namespace": spec.namespace,
                "labels": {"app": spec.service_account},
            },
            "spec": {
                "nodeName": spec.node,
                "serviceAccountName": spec.service_account,
                "containers": [{"name": "app", "image": "registry.invalid/app:test"}],
            },
        });
        self.api
            .kubectl(&["create", "-f", "-"], Some(&pod.to_string()))
            .with_context(|| format!("creating pod {}/{}", spec.namespace, spec.name))?;
        Ok(())
    }

    /// What the kubelet (address, phase, readiness) and the node agent
    /// (the redirection annotation, for a captured pod) write once the pod
    /// runs.
    pub(super) fn publish(&self, spec: &PodSpec, ip: Ipv4Addr, hbone: bool) -> anyhow::Result<()> {
        let annotations = if hbone {
            serde_json::json!({"ambient.istio.io/redirection": "enabled"})
        } else {
            serde_json::json!({"ambient.istio.io/redirection": null})
        };
        let patch = serde_json::json!({
            "metadata": {"annotations": annotations},
            "status": {
                "phase": "Running",
                "podIP": ip.to_string(),
                "podIPs": [{"ip": ip.to_string()}],
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        });
        self.patch_status(&spec.namespace, &spec.name, &patch)
    }

    /// Takes the pod's address away (it is no workload without one).
    pub(super) fn unpublish(&self, spec: &PodSpec) -> anyhow::Result<()> {
        let patch = serde_json::json!({
            "status": {"phase": "Pending", "podIP": null, "podIPs": null, "conditions": null},
        });
        self.patch_status(&spec.namespace, &spec.name, &patch)
    }

    /// Deletes the pod object at once (no kubelet confirms a graceful
    /// deletion here).
    pub(super) fn delete(&self, spec: &PodSpec) -> anyhow::Result<()> {
        self.api.kubectl(
            &[
                "delete",
                "pod",
                &spec.name,
                "-n",
                &spec.namespace,
                "--grace-period=0",
                "--force",
            ],
            None,
        )?;
        Ok(())
    }

    /// The workload uid the control plane gives the pod (istiod's form).
    pub(super) fn workload_uid(spec: &PodSpec) -> String {
        format!("{CLUSTER_ID}//Pod/{}/{}", spec.namespace, spec.name)
    }

    fn patch_status(
        &self,
        namespace: &str,
        name: &str,
        patch: &serde_json::Value,
    ) -> anyhow::Result<()> {
        self.api
            .kubectl(
                &[
                    "patch",
                    "pod",
                    name,
                    "-n",
                    namespace,
                    "--subresource=status",
                    "--type=merge",
                    "-p",
                    &patch.to_string(),
                ],
                None,
            )
            .with_context(|| format!("writing the status of pod {namespace}/{name}"))?;
        Ok(())
    }
}

fn apply_namespace(api: &KubeApi, namespace: &str, ambient: bool) -> anyhow::Result<()> {
    let labels = if ambient {
        serde_json::json!({"istio.io/dataplane-mode": "ambient"})
    } else {
        serde_json::json!({})
    };
    let object = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": namespace, "labels": labels},
    });
    api.kubectl(&["apply", "-f", "-"], Some(&object.to_string()))
        .with_context(|| format!("applying namespace {namespace}"))?;
    Ok(())
}
