//! The inbound HBONE listener (15008): TLS with the local workload's
//! certificate, the pending handshakes bounded (by the listener's own
//! limit: a handshake holds no slot of the pod's share), a slot of the
//! share once the peer is known, then the HBONE server whose handler
//! admits each CONNECT stream, each with a slot of its own, and dials the
//! application (`application.rs`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use http::HeaderValue;
use prometheus_client::metrics::gauge::Gauge;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use ztunnel_certs::cert::WorkloadCertificate;
use ztunnel_certs::error_chain::ErrorChain;

use crate::accept;
use crate::capacity::Listener;
use crate::context::{Proxy, TLS_HANDSHAKE_TIMEOUT};
use crate::copy::{CopyError, Transferred};
use crate::hbone::{
    Authority, FORWARDED, InboundHandler, InboundRefusal, InboundRequest, ServedClient,
    ServerError, X_FORWARDED_NETWORK, accept_tls, baggage, forwarded_host, serve_connection,
};
use crate::inbound::application::{AppConnection, Forwarded, close_report, open_upstream_for};
use crate::inbound::decision::Arrival;
use crate::metrics::Reporter;
use crate::report;
use crate::revocation;
use crate::socket::canonical;

/// The HBONE server's handler.
pub struct HboneInbound {
    proxy: Arc<Proxy>,
}

impl InboundHandler for HboneInbound {
    type Upstream = AppConnection;

    async fn open(&self, request: &InboundRequest) -> Result<AppConnection, InboundRefusal> {
        let local_ip = canonical(request.local_addr).ip();
        let (authority, target) = match &request.authority {
            Authority::Address(address) => {
                let address = canonical(*address);
                (Authority::Address(address), address)
            }
            Authority::Hostname { port, .. } => {
                (request.authority.clone(), SocketAddr::new(local_ip, *port))
            }
        };
        let arrival = Arrival {
            peer_identity: Some(request.peer_identity.clone()),
            source_ip: canonical(request.peer_addr).ip(),
            source_port: request.peer_addr.port(),
            local_ip,
            target,
        };
        let peer = Some(&request.peer_identity);
        // Not visible ASCII: no network we could be named by, as if absent.
        let forwarded_network = request
            .headers
            .get(X_FORWARDED_NETWORK)
            .and_then(|value| value.to_str().ok());
        let host = match &request.authority {
            Authority::Hostname { host, .. } => Some(&**host),
            Authority::Address(_) => request
                .headers
                .get(FORWARDED)
                .and_then(|value| value.to_str().ok())
                .and_then(forwarded_host),
        };
        let baggage = self.proxy.node.config.response_baggage;
        let forwarded = Forwarded {
            network: forwarded_network,
            host,
            baggage: baggage.then_some(&request.headers),
        };
        let proxy = &self.proxy;
        let Some(slot) = proxy.share.admit(Listener::HboneStream) else {
            return Err(InboundRefusal::Unavailable("connection limit reached"));
        };
        let mut upstream =
            open_upstream_for(proxy, &arrival, &authority, forwarded, peer, false).await?;
        upstream.slot = Some(slot);
        upstream.revocation = request.revocation.clone();
        Ok(upstream)
    }

    fn response_baggage(&self, upstream: &AppConnection) -> Option<HeaderValue> {
        if !self.proxy.node.config.response_baggage {
            return None;
        }
        // Labels that cannot be a header value (the state refuses none so
        // far) leave the answer without baggage rather than unanswered.
        baggage(&report::baggage_labels(&upstream.workload)).ok()
    }

    fn stop(upstream: &AppConnection) -> CancellationToken {
        upstream.stop.clone()
    }

    fn closed(&self, mut upstream: AppConnection, result: Result<Transferred, CopyError>) {
        close_report(&mut upstream, &result);
    }
}

/// A connection counted against its listener's handshake limit until it
/// is dropped, after the TLS handshake (or its failure).
struct PendingHandshake {
    _permit: OwnedSemaphorePermit,
    gauge: Gauge,
}

/// Pending handshakes (over all listeners, as the gauge counts them) from
/// which their end counts as the end of a flood, whose memory is then given
/// back to the system.
const FLOOD: i64 = 256;

/// Whether the pending handshakes reached [`FLOOD`] since they were last
/// all done.
static FLOODED: AtomicBool = AtomicBool::new(false);

impl PendingHandshake {
    fn new(permit: OwnedSemaphorePermit, gauge: Gauge) -> Self {
        if gauge.inc() + 1 >= FLOOD {
            FLOODED.store(true, Ordering::Relaxed);
        }
        Self {
            _permit: permit,
            gauge,
        }
    }
}

impl Drop for PendingHandshake {
    fn drop(&mut self) {
        // The last pending handshake of a flood: the tasks of thousands of
        // silent connections were freed on this worker, and the allocator
        // would keep their pages until it needs them again.
        if self.gauge.dec() == 1 && FLOODED.swap(false, Ordering::Relaxed) {
            crate::memory::give_back_soon();
        }
    }
}

