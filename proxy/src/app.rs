//! The assembled proxy: what every listener of one workload shares
//! ([`Proxy`]), the rules both modes use to build it, and start-up
//! (`app/start.rs`, then `dedicated.rs` or `shared.rs`): state from the local
//! file or xDS, certificates from the CA, the listeners, the policy re-check, and
//! the admin, stats and readiness servers. Shutdown is one drain
//! (`drain.rs`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use prometheus_client::registry::Registry;
use rand::Rng;
use ztunnel_certs::identity::{Identity, IdentityError};

use crate::config::{Config, WorkloadInfo};
use crate::discovery::{self, SharedState};
use crate::drain::DrainWatcher;
use crate::hbone::H2Settings;
use crate::identity::ca_client::{CaClient, CaClientConfig};
use crate::identity::manager::IdentityManager;
use crate::inbound::tracker::Tracker;
use crate::metrics::{Metrics, Reporter};
use crate::pool::{Pool, PoolConfig};
use crate::socket::{LocalSockets, SocketFactory};
use crate::state::{State, Workload};

mod dedicated;
mod dump;
mod shared;
mod start;

pub use start::run;

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
    /// Open inbound connections, for policy re-checks.
    pub tracker: Tracker,
    /// The workload this proxy serves.
    pub workload: WorkloadInfo,
    /// Ends every task.
    pub drain: DrainWatcher,
}

impl Proxy {
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
        // Subscribed before looking again, so a push in between is seen.
        let mut changes = self.state.subscribe();
        let started = tokio::time::Instant::now();
        let deadline = started + self.config.local_workload_wait;
        loop {
            if let Some(workload) = self.local_workload() {
                self.metrics.record_workload_wait(reporter, true);
                tracing::debug!(
                    namespace = %self.workload.namespace,
                    name = %self.workload.name,
                    waited = ?started.elapsed(),
                    "the local workload arrived"
                );
                return Some(workload);
            }
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Ok(Ok(())) => {}
                // The deadline, or the state's sender gone (shutting down).
                Ok(Err(_)) | Err(_) => break,
            }
        }
        self.metrics.record_workload_wait(reporter, false);
        tracing::warn!(
            namespace = %self.workload.namespace,
            name = %self.workload.name,
            waited = ?self.config.local_workload_wait,
            "the control plane has not described this pod's workload yet; connection refused"
        );
        None
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

/// The pool limits from the configuration.
pub fn pool_config(config: &Config) -> PoolConfig {
    PoolConfig {
        max_streams_per_connection: config.pool.max_streams_per_connection as usize,
        max_connections_per_key: config.pool.max_connections_per_key,
        unused_release_timeout: config.pool.unused_release_timeout,
        ..PoolConfig::default()
    }
}

/// HTTP/2 settings from the configuration.
pub fn h2_settings(config: &Config) -> H2Settings {
    H2Settings {
        stream_window: config.http2.stream_window,
        connection_window: config.http2.connection_window,
        max_frame_size: config.http2.frame_size,
        client_send_buffer: config.http2.stream_window as usize,
        ..H2Settings::default()
    }
}

/// Builds the CA client from the configuration; `own_identity` is the
/// dedicated workload's, `None` in shared mode (always impersonate).
pub fn ca_client(config: &Config, own_identity: Option<Identity>) -> anyhow::Result<CaClient> {
    let ca_config = CaClientConfig {
        address: config.ca_address.clone(),
        root_ca: config.ca_root_ca.clone(),
        token: Some(config.auth_token.clone()),
        cluster_id: config.cluster_id.clone(),
        secret_ttl: config.secret_ttl,
        own_identity,
        server_name: None,
    };
    CaClient::new(&ca_config).context("CA client configuration")
}

/// Loads the initial state: from the local file when configured (an invalid
/// file fails start-up), else empty until xDS delivers it.
pub fn initial_state(config: &Config) -> anyhow::Result<(State, Option<discovery::FileDigest>)> {
    match &config.local_xds_path {
        Some(path) => {
            let (state, digest) = discovery::load_local_file(path)?;
            Ok((state, Some(digest)))
        }
        None => Ok((State::new(), None)),
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

/// Binds a listener or says which address failed.
pub fn bind(
    sockets: &LocalSockets,
    addr: SocketAddr,
    what: &str,
) -> anyhow::Result<tokio::net::TcpListener> {
    sockets
        .tcp_listener(addr)
        .with_context(|| format!("binding the {what} listener on {addr}"))
}

/// The metrics registry with the proxy's metrics registered.
pub fn metrics_registry() -> (Registry, Metrics) {
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry, env!("CARGO_PKG_VERSION"));
    (registry, metrics)
}

/// Waits for SIGTERM or SIGINT.
pub async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot listen for SIGTERM/SIGINT; stop with /quitquitquit");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: draining"),
        _ = int.recv() => tracing::info!("SIGINT: draining"),
    }
}
