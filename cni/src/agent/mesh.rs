//! The pods in the mesh, and what changes them: a pod added by the CNI
//! plugin (look it up in the pod source, install its rules, record it,
//! tell the newest ztunnel, annotate it), a running pod enrolled by the
//! reconciliation (the same from its rules on), and a pod deleted or taken
//! out (KUBERNETES.md A6: its probe-set entries, its rules, its record and
//! ztunnel's proxy, its annotation, in that order).
//!
//! Adds and deletes run one at a time (`operations`); the pod set and the
//! ztunnel connections share one lock (`state`) so that a connection's
//! snapshot and the events queued after it agree. A change builds the new
//! pod set, saves it with no lock but `operations` held, then swaps it in
//! under `state`. Finding the pod is `source.rs`'s, deciding which running
//! pods join or leave `reconcile.rs`'s, rules are `rules.rs`'s and
//! `host_rules.rs`'s, persistence `pods.rs`'s, the ZDS exchange `zds.rs`'s.

use std::net::IpAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use ztunnel_certs::error_chain::ErrorChain;

use crate::event::{CmdAdd, CmdDel};

use super::host_rules::HostRules;
use super::kube::Redirection;
use super::netns::NetnsError;
use super::pods::{PodRecord, PodSet, PodStore, PodStoreError};
use super::rules::{self, RuleSettings};
use super::source::{PodSource, ResolveError};
use super::zds::wire::Request;
use super::zds::{Connections, ZdsError, ZdsEvent};

use outcome::ZtunnelOutcome;
use sandbox::{DelSandbox, DelTarget, RecordedSandbox};

mod outcome;
mod sandbox;

/// How long a DEL waits for the removal of the pod's annotation before it
/// answers (the removal goes on after): DEL has no deadline of its own,
/// and a slow API server must not hold it.
const UNANNOTATE_WITHIN: Duration = Duration::from_secs(3);

/// How long a pod's add waits for a ztunnel when none is connected: a
/// ztunnel reconnecting after its own or the agent's restart comes back
/// within its backoff's cap (500 ms) and then starts the pod's proxy; a
/// node with no ztunnel at all delays each pod's start by this much only.
const ZTUNNEL_WAIT: Duration = Duration::from_secs(2);