/// Accepts HBONE connections until the drain; each is served on its own
/// task. At most `max_pending_handshakes` wait for their TLS handshake at
/// once; beyond that a new connection is closed at once and counted.
pub async fn serve_hbone(proxy: Arc<Proxy>, listener: TcpListener) {
    let handler = Arc::new(HboneInbound {
        proxy: Arc::clone(&proxy),
    });
    let drain = proxy.drain.clone();
    let limit = proxy.node.config.max_pending_handshakes;
    let pending = Arc::new(Semaphore::new(limit));
    let gauge = proxy.node.metrics.pending_handshakes();
    // Whether the limit was hit since the last connection it let in: one
    // warning per episode, not one per connection of a flood.
    let mut at_limit = false;
    let metrics = Arc::clone(&proxy.node.metrics);
    // A pending handshake holds no slot of the connection bound: this
    // limit bounds them, and the slot is taken once the peer is known.
    let admit = || {
        let Ok(permit) = Arc::clone(&pending).try_acquire_owned() else {
            metrics.record_handshake_refused("pending_limit");
            if !at_limit {
                at_limit = true;
                tracing::warn!(
                    limit,
                    "too many HBONE handshakes pending on this listener; closing new connections until some finish"
                );
            }
            return None;
        };
        at_limit = false;
        Some(PendingHandshake::new(permit, gauge.clone()))
    };
    accept::serve(listener, "hbone", drain, &metrics, admit, |tcp, peer, waiting| {
        let proxy = Arc::clone(&proxy);
        let handler = Arc::clone(&handler);
        tokio::spawn(async move {
            // Nothing of the handshake (workload lookup, certificate, TLS
            // state and its buffers) exists until the client has sent a
            // byte: a silent connection costs this small task only. A peek,
            // not a readiness wait, which can wake without data.
            let mut first = [0u8; 1];
            match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, tcp.peek(&mut first)).await {
                Ok(Ok(0)) => {
                    tracing::debug!(%peer, "HBONE client closed before sending anything");
                    return;
                }
                Ok(Ok(_)) => {}
                Ok(Err(error)) => {
                    tracing::debug!(%peer, %error, "HBONE connection failed before its first byte");
                    return;
                }
                Err(_) => {
                    // Debug only: a flood of these would be a flood of lines.
                    tracing::debug!(%peer, timeout = ?TLS_HANDSHAKE_TIMEOUT, "HBONE client sent nothing; closed");
                    return;
                }
            }
            Box::pin(handshake_and_serve(proxy, handler, tcp, peer, waiting)).await;
        });
    })
    .await;
}

/// The TLS handshake of an HBONE connection whose client has started
/// talking, then the HBONE server on it.
async fn handshake_and_serve(
    proxy: Arc<Proxy>,
    handler: Arc<HboneInbound>,
    tcp: TcpStream,
    peer: SocketAddr,
    waiting: PendingHandshake,
) {
    let local = match tcp.local_addr() {
        Ok(local) => local,
        Err(_) => return,
    };
    let Some(workload) = proxy.wait_for_local_workload(Reporter::Destination).await else {
        tracing::warn!(%peer, "HBONE connection before the local workload is known");
        return;
    };
    let certificate = proxy
        .node
        .identities
        .fetch_certificate(&workload.identity)
        .await;
    let watch =
        |cert: &WorkloadCertificate| proxy.revocation_watch(Reporter::Destination, cert.roots());
    let (config, watch) = match certificate.map(|cert| (cert.server_config(), watch(&cert))) {
        Ok((Ok(config), watch)) => (config, watch),
        Ok((Err(error), _)) => {
            tracing::warn!(error = %ErrorChain(&error), "cannot build the HBONE server TLS config");
            return;
        }
        Err(error) => {
            tracing::warn!(error = %ErrorChain(&error), "no certificate for the local workload");
            return;
        }
    };
    let accepted = accept_tls(tcp, config, TLS_HANDSHAKE_TIMEOUT).await;
    drop(waiting);
    let (tls, client) = match accepted {
        Ok(accepted) => accepted,
        Err(error) => {
            if let ServerError::Tls(handshake) = &error
                && revocation::revoked(handshake)
            {
                proxy
                    .node
                    .metrics
                    .record_crl_rejection(Reporter::Destination);
            }
            tracing::warn!(%peer, error = %ErrorChain(&error), "HBONE TLS handshake failed");
            return;
        }
    };
    let Some(slot) = proxy.share.admit(Listener::Hbone) else {
        // Closed, as a connection over the bound is on the other listeners.
        return;
    };
    let watched = watch.and_then(|watch| watch.watch(client.chain, &client.identity));
    let client = ServedClient {
        identity: client.identity,
        watched,
    };
    let drain = proxy.drain.clone();
    if let Err(error) =
        serve_connection(tls, client, (peer, local), &proxy.node.h2, handler, drain).await
    {
        tracing::debug!(%peer, error = %ErrorChain(&error), "HBONE connection ended with an error");
    }
    drop(slot);
}
