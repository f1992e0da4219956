//! The serve loop the agent's two HTTP/1.1 servers share: the plugin's
//! events on the unix socket (`server.rs`) and the kubelet's probes on TCP
//! (`health.rs`). Each connection gets a task of its own; at most
//! [`Limits::max_connections`] are served at once (the next waits in the
//! listen backlog for a slot), a client has [`Limits::header_read_timeout`]
//! to send each request's head, and at shutdown the open connections are
//! closed. What each server answers is its own.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::Service;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use ztunnel_certs::error_chain::ErrorChain;

use super::{ACCEPT_ERROR_PAUSE, stopped};

/// What one server allows its clients.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections served at once. The plugin holds one per pod being
    /// added (kubelet adds pods of a node in parallel) and the kubelet one
    /// per probe; 64, as ztunnel's admin server, leaves room for both
    /// while a flood of idle connections from the host network cannot
    /// take every descriptor.
    pub max_connections: usize,
    /// How long a client has to send a request's head: the plugin and
    /// kubelet send theirs at once, so 10 s only bounds a client that
    /// sends nothing.
    pub header_read_timeout: Duration,
}

impl Limits {
    /// The agent's servers' limits.
    pub const DEFAULT: Limits = Limits {
        max_connections: 64,
        header_read_timeout: Duration::from_secs(10),
    };
}

/// Where connections come from: a TCP or unix listener, or one that
/// admits only some peers.
pub trait Accept {
    /// A connection.
    type Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    /// The next connection. Cancel safe: between accepts none is held.
    fn accept(&self) -> impl Future<Output = std::io::Result<Self::Stream>> + Send;
}

impl Accept for tokio::net::TcpListener {
    type Stream = tokio::net::TcpStream;
    async fn accept(&self) -> std::io::Result<Self::Stream> {
        Ok(tokio::net::TcpListener::accept(self).await?.0)
    }
}

/// Serves HTTP/1.1 with `service` on each connection from `listener`
/// within `limits`, until `shutdown`; the open connections are then
/// closed. `what` names the server in log lines.
pub async fn serve<L, S>(
    listener: L,
    what: &'static str,
    limits: Limits,
    service: S,
    mut shutdown: watch::Receiver<bool>,
) where
    L: Accept + Sync,
    S: Service<Request<Incoming>, Response = Response<Full<Bytes>>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let mut connections = JoinSet::new();
    loop {
        while connections.try_join_next().is_some() {}
        let slot = tokio::select! {
            () = stopped(&mut shutdown) => break,
            slot = Arc::clone(&slots).acquire_owned() => slot,
        };
        // The semaphore is never closed.
        let Ok(slot) = slot else { break };
        let accepted = tokio::select! {
            () = stopped(&mut shutdown) => break,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok(stream) => stream,
            Err(error) => {
                tracing::warn!(error = %ErrorChain(&error), "accepting a {what} connection");
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                continue;
            }
        };
        let service = service.clone();
        connections.spawn(async move {
            let _slot = slot;
            let served = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout)
                .serve_connection(TokioIo::new(stream), service)
                .await;
            if let Err(error) = served {
                tracing::debug!(error = %ErrorChain(&error), "{what} connection ended");
            }
        });
    }
    connections.abort_all();
    while connections.join_next().await.is_some() {}
}

#[cfg(test)]
mod tests;
