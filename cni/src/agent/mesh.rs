//! The pods in the mesh, and the two things that change them: a pod added
//! by the CNI plugin (look it up in the registry, install its rules, record
//! it, tell the newest ztunnel) and a pod deleted (remove its rules, forget
//! it, tell every ztunnel).
//!
//! Adds and deletes run one at a time (`operations`); the pod set and the
//! ztunnel connections share one lock (`state`) so that a connection's
//! snapshot and the events queued after it agree. Rules are `rules.rs`'s,
//! persistence `pods.rs`'s, the ZDS exchange `zds.rs`'s.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use ztunnel_certs::ca::registry::{FileRegistry, PodRegistry};

use crate::event::{CmdAdd, CmdDel};

use super::pods::{PodRecord, PodSet, PodStore, PodStoreError};
use super::rules::{self, RuleSettings, RulesError};
use super::zds::wire::Request;
use super::zds::{Connections, ZdsError, ZdsEvent};

/// How long an add waits for ztunnel's ack. Below the plugin's 5 s budget,
/// so the plugin hears the agent's answer rather than its own timeout.
const ACK_WAIT: Duration = Duration::from_secs(4);

/// The agent's pods and ztunnel connections.
pub struct Mesh {
    /// Pod facts (uid, service account, node).
    registry: FileRegistry,
    /// This node; pods the registry places elsewhere are refused.
    node_name: Option<String>,
    /// How rules are written.
    rules: RuleSettings,
    /// Where the pod set is kept.
    store: PodStore,
    /// Serializes adds and deletes, rule installation included.
    operations: tokio::sync::Mutex<()>,
    /// Pod set and connections; held briefly, never across an await.
    state: Mutex<State>,
}

/// What `Mesh::state` guards.
#[derive(Debug, Default)]
struct State {
    pods: PodSet,
    connections: Connections,
}

