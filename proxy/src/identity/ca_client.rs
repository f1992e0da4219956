//! The client side of the CA's `CreateCertificate` (WIRE.md §3): gRPC over
//! TLS 1.3 with HTTP/2, trusting the CA only through the configured root
//! file, the Bearer token re-read from its file on every call, `clusterid`,
//! and `ImpersonatedIdentity` for any identity other than the proxy's own.
//!
//! Before each call the root file is read again: when its content changed
//! (a rotated root) the channel is rebuilt on the new roots, so the next
//! connection to the CA trusts them, as istio/ztunnel does; a new root that
//! does not load keeps the old channel and is tried again next call.
//!
//! It fetches one certificate per call and keeps no cache; caching, refresh
//! and retry are `manager.rs`'s business.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tonic::transport::Channel;
use ztunnel_certs::cert::{CertError, WorkloadCertificate};
use ztunnel_certs::csr::{CertRequest, CsrBuildError};
use ztunnel_certs::error_chain::ErrorChain;
use ztunnel_certs::identity::Identity;
use ztunnel_proto::istio::v1::auth::IstioCertificateRequest;
use ztunnel_proto::istio::v1::auth::istio_certificate_service_client::IstioCertificateServiceClient;

use crate::control_plane::{
    ControlPlaneAddress, ControlPlaneError, Credentials, Dialer, ExtraHeaders, RootSource,
    TokenSource, client_tls_config,
};

/// How long one `CreateCertificate` call may take once connected, so a CA
/// that accepts but never answers cannot hold a fetch slot forever.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

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
    /// The roots the CA's serving certificate must chain to, the only
    /// trust anchors: a PEM file (read again before each call, so a
    /// rotated root is used from then on), inline PEM, or the system's
    /// roots where the operator asks for them (`SYSTEM`).
    pub root: RootSource,
    /// The Bearer token: a file is read again on every call because the
    /// kubelet rotates projected tokens. `None` sends no `authorization`
    /// header.
    pub token: TokenSource,
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
    /// A second name the CA's certificate may carry instead
    /// (`ALT_CA_HOSTNAME`).
    pub alt_hostname: Option<String>,
    /// Headers sent on every call besides the credentials
    /// (`CA_HEADER_<NAME>`).
    pub headers: ExtraHeaders,
}

