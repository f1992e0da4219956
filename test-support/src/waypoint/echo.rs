//! An HBONE destination for tests: it terminates HBONE with its own
//! identity, answers every CONNECT 200, records it, and echoes the stream
//! until the client half-closes. What a test asserts about the last hop
//! (who the peer was, which authority arrived) it reads here.

use std::net::SocketAddr;
use std::sync::Arc;

use ztunnel_certs::cert::WorkloadCertificate;
use ztunnel_certs::identity::Identity;

use super::hbone::{Connect, echo};
use super::peer::{HandlerParts, Peer};
use super::{Outcome, Record, Records};
use crate::netns::NetNs;

/// An HBONE echo server; stops when dropped.
pub struct EchoServer {
    peer: Peer,
}

impl EchoServer {
    /// Starts an echo server listening on `listen` (port 0 for any; see
    /// [`EchoServer::addr`]) in the caller's namespace, with `cert` as its
    /// identity.
    pub fn start(listen: SocketAddr, cert: WorkloadCertificate) -> anyhow::Result<EchoServer> {
        Self::start_on(None, listen, cert)
    }

    /// As [`EchoServer::start`], inside `ns`.
    pub fn start_in(
        ns: &NetNs,
        listen: SocketAddr,
        cert: WorkloadCertificate,
    ) -> anyhow::Result<EchoServer> {
        Self::start_on(Some(ns), listen, cert)
    }

    fn start_on(
        ns: Option<&NetNs>,
        listen: SocketAddr,
        cert: WorkloadCertificate,
    ) -> anyhow::Result<EchoServer> {
        let handler =
            |parts: HandlerParts| move |connect| answer(Arc::clone(&parts.records), connect);
        let peer = Peer::start("echo server", ns, listen, &cert, handler)?;
        Ok(EchoServer { peer })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.peer.addr
    }

    /// Its own identity: what clients must expect of it.
    pub fn identity(&self) -> &Identity {
        &self.peer.identity
    }

    /// Every CONNECT it answered, oldest first (the last 10,000).
    pub fn records(&self) -> Vec<Record> {
        self.peer.records.all()
    }
}

async fn answer(records: Arc<Records>, connect: Connect) {
    records.push(Record::of(&connect, Outcome::Terminated));
    if let Ok(tunnel) = connect.accept() {
        let _ = echo(tunnel).await;
    }
}
