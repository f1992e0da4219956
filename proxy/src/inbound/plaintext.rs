//! The inbound plaintext listener (15006): captured connections without
//! HBONE, each admitted by its original destination with no peer identity,
//! then copied to the application (`application.rs`).

use std::sync::Arc;

use tokio::net::TcpListener;

use crate::accept;
use crate::capacity::Listener;
use crate::context::Proxy;
use crate::copy::copy_bidirectional_until;
use crate::inbound::application::{Forwarded, close_report, open_upstream};
use crate::inbound::decision::Arrival;
use crate::socket::{canonical, original_destination};

/// Accepts captured plaintext connections until the drain.
pub async fn serve_plaintext(proxy: Arc<Proxy>, listener: TcpListener) {
    let (drain, metrics) = (proxy.drain.clone(), Arc::clone(&proxy.node.metrics));
    accept::serve(
        listener,
        "inbound_plaintext",
        drain,
        &metrics,
        || proxy.share.admit(Listener::InboundPlaintext),
        |mut tcp, peer, slot| {
            let proxy = Arc::clone(&proxy);
            tokio::spawn(async move {
                let target = match original_destination(&tcp) {
                    Ok(target) => target,
                    Err(error) => {
                        tracing::warn!(%peer, %error, "no original destination on 15006");
                        return;
                    }
                };
                let arrival = Arrival {
                    peer_identity: None,
                    source_ip: canonical(peer).ip(),
                    source_port: peer.port(),
                    local_ip: target.ip(),
                    target,
                };
                // A refusal closes the connection (dropping it), as istio does.
                // Boxed: the admission and dial state is freed before the copy,
                // not carried in the task for the connection's life.
                let Ok(mut upstream) = Box::pin(open_upstream(
                    &proxy,
                    &arrival,
                    Forwarded::default(),
                    None,
                    false,
                ))
                .await
                else {
                    return;
                };
                let stop = upstream.stop.clone();
                let result =
                    copy_bidirectional_until(&mut tcp, &mut upstream, stop.cancelled()).await;
                close_report(&mut upstream, &result);
                drop(slot);
            });
        },
    )
    .await;
}
