//! The proxy's own HTTP servers: admin (127.0.0.1:15000: `/config_dump`,
//! `/logging` with Istio's query parameters, `/quitquitquit`,
//! `/debug/pprof/profile`, in `admin/profile.rs`) and stats (15020: `/metrics`,
//! `/stats/prometheus`), and the small HTTP/1 accept loop they and the
//! readiness server (readiness.rs) share. What the config dump contains is
//! the caller's [`ConfigDump`]; how metrics are named is metrics.rs.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{ACCEPT_ENCODING, CONTENT_ENCODING, CONTENT_TYPE, HeaderValue, VARY};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use ztunnel_certs::error_chain::ErrorChain;

use crate::drain::DrainWatcher;
use crate::metrics;
use crate::telemetry::{LogHandle, TelemetryError};

mod encoding;
mod profile;

/// Response body of every admin-side server.
pub type Body = Full<Bytes>;

/// A slow or idle client may hold a connection this long before sending
/// its request headers; bounds what an idle scraper can keep open.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Open connections per server. Scrapers, probes and an operator need a
/// handful; the bound keeps a flood from using up the admin runtime.
const MAX_CONNECTIONS: usize = 64;

/// After a failed `accept` (e.g. out of file descriptors) wait this long
/// before the next, so the loop does not spin.
const ACCEPT_RETRY_DELAY: Duration = Duration::from_millis(100);

/// The Prometheus text format as prometheus-client writes it.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// How to use `/logging`, sent with every refusal.
const LOGGING_USAGE: &str = "usage: POST /logging[?level=<levels>][&reset]
  level: a comma list of off, error, warn, info, debug or trace (the
         default) and <target>=<level> (one module), laid over the
         current filter; reset: start again from the filter ztunnel
         started with (RUST_LOG). With neither, the filter in force.
";

/// Errors of admin requests, each answered as 400.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AdminError {
    /// A `%` escape in the query string is not two hex digits, or the
    /// decoded bytes are not UTF-8.
    #[error("malformed query string")]
    MalformedQuery,
    /// A numeric parameter is not a whole number from 1 to its maximum.
    #[error("{key} must be a whole number from 1 to {max}")]
    OutOfRange {
        /// The parameter.
        key: &'static str,
        /// Its largest value.
        max: u64,
    },
}

/// What `/config_dump` shows: workloads, services, policies and
/// certificates, as the proxy's state renders them. Implementations must
/// never include private keys: a certificate shows its identity and
/// validity only.
pub trait ConfigDump: Send + Sync {
    /// The current configuration as JSON.
    fn config_dump(&self) -> serde_json::Value;
}

/// What the admin server needs from the rest of the proxy.
#[derive(Clone)]
pub struct Admin {
    /// Source of `/config_dump`.
    pub config: Arc<dyn ConfigDump>,
    /// Changes the log filter for `/logging`.
    pub logs: LogHandle,
    /// Called by `POST /quitquitquit`; it should start the drain (e.g. by
    /// waking the task that owns the `DrainTrigger`) and return at once.
    pub quit: Arc<dyn Fn() + Send + Sync>,
}

impl Admin {
    async fn respond(&self, request: Request<Incoming>) -> Response<Body> {
        let query = request.uri().query().unwrap_or("");
        match (request.method(), request.uri().path()) {
            (&Method::GET, "/") => index(),
            (&Method::GET, "/config_dump") => self.config_dump(),
            (&Method::POST, "/logging") => self.logging(query),
            (_, "/logging") => text(
                StatusCode::METHOD_NOT_ALLOWED,
                format!("/logging takes POST only\n{LOGGING_USAGE}"),
            ),
            (&Method::POST, "/quitquitquit") => {
                tracing::info!("shutdown requested through /quitquitquit");
                (self.quit)();
                text(StatusCode::OK, "shutdown now\n".to_owned())
            }
            (_, "/debug/pprof/profile") => cpu_profile(query).await,
            (_, "/debug/pprof/heap" | "/debug/pprof/heap/profiling") => heap_profile().await,
            (_, "/config_dump" | "/quitquitquit") => text(
                StatusCode::METHOD_NOT_ALLOWED,
                "method not allowed\n".to_owned(),
            ),
            _ => text(StatusCode::NOT_FOUND, "not found\n".to_owned()),
        }
    }

