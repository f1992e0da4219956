//! A client of the CA for integration tests: gRPC over TLS dialed by hand
//! (trusting only the given roots and checking the `localhost` name), the
//! request shape ztunnel sends, and a bare HTTP/1.1 GET of `/metrics`. The
//! xDS tests dial the same channel.

use std::net::SocketAddr;
use std::sync::Arc;

use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tonic::Request;
use tonic::transport::{Channel, Endpoint, Uri};
use ztunnel_proto::istio::v1::auth::IstioCertificateRequest;
use ztunnel_proto::istio::v1::auth::istio_certificate_service_client::IstioCertificateServiceClient;

/// Connects to the CA at `addr`, verifying its serving certificate for
/// `localhost` against `roots`.
pub async fn connect(
    addr: SocketAddr,
    roots: &[CertificateDer<'static>],
) -> IstioCertificateServiceClient<Channel> {
    IstioCertificateServiceClient::new(channel(addr, roots).await)
}

/// A gRPC channel to the CA's port at `addr` over TLS 1.3, verifying its
/// serving certificate for `localhost` against `roots`.
pub async fn channel(addr: SocketAddr, roots: &[CertificateDer<'static>]) -> Channel {
    channel_for(addr, roots, "localhost").await
}

/// As [`channel`], verifying the serving certificate for `name` (e.g. the
/// Service name ztunnel dials).
pub async fn channel_for(
    addr: SocketAddr,
    roots: &[CertificateDer<'static>],
    name: &'static str,
) -> Channel {
    dial(addr, roots, name, None).await
}

/// As [`channel`], announcing an HTTP/2 stream window of `window` bytes:
/// a client that does not read holds the server's writes back after that
/// many bytes, as a slow ztunnel would.
#[allow(dead_code)] // only the xDS order test holds a stream back
pub async fn channel_with_stream_window(
    addr: SocketAddr,
    roots: &[CertificateDer<'static>],
    window: u32,
) -> Channel {
    dial(addr, roots, "localhost", Some(window)).await
}

async fn dial(
    addr: SocketAddr,
    roots: &[CertificateDer<'static>],
    name: &'static str,
    stream_window: Option<u32>,
) -> Channel {
    let connector = connector(roots);
    Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .initial_stream_window_size(stream_window)
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let connector = connector.clone();
            async move {
                let tcp = TcpStream::connect(addr).await?;
                let name = ServerName::try_from(name).unwrap();
                let tls = connector.connect(name, tcp).await?;
                Ok::<_, std::io::Error>(TokioIo::new(tls))
            }
        }))
        .await
        .unwrap()
}

/// A TLS 1.3 client offering ALPN `h2`, trusting only `roots`.
fn connector(roots: &[CertificateDer<'static>]) -> tokio_rustls::TlsConnector {
    let mut store = rustls::RootCertStore::empty();
    for root in roots {
        store.add(root.clone()).unwrap();
    }
    let mut tls = rustls::ClientConfig::builder_with_provider(ztunnel_certs::tls::provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(store)
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"h2".to_vec()];
    tokio_rustls::TlsConnector::from(Arc::new(tls))
}

/// A connection to the CA's port at `addr` with its TLS handshake done
/// and nothing sent: no HTTP/2 preface, no request.
#[allow(dead_code)] // only the connection-bound tests hold one
pub async fn tls_only(
    addr: SocketAddr,
    roots: &[CertificateDer<'static>],
) -> tokio_rustls::client::TlsStream<TcpStream> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    connector(roots).connect(name, tcp).await.unwrap()
}

/// A `CreateCertificate` request as ztunnel sends it: the token in the
/// `authorization` header, `clusterid`, and `ImpersonatedIdentity` in the
/// request's metadata Struct when impersonating.
pub fn request(
    token: Option<&str>,
    csr: &str,
    impersonate: Option<&str>,
    validity_secs: i64,
) -> Request<IstioCertificateRequest> {
    let metadata = impersonate.map(|identity| prost_types::Struct {
        fields: [(
            "ImpersonatedIdentity".to_string(),
            prost_types::Value {
                kind: Some(prost_types::value::Kind::StringValue(identity.into())),
            },
        )]
        .into(),
    });
    let mut request = Request::new(IstioCertificateRequest {
        csr: csr.into(),
        validity_duration: validity_secs,
        metadata,
    });
    if let Some(token) = token {
        let value = format!("Bearer {token}").parse().unwrap();
        request.metadata_mut().insert("authorization", value);
    }
    request
        .metadata_mut()
        .insert("clusterid", "Kubernetes".parse().unwrap());
    request
}

/// The `/metrics` response, status line included.
pub async fn metrics(addr: SocketAddr) -> String {
    let response = get(addr, "/metrics").await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    response
}

/// A plain HTTP/1.1 GET of `path`: the whole response, status line
/// included.
pub async fn get(addr: SocketAddr, path: &str) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    response
}
