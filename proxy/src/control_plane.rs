//! The connection to the control plane's gRPC services, the CA (WIRE.md §3)
//! and xDS (§7): the `https://host:port` address, the TCP and TLS dial
//! (TLS 1.3, ALPN `h2`, server authentication only, TCP keepalive and
//! HTTP/2 pings as ztunnel sets them), and the channel tonic runs over it.
//!
//! The roots a server is trusted through are `control_plane/trust.rs`; the
//! headers every call carries (`authorization`, `clusterid`, extras) are
//! `control_plane/credentials.rs`. What each service says over the channel is
//! `identity/ca_client.rs`'s and `xds/client.rs`'s business.

use std::fmt;
use std::path::PathBuf;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tonic::transport::{Channel, Endpoint, Uri};

mod credentials;
mod trust;

pub use credentials::{Credentials, ExtraHeaders, LiteralToken, TokenSource};
pub use trust::{RootSource, client_tls_config};

/// How long dialing a control-plane server (TCP and TLS) may take (WIRE.md §3).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// TCP keepalive towards the control plane, as ztunnel sets it (WIRE.md §3),
/// so a dead path is noticed between messages.
const TCP_KEEPALIVE_IDLE: Duration = Duration::from_secs(300);
const TCP_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(75);
const TCP_KEEPALIVE_PROBES: u32 = 9;

/// HTTP/2 pings towards the control plane, as ztunnel sets them (WIRE.md §3).
const H2_PING_INTERVAL: Duration = Duration::from_secs(30);
const H2_PING_TIMEOUT: Duration = Duration::from_secs(10);

/// The port of an `https` address that names none.
const HTTPS_PORT: u16 = 443;
/// The port of an `http` address that names none.
const HTTP_PORT: u16 = 80;