    fn config_dump(&self) -> Response<Body> {
        let response = match serde_json::to_vec_pretty(&self.config.config_dump()) {
            Ok(json) => with_type(StatusCode::OK, json, "application/json"),
            Err(error) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("{error}\n")),
        };
        // The dump of a large mesh is a JSON tree of tens of MB, built and
        // freed on this thread: give it back rather than keep it resident.
        crate::memory::give_back();
        response
    }

    /// `/logging` as istio/ztunnel answers it: without `level` or `reset`
    /// the filter in force; else `level` laid over the current filter, or
    /// over the start-up one with `reset`.
    fn logging(&self, query: &str) -> Response<Body> {
        let (level, reset) = match (query_value(query, "level"), query_value(query, "reset")) {
            (Ok(level), Ok(reset)) => (level, reset.is_some()),
            (Err(error), _) | (_, Err(error)) => {
                return text(StatusCode::BAD_REQUEST, format!("{error}\n{LOGGING_USAGE}"));
            }
        };
        let answer = match (level, reset) {
            (None, false) => self.logs.current(),
            (level, reset) => {
                let answer = self.logs.change(reset, level.as_deref().unwrap_or(""));
                if let Ok(filter) = &answer {
                    tracing::info!(%filter, "log filter changed through /logging");
                }
                answer
            }
        };
        match answer {
            Ok(filter) => text(StatusCode::OK, format!("current log level is {filter}\n")),
            Err(TelemetryError::InvalidLevel(level)) => text(
                StatusCode::BAD_REQUEST,
                format!("Invalid level provided: {level}\n{LOGGING_USAGE}"),
            ),
            Err(error @ TelemetryError::InvalidFilter { .. }) => text(
                StatusCode::BAD_REQUEST,
                format!("{}\n{LOGGING_USAGE}", ErrorChain(&error)),
            ),
            Err(error) => text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("{}\n", ErrorChain(&error)),
            ),
        }
    }
}

/// `/debug/pprof/profile`: 200 with the profile, 400 for a bad query, 409
/// while another profile runs.
async fn cpu_profile(query: &str) -> Response<Body> {
    let request = match profile::parse_request(query) {
        Ok(request) => request,
        Err(error) => return text(StatusCode::BAD_REQUEST, format!("{error}\n")),
    };
    tracing::info!(
        seconds = request.duration.as_secs(),
        frequency = request.frequency,
        "CPU profile"
    );
    match profile::cpu_profile(request).await {
        Ok(profile) => with_type(StatusCode::OK, profile, "application/octet-stream"),
        Err(error @ profile::ProfileError::Busy) => {
            text(StatusCode::CONFLICT, format!("{error}\n"))
        }
        Err(error) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("{}\n", ErrorChain(&error)),
        ),
    }
}

/// `/debug/pprof/heap`: 200 with the live heap as sampled, in pprof's
/// format; 501 when sampling is off (`ZTUNNEL_HEAP_SAMPLE_BYTES=0`).
async fn heap_profile() -> Response<Body> {
    // Symbolizing reads the binary's debug information: not on a worker.
    match tokio::task::spawn_blocking(crate::memory::heap_profile).await {
        Ok(Some(profile)) => with_type(StatusCode::OK, profile, "application/octet-stream"),
        Ok(None) => text(
            StatusCode::NOT_IMPLEMENTED,
            "heap sampling is off (ZTUNNEL_HEAP_SAMPLE_BYTES=0)\n".to_owned(),
        ),
        Err(error) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("building the heap profile: {error}\n"),
        ),
    }
}

/// Serves the admin endpoints on `listener` until `drain` signals.
pub async fn serve_admin(listener: TcpListener, admin: Admin, drain: DrainWatcher) {
    let admin = Arc::new(admin);
    serve_http(listener, drain, move |request| {
        let admin = Arc::clone(&admin);
        async move { admin.respond(request).await }
    })
    .await;
}

/// Serves `/metrics` and `/stats/prometheus` from `registry` on `listener`
/// until `drain` signals.
pub async fn serve_stats(listener: TcpListener, registry: Arc<Registry>, drain: DrainWatcher) {
    serve_http(listener, drain, move |request| {
        std::future::ready(match (request.method(), request.uri().path()) {
            (&Method::GET, "/metrics" | "/stats/prometheus") => match metrics::encode(&registry) {
                Ok(encoded) => metrics_answer(&request, encoded),
                Err(error) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("{error}\n")),
            },
            _ => text(StatusCode::NOT_FOUND, "not found\n".to_owned()),
        })
    })
    .await;
}

