//! Where the agent learns who the pod named by an add is: the pod registry
//! file, or the Kubernetes API (KUBERNETES.md A4). Either way the uid and
//! service account come from the source, never from the plugin's request,
//! and a pod on another node is refused. The Kubernetes source also
//! re-checks enablement and writes the redirection annotation.
//!
//! The watch and the API writes are `kube.rs`'s; the enablement decision is
//! `enablement.rs`'s; what is done with the pod is `mesh.rs`'s.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod as KubePod;
use tokio::time::Instant;
use ztunnel_certs::error_chain::ErrorChain;
use ztunnel_mesh::kube::convert::service_account;
use ztunnel_mesh::{FileRegistry, Pod, PodRegistry};

use crate::event::CmdAdd;

use super::enablement::{self, EnablementSettings, Enrollment, should_enroll};
use super::kube::{KubeError, PodWatch, Redirection};
use super::pods::PodRecord;

/// How long an add waits for the watch to show a pod it has not seen: the
/// plugin may post before the watch event arrives. Well inside the
/// plugin's 5 s, leaving time for the rules and ztunnel's ack.
const POD_WAIT: Duration = Duration::from_secs(3);

/// Where pods are looked up.
pub enum PodSource {
    /// The registry file.
    File(FileSource),
    /// The Kubernetes API.
    Kubernetes(KubeSource),
}

/// Pods from the registry file.
pub struct FileSource {
    /// Pod facts (uid, service account, node); shared with the blocking
    /// thread that reloads it.
    pub registry: Arc<FileRegistry>,
    /// This node; pods the registry places elsewhere are refused. Without
    /// it the node is not checked.
    pub node_name: Option<String>,
}

/// Pods from the Kubernetes API.
pub struct KubeSource {
    /// The pods of this node and every namespace.
    pub watch: Arc<PodWatch>,
    /// This node; the watch only holds its pods, and a pod read directly
    /// from elsewhere is refused.
    pub node_name: String,
    /// Which pods belong in the mesh.
    pub enablement: EnablementSettings,
}

impl PodSource {
    /// The record of the pod an add names: checks the event, finds the pod
    /// and checks it may join the mesh here.
    pub async fn resolve(&self, event: &CmdAdd) -> Result<PodRecord, ResolveError> {
        if event.netns.is_empty() || event.pod_name.is_empty() || event.pod_namespace.is_empty() {
            return Err(ResolveError::Incomplete);
        }
        match self {
            PodSource::File(source) => source.resolve(event).await,
            PodSource::Kubernetes(source) => source.resolve(event).await,
        }
    }

    /// Writes the pod's redirection annotation, when the source is the
    /// API. Waits for the write until `deadline` only: the write goes on
    /// in the background after it, so the plugin's answer is never late
    /// and a write is never cut off halfway. A failure is logged, not
    /// returned: the pod's redirection stands whatever the annotation
    /// says.
    pub async fn annotate(
        &self,
        namespace: &str,
        name: &str,
        redirection: Redirection,
        deadline: Instant,
    ) {
        let PodSource::Kubernetes(source) = self else {
            return;
        };
        let watch = Arc::clone(&source.watch);
        let pod = format!("{namespace}/{name}");
        let (namespace, name) = (namespace.to_owned(), name.to_owned());
        let write = tokio::spawn(async move {
            match watch.annotate(&namespace, &name, redirection).await {
                Ok(()) => {
                    tracing::debug!(?redirection, pod = %format!("{namespace}/{name}"), "redirection annotation written")
                }
                Err(error) => {
                    tracing::warn!(error = %ErrorChain(&error), ?redirection, "redirection annotation not written")
                }
            }
        });
        if tokio::time::timeout_at(deadline, write).await.is_err() {
            tracing::info!(%pod, ?redirection, "redirection annotation still being written; answering meanwhile");
        }
    }
}

impl FileSource {
    /// Looks the pod up; the file is re-read (on a blocking thread) only
    /// when it does not know the pod or knows it with another uid.
    async fn resolve(&self, event: &CmdAdd) -> Result<PodRecord, ResolveError> {
        let current = |pod: &Pod| event.pod_uid.is_empty() || event.pod_uid == pod.uid;
        let mut snapshot = self.registry.snapshot();
        if !snapshot
            .pod(&event.pod_namespace, &event.pod_name)
            .is_some_and(current)
        {
            let registry = Arc::clone(&self.registry);
            match tokio::task::spawn_blocking(move || registry.reload()).await {
                Ok(Ok(_)) => {}
                Ok(Err(error)) => {
                    tracing::warn!(error = %ErrorChain(&error), "pod registry not reloaded; using the last good one");
                }
                Err(_) => return Err(ResolveError::ReloadFailed),
            }
            snapshot = self.registry.snapshot();
        }
        let pod = snapshot
            .pod(&event.pod_namespace, &event.pod_name)
            .ok_or_else(|| ResolveError::NotInRegistry(qualified(event)))?;
        if !current(pod) {
            return Err(ResolveError::UidMismatch {
                pod: qualified(event),
                runtime: event.pod_uid.clone(),
                known: pod.uid.clone(),
            });
        }
        if let (Some(ours), Some(theirs)) = (&self.node_name, &pod.node_name)
            && ours != theirs
        {
            return Err(ResolveError::WrongNode {
                pod: qualified(event),
                node: theirs.clone(),
            });
        }
        Ok(record(event, &pod.uid, &pod.service_account))
    }
}

