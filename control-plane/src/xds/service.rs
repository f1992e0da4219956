//! `envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources`:
//! the async shell around `delta.rs`. It authenticates the caller, keeps
//! the shared resources current (one task rebuilds them on each registry
//! snapshot), and runs one task per stream that feeds requests and new
//! builds to the stream's [`DeltaStream`] and sends what it answers. The
//! gRPC framing is `wire.rs`'s (why not tonic's generated server: there).
//!
//! Who may subscribe: trusted node agents only (`--trusted-node-account`),
//! whose pod the registry knows with the token's UID and service account on
//! a node — the same checks the CA makes before letting a node agent
//! impersonate. The resources are the whole mesh (every pod's IP, service
//! account and node, every policy); the node agents are the only callers
//! that need them, and the only ones the CA already trusts with every
//! identity on their node. A dedicated-mode ztunnel (a workload's own
//! token) is refused and keeps using its local file.
//!
//! Admission is not forever: an open stream ends when the token it was
//! admitted on expires (its `exp` plus the leeway; for a TokenReview, the
//! `exp` of the reviewed token), or when a registry snapshot no longer has
//! the caller's pod with the token's UID and service account (the pod was
//! deleted). The client gets the status a new stream would, and reconnects
//! with its current token. Counted in `ca_xds_streams_revoked_total`.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::SystemTime;

use http_body_util::BodyExt;
use tokio::sync::{mpsc, watch};
use tonic::Status;
use tonic::body::Body;
use tonic::codegen::http::{self, HeaderMap, HeaderValue};
use tonic::codegen::{BoxFuture, Service};
use ztunnel_certs::error_chain::ErrorChain;
use ztunnel_proto::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use ztunnel_proto::xds_types::ResourceKind;

use crate::ca::CaConfig;
use crate::ca::authenticator::Authenticator;
use crate::ca::authn::{AuthnError, Caller, bearer_token};
use crate::ca::authz::{Denial, NodeAgentAccount, caller_node, trusted_node_agent};
use crate::ca::connection::{Authenticated, mark_authenticated};
use crate::ca::metrics::CaMetrics;
use crate::ca::service::bounded_for_log as bounded;
use ztunnel_mesh::{MeshSnapshot, PodRegistry};

use super::cache::MeshResources;
use super::delta::{DeltaStream, Push, RequestKind};
use super::wire::{PushFrames, RequestDecoder, ResponseBody, WireError};

/// The gRPC service name, the first segment of the request path.
pub const SERVICE_NAME: &str = "envoy.service.discovery.v3.AggregatedDiscoveryService";

/// The one method served; `StreamAggregatedResources` (state of the world)
/// is `Unimplemented`, as ztunnel never calls it.
const DELTA_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

/// Responses queued per stream. A client that reads slowly holds back only
/// its own task, and the builds that arrive meanwhile coalesce into one
/// difference instead of queueing up; a few let a burst go out unblocked.
const RESPONSE_QUEUE: usize = 4;

/// Longest NACK detail logged: enough for a few resource names and
/// reasons, without letting a client write megabyte log lines.
const MAX_LOGGED_DETAIL: usize = 1024;

/// The ADS service: a tower service for the listener's router, cheap to
/// clone.
#[derive(Clone)]
pub struct AdsService(Arc<Shared>);

/// What every stream of the service shares.
struct Shared {
    /// Who a token belongs to.
    authenticator: Arc<Authenticator>,
    /// Who may subscribe.
    trusted_node_accounts: Vec<NodeAgentAccount>,
    /// Where the caller's pod is looked up.
    registry: Arc<dyn PodRegistry>,
    /// Counters.
    metrics: Arc<CaMetrics>,
    /// The resources of the latest snapshot.
    resources: watch::Receiver<Arc<MeshResources>>,
    /// Becomes true when the server shuts down: streams end then, or the
    /// graceful shutdown would wait for them forever.
    stop: watch::Receiver<bool>,
    /// Largest request decoded.
    max_request_bytes: usize,
    /// The next stream id.
    next_stream: AtomicU64,
}

