//! Start-up of a dedicated proxy, on two runtimes: a small control runtime
//! (configuration reload, the CA, admin, stats, readiness) and the data-plane
//! runtime with `ZTUNNEL_WORKER_THREADS` workers that moves the bytes.

use std::sync::Arc;
use std::time::SystemTime;

use anyhow::bail;
use serde_json::json;
use tokio::sync::mpsc;
use ztunnel_certs::identity::Identity;

use crate::admin::{self, Admin, ConfigDump};
use crate::app::{self, Proxy, find_workload};
use crate::config::{Config, ProxyMode};
use crate::discovery::{self, SharedState};
use crate::drain;
use crate::identity::manager::IdentityManager;
use crate::inbound::listeners;
use crate::inbound::tracker::Tracker;
use crate::outbound;
use crate::pool::Pool;
use crate::readiness::{self, Ready};
use crate::socket::{LocalSockets, SocketFactory};
use crate::telemetry::{self, LogOptions};

/// Runs the proxy until it is drained (SIGTERM, SIGINT or `/quitquitquit`).
pub fn run(config: Config) -> anyhow::Result<()> {
    let ProxyMode::Dedicated(workload) = config.mode.clone() else {
        bail!("PROXY_MODE=shared (in-pod) is not available yet; use PROXY_MODE=dedicated");
    };
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
    let (state, text) = app::initial_state(&config)?;
    let identity = match find_workload(&state, &workload) {
        Some(found) => found.identity()?,
        None => Identity::new(
            &config.trust_domain,
            &workload.namespace,
            &workload.service_account,
        )?,
    };
    let state = SharedState::new(state);
    let (trigger, watcher) = drain::channel();
    let ready = Ready::new();
    let listeners_ready = ready.register_task("listeners");
    let certificate_ready = ready.register_task("local workload certificate");

    let control_guard = control.enter();
    let client = app::ca_client(&config, identity.clone())?;
    let manager_drain = watcher.clone();
    let (identities, manager_task) =
        IdentityManager::new(client, async move { manager_drain.signaled().await });
    control.spawn(manager_task);

    let (registry, metrics) = app::metrics_registry();
    let sockets: Arc<dyn SocketFactory> = Arc::new(LocalSockets {
        mark: config.packet_mark,
    });
    let proxy = Arc::new(Proxy {
        config: Arc::clone(&config),
        state: state.clone(),
        identities: identities.clone(),
        metrics: Arc::new(metrics),
        sockets: Arc::clone(&sockets),
        h2: app::h2_settings(&config),
        pool: Pool::new(app::pool_config(&config)),
        tracker: Tracker::default(),
        workload,
        drain: watcher.clone(),
    });

    if let (Some(path), Some(text)) = (config.local_xds_path.clone(), text) {
        let stop = watcher.clone();
        control.spawn(discovery::watch_local_file(
            path,
            text,
            state.clone(),
            discovery::LOCAL_FILE_POLL,
            async move { stop.signaled().await },
        ));
    }

    // Control-plane servers, unmarked: nothing captures them.
    let addrs = config.listeners;
    let plain = LocalSockets { mark: None };
    let admin_listener = app::bind(&plain, addrs.admin, "admin")?;
    let stats_listener = app::bind(&plain, addrs.stats, "stats")?;
    let readiness_listener = app::bind(&plain, addrs.readiness, "readiness")?;
    let (quit, mut quit_requests) = mpsc::channel::<()>(1);
    let admin = Admin {
        config: Arc::new(Dump {
            proxy: Arc::clone(&proxy),
        }),
        logs,
        quit: Arc::new(move || {
            // Full means a quit is already on its way.
            let _ = quit.try_send(());
        }),
    };
    control.spawn(admin::serve_admin(admin_listener, admin, watcher.clone()));
    control.spawn(admin::serve_stats(
        stats_listener,
        Arc::new(registry),
        watcher.clone(),
    ));
    control.spawn(readiness::serve(readiness_listener, ready, watcher.clone()));
    drop(control_guard);

    // Data plane.
    let data_guard = data.enter();
    let outbound_listener = app::bind(sockets.as_ref(), addrs.outbound, "outbound")?;
    let inbound_listener = app::bind(sockets.as_ref(), addrs.inbound, "inbound HBONE")?;
    let plaintext_listener = app::bind(
        sockets.as_ref(),
        addrs.inbound_plaintext,
        "inbound plaintext",
    )?;
    data.spawn(outbound::serve(Arc::clone(&proxy), outbound_listener));
    data.spawn(listeners::serve_hbone(Arc::clone(&proxy), inbound_listener));
    data.spawn(listeners::serve_plaintext(
        Arc::clone(&proxy),
        plaintext_listener,
    ));
    data.spawn(app::recheck_policies(Arc::clone(&proxy)));
    data.spawn(
        proxy
            .pool
            .clone()
            .release_idle_until_drained(watcher.clone()),
    );
    drop(data_guard);
    drop(listeners_ready);
    tracing::info!(%identity, "ztunnel serving");

    let prefetch = identities.clone();
    let prefetch_drain = watcher.clone();
    control.spawn(async move {
        // Readiness waits for the first certificate; the manager retries
        // with backoff meanwhile.
        loop {
            match prefetch.fetch_certificate(&identity).await {
                Ok(_) => break,
                Err(error) => tracing::warn!(%error, "no certificate for the local workload yet"),
            }
            tokio::select! {
                () = prefetch_drain.signaled() => return,
                () = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
            }
        }
        drop(certificate_ready);
    });
    // The drain counts the watchers still held: this function keeps none.
    drop(proxy);
    drop(watcher);
    let deadline = config.drain_deadline;
    control.block_on(async move {
        tokio::select! {
            () = app::wait_for_signal() => {}
            _ = quit_requests.recv() => tracing::info!("/quitquitquit: draining"),
        }
        let outcome = trigger.drain(deadline).await;
        tracing::info!(?outcome, "drain finished");
    });
    Ok(())
}

