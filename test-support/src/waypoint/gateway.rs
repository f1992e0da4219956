//! The east-west network gateway of double HBONE (AMBIENT.md §3.4): it
//! terminates the outer HBONE with its own identity, finds the endpoint for
//! the `<service hostname>:<port>` authority in its route table, dials the
//! endpoint's 15008 in plain TCP, and only then answers 200; after that it
//! pipes the bytes opaquely, so the inner TLS of the client ends at the
//! endpoint's ztunnel, not here. It dials from the IP it listens on, as a
//! gateway pod would, so the endpoint sees the gateway's IP as the source
//! (AMBIENT.md §3.5).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use ztunnel_certs::cert::WorkloadCertificate;
use ztunnel_certs::identity::Identity;

use super::hbone::{Connect, tcp_connect};
use super::peer::{HandlerParts, Peer};
use super::{Outcome, Record, Records, lock};
use crate::netns::NetNs;

/// An east-west gateway; stops when dropped.
pub struct EastWestGateway {
    routes: Arc<Mutex<HashMap<String, SocketAddr>>>,
    peer: Peer,
}

impl EastWestGateway {
    /// Starts a gateway listening on `listen` (port 0 for any; see
    /// [`EastWestGateway::addr`]) in the caller's namespace, with `cert` as
    /// its identity and `routes` from `<service hostname>:<port>` to an
    /// endpoint's `ip:15008`.
    pub fn start(
        listen: SocketAddr,
        cert: WorkloadCertificate,
        routes: HashMap<String, SocketAddr>,
    ) -> anyhow::Result<EastWestGateway> {
        Self::start_on(None, listen, cert, routes)
    }

    /// As [`EastWestGateway::start`], inside `ns`: it listens and dials
    /// endpoints there.
    pub fn start_in(
        ns: &NetNs,
        listen: SocketAddr,
        cert: WorkloadCertificate,
        routes: HashMap<String, SocketAddr>,
    ) -> anyhow::Result<EastWestGateway> {
        Self::start_on(Some(ns), listen, cert, routes)
    }

    fn start_on(
        ns: Option<&NetNs>,
        listen: SocketAddr,
        cert: WorkloadCertificate,
        routes: HashMap<String, SocketAddr>,
    ) -> anyhow::Result<EastWestGateway> {
        let routes = Arc::new(Mutex::new(routes));
        let handler = |parts: HandlerParts| {
            let routes = Arc::clone(&routes);
            move |connect| {
                pipe(
                    Arc::clone(&routes),
                    parts.source,
                    Arc::clone(&parts.records),
                    connect,
                )
            }
        };
        let peer = Peer::start("east-west gateway", ns, listen, &cert, handler)?;
        Ok(EastWestGateway { routes, peer })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.peer.addr
    }

    /// Its own identity: what clients must expect of the outer session.
    pub fn identity(&self) -> &Identity {
        &self.peer.identity
    }

    /// Sets (or replaces) the endpoint for `authority`.
    pub fn set_route(&self, authority: &str, endpoint: SocketAddr) {
        lock(&self.routes).insert(authority.to_owned(), endpoint);
    }

    /// Removes the route for `authority`: later CONNECTs to it get 503.
    pub fn remove_route(&self, authority: &str) {
        lock(&self.routes).remove(authority);
    }

    /// Every outer CONNECT it saw, oldest first (the last 10,000).
    pub fn records(&self) -> Vec<Record> {
        self.peer.records.all()
    }
}

/// One outer CONNECT: find the endpoint, dial it (from `source`, the
/// gateway's own IP, if it listens on one), answer, copy.
async fn pipe(
    routes: Arc<Mutex<HashMap<String, SocketAddr>>>,
    source: Option<IpAddr>,
    records: Arc<Records>,
    connect: Connect,
) {
    let endpoint = lock(&routes).get(&connect.authority).copied();
    let Some(endpoint) = endpoint else {
        return super::refuse(&records, connect, Outcome::NoRoute);
    };
    let Ok(mut tcp) = tcp_connect(source, endpoint).await else {
        return super::refuse(&records, connect, Outcome::UpstreamFailed(None));
    };
    records.push(Record::of(&connect, Outcome::Forwarded));
    if let Ok(mut tunnel) = connect.accept() {
        let _ = tokio::io::copy_bidirectional(&mut tunnel, &mut tcp).await;
    }
}
