//! The xDS stream task: dial istiod, open `DeltaAggregatedResources`, send
//! the initial requests, then for each response call the pure
//! [`decide`](super::apply::decide), apply its changes to the shared state
//! and send its ACK or NACK; when the stream ends, wait as
//! [`Reconnect`](super::reconnect::Reconnect) says and do it again, echoing the
//! versions accepted so far. The state is kept and served throughout a
//! disconnect.
//!
//! Readiness is held until one response of each wildcard type has been
//! ACKed (a NACKed one does not count), across reconnects.

use std::collections::BTreeMap;

use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;
use tonic::transport::Channel;
use ztunnel_certs::error_chain::ErrorChain;
use ztunnel_proto::envoy::config::core::v3::Node;
use ztunnel_proto::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use ztunnel_proto::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DeltaDiscoveryResponse};
use ztunnel_proto::xds_types::ResourceKind;

use crate::config::XdsSettings;
use crate::control_plane::{
    ControlPlaneError, Credentials, Dialer, TokenSource, client_tls_config,
};
use crate::drain::DrainWatcher;
use crate::readiness::{BlockReady, Ready};
use crate::state::{Interner, SharedState};

use super::XdsError;
use super::apply::{self, Applied};
use super::demand::{Demanded, Pending};
use super::known::KnownVersions;
use super::metrics::XdsMetrics;
use super::reconnect::{Reconnect, StreamEnd};
use super::request;

/// Resources in one response from which the memory its decoding freed is
/// given back to the system at once (`memory.rs`).
const LARGE_RESPONSE: usize = 1000;

/// Largest response decoded (WIRE.md §7): a full push of a large cluster's
/// workloads runs to tens of MiB; 200 MiB is istio/ztunnel's limit.
const MAX_MESSAGE_BYTES: usize = 200 * 1024 * 1024;

/// Requests queued towards istiod: the two initial ones plus ACKs of
/// responses in flight. A reply waits when it is full, which only happens
/// when istiod stops reading.
const REQUEST_QUEUE: usize = 16;

/// The xDS client; [`XdsClient::run`] is its task.
pub struct XdsClient {
    settings: XdsSettings,
    credentials: Credentials,
    node: Node,
    state: SharedState,
    metrics: XdsMetrics,
    known: KnownVersions,
    /// The shared copies of what the stream's workloads repeat, kept
    /// across responses (and reconnects) so that a workload arriving later
    /// shares with those already stored.
    interner: Interner,
    reconnect: Reconnect,
    /// Readiness held per wildcard type until its first ACK.
    waiting: BTreeMap<ResourceKind, BlockReady>,
    /// With `XDS_ON_DEMAND`: the data path's demands, and the names asked
    /// for so far.
    on_demand: Option<(mpsc::Receiver<Demanded>, Pending)>,
}

impl XdsClient {
    /// Builds the client and registers its readiness tasks on `ready`.
    /// Nothing is dialed yet; an `http://` address or missing roots fail
    /// each attempt, not this.
    pub fn new(
        settings: &XdsSettings,
        cluster_id: &str,
        state: SharedState,
        metrics: XdsMetrics,
        ready: &Ready,
    ) -> Result<XdsClient, XdsError> {
        let has_token = settings.token != TokenSource::None;
        // istiod reads `clusterid` only next to a token (WIRE.md §7).
        let credentials = Credentials::new(
            settings.token.clone(),
            has_token.then_some(cluster_id),
            settings.headers.clone(),
        )?;
        if let Some(alt) = &settings.alt_hostname {
            rustls::pki_types::ServerName::try_from(alt.as_str())
                .map_err(|_| ControlPlaneError::InvalidServerName(alt.clone()))?;
        }
        // On demand, Address is no wildcard: there is no first response of
        // everything to wait for, only Authorization's.
        let waiting = ResourceKind::ALL
            .into_iter()
            .filter(|kind| !(settings.on_demand && *kind == ResourceKind::Address))
            .map(|kind| (kind, ready.register_task(&readiness_name(kind))))
            .collect();
        Ok(XdsClient {
            settings: settings.clone(),
            credentials,
            node: request::node(&settings.node),
            state,
            metrics,
            known: KnownVersions::new(),
            interner: Interner::new(),
            reconnect: Reconnect::new(),
            waiting,
            on_demand: None,
        })
    }