/// The metrics text `encoded`, gzipped where `request` accepts it.
fn metrics_answer(request: &Request<Incoming>, encoded: String) -> Response<Body> {
    let accepted = request
        .headers()
        .get(ACCEPT_ENCODING)
        .and_then(|value| value.to_str().ok());
    let compressed = encoding::accepts_gzip(accepted)
        .then(|| encoding::gzip(encoded.as_bytes()))
        .and_then(Result::ok);
    // A body to compress is in memory already: a failure cannot come from
    // the writer, and the text is sent as it is.
    let Some(compressed) = compressed else {
        let mut response = with_type(StatusCode::OK, encoded.into_bytes(), OPENMETRICS);
        response
            .headers_mut()
            .insert(VARY, HeaderValue::from_static("accept-encoding"));
        return response;
    };
    let mut response = with_type(StatusCode::OK, compressed, OPENMETRICS);
    let headers = response.headers_mut();
    headers.insert(CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    headers.insert(VARY, HeaderValue::from_static("accept-encoding"));
    response
}

/// The value of `key` in a query string, percent-decoded (`+` is a space).
fn query_value(query: &str, key: &str) -> Result<Option<String>, AdminError> {
    for pair in query.split('&') {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        if percent_decode(name)? == key {
            return percent_decode(value).map(Some);
        }
    }
    Ok(None)
}

fn percent_decode(text: &str) -> Result<String, AdminError> {
    let mut decoded = Vec::with_capacity(text.len());
    let mut bytes = text.bytes();
    while let Some(byte) = bytes.next() {
        decoded.push(match byte {
            b'+' => b' ',
            b'%' => {
                let high = bytes.next().and_then(hex_digit);
                let low = bytes.next().and_then(hex_digit);
                match (high, low) {
                    (Some(high), Some(low)) => high << 4 | low,
                    _ => return Err(AdminError::MalformedQuery),
                }
            }
            other => other,
        });
    }
    String::from_utf8(decoded).map_err(|_| AdminError::MalformedQuery)
}

fn hex_digit(byte: u8) -> Option<u8> {
    char::from(byte)
        .to_digit(16)
        .and_then(|digit| u8::try_from(digit).ok())
}

/// A plain-text response.
pub(crate) fn text(status: StatusCode, body: String) -> Response<Body> {
    with_type(status, body.into_bytes(), "text/plain; charset=utf-8")
}

fn with_type(status: StatusCode, body: Vec<u8>, content_type: &'static str) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// What the index page lists: each endpoint's path, the method it takes,
/// and what it is for. Every path here is answered by [`Admin::respond`].
const ENDPOINTS: &[(&str, &str, &str)] = &[
    (
        "config_dump",
        "GET",
        "the workloads, services, policies, certificates (never keys) and pods as istioctl ztunnel-config reads them",
    ),
    (
        "logging",
        "POST",
        "the log filter in force; ?level=<level> or ?level=<module>=<level>,... changes it, ?reset restores RUST_LOG",
    ),
    (
        "debug/pprof/profile",
        "GET",
        "a CPU profile for go tool pprof; ?seconds=1..300 (10), ?frequency=1..1000 Hz (100)",
    ),
    (
        "debug/pprof/heap",
        "GET",
        "the live heap for go tool pprof, sampled about once per ZTUNNEL_HEAP_SAMPLE_BYTES allocated",
    ),
    ("quitquitquit", "POST", "starts the drain, as SIGTERM does"),
];

/// `GET /`: the endpoints, linked, as istio/ztunnel's admin lists its
/// own; the metrics are on the stats port (15020, `/metrics`).
fn index() -> Response<Body> {
    let rows: String = ENDPOINTS
        .iter()
        .map(|(path, method, what)| {
            format!(
                "<tr><td><a href=\"{path}\">/{path}</a></td><td>{method}</td><td>{what}</td></tr>\n"
            )
        })
        .collect();
    let page = format!(
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>ztunnel admin</title></head>\n\
         <body><h1>ztunnel admin</h1>\n<table>\n<tr><th>endpoint</th><th>method</th><th>what it does</th></tr>\n\
         {rows}</table>\n<p>Metrics: <code>/metrics</code> on the stats port (15020); readiness: \
         <code>/healthz/ready</code> on 15021.</p></body></html>\n"
    );
    with_type(
        StatusCode::OK,
        page.into_bytes(),
        "text/html; charset=utf-8",
    )
}

/// Accepts HTTP/1 connections on `listener` and answers each request with
/// `respond`, until `drain` signals: then it stops accepting, lets open
/// connections finish their request, and cuts them when the drain is forced.
/// At most [`MAX_CONNECTIONS`] are served at once; the next waits its turn.
pub(crate) async fn serve_http<F, Answer>(listener: TcpListener, drain: DrainWatcher, respond: F)
where
    F: Fn(Request<Incoming>) -> Answer + Send + Sync + 'static,
    Answer: Future<Output = Response<Body>> + Send + 'static,
{
    let respond = Arc::new(respond);
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let permit = tokio::select! {
            () = drain.signaled() => break,
            permit = Arc::clone(&slots).acquire_owned() => permit,
        };
        // The semaphore is never closed, so this only ends the loop in theory.
        let Ok(permit) = permit else { break };
        let accepted = tokio::select! {
            () = drain.signaled() => break,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _peer)) => stream,
            Err(error) => {
                tracing::warn!(error = %ErrorChain(&error), "admin accept failed");
                tokio::time::sleep(ACCEPT_RETRY_DELAY).await;
                continue;
            }
        };
        let respond = Arc::clone(&respond);
        let drain = drain.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let service = service_fn(move |request| {
                let response = respond(request);
                async move { Ok::<_, Infallible>(response.await) }
            });
            let connection = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(connection);
            let finished = tokio::select! {
                finished = connection.as_mut() => finished,
                () = drain.signaled() => {
                    connection.as_mut().graceful_shutdown();
                    tokio::select! {
                        finished = connection.as_mut() => finished,
                        () = drain.forced() => Ok(()),
                    }
                }
            };
            if let Err(error) = finished {
                tracing::debug!(error = %ErrorChain(&error), "admin connection ended with an error");
            }
        });
    }
}

#[cfg(test)]
mod tests;
