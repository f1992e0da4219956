//! Stand-ins for the Envoy-based HBONE peers of an ambient mesh, for tests
//! that have no Envoy: a waypoint ([`Waypoint`]: terminates HBONE, applies a
//! deny rule of its own, forwards over HBONE with its own identity) and an
//! east-west network gateway ([`EastWestGateway`], `waypoint/gateway.rs`:
//! terminates the outer HBONE of double HBONE and pipes the inner bytes to
//! an endpoint's 15008). Both record what they saw per CONNECT
//! ([`Record`]), so a test can assert who came through and what was
//! decided. [`EchoServer`] (`waypoint/echo.rs`) is an HBONE destination
//! that echoes.
//!
//! The HBONE they speak is `waypoint/hbone.rs`, written apart from the
//! proxy's; what they share (identity, records, the thread each one serves
//! on), `waypoint/peer.rs`. Each peer
//! runs on a thread and runtime of its own, on loopback or inside a test
//! namespace (`start_in`), and stops when dropped. `waypoint/pod.rs` runs
//! a waypoint as a process of its own (`ztunnel-test-waypoint`), for a pod.

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};

use http::{HeaderMap, StatusCode};
use tokio_rustls::rustls::ClientConfig;
use ztunnel_certs::cert::WorkloadCertificate;
use ztunnel_certs::identity::Identity;
use ztunnel_certs::tls::client_config;

use self::hbone::Connect;
use self::peer::{HandlerParts, Peer};
use crate::netns::NetNs;

mod echo;
mod gateway;
pub mod hbone;
mod peer;
pub mod pod;

pub use echo::EchoServer;
pub use gateway::EastWestGateway;

/// The request headers a record keeps.
const BAGGAGE: &str = "baggage";
const FORWARDED: &str = "forwarded";

/// Records kept per peer, the latest ones: bounds what a soak through a
/// peer holds, and is far more than a test reads.
const MAX_RECORDS: usize = 10_000;

/// Where a waypoint sends the streams for one `:authority`, as a ztunnel
/// would dial the destination workload (WIRE.md §4, "Direct to HBONE
/// workload").
#[derive(Debug, Clone)]
pub struct Route {
    /// The address to dial: the endpoint's `ip:15008`.
    pub dial: SocketAddr,
    /// The `:authority` to send: the endpoint's `ip:targetPort`.
    pub authority: String,
    /// The identities the upstream's certificate may carry: the
    /// destination workload's, plus its services' SANs.
    pub identities: Vec<Identity>,
}

/// A route as one command-line argument,
/// `AUTHORITY=DIAL,UPSTREAM_AUTHORITY,IDENTITY[,IDENTITY...]`: e.g.
/// `198.19.128.20:8080=198.18.64.5:15008,198.18.64.5:8080,spiffe://cluster.local/ns/demo/sa/echo`
/// (the service's VIP:port, the endpoint's HBONE address and its own
/// address, its identity). What a waypoint in a pod is started with.
#[derive(Debug, Clone)]
pub struct RouteSpec {
    /// The `:authority` clients ask for.
    pub authority: String,
    /// Where it goes.
    pub route: Route,
}

/// Why a route argument was refused.
#[derive(Debug, thiserror::Error)]
pub enum RouteSpecError {
    /// No `=` between the authority and the route.
    #[error("{0:?}: expected AUTHORITY=DIAL,UPSTREAM_AUTHORITY,IDENTITY[,IDENTITY...]")]
    Shape(String),
    /// The address to dial is not `ip:port`.
    #[error("{0:?}: the address to dial is not ip:port")]
    Dial(String),
    /// An identity is not a SPIFFE identity.
    #[error("{0:?}: not a SPIFFE identity")]
    Identity(String),
}

impl std::str::FromStr for RouteSpec {
    type Err = RouteSpecError;