impl Mesh {
    /// A mesh starting from the stored pod set, minus pods whose netns no
    /// longer exists (their DEL may have been missed while the agent was
    /// down).
    pub fn new(
        registry: FileRegistry,
        node_name: Option<String>,
        rules: RuleSettings,
        store: PodStore,
        mut pods: PodSet,
    ) -> Result<Mesh, MeshError> {
        let gone = pods.prune(|pod| !pod.netns.exists());
        for pod in &gone {
            tracing::info!(pod = %format!("{}/{}", pod.namespace, pod.name), netns = %pod.netns.display(), "pruned: netns is gone");
        }
        if !gone.is_empty() {
            store.save(&pods)?;
        }
        Ok(Mesh {
            registry,
            node_name,
            rules,
            store,
            operations: tokio::sync::Mutex::new(()),
            state: Mutex::new(State {
                pods,
                connections: Connections::default(),
            }),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The pod `namespace/name`, if it is in the mesh.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<PodRecord> {
        self.state().pods.get(namespace, name).cloned()
    }

    /// Registers a ztunnel connection; returns its id, its event queue and
    /// the pods for its snapshot, taken at the same instant.
    pub fn connect(&self) -> (u64, mpsc::UnboundedReceiver<ZdsEvent>, Vec<PodRecord>) {
        let mut state = self.state();
        let (id, events) = state.connections.register();
        let pods = state.pods.iter().cloned().collect();
        (id, events, pods)
    }

    /// Forgets a ztunnel connection.
    pub fn disconnect(&self, id: u64) {
        self.state().connections.deregister(id);
    }

    /// Puts a pod in the mesh. Succeeds once its rules are in place and it
    /// is recorded, and, if a ztunnel is connected, once that ztunnel has
    /// acked the `add`. With none connected the pod waits for the next
    /// snapshot; its rules already send its traffic to ports nobody
    /// listens on, so it fails closed meanwhile.
    pub async fn add(&self, event: CmdAdd) -> Result<(), MeshError> {
        let record = self.resolve(&event)?;
        let label = format!("{}/{}", record.namespace, record.name);
        let reply = {
            let _operation = self.operations.lock().await;
            let (netns, ips, settings) =
                (record.netns.clone(), record.ips.clone(), self.rules.clone());
            install_blocking(netns, ips, settings).await?;
            let mut state = self.state();
            let replaced = state.pods.insert(record.clone());
            self.store.save(&state.pods)?;
            if let Some(old) = replaced.filter(|old| old.uid != record.uid) {
                state
                    .connections
                    .send_to_all(&Request::Del { uid: old.uid });
            }
            let (reply, answer) = oneshot::channel();
            let event = ZdsEvent {
                request: Request::add(&record),
                reply: Some(reply),
            };
            state.connections.send_to_newest(event).then_some(answer)
        };
        tracing::info!(pod = %label, uid = %record.uid, "pod added to the mesh");
        let Some(answer) = reply else {
            tracing::info!(pod = %label, "no ztunnel connected; the pod is in the next snapshot");
            return Ok(());
        };
        match tokio::time::timeout(ACK_WAIT, answer).await {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(ZdsError::ConnectionLost(error))))
            | Ok(Ok(Err(ZdsError::NetnsGone(error)))) => {
                tracing::warn!(pod = %label, %error, "ztunnel did not get the pod; it is in the next snapshot");
                Ok(())
            }
            Ok(Ok(Err(error))) => Err(MeshError::Ztunnel(error)),
            // The connection task ended without answering: as above.
            Ok(Err(_)) => Ok(()),
            Err(_) => Err(MeshError::AckTimeout),
        }
    }

    /// Takes a pod out of the mesh: its rules (when its netns still
    /// exists), its record (when the uid matches), and ztunnel's proxy.
    /// Unknown pods are fine: DEL is repeated by runtimes.
    pub async fn del(&self, event: CmdDel) -> Result<(), MeshError> {
        let _operation = self.operations.lock().await;
        if !event.netns.is_empty() && Path::new(&event.netns).exists() {
            let netns = PathBuf::from(&event.netns);
            tokio::task::spawn_blocking(move || rules::remove(&netns))
                .await
                .map_err(|_| MeshError::TaskFailed)??;
        }
        let mut state = self.state();
        if let Some(pod) = state
            .pods
            .remove(&event.pod_namespace, &event.pod_name, &event.pod_uid)
        {
            self.store.save(&state.pods)?;
            state.connections.send_to_all(&Request::Del {
                uid: pod.uid.clone(),
            });
            tracing::info!(pod = %format!("{}/{}", pod.namespace, pod.name), uid = %pod.uid, "pod removed from the mesh");
        }
        Ok(())
    }

    /// The record of a pod to add: checks the event and looks the pod up.
    fn resolve(&self, event: &CmdAdd) -> Result<PodRecord, MeshError> {
        if event.netns.is_empty() || event.pod_name.is_empty() || event.pod_namespace.is_empty() {
            return Err(MeshError::Incomplete);
        }
        if let Err(error) = self.registry.reload() {
            tracing::warn!(%error, "pod registry not reloaded; using the last good one");
        }
        let snapshot = self.registry.snapshot();
        let pod = snapshot
            .pod(&event.pod_namespace, &event.pod_name)
            .ok_or_else(|| {
                MeshError::NotInRegistry(format!("{}/{}", event.pod_namespace, event.pod_name))
            })?;
        if !event.pod_uid.is_empty() && event.pod_uid != pod.uid {
            return Err(MeshError::UidMismatch {
                pod: format!("{}/{}", pod.namespace, pod.name),
                runtime: event.pod_uid.clone(),
                registry: pod.uid.clone(),
            });
        }
        if let (Some(ours), Some(theirs)) = (&self.node_name, &pod.node_name)
            && ours != theirs
        {
            return Err(MeshError::WrongNode {
                pod: format!("{}/{}", pod.namespace, pod.name),
                node: theirs.clone(),
            });
        }
        Ok(PodRecord {
            uid: pod.uid.clone(),
            name: pod.name.clone(),
            namespace: pod.namespace.clone(),
            service_account: pod.service_account.clone(),
            netns: PathBuf::from(&event.netns),
            ips: event.ips.iter().map(|ip| ip.address.ip).collect(),
        })
    }
}

/// Installs rules on a blocking thread (the netns switch happens on a
/// thread of its own inside).
async fn install_blocking(
    netns: PathBuf,
    ips: Vec<IpAddr>,
    settings: RuleSettings,
) -> Result<(), MeshError> {
    tokio::task::spawn_blocking(move || rules::install(&netns, &ips, &settings))
        .await
        .map_err(|_| MeshError::TaskFailed)??;
    Ok(())
}

/// Why a pod could not be added or deleted. Every variant is a 500 on the
/// plugin-event socket, with this text as the body.
#[derive(Debug, thiserror::Error)]
pub enum MeshError {
    /// The event lacks the netns, name or namespace.
    #[error("the event needs Netns, PodName and PodNamespace")]
    Incomplete,
    /// The registry does not know the pod.
    #[error("pod {0} is not in the pod registry")]
    NotInRegistry(String),
    /// The runtime's pod UID is not the registry's.
    #[error("pod {pod}: the runtime says uid {runtime}, the registry says {registry}")]
    UidMismatch {
        /// namespace/name.
        pod: String,
        /// From `K8S_POD_UID`.
        runtime: String,
        /// From the registry.
        registry: String,
    },
    /// The registry places the pod on another node.
    #[error("pod {pod} is on node {node}, not this one")]
    WrongNode {
        /// namespace/name.
        pod: String,
        /// The registry's node.
        node: String,
    },
    /// Installing or removing rules failed.
    #[error(transparent)]
    Rules(#[from] RulesError),
    /// The pod set could not be saved.
    #[error(transparent)]
    Store(#[from] PodStoreError),
    /// ztunnel refused the pod.
    #[error(transparent)]
    Ztunnel(ZdsError),
    /// ztunnel did not answer in time.
    #[error("ztunnel did not ack the pod within {ACK_WAIT:?}")]
    AckTimeout,
    /// The blocking task that changes rules died.
    #[error("the rule task failed")]
    TaskFailed,
}
