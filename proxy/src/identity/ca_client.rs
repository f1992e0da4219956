//! The client side of the CA's `CreateCertificate` (WIRE.md §3): gRPC over
//! TLS 1.3 with HTTP/2, trusting the CA only through the configured root
//! file, the Bearer token re-read from its file on every call, `clusterid`,
//! and `ImpersonatedIdentity` for any identity other than the proxy's own.
//!
//! It fetches one certificate per call and keeps no cache; caching, refresh
//! and retry are `manager.rs`'s business.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::transport::{Channel, Endpoint, Uri};
use ztunnel_certs::cert::{CertError, WorkloadCertificate};
use ztunnel_certs::csr::{CertRequest, CsrError};
use ztunnel_certs::identity::Identity;
use ztunnel_proto::istio::v1::auth::IstioCertificateRequest;
use ztunnel_proto::istio::v1::auth::istio_certificate_service_client::IstioCertificateServiceClient;

/// How long dialing the CA (TCP and TLS) may take (WIRE.md §3).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long one `CreateCertificate` call may take once connected, so a CA
/// that accepts but never answers cannot hold a fetch slot forever.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// TCP keepalive towards the CA, as ztunnel sets it (WIRE.md §3).
const TCP_KEEPALIVE_IDLE: Duration = Duration::from_secs(300);
const TCP_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(75);
const TCP_KEEPALIVE_PROBES: u32 = 9;

/// HTTP/2 pings towards the CA, as ztunnel sets them (WIRE.md §3).
const H2_PING_INTERVAL: Duration = Duration::from_secs(30);
const H2_PING_TIMEOUT: Duration = Duration::from_secs(10);

/// The port of an `https` address that names none.
const HTTPS_PORT: u16 = 443;

/// The Struct key that asks the CA for another identity (WIRE.md §3).
const IMPERSONATED_IDENTITY: &str = "ImpersonatedIdentity";

/// Where the CA is and how this proxy authenticates to it. Built by the
/// config module from `CA_ADDRESS`, `CA_ROOT_CA`, `AUTH_TOKEN`, `CLUSTER_ID`
/// and `SECRET_TTL`.
#[derive(Debug, Clone)]
pub struct CaClientConfig {
    /// `https://host:port`; without a scheme `https` is assumed. `http://` is
    /// refused: certificates and tokens never travel in clear text.
    pub address: String,
    /// PEM file of the roots the CA's serving certificate must chain to. The
    /// only trust anchors: system roots are never consulted.
    pub root_ca: PathBuf,
    /// The Bearer token file, read again on every call because the kubelet
    /// rotates projected tokens. `None` sends no `authorization` header.
    pub token: Option<PathBuf>,
    /// Sent as `clusterid`: picks the cluster the CA checks the token against.
    pub cluster_id: String,
    /// Requested lifetime of each certificate, sent as `validity_duration`.
    pub secret_ttl: Duration,
    /// The proxy's own identity in dedicated mode; requests for any other
    /// identity impersonate. `None` (shared mode, where the proxy serves
    /// other workloads only) impersonates on every request.
    pub own_identity: Option<Identity>,
    /// The name the CA's certificate must carry; `None` means the host of
    /// `address`.
    pub server_name: Option<String>,
}

