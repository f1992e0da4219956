//! The process-wide bound on the connections the proxy carries, shared
//! fairly among the pods it serves: one slot per connection accepted on
//! 15001 or 15006, per TLS connection on 15008 once its handshake is done,
//! per HBONE stream to an application and per same-node connection, held
//! until the connection or the stream is gone. What a carried connection
//! may hold in memory is bounded per connection (copy buffers, TLS
//! records, HTTP/2 windows); this bounds how many there are, so that a
//! flood of connections ends in refusals counted here rather than in the
//! kernel's OOM killer taking the whole node's traffic down, and so that
//! one pod's flood ends in its own refusals, not its neighbours'.
//!
//! Each pod's slots are charged to it: its outbound connections, and the
//! connections and streams sent to it. Its share is decided by
//! `capacity/ledger.rs` (a floor each pod keeps, the rest divided among
//! the busy ones). A TLS handshake in progress on 15008 holds no slot:
//! `MAX_PENDING_HANDSHAKES` bounds those per listener, and a silent
//! connection holds a small task only (`inbound/hbone.rs`).
//!
//! When a pod may take no slot, a new connection is closed at once (a
//! stream is answered 503), `ztunnel_connections_refused_total{listener,
//! reason}` counts it on the node and `ztunnel_pod_connections_refused_total`
//! for the pod, and the log has one warning when refusals start (for the
//! node, or for the pod at its share) and one line when a connection is
//! admitted again. Which listener refuses, and how, is the caller's:
//! `accept.rs` for listeners, `inbound/hbone.rs` for streams,
//! `outbound/same_node.rs` for the same-node path.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::registry::Registry;

use crate::config::WorkloadInfo;

mod ledger;

pub use ledger::Refusal;
use ledger::{Ledger, PodId, Taken};

/// Where a slot is asked for: the `listener` label of the refusals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    /// A connection accepted on 15001.
    Outbound,
    /// A connection accepted on 15006.
    InboundPlaintext,
    /// A TLS connection on 15008, once its handshake is done.
    Hbone,
    /// A CONNECT stream on an HBONE connection.
    HboneStream,
    /// A connection handed in process from another pod of the node.
    SameNode,
    /// A connection accepted on the SOCKS5 listener (15080).
    Socks5,
}

impl Listener {
    /// The `listener` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Listener::Outbound => "outbound",
            Listener::InboundPlaintext => "inbound_plaintext",
            Listener::Hbone => "hbone",
            Listener::HboneStream => "hbone_stream",
            Listener::SameNode => "same_node",
            Listener::Socks5 => "socks5",
        }
    }
}

/// Labels of `ztunnel_connections_refused`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RefusedLabels {
    /// [`Listener::as_str`].
    listener: &'static str,
    /// [`Refusal::as_str`].
    reason: &'static str,
}

/// The ledger and the names of the pods in it, under one lock: a
/// decision is a few additions, and the names are read only on a scrape.
#[derive(Debug)]
struct Book {
    ledger: Ledger,
    /// Namespace and name of each pod with an account.
    names: HashMap<PodId, (Arc<str>, Arc<str>)>,
}

/// The bound, shared by every pod's proxy of the process.
#[derive(Debug)]
pub struct Capacity {
    book: Mutex<Book>,
    /// Slots of the node, for the log.
    limit: usize,
    refused: Family<RefusedLabels, Counter>,
    carried: Gauge,
}

/// One served pod's part of the bound, held by its proxy: the pod leaves
/// the ledger when its proxy is dropped, and its account when its last
/// slot is given back.
#[derive(Debug)]
pub struct Share(Arc<Member>);

/// What a pod's share and its slots point at.
#[derive(Debug)]
struct Member {
    capacity: Arc<Capacity>,
    pod: PodId,
    /// The pod's namespace, for the log.
    namespace: Arc<str>,
    /// The pod's name, for the log.
    name: Arc<str>,
}

/// A carried connection's slot, given back when dropped.
#[derive(Debug)]
pub struct Slot(Arc<Member>);

impl Capacity {
    /// A bound of `limit` connections, of which each pod keeps `floor`
    /// (both more than zero; the configuration refuses zero), with its
    /// metrics registered on `registry`.
    pub fn register(registry: &mut Registry, limit: usize, floor: usize) -> Arc<Self> {
        let capacity = Arc::new(Self::new(limit, floor));
        registry.register(
            "ztunnel_connections_refused",
            "Connections closed at once, and HBONE streams answered 503, because the proxy carried its most connections (MAX_CONNECTIONS) or the pod its share of them, by listener and reason",
            capacity.refused.clone(),
        );
        registry.register(
            "ztunnel_connections_carried",
            "Connections and HBONE streams the proxy carries now, each holding one of MAX_CONNECTIONS slots",
            capacity.carried.clone(),
        );
        let limit_gauge = Gauge::<i64>::default();
        limit_gauge.set(i64::try_from(limit).unwrap_or(i64::MAX));
        registry.register(
            "ztunnel_connection_limit",
            "The most connections and HBONE streams the proxy carries at once (MAX_CONNECTIONS)",
            limit_gauge,
        );
        registry.register_collector(Box::new(PodShares(Arc::clone(&capacity))));
        capacity
    }

    /// A bound of `limit` connections, `floor` kept for each pod, with
    /// metrics registered nowhere, for proxies built by tests.
    pub fn new(limit: usize, floor: usize) -> Self {
        let ledger = Ledger::new(limit, floor);
        Self {
            limit: ledger.limit(),
            book: Mutex::new(Book {
                ledger,
                names: HashMap::new(),
            }),
            refused: Family::default(),
            carried: Gauge::default(),
        }
    }

