//! The shared (in-pod) mode: the ZDS session with the node agent adds and
//! removes pods, and each pod's listeners live in its own network namespace
//! (`inpod/`). The one port here is ztunnel's own HBONE listener, for its
//! own pod's workload, when the pod's name, namespace and service account
//! are given.

use std::sync::Arc;

use anyhow::Context;
use prometheus_client::registry::Registry;
use ztunnel_certs::error_chain::ErrorChain;

use crate::app::{self, Node, Started};
use crate::config::WorkloadInfo;
use crate::context::Proxy;
use crate::inpod::netns::HostNetns;
use crate::inpod::workloads::{PodRuntime, Workloads, prefetch_node_certificates};
use crate::inpod::zds;
use crate::metrics::WorkloadManagerMetrics;
use crate::serve;
use crate::socket::LocalSockets;

/// Checks the capabilities the mode needs, then starts the ZDS session and
/// the certificate prefetch for the node's workloads.
/// The pod proxy counts are registered on `registry`.
pub fn start(node: &Node, registry: &mut Registry) -> anyhow::Result<Started> {
    let config = &node.runtime.config;
    let home = HostNetns::open_and_probe(config.packet_mark)
        .context("the shared mode needs CAP_SYS_ADMIN (setns) and CAP_NET_ADMIN (SO_MARK)")?;
    let pods = Arc::new(Workloads::new(
        Arc::clone(&node.runtime),
        PodRuntime {
            home,
            data: node.data.handle().clone(),
            drain: node.trigger.clone(),
        },
        WorkloadManagerMetrics::register(registry),
    ));
    node.control.spawn(prefetch_node_certificates(
        node.runtime.state.clone(),
        node.runtime.identities.clone(),
        config.node_name.clone(),
        node.drain.clone(),
    ));
    // Readiness is held from here until the first snapshot is served.
    let session = zds::run(
        zds::Settings::new(config.inpod.uds.clone(), Arc::clone(&node.runtime.metrics)),
        Arc::clone(&pods) as Arc<dyn crate::inpod::PodProxies>,
        node.ready.clone(),
        node.drain.clone(),
    );
    let session = node.control.spawn(session);
    if let Some(workload) = &config.own_workload {
        serve_own_workload(node, workload.clone());
    }
    tracing::info!(uds = %config.inpod.uds.display(), "shared mode: waiting for the node agent");
    Ok(Started {
        pods: Some(pods),
        session: Some(session),
    })
}

/// Serves ztunnel's own pod as a workload, as istio/ztunnel does: HBONE on
/// `ZTUNNEL_INBOUND_ADDR` (15008) in ztunnel's own network namespace, with
/// its own identity's certificate and the policies that select it, dialling
/// its own ports (15020's metrics, say) from its own address. A listener
/// that cannot be bound is logged and the pods are served all the same:
/// unlike istio/ztunnel, which then fails to start, this is an addition
/// beside the pods' traffic, not its path.
fn serve_own_workload(node: &Node, workload: WorkloadInfo) {
    let config = &node.runtime.config;
    let sockets = LocalSockets {
        mark: config.packet_mark,
        keepalive: config.keepalive,
    };
    let addr = config.listeners.inbound;
    let data = node.data.handle();
    let _guard = data.enter();
    let listener = match app::bind(&sockets, addr, "ztunnel's own HBONE") {
        Ok(listener) => listener,
        Err(error) => {
            tracing::warn!(error = %ErrorChain(&*error), "ztunnel's own workload is not served");
            return;
        }
    };
    tracing::info!(%addr, namespace = %workload.namespace, name = %workload.name, "serving ztunnel's own workload over HBONE");
    let proxy = Arc::new(Proxy::new(
        Arc::clone(&node.runtime),
        workload,
        Arc::new(sockets),
        node.drain.clone(),
    ));
    serve::spawn_inbound_only(&proxy, listener);
}
