#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test
//! Double HBONE over real loopback sockets (AMBIENT.md §3.4, WIRE.md §4):
//! the client's outer session to a fake east-west gateway, which ends the
//! outer TLS with the proxy's own HBONE server and pipes the CONNECT
//! stream's bytes, opaque, to a destination on another address; the inner
//! session runs through them to that destination, which is a peer that is
//! not ours: stock tokio-rustls and a plain h2 server, echoing.
//!
//! Checked where the far ends would notice: the bytes echoed, who each
//! server saw (the client's certificate at both: the inner TLS crosses the
//! gateway untouched), the `:authority` each got, and `x-forwarded-network`
//! on the inner CONNECT only.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Response, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use ztunnel_certs::cert::WorkloadCertificate;
use ztunnel_certs::csr::CertRequest;
use ztunnel_certs::identity::Identity;
use ztunnel_certs::issuer::{Issuer, SigningMaterial, SigningRequest, generate_root};
use ztunnel_certs::tls::{client_config, peer_identity, server_config};
use ztunnel_proxy::copy::{CopyError, Transferred};
use ztunnel_proxy::drain::{self, DrainWatcher};
use ztunnel_proxy::hbone::{
    self, Authority, H2Settings, HboneError, InboundHandler, InboundRefusal, InboundRequest,
    X_FORWARDED_NETWORK, accept_tls, connect_inner, serve_connection,
};

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

type Log = Arc<Mutex<Vec<Seen>>>;

/// Issues mesh certificates from one generated root.
struct Ca(Issuer);

impl Ca {
    fn new() -> Ca {
        let root = generate_root("cluster.local", SystemTime::now()).unwrap();
        Ca(Issuer::new(&SigningMaterial {
            root_cert_pem: root.cert_pem,
            root_key_pem: Some(root.key_pem),
            ..SigningMaterial::default()
        })
        .unwrap())
    }

    fn certificate(&self, namespace: &str, service_account: &str) -> WorkloadCertificate {
        let identity = Identity::new("cluster.local", namespace, service_account).unwrap();
        let request = CertRequest::generate(&identity).unwrap();
        let signing = SigningRequest::from_pem(request.csr_pem()).unwrap();
        let chain = self
            .0
            .sign_workload(
                &signing,
                &identity,
                Duration::from_secs(3600),
                SystemTime::now(),
            )
            .unwrap();
        WorkloadCertificate::from_ca_response(&chain, request.private_key(), Some(&identity))
            .unwrap()
    }
}

/// The east-west gateway's side of the outer CONNECT: admits every tunnel
/// and connects it to the destination, whatever the authority names, as a
/// gateway that forwards `example.com:80` to its only endpoint would.
struct Gateway {
    destination: SocketAddr,
    seen: Log,
}

impl InboundHandler for Gateway {
    type Upstream = TcpStream;