/// Why the CA client could not be built or a certificate not fetched.
#[derive(Debug, thiserror::Error)]
pub enum CaClientError {
    /// The address uses `http://`; the CA is only reached over TLS.
    #[error("CA address {0:?} uses http://; only https is allowed")]
    InsecureAddress(String),
    /// The address is not a URI with a host.
    #[error("CA address {address:?} is not a valid https URI: {reason}")]
    InvalidAddress {
        /// The configured address.
        address: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The name to verify the CA against is not a DNS name or IP address.
    #[error("CA server name {0:?} is not a valid DNS name or IP address")]
    InvalidServerName(String),
    /// The root file could not be read.
    #[error("reading CA root file {path}: {source}")]
    RootCaRead {
        /// The configured root file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The root file is not PEM certificates, or no usable one.
    #[error("CA root file {path} holds no usable certificate: {reason}")]
    RootCaInvalid {
        /// The configured root file.
        path: PathBuf,
        /// Why it was refused.
        reason: String,
    },
    /// The TLS configuration could not be built.
    #[error("building the CA TLS configuration: {0}")]
    Tls(#[source] rustls::Error),
    /// The cluster ID cannot be sent as a header value.
    #[error("cluster ID {0:?} is not a valid header value")]
    InvalidClusterId(String),
    /// The token file could not be read.
    #[error("reading token file {path}: {source}")]
    TokenRead {
        /// The configured token file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The token holds characters a header cannot carry. The token itself is
    /// never part of the message.
    #[error("token file {0} does not hold a valid header value")]
    InvalidToken(PathBuf),
    /// The key or CSR could not be generated.
    #[error("generating the CSR: {0}")]
    Csr(#[from] CsrError),
    /// The CA refused the request or could not be reached.
    #[error("CA call failed: {0}")]
    Rpc(#[from] tonic::Status),
    /// The CA answered with a chain that fails the client checks, including a
    /// leaf for another identity than the one requested.
    #[error("CA response refused: {0}")]
    Certificate(#[from] CertError),
}

/// A connection to the CA; cheap to clone (the channel is shared).
#[derive(Clone)]
pub struct CaClient {
    channel: Channel,
    token: Option<PathBuf>,
    cluster_id: AsciiMetadataValue,
    validity_secs: i64,
    own_identity: Option<Identity>,
}

impl CaClient {
    /// Builds the client. It connects lazily, on the first fetch, so the
    /// proxy starts while the CA is still down; the channel reconnects by
    /// itself after the CA comes back.
    pub fn new(config: &CaClientConfig) -> Result<CaClient, CaClientError> {
        let (host, port) = parse_address(&config.address)?;
        let server_name_text = config.server_name.clone().unwrap_or_else(|| host.clone());
        let server_name = ServerName::try_from(server_name_text.clone())
            .map_err(|_| CaClientError::InvalidServerName(server_name_text))?;
        let connector = TlsConnector::from(Arc::new(tls_config(&config.root_ca)?));
        let cluster_id = config
            .cluster_id
            .parse::<AsciiMetadataValue>()
            .map_err(|_| CaClientError::InvalidClusterId(config.cluster_id.clone()))?;

        // The connector dials TCP and TLS itself, so the endpoint's scheme is
        // only a placeholder and its own TCP options do not apply.
        let endpoint = Endpoint::from_shared(format!("http://{}", format_authority(&host, port)))
            .map_err(|error| CaClientError::InvalidAddress {
                address: config.address.clone(),
                reason: error.to_string(),
            })?
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT)
            .http2_keep_alive_interval(H2_PING_INTERVAL)
            .keep_alive_timeout(H2_PING_TIMEOUT)
            .keep_alive_while_idle(true);
        let channel = endpoint.connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
            let connector = connector.clone();
            let server_name = server_name.clone();
            let host = host.clone();
            async move {
                tokio::time::timeout(CONNECT_TIMEOUT, async {
                    let tcp = TcpStream::connect((host.as_str(), port)).await?;
                    set_keepalive(&tcp)?;
                    let tls = connector.connect(server_name, tcp).await?;
                    Ok::<_, std::io::Error>(TokioIo::new(tls))
                })
                .await
                .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))?
            }
        }));

        Ok(CaClient {
            channel,
            token: config.token.clone(),
            cluster_id,
            validity_secs: i64::try_from(config.secret_ttl.as_secs()).unwrap_or(i64::MAX),
            own_identity: config.own_identity.clone(),
        })
    }

    /// Fetches a certificate for `identity` with a freshly generated key. The
    /// returned leaf carries exactly `identity`, or the fetch fails.
    pub async fn fetch(&self, identity: &Identity) -> Result<WorkloadCertificate, CaClientError> {
        let csr = CertRequest::generate(identity)?;
        let metadata =
            (self.own_identity.as_ref() != Some(identity)).then(|| prost_types::Struct {
                fields: [(
                    IMPERSONATED_IDENTITY.to_string(),
                    prost_types::Value {
                        kind: Some(prost_types::value::Kind::StringValue(
                            identity.as_str().to_string(),
                        )),
                    },
                )]
                .into(),
            });
        let mut request = tonic::Request::new(IstioCertificateRequest {
            csr: csr.csr_pem().to_string(),
            validity_duration: self.validity_secs,
            metadata,
        });
        if let Some(authorization) = self.authorization().await? {
            request
                .metadata_mut()
                .insert("authorization", authorization);
        }
        request
            .metadata_mut()
            .insert("clusterid", self.cluster_id.clone());

        let mut client = IstioCertificateServiceClient::new(self.channel.clone());
        let response = client.create_certificate(request).await?.into_inner();
        Ok(WorkloadCertificate::from_ca_response(
            &response.cert_chain,
            csr.private_key(),
            Some(identity),
        )?)
    }

    /// The `authorization` header from the token file as it is now, marked
    /// sensitive so it never shows in debug output.
    async fn authorization(&self) -> Result<Option<AsciiMetadataValue>, CaClientError> {
        let Some(path) = &self.token else {
            return Ok(None);
        };
        let token =
            tokio::fs::read_to_string(path)
                .await
                .map_err(|source| CaClientError::TokenRead {
                    path: path.clone(),
                    source,
                })?;
        let mut value = MetadataValue::try_from(format!("Bearer {}", token.trim()))
            .map_err(|_| CaClientError::InvalidToken(path.clone()))?;
        value.set_sensitive(true);
        Ok(Some(value))
    }
}

impl std::fmt::Debug for CaClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaClient")
            .field("token", &self.token)
            .field("own_identity", &self.own_identity)
            .finish_non_exhaustive()
    }
}

