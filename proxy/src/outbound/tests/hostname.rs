//! A connection to an endpoint known by hostname (AMBIENT.md §4.6), through
//! the outbound path from the original destination on: the route, the
//! lookup against a nameserver of the test's own, the report and the dial,
//! to a plain TCP echo on loopback at the address the name resolves to.
//! And the refusal, reported and counted, of one whose name does not
//! resolve. Only the capture (SO_ORIGINAL_DST) and the copy are left out.

use std::time::Duration;

use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use ztunnel_certs::cert::WorkloadCertificate;
use ztunnel_certs::identity::Identity;

use super::*;
use crate::config::local;
use crate::copy::Transferred;
use crate::drain::DrainTrigger;
use crate::identity::ca_client::CaClientError;
use crate::identity::manager::CertificateSource;
use crate::metrics::encode;
use crate::outbound::test_proxy::TestProxy;
use crate::pool::PoolConfig;
use crate::resolve::Resolver;
use crate::resolve::tests::Nameserver;
use crate::state::State;

/// How long any step may take before the test fails instead of hanging.
const PATIENCE: Duration = Duration::from_secs(10);

/// The client as the proxy sees it.
const PEER: &str = "127.0.0.1:40000";

/// The most connections the echo server takes before it stops by itself.
const MOST_CONNECTIONS: usize = 8;

/// The VIPs of the two ServiceEntries; never dialled, only routed.
const APP_VIP: &str = "240.240.0.1:80";
const GONE_VIP: &str = "240.240.0.2:80";

/// A CA that is never asked: plain TCP needs no certificate.
#[derive(Clone)]
struct NoCa;

impl CertificateSource for NoCa {
    fn fetch(
        &self,
        _identity: &Identity,
    ) -> impl Future<Output = Result<WorkloadCertificate, CaClientError>> + Send {
        std::future::pending()
    }
}

/// The client, and two ServiceEntry hosts as istiod sends them: a
/// workload with a hostname and no IP behind each VIP, taking plain TCP
/// at `port`.
fn mesh(port: u16) -> State {
    let yaml = format!(
        r#"
workloads:
- uid: client-0
  name: client-0
  namespace: default
  serviceAccount: client
  workloadIps: [127.0.0.1]
  protocol: HBONE
  services: {{}}
- uid: Kubernetes/networking.istio.io/ServiceEntry/default/app/app.test
  name: app
  namespace: default
  hostname: app.test
  workloadIps: []
  protocol: TCP
  services:
    default/app.test: {{80: {port}}}
- uid: Kubernetes/networking.istio.io/ServiceEntry/default/gone/gone.test
  name: gone
  namespace: default
  hostname: gone.test
  workloadIps: []
  protocol: TCP
  services:
    default/gone.test: {{80: {port}}}
services:
- name: app.test
  namespace: default
  hostname: app.test
  vips: [/240.240.0.1]
  ports: {{80: {port}}}
- name: gone.test
  namespace: default
  hostname: gone.test
  vips: [/240.240.0.2]
  ports: {{80: {port}}}
"#
    );
    local::parse(&yaml, "test.yaml".as_ref())
        .unwrap()
        .into_state()
}

/// A proxy for the client whose resolver asks `nameserver` only, A
/// records only, and the registry of its metrics.
fn proxy(state: State, nameserver: &Nameserver) -> (Proxy, Registry, DrainTrigger) {
    TestProxy {
        name: "client-0",
        service_account: "client",
        args: &[],
        pool: PoolConfig::default(),
        resolver: Resolver::with_nameservers(&[nameserver.addr], false).unwrap(),
        local_pods: None,
    }
    .build(NoCa, state)
}

/// Accepts up to [`MOST_CONNECTIONS`] connections and echoes each until it
/// closes.
async fn echo(listener: TcpListener) {
    for _ in 0..MOST_CONNECTIONS {
        let (mut stream, _) = listener.accept().await.unwrap();
        tokio::spawn(async move {
            let (mut read, mut write) = stream.split();
            tokio::io::copy(&mut read, &mut write).await.unwrap();
        });
    }
}

