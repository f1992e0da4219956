//! The dedicated mode: one proxy for the workload `PROXY_WORKLOAD_INFO`,
//! with ordinary sockets in the current network namespace.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use ztunnel_certs::error_chain::ErrorChain;

use crate::app;
use crate::app::{Node, Started};
use crate::config::WorkloadInfo;
use crate::context::Proxy;
use crate::dns::{self, server::Dns};
use crate::identity::manager::IdentityManager;
use crate::outbound::socks5;
use crate::serve;
use crate::socket::LocalSockets;
use ztunnel_certs::identity::Identity;

/// Binds and serves the DNS proxy on this namespace's loopback. A port
/// already taken (another proxy or resolver on this host) is logged and
/// the rest of the proxy serves: the DNS proxy is an addition here, not
/// the path of the workload's traffic.
fn serve_dns(proxy: &Arc<Proxy>, dns: &Arc<Dns>) {
    let config = &proxy.node.config;
    let bound = dns::server::bind_listeners(
        config.dns.address,
        config.inpod.ipv6_enabled,
        config.packet_mark,
        false,
    )
    .and_then(|listeners| dns::server::serve(&proxy.dns_side(dns), listeners));
    if let Err(error) = bound {
        tracing::warn!(address = %config.dns.address, error = %ErrorChain(&error), "DNS proxy not listening");
    }
}

/// How long the readiness prefetch waits between tries; the identity
/// manager has its own backoff underneath.
const PREFETCH_RETRY: Duration = Duration::from_secs(1);

/// Binds 15001, 15006 and 15008 here and serves them for `workload`.
pub fn start(node: &Node, workload: WorkloadInfo, identity: Identity) -> anyhow::Result<Started> {
    let config = &node.runtime.config;
    let listeners_ready = node.ready.register_task("listeners");
    let certificate_ready = node.ready.register_task("local workload certificate");
    let sockets = LocalSockets {
        mark: config.packet_mark,
        keepalive: config.keepalive,
    };
    let proxy = Arc::new(Proxy::new(
        Arc::clone(&node.runtime),
        workload,
        Arc::new(sockets),
        node.drain.clone(),
    ));

    let addrs = config.listeners;
    let data = node.data.handle();
    let _guard = data.enter();
    let listeners = serve::Listeners {
        outbound: app::bind(&sockets, addrs.outbound, "outbound")?,
        inbound: app::bind(&sockets, addrs.inbound, "inbound HBONE")?,
        inbound_plaintext: app::bind(&sockets, addrs.inbound_plaintext, "inbound plaintext")?,
        socks5: match addrs.socks5 {
            Some(addr) => Some(
                socks5::bind(addr)
                    .and_then(tokio::net::TcpListener::from_std)
                    .with_context(|| format!("binding the SOCKS5 listener on {addr}"))?,
            ),
            None => None,
        },
    };
    serve::spawn(&proxy, listeners);
    if let Some(dns) = &node.runtime.dns {
        serve_dns(&proxy, dns);
    }
    drop(listeners_ready);
    tracing::info!(%identity, "dedicated proxy listening");

    node.control.spawn(prefetch_until_ready(
        node.runtime.identities.clone(),
        identity,
        node.drain.clone(),
        certificate_ready,
    ));
    Ok(Started {
        pods: None,
        session: None,
    })
}

/// Fetches the workload's certificate, retrying until it comes, then
/// releases readiness.
async fn prefetch_until_ready(
    identities: IdentityManager,
    identity: Identity,
    drain: crate::drain::DrainWatcher,
    ready: crate::readiness::BlockReady,
) {
    loop {
        match identities.fetch_certificate(&identity).await {
            Ok(_) => break,
            Err(error) => {
                tracing::warn!(error = %ErrorChain(&error), "no certificate for the local workload yet")
            }
        }
        tokio::select! {
            () = drain.signaled() => return,
            () = tokio::time::sleep(PREFETCH_RETRY) => {}
        }
    }
    drop(ready);
}
