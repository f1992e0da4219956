//! The resolver against a nameserver of the test's own on 127.0.0.1 (UDP,
//! messages built with hickory's protocol types, which are not the
//! resolver's logic): which record types are asked, what the cache spares
//! the nameserver, and what an unknown name or a missing configuration
//! gives.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use hickory_resolver::proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_resolver::proto::rr::rdata::{A, AAAA};
use hickory_resolver::proto::rr::{RData, Record, RecordType};
use tokio::net::UdpSocket;

use super::*;

/// How long a test waits for an answer before failing instead of hanging.
const PATIENCE: Duration = Duration::from_secs(10);

/// The most queries a test nameserver answers before it stops by itself.
const MOST_QUERIES: usize = 100;

/// A nameserver on 127.0.0.1 that knows a few names and logs the
/// questions it is asked; the outbound path's tests use it too.
pub(crate) struct Nameserver {
    /// Where it listens (UDP).
    pub(crate) addr: SocketAddr,
    asked: Arc<Mutex<Vec<(String, RecordType)>>>,
}

impl Nameserver {
    /// Answers for `zone` (name without the final dot → addresses), each
    /// record with `ttl` seconds; any other name is NXDOMAIN.
    pub(crate) async fn start(zone: &[(&str, &[&str])], ttl: u32) -> Nameserver {
        let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = socket.local_addr().unwrap();
        let zone: HashMap<String, Vec<IpAddr>> = zone
            .iter()
            .map(|(name, ips)| {
                let ips = ips.iter().map(|ip| ip.parse().unwrap()).collect();
                (format!("{name}."), ips)
            })
            .collect();
        let asked = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&asked);
        tokio::spawn(async move {
            let mut buffer = vec![0; 4096];
            for _ in 0..MOST_QUERIES {
                let (length, client) = socket.recv_from(&mut buffer).await.unwrap();
                let query = Message::from_vec(&buffer[..length]).unwrap();
                let answer = answer(&zone, &query, ttl, &log);
                socket
                    .send_to(&answer.to_vec().unwrap(), client)
                    .await
                    .unwrap();
            }
        });
        Nameserver { addr, asked }
    }

    /// The questions asked so far, as `name type`.
    pub(crate) fn asked(&self) -> Vec<String> {
        let asked = self.asked.lock().unwrap();
        asked
            .iter()
            .map(|(name, kind)| format!("{name} {kind}"))
            .collect()
    }
}

/// The answer to `query` from `zone`, logging its question.
fn answer(
    zone: &HashMap<String, Vec<IpAddr>>,
    query: &Message,
    ttl: u32,
    log: &Mutex<Vec<(String, RecordType)>>,
) -> Message {
    let mut answer = Message::new(query.metadata.id, MessageType::Response, OpCode::Query);
    answer.metadata.recursion_desired = query.metadata.recursion_desired;
    answer.metadata.recursion_available = true;
    answer.metadata.authoritative = true;
    let question = query.queries[0].clone();
    let name = question.name().to_ascii().to_lowercase();
    let kind = question.query_type();
    log.lock().unwrap().push((name.clone(), kind));
    answer.add_query(question.clone());
    let Some(ips) = zone.get(&name) else {
        answer.metadata.response_code = ResponseCode::NXDomain;
        return answer;
    };
    for ip in ips {
        let data = match (ip, kind) {
            (IpAddr::V4(v4), RecordType::A) => RData::A(A(*v4)),
            (IpAddr::V6(v6), RecordType::AAAA) => RData::AAAA(AAAA(*v6)),
            _ => continue,
        };
        answer.add_answer(Record::from_rdata(question.name().clone(), ttl, data));
    }
    answer
}

async fn lookup(resolver: &Resolver, hostname: &str) -> Result<Vec<IpAddr>, ResolveError> {
    let hostname: Arc<str> = Arc::from(hostname);
    tokio::time::timeout(PATIENCE, resolver.lookup(&hostname))
        .await
        .unwrap()
}

/// The addresses, sorted, as text.
fn sorted(mut addresses: Vec<IpAddr>) -> Vec<String> {
    addresses.sort();
    addresses.iter().map(IpAddr::to_string).collect()
}