    fn open(
        &self,
        request: &InboundRequest,
    ) -> impl Future<Output = Result<TcpStream, InboundRefusal>> + Send {
        self.seen.lock().unwrap().push(Seen {
            peer: request.peer_identity.clone(),
            authority: request.authority.to_string(),
            forwarded_network: forwarded_network(&request.headers),
        });
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

fn forwarded_network(headers: &HeaderMap) -> Option<String> {
    headers
        .get(X_FORWARDED_NETWORK)
        .map(|value| value.to_str().unwrap().to_owned())
}

/// The gateway: the proxy's HBONE server with the gateway's certificate.
async fn serve_gateway(
    listener: TcpListener,
    cert: WorkloadCertificate,
    handler: Arc<Gateway>,
    drain: DrainWatcher,
) {
    let config = Arc::new(server_config(&cert).unwrap());
    loop {
        let (tcp, peer) = listener.accept().await.unwrap();
        let local = tcp.local_addr().unwrap();
        let (config, handler, drain) = (Arc::clone(&config), Arc::clone(&handler), drain.clone());
        tokio::spawn(async move {
            let Ok((tls, identity)) = accept_tls(tcp, config, PATIENCE).await else {
                return;
            };
            let settings = H2Settings::default();
            let addresses = (peer, local);
            let _ = serve_connection(tls, identity, addresses, &settings, handler, drain).await;
        });
    }
}

/// The destination: stock tokio-rustls with the destination's certificate
/// and a plain h2 server that answers each CONNECT with 200 and echoes it.
async fn serve_destination(listener: TcpListener, cert: WorkloadCertificate, seen: Log) {
    let acceptor = TlsAcceptor::from(Arc::new(server_config(&cert).unwrap()));
    loop {
        let (tcp, _peer) = listener.accept().await.unwrap();
        let (acceptor, seen) = (acceptor.clone(), Arc::clone(&seen));
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let peer = peer_identity(tls.get_ref().1).unwrap();
            let mut connection = h2::server::handshake(tls).await.unwrap();
            while let Some(Ok((request, mut respond))) = connection.accept().await {
                assert_eq!(request.method(), Method::CONNECT);
                seen.lock().unwrap().push(Seen {
                    peer: peer.clone(),
                    authority: request.uri().authority().unwrap().to_string(),
                    forwarded_network: forwarded_network(request.headers()),
                });
                let mut body = request.into_body();
                let response = Response::builder().status(StatusCode::OK).body(()).unwrap();
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

/// A gateway on 127.0.0.2 in front of a destination on 127.0.0.3, both
/// logging what they see, and the client's certificate.
struct Topology {
    gateway: SocketAddr,
    gateway_seen: Log,
    destination_seen: Log,
    client: WorkloadCertificate,
    _drain: drain::DrainTrigger,
}

async fn topology() -> Topology {
    let ca = Ca::new();
    let destination_listener = TcpListener::bind("127.0.0.3:0").await.unwrap();
    let gateway_listener = TcpListener::bind("127.0.0.2:0").await.unwrap();
    let destination = destination_listener.local_addr().unwrap();
    let gateway = gateway_listener.local_addr().unwrap();
    let (destination_seen, gateway_seen) = (Log::default(), Log::default());
    tokio::spawn(serve_destination(
        destination_listener,
        ca.certificate("default", "server"),
        Arc::clone(&destination_seen),
    ));
    let (trigger, watcher) = drain::channel();
    let handler = Arc::new(Gateway {
        destination,
        seen: Arc::clone(&gateway_seen),
    });
    tokio::spawn(serve_gateway(
        gateway_listener,
        ca.certificate("istio-system", "eastwest"),
        handler,
        watcher,
    ));
    Topology {
        gateway,
        gateway_seen,
        destination_seen,
        client: ca.certificate("default", "client"),
        _drain: trigger,
    }
}

fn id(namespace: &str, service_account: &str) -> Identity {
    Identity::new("cluster.local", namespace, service_account).unwrap()
}

/// Opens the outer tunnel to the gateway for `authority` and, inside it,
/// the inner one expecting `inner_expected`, from network `network-a`.
async fn double_tunnel(
    topology: &Topology,
    authority: &Authority,
    inner_expected: Vec<Identity>,
) -> Result<hbone::H2Stream, HboneError> {
    let settings = H2Settings::default();
    let tcp = TcpStream::connect(topology.gateway).await.unwrap();
    let outer_tls = client_config(&topology.client, vec![id("istio-system", "eastwest")]).unwrap();
    let outer = hbone::connect(tcp, Arc::new(outer_tls), &settings).await?;
    let outer = outer.send_connect(authority, HeaderMap::new()).await?;
    let inner_tls = client_config(&topology.client, inner_expected).unwrap();
    let mut headers = HeaderMap::new();
    headers.insert(X_FORWARDED_NETWORK, HeaderValue::from_static("network-a"));
    connect_inner(outer, Arc::new(inner_tls), &settings, authority, headers).await
}

#[tokio::test]
async fn the_inner_tunnel_crosses_the_gateway_untouched_to_the_destination() {
    let topology = topology().await;
    let authority: Authority = "example.com:80".parse().unwrap();
    let inner = double_tunnel(&topology, &authority, vec![id("default", "server")]);
    let mut inner = tokio::time::timeout(PATIENCE, inner)
        .await
        .unwrap()
        .unwrap();

    let message: Vec<u8> = (0..64 * 1024).map(|i| (i % 251) as u8).collect();
    inner.write_all(&message).await.unwrap();
    inner.shutdown().await.unwrap();
    let mut echoed = Vec::new();
    tokio::time::timeout(PATIENCE, inner.read_to_end(&mut echoed))
        .await
        .unwrap()
        .unwrap();
    assert!(
        echoed == message,
        "{} of {} bytes echoed",
        echoed.len(),
        message.len()
    );

    let client = id("default", "client");
    let seen = |log: &Log| log.lock().unwrap().clone();
    assert_eq!(
        seen(&topology.gateway_seen),
        [Seen {
            peer: client.clone(),
            authority: "example.com:80".into(),
            forwarded_network: None,
        }],
        "the outer CONNECT: the client's identity, the service's name, no network"
    );
    assert_eq!(
        seen(&topology.destination_seen),
        [Seen {
            peer: client,
            authority: "example.com:80".into(),
            forwarded_network: Some("network-a".into()),
        }],
        "the inner CONNECT: the same client certificate, through the gateway, with the network"
    );
}

#[tokio::test]
async fn an_inner_peer_outside_the_expected_identities_is_refused() {
    let topology = topology().await;
    let authority: Authority = "example.com:80".parse().unwrap();
    // The gateway's own identity does not do for the inner session: only
    // the service's SANs do, and the destination is someone else.
    let inner = double_tunnel(&topology, &authority, vec![id("istio-system", "eastwest")]);
    let result = tokio::time::timeout(PATIENCE, inner).await.unwrap();
    assert!(
        matches!(result, Err(HboneError::Tls(_))),
        "{:?}",
        result.map(|_| ())
    );
    assert_eq!(topology.gateway_seen.lock().unwrap().len(), 1);
    assert!(
        topology.destination_seen.lock().unwrap().is_empty(),
        "no CONNECT reaches a destination the client does not trust"
    );
}
