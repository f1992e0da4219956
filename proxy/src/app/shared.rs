//! The shared (in-pod) mode: no pod ports here; the ZDS session with the
//! node agent adds and removes pods, and each pod's listeners live in its
//! own network namespace (`inpod/`).

use std::sync::Arc;

use anyhow::Context;
use prometheus_client::registry::Registry;

use crate::app::{Node, Started};
use crate::inpod::netns::HostNetns;
use crate::inpod::workloads::{PodRuntime, Workloads, prefetch_node_certificates};
use crate::inpod::zds;
use crate::metrics::WorkloadManagerMetrics;

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
    tracing::info!(uds = %config.inpod.uds.display(), "shared mode: waiting for the node agent");
    Ok(Started {
        pods: Some(pods),
        session: Some(session),
    })
}