#[tokio::test]
async fn both_families_are_asked_for_and_returned() {
    let server = Nameserver::start(&[("app.test", &["127.0.0.7", "::1"])], 300).await;
    let resolver = Resolver::with_nameservers(&[server.addr], true).unwrap();
    let addresses = lookup(&resolver, "app.test").await.unwrap();
    assert_eq!(sorted(addresses), ["127.0.0.7", "::1"]);
    let mut asked = server.asked();
    asked.sort();
    assert_eq!(asked, ["app.test. A", "app.test. AAAA"]);
}

#[tokio::test]
async fn with_ipv6_off_only_a_records_are_asked_for() {
    let server = Nameserver::start(&[("app.test", &["127.0.0.7", "::1"])], 300).await;
    let resolver = Resolver::with_nameservers(&[server.addr], false).unwrap();
    let addresses = lookup(&resolver, "app.test").await.unwrap();
    assert_eq!(sorted(addresses), ["127.0.0.7"]);
    assert_eq!(server.asked(), ["app.test. A"]);
}

#[tokio::test]
async fn a_name_with_addresses_of_one_family_only_resolves_to_those() {
    let server = Nameserver::start(&[("v4.test", &["127.0.0.8", "127.0.0.9"])], 300).await;
    let resolver = Resolver::with_nameservers(&[server.addr], true).unwrap();
    let addresses = lookup(&resolver, "v4.test").await.unwrap();
    assert_eq!(sorted(addresses), ["127.0.0.8", "127.0.0.9"]);
}

#[tokio::test]
async fn a_lookup_within_the_ttl_is_answered_from_the_cache() {
    let server = Nameserver::start(&[("app.test", &["127.0.0.7", "::1"])], 300).await;
    let resolver = Resolver::with_nameservers(&[server.addr], true).unwrap();
    let first = lookup(&resolver, "app.test").await.unwrap();
    // A clone shares the cache: every pod's proxy holds one.
    let second = lookup(&resolver.clone(), "app.test").await.unwrap();
    assert_eq!(sorted(first), sorted(second));
    assert_eq!(server.asked().len(), 2, "{:?}", server.asked());
}

#[tokio::test]
async fn a_lookup_after_the_ttl_asks_the_nameserver_again() {
    let server = Nameserver::start(&[("app.test", &["127.0.0.7"])], 1).await;
    let resolver = Resolver::with_nameservers(&[server.addr], false).unwrap();
    lookup(&resolver, "app.test").await.unwrap();
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    lookup(&resolver, "app.test").await.unwrap();
    assert_eq!(server.asked(), ["app.test. A", "app.test. A"]);
}

#[tokio::test]
async fn an_unknown_name_is_an_error_that_names_it() {
    let server = Nameserver::start(&[("app.test", &["127.0.0.7"])], 300).await;
    let resolver = Resolver::with_nameservers(&[server.addr], true).unwrap();
    let error = lookup(&resolver, "missing.test").await.unwrap_err();
    assert!(
        matches!(&error, ResolveError::Lookup { hostname, .. } if &**hostname == "missing.test"),
        "{error:?}"
    );
    let text = ErrorChain(&error).to_string();
    assert!(text.starts_with("resolving missing.test: "), "{text}");
}

#[tokio::test]
async fn without_a_usable_resolv_conf_every_lookup_fails_and_says_why() {
    let directory = tempfile::tempdir().unwrap();
    let missing = directory.path().join("resolv.conf");
    let empty = directory.path().join("empty.conf");
    std::fs::write(&empty, "# no nameserver\noptions ndots:2\n").unwrap();
    for path in [missing, empty] {
        let resolver = Resolver::from_resolv_conf(&path, true);
        let error = lookup(&resolver, "app.test").await.unwrap_err();
        assert!(matches!(error, ResolveError::Unconfigured(_)), "{error:?}");
        assert_eq!(
            error.to_string(),
            format!(
                "no DNS resolver: {} could not be used at start-up",
                path.display()
            )
        );
    }
}

#[tokio::test]
async fn a_resolv_conf_with_a_nameserver_gives_a_working_resolver() {
    // The nameserver's port is resolv.conf's 53, which nothing here serves:
    // the file is taken, and the lookup goes out and fails for itself.
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("resolv.conf");
    std::fs::write(
        &path,
        "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n",
    )
    .unwrap();
    let resolver = Resolver::from_resolv_conf(&path, true);
    let error = lookup(&resolver, "nothing.invalid").await.unwrap_err();
    assert!(matches!(error, ResolveError::Lookup { .. }), "{error:?}");
}
