//! The tasks of one proxy, started alike in both modes: its three capture
//! listeners (outbound 15001, inbound plaintext 15006, inbound HBONE 15008)
//! and SOCKS5 (15080) when it is on,
//! the policy re-check of its open connections, and its pool's release of
//! idle connections; or, for ztunnel's own workload, its HBONE listener
//! and the re-check alone. Where the listeners are bound (this namespace, or a
//! pod's) is the mode's business (`app/dedicated.rs`, `inpod/workloads.rs`);
//! the DNS listeners are `dns/server.rs`'s.

use std::sync::Arc;

use tokio::net::TcpListener;

use crate::context::Proxy;
use crate::inbound::{self, hbone, plaintext};
use crate::outbound;

/// One proxy's capture listeners, bound and registered with the runtime.
pub struct Listeners {
    /// Outbound capture.
    pub outbound: TcpListener,
    /// Inbound plaintext capture.
    pub inbound_plaintext: TcpListener,
    /// Inbound HBONE.
    pub inbound: TcpListener,
    /// SOCKS5 (`UNSTABLE_ENABLE_SOCKS5`), when on.
    pub socks5: Option<TcpListener>,
}

/// Spawns `proxy`'s tasks on the current runtime; each ends with the
/// proxy's drain.
pub fn spawn(proxy: &Arc<Proxy>, listeners: Listeners) {
    tokio::spawn(outbound::serve(Arc::clone(proxy), listeners.outbound));
    tokio::spawn(plaintext::serve_plaintext(
        Arc::clone(proxy),
        listeners.inbound_plaintext,
    ));
    tokio::spawn(hbone::serve_hbone(Arc::clone(proxy), listeners.inbound));
    if let Some(listener) = listeners.socks5 {
        tokio::spawn(outbound::socks5::serve(Arc::clone(proxy), listener));
    }
    tokio::spawn(inbound::recheck_policies(Arc::clone(proxy)));
    let drain = proxy.drain.clone();
    tokio::spawn(proxy.pool.clone().release_idle_until_drained(drain));
}

/// Spawns the tasks of a proxy that only receives: its HBONE listener and
/// the policy re-check of what that listener let in. It never dials a
/// tunnel, so it has no pool to release.
pub fn spawn_inbound_only(proxy: &Arc<Proxy>, inbound: TcpListener) {
    tokio::spawn(hbone::serve_hbone(Arc::clone(proxy), inbound));
    tokio::spawn(inbound::recheck_policies(Arc::clone(proxy)));
}
