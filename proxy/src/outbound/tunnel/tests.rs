//! Double HBONE over real loopback sockets (AMBIENT.md §3.4, WIRE.md §4),
//! from the route of a connection to a service on another network to the
//! bytes echoed: the proxy's outer session goes to a fake east-west gateway
//! (the proxy's own HBONE server, piping each CONNECT stream, opaque, to
//! the one destination behind it), and the inner session through it to
//! that destination, a peer that is not ours: stock tokio-rustls and a
//! plain h2 server, echoing.
//!
//! Checked where the far ends would notice: who each server saw (the
//! client's certificate at both: the inner TLS crosses the gateway
//! untouched), the `:authority` each got, `x-forwarded-network` on the
//! inner CONNECT only, one pooled connection to the gateway for many
//! tunnels but a session of its own for each inner one, and a refusal when
//! the destination is not one of the service's identities.

use std::future::Future;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{Method, Response, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use ztunnel_certs::issuer::{Issuer, SigningMaterial, generate_root};
use ztunnel_certs::tls::{peer_identity, server_config};

use super::*;
use crate::config::local;
use crate::copy::{CopyError, Transferred};
use crate::drain::{self, DrainTrigger};
use crate::hbone::{
    H2Settings, InboundHandler, InboundRefusal, InboundRequest, accept_tls, serve_connection,
};
use crate::identity::ca_client::CaClientError;
use crate::identity::manager::CertificateSource;
use crate::outbound::route::{Route, route};
use crate::outbound::test_proxy::{self, TestProxy};
use crate::pool::PoolConfig;
use crate::resolve::Resolver;
use crate::state::State;

/// How long any step may take before the test fails instead of hanging.
const PATIENCE: Duration = Duration::from_secs(10);

/// One CONNECT as a server saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Seen {
    /// The client identity of the TLS session it came on.
    peer: Identity,
    /// Its `:authority`.
    authority: String,
    /// Its `x-forwarded-network`, if any.
    forwarded_network: Option<String>,
}

/// What one server saw: its TLS sessions and their CONNECTs.
#[derive(Default)]
struct Log {
    sessions: AtomicUsize,
    connects: Mutex<Vec<Seen>>,
}

impl Log {
    fn sessions(&self) -> usize {
        self.sessions.load(Ordering::SeqCst)
    }

    fn connects(&self) -> Vec<Seen> {
        self.connects.lock().unwrap().clone()
    }

    fn record(&self, peer: &Identity, authority: String, headers: &HeaderMap) {
        let forwarded_network = headers
            .get(X_FORWARDED_NETWORK)
            .map(|value| value.to_str().unwrap().to_owned());
        self.connects.lock().unwrap().push(Seen {
            peer: peer.clone(),
            authority,
            forwarded_network,
        });
    }
}

/// A CA that signs whatever is asked, from one generated root: the mesh's,
/// for the proxy's identity manager and the servers alike.
#[derive(Clone)]
struct Ca(Arc<Issuer>);

impl Ca {
    fn new() -> Ca {
        let root = generate_root("cluster.local", SystemTime::now()).unwrap();
        let material = SigningMaterial {
            root_cert_pem: root.cert_pem,
            root_key_pem: Some(root.key_pem),
            ..SigningMaterial::default()
        };
        Ca(Arc::new(Issuer::new(&material).unwrap()))
    }

    fn issue(&self, identity: &Identity) -> WorkloadCertificate {
        test_proxy::issue(&self.0, identity)
    }
}

impl CertificateSource for Ca {
    fn fetch(
        &self,
        identity: &Identity,
    ) -> impl Future<Output = Result<WorkloadCertificate, CaClientError>> + Send {
        std::future::ready(Ok(self.issue(identity)))
    }
}

fn id(namespace: &str, service_account: &str) -> Identity {
    Identity::new("cluster.local", namespace, service_account).unwrap()
}

/// The east-west gateway's side of the outer CONNECT: admits every tunnel
/// and connects it to the destination, as a gateway whose service has one
/// endpoint would.
struct Gateway {
    destination: SocketAddr,
    log: Arc<Log>,
}

impl InboundHandler for Gateway {
    type Upstream = TcpStream;

    fn open(
        &self,
        request: &InboundRequest,
    ) -> impl Future<Output = Result<TcpStream, InboundRefusal>> + Send {
        let authority = request.authority.to_string();
        self.log
            .record(&request.peer_identity, authority, &request.headers);
        let destination = self.destination;
        async move {
            TcpStream::connect(destination)
                .await
                .map_err(|_| InboundRefusal::Unavailable("destination unreachable"))
        }
    }

    fn stop(_upstream: &TcpStream) -> CancellationToken {
        CancellationToken::new()
    }

    fn closed(&self, _upstream: TcpStream, _result: Result<Transferred, CopyError>) {}
}