impl KubeSource {
    /// Finds the pod in the watch, waiting briefly for it; when the watch
    /// does not show it, reads it directly to tell a pod the API does not
    /// know from one on another node (or one the watch has not caught up
    /// with, which is then used).
    async fn resolve(&self, event: &CmdAdd) -> Result<PodRecord, ResolveError> {
        let (namespace, name) = (&event.pod_namespace, &event.pod_name);
        let pod = match self.watch.wait_for_pod(namespace, name, POD_WAIT).await {
            Some(pod) => pod,
            None => match self.watch.fetch_pod(namespace, name).await? {
                Some(pod) => Arc::new(pod),
                None => return Err(ResolveError::NotKnownToApi(qualified(event))),
            },
        };
        // A namespace the watch has not seen yet counts as unlabelled: the
        // pod may then be refused, and the kubelet retries the sandbox.
        let namespace_labels = self.watch.namespace_labels(namespace).unwrap_or_default();
        admit(
            &pod,
            event,
            &self.node_name,
            &namespace_labels,
            &self.enablement,
        )
    }
}

/// Decides whether the API's `pod` may join the mesh on `node_name` for
/// `event`, and builds its record from the Pod object.
pub fn admit(
    pod: &KubePod,
    event: &CmdAdd,
    node_name: &str,
    namespace_labels: &BTreeMap<String, String>,
    enablement: &EnablementSettings,
) -> Result<PodRecord, ResolveError> {
    let uid = pod
        .metadata
        .uid
        .as_deref()
        .filter(|uid| !uid.is_empty())
        .ok_or_else(|| ResolveError::WithoutUid(qualified(event)))?;
    if !event.pod_uid.is_empty() && event.pod_uid != uid {
        return Err(ResolveError::UidMismatch {
            pod: qualified(event),
            runtime: event.pod_uid.clone(),
            known: uid.to_owned(),
        });
    }
    let spec = pod.spec.as_ref();
    let pod_node = spec.and_then(|spec| spec.node_name.as_deref());
    if pod_node != Some(node_name) {
        return Err(ResolveError::WrongNode {
            pod: qualified(event),
            node: pod_node.unwrap_or("none (not scheduled)").to_owned(),
        });
    }
    let enrollment = should_enroll(pod, namespace_labels, enablement);
    if !enrollment.is_enrolled() {
        return Err(ResolveError::NotEnrolled {
            pod: qualified(event),
            reason: enrollment,
        });
    }
    let mut record = record(event, uid, service_account(pod));
    record.dns_capture = enablement::dns_capture(pod);
    Ok(record)
}

/// The record of an added pod: identity from the source, netns and
/// addresses from the event.
fn record(event: &CmdAdd, uid: &str, service_account: &str) -> PodRecord {
    PodRecord {
        uid: uid.to_owned(),
        name: event.pod_name.clone(),
        namespace: event.pod_namespace.clone(),
        service_account: service_account.to_owned(),
        netns: PathBuf::from(&event.netns),
        // Read when the rules go in, on the blocking thread that enters
        // the netns.
        netns_inode: None,
        ips: event.ips.iter().map(|ip| ip.address.ip).collect(),
        dns_capture: None,
    }
}

/// `namespace/name` of the event's pod, for messages.
fn qualified(event: &CmdAdd) -> String {
    format!("{}/{}", event.pod_namespace, event.pod_name)
}

/// Why the pod of an add was not accepted. Each is the body of the 500 the
/// plugin receives.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// The event lacks the netns, name or namespace.
    #[error("the event needs Netns, PodName and PodNamespace")]
    Incomplete,
    /// The registry file does not know the pod.
    #[error("pod {0} is not in the pod registry")]
    NotInRegistry(String),
    /// The API server does not know the pod.
    #[error("pod {0} is not known to the API server")]
    NotKnownToApi(String),
    /// The API's Pod has no uid.
    #[error("pod {0} has no uid in the API server")]
    WithoutUid(String),
    /// The runtime's pod UID is not the source's.
    #[error("pod {pod}: the runtime says uid {runtime}, the pod source says {known}")]
    UidMismatch {
        /// namespace/name.
        pod: String,
        /// From `K8S_POD_UID`.
        runtime: String,
        /// From the registry or the API.
        known: String,
    },
    /// The source places the pod on another node.
    #[error("pod {pod} is on node {node}, not this one")]
    WrongNode {
        /// namespace/name.
        pod: String,
        /// The source's node.
        node: String,
    },
    /// The pod does not belong in the ambient mesh.
    #[error("pod {pod} is not enrolled in ambient: {reason}")]
    NotEnrolled {
        /// namespace/name.
        pod: String,
        /// Why not.
        reason: Enrollment,
    },
    /// The registry reload task died.
    #[error("the pod registry reload failed")]
    ReloadFailed,
    /// The API server could not be asked.
    #[error(transparent)]
    Api(#[from] KubeError),
}

#[cfg(test)]
mod tests;
