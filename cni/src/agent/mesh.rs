//! The pods in the mesh, and the two things that change them: a pod added
//! by the CNI plugin (look it up in the pod source, install its rules,
//! record it, tell the newest ztunnel, annotate it) and a pod deleted
//! (remove its rules, forget it, tell every ztunnel, remove the
//! annotation).
//!
//! Adds and deletes run one at a time (`operations`); the pod set and the
//! ztunnel connections share one lock (`state`) so that a connection's
//! snapshot and the events queued after it agree. A change builds the new
//! pod set, saves it with no lock but `operations` held, then swaps it in
//! under `state`. Finding the pod is `source.rs`'s, rules are `rules.rs`'s,
//! persistence `pods.rs`'s, the ZDS exchange `zds.rs`'s.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::event::{CmdAdd, CmdDel};

use super::kube::Redirection;
use super::netns::NetnsError;
use super::pods::{PodRecord, PodSet, PodStore, PodStoreError};
use super::rules::{self, RuleSettings};
use super::source::{PodSource, ResolveError};
use super::zds::wire::Request;
use super::zds::{Connections, ZdsError, ZdsEvent};

/// How long a DEL waits for the removal of the pod's annotation before it
/// answers (the removal goes on after): DEL has no deadline of its own,
/// and a slow API server must not hold it.
const UNANNOTATE_WITHIN: Duration = Duration::from_secs(3);

/// The agent's pods and ztunnel connections.
pub struct Mesh {
    /// Who the pods are (uid, service account, node), and where their
    /// redirection is published.
    source: PodSource,
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
        source: PodSource,
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
            source,
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
    /// With the Kubernetes source the Pod is then annotated `enabled` once
    /// ztunnel acked it, `pending` when ztunnel was not told; rules that
    /// failed leave no annotation.
    ///
    /// `deadline` bounds the wait for ztunnel's answer and for the
    /// annotation, so the plugin hears the outcome before its own timeout;
    /// the rest runs to its end.
    pub async fn add(&self, event: CmdAdd, deadline: Instant) -> Result<(), MeshError> {
        let record = self.source.resolve(&event).await?;
        let label = format!("{}/{}", record.namespace, record.name);
        let answer = self.install_and_queue(&record).await?;
        tracing::info!(pod = %label, uid = %record.uid, "pod added to the mesh");
        let told = match answer {
            Some(answer) => ZtunnelOutcome::of(tokio::time::timeout_at(deadline, answer).await),
            None => ZtunnelOutcome::NoZtunnel,
        };
        match &told {
            ZtunnelOutcome::Acked => {}
            ZtunnelOutcome::NoZtunnel => {
                tracing::info!(pod = %label, "no ztunnel connected; the pod is in the next snapshot");
            }
            ZtunnelOutcome::Lost(error) => {
                tracing::warn!(pod = %label, %error, "ztunnel did not get the pod; it is in the next snapshot");
            }
            ZtunnelOutcome::Refused(error) => {
                tracing::warn!(pod = %label, %error, "ztunnel refused the pod");
            }
            ZtunnelOutcome::TimedOut => {
                tracing::warn!(pod = %label, "ztunnel did not ack the pod in time");
            }
        }
        self.source
            .annotate(
                &record.namespace,
                &record.name,
                told.redirection(),
                deadline,
            )
            .await;
        told.into_result()
    }