/// The gateway: the proxy's HBONE server with the gateway's certificate.
async fn serve_gateway(listener: TcpListener, gateway: Arc<Gateway>, cert: WorkloadCertificate) {
    let config = Arc::new(server_config(&cert).unwrap());
    let (_trigger, drain) = drain::channel();
    loop {
        let (tcp, peer) = listener.accept().await.unwrap();
        gateway.log.sessions.fetch_add(1, Ordering::SeqCst);
        let local = tcp.local_addr().unwrap();
        let (config, gateway, drain) = (Arc::clone(&config), Arc::clone(&gateway), drain.clone());
        tokio::spawn(async move {
            let Ok((tls, client)) = accept_tls(tcp, config, PATIENCE).await else {
                return;
            };
            let settings = H2Settings::default();
            let client = client.identity.into();
            let _ = serve_connection(tls, client, (peer, local), &settings, gateway, drain).await;
        });
    }
}

/// The destination: stock tokio-rustls with the destination's certificate
/// and a plain h2 server that answers each CONNECT with 200 and echoes it.
async fn serve_destination(listener: TcpListener, cert: WorkloadCertificate, log: Arc<Log>) {
    let acceptor = TlsAcceptor::from(Arc::new(server_config(&cert).unwrap()));
    loop {
        let (tcp, _peer) = listener.accept().await.unwrap();
        let (acceptor, log) = (acceptor.clone(), Arc::clone(&log));
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            log.sessions.fetch_add(1, Ordering::SeqCst);
            let peer = peer_identity(tls.get_ref().1).unwrap();
            let mut connection = h2::server::handshake(tls).await.unwrap();
            while let Some(Ok((request, mut respond))) = connection.accept().await {
                assert_eq!(request.method(), Method::CONNECT);
                let authority = request.uri().authority().unwrap().to_string();
                log.record(&peer, authority, request.headers());
                let mut body = request.into_body();
                let response = Response::builder()
                    .status(StatusCode::OK)
                    .header("baggage", DESTINATION_BAGGAGE)
                    .body(())
                    .unwrap();
                let mut send = respond.send_response(response, false).unwrap();
                tokio::spawn(async move {
                    while let Some(Ok(chunk)) = body.data().await {
                        let _ = body.flow_control().release_capacity(chunk.len());
                        send.send_data(chunk, false).unwrap();
                    }
                    let _ = send.send_data(Bytes::new(), true);
                });
            }
        });
    }
}

/// What the destination's 200 says of the workload it serves.
const DESTINATION_BAGGAGE: &str = "k8s.cluster.name=far,k8s.namespace.name=default,\
    k8s.deployment.name=server-v2,service.name=server,service.version=v2";

/// The services of the mesh, each reached only through istiod's stand-in
/// for network `far`: `(hostname, VIP, subject_alt_names)`.
const SERVICES: [(&str, &str, &str); 3] = [
    // The destination's identity.
    (
        "example.com",
        "10.96.1.1",
        "spiffe://cluster.local/ns/default/sa/server",
    ),
    // Someone else's.
    (
        "impostor.example",
        "10.96.1.2",
        "spiffe://cluster.local/ns/default/sa/other",
    ),
    // None.
    ("bare.example", "10.96.1.3", ""),
];

/// The mesh as the client's proxy knows it: the client on `network-a`, the
/// gateway at `gateway` on network `far`, and [`SERVICES`].
fn mesh(gateway: SocketAddr) -> State {
    let (ip, port) = (gateway.ip(), gateway.port());
    let mut workloads = format!(
        r#"
- uid: client-0
  name: client-0
  namespace: default
  serviceAccount: client
  network: network-a
  workloadIps: [127.0.0.1]
  protocol: HBONE
  services: {{}}
- uid: NetworkGateway/far/{ip}/{port}
  name: eastwest
  namespace: istio-system
  serviceAccount: eastwest
  network: far
  workloadIps: [{ip}]
  protocol: HBONE
  services: {{}}
"#
    );
    let mut services = String::new();
    for (host, vip, san) in SERVICES {
        workloads.push_str(&format!(
            r#"- uid: far/SplitHorizonWorkload/{host}
  name: far/SplitHorizonWorkload/{host}
  namespace: default
  network: far
  workloadIps: []
  protocol: HBONE
  networkGateway: {{destination: far/{ip}, hboneMtlsPort: {port}}}
  services:
    default/{host}: {{80: 8080}}
"#
        ));
        let sans = if san.is_empty() {
            "[]".to_owned()
        } else {
            format!("[\"{san}\"]")
        };
        services.push_str(&format!(
            r#"- name: {host}
  namespace: default
  hostname: {host}
  vips: [network-a/{vip}]
  ports: {{80: 8080}}
  subjectAltNames: {sans}
"#
        ));
    }
    let yaml = format!("workloads:{workloads}services:\n{services}");
    local::parse(&yaml, "test.yaml".as_ref())
        .unwrap()
        .into_state()
}

/// A client proxy on `network-a`, a gateway on 127.0.0.2 and the
/// destination behind it on 127.0.0.3, each server logging what it sees.
struct Topology {
    proxy: Proxy,
    gateway: Arc<Log>,
    destination: Arc<Log>,
    _drain: DrainTrigger,
}

