//! The CA's gRPC listener: TLS 1.3 only, ALPN `h2`, server authentication
//! only (callers authenticate with their token, WIRE.md §3), with a serving
//! certificate the CA issues itself at start-up. It serves two services, as
//! istiod does on 15012: `IstioCertificateService` and the delta ADS of
//! `crate::xds`, routed by path.
//!
//! Handshakes run in their own tasks, bounded in number and time, so that a
//! slow or failing client never stalls or stops the listener.

use std::convert::Infallible;
use std::io;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use rustls::ServerConfig;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::body::Body;
use tonic::codegen::{BoxFuture, Service, http};
use tonic::server::NamedService;
use ztunnel_certs::error_chain::ErrorChain;
use ztunnel_proto::istio::v1::auth::istio_certificate_service_server::IstioCertificateServiceServer;

use crate::xds::service::{self as ads, AdsService};
use ztunnel_certs::issuer::{IssuerError, ServingCertificate};
use ztunnel_certs::tls;

use super::CaConfig;
use super::connection::{ConnectionLimits, Guarded};
use super::metrics::CaMetrics;
use super::service::CertificateService;
use super::slots::{SourceSlots, Stage};

/// Largest gRPC request decoded: a CSR is at most 64 KiB of PEM, and the
/// metadata a few hundred bytes; 256 KiB leaves room for framing.
pub const MAX_DECODING_MESSAGE_BYTES: usize = 256 * 1024;

/// Largest response encoded: a chain with a large root bundle stays far below.
const MAX_ENCODING_MESSAGE_BYTES: usize = 1024 * 1024;

/// Largest xDS request decoded: a reconnecting client lists every resource
/// it holds in `initial_resource_versions`, about 60 bytes each; 32 MiB
/// covers half a million. Only authenticated callers get this far.
const MAX_XDS_DECODING_MESSAGE_BYTES: usize = 32 * 1024 * 1024;

/// HTTP/2 ping interval: xDS streams live for hours, and a client that
/// vanished without closing its connection is only noticed by pings. 30 s
/// is what ztunnel uses towards us (WIRE.md §3).
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);

/// How long a ping may go unanswered before the connection is dropped.
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// A TLS handshake takes milliseconds on loopback and well under a second
/// across a cluster; 10 s frees the slot of a client that stalls.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Handshakes in flight from one source address: a ztunnel opens a
/// connection or two at a time (CA and xDS, on start and on renewal); more
/// is a peer holding slots. Over it a connection is closed at once.
const MAX_PENDING_PER_SOURCE: usize = 16;

/// Handshakes in flight in all: each holds a socket and a rustls state
/// (tens of KiB), so this bounds the memory unidentified peers cost.
const MAX_PENDING_HANDSHAKES: usize = 1024;

/// Finished handshakes waiting for the gRPC server to take them.
const HANDED_OVER: usize = 256;

/// How often refused connections are logged: each is counted, the log
/// says it is happening without a line per connection.
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(10);

/// Requests a connection may have in flight: a ztunnel runs at most 8
/// concurrent CA calls (WIRE.md §3).
const MAX_CONCURRENT_STREAMS: u32 = 64;