    /// The share of a newly served pod.
    pub fn join(self: &Arc<Self>, pod: &WorkloadInfo) -> Share {
        let mut book = self.book();
        let id = book.ledger.join();
        book.names
            .insert(id, (Arc::clone(&pod.namespace), Arc::clone(&pod.name)));
        Share(Arc::new(Member {
            capacity: Arc::clone(self),
            pod: id,
            namespace: Arc::clone(&pod.namespace),
            name: Arc::clone(&pod.name),
        }))
    }

    fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        // The ledger's sums stay whole at every return of its methods: a
        // panic elsewhere while the lock was held left nothing half done.
        self.book.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `pod`'s slot given back.
    fn give_back(&self, pod: PodId) {
        self.carried.dec();
        let mut book = self.book();
        if book.ledger.give_back(pod) {
            book.names.remove(&pod);
        }
    }

    /// `pod` no longer served.
    fn leave(&self, pod: PodId) {
        let mut book = self.book();
        if book.ledger.leave(pod) {
            book.names.remove(&pod);
        }
    }
}

impl Share {
    /// A slot for a new connection of `listener`, or `None` (counted and,
    /// at the start of an episode, logged) when the pod holds its share
    /// or the node its limit.
    pub fn admit(&self, listener: Listener) -> Option<Slot> {
        let member = &self.0;
        let capacity = &member.capacity;
        let taken = capacity.book().ledger.take(member.pod);
        match taken {
            Taken::Admitted {
                node_episode_ended,
                pod_episode_ended,
            } => {
                member.tell_admitted(node_episode_ended, pod_episode_ended);
                capacity.carried.inc();
                Some(Slot(Arc::clone(member)))
            }
            Taken::Refused {
                refusal,
                episode_started,
            } => {
                let labels = RefusedLabels {
                    listener: listener.as_str(),
                    reason: refusal.as_str(),
                };
                capacity.refused.get_or_create(&labels).inc();
                if episode_started {
                    member.tell_refused(listener, refusal);
                }
                None
            }
        }
    }
}

impl Member {
    /// The ends of refusal episodes an admission brought, each with its
    /// count.
    fn tell_admitted(&self, node_episode_ended: Option<u64>, pod_episode_ended: Option<u64>) {
        if let Some(refused) = node_episode_ended {
            tracing::info!(
                limit = self.capacity.limit,
                refused,
                "admitting connections again, below the connection limit"
            );
        }
        if let Some(refused) = pod_episode_ended {
            tracing::info!(
                namespace = &*self.namespace,
                pod = &*self.name,
                refused,
                "admitting the pod's connections again, below its share"
            );
        }
    }

    /// The start of a refusal episode.
    fn tell_refused(&self, listener: Listener, refusal: Refusal) {
        let listener = listener.as_str();
        match refusal {
            Refusal::NodeLimit => tracing::warn!(
                listener,
                limit = self.capacity.limit,
                "the proxy carries its most connections (MAX_CONNECTIONS); refusing new ones until some close"
            ),
            Refusal::PodShare => tracing::warn!(
                listener,
                namespace = &*self.namespace,
                pod = &*self.name,
                "the pod carries its share of the connection limit; refusing its new connections until some close, so that its neighbours keep theirs"
            ),
        }
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        self.0.capacity.leave(self.0.pod);
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.capacity.give_back(self.0.pod);
    }
}

/// The per-pod metrics, read from the ledger on each scrape: a pod's
/// series go with its account.
#[derive(Debug)]
struct PodShares(Arc<Capacity>);

/// One pod's figures at a scrape.
struct PodFigures {
    namespace: Arc<str>,
    pod: Arc<str>,
    carried: usize,
    share: usize,
    refused: [u64; 2],
}

impl Collector for PodShares {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let pods: Vec<PodFigures> = {
            let book = self.0.book();
            book.ledger
                .accounts()
                .filter_map(|(id, account)| {
                    let (namespace, pod) = book.names.get(&id)?.clone();
                    Some(PodFigures {
                        namespace,
                        pod,
                        carried: account.held,
                        share: if account.served {
                            book.ledger.share_of(id)
                        } else {
                            0
                        },
                        refused: account.refused,
                    })
                })
                .collect()
        };
        fn labels(figures: &PodFigures) -> [(&'static str, &str); 2] {
            [("namespace", &*figures.namespace), ("pod", &*figures.pod)]
        }
        let gauge = |value: usize| ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX));
        let mut carried = encoder.encode_descriptor(
            "ztunnel_pod_connections_carried",
            "Connections and HBONE streams the proxy carries now for the pod, charged to its share",
            None,
            MetricType::Gauge,
        )?;
        for figures in &pods {
            gauge(figures.carried).encode(carried.encode_family(&labels(figures))?)?;
        }
        let mut share = encoder.encode_descriptor(
            "ztunnel_pod_connection_share",
            "The most connections and HBONE streams the pod may hold now: a floor (MIN_CONNECTIONS_PER_POD), else the limit divided among the busy pods, less the floors its idle neighbours keep",
            None,
            MetricType::Gauge,
        )?;
        for figures in &pods {
            gauge(figures.share).encode(share.encode_family(&labels(figures))?)?;
        }
        let mut refused = encoder.encode_descriptor(
            "ztunnel_pod_connections_refused",
            "The pod's connections closed at once and HBONE streams answered 503 since it was first served, by reason",
            None,
            MetricType::Counter,
        )?;
        for figures in &pods {
            for (reason, count) in [Refusal::NodeLimit, Refusal::PodShare]
                .into_iter()
                .zip(figures.refused)
            {
                let [namespace, pod] = labels(figures);
                let labels = [namespace, pod, ("reason", reason.as_str())];
                ConstCounter::new(count).encode(refused.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