/// Why the CA client could not be built or a certificate not fetched.
#[derive(Debug, thiserror::Error)]
pub enum CaClientError {
    /// The address uses `http://`; the CA is only reached over TLS.
    #[error("CA address {0:?} uses http://; only https is allowed")]
    InsecureAddress(String),
    /// The address, roots, server name or headers are unusable, or the
    /// token file could not be read for this call.
    #[error("CA connection")]
    Connection(#[from] ControlPlaneError),
    /// The key or CSR could not be generated.
    #[error("generating the CSR")]
    Csr(#[from] CsrBuildError),
    /// The CA refused the request or could not be reached.
    #[error("CA call failed")]
    Rpc(#[from] tonic::Status),
    /// The CA answered with a chain that fails the client checks, including a
    /// leaf for another identity than the one requested.
    #[error("CA response refused")]
    Certificate(#[from] CertError),
}

/// A connection to the CA; cheap to clone (the channel is shared).
#[derive(Clone)]
pub struct CaClient {
    channel: Arc<Mutex<RootedChannel>>,
    dial: Arc<DialSettings>,
    credentials: Credentials,
    validity_secs: i64,
    own_identity: Option<Identity>,
}

/// The channel, and the root file's content it was built on (`None` for
/// roots that are not a file, which never change).
struct RootedChannel {
    channel: Channel,
    root_pem: Option<Vec<u8>>,
}

/// What a channel is built from, kept to rebuild it on a new root.
struct DialSettings {
    address: ControlPlaneAddress,
    root: RootSource,
    server_name: Option<String>,
    alt_hostname: Option<String>,
}

impl DialSettings {
    /// A lazy channel trusting the roots of a root file whose content is
    /// `root_pem`, or those of the root source when it is not a file.
    fn channel(&self, root_pem: Option<&[u8]>) -> Result<Channel, ControlPlaneError> {
        let roots = match (root_pem, &self.root) {
            (Some(pem), RootSource::File(path)) => {
                RootSource::Pem(String::from_utf8_lossy(pem).into_owned())
                    .load()
                    .map_err(|error| match error {
                        ControlPlaneError::RootInvalid { reason, .. } => {
                            ControlPlaneError::RootInvalid {
                                origin: path.display().to_string(),
                                reason,
                            }
                        }
                        other => other,
                    })?
            }
            _ => self.root.load()?,
        };
        let dialer = Dialer::new(
            &self.address,
            client_tls_config(roots, self.alt_hostname.as_deref())?,
            self.server_name.as_deref(),
        )?;
        Ok(dialer.lazy_channel(REQUEST_TIMEOUT))
    }

    /// The root file's content now; `None` when the roots are not a file.
    fn read_root(&self) -> Result<Option<Vec<u8>>, ControlPlaneError> {
        let RootSource::File(path) = &self.root else {
            return Ok(None);
        };
        std::fs::read(path)
            .map(Some)
            .map_err(|source| ControlPlaneError::RootRead {
                path: path.clone(),
                source,
            })
    }
}

impl CaClient {
    /// Builds the client. It connects lazily, on the first fetch, so the
    /// proxy starts while the CA is still down; the channel reconnects by
    /// itself after the CA comes back.
    pub fn new(config: &CaClientConfig) -> Result<CaClient, CaClientError> {
        let address: ControlPlaneAddress = config.address.parse()?;
        if address.require_tls().is_err() {
            return Err(CaClientError::InsecureAddress(config.address.clone()));
        }
        let dial = DialSettings {
            address,
            root: config.root.clone(),
            server_name: config.server_name.clone(),
            alt_hostname: config.alt_hostname.clone(),
        };
        let root_pem = dial.read_root()?;
        let channel = dial.channel(root_pem.as_deref())?;
        let credentials = Credentials::new(
            config.token.clone(),
            Some(&config.cluster_id),
            config.headers.clone(),
        )?;
        Ok(CaClient {
            channel: Arc::new(Mutex::new(RootedChannel { channel, root_pem })),
            dial: Arc::new(dial),
            credentials,
            validity_secs: i64::try_from(config.secret_ttl.as_secs()).unwrap_or(i64::MAX),
            own_identity: config.own_identity.clone(),
        })
    }

    /// The channel to call on: rebuilt first when the root file's content
    /// changed and the new root loads. A root file that cannot be read or
    /// does not load leaves the channel as it is, with a warning.
    fn channel(&self) -> Channel {
        let current = self.dial.read_root();
        let mut rooted = self.channel.lock().unwrap_or_else(PoisonError::into_inner);
        match current {
            Ok(pem) if pem != rooted.root_pem => match self.dial.channel(pem.as_deref()) {
                Ok(channel) => {
                    tracing::info!(root = ?self.dial.root, "CA root changed; reconnecting with it");
                    *rooted = RootedChannel {
                        channel,
                        root_pem: pem,
                    };
                }
                Err(error) => tracing::warn!(
                    error = %ErrorChain(&error),
                    "the changed CA root does not load; keeping the previous one"
                ),
            },
            Ok(_) => {}
            Err(error) => tracing::warn!(
                error = %ErrorChain(&error),
                "the CA root cannot be read; keeping the previous one"
            ),
        }
        rooted.channel.clone()
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
        self.credentials.apply(request.metadata_mut()).await?;

        let mut client = IstioCertificateServiceClient::new(self.channel());
        let response = client.create_certificate(request).await?.into_inner();
        Ok(WorkloadCertificate::from_ca_response(
            &response.cert_chain,
            csr.private_key(),
            Some(identity),
        )?)
    }
}

impl std::fmt::Debug for CaClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaClient")
            .field("credentials", &self.credentials)
            .field("own_identity", &self.own_identity)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn config(address: &str) -> CaClientConfig {
        CaClientConfig {
            address: address.to_owned(),
            root: RootSource::File(PathBuf::from("/nonexistent")),
            token: TokenSource::None,
            cluster_id: "Kubernetes".into(),
            secret_ttl: Duration::from_secs(3600),
            own_identity: None,
            server_name: None,
            alt_hostname: None,
            headers: ExtraHeaders::default(),
        }
    }

    #[test]
    fn plain_http_is_refused_before_anything_is_read() {
        for address in ["http://127.0.0.1:15012", "http://istiod"] {
            assert!(matches!(
                CaClient::new(&config(address)),
                Err(CaClientError::InsecureAddress(_))
            ));
        }
        assert!(matches!(
            CaClient::new(&config("grpc://127.0.0.1:15012")),
            Err(CaClientError::Connection(
                ControlPlaneError::InvalidAddress { .. }
            ))
        ));
        assert!(matches!(
            CaClient::new(&config("https://127.0.0.1:15012")),
            Err(CaClientError::Connection(
                ControlPlaneError::RootRead { .. }
            ))
        ));
    }
}