/// A dial in progress; boxed because tonic needs a nameable future type.
type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Why a control-plane connection could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ControlPlaneError {
    /// The address uses `http://`: the control plane is only reached over
    /// TLS, so such an address never connects.
    #[error("unsupported scheme http in {0:?}: only https is allowed")]
    InsecureAddress(String),
    /// The address is not a URI with a host.
    #[error("address {address:?} is not a valid https URI: {reason}")]
    InvalidAddress {
        /// The configured address.
        address: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The name to verify the server against is not a DNS name or IP address.
    #[error("server name {0:?} is not a valid DNS name or IP address")]
    InvalidServerName(String),
    /// A root file could not be read.
    #[error("reading root file {path}")]
    RootRead {
        /// The configured root file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The roots are not PEM certificates, or none is usable.
    #[error("roots from {origin} hold no usable certificate: {reason}")]
    RootInvalid {
        /// Where the roots came from (a file, inline PEM, the system).
        origin: String,
        /// Why they were refused.
        reason: String,
    },
    /// `SYSTEM` roots were asked for and no system bundle exists.
    #[error("no system root bundle found (looked in {0})")]
    NoSystemRoots(String),
    /// The TLS configuration could not be built.
    #[error("building the TLS configuration")]
    Tls(#[source] rustls::Error),
    /// A header name or value cannot be sent.
    #[error("{0} is not a valid header")]
    InvalidHeader(String),
    /// The token file could not be read.
    #[error("reading token file {path}")]
    TokenRead {
        /// The configured token file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The token holds characters a header cannot carry. The token itself is
    /// never part of the message.
    #[error("the token from {0} is not a valid header value")]
    InvalidToken(String),
    /// TCP, TLS or the HTTP/2 handshake failed. tonic's own message says
    /// only "transport error"; what failed is further down its chain.
    #[error("connecting")]
    Connect(#[source] tonic::transport::Error),
}

/// Whether an address asks for TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// `https://`, or no scheme at all.
    Https,
    /// `http://`: kept so that the xDS client can refuse it on every attempt
    /// (WIRE.md §7) rather than at start-up.
    Http,
}

/// A parsed control-plane address: `https://host:port`, where a missing
/// scheme means `https` and a missing port the scheme's default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlPlaneAddress {
    text: String,
    scheme: Scheme,
    /// Without brackets for IPv6.
    host: String,
    port: u16,
}

impl FromStr for ControlPlaneAddress {
    type Err = ControlPlaneError;

    fn from_str(address: &str) -> Result<Self, Self::Err> {
        let invalid = |reason: &str| ControlPlaneError::InvalidAddress {
            address: address.to_owned(),
            reason: reason.to_owned(),
        };
        let with_scheme = if address.contains("://") {
            address.to_owned()
        } else {
            format!("https://{address}")
        };
        let uri = with_scheme
            .parse::<Uri>()
            .map_err(|error| invalid(&error.to_string()))?;
        let (scheme, default_port) = match uri.scheme_str() {
            Some("https") => (Scheme::Https, HTTPS_PORT),
            Some("http") => (Scheme::Http, HTTP_PORT),
            _ => return Err(invalid("the scheme must be https")),
        };
        let host = uri
            .host()
            .filter(|host| !host.is_empty())
            .ok_or_else(|| invalid("no host"))?;
        Ok(ControlPlaneAddress {
            text: address.to_owned(),
            scheme,
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned(),
            port: uri.port_u16().unwrap_or(default_port),
        })
    }
}

impl fmt::Display for ControlPlaneAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl ControlPlaneAddress {
    /// Whether the address asks for TLS.
    pub fn scheme(&self) -> Scheme {
        self.scheme
    }

    /// The host, without brackets.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Fails for `http://`: nothing is ever sent to the control plane in
    /// clear text.
    pub fn require_tls(&self) -> Result<(), ControlPlaneError> {
        match self.scheme {
            Scheme::Https => Ok(()),
            Scheme::Http => Err(ControlPlaneError::InsecureAddress(self.text.clone())),
        }
    }

    /// `host:port`, with brackets around an IPv6 host.
    fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// Dials one control-plane server: TCP with keepalive, then TLS with the
/// given configuration, verifying the server as `server_name`.
#[derive(Clone)]
pub struct Dialer {
    host: String,
    port: u16,
    server_name: ServerName<'static>,
    connector: TlsConnector,
    endpoint: Endpoint,
}

impl Dialer {
    /// A dialer for `address` (which must be https). `server_name` is the
    /// name the server's certificate must carry; `None` means the host of
    /// `address` (an IP SAN when it is an IP literal).
    pub fn new(
        address: &ControlPlaneAddress,
        tls: rustls::ClientConfig,
        server_name: Option<&str>,
    ) -> Result<Dialer, ControlPlaneError> {
        address.require_tls()?;
        let name = server_name.unwrap_or(&address.host).to_owned();
        let server_name = ServerName::try_from(name.clone())
            .map_err(|_| ControlPlaneError::InvalidServerName(name))?;
        // The connector dials TCP and TLS itself, so the endpoint's scheme is
        // only a placeholder and its own TCP options do not apply.
        let endpoint = Endpoint::from_shared(format!("http://{}", address.authority()))
            .map_err(|error| ControlPlaneError::InvalidAddress {
                address: address.text.clone(),
                reason: error.to_string(),
            })?
            .connect_timeout(CONNECT_TIMEOUT)
            .http2_keep_alive_interval(H2_PING_INTERVAL)
            .keep_alive_timeout(H2_PING_TIMEOUT)
            .keep_alive_while_idle(true);
        Ok(Dialer {
            host: address.host.clone(),
            port: address.port,
            server_name,
            connector: TlsConnector::from(Arc::new(tls)),
            endpoint,
        })
    }

    /// A channel that connects on first use and reconnects by itself after
    /// a failure. Each call may take at most `request_timeout`.
    pub fn lazy_channel(&self, request_timeout: Duration) -> Channel {
        let endpoint = self.endpoint.clone().timeout(request_timeout);
        endpoint.connect_with_connector_lazy(self.connector())
    }

    /// Connects now: TCP, TLS and the HTTP/2 handshake. No per-call timeout,
    /// for long-lived streams.
    pub async fn connect(&self) -> Result<Channel, ControlPlaneError> {
        self.endpoint
            .connect_with_connector(self.connector())
            .await
            .map_err(ControlPlaneError::Connect)
    }

    /// The TCP and TLS dial, as the tower service tonic connects through.
    fn connector(
        &self,
    ) -> impl tower::Service<
        Uri,
        Response = TokioIo<TlsStream<TcpStream>>,
        Error = std::io::Error,
        Future = BoxFuture<std::io::Result<TokioIo<TlsStream<TcpStream>>>>,
    > + Send
    + 'static {
        let dialer = self.clone();
        tower::service_fn(move |_: Uri| -> BoxFuture<_> { Box::pin(dialer.clone().dial()) })
    }

    /// One TCP and TLS dial, bounded by [`CONNECT_TIMEOUT`].
    async fn dial(self) -> std::io::Result<TokioIo<TlsStream<TcpStream>>> {
        tokio::time::timeout(CONNECT_TIMEOUT, async {
            let tcp = TcpStream::connect((self.host.as_str(), self.port)).await?;
            set_keepalive(&tcp)?;
            let tls = self.connector.connect(self.server_name, tcp).await?;
            Ok(TokioIo::new(tls))
        })
        .await
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))?
    }
}

/// TCP keepalive as ztunnel sets it towards the control plane.
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
    fn addresses_default_to_https_and_keep_http_to_refuse_it() {
        let cases = [
            (
                "https://127.0.0.1:15012",
                Some((Scheme::Https, "127.0.0.1", 15012)),
            ),
            ("127.0.0.1:15012", Some((Scheme::Https, "127.0.0.1", 15012))),
            (
                "istiod.istio-system.svc:15012",
                Some((Scheme::Https, "istiod.istio-system.svc", 15012)),
            ),
            (
                "https://istiod.example",
                Some((Scheme::Https, "istiod.example", 443)),
            ),
            ("https://[::1]:15012", Some((Scheme::Https, "::1", 15012))),
            (
                "http://127.0.0.1:15010",
                Some((Scheme::Http, "127.0.0.1", 15010)),
            ),
            ("http://istiod", Some((Scheme::Http, "istiod", 80))),
            ("grpc://127.0.0.1:15012", None),
            ("https://", None),
            ("", None),
        ];
        for (text, expected) in cases {
            let parsed = text.parse::<ControlPlaneAddress>().ok();
            let parsed = parsed
                .as_ref()
                .map(|address| (address.scheme(), address.host(), address.port()));
            assert_eq!(parsed, expected, "{text}");
        }
        let http: ControlPlaneAddress = "http://127.0.0.1:15010".parse().unwrap();
        let error = http.require_tls().unwrap_err();
        assert!(
            error.to_string().contains("unsupported scheme http"),
            "{error}"
        );
    }

    #[test]
    fn ipv6_authorities_get_brackets() {
        let address: ControlPlaneAddress = "https://[fd00::1]:15012".parse().unwrap();
        assert_eq!(address.authority(), "[fd00::1]:15012");
        let address: ControlPlaneAddress = "istiod:15012".parse().unwrap();
        assert_eq!(address.authority(), "istiod:15012");
        assert_eq!(address.to_string(), "istiod:15012");
    }
}
