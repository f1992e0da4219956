//! The pods in the mesh, and the two things that change them: a pod added
//! by the CNI plugin (look it up in the registry, install its rules, record
//! it, tell the newest ztunnel) and a pod deleted (remove its rules, forget
//! it, tell every ztunnel).
//!
//! Adds and deletes run one at a time (`operations`); the pod set and the
//! ztunnel connections share one lock (`state`) so that a connection's
//! snapshot and the events queued after it agree. A change builds the new
//! pod set, saves it with no lock but `operations` held, then swaps it in
//! under `state`. Rules are `rules.rs`'s, persistence `pods.rs`'s, the ZDS
//! exchange `zds.rs`'s.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use ztunnel_mesh::{FileRegistry, Pod, PodRegistry};

use crate::event::{CmdAdd, CmdDel};

use super::netns::NetnsError;
use super::pods::{PodRecord, PodSet, PodStore, PodStoreError};
use super::rules::{self, RuleSettings};
use super::zds::wire::Request;
use super::zds::{Connections, ZdsError, ZdsEvent};

/// The agent's pods and ztunnel connections.
pub struct Mesh {
    /// Pod facts (uid, service account, node); shared with the blocking
    /// thread that reloads it.
    registry: Arc<FileRegistry>,
    /// This node; pods the registry places elsewhere are refused.
    node_name: Option<String>,
    /// How rules are written.
    rules: RuleSettings,
    /// Where the pod set is kept.
    store: PodStore,
    /// Serializes adds and deletes, rule installation and saving included.
    operations: tokio::sync::Mutex<()>,
    /// Pod set and connections; held briefly, never across an await or
    /// file I/O.
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
            registry: Arc::new(registry),
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
    ///
    /// `deadline` bounds the wait for ztunnel's answer, so the plugin hears
    /// the outcome before its own timeout; the rest runs to its end.
    pub async fn add(&self, event: CmdAdd, deadline: Instant) -> Result<(), MeshError> {
        let record = self.resolve(&event).await?;
        let label = format!("{}/{}", record.namespace, record.name);
        let answer = {
            let _operation = self.operations.lock().await;
            let (netns, ips, settings) =
                (record.netns.clone(), record.ips.clone(), self.rules.clone());
            install_blocking(netns, ips, settings).await?;
            let mut pods = self.state().pods.clone();
            let replaced = pods.insert(record.clone());
            let pods = self.persist(pods).await?;
            let mut state = self.state();
            state.pods = pods;
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
        let Some(answer) = answer else {
            tracing::info!(pod = %label, "no ztunnel connected; the pod is in the next snapshot");
            return Ok(());
        };
        match tokio::time::timeout_at(deadline, answer).await {
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
        let removed = self
            .forget(&event.pod_namespace, &event.pod_name, &event.pod_uid)
            .await?;
        if let Some(pod) = removed {
            tracing::info!(pod = %format!("{}/{}", pod.namespace, pod.name), uid = %pod.uid, "pod removed from the mesh");
        }
        Ok(())
    }

    /// Drops the record of a pod whose netns has vanished (its DEL was
    /// missed), found while sending a snapshot, and tells every ztunnel.
    /// A pod recorded since under the same name with another uid stays.
    pub async fn forget_gone(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
    ) -> Result<(), MeshError> {
        let _operation = self.operations.lock().await;
        if let Some(pod) = self.forget(namespace, name, uid).await? {
            tracing::info!(pod = %format!("{namespace}/{name}"), uid, netns = %pod.netns.display(), "pod removed from the mesh: netns is gone");
        }
        Ok(())
    }

    /// Removes a recorded pod (see [`PodSet::remove`]), saves the set and
    /// sends `del` to every ztunnel; returns the removed record. The
    /// caller holds `operations`.
    async fn forget(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
    ) -> Result<Option<PodRecord>, MeshError> {
        let mut pods = self.state().pods.clone();
        let Some(pod) = pods.remove(namespace, name, uid) else {
            return Ok(None);
        };
        let pods = self.persist(pods).await?;
        let mut state = self.state();
        state.pods = pods;
        state.connections.send_to_all(&Request::Del {
            uid: pod.uid.clone(),
        });
        Ok(Some(pod))
    }

    /// Saves `pods` on a blocking thread (the write ends in an fsync) and
    /// hands the set back. Callers hold `operations`, so saves never race.
    async fn persist(&self, pods: PodSet) -> Result<PodSet, MeshError> {
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || store.save(&pods).map(|()| pods))
            .await
            .map_err(|_| MeshError::TaskFailed)?
            .map_err(MeshError::Store)
    }

    /// The record of a pod to add: checks the event and looks the pod up.
    /// The registry file is re-read (on a blocking thread) only when it
    /// does not know the pod or knows it with another uid.
    async fn resolve(&self, event: &CmdAdd) -> Result<PodRecord, MeshError> {
        if event.netns.is_empty() || event.pod_name.is_empty() || event.pod_namespace.is_empty() {
            return Err(MeshError::Incomplete);
        }
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
                    tracing::warn!(%error, "pod registry not reloaded; using the last good one");
                }
                Err(_) => return Err(MeshError::TaskFailed),
            }
            snapshot = self.registry.snapshot();
        }
        let pod = snapshot
            .pod(&event.pod_namespace, &event.pod_name)
            .ok_or_else(|| {
                MeshError::NotInRegistry(format!("{}/{}", event.pod_namespace, event.pod_name))
            })?;
        if !current(pod) {
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
    Rules(#[from] NetnsError),
    /// The pod set could not be saved.
    #[error(transparent)]
    Store(#[from] PodStoreError),
    /// ztunnel refused the pod.
    #[error(transparent)]
    Ztunnel(ZdsError),
    /// ztunnel did not answer before the plugin's deadline; the pod is
    /// recorded and stays queued for ztunnel.
    #[error("ztunnel did not ack the pod before the plugin's deadline")]
    AckTimeout,
    /// A task of the operation (rules, saving, the registry reload, or
    /// the operation itself) died.
    #[error("an agent task failed")]
    TaskFailed,
}
