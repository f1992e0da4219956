//! One delta ADS stream as a pure state machine: what the client has been
//! sent of each type, and the response (if any) each request or each new
//! build of the resources calls for (WIRE.md §7).
//!
//! - The first request of a type (no `response_nonce`) subscribes to all of
//!   it: the answer holds every resource whose version differs from the
//!   client's `initial_resource_versions`, and the names it listed that no
//!   longer exist. It is sent even when empty: ztunnel is not ready until
//!   it has one response of each type.
//! - An unknown type URL gets one empty response, so a client waiting for
//!   it is not held back.
//! - A request with a `response_nonce` is an ACK, or a NACK when it has an
//!   `error_detail`. Neither changes what is sent: the client keeps the
//!   resources it accepted, and a rejected version is not sent again; the
//!   next version of that resource is.
//! - A new build sends each subscribed type's difference from what this
//!   client was sent, nothing when there is none.
//!
//! Order (istiod's): within every sequence of responses, Address comes
//! before Authorization. A workload's `authorization_policies` names the
//! selector policies that pick it, and istio/ztunnel re-checks its open
//! connections only when its policy store changes: an Authorization that
//! arrived ahead of the workload update listing it would be checked
//! without it. So every subscribed type is kept
//! at one build: whatever a request is answered against, the types already
//! subscribed are brought to that build too, in [`ResourceKind::ALL`]'s
//! order, with a new subscription's answer in its own type's place. A
//! request never answers one type from a newer build than another was
//! sent. istio/ztunnel subscribes Address first, then Authorization; a
//! client that subscribes the other way round gets the Authorization
//! answer first, as it asked, and Address first from then on.
//!
//! Every subscription is served as a wildcard: names in
//! `resource_names_subscribe` (on-demand mode) are not filtered on.

use std::collections::HashMap;
use std::sync::Arc;

use ztunnel_proto::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use ztunnel_proto::xds_types::ResourceKind;

use super::cache::{Entry, Known, MeshResources, ResourceSet, changes_since};

/// The state of one stream.
#[derive(Debug)]
pub struct DeltaStream {
    /// Unique among the server's streams; the first part of every nonce.
    id: u64,
    /// Responses sent so far; the second part of every nonce.
    responses: u64,
    /// Per type (by [`ResourceKind::index`]): the set this client was last
    /// brought to, once it has subscribed. After every call, every
    /// subscribed type holds the same build's set.
    sent: [Option<Arc<ResourceSet>>; 2],
}

/// One `DeltaDiscoveryResponse` to send, holding the shared encoded
/// resources rather than copies (`wire.rs` frames it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Push {
    /// The response's type URL (the request's, for an unknown type).
    pub type_url: String,
    /// Unique per response.
    pub nonce: String,
    /// Resources added or changed, sorted by name.
    pub resources: Vec<Arc<Entry>>,
    /// Names removed, sorted.
    pub removed: Vec<Arc<str>>,
}

/// What a request was, for logs and metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestKind {
    /// The first request of a served type; answered.
    Subscribe {
        /// The type.
        kind: ResourceKind,
        /// How many versions the client listed as already held.
        known: usize,
    },
    /// A first request of a type this server does not serve; answered empty.
    UnknownType,
    /// A later request without a nonce (a subscription change): every
    /// subscription is already a wildcard, so nothing to do.
    Resubscribe {
        /// The type.
        kind: ResourceKind,
    },
    /// The client accepted a response.
    Ack {
        /// The type.
        kind: ResourceKind,
    },
    /// The client rejected (some of) a response.
    Nack {
        /// The type.
        kind: ResourceKind,
        /// The client's `error_detail.message`: `<name>: <reason>; ...`.
        detail: String,
    },
    /// An ACK or NACK of a type this stream never subscribed to (e.g. of the
    /// empty answer to an unknown type).
    Stray,
}

impl DeltaStream {
    /// A stream that has subscribed to nothing yet.
    pub fn new(id: u64) -> Self {
        DeltaStream {
            id,
            responses: 0,
            sent: [None, None],
        }
    }

    /// Handles one request against the current resources: what it was, and
    /// the responses it calls for, in the order to send them. Besides its
    /// own answer, a request brings every subscribed type to `current`
    /// (see the module's doc on order): the caller has taken `current` as
    /// seen, so no later notice of this build will come.
    pub fn on_request(
        &mut self,
        request: &DeltaDiscoveryRequest,
        current: &MeshResources,
    ) -> (RequestKind, Vec<Push>) {
        let kind = ResourceKind::from_type_url(&request.type_url);
        let subscribed = kind.is_some_and(|kind| self.sent[kind.index()].is_some());
        match (kind, request.response_nonce.is_empty()) {
            (None, true) => {
                let mut responses = self.on_resources(current);
                responses.push(self.response(&request.type_url, Vec::new(), Vec::new()));
                (RequestKind::UnknownType, responses)
            }
            (Some(kind), true) if !subscribed => {
                let known = &request.initial_resource_versions;
                let responses = self.bring_to(current, Some((kind, known)));
                let outcome = RequestKind::Subscribe {
                    kind,
                    known: known.len(),
                };
                (outcome, responses)
            }
            (Some(kind), true) => (
                RequestKind::Resubscribe { kind },
                self.on_resources(current),
            ),
            (Some(kind), false) if subscribed => {
                let outcome = match &request.error_detail {
                    Some(status) => RequestKind::Nack {
                        kind,
                        detail: status.message.clone(),
                    },
                    None => RequestKind::Ack { kind },
                };
                (outcome, self.on_resources(current))
            }
            (_, false) => (RequestKind::Stray, self.on_resources(current)),
        }
    }

    /// The responses that bring every subscribed type up to `current`: one
    /// per type that differs from what this client was sent, Address first.
    pub fn on_resources(&mut self, current: &MeshResources) -> Vec<Push> {
        self.bring_to(current, None)
    }

    /// Brings every subscribed type to `current`, in [`ResourceKind::ALL`]'s
    /// order; `subscribing` is a type subscribed by this call, with the
    /// versions the client says it holds, whose answer is sent even when
    /// empty.
    fn bring_to(
        &mut self,
        current: &MeshResources,
        subscribing: Option<(ResourceKind, &HashMap<String, String>)>,
    ) -> Vec<Push> {
        let mut responses = Vec::new();
        for kind in ResourceKind::ALL {
            let known = match (subscribing, &self.sent[kind.index()]) {
                (Some((subscribed, versions)), _) if subscribed == kind => {
                    Known::Versions(versions)
                }
                (_, Some(sent)) => Known::Sent(sent),
                (_, None) => continue,
            };
            let answer = matches!(known, Known::Versions(_));
            let set = current.get(kind);
            let (updated, removed) = changes_since(known, set);
            self.sent[kind.index()] = Some(Arc::clone(set));
            if answer || !updated.is_empty() || !removed.is_empty() {
                responses.push(self.response(kind.type_url(), updated, removed));
            }
        }
        responses
    }

    /// The types this stream has subscribed to.
    pub fn subscribed(&self) -> impl Iterator<Item = ResourceKind> + '_ {
        ResourceKind::ALL
            .into_iter()
            .filter(|kind| self.sent[kind.index()].is_some())
    }

    /// A response with a fresh nonce.
    fn response(
        &mut self,
        type_url: &str,
        resources: Vec<Arc<Entry>>,
        removed: Vec<Arc<str>>,
    ) -> Push {
        self.responses += 1;
        Push {
            type_url: type_url.to_owned(),
            nonce: format!("{:x}-{:x}", self.id, self.responses),
            resources,
            removed,
        }
    }
}

#[cfg(test)]
mod tests;
