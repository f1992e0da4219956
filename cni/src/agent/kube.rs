//! The agent's view of the Kubernetes API (KUBERNETES.md A5): a watch of
//! the Pods on this node (field selector `spec.nodeName=<node>`) and of
//! every Namespace, each into a reflector store, with look-ups and a short
//! wait for a pod the watch has not seen yet; and the writes of the
//! redirection annotation (`redirection.rs`).
//!
//! Whether a pod is enrolled is `enablement.rs`'s; what an add does with
//! the pod is `source.rs`'s.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::Api;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use ztunnel_certs::error_chain::ErrorChain;
use ztunnel_mesh::kube::source::watch_into_store;

use super::stopped;

pub use redirection::{REDIRECTION_ANNOTATION, Redirection};

mod redirection;

/// The agent's watches and its client.
pub struct PodWatch {
    /// For the direct reads and the annotation writes.
    client: kube::Client,
    /// The pods on this node.
    pods: Store<Pod>,
    /// Every namespace, for its labels.
    namespaces: Store<Namespace>,
    /// Bumped on every watch event, so a waiter re-checks the stores
    /// without polling.
    changed: watch::Sender<()>,
    /// True once both watches have listed once.
    ready: watch::Sender<bool>,
}

impl PodWatch {
    /// Starts both watches through `client`; they run until `shutdown`
    /// turns true. Must be called inside a Tokio runtime.
    pub fn start(
        client: kube::Client,
        node_name: &str,
        shutdown: watch::Receiver<bool>,
    ) -> Arc<PodWatch> {
        let changed = watch::Sender::new(());
        let on_this_node = watcher::Config::default().fields(&format!("spec.nodeName={node_name}"));
        let pods = watch_kind::<Pod>(
            Api::all(client.clone()),
            on_this_node,
            "Pod",
            &changed,
            shutdown.clone(),
        );
        let namespaces = watch_kind::<Namespace>(
            Api::all(client.clone()),
            watcher::Config::default(),
            "Namespace",
            &changed,
            shutdown.clone(),
        );
        let ready = watch::Sender::new(false);
        let watch = Arc::new(PodWatch {
            client,
            pods: pods.clone(),
            namespaces: namespaces.clone(),
            changed,
            ready: ready.clone(),
        });
        let mut shutdown = shutdown;
        tokio::spawn(async move {
            tokio::select! {
                () = stopped(&mut shutdown) => {}
                // Both writers live as long as their watch tasks.
                (Ok(()), Ok(())) = async {
                    (pods.wait_until_ready().await, namespaces.wait_until_ready().await)
                } => {
                    tracing::info!("pod and namespace watches listed");
                    ready.send_replace(true);
                }
            }
        });
        watch
    }

    /// The client the watches use, for reads of other kinds (the agent's
    /// DaemonSet and node at exit, `upgrade.rs`).
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// Whether both watches have listed once.
    pub fn ready(&self) -> bool {
        *self.ready.borrow()
    }

    /// Waits until both watches have listed once; forever if they never
    /// do (the caller also waits for shutdown). Cancel safe: it only waits.
    pub async fn wait_ready(&self) {
        let mut ready = self.ready.subscribe();
        let _ = ready.wait_for(|ready| *ready).await;
    }

    /// Every pod of this node the watch holds.
    pub fn pods(&self) -> Vec<Arc<Pod>> {
        self.pods.state()
    }

    /// A receiver that is marked changed on every event of either watch.
    pub fn changes(&self) -> watch::Receiver<()> {
        self.changed.subscribe()
    }

    /// The pod `namespace/name`, if it is on this node and the watch has
    /// seen it.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<Arc<Pod>> {
        self.pods.get(&ObjectRef::new(name).within(namespace))
    }

    /// The labels of namespace `name`, if the watch has seen it.
    pub fn namespace_labels(&self, name: &str) -> Option<BTreeMap<String, String>> {
        self.namespaces
            .get(&ObjectRef::new(name))
            .map(|namespace| namespace.metadata.labels.clone().unwrap_or_default())
    }

    /// The pod `namespace/name`, waiting up to `timeout` for the watch to
    /// see it and its namespace: the plugin's event can arrive before the
    /// watch event of a pod just created. Returns the pod as soon as both
    /// are known, or at the deadline whatever the watch has (`None` when
    /// it has not seen the pod). Cancel safe: it only reads and waits.
    pub async fn wait_for_pod(
        &self,
        namespace: &str,
        name: &str,
        timeout: Duration,
    ) -> Option<Arc<Pod>> {
        // Subscribed before the first look, so an event between the look
        // and the wait still wakes the wait.
        let mut changed = self.changed.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let pod = self.pod(namespace, name);
            if pod.is_some() && self.namespace_labels(namespace).is_some() {
                return pod;
            }
            match tokio::time::timeout_at(deadline, changed.changed()).await {
                Ok(Ok(())) => {}
                // The deadline passed, or the watches have stopped.
                Ok(Err(_)) | Err(_) => return self.pod(namespace, name),
            }
        }
    }

    /// Reads `namespace/name` from the API server directly, whatever node
    /// it is on: tells a pod the API does not know (`None`) from one the
    /// watch does not show because it is elsewhere or not seen yet.
    pub async fn fetch_pod(&self, namespace: &str, name: &str) -> Result<Option<Pod>, KubeError> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        api.get_opt(name).await.map_err(|source| KubeError::Read {
            pod: format!("{namespace}/{name}"),
            source,
        })
    }

    /// Writes the redirection annotation of `namespace/name` through the
    /// `pods/status` subresource; a pod that is gone is not an error when
    /// the annotation is being removed.
    pub async fn annotate(
        &self,
        namespace: &str,
        name: &str,
        redirection: Redirection,
    ) -> Result<(), KubeError> {
        redirection::write(&self.client, namespace, name, redirection)
            .await
            .map_err(|source| KubeError::Annotate {
                pod: format!("{namespace}/{name}"),
                source,
            })
    }
}

/// Starts the watch of one kind into a store, waking `changed` on every
/// event; errors are logged and the watch resumes after backoff.
fn watch_kind<K>(
    api: Api<K>,
    config: watcher::Config,
    kind: &'static str,
    changed: &watch::Sender<()>,
    mut shutdown: watch::Receiver<bool>,
) -> Store<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let changed = changed.clone();
    let on_event = move |event: Result<(), watcher::Error>| match event {
        Ok(()) => {
            changed.send_replace(());
        }
        Err(error) => tracing::warn!(kind, error = %ErrorChain(&error), "watch failed; retrying"),
    };
    let until_stopped = async move { stopped(&mut shutdown).await };
    watch_into_store(api, config, on_event, until_stopped)
}

/// Why a read or write of the API failed.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    /// Reading a pod failed.
    #[error("reading pod {pod} from the API server")]
    Read {
        /// namespace/name.
        pod: String,
        /// The client's error.
        source: kube::Error,
    },
    /// Writing the redirection annotation failed.
    #[error("annotating pod {pod}")]
    Annotate {
        /// namespace/name.
        pod: String,
        /// The client's error.
        source: kube::Error,
    },
}
