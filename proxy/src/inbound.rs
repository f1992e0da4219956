//! Inbound: connections arriving for a local workload, over HBONE (15008,
//! with the peer's verified identity) or as captured plaintext (15006, with
//! none). Each is admitted or refused (`inbound/decision.rs`) before the
//! application is dialled; open ones are re-checked here when policies
//! change. Which connections are open is `tracker.rs`'s.

use std::sync::Arc;

use crate::context::Proxy;
use crate::metrics::Reporter;

pub mod application;
pub mod decision;
pub mod hbone;
pub mod plaintext;
pub mod proxy_protocol;

/// Re-checks open inbound connections whenever policies or workloads
/// change (a file reload, an xDS update), closing those no longer allowed
/// (each closure logged and counted).
pub async fn recheck_policies(proxy: Arc<Proxy>) {
    let mut changes = proxy.node.state.subscribe_authorization();
    let drain = proxy.drain.clone();
    loop {
        tokio::select! {
            () = drain.signaled() => return,
            changed = changes.changed() => if changed.is_err() { return },
        }
        let state = proxy.node.state.read();
        let closed = proxy
            .tracker
            .recheck(|connection| decision::still_allowed(&state, connection));
        drop(state);
        for closed in closed {
            tracing::info!(
                src.addr = %closed.connection.source_ip,
                dst.workload = %closed.connection.destination_workload,
                reason = %closed.reason,
                "connection closed: no longer allowed by policy"
            );
            proxy
                .node
                .metrics
                .record_policy_close(Reporter::Destination);
        }
    }
}