async fn topology() -> Topology {
    let ca = Ca::new();
    let destination_listener = TcpListener::bind("127.0.0.3:0").await.unwrap();
    let gateway_listener = TcpListener::bind("127.0.0.2:0").await.unwrap();
    let gateway_addr = gateway_listener.local_addr().unwrap();
    let destination = Arc::new(Log::default());
    let gateway = Arc::new(Gateway {
        destination: destination_listener.local_addr().unwrap(),
        log: Arc::default(),
    });
    let gateway_log = Arc::clone(&gateway.log);
    tokio::spawn(serve_destination(
        destination_listener,
        ca.issue(&id("default", "server")),
        Arc::clone(&destination),
    ));
    tokio::spawn(serve_gateway(
        gateway_listener,
        gateway,
        ca.issue(&id("istio-system", "eastwest")),
    ));

    let (proxy, _registry, trigger) = TestProxy {
        name: "client-0",
        service_account: "client",
        args: &["--network", "network-a"],
        // One connection per key, as istio/ztunnel pools.
        pool: PoolConfig {
            max_connections_per_key: 1,
            ..PoolConfig::default()
        },
        resolver: Resolver::with_nameservers(&[], true).unwrap(),
        local_pods: None,
    }
    .build(ca, mesh(gateway_addr));
    Topology {
        proxy,
        gateway: gateway_log,
        destination,
        _drain: trigger,
    }
}

/// Routes a connection from the client to `dst` and opens its double tunnel.
async fn connect(
    topology: &Topology,
    dst: &str,
) -> Result<(hbone::H2Stream, Option<Baggage>), OutboundError> {
    let client = topology.proxy.local_workload().unwrap();
    let client_addr: SocketAddr = "127.0.0.1:40000".parse().unwrap();
    let routed = route(
        &topology.proxy.node.state.read(),
        &client,
        client_addr.ip(),
        dst.parse().unwrap(),
        0,
    );
    let Route::DoubleHbone(double) = routed else {
        panic!("{dst}: {routed:?}");
    };
    let tunnel = Tunnel::double(&double, dst.parse().unwrap());
    let tunnel = open(&topology.proxy, Some(&client), client_addr, &tunnel);
    tokio::time::timeout(PATIENCE, tunnel).await.unwrap()
}

/// Sends `message`, half-closes, and reads the whole echo.
async fn echo(mut stream: hbone::H2Stream, message: &[u8]) -> Vec<u8> {
    stream.write_all(message).await.unwrap();
    stream.shutdown().await.unwrap();
    let mut echoed = Vec::new();
    tokio::time::timeout(PATIENCE, stream.read_to_end(&mut echoed))
        .await
        .unwrap()
        .unwrap();
    echoed
}

#[tokio::test]
async fn a_service_on_another_network_is_reached_through_its_gateway_in_a_tunnel_of_its_own() {
    let topology = topology().await;
    let message: Vec<u8> = (0..64 * 1024).map(|i| (i % 251) as u8).collect();
    // Two tunnels open at once: two inner sessions in one outer connection.
    let (first, described) = connect(&topology, "10.96.1.1:80").await.unwrap();
    let (second, _) = connect(&topology, "10.96.1.1:80").await.unwrap();
    let described = described.unwrap();
    let named = |value: &str| Some(Arc::from(value));
    assert_eq!(
        (
            described.cluster,
            described.workload_name,
            described.canonical_revision
        ),
        (named("far"), named("server-v2"), named("v2")),
        "the far end's answer names the workload the inner tunnel ended at"
    );
    for stream in [first, second] {
        let echoed = echo(stream, &message).await;
        assert!(
            echoed == message,
            "{} of {} bytes",
            echoed.len(),
            message.len()
        );
    }

    let outer = Seen {
        peer: id("default", "client"),
        authority: "example.com:80".into(),
        forwarded_network: None,
    };
    let inner = Seen {
        forwarded_network: Some("network-a".into()),
        ..outer.clone()
    };
    assert_eq!(
        topology.gateway.connects(),
        [outer.clone(), outer],
        "outer CONNECTs: the client's identity, the service's name, no network"
    );
    assert_eq!(
        topology.destination.connects(),
        [inner.clone(), inner],
        "inner CONNECTs: the client's certificate through the gateway, with the network"
    );
    assert_eq!(
        topology.gateway.sessions(),
        1,
        "the outer session is pooled"
    );
    assert_eq!(topology.destination.sessions(), 2, "each inner one is new");
}

#[tokio::test]
async fn a_destination_outside_the_services_identities_is_refused_before_any_connect() {
    let topology = topology().await;
    for dst in ["10.96.1.2:80", "10.96.1.3:80"] {
        let refused = connect(&topology, dst).await;
        assert!(
            matches!(
                &refused,
                Err(OutboundError::Tunnel(error))
                    if matches!(**error, HboneError::Tls(_) | HboneError::TlsConfig(_))
            ),
            "{dst}: {:?}",
            refused.map(|_| ())
        );
    }
    assert_eq!(
        topology.gateway.connects().len(),
        1,
        "the outer tunnel opens only when the inner one can be verified"
    );
    assert!(
        topology.destination.connects().is_empty(),
        "no CONNECT reaches a destination the service does not name"
    );
}
