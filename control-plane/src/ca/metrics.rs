//! The CA's Prometheus metrics (certificate requests, token reviews, the
//! mesh file, and the xDS server sharing its port) and the plain-HTTP
//! `/metrics` endpoint that serves them.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use ztunnel_certs::error_chain::ErrorChain;

use super::authz::Denial;

/// How long one scrape connection may live: a scrape takes milliseconds, and
/// an idle or slow client must not hold a task forever.
const CONNECTION_DEADLINE: Duration = Duration::from_secs(30);

/// The CA's counters.
#[derive(Debug)]
pub struct CaMetrics {
    /// Owns the metric descriptions for encoding.
    registry: Registry,
    /// Denied requests by reason: where to look when ztunnels cannot get
    /// certificates.
    denied: Family<ReasonLabels, Counter>,
    /// Malformed requests (bad CSR, TTL above the maximum) by reason.
    rejected: Family<ReasonLabels, Counter>,
    /// Issued certificates, own identity or impersonated.
    issued: Family<KindLabels, Counter>,
    /// Mesh file edits refused: a non-zero rate means the CA and xDS serve
    /// an older file than the one on disk.
    mesh_reload_errors: Counter,
    /// xDS streams open now.
    xds_clients: Gauge,
    /// xDS subscriptions refused, by reason.
    xds_denied: Family<ReasonLabels, Counter>,
    /// Open xDS streams closed because their caller stopped being allowed
    /// (token expired, pod gone), by reason.
    xds_revoked: Family<ReasonLabels, Counter>,
    /// xDS responses sent, by type.
    xds_pushes: Family<TypeLabels, Counter>,
    /// Resources carried by those responses, by type.
    xds_resources: Family<TypeLabels, Counter>,
    /// Removed resource names carried by those responses, by type.
    xds_removals: Family<TypeLabels, Counter>,
    /// Encoded bytes of those responses, by type.
    xds_bytes: Family<TypeLabels, Counter>,
    /// Responses a client rejected, by type: a client and this server
    /// disagree on the wire format.
    xds_nacks: Family<TypeLabels, Counter>,
    /// Kubernetes watch failures, by kind: a non-zero rate means the mesh
    /// served is older than the API server's (the watch resumes).
    kube_watch_errors: Family<KindLabels, Counter>,
    /// Kubernetes objects left out of the mesh, by kind.
    kube_objects_refused: Family<KindLabels, Counter>,
    /// Connections closed before their TLS handshake ended, by reason:
    /// too many pending from one source or in all, or the handshake's
    /// time ran out.
    connections_refused: Family<ReasonLabels, Counter>,
    /// TokenReviews sent to the API server, by outcome: with junk refused
    /// before a review, this follows the honest callers.
    token_reviews: Family<OutcomeLabels, Counter>,
    /// Tokens refused without a review, by reason (`AuthnError::label`).
    tokens_refused_locally: Family<ReasonLabels, Counter>,
    /// Tokens answered from the review cache, by outcome.
    token_review_cache_hits: Family<OutcomeLabels, Counter>,
    /// Tokens refused because no review slot came free in time: a non-zero
    /// rate means the API server answers reviews too slowly for the load.
    token_reviews_busy: Counter,
}

