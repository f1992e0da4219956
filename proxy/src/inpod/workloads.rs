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
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::runtime::Handle;
use ztunnel_certs::identity::Identity;

use crate::context::{ConnectionsShown, NodeRuntime, Proxy};
use crate::dns;
use crate::drain::{DrainTrigger, DrainWatcher};
use crate::identity::manager::IdentityManager;
use crate::inpod::netns::{
    HostNetns, ListenerOptions, NetnsId, NetnsSockets, PodNetns, bind_pod_listeners,
};
use crate::inpod::{PodInfo, PodProxies, StartError};
use crate::metrics::WorkloadManagerMetrics;
use crate::outbound::socks5;
use crate::serve;
use crate::state::SharedState;
use crate::state::{InboundProtocol, State, Workload};

/// What the pods' proxies need beyond the node's runtime: where their
/// tasks run, and the drain each pod's drain is a child of.
pub struct PodRuntime {
    /// Where runtime threads return after creating a pod's socket.
    pub home: HostNetns,
    /// The data-plane runtime the pods' tasks run on.
    pub data: Handle,
    /// The node's drain: each pod's drain is a child of it, so that the
    /// node's drain reaches every pod and waits for it.
    pub drain: DrainTrigger,
}

/// The pods served, keyed by uid.
pub struct Workloads {
    node: Arc<NodeRuntime>,
    pod_runtime: PodRuntime,
    /// How many pod proxies run, started and stopped.
    counts: WorkloadManagerMetrics,
    pods: Mutex<HashMap<Arc<str>, Served>>,
}

/// A pod being served.
struct Served {
    info: PodInfo,
    netns: NetnsId,
    /// Drains this pod alone.
    trigger: DrainTrigger,
    /// Its proxy, to take out of the same-node registry.
    proxy: Weak<Proxy>,
}

impl Workloads {
    /// No pods yet; `counts` follows the pods served.
    pub fn new(
        node: Arc<NodeRuntime>,
        pod_runtime: PodRuntime,
        counts: WorkloadManagerMetrics,
    ) -> Workloads {
        Workloads {
            node,
            pod_runtime,
            counts,
            pods: Mutex::default(),
        }
    }

