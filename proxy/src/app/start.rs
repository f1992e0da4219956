//! Start-up, on two runtimes: a small control runtime (configuration
//! reload or the xDS client, the CA, admin, stats, readiness, the ZDS
//! session) and the
//! data-plane runtime with `ZTUNNEL_WORKER_THREADS` workers that moves the
//! bytes. What both modes share is here; `dedicated.rs` and `shared.rs`
//! start their listeners.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use tokio::runtime::Runtime;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use ztunnel_certs::error_chain::ErrorChain;

use crate::admin::{self, Admin};
use crate::app::dump::Dump;
use crate::app::{self, Node, dedicated, shared};
use crate::capacity::Capacity;
use crate::config::{Config, ProxyMode};
use crate::context::{self, LocalPods, NodeRuntime};
use crate::discovery;
use crate::dns::server::Dns;
use crate::drain::{self, DrainTrigger};
use crate::hbone::H2Settings;
use crate::identity::manager::IdentityManager;
use crate::inpod::workloads::Workloads;
use crate::inpod::zds::ProtocolError;
use crate::memory;
use crate::metrics;
use crate::pool::PoolConfig;
use crate::readiness::{self, Ready};
use crate::resolve::{self, Resolver};
use crate::revocation;
use crate::socket::{Keepalive, LocalSockets};
use crate::state::SharedState;
use crate::telemetry::{self, LogHandle, LogOptions};
use crate::xds::{self, XdsClient, XdsMetrics};

/// Runs the proxy until it is drained (SIGTERM, SIGINT or `/quitquitquit`),
/// or until a fatal error, which is returned.
pub fn run(config: Config) -> anyhow::Result<()> {
    let logs = telemetry::init(&LogOptions {
        filter: config.log_filter.clone(),
        format: config.log_format,
    })?;
    raise_open_file_limit();
    let control = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("control")
        .enable_all()
        .build()?;
    let data = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(config.worker_threads)
        .thread_name("data")
        .enable_all()
        .build()?;

    let config = Arc::new(config);
    let (state, version) = app::initial_state(&config)?;
    // The file's parse freed far more than the state keeps.
    memory::give_back();
    // The dedicated workload's identity is the CA client's own; the shared
    // mode impersonates every pod.
    let dedicated = match &config.mode {
        ProxyMode::Dedicated(workload) => Some((
            workload.clone(),
            context::local_identity(&state, workload, &config)?,
        )),
        ProxyMode::Shared => None,
    };
    let state = SharedState::new(state);
    let (trigger, watcher) = drain::channel();
    let crl = match &config.crl_path {
        Some(path) => Some((path.clone(), revocation::load(path)?)),
        None => None,
    };

    let control_guard = control.enter();
    let own_identity = dedicated.as_ref().map(|(_, identity)| identity.clone());
    let client = app::ca_client(&config, own_identity)?;
    let manager_drain = watcher.clone();
    let (identities, manager_task) =
        IdentityManager::new(client, async move { manager_drain.signaled().await });
    control.spawn(manager_task);
    if let Some((path, installed)) = crl {
        control.spawn(revocation::watch(path, installed, watcher.clone()));
    }
    // With xDS too, the file only seeds the state (istio/ztunnel reads it
    // once): a reload would take back what xDS delivered since.
    let reloaded = if config.xds.is_none() { version } else { None };
    if let (Some(path), Some(version)) = (config.local_xds_path.clone(), reloaded) {
        let stop = watcher.clone();
        control.spawn(discovery::watch_local_file(
            path,
            version,
            state.clone(),
            discovery::LOCAL_FILE_POLL,
            async move { stop.signaled().await },
        ));
    }
    drop(control_guard);

    let (mut registry, metrics) = app::metrics_registry(&config.istio_version);
    let xds_metrics = XdsMetrics::register(&mut registry);
    let capacity = Capacity::register(
        &mut registry,
        config.max_connections,
        config.min_connections_per_pod,
    );
    metrics::register_process_and_runtime(&mut registry, data.handle().clone());
    let dns = Dns::from_config(&config, &mut registry);
    // The same-node path is between the pods of the shared mode.
    let same_node = matches!(config.mode, ProxyMode::Shared) && config.inpod.same_node_shortcut;
    let (demand, demands) = match &config.xds {
        Some(xds) if xds.on_demand => {
            let (demand, demands) = xds::demand::channel();
            (Some(demand), Some(demands))
        }
        _ => (None, None),
    };
    let runtime = NodeRuntime {
        config: Arc::clone(&config),
        state,
        identities,
        metrics: Arc::new(metrics),
        resolver: Resolver::from_resolv_conf(
            Path::new(resolve::RESOLV_CONF),
            config.inpod.ipv6_enabled,
        ),
        capacity,
        dns,
        h2: H2Settings::from(&config.http2),
        pool: PoolConfig::from(&config.pool),
        local_pods: same_node.then(|| Arc::new(LocalPods::default())),
        demand,
    };
    let node = Node {
        runtime: Arc::new(runtime),
        control,
        data,
        ready: Ready::new(),
        drain: watcher,
        trigger,
    };
    start_xds(&node, xds_metrics, demands)?;
    let started = match dedicated {
        Some((workload, identity)) => dedicated::start(&node, workload, identity)?,
        None => shared::start(&node, &mut registry)?,
    };
    let quit_requests = serve_operations(&node, registry, logs, started.pods.clone())?;
    tracing::info!(mode = ?config.mode, "ztunnel serving");

    // The drain counts the watchers still held: this function keeps none.
    let Node {
        control,
        drain,
        trigger,
        ..
    } = node;
    drop(drain);
    wait_and_drain(&control, trigger, quit_requests, started.session, &config)
}