    /// Takes the data path's demands from `demands` (`XDS_ON_DEMAND`).
    pub fn with_demands(mut self, demands: mpsc::Receiver<Demanded>) -> XdsClient {
        self.on_demand = Some((demands, Pending::default()));
        self
    }

    /// Keeps a stream open until the drain: reconnects after every end.
    pub async fn run(mut self, drain: DrainWatcher) {
        for (key, error) in &self.settings.node.invalid_metadata {
            tracing::warn!(key = %key, %error, "ISTIO_METAJSON_ value is not JSON; left out of the node metadata");
        }
        tracing::info!(
            address = %self.settings.address,
            node = %self.node.id,
            token = self.credentials.has_token(),
            "xDS client starting"
        );
        loop {
            // Cancel safe: a response's state changes and versions are
            // recorded together, with no await in between; a drain that
            // lands while its reply is queued only loses the reply.
            let end = tokio::select! {
                () = drain.signaled() => return,
                end = self.attempt() => end,
            };
            self.metrics.set_connected(false);
            self.metrics.record_termination(end.reason());
            let wait = self.reconnect.after(&end, rand::random());
            // Failures were logged where they happened, as warnings.
            if end == StreamEnd::Clean {
                tracing::info!(?wait, "xDS stream closed by the server; reconnecting");
            } else {
                tracing::debug!(?end, ?wait, "xDS reconnecting");
            }
            tokio::select! {
                () = drain.signaled() => return,
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// One stream, from dialing to its end.
    async fn attempt(&mut self) -> StreamEnd {
        let channel = match self.connect().await {
            Ok(channel) => channel,
            Err(error) => {
                tracing::warn!(address = %self.settings.address, error = %ErrorChain(&error), "xDS connection failed");
                return StreamEnd::ConnectionFailed;
            }
        };
        let (requests, outbound) = mpsc::channel(REQUEST_QUEUE);
        let demanded = self
            .on_demand
            .as_ref()
            .map(|(_, pending)| pending.subscribed());
        for initial in request::initial_requests_on_demand(&self.node, &self.known, demanded) {
            // The queue is empty and larger than the initial requests.
            let _ = requests.try_send(initial);
        }
        let mut request = tonic::Request::new(ReceiverStream::new(outbound));
        if let Err(error) = self.credentials.apply(request.metadata_mut()).await {
            tracing::warn!(error = %ErrorChain(&error), "xDS credentials unavailable");
            return StreamEnd::ConnectionFailed;
        }
        let mut client = AggregatedDiscoveryServiceClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_BYTES);
        let mut responses = match client.delta_aggregated_resources(request).await {
            Ok(response) => response.into_inner(),
            Err(status) => return status_end(status),
        };
        self.metrics.set_connected(true);
        tracing::info!(address = %self.settings.address, "xDS stream open");
        loop {
            // Both cancel safe: `message`, and `recv` of a demand.
            let received = tokio::select! {
                received = responses.message() => received,
                Some(demanded) = next_demand(&mut self.on_demand) => {
                    let subscribe = self
                        .on_demand
                        .as_mut()
                        .and_then(|(_, pending)| pending.add(demanded));
                    if let Some(subscribe) = subscribe {
                        // Gone request side: the next read reports why.
                        let _ = requests.send(subscribe).await;
                    }
                    continue;
                }
            };
            let response = match received {
                Ok(Some(response)) => response,
                Ok(None) => return StreamEnd::Clean,
                Err(status) => return status_end(status),
            };
            let answered = self
                .on_demand
                .as_ref()
                .map(|(_, pending)| pending.answered_by(&response))
                .unwrap_or_default();
            let (reply, acked) = self.handle(response);
            // The state has the response now: its askers find it there.
            if let Some((_, pending)) = self.on_demand.as_mut() {
                pending.answer(answered);
            }
            if requests.send(reply).await.is_err() {
                // The request side is gone: the next read reports why.
                continue;
            }
            if let Some(kind) = acked
                && self.waiting.remove(&kind).is_some()
            {
                tracing::info!(type_url = kind.type_url(), "xDS: first response ACKed");
            }
        }
    }

    /// Dials with the roots as they are on disk now, so a rotated root is
    /// used from the next reconnect on.
    async fn connect(&self) -> Result<Channel, ControlPlaneError> {
        let settings = &self.settings;
        settings.address.require_tls()?;
        let tls = client_tls_config(settings.root.load()?, settings.alt_hostname.as_deref())?;
        Dialer::new(&settings.address, tls, None)?.connect().await
    }

    /// Applies one response; returns the reply and, for an ACK of a type we
    /// handle, that type.
    fn handle(
        &mut self,
        response: DeltaDiscoveryResponse,
    ) -> (DeltaDiscoveryRequest, Option<ResourceKind>) {
        self.metrics
            .record_message(&response.type_url, response.encoded_len());
        let update = apply::decide(&self.known, &response, &mut self.interner);
        let Some(kind) = update.kind else {
            tracing::info!(type_url = %response.type_url, "xDS response of an unknown type; ACKed and ignored");
            return (update.reply, None);
        };
        let authorization_changed = update.authorization_changed();
        let applied = if update.changes.is_empty() {
            Applied::default()
        } else {
            let changes = update.changes;
            self.state.apply(
                |state| apply::apply_changes(state, changes),
                authorization_changed,
            )
        };
        self.known.record(kind, update.versions);
        // A large response (the first of a stream, a big push) decoded and
        // converted far more than the state keeps.
        if applied.updated + applied.removed >= LARGE_RESPONSE {
            crate::memory::give_back();
        }
        self.metrics.record_resources(
            kind.type_url(),
            applied.updated,
            applied.removed,
            update.rejected.len(),
        );
        let detail = update.reply.error_detail.as_ref();
        match detail {
            Some(status) => tracing::warn!(
                type_url = kind.type_url(),
                nonce = %response.nonce,
                updated = applied.updated,
                removed = applied.removed,
                rejected = %status.message,
                "xDS response NACKed"
            ),
            None => tracing::debug!(
                type_url = kind.type_url(),
                nonce = %response.nonce,
                updated = applied.updated,
                removed = applied.removed,
                "xDS response ACKed"
            ),
        }
        let acked = detail.is_none().then_some(kind);
        (update.reply, acked)
    }
}

/// The next demand, when demands are taken; never otherwise.
async fn next_demand(
    on_demand: &mut Option<(mpsc::Receiver<Demanded>, Pending)>,
) -> Option<Demanded> {
    match on_demand {
        Some((demands, _)) => demands.recv().await,
        None => std::future::pending().await,
    }
}

/// The readiness task name of a type, as 503 answers show it.
fn readiness_name(kind: ResourceKind) -> String {
    let short = kind
        .type_url()
        .rsplit('/')
        .next()
        .unwrap_or(kind.type_url());
    format!("xDS {short}")
}

/// How a stream that ended with `status` ended; OK is a clean end.
fn status_end(status: tonic::Status) -> StreamEnd {
    if status.code() == Code::Ok {
        return StreamEnd::Clean;
    }
    tracing::warn!(code = ?status.code(), message = status.message(), "xDS stream failed");
    StreamEnd::Status {
        code: status.code(),
        message: status.message().to_owned(),
    }
}