/// Splits `https://host:port` (or `host:port`) into host and port; refuses
/// `http://` and any other scheme.
fn parse_address(address: &str) -> Result<(String, u16), CaClientError> {
    let invalid = |reason: &str| CaClientError::InvalidAddress {
        address: address.to_string(),
        reason: reason.to_string(),
    };
    let with_scheme = if address.contains("://") {
        address.to_string()
    } else {
        format!("https://{address}")
    };
    let uri = with_scheme
        .parse::<Uri>()
        .map_err(|error| invalid(&error.to_string()))?;
    match uri.scheme_str() {
        Some("https") => {}
        Some("http") => return Err(CaClientError::InsecureAddress(address.to_string())),
        _ => return Err(invalid("the scheme must be https")),
    }
    let host = uri
        .host()
        .filter(|host| !host.is_empty())
        .ok_or_else(|| invalid("no host"))?;
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    Ok((host, uri.port_u16().unwrap_or(HTTPS_PORT)))
}

/// `host:port`, with brackets around an IPv6 host.
fn format_authority(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// TLS 1.3 only, HTTP/2 by ALPN, server authentication against the roots in
/// `root_ca` alone with normal hostname checks, no client certificate.
fn tls_config(root_ca: &PathBuf) -> Result<rustls::ClientConfig, CaClientError> {
    let pem = std::fs::read(root_ca).map_err(|source| CaClientError::RootCaRead {
        path: root_ca.clone(),
        source,
    })?;
    let invalid = |reason: String| CaClientError::RootCaInvalid {
        path: root_ca.clone(),
        reason,
    };
    let roots = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| invalid(error.to_string()))?;
    let mut store = rustls::RootCertStore::empty();
    for root in roots {
        store
            .add(root)
            .map_err(|error| invalid(error.to_string()))?;
    }
    if store.is_empty() {
        return Err(invalid("no certificate found".to_string()));
    }
    let mut config = rustls::ClientConfig::builder_with_provider(ztunnel_certs::tls::provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(CaClientError::Tls)?
        .with_root_certificates(store)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// TCP keepalive as ztunnel sets it towards the CA, so a dead path is noticed
/// even between refreshes.
fn set_keepalive(tcp: &TcpStream) -> std::io::Result<()> {
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(TCP_KEEPALIVE_IDLE)
        .with_interval(TCP_KEEPALIVE_INTERVAL)
        .with_retries(TCP_KEEPALIVE_PROBES);
    socket2::SockRef::from(tcp).set_tcp_keepalive(&keepalive)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_default_to_https_and_refuse_http() {
        let cases = [
            ("https://127.0.0.1:15012", Some(("127.0.0.1", 15012))),
            ("127.0.0.1:15012", Some(("127.0.0.1", 15012))),
            (
                "istiod.istio-system.svc:15012",
                Some(("istiod.istio-system.svc", 15012)),
            ),
            ("https://istiod.example", Some(("istiod.example", 443))),
            ("https://[::1]:15012", Some(("::1", 15012))),
            ("http://127.0.0.1:15012", None),
            ("grpc://127.0.0.1:15012", None),
            ("https://", None),
            ("", None),
        ];
        for (address, expected) in cases {
            let parsed = parse_address(address).ok();
            let parsed = parsed.as_ref().map(|(host, port)| (host.as_str(), *port));
            assert_eq!(parsed, expected, "{address}");
        }
        assert!(matches!(
            parse_address("http://127.0.0.1:15012"),
            Err(CaClientError::InsecureAddress(_))
        ));
    }
}
