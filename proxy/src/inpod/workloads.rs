//! The per-pod proxies of the shared mode: for each pod the node agent
//! adds, the 15001, 15006 and 15008 listeners inside the pod's namespace and
//! the tasks that serve them, built from the same [`Proxy`] core as the
//! dedicated mode with the pod's own socket factory, pool and drain.
//!
//! The ZDS wire is `inpod/zds.rs`; this module only implements
//! [`PodProxies`].

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::runtime::Handle;
use ztunnel_certs::identity::Identity;

use crate::app::{self, Proxy};
use crate::config::Config;
use crate::discovery::SharedState;
use crate::drain::{self, DrainTrigger, DrainWatcher};
use crate::hbone::H2Settings;
use crate::identity::manager::IdentityManager;
use crate::inbound::listeners;
use crate::inbound::tracker::Tracker;
use crate::inpod::netns::{
    HostNetns, ListenerOptions, NetnsId, NetnsSockets, PodNetns, bind_pod_listeners,
};
use crate::inpod::{PodInfo, PodProxies, StartError};
use crate::metrics::Metrics;
use crate::outbound;
use crate::pool::Pool;
use crate::state::State;

/// What every pod's proxy shares: configuration, state, certificates and
/// metrics are the node's, not the pod's.
#[derive(Clone)]
pub struct NodeParts {
    /// The configuration.
    pub config: Arc<Config>,
    /// Workloads, services and policies.
    pub state: SharedState,
    /// Certificates of every identity on the node.
    pub identities: IdentityManager,
    /// Traffic metrics.
    pub metrics: Arc<Metrics>,
    /// Where runtime threads return after creating a pod's socket.
    pub home: HostNetns,
    /// The data-plane runtime the pods' tasks run on.
    pub data: Handle,
    /// The node's drain: when it starts, every pod drains with it.
    pub drain: DrainWatcher,
}

/// The pods served, keyed by uid.
pub struct Workloads {
    node: NodeParts,
    h2: H2Settings,
    pods: Mutex<HashMap<Arc<str>, Served>>,
}

/// A pod being served.
struct Served {
    info: PodInfo,
    netns: NetnsId,
    identity: Option<Identity>,
    /// Drains this pod alone.
    trigger: DrainTrigger,
}