    fn from_str(spec: &str) -> Result<RouteSpec, RouteSpecError> {
        let shape = || RouteSpecError::Shape(spec.to_owned());
        let (authority, route) = spec.split_once('=').ok_or_else(shape)?;
        let mut parts = route.split(',');
        let dial = parts
            .next()
            .filter(|part| !part.is_empty())
            .ok_or_else(shape)?;
        let upstream = parts
            .next()
            .filter(|part| !part.is_empty())
            .ok_or_else(shape)?;
        let identities = parts
            .map(|identity| {
                identity
                    .parse()
                    .map_err(|_| RouteSpecError::Identity(identity.to_owned()))
            })
            .collect::<Result<Vec<Identity>, _>>()?;
        if authority.is_empty() || identities.is_empty() {
            return Err(shape());
        }
        Ok(RouteSpec {
            authority: authority.to_owned(),
            route: Route {
                dial: dial
                    .parse()
                    .map_err(|_| RouteSpecError::Dial(dial.to_owned()))?,
                authority: upstream.to_owned(),
                identities,
            },
        })
    }
}

/// What a peer did with one CONNECT; [`Outcome::status`] is what it
/// answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Forwarded: the upstream answered 200, then the peer did.
    Forwarded,
    /// Answered 200 and served the stream itself (the echo server).
    Terminated,
    /// The client's identity is on the waypoint's deny list.
    Denied,
    /// No route for the authority.
    NoRoute,
    /// The upstream could not be reached, or answered this non-200 status.
    UpstreamFailed(Option<StatusCode>),
}

