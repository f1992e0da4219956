//! The cluster on a real Kubernetes API server (`crate::kube`): what a
//! kubelet, a scheduler and an operator would write there, done with
//! `kubectl` as the admin. The control plane and the node agents read only
//! the API: the CRDs and both roles are installed, each component runs as a
//! service account bound to its role, each node's ztunnel pod exists there
//! with a token from the TokenRequest API bound to it, and each
//! application pod is created before its sandbox and gets its address,
//! phase and readiness once the CNI chain has run. The redirection
//! annotation is the node agent's to write.
//!
//! Tests change namespace and pod labels and read the annotation through
//! the [`Cluster`] methods at the end of this file.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

use crate::cluster::files::ztunnel_pod;
use crate::cluster::{Cluster, PodSpec};
use crate::kube::KubeApi;

/// The AuthorizationPolicy CRD the control plane watches.
const CRD: &str = include_str!("../../../deploy/crds/authorizationpolicies.security.istio.io.yaml");

/// The PeerAuthentication CRD it watches too.
const PEER_AUTHENTICATION_CRD: &str =
    include_str!("../../../deploy/crds/peerauthentications.security.istio.io.yaml");

/// The ServiceEntry and WorkloadEntry CRDs it watches too.
const SERVICE_ENTRY_CRD: &str =
    include_str!("../../../deploy/crds/serviceentries.networking.istio.io.yaml");
const WORKLOAD_ENTRY_CRD: &str =
    include_str!("../../../deploy/crds/workloadentries.networking.istio.io.yaml");

/// The control plane's ClusterRole, `ztunnel-control-plane`.
const CONTROL_PLANE_ROLE: &str = include_str!("../../../deploy/rbac/control-plane.yaml");

/// The node agent's ClusterRole, `ztunnel-node-agent`.
const NODE_AGENT_ROLE: &str = include_str!("../../../deploy/rbac/node-agent.yaml");

/// The namespace label that puts a namespace's pods in the ambient mesh.
const DATAPLANE_MODE: &str = "istio.io/dataplane-mode";

/// The annotation the node agent writes on a pod it captured.
const REDIRECTION: &str = "ambient.istio.io/redirection";

/// The cluster id the control plane stamps into workload uids.
const CLUSTER_ID: &str = "Kubernetes";

/// kubectl's output of an object's uid alone.
const UID: &str = "jsonpath={.metadata.uid}";

/// The cluster's view of the API server it runs on.
pub struct ClusterApi {
    api: KubeApi,
    /// The control plane's kubeconfig (its service account's token).
    control_plane_kubeconfig: PathBuf,
    /// The node agents' kubeconfig (their service account's token).
    node_agent_kubeconfig: PathBuf,
}

