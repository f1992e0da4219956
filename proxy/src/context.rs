//! What the data path's connection handlers share: the [`Proxy`] of one
//! served workload (state, certificates, metrics, sockets, pool, tracker,
//! drain), its time limits, how it finds the workload it serves, and the
//! policy re-check of its open connections. Outbound (`outbound.rs`) and
//! inbound (`inbound/`) depend on this module; `app` only assembles it.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock, Weak};
use std::time::Duration;

use rand::Rng;
use ztunnel_certs::identity::{Identity, IdentityError};

use crate::capacity::Capacity;
use crate::config::{Config, WorkloadInfo};
use crate::drain::DrainWatcher;
use crate::hbone::H2Settings;
use crate::identity::manager::IdentityManager;
use crate::inbound::tracker::{OutboundTracker, Shown, Tracker};
use crate::metrics::{Metrics, Reporter};
use crate::pool::Pool;
use crate::resolve::Resolver;
use crate::socket::SocketFactory;
use crate::state::{SharedState, State, Workload};

/// How long a peer may take to finish the TLS handshake: bounds the sockets
/// a slow or hostile client can hold open before it is identified.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long dialing an upstream (application or peer ztunnel) may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// What every connection handler of one proxied workload shares.
pub struct Proxy {
    /// The configuration.
    pub config: Arc<Config>,
    /// Workloads, services and policies.
    pub state: SharedState,
    /// Certificates.
    pub identities: IdentityManager,
    /// Traffic metrics.
    pub metrics: Arc<Metrics>,
    /// Where sockets come from.
    pub sockets: Arc<dyn SocketFactory>,
    /// HBONE HTTP/2 settings.
    pub h2: H2Settings,
    /// Outbound HBONE connections.
    pub pool: Pool,
    /// Looks up the addresses of endpoints known by hostname; one for the
    /// process, shared by every pod's proxy.
    pub resolver: Resolver,
    /// Open inbound connections, for policy re-checks and `/config_dump`.
    pub tracker: Tracker,
    /// Open outbound connections, for `/config_dump`.
    pub outbound_tracker: OutboundTracker,
    /// The bound on connections the process carries, shared by every
    /// pod's proxy.
    pub capacity: Arc<Capacity>,
    /// The workload this proxy serves.
    pub workload: WorkloadInfo,
    /// Ends every task.
    pub drain: DrainWatcher,
    /// The other pods this process serves, for the same-node path; `None`
    /// when there is no such path (dedicated mode, or the setting off).
    pub local_pods: Option<Arc<LocalPods>>,
}

/// A proxy's open connections as `/config_dump` lists them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnectionsShown {
    /// Connections to the served workload.
    pub inbound: Vec<Shown>,
    /// Connections from it.
    pub outbound: Vec<Shown>,
}

impl Proxy {
    /// The open connections, for `/config_dump`.
    pub fn connections(&self) -> ConnectionsShown {
        ConnectionsShown {
            inbound: self.tracker.shown(),
            outbound: self.outbound_tracker.shown(),
        }
    }

    /// The served workload as the state knows it now.
    pub fn local_workload(&self) -> Option<Arc<Workload>> {
        self.local_workload_in(&self.state.read())
    }

    /// [`Proxy::local_workload`] in a state the caller already holds: the
    /// state's lock must not be taken twice by one reader.
    pub fn local_workload_in(&self, state: &State) -> Option<Arc<Workload>> {
        find_node_workload(state, &self.workload, self.config.node_name.as_deref())
    }

    /// The served workload, waiting up to `local_workload_wait` for the
    /// control plane to describe it: a new pod sends (and is sent to) as
    /// soon as its network is up, which can be before the push that names
    /// it arrives. `None` after the wait, logged and counted.
    pub async fn wait_for_local_workload(&self, reporter: Reporter) -> Option<Arc<Workload>> {
        if let Some(workload) = self.local_workload() {
            return Some(workload);
        }
        let started = tokio::time::Instant::now();
        let arrived = self
            .local_workload_within(self.config.local_workload_wait)
            .await;
        self.metrics
            .record_workload_wait(reporter, arrived.is_some());
        match &arrived {
            Some(_) => tracing::debug!(
                namespace = %self.workload.namespace,
                name = %self.workload.name,
                waited = ?started.elapsed(),
                "the local workload arrived"
            ),
            None => tracing::warn!(
                namespace = %self.workload.namespace,
                name = %self.workload.name,
                waited = ?self.config.local_workload_wait,
                "the control plane has not described this pod's workload yet; connection refused"
            ),
        }
        arrived
    }

    /// The served workload once the state describes it, waiting at most
    /// `wait`; neither logged nor counted, which is the caller's part.
    pub async fn local_workload_within(&self, wait: Duration) -> Option<Arc<Workload>> {
        // Subscribed before looking, so a push in between is seen.
        let mut changes = self.state.subscribe();
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if let Some(workload) = self.local_workload() {
                return Some(workload);
            }
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Ok(Ok(())) => {}
                // The deadline, or the state's sender gone (shutting down).
                Ok(Err(_)) | Err(_) => return None,
            }
        }
    }

    /// Whether `workload` is the one this proxy serves.
    pub fn is_local(&self, workload: &Workload) -> bool {
        *workload.namespace == *self.workload.namespace && *workload.name == *self.workload.name
    }

    /// A random number that spreads connections over endpoints.
    pub fn pick(&self) -> u64 {
        rand::rng().random()
    }
}