/// `/config_dump`: workloads, services, policies and certificates (identity
/// and validity only, never keys).
struct Dump {
    proxy: Arc<Proxy>,
}

impl ConfigDump for Dump {
    fn config_dump(&self) -> serde_json::Value {
        let state = self.proxy.state.read();
        let workloads: Vec<_> = state
            .workloads()
            .map(|workload| {
                json!({
                    "uid": &*workload.uid,
                    "name": &*workload.name,
                    "namespace": &*workload.namespace,
                    "addresses": workload.addresses.iter().map(ToString::to_string).collect::<Vec<_>>(),
                    "protocol": format!("{:?}", workload.protocol),
                    "serviceAccount": &*workload.service_account,
                    "node": &*workload.node,
                    "status": format!("{:?}", workload.status),
                })
            })
            .collect();
        let services: Vec<_> = state
            .services()
            .map(|service| {
                json!({
                    "name": &*service.name,
                    "namespace": &*service.namespace,
                    "hostname": &*service.hostname,
                })
            })
            .collect();
        let policies: Vec<_> = state
            .policies()
            .map(|(key, policy)| {
                json!({
                    "key": &**key,
                    "name": &*policy.name,
                    "namespace": &*policy.namespace,
                    "action": format!("{:?}", policy.action),
                    "scope": format!("{:?}", policy.scope),
                    "dryRun": policy.dry_run,
                })
            })
            .collect();
        let certificates: Vec<_> = self
            .proxy
            .identities
            .snapshot()
            .into_iter()
            .map(|summary| {
                json!({
                    "identity": summary.identity.as_str(),
                    "state": format!("{:?}", summary.state),
                    "notBefore": summary.not_before.map(seconds),
                    "notAfter": summary.not_after.map(seconds),
                    "refreshAt": summary.refresh_at.map(seconds),
                })
            })
            .collect();
        json!({
            "workloads": workloads,
            "services": services,
            "policies": policies,
            "certificates": certificates,
        })
    }
}

/// Seconds since the epoch, for the dump.
fn seconds(time: SystemTime) -> u64 {
    time.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs())
}

/// Raises the soft open-file limit to the hard limit: every proxied
/// connection holds two descriptors.
fn raise_open_file_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => {
            if let Err(error) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
                tracing::warn!(%error, "cannot raise the open-file limit");
            }
        }
        Ok(_) => {}
        Err(error) => tracing::warn!(%error, "cannot read the open-file limit"),
    }
}