/// Starts the xDS client when one is configured, taking the data path's
/// `demands` on demand. Its readiness tasks are registered here, before
/// the readiness server starts.
fn start_xds(
    node: &Node,
    metrics: XdsMetrics,
    demands: Option<tokio::sync::mpsc::Receiver<xds::demand::Demanded>>,
) -> anyhow::Result<()> {
    let Some(settings) = &node.runtime.config.xds else {
        return Ok(());
    };
    let client = XdsClient::new(
        settings,
        &node.runtime.config.cluster_id,
        node.runtime.state.clone(),
        metrics,
        &node.ready,
    )
    .context("xDS client configuration")?;
    let client = match demands {
        Some(demands) => client.with_demands(demands),
        None => client,
    };
    node.control.spawn(client.run(node.drain.clone()));
    Ok(())
}

/// Binds and serves admin (15000), stats (15020) and readiness (15021) in
/// the proxy's own namespace, unmarked: nothing captures them. Returns the
/// channel `/quitquitquit` writes to.
fn serve_operations(
    node: &Node,
    registry: prometheus_client::registry::Registry,
    logs: LogHandle,
    pods: Option<Arc<Workloads>>,
) -> anyhow::Result<mpsc::Receiver<()>> {
    let _guard = node.control.enter();
    let addrs = node.runtime.config.listeners;
    let plain = LocalSockets {
        mark: None,
        keepalive: Keepalive::OFF,
    };
    let admin_listener = app::bind(&plain, addrs.admin, "admin")?;
    // Istio's admin listens on both loopbacks; a loopback without IPv6
    // (a kernel without it, or IPv6 off on `lo`) keeps only 127.0.0.1.
    let admin_ipv6 = addrs.admin_ipv6.and_then(|addr| {
        app::bind(&plain, addr, "admin")
            .inspect_err(|error| {
                tracing::info!(
                    error = %format!("{error:#}"),
                    "the admin listens on 127.0.0.1 only: the loopback has no IPv6"
                );
            })
            .ok()
    });
    let stats_listener = app::bind(&plain, addrs.stats, "stats")?;
    let readiness_listener = app::bind(&plain, addrs.readiness, "readiness")?;
    let (quit, quit_requests) = mpsc::channel::<()>(1);
    let admin = Admin {
        config: Arc::new(Dump {
            state: node.runtime.state.clone(),
            identities: node.runtime.identities.clone(),
            pods,
            config: Arc::clone(&node.runtime.config),
        }),
        logs,
        quit: Arc::new(move || {
            // Full means a quit is already on its way.
            let _ = quit.try_send(());
        }),
    };
    let drain = &node.drain;
    if let Some(listener) = admin_ipv6 {
        node.control
            .spawn(admin::serve_admin(listener, admin.clone(), drain.clone()));
    }
    node.control
        .spawn(admin::serve_admin(admin_listener, admin, drain.clone()));
    node.control.spawn(admin::serve_stats(
        stats_listener,
        Arc::new(registry),
        drain.clone(),
    ));
    node.control.spawn(readiness::serve(
        readiness_listener,
        node.ready.clone(),
        drain.clone(),
    ));
    Ok(quit_requests)
}

/// Waits for a signal, `/quitquitquit` or a fatal error, then drains.
fn wait_and_drain(
    control: &Runtime,
    trigger: DrainTrigger,
    mut quit_requests: mpsc::Receiver<()>,
    session: Option<JoinHandle<Result<(), ProtocolError>>>,
    config: &Config,
) -> anyhow::Result<()> {
    let deadline = config.drain_deadline;
    control.block_on(async move {
        let session_end = async {
            match session {
                Some(session) => session.await,
                None => std::future::pending().await,
            }
        };
        let fatal_error = tokio::select! {
            () = app::wait_for_signal() => None,
            _ = quit_requests.recv() => {
                tracing::info!("/quitquitquit: draining");
                None
            }
            ended = session_end => {
                let error = match ended {
                    Ok(Ok(())) => anyhow::anyhow!("the ZDS session ended"),
                    Ok(Err(error)) => anyhow::Error::new(error).context("ZDS protocol error"),
                    Err(error) => anyhow::Error::new(error).context("the ZDS session failed"),
                };
                tracing::error!("{}: draining and exiting", ErrorChain(&*error));
                Some(error)
            }
        };
        let outcome = trigger.drain(deadline).await;
        tracing::info!(?outcome, "drain finished");
        match fatal_error {
            Some(error) => Err(error).context("fatal"),
            None => Ok(()),
        }
    })
}

/// Raises the soft open-file limit to the hard limit: every proxied
/// connection holds two descriptors.
fn raise_open_file_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => {
            if let Err(error) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
                tracing::warn!(error = %ErrorChain(&error), "cannot raise the open-file limit");
            }
        }
        Ok(_) => {}
        Err(error) => {
            tracing::warn!(error = %ErrorChain(&error), "cannot read the open-file limit")
        }
    }
}