impl AdsService {
    /// A service for `config`'s registry, and the task that rebuilds the
    /// resources on each of its snapshots (it ends when the service and
    /// every stream are gone). Requests over `max_request_bytes` end their
    /// stream. Must be called inside a Tokio runtime.
    pub fn start(config: &CaConfig, max_request_bytes: usize, stop: watch::Receiver<bool>) -> Self {
        let mut changes = config.registry.changes();
        let snapshot = Arc::clone(&changes.borrow_and_update());
        let first = MeshResources::build(&snapshot, &config.trust_domain, &MeshResources::empty());
        let (publisher, resources) = watch::channel(Arc::new(first));
        tokio::spawn(publish(changes, config.trust_domain.clone(), publisher));
        AdsService(Arc::new(Shared {
            authenticator: Arc::clone(&config.authenticator),
            trusted_node_accounts: config.trusted_node_accounts.clone(),
            registry: Arc::clone(&config.registry),
            metrics: Arc::clone(&config.metrics),
            resources,
            stop,
            max_request_bytes,
            next_stream: AtomicU64::new(1),
        }))
    }
}

impl Service<http::Request<Body>> for AdsService {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let shared = Arc::clone(&self.0);
        Box::pin(async move {
            let response = shared.open(request, SystemTime::now()).await;
            Ok(response.unwrap_or_else(Status::into_http))
        })
    }
}

impl Shared {
    /// Admits a stream and starts its task, or says why not.
    async fn open(
        &self,
        request: http::Request<Body>,
        now: SystemTime,
    ) -> Result<http::Response<Body>, Status> {
        if request.uri().path() != DELTA_PATH {
            return Err(Status::unimplemented(""));
        }
        let connection = request.extensions().get::<Authenticated>();
        let subscriber = self.admit(request.headers(), connection, now).await?;
        if *self.stop.borrow() {
            return Err(Status::unavailable("server is shutting down"));
        }
        let id = self.next_stream.fetch_add(1, Ordering::Relaxed);
        let (out, frames) = mpsc::channel(RESPONSE_QUEUE);
        let stream = StreamTask {
            id,
            subscriber,
            state: DeltaStream::new(id),
            body: request.into_body(),
            decoder: RequestDecoder::new(self.max_request_bytes),
            out,
            resources: self.resources.clone(),
            registry: self.registry.changes(),
            stop: self.stop.clone(),
            metrics: Arc::clone(&self.metrics),
        };
        tokio::spawn(stream.run());
        let mut response = http::Response::new(Body::new(ResponseBody::new(frames)));
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        Ok(response)
    }

    /// Authenticates and authorizes a subscriber at `now`; a refusal is
    /// logged, counted, and returned as an opaque status. An authenticated
    /// caller marks its `connection` as such.
    async fn admit(
        &self,
        headers: &HeaderMap,
        connection: Option<&Authenticated>,
        now: SystemTime,
    ) -> Result<Subscriber, Status> {
        let header = headers.get("authorization").map(HeaderValue::as_bytes);
        let deny = |caller: Option<&Caller>, denial: Denial| {
            self.metrics.record_xds_denial(&denial);
            tracing::warn!(
                caller = caller.map_or_else(
                    || "unauthenticated".to_owned(),
                    |c| format!("{}/{} pod={}", c.namespace, c.service_account, c.pod_name)
                ),
                reason = denial.label(),
                detail = %ErrorChain(&denial),
                "xDS subscription denied"
            );
            subscription_status(&denial)
        };
        let token = bearer_token(header).map_err(|error| deny(None, error.into()))?;
        let caller = self
            .authenticator
            .authenticate(token, now)
            .await
            .map_err(|error| deny(None, error.into()))?;
        mark_authenticated(connection);
        trusted_node_agent(&caller, &self.trusted_node_accounts)
            .map_err(|denial| deny(Some(&caller), denial))?;
        let snapshot = self.registry.snapshot();
        let node = caller_node(&caller, &snapshot)
            .map_err(|denial| deny(Some(&caller), denial))?
            .to_owned();
        Ok(Subscriber {
            pod: format!("{}/{}", caller.namespace, caller.pod_name),
            node,
            caller,
        })
    }
}

/// The caller of a stream: for logs, and for the re-checks that end the
/// stream when it is no longer allowed.
#[derive(Debug)]
struct Subscriber {
    /// `namespace/name` of the caller's pod.
    pod: String,
    /// The node the registry puts it on.
    node: String,
    /// Who the token named, and until when it is accepted.
    caller: Caller,
}