impl ClusterApi {
    /// Installs what the control plane and the node agents need on `api`:
    /// the CRDs, their roles and service accounts, the namespaces (ambient
    /// ones labelled), the ztunnel pod of each node, and the application
    /// pods (not running yet).
    pub(super) fn prepare(
        api: KubeApi,
        nodes: &[&str],
        pods: &[PodSpec],
        ambient_namespaces: &[&str],
    ) -> anyhow::Result<ClusterApi> {
        for manifest in [
            CRD,
            PEER_AUTHENTICATION_CRD,
            SERVICE_ENTRY_CRD,
            WORKLOAD_ENTRY_CRD,
            CONTROL_PLANE_ROLE,
            NODE_AGENT_ROLE,
        ] {
            api.kubectl(&["apply", "-f", "-"], Some(manifest))?;
        }
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
        let cluster = ClusterApi {
            control_plane_kubeconfig: service_account_kubeconfig(&api, "ztunnel-control-plane")?,
            node_agent_kubeconfig: service_account_kubeconfig(&api, "ztunnel-node-agent")?,
            api,
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

    /// The node agents' kubeconfig.
    pub(super) fn node_agent_kubeconfig(&self) -> &Path {
        &self.node_agent_kubeconfig
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
    /// exists; returns its uid, which the runtime passes to the CNI chain.
    pub(super) fn create_pod(&self, spec: &PodSpec) -> anyhow::Result<String> {
        let existing = self.api.kubectl(
            &[
                "get",
                "pod",
                &spec.name,
                "-n",
                &spec.namespace,
                "--ignore-not-found",
                "-o",
                UID,
            ],
            None,
        )?;
        let existing = existing.trim();
        if !existing.is_empty() {
            return Ok(existing.to_owned());
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
        let uid = self
            .api
            .kubectl(&["create", "-f", "-", "-o", UID], Some(&pod.to_string()))
            .with_context(|| format!("creating pod {}/{}", spec.namespace, spec.name))?;
        let uid = uid.trim();
        if uid.is_empty() {
            bail!(
                "the API server gave pod {}/{} no uid",
                spec.namespace,
                spec.name
            );
        }
        Ok(uid.to_owned())
    }

    /// What the kubelet writes once the pod runs: its address, phase and
    /// readiness. The redirection annotation is the node agent's.
    pub(super) fn publish(&self, spec: &PodSpec, ip: Ipv4Addr) -> anyhow::Result<()> {
        let patch = serde_json::json!({
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

/// Creates the service account `istio-system/<role>` bound to the
/// ClusterRole `<role>`, and writes a kubeconfig with a token of it.
fn service_account_kubeconfig(api: &KubeApi, role: &str) -> anyhow::Result<PathBuf> {
    api.kubectl(
        &["create", "serviceaccount", role, "-n", "istio-system"],
        None,
    )?;
    api.kubectl(
        &[
            "create",
            "clusterrolebinding",
            role,
            &format!("--clusterrole={role}"),
            &format!("--serviceaccount=istio-system:{role}"),
        ],
        None,
    )?;
    let token = api.kubectl(
        &[
            "create",
            "token",
            role,
            "-n",
            "istio-system",
            "--duration=2h",
        ],
        None,
    )?;
    api.kubeconfig_for_token(role, token.trim())
}

impl Cluster {
    /// Puts `namespace` in the ambient mesh (`istio.io/dataplane-mode=ambient`)
    /// or takes the label away, creating the namespace first if it does not
    /// exist. The node agents act on the change, as they watch namespaces.
    pub fn set_namespace_ambient(&mut self, namespace: &str, ambient: bool) -> anyhow::Result<()> {
        let api = self.kube_api()?;
        let exists = api.kubectl(
            &[
                "get",
                "namespace",
                namespace,
                "--ignore-not-found",
                "-o",
                UID,
            ],
            None,
        )?;
        if exists.trim().is_empty() {
            apply_namespace(api, namespace, false)?;
        }
        let label = if ambient {
            format!("{DATAPLANE_MODE}=ambient")
        } else {
            format!("{DATAPLANE_MODE}-")
        };
        api.kubectl(
            &["label", "namespace", namespace, &label, "--overwrite"],
            None,
        )?;
        self.ambient_namespaces.retain(|known| known != namespace);
        if ambient {
            self.ambient_namespaces.push(namespace.to_owned());
        }
        Ok(())
    }

    /// Sets the label `key` of pod `namespace/name` to `value`, or removes
    /// it with `None`.
    pub fn set_pod_label(
        &self,
        namespace: &str,
        name: &str,
        key: &str,
        value: Option<&str>,
    ) -> anyhow::Result<()> {
        let label = match value {
            Some(value) => format!("{key}={value}"),
            None => format!("{key}-"),
        };
        self.kube_api()?.kubectl(
            &["label", "pod", name, "-n", namespace, &label, "--overwrite"],
            None,
        )?;
        Ok(())
    }

    /// The `ambient.istio.io/redirection` annotation of pod
    /// `namespace/name` as the API server has it; `None` when it has none.
    pub fn pod_redirection(&self, namespace: &str, name: &str) -> anyhow::Result<Option<String>> {
        let json = self
            .kube_api()?
            .kubectl(&["get", "pod", name, "-n", namespace, "-o", "json"], None)?;
        let pod: serde_json::Value = serde_json::from_str(&json)
            .with_context(|| format!("pod {namespace}/{name} is not JSON"))?;
        Ok(pod
            .pointer("/metadata/annotations")
            .and_then(|annotations| annotations.get(REDIRECTION))
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned))
    }

    /// The API server, or an error on a cluster without one.
    fn kube_api(&self) -> anyhow::Result<&KubeApi> {
        match self.kube() {
            Some(cluster_api) => Ok(cluster_api.api()),
            None => bail!("the cluster does not run on a Kubernetes API server"),
        }
    }
}
