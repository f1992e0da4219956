//! What every test HBONE peer is made of: its identity, its records, and
//! the thread it serves on (a listener bound on it, a runtime of its own, an
//! accept loop handing each connection to [`hbone::serve_connection`], and
//! a stop on drop). A peer started inside a test namespace has its thread
//! made there, so its listener and every connection it dials belong to the
//! namespace, whatever runtime the test itself runs on (if any). What a peer
//! does with a CONNECT is its handler's business.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::Context;
use tokio::sync::oneshot;
use tokio_rustls::rustls::ServerConfig;
use ztunnel_certs::cert::WorkloadCertificate;
use ztunnel_certs::identity::Identity;

use super::Records;
use super::hbone::{self, Connect};
use crate::netns::NetNs;

/// The pause after an accept error (out of descriptors, a connection reset
/// before it was accepted) before accepting again.
const ACCEPT_RETRY: Duration = Duration::from_millis(50);

/// A running peer; dropping it stops the peer and closes its connections.
pub(super) struct Peer {
    /// Its own identity, from its certificate.
    pub(super) identity: Identity,
    /// What its handler recorded, shared with the handler.
    pub(super) records: Arc<Records>,
    /// The address it listens on (the port the kernel chose for port 0).
    pub(super) addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

/// What a peer's handler is made with.
pub(super) struct HandlerParts {
    /// Where the handler records each CONNECT.
    pub(super) records: Arc<Records>,
    /// The IP the peer dials from: the one it listens on, as a pod with one
    /// address would, unless it listens on all of them.
    pub(super) source: Option<IpAddr>,
}

impl Peer {
    /// Binds `listen` (inside `ns` if given, else in the caller's
    /// namespace) and serves HBONE there as `cert`, passing each CONNECT to
    /// the handler `make_handler` builds.
    pub(super) fn start<H, F>(
        name: &str,
        ns: Option<&NetNs>,
        listen: SocketAddr,
        cert: &WorkloadCertificate,
        make_handler: impl FnOnce(HandlerParts) -> H,
    ) -> anyhow::Result<Peer>
    where
        H: Fn(Connect) -> F + Send + Sync + 'static,
        F: Future<Output = ()> + Send + 'static,
    {
        ztunnel_certs::tls::install_provider();
        let identity = cert
            .identity()
            .cloned()
            .with_context(|| format!("the {name}'s certificate has no identity"))?;
        let records = Arc::new(Records::default());
        let handler = make_handler(HandlerParts {
            records: Arc::clone(&records),
            source: Some(listen.ip()).filter(|ip| !ip.is_unspecified()),
        });
        let config = cert.server_config()?;
        let (bound, bound_rx) = mpsc::channel();
        let (stop, stopped) = oneshot::channel();
        let body = move || serve(listen, config, handler, bound, stopped);
        let builder = std::thread::Builder::new().name(name.to_owned());
        // A thread starts in its creator's namespace: made from a thread
        // that entered `ns`, it lives there.
        let thread = match ns {
            Some(ns) => ns.run(move || builder.spawn(body))??,
            None => builder.spawn(body)?,
        };
        let addr = bound_rx
            .recv()
            .context("the serving thread ended before binding")?
            .with_context(|| format!("binding the {name} on {listen}"))?;
        Ok(Peer {
            identity,
            records,
            addr,
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The serving thread's body: binds, says where (or why not), then accepts
/// until stopped. Dropping the runtime on return ends every connection.
fn serve<H, F>(
    listen: SocketAddr,
    config: Arc<ServerConfig>,
    handler: H,
    bound: mpsc::Sender<std::io::Result<SocketAddr>>,
    mut stopped: oneshot::Receiver<()>,
) where
    H: Fn(Connect) -> F + Send + Sync + 'static,
    F: Future<Output = ()> + Send + 'static,
{
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            let _ = bound.send(Err(error));
            return;
        }
    };
    let listener = runtime.block_on(async { tokio::net::TcpListener::bind(listen).await });
    let listener = match listener.and_then(|l| Ok((l.local_addr()?, l))) {
        Ok((addr, listener)) => {
            let _ = bound.send(Ok(addr));
            listener
        }
        Err(error) => {
            let _ = bound.send(Err(error));
            return;
        }
    };
    let handler = Arc::new(handler);
    runtime.block_on(async move {
        loop {
            // Cancel safety: `accept` loses no connection when the stop wins.
            let accepted = tokio::select! {
                _ = &mut stopped => return,
                accepted = listener.accept() => accepted,
            };
            let Ok((tcp, _)) = accepted else {
                tokio::time::sleep(ACCEPT_RETRY).await;
                continue;
            };
            let _ = tcp.set_nodelay(true);
            let config = Arc::clone(&config);
            let handler = Arc::clone(&handler);
            tokio::spawn(async move {
                // A client refused at the handshake (wrong version, foreign
                // trust domain) ends here; the test sees it on its side.
                let _ = hbone::serve_connection(tcp, config, |connect| handler(connect)).await;
            });
        }
    });
}
