//! The assembled proxy: the rules both modes use to build the data path's
//! context (`Proxy`, `context.rs`), and start-up
//! (`app/start.rs`, then `dedicated.rs` or `shared.rs`): state from the local
//! file or xDS, certificates from the CA, the listeners, the policy re-check, and
//! the admin, stats and readiness servers. Shutdown is one drain
//! (`drain.rs`).

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use prometheus_client::registry::Registry;
use tokio::runtime::Runtime;
use tokio::task::JoinHandle;
use ztunnel_certs::identity::Identity;

use crate::config::Config;
use crate::context::NodeRuntime;
use crate::discovery;
use crate::drain::{DrainTrigger, DrainWatcher};
use crate::identity::ca_client::{CaClient, CaClientConfig};
use crate::inpod::workloads::Workloads;
use crate::inpod::zds::ProtocolError;
use crate::metrics::Metrics;
use crate::readiness::Ready;
use crate::socket::LocalSockets;
use crate::state::State;

mod dedicated;
mod dump;
mod shared;
mod start;

pub use start::run;

/// What both modes build on: the node's runtime, and what start-up and the
/// main loop hold besides.
pub struct Node {
    /// What every proxy of the node shares.
    pub runtime: Arc<NodeRuntime>,
    /// Control-plane tasks.
    pub control: Runtime,
    /// Data-plane tasks.
    pub data: Runtime,
    /// Start-up tasks the readiness endpoint waits for.
    pub ready: Ready,
    /// The node's drain, held by every task.
    pub drain: DrainWatcher,
    /// Starts the node's drain; pods' drains are children of it.
    pub trigger: DrainTrigger,
}

/// What a mode started, for the admin view and the main loop.
pub struct Started {
    /// The shared mode's pods, for `/config_dump`.
    pub pods: Option<Arc<Workloads>>,
    /// The shared mode's ZDS session: it ends with an error that must stop
    /// the process (a protocol error), or once the drain has started.
    pub session: Option<JoinHandle<Result<(), ProtocolError>>>,
}

/// Builds the CA client from the configuration; `own_identity` is the
/// dedicated workload's, `None` in shared mode (always impersonate).
pub fn ca_client(config: &Config, own_identity: Option<Identity>) -> anyhow::Result<CaClient> {
    let ca_config = CaClientConfig {
        address: config.ca_address.clone(),
        root: config.ca_root_ca.clone(),
        token: config.auth_token.clone(),
        cluster_id: config.cluster_id.clone(),
        secret_ttl: config.secret_ttl,
        own_identity,
        server_name: None,
        alt_hostname: config.ca_alt_hostname.clone(),
        headers: config.ca_headers.clone(),
    };
    CaClient::new(&ca_config).context("CA client configuration")
}

/// Loads the initial state: from the local file when configured (an invalid
/// file fails start-up), else empty until xDS delivers it.
pub fn initial_state(config: &Config) -> anyhow::Result<(State, Option<discovery::FileVersion>)> {
    match &config.local_xds_path {
        Some(path) => {
            let (state, version) = discovery::load_local_file(path)?;
            Ok((state, Some(version)))
        }
        None => Ok((State::new(), None)),
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

/// The metrics registry with the proxy's metrics registered; `istio_build`
/// is tagged with the Istio release the proxy serves as ztunnel of.
pub fn metrics_registry(istio_version: &str) -> (Registry, Metrics) {
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry, istio_version);
    (registry, metrics)
}

/// Waits for SIGTERM or SIGINT, and logs which came.
pub async fn wait_for_signal() {
    let stop = ztunnel_process::shutdown::signal().await;
    tracing::info!("{}: draining", stop.name());
}
