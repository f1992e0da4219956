//! The node untaint controller (KUBERNETES.md D): a node provisioner may
//! taint new nodes `cni.istio.io/not-ready` so that no pod lands on them
//! before the node agent can capture it; once the node agent pod on a node
//! is Ready, this controller removes every taint with that key from the
//! node, whatever its effect, and leaves the other taints as they are.
//!
//! Off by default (`--taint-enabled`); it needs `patch` on nodes
//! (`deploy/rbac/control-plane-untaint.yaml`). The decisions are pure
//! ([`node_to_untaint`], [`without_taint`]); the shell watches the node
//! agent pods and the nodes, and patches the taints with the
//! `resourceVersion` it read as a precondition, so that a concurrent change
//! (or a second control plane replica doing the same) makes the patch fail
//! with a conflict and the controller read again rather than overwrite it.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod, Taint};
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use tokio::sync::Notify;
use ztunnel_certs::error_chain::ErrorChain;

use crate::kubernetes::watch_waking;

/// The taint key istiod's controller removes by default.
pub const DEFAULT_TAINT_KEY: &str = "cni.istio.io/not-ready";

/// The label of node agent pods (istio-cni's, and ours).
pub const AGENT_POD_LABEL: &str = "k8s-app=istio-cni-node";

/// The controller's name in logs.
const CONTROLLER: &str = "node untaint";

/// How many times one node's patch is tried before the next event, as
/// istiod's controller does.
const ATTEMPTS: usize = 5;

/// HTTP 409: the resource version the patch was made on is not current.
const CONFLICT: u16 = 409;

/// The pause before a retry, times the attempt number: a conflict clears
/// as soon as the node is read again; an API outage gets a little time.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// What the controller is told to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UntaintConfig {
    /// The namespace of the node agent pods.
    pub agent_namespace: String,
    /// The taint key to remove.
    pub taint_key: String,
}

/// The node a node agent pod is on, if the pod is Ready (condition
/// `Ready=True`) and not Failed: the node whose taint may go.
pub fn node_to_untaint(pod: &Pod) -> Option<&str> {
    let status = pod.status.as_ref()?;
    if status.phase.as_deref() == Some("Failed") {
        return None;
    }
    let ready = status
        .conditions
        .iter()
        .flatten()
        .any(|condition| condition.type_ == "Ready" && condition.status == "True");
    if !ready {
        return None;
    }
    pod.spec.as_ref()?.node_name.as_deref()
}

/// The node's taints without any of `key`, or `None` when it has none of
/// them (nothing to patch).
pub fn without_taint(node: &Node, key: &str) -> Option<Vec<Taint>> {
    let taints = node.spec.as_ref()?.taints.as_ref()?;
    if !taints.iter().any(|taint| taint.key == key) {
        return None;
    }
    Some(
        taints
            .iter()
            .filter(|taint| taint.key != key)
            .cloned()
            .collect(),
    )
}

/// Runs the controller until `shutdown` resolves: watches the node agent
/// pods of the configured namespace and every node, and untaints each
/// node with a Ready agent pod.
pub async fn run(
    client: kube::Client,
    config: UntaintConfig,
    shutdown: impl Future<Output = ()> + Send,
) {
    let changed = Arc::new(Notify::new());
    let pods: Api<Pod> = Api::namespaced(client.clone(), &config.agent_namespace);
    let pod_config = watcher::Config::default()
        .labels(AGENT_POD_LABEL)
        .fields("status.phase!=Failed");
    let pod_store = watch_waking(pods, pod_config, (CONTROLLER, "node agent Pod"), &changed);
    let nodes: Api<Node> = Api::all(client.clone());
    let node_store = watch_waking(
        nodes.clone(),
        watcher::Config::default(),
        (CONTROLLER, "Node"),
        &changed,
    );
    tokio::pin!(shutdown);
    tracing::info!(
        namespace = %config.agent_namespace,
        key = %config.taint_key,
        "node untaint controller started"
    );
    loop {
        tokio::select! {
            () = &mut shutdown => return,
            () = changed.notified() => {}
        }
        let ready: BTreeSet<String> = pod_store
            .state()
            .iter()
            .filter_map(|pod| node_to_untaint(pod).map(str::to_owned))
            .collect();
        for name in ready {
            untaint(&nodes, &node_store, &name, &config.taint_key).await;
        }
    }
}

/// Removes `key` from node `name`'s taints if it has it, on the version
/// it read; up to [`ATTEMPTS`] times, re-reading in between.
async fn untaint(nodes: &Api<Node>, store: &Store<Node>, name: &str, key: &str) {
    let mut current = store
        .state()
        .into_iter()
        .find(|node| node.metadata.name.as_deref() == Some(name));
    for attempt in 1..=ATTEMPTS {
        let Some(node) = current.as_deref() else {
            return;
        };
        let Some(remaining) = without_taint(node, key) else {
            return;
        };
        // A merge patch replaces the whole list; the resource version
        // makes it apply only to the node as read.
        let patch = serde_json::json!({
            "metadata": {"resourceVersion": node.metadata.resource_version},
            "spec": {"taints": remaining},
        });
        match nodes
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                tracing::info!(node = name, key, "node agent ready: node untainted");
                return;
            }
            Err(kube::Error::Api(status)) if status.code == CONFLICT => {
                // The node changed since it was read (often: this
                // controller's own earlier patch); read it again.
                tracing::debug!(
                    node = name,
                    attempt,
                    "node changed meanwhile; reading it again"
                );
                current = nodes.get(name).await.ok().map(Arc::new);
            }
            Err(error) => {
                tracing::warn!(node = name, attempt, error = %ErrorChain(&error), "untainting the node failed");
                tokio::time::sleep(RETRY_PAUSE * u32::try_from(attempt).unwrap_or(1)).await;
                current = nodes.get(name).await.ok().map(Arc::new);
            }
        }
    }
}

#[cfg(test)]
mod tests;