/// The agent's pods and ztunnel connections.
pub struct Mesh {
    /// Who the pods are (uid, service account, node), and where their
    /// redirection is published.
    source: PodSource,
    /// How rules are written.
    rules: RuleSettings,
    /// Where the host's root filesystem is seen (`/` on the host, `/host`
    /// in a container that mounts it there): the netns paths the plugin
    /// reports are the host's.
    host_root: PathBuf,
    /// The node's probe sets, when the agent keeps them (`None`: another
    /// agent or nobody does, e.g. in tests that share the host's netns).
    host_rules: Option<Arc<HostRules>>,
    /// Where the pod set is kept.
    store: PodStore,
    /// Serializes adds and deletes, rule installation and saving included.
    operations: tokio::sync::Mutex<()>,
    /// Pod set and connections; held briefly, never across an await or
    /// file I/O.
    state: Mutex<State>,
    /// Marked each time a ztunnel has been sent its snapshot: pods held
    /// while no ztunnel was there can now be confirmed (`reconcile.rs`).
    snapshots: tokio::sync::watch::Sender<()>,
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
        host_rules: Option<Arc<HostRules>>,
        store: PodStore,
        mut pods: PodSet,
    ) -> Result<Mesh, MeshError> {
        let gone = pods.prune(|pod| !pod.netns_alive());
        for pod in &gone {
            tracing::info!(pod = %format!("{}/{}", pod.namespace, pod.name), netns = %pod.netns.display(), "pruned: netns is gone");
        }
        if !gone.is_empty() {
            store.save(&pods)?;
        }
        Ok(Mesh {
            source,
            rules,
            host_root: PathBuf::from("/"),
            host_rules,
            store,
            operations: tokio::sync::Mutex::new(()),
            state: Mutex::new(State {
                pods,
                connections: Connections::default(),
            }),
            snapshots: tokio::sync::watch::Sender::new(()),
        })
    }

    /// The mesh with the host's root filesystem seen at `host_root`.
    pub fn with_host_root(mut self, host_root: PathBuf) -> Mesh {
        self.host_root = host_root;
        self
    }

    /// `path`, a host path the plugin reported, as this agent sees it.
    fn on_host(&self, path: &str) -> String {
        seen_from(&self.host_root, path)
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The pod `namespace/name`, if it is in the mesh.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<PodRecord> {
        self.state().pods.get(namespace, name).cloned()
    }

    /// Every pod in the mesh.
    pub fn pods(&self) -> Vec<PodRecord> {
        self.state().pods.iter().cloned().collect()
    }

    /// Called once a ztunnel has been sent its snapshot.
    pub fn snapshot_sent(&self) {
        self.snapshots.send_replace(());
    }

    /// A receiver marked changed each time a ztunnel has been sent its
    /// snapshot.
    pub fn snapshots(&self) -> tokio::sync::watch::Receiver<()> {
        self.snapshots.subscribe()
    }

    /// Whether a ztunnel is connected.
    pub fn has_ztunnel(&self) -> bool {
        !self.state().connections.is_empty()
    }

    /// Where pods are looked up and annotated.
    pub fn source(&self) -> &PodSource {
        &self.source
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

    /// Answers a CNI ADD: finds the pod in the source and puts it in the
    /// mesh ([`Mesh::enroll`]). A pod the Kubernetes source says is not
    /// enrolled in ambient is left alone and the ADD succeeds: with the
    /// plugin reporting every pod, this is how pods outside the mesh start.
    ///
    /// An add whose `deadline` has passed before its rules go in is
    /// refused ([`MeshError::DeadlinePassed`]): the plugin has stopped
    /// waiting, so the runtime is tearing this sandbox down and retries
    /// with a new one, which must not lose its place to this one.
    pub async fn add(&self, mut event: CmdAdd, deadline: Instant) -> Result<(), MeshError> {
        event.netns = self.on_host(&event.netns);
        in_time(&event, deadline, Instant::now())?;
        match self.source.resolve(&event).await {
            Ok(record) => {
                in_time(&event, deadline, Instant::now())?;
                self.enroll(record, deadline, ZTUNNEL_WAIT).await
            }
            Err(ResolveError::NotEnrolled { pod, reason }) => {
                tracing::info!(%pod, %reason, "not enrolled in ambient; left alone");
                Ok(())
            }
            Err(error) => Err(error.into()),
        }
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
    ///
    /// With no ztunnel connected, the add waits up to `ztunnel_wait` (and
    /// the deadline) for one to connect and be sent its snapshot, which
    /// holds the pod: right after the agent or ztunnel restarts, ztunnel is
    /// back within a second, and the pod then starts with its proxy in
    /// place instead of failing closed until then.
    pub async fn enroll(
        &self,
        record: PodRecord,
        deadline: Instant,
        ztunnel_wait: Duration,
    ) -> Result<(), MeshError> {
        let label = format!("{}/{}", record.namespace, record.name);
        let answer = self.install_and_queue(record.clone()).await?;
        tracing::info!(pod = %label, uid = %record.uid, netns = %record.netns.display(), "pod added to the mesh");
        let told = match answer {
            Some(answer) => ZtunnelOutcome::of(tokio::time::timeout_at(deadline, answer).await),
            None => {
                // Subscribed after the pod was recorded: any snapshot
                // marked from now on was built with it.
                let mut snapshots = self.snapshots();
                snapshots.borrow_and_update();
                let until = deadline.min(Instant::now() + ztunnel_wait);
                match tokio::time::timeout_at(until, snapshots.changed()).await {
                    Ok(Ok(())) => ZtunnelOutcome::Acked,
                    Ok(Err(_)) | Err(_) => ZtunnelOutcome::NoZtunnel,
                }
            }
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
                tracing::warn!(pod = %label, error = %ErrorChain(&error), "ztunnel refused the pod");
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

    /// Installs the pod's rules, adds its addresses to the probe sets,
    /// records it and queues its `add` for the newest ztunnel; returns
    /// where ztunnel's answer will come, or `None` when no ztunnel is
    /// connected.
    async fn install_and_queue(
        &self,
        mut record: PodRecord,
    ) -> Result<Option<oneshot::Receiver<Result<(), ZdsError>>>, MeshError> {
        let _operation = self.operations.lock().await;
        let (netns, ips) = (record.netns.clone(), record.ips.clone());
        let settings = self.rules.for_pod(record.dns_capture);
        let (_, inode) = install_blocking(netns, ips, settings, record.netns_inode).await?;
        record.netns_inode = Some(inode);
        self.probe_set(&record, ProbeSetChange::Add).await;
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
        Ok(state.connections.send_to_newest(event).then_some(answer))
    }

    /// Re-applies a recorded pod's rules (on the agent's start); returns
    /// whether they were not all in place.
    pub async fn reapply_rules(&self, record: &PodRecord) -> Result<bool, MeshError> {
        let _operation = self.operations.lock().await;
        let (netns, ips) = (record.netns.clone(), record.ips.clone());
        let settings = self.rules.for_pod(record.dns_capture);
        let (changed, _) = install_blocking(netns, ips, settings, record.netns_inode).await?;
        Ok(changed)
    }

    /// Makes the node's probe sets hold exactly the addresses of the pods
    /// in the mesh; returns how many entries were added and removed.
    pub async fn sync_probe_sets(&self) -> Result<(usize, usize), MeshError> {
        let Some(host_rules) = self.host_rules.clone() else {
            return Ok((0, 0));
        };
        let _operation = self.operations.lock().await;
        let ips: Vec<IpAddr> = self
            .state()
            .pods
            .iter()
            .flat_map(|pod| pod.ips.iter().copied())
            .collect();
        let report = tokio::task::spawn_blocking(move || host_rules.sync(&ips))
            .await
            .map_err(|_| MeshError::TaskFailed)??;
        Ok((report.added.len(), report.removed.len()))
    }

    /// Takes a pod out of the mesh in KUBERNETES.md A6's order: its
    /// addresses leave the probe sets, its rules are removed (only when it
    /// opted out: a deleted pod's netns is the runtime's to tear down),
    /// its record is dropped and every ztunnel told, then its annotation
    /// is removed (only when it opted out: a deleted pod has none to
    /// keep). A record replaced meanwhile (another uid) is left alone.
    pub async fn remove(&self, record: &PodRecord, removal: Removal) -> Result<(), MeshError> {
        let operation = self.operations.lock().await;
        self.probe_set(record, ProbeSetChange::Remove).await;
        if removal == Removal::OptedOut && record.netns_alive() {
            remove_blocking(record.netns.clone()).await?;
        }
        let removed = self
            .forget(&record.namespace, &record.name, &record.uid)
            .await?;
        drop(operation);
        if let Some(pod) = removed {
            tracing::info!(pod = %format!("{}/{}", pod.namespace, pod.name), uid = %pod.uid, reason = %removal, "pod removed from the mesh");
            if removal == Removal::OptedOut {
                self.unannotate(&pod).await;
            }
        }
        Ok(())
    }

    /// Adds the pod's addresses to the node's probe sets or removes them.
    /// A failure is logged, not returned: the pod's redirection stands
    /// without it, only its kubelet probes are captured.
    async fn probe_set(&self, record: &PodRecord, change: ProbeSetChange) {
        let Some(host_rules) = self.host_rules.clone() else {
            return;
        };
        let ips = record.ips.clone();
        let outcome = tokio::task::spawn_blocking(move || match change {
            ProbeSetChange::Add => host_rules.add_pod(&ips),
            ProbeSetChange::Remove => host_rules.remove_pod(&ips),
        })
        .await;
        let pod = format!("{}/{}", record.namespace, record.name);
        match outcome {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                tracing::error!(%pod, ?change, error = %ErrorChain(&error), "probe set not updated; the pod's kubelet probes may be captured")
            }
            Err(_) => tracing::error!(%pod, ?change, "probe set update task failed"),
        }
    }

    /// Takes a pod out of the mesh: the rules in the DEL's netns (when it
    /// still exists), and, when the DEL is about the recorded sandbox
    /// (`sandbox::target`), its probe-set entries, its record, ztunnel's
    /// proxy and its annotation. A DEL for another sandbox of the pod (one
    /// the runtime gave up on) leaves the recorded one in the mesh.
    /// Unknown pods are fine: DEL is repeated by runtimes.
    pub async fn del(&self, mut event: CmdDel) -> Result<(), MeshError> {
        event.netns = self.on_host(&event.netns);
        let operation = self.operations.lock().await;
        let recorded = self.pod(&event.pod_namespace, &event.pod_name);
        let del = DelSandbox::seen(&event.pod_uid, &event.netns);
        let target = sandbox::target(&del, recorded.as_ref().map(RecordedSandbox::of).as_ref());
        if let (DelTarget::AnotherSandbox, Some(pod)) = (target, &recorded) {
            tracing::info!(pod = %format!("{}/{}", pod.namespace, pod.name), uid = %pod.uid, netns = %event.netns, recorded_netns = %pod.netns.display(), "DEL is for another sandbox of the pod: its recorded netns is live and not the DEL's, so it stays in the mesh");
        }
        let recorded = recorded.filter(|_| target == DelTarget::Recorded);
        if let Some(pod) = &recorded {
            self.probe_set(pod, ProbeSetChange::Remove).await;
        }
        if del.netns_inode.is_some() {
            remove_blocking(PathBuf::from(&event.netns)).await?;
        }
        let removed = match &recorded {
            Some(pod) => self.forget(&pod.namespace, &pod.name, &pod.uid).await?,
            None => None,
        };
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

/// Refuses `event` when its `deadline` has passed at `now`, and says so.
fn in_time(event: &CmdAdd, deadline: Instant, now: Instant) -> Result<(), MeshError> {
    let Some(late_by) = now.checked_duration_since(deadline) else {
        return Ok(());
    };
    let pod = format!("{}/{}", event.pod_namespace, event.pod_name);
    tracing::info!(%pod, netns = %event.netns, ?late_by, "ADD refused: it came after its deadline, the plugin has stopped waiting");
    Err(MeshError::DeadlinePassed { pod, late_by })
}

/// Installs rules on a blocking thread (the netns switch happens on a
/// thread of its own inside); returns whether they were not all in place,
/// and the netns's inode, which must be `expected_inode` when that is
/// known (a procfs path whose process has gone may name another netns).
async fn install_blocking(
    netns: PathBuf,
    ips: Vec<IpAddr>,
    settings: RuleSettings,
    expected_inode: Option<u64>,
) -> Result<(bool, u64), MeshError> {
    tokio::task::spawn_blocking(move || {
        let inode = std::fs::metadata(&netns)
            .map_err(|error| MeshError::NetnsGone {
                netns: netns.clone(),
                reason: error.to_string(),
            })?
            .ino();
        if expected_inode.is_some_and(|expected| expected != inode) {
            return Err(MeshError::NetnsGone {
                netns,
                reason: "it names another network namespace now".to_owned(),
            });
        }
        let changed = rules::install(&netns, &ips, &settings)?;
        Ok((changed, inode))
    })
    .await
    .map_err(|_| MeshError::TaskFailed)?
}

/// Removes the rules in the netns at `netns` on a blocking thread.
async fn remove_blocking(netns: PathBuf) -> Result<(), MeshError> {
    tokio::task::spawn_blocking(move || rules::remove(&netns))
        .await
        .map_err(|_| MeshError::TaskFailed)??;
    Ok(())
}

/// Which way a pod's addresses move in the probe sets.
#[derive(Debug, Clone, Copy)]
enum ProbeSetChange {
    Add,
    Remove,
}

/// Why a pod leaves the mesh (KUBERNETES.md A6), which decides what is
/// undone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// It no longer belongs in the mesh (a label changed) but keeps
    /// running: its rules and its annotation are removed.
    OptedOut,
    /// It was deleted or has finished: its netns is going away with it.
    Deleted,
}

impl std::fmt::Display for Removal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Removal::OptedOut => "no longer enrolled in ambient",
            Removal::Deleted => "deleted or finished",
        })
    }
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
    /// The pod's netns is not there (any more), or is another one.
    #[error("the pod's netns {netns} is gone: {reason}")]
    NetnsGone {
        /// The recorded path.
        netns: PathBuf,
        /// What was found there.
        reason: String,
    },
    /// The node's probe sets could not be brought up to date.
    #[error(transparent)]
    HostRules(#[from] super::host_rules::HostRulesError),
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
    /// The add's deadline passed before its rules went in: the plugin has
    /// stopped waiting (or would before the answer reached it) and fails
    /// the ADD, and the runtime retries with a new sandbox. Nothing was
    /// installed or recorded.
    #[error(
        "ADD of {pod} refused: it came {late_by:?} after its deadline; the plugin has stopped waiting and the runtime retries with a new sandbox"
    )]
    DeadlinePassed {
        /// `namespace/name`.
        pod: String,
        /// How long after the deadline the agent came to it.
        late_by: Duration,
    },
    /// A task of the operation (rules, saving, or the operation itself)
    /// died.
    #[error("an agent task failed")]
    TaskFailed,
}

/// The host path `path` as seen with the host's root at `host_root`; an
/// empty path (DEL after the runtime removed the netns) stays empty.
fn seen_from(host_root: &Path, path: &str) -> String {
    if path.is_empty() {
        return String::new();
    }
    host_root
        .join(path.trim_start_matches('/'))
        .to_string_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_paths_are_seen_under_the_host_root() {
        #[rustfmt::skip]
        let cases = [
            ("/", "/var/run/netns/cni-1", "/var/run/netns/cni-1"),
            ("/host", "/var/run/netns/cni-1", "/host/var/run/netns/cni-1"),
            ("/host/", "/proc/42/ns/net", "/host/proc/42/ns/net"),
            ("/host", "", ""),
        ];
        for (root, path, seen) in cases {
            assert_eq!(seen_from(Path::new(root), path), seen, "{root} {path}");
        }
    }
}
