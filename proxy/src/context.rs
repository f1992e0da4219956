//! What the data path's connection handlers share: the [`NodeRuntime`]
//! every proxy of the node holds (configuration, state, certificates,
//! metrics, resolver, connection bound, DNS proxy, HBONE settings, the
//! same-node registry), and the [`Proxy`] of one served workload (its
//! sockets, pool, trackers and drain) with how it finds that workload.
//! Outbound (`outbound.rs`) and inbound (`inbound/`) depend on this module;
//! `app` only assembles it.

use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use ztunnel_certs::identity::{Identity, IdentityError};
use ztunnel_certs::tls::TrustRoots;

use crate::capacity::{Capacity, Share};
use crate::config::{Config, WorkloadInfo};
use crate::dns::{self, server::Dns};
use crate::drain::DrainWatcher;
use crate::hbone::H2Settings;
use crate::identity::manager::IdentityManager;
use crate::metrics::{Metrics, Reporter};
use crate::pool::{Pool, PoolConfig};
use crate::resolve::Resolver;
use crate::revocation::RevocationWatch;
use crate::socket::SocketFactory;
use crate::state::{SharedState, State, Workload};
use crate::tracker::{OutboundTracker, Shown, Tracker};
use crate::xds::demand::Demand;

mod local_pods;

pub use local_pods::LocalPods;

/// How long a peer may take to finish the TLS handshake: bounds the sockets
/// a slow or hostile client can hold open before it is identified.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long dialing an upstream (application or peer ztunnel) may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// What every proxy of the node shares, built once at start and handed to
/// each proxy behind an `Arc`: a node-wide service is one field here, set
/// in `app/start.rs`. What belongs to one workload is in [`Proxy`].
pub struct NodeRuntime {
    /// The configuration.
    pub config: Arc<Config>,
    /// Workloads, services and policies.
    pub state: SharedState,
    /// Certificates of every identity the node serves.
    pub identities: IdentityManager,
    /// Traffic metrics.
    pub metrics: Arc<Metrics>,
    /// Looks up the addresses of endpoints known by hostname, in ztunnel's
    /// own network namespace.
    pub resolver: Resolver,
    /// The bound on connections the process carries, shared among the
    /// pods.
    pub capacity: Arc<Capacity>,
    /// The DNS proxy whose listeners each proxy gets; `None` when it is off.
    pub dns: Option<Arc<Dns>>,
    /// HBONE HTTP/2 settings.
    pub h2: H2Settings,
    /// The limits of each proxy's pool of outbound HBONE connections.
    pub pool: PoolConfig,
    /// The pods this process serves, for the same-node path; `None` when
    /// there is no such path (dedicated mode, or the setting off).
    pub local_pods: Option<Arc<LocalPods<Proxy>>>,
    /// Asks the xDS client for an address the state does not know
    /// (`XDS_ON_DEMAND`); `None` when every address is pushed.
    pub demand: Option<Demand>,
}

/// What every connection handler of one proxied workload shares: the
/// node's runtime and what is this workload's own.
pub struct Proxy {
    /// What the node's proxies share.
    pub node: Arc<NodeRuntime>,
    /// The workload this proxy serves.
    pub workload: WorkloadInfo,
    /// Where this workload's sockets come from (its network namespace).
    pub sockets: Arc<dyn SocketFactory>,
    /// Its part of the node's connection bound: every connection from or
    /// to it takes a slot here.
    pub share: Share,
    /// Its outbound HBONE connections.
    pub pool: Pool,
    /// Its open inbound connections, for policy re-checks and `/config_dump`.
    pub tracker: Tracker,
    /// Its open outbound connections, for `/config_dump`.
    pub outbound_tracker: OutboundTracker,
    /// Ends its tasks: the node's drain, or a child of it for one pod.
    pub drain: DrainWatcher,
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
    /// The proxy of `workload` on `node`, with its own sockets and drain,
    /// and an empty pool and trackers.
    pub fn new(
        node: Arc<NodeRuntime>,
        workload: WorkloadInfo,
        sockets: Arc<dyn SocketFactory>,
        drain: DrainWatcher,
    ) -> Proxy {
        let pool = Pool::new(node.pool);
        let share = node.capacity.join(&workload);
        Proxy {
            node,
            workload,
            sockets,
            share,
            pool,
            tracker: Tracker::default(),
            outbound_tracker: OutboundTracker::default(),
            drain,
        }
    }

    /// The open connections, for `/config_dump`.
    pub fn connections(&self) -> ConnectionsShown {
        ConnectionsShown {
            inbound: self.tracker.shown(),
            outbound: self.outbound_tracker.shown(),
        }
    }

    /// The served workload as the state knows it now.
    pub fn local_workload(&self) -> Option<Arc<Workload>> {
        self.local_workload_in(&self.node.state.read())
    }

    /// [`Proxy::local_workload`] in a state the caller already holds: the
    /// state's lock must not be taken twice by one reader.
    pub fn local_workload_in(&self, state: &State) -> Option<Arc<Workload>> {
        find_node_workload(state, &self.workload, self.node.config.node_name.as_deref())
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
            .local_workload_within(self.node.config.local_workload_wait)
            .await;
        self.node
            .metrics
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
                waited = ?self.node.config.local_workload_wait,
                "the control plane has not described this pod's workload yet; connection refused"
            ),
        }
        arrived
    }

    /// The served workload once the state describes it, waiting at most
    /// `wait`; neither logged nor counted, which is the caller's part.
    pub async fn local_workload_within(&self, wait: Duration) -> Option<Arc<Workload>> {
        self.node
            .state
            .first_within(wait, |state| self.local_workload_in(state))
            .await
    }

    /// Whether `workload` is the one this proxy serves.
    pub fn is_local(&self, workload: &Workload) -> bool {
        *workload.namespace == *self.workload.namespace && *workload.name == *self.workload.name
    }

    /// How this proxy's connections as `reporter` are watched for
    /// revocation, their peers verified against `roots`; `None` without
    /// `CRL_PATH`.
    pub fn revocation_watch(
        &self,
        reporter: Reporter,
        roots: &TrustRoots,
    ) -> Option<RevocationWatch> {
        RevocationWatch::configured(&self.node.config, &self.node.metrics, reporter, roots)
    }

    /// This proxy's side of the node's DNS proxy `dns`: its listeners
    /// answer for this proxy's workload from its namespace, until its drain.
    pub fn dns_side(&self, dns: &Arc<Dns>) -> Arc<dns::server::Served> {
        Arc::new(dns::server::Served {
            dns: Arc::clone(dns),
            config: Arc::clone(&self.node.config),
            state: self.node.state.clone(),
            workload: self.workload.clone(),
            sockets: Arc::clone(&self.sockets),
            drain: self.drain.clone(),
        })
    }

    /// A random number that spreads connections over endpoints.
    pub fn pick(&self) -> u64 {
        rand::rng().random()
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
