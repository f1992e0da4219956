//! Keeps the mesh in line with the Kubernetes API without waiting for a
//! CNI event (KUBERNETES.md A5, A6): a pod that becomes ambient after it
//! started is found through procfs and enrolled, a pod that opts out, is
//! deleted or finishes is taken out, and on the agent's start every held
//! pod is checked again (rules re-applied, netns re-found, records of
//! vanished pods dropped, probe sets rebuilt), each repair logged with
//! the pod's name.
//!
//! A pass runs after every burst of watch events, once a ztunnel has been
//! sent its snapshot, after a pause while a pod waits to be found, and
//! every 30 s regardless (`RESYNC`). What a pass
//! does is decided by `plan.rs` from plain data; this file reads the
//! watch, scans procfs and calls the mesh. Istio's repair controller
//! (KUBERNETES.md C) is for sidecar pods; this reconciliation is the
//! ambient agent's own.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use ztunnel_certs::error_chain::ErrorChain;

use super::kube::PodWatch;
use super::mesh::{Mesh, MeshError, Removal};
use super::pods::PodRecord;
use super::procfs::{self, PodUid};
use super::source::{KubeSource, PodSource};
use super::stopped;

use plan::{ApiPod, Step, plan};

pub mod plan;

/// How long a burst of watch events is let settle before a pass: one pass
/// for a namespace relabelled with many pods, not one per event.
const SETTLE: Duration = Duration::from_millis(100);
/// How soon a pass is repeated while a pod waits to be found (its
/// processes not started yet) or a step failed.
const RETRY: Duration = Duration::from_secs(2);
/// How often a pass runs with no event at all: what a missed event or a
/// failed write left behind is caught here.
const RESYNC: Duration = Duration::from_secs(30);
/// How long an enrollment waits for ztunnel's ack before the pod is
/// annotated `pending` and the pass moves on.
const ACK_WITHIN: Duration = Duration::from_secs(5);

/// The reconciliation of one agent.
pub struct Reconciler {
    mesh: Arc<Mesh>,
    watch: Arc<PodWatch>,
    /// The host's procfs, for finding running pods' netns.
    procfs: PathBuf,
}

impl Reconciler {
    /// The reconciliation of `mesh`, when its pods come from the
    /// Kubernetes API; `None` otherwise (the registry file has no running
    /// pods to follow).
    pub fn new(mesh: Arc<Mesh>, procfs: PathBuf) -> Option<Reconciler> {
        let PodSource::Kubernetes(KubeSource { watch, .. }) = mesh.source() else {
            return None;
        };
        let watch = Arc::clone(watch);
        Some(Reconciler {
            mesh,
            watch,
            procfs,
        })
    }