impl Outcome {
    /// The status the peer answered the CONNECT with: 403 for a deny, as an
    /// HTTP RBAC filter answers; 503 when there is nowhere to go, as
    /// ztunnel does (WIRE.md §4).
    pub fn status(self) -> StatusCode {
        match self {
            Outcome::Forwarded | Outcome::Terminated => StatusCode::OK,
            Outcome::Denied => StatusCode::FORBIDDEN,
            Outcome::NoRoute | Outcome::UpstreamFailed(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

/// What a peer saw of one CONNECT, and what it did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The client's identity, from its verified certificate.
    pub identity: Identity,
    /// The TCP peer of the HBONE connection: the sending ztunnel's
    /// address (in shared mode, the client pod's IP).
    pub peer: SocketAddr,
    /// The `:authority` asked for.
    pub authority: String,
    /// The `baggage` header, if sent.
    pub baggage: Option<String>,
    /// The `forwarded` header, if sent.
    pub forwarded: Option<String>,
    /// What the peer did.
    pub outcome: Outcome,
}

impl Record {
    fn of(connect: &Connect, outcome: Outcome) -> Record {
        Record {
            identity: connect.identity.clone(),
            peer: connect.peer,
            authority: connect.authority.clone(),
            baggage: connect.header(BAGGAGE).map(str::to_owned),
            forwarded: connect.header(FORWARDED).map(str::to_owned),
            outcome,
        }
    }
}

/// The records of one peer, shared by its connections and the test.
#[derive(Debug, Default)]
struct Records(Mutex<RecordLog>);

/// The latest records, and how many were ever pushed: a reader that
/// remembers the count finds what came after it.
#[derive(Debug, Default)]
struct RecordLog {
    kept: VecDeque<Record>,
    pushed: u64,
}

impl Records {
    fn push(&self, record: Record) {
        let mut log = lock(&self.0);
        if log.kept.len() == MAX_RECORDS {
            log.kept.pop_front();
        }
        log.kept.push_back(record);
        log.pushed += 1;
    }

    fn all(&self) -> Vec<Record> {
        lock(&self.0).kept.iter().cloned().collect()
    }

    /// The records pushed after the first `seen` (those still kept), and
    /// how many were pushed in all.
    fn since(&self, seen: u64) -> (Vec<Record>, u64) {
        let log = lock(&self.0);
        let new = usize::try_from(log.pushed.saturating_sub(seen)).unwrap_or(usize::MAX);
        let skip = log.kept.len().saturating_sub(new);
        (log.kept.iter().skip(skip).cloned().collect(), log.pushed)
    }
}

/// Locks a peer's state; a connection task that panicked while holding it
/// left nothing half-written worth refusing the test over.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A route with the TLS configuration to dial it, built once when the route
/// is set.
#[derive(Debug, Clone)]
struct Upstream {
    route: Route,
    tls: Arc<ClientConfig>,
}

/// A waypoint's rules: the routes and the deny list, which the test changes
/// while it runs.
#[derive(Debug, Default)]
struct Rules {
    routes: HashMap<String, Upstream>,
    denied: HashSet<Identity>,
}

/// The waypoint's decision for a client and an authority: the upstream to
/// forward to, or the refusal. A denied identity is refused whatever it
/// asks for; an authority without a route has nowhere to go.
fn decide<'a>(
    rules: &'a Rules,
    identity: &Identity,
    authority: &str,
) -> Result<&'a Upstream, Outcome> {
    if rules.denied.contains(identity) {
        return Err(Outcome::Denied);
    }
    rules.routes.get(authority).ok_or(Outcome::NoRoute)
}

/// An HBONE waypoint: terminates HBONE with its own certificate (clients of
/// its trust domain only), refuses clients on its deny list (403), answers
/// 503 to an authority without a route, and otherwise forwards the stream
/// over HBONE with its own identity to the route's upstream, answering 200
/// only once the upstream did. It dials from the IP it listens on (unless
/// that is `0.0.0.0` or `::`), as a waypoint pod would. Stops when dropped.
///
/// The forwarded CONNECT carries one header, `forwarded`: the client's own
/// `forwarded` value when it sent one (ztunnel sends `for="<app ip:port>"`),
/// else `for="<the client's TCP address>"`, so the destination sees the
/// original client as an Envoy waypoint reports it. No `baggage` or
/// `traceparent` is sent.
pub struct Waypoint {
    /// Signs its side of every upstream session: kept to build each
    /// route's TLS configuration when the route is set.
    cert: WorkloadCertificate,
    rules: Arc<Mutex<Rules>>,
    peer: Peer,
}

impl Waypoint {
    /// Starts a waypoint listening on `listen` (port 0 for any; see
    /// [`Waypoint::addr`]) in the caller's namespace, with `cert` as its
    /// identity and `routes` by `:authority`.
    pub fn start(
        listen: SocketAddr,
        cert: WorkloadCertificate,
        routes: HashMap<String, Route>,
    ) -> anyhow::Result<Waypoint> {
        Self::start_on(None, listen, cert, routes)
    }

    /// As [`Waypoint::start`], inside `ns`: it listens and dials upstreams
    /// there.
    pub fn start_in(
        ns: &NetNs,
        listen: SocketAddr,
        cert: WorkloadCertificate,
        routes: HashMap<String, Route>,
    ) -> anyhow::Result<Waypoint> {
        Self::start_on(Some(ns), listen, cert, routes)
    }

    fn start_on(
        ns: Option<&NetNs>,
        listen: SocketAddr,
        cert: WorkloadCertificate,
        routes: HashMap<String, Route>,
    ) -> anyhow::Result<Waypoint> {
        let rules = Arc::new(Mutex::new(Rules::default()));
        let handler = |parts: HandlerParts| {
            let rules = Arc::clone(&rules);
            move |connect| {
                forward(
                    Arc::clone(&rules),
                    parts.source,
                    Arc::clone(&parts.records),
                    connect,
                )
            }
        };
        let peer = Peer::start("waypoint", ns, listen, &cert, handler)?;
        let waypoint = Waypoint { cert, rules, peer };
        for (authority, route) in routes {
            waypoint.set_route(&authority, route)?;
        }
        Ok(waypoint)
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.peer.addr
    }

