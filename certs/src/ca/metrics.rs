//! The CA's Prometheus metrics and the plain-HTTP `/metrics` endpoint that
//! serves them.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

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
        CaMetrics {
            registry,
            denied,
            rejected,
            issued,
        }
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

    /// Counts an issued certificate.
    pub fn record_issued(&self, impersonated: bool) {
        let kind = if impersonated { "impersonated" } else { "own" };
        self.issued.get_or_create(&KindLabels { kind }).inc();
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

/// Labels of the issued-certificates counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

/// Serves `GET /metrics` over plain HTTP/1.1 until `shutdown` resolves.
///
/// A failing connection is logged and does not stop the listener.
pub async fn serve(
    metrics: Arc<CaMetrics>,
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
                    tracing::warn!(%error, "metrics accept failed");
                    continue;
                }
            },
        };
        let metrics = Arc::clone(&metrics);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let metrics = Arc::clone(&metrics);
                async move { Ok::<_, Infallible>(respond(&metrics, &request)) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service);
            match tokio::time::timeout(CONNECTION_DEADLINE, connection).await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => tracing::debug!(%error, "metrics connection failed"),
                Err(_) => tracing::debug!("metrics connection timed out"),
            }
        });
    }
}

fn respond(metrics: &CaMetrics, request: &Request<Incoming>) -> Response<String> {
    let mut response = Response::new(String::new());
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