    /// Runs passes until `shutdown`: the first (the start-up one) once
    /// both watches have listed, then on events and timers.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        let mut changes = self.watch.changes();
        let mut snapshots = self.mesh.snapshots();
        tokio::select! {
            () = stopped(&mut shutdown) => return,
            () = self.watch.wait_ready() => {}
        }
        changes.mark_unchanged();
        let mut next = Instant::now() + self.pass(true, true).await;
        loop {
            // Event passes leave the probe sets to the enrollments and
            // removals that change them; timed ones read the sets back.
            let mut timed = false;
            tokio::select! {
                () = stopped(&mut shutdown) => return,
                changed = changes.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    tokio::time::sleep(SETTLE).await;
                    changes.mark_unchanged();
                }
                // Pods held while no ztunnel was there are confirmed now.
                sent = snapshots.changed() => {
                    if sent.is_err() {
                        return;
                    }
                }
                () = tokio::time::sleep_until(next) => timed = true,
            }
            next = Instant::now() + self.pass(false, timed).await;
        }
    }

    /// One pass; returns how long until the next one without events.
    /// `startup` also re-applies the rules of every held pod and logs what
    /// it repairs; `sync_probe_sets` reads the node's probe sets back and
    /// repairs them (on start and on the timer, not on every event).
    async fn pass(&self, startup: bool, sync_probe_sets: bool) -> Duration {
        let api = self.api_pods();
        let held = self.mesh.pods();
        let steps = plan(&api, &held, PodRecord::netns_alive);
        let mut unsettled = false;
        let mut to_find = Vec::new();
        for step in steps {
            match step {
                Step::Find(pod) => to_find.push(pod),
                Step::Refresh(pod, record) => self.refresh(&pod, record).await,
                Step::Remove(record, removal) => {
                    unsettled |= !self.remove(&record, removal, startup).await;
                }
                Step::Confirm(record) => unsettled |= !self.confirm_gone(&record, startup).await,
            }
        }
        if startup {
            self.reapply_rules(&api).await;
        }
        if !to_find.is_empty() {
            unsettled |= !self.find_and_enroll(to_find, startup).await;
        }
        if !sync_probe_sets {
            return if unsettled { RETRY } else { RESYNC };
        }
        match self.mesh.sync_probe_sets().await {
            Ok((0, 0)) => {}
            Ok((added, removed)) => {
                tracing::info!(added, removed, "repaired the node's probe sets")
            }
            Err(error) => {
                unsettled = true;
                tracing::error!(error = %ErrorChain(&error), "the node's probe sets could not be brought up to date");
            }
        }
        if unsettled { RETRY } else { RESYNC }
    }

    /// This node's pods as the watch shows them.
    fn api_pods(&self) -> Vec<ApiPod> {
        let PodSource::Kubernetes(source) = self.mesh.source() else {
            return Vec::new();
        };
        self.watch
            .pods()
            .iter()
            .filter_map(|pod| {
                let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
                let labels = self.watch.namespace_labels(namespace)?;
                ApiPod::of(pod, &labels, &source.enablement)
            })
            .collect()
    }

    /// Takes a held pod out; false when that failed (retried next pass).
    async fn remove(&self, record: &PodRecord, removal: Removal, startup: bool) -> bool {
        let pod = format!("{}/{}", record.namespace, record.name);
        if startup {
            tracing::info!(%pod, reason = %removal, "repair: the pod left the mesh while the agent was away");
        }
        match self.mesh.remove(record, removal).await {
            Ok(()) => true,
            Err(error) => {
                tracing::warn!(%pod, error = %ErrorChain(&error), "could not take the pod out of the mesh; retrying");
                false
            }
        }
    }

    /// Removes a held pod the watch does not show, once the API server
    /// confirms it is gone (or is another pod now); false when it could
    /// not be asked or the removal failed.
    async fn confirm_gone(&self, record: &PodRecord, startup: bool) -> bool {
        match self.watch.fetch_pod(&record.namespace, &record.name).await {
            Ok(Some(pod)) if pod.metadata.uid.as_deref() == Some(record.uid.as_str()) => true,
            Ok(_) => self.remove(record, Removal::Deleted, startup).await,
            Err(error) => {
                tracing::warn!(error = %ErrorChain(&error), "could not ask whether a held pod still exists; retrying");
                false
            }
        }
    }

    /// Hands a held pod to ztunnel again and annotates it by the outcome:
    /// its earlier add was not acked (no ztunnel then, or a lost write).
    /// Without a ztunnel there is nothing to confirm: the next one gets the
    /// pod in its snapshot, and the pass after that annotates it.
    async fn refresh(&self, pod: &ApiPod, record: PodRecord) {
        if !self.mesh.has_ztunnel() {
            return;
        }
        let deadline = Instant::now() + ACK_WITHIN;
        if let Err(error) = self.mesh.enroll(record, deadline, Duration::ZERO).await {
            tracing::warn!(pod = %pod.label(), error = %ErrorChain(&error), "the pod's redirection is not confirmed yet");
        }
    }

    /// Re-applies the rules of every held pod that stays (on start: rules
    /// may have been flushed while the agent was away).
    async fn reapply_rules(&self, api: &[ApiPod]) {
        for record in self.mesh.pods() {
            let stays = api
                .iter()
                .any(|pod| pod.uid == record.uid && pod.enrollment.is_enrolled());
            if !stays || !record.netns_alive() {
                continue;
            }
            let pod = format!("{}/{}", record.namespace, record.name);
            match self.mesh.reapply_rules(&record).await {
                Ok(true) => {
                    tracing::info!(%pod, "repair: the pod's redirection rules were missing and are back")
                }
                Ok(false) => tracing::debug!(%pod, "the pod's rules are in place"),
                Err(error) => {
                    tracing::warn!(%pod, error = %ErrorChain(&error), "could not re-apply the pod's rules")
                }
            }
        }
    }

    /// Finds the netns of each pod through procfs and enrolls those found;
    /// false when some were not found or not enrolled (retried soon).
    async fn find_and_enroll(&self, pods: Vec<ApiPod>, startup: bool) -> bool {
        let pods: Vec<(Option<PodUid>, ApiPod)> = pods
            .into_iter()
            .map(|pod| (pod.uid.parse::<PodUid>().ok(), pod))
            .collect();
        let wanted: HashMap<PodUid, Vec<IpAddr>> = pods
            .iter()
            .filter_map(|(uid, pod)| Some((uid.clone()?, pod.ips.clone())))
            .collect();
        let procfs = self.procfs.clone();
        let found = match tokio::task::spawn_blocking(move || procfs::scan(&procfs, &wanted)).await
        {
            Ok(Ok(found)) => found,
            Ok(Err(error)) => {
                tracing::error!(error = %ErrorChain(&error), "cannot look for running pods in procfs");
                return false;
            }
            Err(_) => {
                tracing::error!("the procfs scan failed");
                return false;
            }
        };
        let mut settled = true;
        for (uid, pod) in pods {
            let netns = uid.and_then(|uid| found.get(&uid));
            let Some(netns) = netns else {
                tracing::debug!(pod = %pod.label(), "no process of the pod found yet");
                settled = false;
                continue;
            };
            let record = PodRecord {
                uid: pod.uid.clone(),
                name: pod.name.clone(),
                namespace: pod.namespace.clone(),
                service_account: pod.service_account.clone(),
                netns: netns.path.clone(),
                netns_inode: Some(netns.inode),
                ips: pod.ips.clone(),
                dns_capture: pod.dns_capture,
            };
            if startup {
                tracing::info!(pod = %pod.label(), pid = netns.pid, "repair: enrolling a running pod found through procfs");
            } else {
                tracing::info!(pod = %pod.label(), pid = netns.pid, "enrolling a running pod found through procfs");
            }
            let deadline = Instant::now() + ACK_WITHIN;
            match self.mesh.enroll(record, deadline, Duration::ZERO).await {
                Ok(()) => {}
                Err(MeshError::AckTimeout | MeshError::Ztunnel(_)) => {
                    // Held with its rules in place; the annotation says
                    // `pending` and a later pass hands it over again.
                }
                Err(error) => {
                    tracing::warn!(pod = %pod.label(), error = %ErrorChain(&error), "could not enroll the running pod; retrying");
                    settled = false;
                }
            }
        }
        settled
    }
}