    /// The pods served, sorted by uid, each with its proxy's open
    /// connections (`None` once the proxy has stopped), for `/config_dump`.
    pub fn pods(&self) -> Vec<(PodInfo, Option<ConnectionsShown>)> {
        let served: Vec<(PodInfo, Weak<Proxy>)> = self
            .lock()
            .values()
            .map(|served| (served.info.clone(), Weak::clone(&served.proxy)))
            .collect();
        // Each proxy's trackers are locked after the pods' lock is let go.
        let mut pods: Vec<_> = served
            .into_iter()
            .map(|(info, proxy)| (info, proxy.upgrade().map(|proxy| proxy.connections())))
            .collect();
        pods.sort_by(|(a, _), (b, _)| a.uid.cmp(&b.uid));
        pods
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

    /// Binds the pod's listeners and starts its tasks; returns its drain
    /// and its proxy.
    fn start(
        &self,
        pod: &PodInfo,
        netns: PodNetns,
    ) -> Result<(DrainTrigger, Weak<Proxy>), StartError> {
        let config = &self.node.config;
        let options = ListenerOptions {
            mark: config.packet_mark,
            reuse_port: config.inpod.port_reuse,
            transparent: config.inpod.original_source,
            keepalive: config.keepalive,
        };
        let bound = bind_pod_listeners(&netns, self.capture_addrs(), options)
            .map_err(StartError::Netns)?
            .map_err(|error| StartError::Bind {
                what: error.what,
                source: error.source,
            })?;
        let dns_listeners = match &self.node.dns {
            Some(_) => Some(self.bind_dns(&netns)?),
            None => None,
        };
        let socks5 = match config.listeners.socks5 {
            Some(addr) => Some(
                netns
                    .run_on_thread(|| socks5::bind(addr))
                    .map_err(StartError::Netns)?
                    .map_err(|source| StartError::Bind {
                        what: "SOCKS5",
                        source,
                    })?,
            ),
            None => None,
        };
        let (trigger, watcher) = self.pod_runtime.drain.child();
        let sockets = NetnsSockets {
            netns,
            home: self.pod_runtime.home.clone(),
            mark: config.packet_mark,
            keepalive: config.keepalive,
            transparent: bound.transparent,
        };
        let proxy = Arc::new(Proxy::new(
            Arc::clone(&self.node),
            pod.workload.clone(),
            Arc::new(sockets),
            watcher,
        ));
        let runtime = self.pod_runtime.data.enter();
        let register = |listener, what| {
            TcpListener::from_std(listener).map_err(|source| StartError::Bind { what, source })
        };
        let listeners = serve::Listeners {
            outbound: register(bound.outbound, "outbound")?,
            inbound_plaintext: register(bound.inbound_plaintext, "inbound plaintext")?,
            inbound: register(bound.inbound, "inbound HBONE")?,
            socks5: socks5
                .map(|listener| register(listener, "SOCKS5"))
                .transpose()?,
        };
        serve::spawn(&proxy, listeners);
        if let (Some(dns), Some(listeners)) = (&self.node.dns, dns_listeners) {
            dns::server::serve(&proxy.dns_side(dns), listeners).map_err(|source| {
                StartError::Bind {
                    what: "DNS",
                    source,
                }
            })?;
        }
        drop(runtime);
        if let Some(local_pods) = &self.node.local_pods {
            local_pods.insert(&pod.workload, &proxy);
        }
        Ok((trigger, Arc::downgrade(&proxy)))
    }

    /// Binds the DNS proxy's listeners inside the pod (WIRE.md §1: marked,
    /// SO_REUSEPORT as the others).
    fn bind_dns(&self, netns: &PodNetns) -> Result<dns::server::Listeners, StartError> {
        let config = &self.node.config;
        let (address, ipv6) = (config.dns.address, config.inpod.ipv6_enabled);
        let (mark, reuse_port) = (config.packet_mark, config.inpod.port_reuse);
        netns
            .run_on_thread(|| dns::server::bind_listeners(address, ipv6, mark, reuse_port))
            .map_err(StartError::Netns)?
            .map_err(|source| StartError::Bind {
                what: "DNS",
                source,
            })
    }

    /// Stops a pod that left, at once. Its certificate is the state's
    /// business ([`prefetch_node_certificates`]): another pod may share it.
    fn stop(&self, served: Served) {
        self.counts.stopped(self.lock().len());
        tracing::info!(
            uid = %served.info.uid,
            pod = %served.info.workload.name,
            namespace = %served.info.workload.namespace,
            "pod proxy stopped"
        );
        self.forget(&served);
        self.drain_now(served.trigger);
    }

    /// Takes a pod's proxy out of the same-node registry, so that no new
    /// connection takes the same-node path to it.
    fn forget(&self, served: &Served) {
        if let Some(local_pods) = &self.node.local_pods {
            local_pods.remove(&served.info.workload, &served.proxy);
        }
    }

    /// Drains a pod that was removed or replaced, without grace (WIRE.md
    /// §5 removes a pod at once).
    fn drain_now(&self, trigger: DrainTrigger) {
        self.pod_runtime.data.spawn(async move {
            trigger.drain(Duration::ZERO).await;
        });
    }
}

impl PodProxies for Workloads {
    fn add(&self, pod: &PodInfo, netns: &OwnedFd) -> Result<(), StartError> {
        if self.pod_runtime.drain.is_draining() {
            return Err(StartError::Draining);
        }
        let netns = PodNetns::new(netns).map_err(StartError::Netns)?;
        let id = netns.id();
        // The same pod in the same namespace: already served (WIRE.md §5).
        if self
            .lock()
            .get(&pod.uid)
            .is_some_and(|served| served.netns == id)
        {
            return Ok(());
        }
        let (trigger, proxy) = self.start(pod, netns)?;
        let served = Served {
            info: pod.clone(),
            netns: id,
            trigger,
            proxy,
        };
        let (replaced, active) = {
            let mut pods = self.lock();
            (pods.insert(Arc::clone(&pod.uid), served), pods.len())
        };
        self.counts.started(active);
        if let Some(replaced) = replaced {
            self.counts.stopped(active);
            tracing::info!(uid = %pod.uid, "pod's network namespace changed: proxy replaced");
            self.forget(&replaced);
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
        let removed = self.lock().remove(uid);
        if let Some(served) = removed {
            self.stop(served);
        }
    }

    fn retain(&self, keep: &HashSet<Arc<str>>) {
        let gone: Vec<Served> = {
            let mut pods = self.lock();
            let uids: Vec<Arc<str>> = pods
                .keys()
                .filter(|uid| !keep.contains(*uid))
                .cloned()
                .collect();
            uids.iter().filter_map(|uid| pods.remove(uid)).collect()
        };
        for served in gone {
            self.stop(served);
        }
    }

    fn served(&self) -> Vec<Arc<str>> {
        let mut uids: Vec<Arc<str>> = self.lock().keys().cloned().collect();
        uids.sort();
        uids
    }

    fn pending(&self, count: usize) {
        self.counts.pending(count);
    }
}

/// Keeps the certificates of the node's meshed workloads as the state
/// changes: prefetched when a workload arrives, so that a pod's first
/// connection does not wait for the CA, and forgotten when the last
/// workload with that identity leaves. Ends with the drain.
pub async fn prefetch_node_certificates(
    state: SharedState,
    identities: IdentityManager,
    node_name: Option<String>,
    drain: DrainWatcher,
) {
    let mut changes = state.subscribe();
    let mut known = HashSet::new();
    loop {
        let current = node_identities(&state.read(), node_name.as_deref());
        for gone in known.difference(&current) {
            identities.forget(gone);
        }
        for arrived in current.difference(&known) {
            identities.prefetch(arrived.clone());
        }
        known = current;
        tokio::select! {
            () = drain.signaled() => return,
            changed = changes.changed() => if changed.is_err() { return },
        }
    }
}

/// The identities of the meshed (HBONE) workloads on `node` (every
/// workload's when `None`), through the store's node index.
fn node_identities(state: &State, node: Option<&str>) -> HashSet<Identity> {
    let hbone_identity = |workload: &Arc<Workload>| {
        (workload.protocol == InboundProtocol::Hbone).then(|| workload.identity.clone())
    };
    match node {
        Some(node) => state
            .workloads_on_node(node)
            .filter_map(hbone_identity)
            .collect(),
        None => state.workloads().filter_map(hbone_identity).collect(),
    }
}