impl Workloads {
    /// No pods yet.
    pub fn new(node: NodeParts) -> Workloads {
        let h2 = app::h2_settings(&node.config);
        Workloads {
            node,
            h2,
            pods: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, Served>> {
        // Each change is one insert or remove: a panic elsewhere leaves the
        // map consistent.
        self.pods.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The three capture addresses: the wildcard of WIRE.md §1 with the
    /// configured ports.
    fn capture_addrs(&self) -> [(SocketAddr, &'static str); 3] {
        let listeners = &self.node.config.listeners;
        let wildcard = |port| {
            if self.node.config.inpod.ipv6_enabled {
                SocketAddr::from(([0u16; 8], port))
            } else {
                SocketAddr::from(([0u8; 4], port))
            }
        };
        [
            (wildcard(listeners.outbound.port()), "outbound"),
            (
                wildcard(listeners.inbound_plaintext.port()),
                "inbound plaintext",
            ),
            (wildcard(listeners.inbound.port()), "inbound HBONE"),
        ]
    }

    /// Binds the pod's listeners and starts its tasks; returns its drain.
    fn start(&self, pod: &PodInfo, netns: PodNetns) -> Result<DrainTrigger, StartError> {
        let config = &self.node.config;
        let options = ListenerOptions {
            mark: config.packet_mark,
            reuse_port: config.inpod.port_reuse,
            transparent: config.inpod.original_source,
        };
        let bound = bind_pod_listeners(&netns, self.capture_addrs(), options)
            .map_err(StartError::Netns)?
            .map_err(|error| StartError::Bind {
                what: error.what,
                source: error.source,
            })?;
        let (trigger, watcher) = drain::channel();
        let sockets = NetnsSockets {
            netns,
            home: self.node.home.clone(),
            mark: config.packet_mark,
            transparent: bound.transparent,
        };
        let proxy = Arc::new(Proxy {
            config: Arc::clone(config),
            state: self.node.state.clone(),
            identities: self.node.identities.clone(),
            metrics: Arc::clone(&self.node.metrics),
            sockets: Arc::new(sockets),
            h2: self.h2.clone(),
            pool: Pool::new(app::pool_config(config)),
            tracker: Tracker::default(),
            workload: pod.workload.clone(),
            drain: watcher.clone(),
        });
        let runtime = self.node.data.enter();
        let registered = (
            TcpListener::from_std(bound.outbound),
            TcpListener::from_std(bound.inbound_plaintext),
            TcpListener::from_std(bound.inbound),
        );
        let (outbound, plaintext, inbound) = match registered {
            (Ok(outbound), Ok(plaintext), Ok(inbound)) => (outbound, plaintext, inbound),
            (Err(source), _, _) | (_, Err(source), _) | (_, _, Err(source)) => {
                return Err(StartError::Bind {
                    what: "capture",
                    source,
                });
            }
        };
        tokio::spawn(outbound::serve(Arc::clone(&proxy), outbound));
        tokio::spawn(listeners::serve_plaintext(Arc::clone(&proxy), plaintext));
        tokio::spawn(listeners::serve_hbone(Arc::clone(&proxy), inbound));
        tokio::spawn(app::recheck_policies(Arc::clone(&proxy)));
        tokio::spawn(
            proxy
                .pool
                .clone()
                .release_idle_until_drained(watcher.clone()),
        );
        tokio::spawn(follow_node_drain(
            self.node.drain.clone(),
            trigger.clone(),
            watcher,
            config.drain_deadline,
        ));
        drop(runtime);
        Ok(trigger)
    }

    /// Stops a pod that left, at once, and forgets its certificate unless
    /// another pod on the node has the same identity.
    fn stop(&self, served: Served, pods: &HashMap<Arc<str>, Served>) {
        tracing::info!(
            uid = %served.info.uid,
            pod = %served.info.workload.name,
            namespace = %served.info.workload.namespace,
            "pod proxy stopped"
        );
        self.drain_now(served.trigger);
        if let Some(identity) = served.identity
            && !pods
                .values()
                .any(|other| other.identity.as_ref() == Some(&identity))
        {
            self.node.identities.forget(&identity);
        }
    }

    /// Drains a pod that was removed or replaced, without grace (WIRE.md
    /// §5 removes a pod at once).
    fn drain_now(&self, trigger: DrainTrigger) {
        self.node.data.spawn(async move {
            trigger.drain(Duration::ZERO).await;
        });
    }
}

impl PodProxies for Workloads {
    fn add(&self, pod: &PodInfo, netns: &OwnedFd) -> Result<(), StartError> {
        if self.node.drain.is_draining() {
            return Err(StartError::Draining);
        }
        let netns = PodNetns::new(netns).map_err(StartError::Netns)?;
        let id = netns.id();
        if let Some(served) = self.lock().get(&pod.uid)
            && served.netns == id
            && served.info == *pod
        {
            return Ok(());
        }
        let trigger = self.start(pod, netns)?;
        let identity =
            app::local_identity(&self.node.state.read(), &pod.workload, &self.node.config).ok();
        if let Some(identity) = &identity {
            self.node.identities.prefetch(identity.clone());
        }
        let served = Served {
            info: pod.clone(),
            netns: id,
            identity,
            trigger,
        };
        let mut pods = self.lock();
        if let Some(replaced) = pods.insert(Arc::clone(&pod.uid), served) {
            tracing::info!(uid = %pod.uid, "pod's network namespace changed: proxy replaced");
            // The replacement shares the identity, so it is not forgotten.
            self.drain_now(replaced.trigger);
        } else {
            tracing::info!(
                uid = %pod.uid,
                pod = %pod.workload.name,
                namespace = %pod.workload.namespace,
                "pod proxy started"
            );
        }
        Ok(())
    }

    fn del(&self, uid: &str) {
        let mut pods = self.lock();
        if let Some(served) = pods.remove(uid) {
            self.stop(served, &pods);
        }
    }

    fn retain(&self, keep: &HashSet<Arc<str>>) {
        let mut pods = self.lock();
        let gone: Vec<Arc<str>> = pods
            .keys()
            .filter(|uid| !keep.contains(*uid))
            .cloned()
            .collect();
        for uid in gone {
            if let Some(served) = pods.remove(&uid) {
                self.stop(served, &pods);
            }
        }
    }

    fn served(&self) -> Vec<Arc<str>> {
        let mut uids: Vec<Arc<str>> = self.lock().keys().cloned().collect();
        uids.sort();
        uids
    }
}

/// Drains the pod when the node drains (with the node's deadline), and ends
/// when the pod itself is drained first (deleted or replaced).
async fn follow_node_drain(
    node: DrainWatcher,
    pod_trigger: DrainTrigger,
    pod: DrainWatcher,
    deadline: Duration,
) {
    let node_first = tokio::select! {
        () = node.signaled() => true,
        () = pod.signaled() => false,
    };
    // Not a task of the pod's: it must not hold up the pod's own drain.
    drop(pod);
    if node_first {
        pod_trigger.drain(deadline).await;
    }
}

/// Prefetches the certificates of every workload on this node as the state
/// learns of them, so that a pod's first connection does not wait for the
/// CA. Ends with the drain.
pub async fn prefetch_node_certificates(
    state: SharedState,
    identities: IdentityManager,
    node_name: Option<String>,
    drain: DrainWatcher,
) {
    let mut changes = state.subscribe();
    loop {
        for identity in node_identities(&state.read(), node_name.as_deref()) {
            identities.prefetch(identity);
        }
        tokio::select! {
            () = drain.signaled() => return,
            changed = changes.changed() => if changed.is_err() { return },
        }
    }
}

/// The identities of the workloads on `node` (every workload when `None`).
pub fn node_identities(state: &State, node: Option<&str>) -> HashSet<Identity> {
    state
        .workloads()
        .filter(|workload| node.is_none_or(|node| *workload.node == *node))
        .filter_map(|workload| workload.identity().ok())
        .collect()
}