/// The proxies of the pods served on this node, by namespace and pod name:
/// where a connection on the same-node path finds its destination's
/// inbound side. Entries are weak, so a stopped pod's proxy is freed with
/// its last connection whether or not its entry is gone yet.
pub struct LocalPods<P = Proxy> {
    pods: RwLock<ByNamespace<P>>,
}

/// Pod proxies by namespace, then by pod name.
type ByNamespace<P> = HashMap<Arc<str>, HashMap<Arc<str>, Weak<P>>>;

impl<P> Default for LocalPods<P> {
    fn default() -> Self {
        LocalPods {
            pods: RwLock::default(),
        }
    }
}

impl<P> LocalPods<P> {
    /// Serves `info`'s pod with `proxy` from now on, in place of any
    /// earlier proxy of a pod of that name.
    pub fn insert(&self, info: &WorkloadInfo, proxy: &Arc<P>) {
        self.write()
            .entry(Arc::clone(&info.namespace))
            .or_default()
            .insert(Arc::clone(&info.name), Arc::downgrade(proxy));
    }

    /// Forgets `proxy` as `info`'s pod, unless another proxy replaced it.
    pub fn remove(&self, info: &WorkloadInfo, proxy: &Weak<P>) {
        let mut pods = self.write();
        let Some(names) = pods.get_mut(&*info.namespace) else {
            return;
        };
        if names
            .get(&*info.name)
            .is_some_and(|entry| Weak::ptr_eq(entry, proxy))
        {
            names.remove(&*info.name);
        }
        if names.is_empty() {
            pods.remove(&*info.namespace);
        }
    }

    /// The live proxy of the pod `namespace`/`name`.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<P>> {
        self.pods
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(namespace)?
            .get(name)?
            .upgrade()
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, ByNamespace<P>> {
        // Each change is one insert or remove: a panic elsewhere leaves the
        // map consistent.
        self.pods.write().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The state's workload for `info`: same namespace, name and service
/// account, among the workloads of `node` when it is set (`NODE_NAME`), the
/// in-pod match of WIRE.md §5.
pub fn find_node_workload(
    state: &State,
    info: &WorkloadInfo,
    node: Option<&str>,
) -> Option<Arc<Workload>> {
    state
        .local_workload(&info.namespace, &info.name, &info.service_account, node)
        .cloned()
}

/// The identity a local workload runs as: its workload's when the state
/// knows it (among `NODE_NAME`'s), else built from the configured trust
/// domain, namespace and service account.
pub fn local_identity(
    state: &State,
    info: &WorkloadInfo,
    config: &Config,
) -> Result<Identity, IdentityError> {
    match find_node_workload(state, info, config.node_name.as_deref()) {
        Some(workload) => Ok(workload.identity.clone()),
        None => Identity::new(&config.trust_domain, &info.namespace, &info.service_account),
    }
}

/// Re-checks open inbound connections whenever policies or workloads
/// change (a file reload, an xDS update), closing those no longer allowed
/// (each closure logged and counted).
pub async fn recheck_policies(proxy: Arc<Proxy>) {
    let mut changes = proxy.state.subscribe_authorization();
    let drain = proxy.drain.clone();
    loop {
        tokio::select! {
            () = drain.signaled() => return,
            changed = changes.changed() => if changed.is_err() { return },
        }
        let closed = proxy.tracker.recheck(&proxy.state.read());
        for closed in closed {
            tracing::info!(
                src.addr = %closed.connection.source_ip,
                dst.workload = %closed.connection.destination_workload,
                reason = %closed.reason,
                "connection closed: no longer allowed by policy"
            );
            proxy.metrics.record_policy_close(Reporter::Destination);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str) -> WorkloadInfo {
        WorkloadInfo {
            namespace: "default".into(),
            name: name.into(),
            service_account: "sa".into(),
        }
    }

    #[test]
    fn a_pod_is_found_until_it_stops_and_a_replacement_survives_its_predecessor() {
        let pods = LocalPods::<&str>::default();
        let first = Arc::new("first");
        pods.insert(&pod("web-0"), &first);
        assert_eq!(pods.get("default", "web-0").as_deref(), Some(&"first"));
        assert!(pods.get("default", "web-1").is_none());
        assert!(pods.get("other", "web-0").is_none());

        // A new pod of the same name (a new netns, or a StatefulSet's next
        // pod) replaces it; the old one's stop must not remove the new one.
        let second = Arc::new("second");
        pods.insert(&pod("web-0"), &second);
        pods.remove(&pod("web-0"), &Arc::downgrade(&first));
        assert_eq!(pods.get("default", "web-0").as_deref(), Some(&"second"));

        // A stopped proxy is not handed out even before its entry goes.
        drop(second);
        assert!(pods.get("default", "web-0").is_none());
        let third = Arc::new("third");
        pods.insert(&pod("web-0"), &third);
        pods.remove(&pod("web-0"), &Arc::downgrade(&third));
        assert!(pods.get("default", "web-0").is_none());
    }
}