/// The lines of metric `name` in the exposition.
fn lines<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
    text.lines()
        .filter(|line| line.starts_with(name) && line[name.len()..].starts_with('{'))
        .collect()
}

async fn open(proxy: &Proxy, dst: &str) -> Option<(Report, Upstream)> {
    let opened = open_to(proxy, PEER.parse().unwrap(), dst.parse().unwrap());
    let opened = tokio::time::timeout(PATIENCE, opened).await.unwrap();
    opened.map(|(report, upstream, _shown)| (report, upstream))
}

#[tokio::test]
async fn a_hostname_endpoint_is_dialled_where_its_name_resolves_and_each_lookup_counted() {
    let listener = TcpListener::bind("127.0.0.9:0").await.unwrap();
    let echo_addr = listener.local_addr().unwrap();
    tokio::spawn(echo(listener));
    let nameserver = Nameserver::start(&[("app.test", &["127.0.0.9"])], 300).await;
    let (proxy, registry, _drain) = proxy(mesh(echo_addr.port()), &nameserver);

    for _ in 0..2 {
        let (report, upstream) = open(&proxy, APP_VIP).await.expect("connected");
        let Upstream::Tcp(mut tcp) = upstream else {
            panic!("plain TCP to a workload that takes no tunnel");
        };
        assert_eq!(tcp.peer_addr().unwrap(), echo_addr);
        tcp.write_all(b"hello, app.test").await.unwrap();
        tcp.shutdown().await.unwrap();
        let mut echoed = Vec::new();
        tokio::time::timeout(PATIENCE, tcp.read_to_end(&mut echoed))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(echoed, b"hello, app.test");
        report.close(Transferred::default(), ResponseFlags::None, None);
    }

    // The second connection's lookup came from the cache, and still counts.
    assert_eq!(nameserver.asked(), ["app.test. A"]);
    let text = encode(&registry).unwrap();
    assert_eq!(
        lines(&text, "istio_on_demand_dns_total"),
        ["istio_on_demand_dns_total{source_workload=\"client-0\",\
             source_canonical_service=\"unknown\",source_canonical_revision=\"unknown\",\
             source_workload_namespace=\"default\",\
             source_principal=\"spiffe://cluster.local/ns/default/sa/client\",\
             source_app=\"unknown\",source_version=\"unknown\",source_cluster=\"Kubernetes\",\
             hostname=\"app.test\"} 2"],
        "{text}"
    );
    let opened = lines(&text, "istio_tcp_connections_opened_total");
    assert_eq!(opened.len(), 1, "{text}");
    assert!(
        opened[0].contains("destination_workload=\"app\"")
            && opened[0].contains("destination_service=\"app.test\"")
            && opened[0].ends_with(" 2"),
        "{}",
        opened[0]
    );
}

#[tokio::test]
async fn a_hostname_that_does_not_resolve_refuses_the_connection_as_a_connect_failure() {
    let nameserver = Nameserver::start(&[("app.test", &["127.0.0.9"])], 300).await;
    let (proxy, registry, _drain) = proxy(mesh(9), &nameserver);

    assert!(open(&proxy, GONE_VIP).await.is_none());

    assert_eq!(nameserver.asked(), ["gone.test. A"]);
    let text = encode(&registry).unwrap();
    let lookups = lines(&text, "istio_on_demand_dns_total");
    assert_eq!(lookups.len(), 1, "{text}");
    assert!(
        lookups[0].contains("hostname=\"gone.test\"") && lookups[0].ends_with(" 1"),
        "{}",
        lookups[0]
    );
    let failed = lines(&text, "istio_tcp_connections_failed_total");
    assert_eq!(failed.len(), 1, "{text}");
    assert!(
        failed[0].contains("destination_workload=\"gone\"")
            && failed[0].contains("destination_service=\"gone.test\"")
            && failed[0].contains("response_flags=\"CONNECT\"")
            && failed[0].ends_with(" 1"),
        "{}",
        failed[0]
    );
}