/// One stream's task.
struct StreamTask {
    id: u64,
    subscriber: Subscriber,
    state: DeltaStream,
    body: Body,
    decoder: RequestDecoder,
    out: mpsc::Sender<Result<PushFrames, Status>>,
    resources: watch::Receiver<Arc<MeshResources>>,
    /// Registry snapshots, to check after each that the caller's pod is
    /// still there, with the token's UID and service account.
    registry: watch::Receiver<Arc<MeshSnapshot>>,
    stop: watch::Receiver<bool>,
    metrics: Arc<CaMetrics>,
}

impl StreamTask {
    /// Runs until the client goes away, the server stops, or the resources
    /// stop being published. Every future in the `select!` is cancel safe:
    /// `next_request` keeps partial requests in the decoder and awaits only
    /// the body's next frame, `watch::Receiver::changed` keeps its state in
    /// the receiver, and `mpsc::Sender::closed` has none.
    async fn run(mut self) {
        let _connected = self.metrics.xds_client_connected();
        tracing::info!(stream = self.id, pod = %self.subscriber.pod, node = %self.subscriber.node, "xDS stream opened");
        // The stream lives no longer than the token it was admitted on.
        let expiry = token_expiry(self.subscriber.caller.expires, SystemTime::now());
        tokio::pin!(expiry);
        let reason = loop {
            tokio::select! {
                _ = self.stop.changed() => break "server stopping",
                () = &mut expiry => {
                    self.revoke(&Denial::Authentication(AuthnError::Expired)).await;
                    break "token expired";
                }
                changed = self.registry.changed(), if self.registry.has_changed().is_ok() => {
                    if changed.is_err() {
                        continue;
                    }
                    let snapshot = Arc::clone(&self.registry.borrow_and_update());
                    if let Err(denial) = caller_node(&self.subscriber.caller, &snapshot) {
                        self.revoke(&denial).await;
                        break "caller no longer allowed";
                    }
                }
                () = self.out.closed() => break "client gone",
                request = next_request(&mut self.body, &mut self.decoder) => match request {
                    Ok(Some(request)) => {
                        if !self.on_request(&request).await {
                            break "client gone";
                        }
                    }
                    Ok(None) => break "client closed the stream",
                    Err(error) => {
                        tracing::info!(stream = self.id, error = %ErrorChain(&error), "xDS stream refused a request");
                        // Err: the client is gone already.
                        let _ = self.out.send(Err(error.status())).await;
                        break "bad request";
                    }
                },
                changed = self.resources.changed() => {
                    if changed.is_err() {
                        break "resources no longer published";
                    }
                    if !self.on_resources().await {
                        break "client gone";
                    }
                }
            }
        };
        tracing::info!(stream = self.id, pod = %self.subscriber.pod, reason, "xDS stream closed");
    }

    /// Ends the stream because its caller is no longer allowed: logged,
    /// counted, and answered with the status a new stream would get.
    async fn revoke(&mut self, denial: &Denial) {
        self.metrics.record_xds_revocation(denial);
        tracing::warn!(
            stream = self.id,
            pod = %self.subscriber.pod,
            reason = denial.label(),
            detail = %ErrorChain(denial),
            "xDS stream closed: its caller is no longer allowed"
        );
        // Err: the client is gone already.
        let _ = self.out.send(Err(subscription_status(denial))).await;
    }

    /// Handles one request; false when the client is gone. The request is
    /// answered against the latest build, which brings the stream's other
    /// types to it as well (`DeltaStream::on_request`): so the build is
    /// marked seen, and `resources.changed()` wakes only for a newer one.
    async fn on_request(&mut self, request: &DeltaDiscoveryRequest) -> bool {
        let current = Arc::clone(&self.resources.borrow_and_update());
        let (kind, pushes) = self.state.on_request(request, &current);
        self.log(request, &kind);
        self.send_all(pushes).await
    }