    /// Its own identity: what upstreams see as the client, and what clients
    /// must expect of it.
    pub fn identity(&self) -> &Identity {
        &self.peer.identity
    }

    /// Sets (or replaces) the route for `authority`.
    pub fn set_route(&self, authority: &str, route: Route) -> anyhow::Result<()> {
        let tls = Arc::new(client_config(&self.cert, route.identities.clone())?);
        lock(&self.rules)
            .routes
            .insert(authority.to_owned(), Upstream { route, tls });
        Ok(())
    }

    /// Removes the route for `authority`: later CONNECTs to it get 503.
    pub fn remove_route(&self, authority: &str) {
        lock(&self.rules).routes.remove(authority);
    }

    /// Refuses `identity` from now on (403), whatever it asks for. Open
    /// tunnels stay open.
    pub fn deny(&self, identity: Identity) {
        lock(&self.rules).denied.insert(identity);
    }

    /// Lets `identity` through again.
    pub fn allow(&self, identity: &Identity) {
        lock(&self.rules).denied.remove(identity);
    }

    /// Every CONNECT it saw, oldest first (the last 10,000).
    pub fn records(&self) -> Vec<Record> {
        self.peer.records.all()
    }

    /// The CONNECTs it saw after the first `seen`, oldest first, and how
    /// many it saw in all: the `seen` of the next call.
    pub fn records_since(&self, seen: u64) -> (Vec<Record>, u64) {
        self.peer.records.since(seen)
    }
}

/// One CONNECT at the waypoint: decide, dial the upstream (from `source`,
/// the waypoint's own IP, if it listens on one), answer, copy.
async fn forward(
    rules: Arc<Mutex<Rules>>,
    source: Option<IpAddr>,
    records: Arc<Records>,
    connect: Connect,
) {
    let upstream = decide(&lock(&rules), &connect.identity, &connect.authority).cloned();
    let upstream = match upstream {
        Ok(upstream) => upstream,
        Err(outcome) => return refuse(&records, connect, outcome),
    };
    let mut headers = HeaderMap::new();
    let forwarded = match connect.headers.get(FORWARDED) {
        Some(value) => value.clone(),
        None => hbone::forwarded_for(connect.peer),
    };
    headers.insert(FORWARDED, forwarded);
    let route = &upstream.route;
    let dialled = match hbone::tcp_connect(source, route.dial).await {
        Ok(tcp) => hbone::connect(tcp, upstream.tls, &route.authority, headers).await,
        Err(error) => Err(error),
    };
    let mut upstream = match dialled {
        Ok(tunnel) => tunnel,
        Err(error) => return refuse(&records, connect, Outcome::UpstreamFailed(error.status())),
    };
    records.push(Record::of(&connect, Outcome::Forwarded));
    if let Ok(mut client) = connect.accept() {
        // Either side may reset; the other is then dropped, resetting it.
        let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
    }
}

/// Records a refusal and answers it.
fn refuse(records: &Records, connect: Connect, outcome: Outcome) {
    records.push(Record::of(&connect, outcome));
    connect.refuse(outcome.status());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(service_account: &str) -> Identity {
        Identity::new("cluster.local", "ns1", service_account).unwrap()
    }

    #[test]
    fn a_denied_identity_is_refused_and_others_follow_the_routes() {
        let root = crate::ca::TestRoot::generate("cluster.local").unwrap();
        let cert = root.issue(&identity("waypoint")).unwrap();
        let route = Route {
            dial: "127.0.0.1:15008".parse().unwrap(),
            authority: "127.0.0.1:8080".into(),
            identities: vec![identity("server")],
        };
        let tls = Arc::new(client_config(&cert, route.identities.clone()).unwrap());
        let rules = Rules {
            routes: HashMap::from([("10.0.0.1:80".to_owned(), Upstream { route, tls })]),
            denied: HashSet::from([identity("mallory")]),
        };
        // (client, authority, upstream authority or refusal, why)
        let cases = [
            ("client", "10.0.0.1:80", Ok("127.0.0.1:8080"), "routed"),
            ("client", "10.0.0.2:80", Err(Outcome::NoRoute), "no route"),
            (
                "mallory",
                "10.0.0.1:80",
                Err(Outcome::Denied),
                "denied though routed",
            ),
            (
                "mallory",
                "10.0.0.2:80",
                Err(Outcome::Denied),
                "a deny comes first",
            ),
        ];
        for (client, authority, expected, why) in cases {
            let decision = decide(&rules, &identity(client), authority);
            let decision = decision.map(|upstream| upstream.route.authority.as_str());
            assert_eq!(decision, expected, "{why}");
        }
    }

    #[test]
    fn a_route_argument_names_the_authority_the_endpoint_and_its_identities() {
        let echo = "spiffe://cluster.local/ns/demo/sa/echo";
        let other = "spiffe://cluster.local/ns/demo/sa/other";
        let spec: RouteSpec = format!("10.0.0.1:80=10.1.0.5:15008,10.1.0.5:8080,{echo},{other}")
            .parse()
            .unwrap();
        assert_eq!(spec.authority, "10.0.0.1:80");
        assert_eq!(spec.route.dial, "10.1.0.5:15008".parse().unwrap());
        assert_eq!(spec.route.authority, "10.1.0.5:8080");
        assert_eq!(
            spec.route.identities,
            vec![echo.parse().unwrap(), other.parse::<Identity>().unwrap()]
        );
        // (argument, why it is refused)
        let refused = [
            ("10.0.0.1:80", "no route"),
            (
                "=10.1.0.5:15008,10.1.0.5:8080,spiffe://cluster.local/ns/a/sa/b",
                "no authority",
            ),
            ("10.0.0.1:80=10.1.0.5:15008,10.1.0.5:8080", "no identity"),
            (
                "10.0.0.1:80=10.1.0.5,10.1.0.5:8080,spiffe://cluster.local/ns/a/sa/b",
                "no port to dial",
            ),
            (
                "10.0.0.1:80=10.1.0.5:15008,10.1.0.5:8080,echo",
                "not an identity",
            ),
            (
                "10.0.0.1:80=,10.1.0.5:8080,spiffe://cluster.local/ns/a/sa/b",
                "nothing to dial",
            ),
        ];
        for (argument, why) in refused {
            assert!(argument.parse::<RouteSpec>().is_err(), "{why}: {argument}");
        }
    }

    #[test]
    fn records_since_a_count_are_those_pushed_after_it() {
        let records = Records::default();
        let record = |authority: &str| Record {
            identity: identity("client"),
            peer: "127.0.0.1:1".parse().unwrap(),
            authority: authority.to_owned(),
            baggage: None,
            forwarded: None,
            outcome: Outcome::Forwarded,
        };
        assert_eq!(records.since(0), (vec![], 0));
        records.push(record("a"));
        records.push(record("b"));
        let (new, seen) = records.since(0);
        assert_eq!((new.len(), seen), (2, 2));
        records.push(record("c"));
        let (new, seen) = records.since(seen);
        assert_eq!(seen, 3);
        assert_eq!(
            new.iter().map(|r| r.authority.as_str()).collect::<Vec<_>>(),
            ["c"]
        );
        assert_eq!(records.since(seen), (vec![], 3));
    }

    #[test]
    fn each_outcome_answers_its_status() {
        let cases = [
            (Outcome::Forwarded, 200),
            (Outcome::Terminated, 200),
            (Outcome::Denied, 403),
            (Outcome::NoRoute, 503),
            (Outcome::UpstreamFailed(None), 503),
            (Outcome::UpstreamFailed(Some(StatusCode::UNAUTHORIZED)), 503),
        ];
        for (outcome, status) in cases {
            assert_eq!(outcome.status().as_u16(), status, "{outcome:?}");
        }
    }
}