/// No CA call legitimately takes this long; it bounds a stuck request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Pause after a failed accept (e.g. out of file descriptors) so the loop
/// does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Why the CA could not serve.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The serving certificate could not be issued.
    #[error("cannot issue the CA serving certificate")]
    ServingCertificate(#[from] IssuerError),
    /// rustls refused the serving configuration.
    #[error("TLS configuration")]
    Tls(#[from] rustls::Error),
    /// The gRPC server failed.
    #[error("gRPC server")]
    Transport(#[from] tonic::transport::Error),
}

/// Serves `IstioCertificateService` and delta ADS on `listener` until
/// `shutdown` resolves, then ends the xDS streams, drains in-flight
/// requests and returns.
pub async fn serve(
    config: CaConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let serving = config.issuer.sign_server(
        &config.serving_dns_names,
        &config.serving_ips,
        SystemTime::now(),
    )?;
    let acceptor = TlsAcceptor::from(Arc::new(tls_config(serving)?));
    let metrics = Arc::clone(&config.metrics);
    let limits = config.connections;
    let (stop, stopped) = watch::channel(false);
    let ads = AdsService::start(&config, MAX_XDS_DECODING_MESSAGE_BYTES, stopped);
    let ca = IstioCertificateServiceServer::new(CertificateService::new(config))
        .max_decoding_message_size(MAX_DECODING_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_ENCODING_MESSAGE_BYTES);
    let shutdown = async move {
        shutdown.await;
        // Long-lived xDS streams end now, so the graceful shutdown below
        // does not wait for them.
        let _ = stop.send(true);
    };

    let (connections, incoming) = mpsc::channel(HANDED_OVER);
    let accept = tokio::spawn(accept_loop(
        listener,
        acceptor,
        connections,
        metrics,
        limits,
    ));
    let result = tonic::transport::Server::builder()
        .timeout(REQUEST_TIMEOUT)
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        .serve_with_incoming_shutdown(Routes { ca, ads }, ReceiverStream::new(incoming), shutdown)
        .await;
    accept.abort();
    Ok(result?)
}

/// The two services of the listener, chosen by the request path's
/// `/<service>/` prefix; any other path is `Unimplemented`. (tonic's own
/// router would bring axum in for this one choice.)
#[derive(Clone)]
struct Routes {
    ca: IstioCertificateServiceServer<CertificateService>,
    ads: AdsService,
}

impl Service<http::Request<Body>> for Routes {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Both services are always ready.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let service = request
            .uri()
            .path()
            .strip_prefix('/')
            .and_then(|path| path.split_once('/'))
            .map(|(service, _)| service);
        match service {
            Some(IstioCertificateServiceServer::<CertificateService>::NAME) => {
                self.ca.call(request)
            }
            Some(ads::SERVICE_NAME) => self.ads.call(request),
            _ => Box::pin(async { Ok(tonic::Status::unimplemented("").into_http()) }),
        }
    }
}

/// The CA's rustls configuration: our provider, TLS 1.3 only, ALPN `h2`,
/// no client certificate.
pub fn tls_config(serving: ServingCertificate) -> Result<ServerConfig, rustls::Error> {
    let mut config = ServerConfig::builder_with_provider(tls::provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_no_client_auth()
        .with_single_cert(serving.chain, serving.key)?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// A connection handed to tonic: its TLS stream, guarded.
type Established = Guarded<TlsStream<TcpStream>>;

/// Accepts TCP connections and hands each finished TLS handshake to tonic.
/// Never waits for a slot: a connection whose source (or the server) has
/// too many handshakes pending, or too many connections established, is
/// closed at once and counted, so peers that connect and send nothing
/// cannot delay anyone else's accept. Runs until aborted or tonic stops
/// taking connections.
async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    connections: mpsc::Sender<io::Result<Established>>,
    metrics: Arc<CaMetrics>,
    limits: ConnectionLimits,
) {
    let pending = SourceSlots::new(
        Stage::Pending,
        MAX_PENDING_PER_SOURCE,
        MAX_PENDING_HANDSHAKES,
    );
    let established = SourceSlots::new(Stage::Established, limits.per_source, limits.total);
    let mut refused_since_log = 0_u64;
    let mut last_log: Option<Instant> = None;
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(error = %ErrorChain(&error), "CA accept failed");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        if connections.is_closed() {
            return;
        }
        let slot = match pending.admit(peer.ip()) {
            Ok(slot) => slot,
            Err(refused) => {
                drop(stream);
                metrics.record_connection_refused(refused.label());
                refused_since_log += 1;
                if last_log.is_none_or(|at| at.elapsed() >= REFUSAL_LOG_EVERY) {
                    tracing::warn!(
                        %peer,
                        reason = refused.label(),
                        refused = refused_since_log,
                        per_source = MAX_PENDING_PER_SOURCE,
                        total = MAX_PENDING_HANDSHAKES,
                        "closing connections whose TLS handshake cannot be pending now \
                         (counted in ca_connections_refused)"
                    );
                    refused_since_log = 0;
                    last_log = Some(Instant::now());
                }
                continue;
            }
        };
        let acceptor = acceptor.clone();
        let connections = connections.clone();
        let metrics = Arc::clone(&metrics);
        let established = Arc::clone(&established);
        tokio::spawn(async move {
            let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await;
            // The slot is given back once the handshake has ended either
            // way, before waiting for the gRPC server to take the stream.
            drop(slot);
            match handshake {
                Ok(Ok(tls)) => {
                    let slot = match established.admit(peer.ip()) {
                        Ok(slot) => slot,
                        Err(refused) => {
                            metrics.record_connection_refused(refused.label());
                            tracing::debug!(%peer, reason = refused.label(), "CA connection closed: too many established");
                            return;
                        }
                    };
                    let guarded = Guarded::new(tls, slot, limits, Arc::clone(&metrics));
                    // Err: the server is shutting down; the connection just closes.
                    let _ = connections.send(Ok(guarded)).await;
                }
                Ok(Err(error)) => {
                    tracing::debug!(%peer, error = %ErrorChain(&error), "CA TLS handshake failed")
                }
                Err(_) => {
                    metrics.record_connection_refused("handshake_timeout");
                    tracing::debug!(%peer, "CA TLS handshake timed out");
                }
            }
        });
    }
}