impl CaMetrics {
    /// Fresh counters, registered under the `ca_` prefix.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("ca");
        let denied = Family::<ReasonLabels, Counter>::default();
        let rejected = Family::<ReasonLabels, Counter>::default();
        let issued = Family::<KindLabels, Counter>::default();
        registry.register(
            "requests_denied",
            "Certificate requests denied, by reason",
            denied.clone(),
        );
        registry.register(
            "requests_rejected",
            "Certificate requests rejected as invalid, by reason",
            rejected.clone(),
        );
        registry.register(
            "certificates_issued",
            "Workload certificates issued, by kind (own or impersonated)",
            issued.clone(),
        );
        let mut metrics = CaMetrics {
            registry,
            denied,
            rejected,
            issued,
            mesh_reload_errors: Counter::default(),
            xds_clients: Gauge::default(),
            xds_denied: Family::default(),
            xds_revoked: Family::default(),
            xds_pushes: Family::default(),
            xds_resources: Family::default(),
            xds_removals: Family::default(),
            xds_bytes: Family::default(),
            xds_nacks: Family::default(),
            kube_watch_errors: Family::default(),
            kube_objects_refused: Family::default(),
            connections_refused: Family::default(),
            token_reviews: Family::default(),
            tokens_refused_locally: Family::default(),
            token_review_cache_hits: Family::default(),
            token_reviews_busy: Counter::default(),
        };
        metrics.register_mesh();
        metrics.register_token_reviews();
        metrics
    }

    /// Registers the mesh file and xDS metrics.
    fn register_mesh(&mut self) {
        let registry = &mut self.registry;
        registry.register(
            "mesh_reload_errors",
            "Mesh file edits refused (the last good file stays in use)",
            self.mesh_reload_errors.clone(),
        );
        registry.register(
            "kube_watch_errors",
            "Kubernetes watch failures, by kind (the last state stays; the watch resumes)",
            self.kube_watch_errors.clone(),
        );
        registry.register(
            "kube_objects_refused",
            "Kubernetes objects left out of the mesh, by kind",
            self.kube_objects_refused.clone(),
        );
        registry.register(
            "connections_refused",
            "Connections closed before their TLS handshake ended, by reason (pending_per_source, pending_total, handshake_timeout)",
            self.connections_refused.clone(),
        );
        registry.register(
            "xds_clients",
            "Delta xDS streams open",
            self.xds_clients.clone(),
        );
        registry.register(
            "xds_subscriptions_denied",
            "Delta xDS subscriptions refused, by reason",
            self.xds_denied.clone(),
        );
        registry.register(
            "xds_streams_revoked",
            "Open delta xDS streams closed because their caller is no longer allowed (token expired, pod deleted), by reason",
            self.xds_revoked.clone(),
        );
        registry.register(
            "xds_pushes",
            "Delta xDS responses sent, by type",
            self.xds_pushes.clone(),
        );
        registry.register(
            "xds_resources_sent",
            "Resources sent in delta xDS responses, by type",
            self.xds_resources.clone(),
        );
        registry.register(
            "xds_removals_sent",
            "Removed resource names sent in delta xDS responses, by type",
            self.xds_removals.clone(),
        );
        registry.register(
            "xds_bytes_sent",
            "Encoded bytes of delta xDS responses, by type",
            self.xds_bytes.clone(),
        );
        registry.register(
            "xds_nacks",
            "Delta xDS responses rejected by clients, by type",
            self.xds_nacks.clone(),
        );
    }

    /// Registers the token review metrics.
    fn register_token_reviews(&mut self) {
        let registry = &mut self.registry;
        registry.register(
            "token_reviews",
            "TokenReviews sent to the API server, by outcome (authenticated, refused, failed)",
            self.token_reviews.clone(),
        );
        registry.register(
            "tokens_refused_locally",
            "Tokens refused without a TokenReview, by reason",
            self.tokens_refused_locally.clone(),
        );
        registry.register(
            "token_review_cache_hits",
            "Tokens answered from the TokenReview cache, by outcome (authenticated, refused)",
            self.token_review_cache_hits.clone(),
        );
        registry.register(
            "token_reviews_busy",
            "Tokens refused because every TokenReview slot stayed taken",
            self.token_reviews_busy.clone(),
        );
    }

    /// Counts a TokenReview sent, by `outcome`.
    pub fn record_token_review(&self, outcome: &'static str) {
        self.token_reviews
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
    }

    /// Counts a token refused without a review.
    pub fn record_token_refused_locally(&self, reason: &'static str) {
        self.tokens_refused_locally
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// Counts a token answered from the review cache.
    pub fn record_token_review_cache_hit(&self, authenticated: bool) {
        let outcome = if authenticated {
            "authenticated"
        } else {
            "refused"
        };
        self.token_review_cache_hits
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
    }

    /// Counts a token refused for want of a review slot.
    pub fn record_token_review_busy(&self) {
        self.token_reviews_busy.inc();
    }

    /// Counts a denial under its reason label.
    pub fn record_denial(&self, denial: &Denial) {
        let labels = ReasonLabels {
            reason: denial.label(),
        };
        self.denied.get_or_create(&labels).inc();
    }

    /// Counts an invalid request.
    pub fn record_rejection(&self, reason: &'static str) {
        self.rejected.get_or_create(&ReasonLabels { reason }).inc();
    }

    /// Counts a connection closed before its TLS handshake ended.
    pub fn record_connection_refused(&self, reason: &'static str) {
        self.connections_refused
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// Counts an issued certificate.
    pub fn record_issued(&self, impersonated: bool) {
        let kind = if impersonated { "impersonated" } else { "own" };
        self.issued.get_or_create(&KindLabels { kind }).inc();
    }

    /// Counts a refused mesh file edit.
    pub fn record_mesh_reload_error(&self) {
        self.mesh_reload_errors.inc();
    }

    /// Counts a failed Kubernetes watch of `kind`.
    pub fn record_kube_watch_error(&self, kind: &'static str) {
        self.kube_watch_errors
            .get_or_create(&KindLabels { kind })
            .inc();
    }

    /// Counts a Kubernetes object of `kind` left out of the mesh.
    pub fn record_kube_object_refused(&self, kind: &'static str) {
        self.kube_objects_refused
            .get_or_create(&KindLabels { kind })
            .inc();
    }

    /// Counts an open xDS stream until the returned guard is dropped.
    pub fn xds_client_connected(self: &Arc<Self>) -> XdsClientGuard {
        self.xds_clients.inc();
        XdsClientGuard(Arc::clone(self))
    }

    /// Counts a refused xDS subscription under its reason label.
    pub fn record_xds_denial(&self, denial: &Denial) {
        let labels = ReasonLabels {
            reason: denial.label(),
        };
        self.xds_denied.get_or_create(&labels).inc();
    }

    /// Counts an open xDS stream closed by a re-check of its caller.
    pub fn record_xds_revocation(&self, denial: &Denial) {
        let labels = ReasonLabels {
            reason: denial.label(),
        };
        self.xds_revoked.get_or_create(&labels).inc();
    }

    /// Counts one xDS response of `type_label` with its resources, removed
    /// names and encoded size.
    pub fn record_xds_push(
        &self,
        type_label: &'static str,
        resources: u64,
        removals: u64,
        bytes: u64,
    ) {
        let labels = TypeLabels { r#type: type_label };
        self.xds_pushes.get_or_create(&labels).inc();
        self.xds_resources.get_or_create(&labels).inc_by(resources);
        self.xds_removals.get_or_create(&labels).inc_by(removals);
        self.xds_bytes.get_or_create(&labels).inc_by(bytes);
    }

    /// Counts a rejected xDS response.
    pub fn record_xds_nack(&self, type_label: &'static str) {
        let labels = TypeLabels { r#type: type_label };
        self.xds_nacks.get_or_create(&labels).inc();
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
}

impl Default for CaMetrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Labels of the denial and rejection counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

/// Keeps one xDS stream counted in `ca_xds_clients`.
#[derive(Debug)]
pub struct XdsClientGuard(Arc<CaMetrics>);

impl Drop for XdsClientGuard {
    fn drop(&mut self) {
        self.0.xds_clients.dec();
    }
}

/// Labels of the xDS counters: the short name of the resource type.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TypeLabels {
    r#type: &'static str,
}

/// Labels of the token review counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

/// Labels of the issued-certificates counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

/// Why the control plane is not ready to serve, or `None` when it is.
pub type Readiness = Arc<dyn Fn() -> Option<String> + Send + Sync>;

/// Serves `GET /metrics` and `GET /ready` (200, or 503 with the reason)
/// over plain HTTP/1.1 until `shutdown` resolves.
///
/// A failing connection is logged and does not stop the listener.
pub async fn serve(
    metrics: Arc<CaMetrics>,
    readiness: Readiness,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            () = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    tracing::warn!(error = %ErrorChain(&error), "metrics accept failed");
                    continue;
                }
            },
        };
        let metrics = Arc::clone(&metrics);
        let readiness = Arc::clone(&readiness);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let metrics = Arc::clone(&metrics);
                let readiness = Arc::clone(&readiness);
                async move { Ok::<_, Infallible>(respond(&metrics, &readiness, &request)) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service);
            match tokio::time::timeout(CONNECTION_DEADLINE, connection).await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => {
                    tracing::debug!(error = %ErrorChain(&error), "metrics connection failed")
                }
                Err(_) => tracing::debug!("metrics connection timed out"),
            }
        });
    }
}

fn respond(
    metrics: &CaMetrics,
    readiness: &Readiness,
    request: &Request<Incoming>,
) -> Response<String> {
    let mut response = Response::new(String::new());
    if request.method() == Method::GET && request.uri().path() == "/ready" {
        if let Some(reason) = readiness() {
            *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            *response.body_mut() = format!("not ready: {reason}\n");
        } else {
            *response.body_mut() = "ready\n".to_owned();
        }
        return response;
    }
    if request.method() != Method::GET || request.uri().path() != "/metrics" {
        *response.status_mut() = StatusCode::NOT_FOUND;
        return response;
    }
    *response.body_mut() = metrics.encode();
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        ),
    );
    response
}