    /// Installs the pod's rules, records it and queues its `add` for the
    /// newest ztunnel; returns where ztunnel's answer will come, or `None`
    /// when no ztunnel is connected.
    async fn install_and_queue(
        &self,
        record: &PodRecord,
    ) -> Result<Option<oneshot::Receiver<Result<(), ZdsError>>>, MeshError> {
        let _operation = self.operations.lock().await;
        let (netns, ips, settings) = (record.netns.clone(), record.ips.clone(), self.rules.clone());
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
            request: Request::add(record),
            reply: Some(reply),
        };
        Ok(state.connections.send_to_newest(event).then_some(answer))
    }

    /// Takes a pod out of the mesh: its rules (when its netns still
    /// exists), its record (when the uid matches), and ztunnel's proxy.
    /// Unknown pods are fine: DEL is repeated by runtimes.
    pub async fn del(&self, event: CmdDel) -> Result<(), MeshError> {
        let operation = self.operations.lock().await;
        if !event.netns.is_empty() && Path::new(&event.netns).exists() {
            let netns = PathBuf::from(&event.netns);
            tokio::task::spawn_blocking(move || rules::remove(&netns))
                .await
                .map_err(|_| MeshError::TaskFailed)??;
        }
        let removed = self
            .forget(&event.pod_namespace, &event.pod_name, &event.pod_uid)
            .await?;
        drop(operation);
        if let Some(pod) = removed {
            tracing::info!(pod = %format!("{}/{}", pod.namespace, pod.name), uid = %pod.uid, "pod removed from the mesh");
            self.unannotate(&pod).await;
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
        let operation = self.operations.lock().await;
        let removed = self.forget(namespace, name, uid).await?;
        drop(operation);
        if let Some(pod) = removed {
            tracing::info!(pod = %format!("{namespace}/{name}"), uid, netns = %pod.netns.display(), "pod removed from the mesh: netns is gone");
            self.unannotate(&pod).await;
        }
        Ok(())
    }

    /// Removes the redirection annotation of a pod taken out of the mesh.
    async fn unannotate(&self, pod: &PodRecord) {
        let deadline = Instant::now() + UNANNOTATE_WITHIN;
        self.source
            .annotate(&pod.namespace, &pod.name, Redirection::Removed, deadline)
            .await;
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
}

/// What became of a pod's `add` toward ztunnel.
#[derive(Debug)]
enum ZtunnelOutcome {
    /// ztunnel acked it.
    Acked,
    /// No ztunnel was connected; the pod is in the next snapshot.
    NoZtunnel,
    /// The connection or the netns went away before the ack; the pod is in
    /// the next snapshot.
    Lost(String),
    /// ztunnel refused it.
    Refused(ZdsError),
    /// ztunnel did not answer before the plugin's deadline.
    TimedOut,
}

impl ZtunnelOutcome {
    /// Classifies the wait for ztunnel's answer.
    fn of(
        answer: Result<
            Result<Result<(), ZdsError>, oneshot::error::RecvError>,
            tokio::time::error::Elapsed,
        >,
    ) -> ZtunnelOutcome {
        match answer {
            Ok(Ok(Ok(()))) => ZtunnelOutcome::Acked,
            Ok(Ok(Err(ZdsError::ConnectionLost(error) | ZdsError::NetnsGone(error)))) => {
                ZtunnelOutcome::Lost(error)
            }
            Ok(Ok(Err(error))) => ZtunnelOutcome::Refused(error),
            Ok(Err(_)) => ZtunnelOutcome::Lost("the connection ended without answering".to_owned()),
            Err(_) => ZtunnelOutcome::TimedOut,
        }
    }

    /// The annotation that says it: `enabled` only once ztunnel has the
    /// pod, `pending` while its rules wait for ztunnel.
    fn redirection(&self) -> Redirection {
        match self {
            ZtunnelOutcome::Acked => Redirection::Enabled,
            _ => Redirection::Pending,
        }
    }

    /// What the plugin hears: success once the rules are in place and the
    /// pod is ztunnel's or queued for it; an error when ztunnel refused it
    /// or did not answer in time.
    fn into_result(self) -> Result<(), MeshError> {
        match self {
            ZtunnelOutcome::Acked | ZtunnelOutcome::NoZtunnel | ZtunnelOutcome::Lost(_) => Ok(()),
            ZtunnelOutcome::Refused(error) => Err(MeshError::Ztunnel(error)),
            ZtunnelOutcome::TimedOut => Err(MeshError::AckTimeout),
        }
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
    /// The pod could not be found, or may not join the mesh here.
    #[error(transparent)]
    Resolve(#[from] ResolveError),
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
    /// A task of the operation (rules, saving, or the operation itself)
    /// died.
    #[error("an agent task failed")]
    TaskFailed,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_ack_enables_and_only_a_refusal_or_timeout_fails_the_add() {
        let ok = Ok(Ok(Ok(())));
        let lost = Ok(Ok(Err(ZdsError::ConnectionLost("reset".to_owned()))));
        let netns_gone = Ok(Ok(Err(ZdsError::NetnsGone("ENOENT".to_owned()))));
        let refused = Ok(Ok(Err(ZdsError::Nack("unknown netns".to_owned()))));
        #[rustfmt::skip]
        let cases = [
            ("acked", ZtunnelOutcome::of(ok), Redirection::Enabled, true),
            ("no ztunnel connected", ZtunnelOutcome::NoZtunnel, Redirection::Pending, true),
            ("connection lost", ZtunnelOutcome::of(lost), Redirection::Pending, true),
            ("netns gone", ZtunnelOutcome::of(netns_gone), Redirection::Pending, true),
            ("refused", ZtunnelOutcome::of(refused), Redirection::Pending, false),
            ("not acked in time", ZtunnelOutcome::TimedOut, Redirection::Pending, false),
        ];
        for (reason, outcome, redirection, succeeds) in cases {
            assert_eq!(outcome.redirection(), redirection, "{reason}");
            assert_eq!(outcome.into_result().is_ok(), succeeds, "{reason}");
        }
    }
}