    fn log(&self, request: &DeltaDiscoveryRequest, kind: &RequestKind) {
        let nonce = bounded(&request.response_nonce, 64);
        match kind {
            RequestKind::Subscribe { kind, known } => tracing::info!(
                stream = self.id,
                pod = %self.subscriber.pod,
                r#type = kind.label(),
                known,
                node_id = bounded(request.node.as_ref().map_or("", |node| node.id.as_str()), 256),
                "xDS subscription"
            ),
            RequestKind::UnknownType => tracing::debug!(
                stream = self.id,
                type_url = bounded(&request.type_url, 256),
                "xDS subscription to an unknown type; answered empty"
            ),
            RequestKind::Resubscribe { kind } => tracing::debug!(
                stream = self.id,
                r#type = kind.label(),
                "xDS subscription change; every subscription is a wildcard"
            ),
            RequestKind::Ack { kind } => {
                tracing::debug!(stream = self.id, r#type = kind.label(), nonce, "xDS ACK");
            }
            RequestKind::Nack { kind, detail } => {
                self.metrics.record_xds_nack(kind.label());
                tracing::warn!(
                    stream = self.id,
                    pod = %self.subscriber.pod,
                    r#type = kind.label(),
                    nonce,
                    detail = bounded(detail, MAX_LOGGED_DETAIL),
                    "xDS NACK: the client rejected resources"
                );
            }
            RequestKind::Stray => {
                tracing::debug!(stream = self.id, nonce, "xDS ACK of an unsubscribed type");
            }
        }
    }

    /// Sends what a new build changed for this client; false when the
    /// client is gone.
    async fn on_resources(&mut self) -> bool {
        let current = Arc::clone(&self.resources.borrow_and_update());
        let pushes = self.state.on_resources(&current);
        self.send_all(pushes).await
    }

    /// Sends responses in their order; false when the client is gone.
    async fn send_all(&mut self, pushes: Vec<Push>) -> bool {
        for push in pushes {
            if !self.send(push).await {
                return false;
            }
        }
        true
    }

    /// Sends one response and counts it; false when the client is gone.
    async fn send(&mut self, push: Push) -> bool {
        let kind = ResourceKind::from_type_url(&push.type_url);
        let (resources, removed) = (push.resources.len(), push.removed.len());
        let frames = match PushFrames::new(push) {
            Ok(frames) => frames,
            Err(error) => {
                tracing::error!(stream = self.id, error = %ErrorChain(&error), "xDS response not sent");
                let _ = self.out.send(Err(error.status())).await;
                return false;
            }
        };
        if let Some(kind) = kind {
            self.metrics.record_xds_push(
                kind.label(),
                resources as u64,
                removed as u64,
                frames.len() as u64,
            );
        }
        self.out.send(Ok(frames)).await.is_ok()
    }
}

/// The next request of the stream; `None` at its clean end.
async fn next_request(
    body: &mut Body,
    decoder: &mut RequestDecoder,
) -> Result<Option<DeltaDiscoveryRequest>, WireError> {
    loop {
        if let Some(request) = decoder.decode()? {
            return Ok(Some(request));
        }
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    decoder.extend(&data);
                }
            }
            // A reset or broken connection: no more requests.
            Some(Err(_)) => return Ok(None),
            None if decoder.has_partial() => return Err(WireError::Truncated),
            None => return Ok(None),
        }
    }
}

/// Rebuilds the resources on every registry snapshot until the registry or
/// every reader of the resources is gone. Builds run on the blocking pool:
/// a mesh of 10,000 pods takes tens of milliseconds.
async fn publish(
    mut changes: watch::Receiver<Arc<MeshSnapshot>>,
    trust_domain: String,
    resources: watch::Sender<Arc<MeshResources>>,
) {
    loop {
        tokio::select! {
            () = resources.closed() => return,
            changed = changes.changed() => if changed.is_err() { return },
        }
        let snapshot = Arc::clone(&changes.borrow_and_update());
        let previous = Arc::clone(&resources.borrow());
        let trust_domain = trust_domain.clone();
        let build = move || MeshResources::build(&snapshot, &trust_domain, &previous);
        match tokio::task::spawn_blocking(build).await {
            Ok(built) => {
                resources.send_replace(Arc::new(built));
            }
            Err(error) => {
                tracing::error!(error = %ErrorChain(&error), "building xDS resources failed; serving the previous ones");
            }
        }
    }
}

/// The status a refused subscription gets: opaque, like the CA's.
/// Resolves when a token that `expires` has expired (never without an
/// expiry); `now` is the wall clock the expiry is measured against.
async fn token_expiry(expires: Option<SystemTime>, now: SystemTime) {
    match expires {
        Some(expires) => {
            let left = expires.duration_since(now).unwrap_or_default();
            tokio::time::sleep(left).await;
        }
        None => std::future::pending().await,
    }
}

fn subscription_status(denial: &Denial) -> Status {
    match denial {
        Denial::Authentication(_) => Status::unauthenticated("request authenticate failure"),
        _ => Status::permission_denied("xDS subscription not authorized"),
    }
}
