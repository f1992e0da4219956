//! On-demand Address resources (`XDS_ON_DEMAND`, WIRE.md §7): the Address
//! type is not subscribed as a wildcard, and a connection that needs an
//! address the state does not know asks for it by name (`<network>/<ip>`)
//! and waits, bounded, for the stream to answer.
//!
//! [`Demand`] is the handle the data path holds; the client task keeps the
//! [`Pending`] names, subscribes each once on its stream (and again on
//! every reconnect), and wakes the waiters of a name when a response
//! carries it: as a resource's name or one of its aliases (istiod names a
//! workload by its uid and gives the address asked as an alias), or as a
//! removal (istiod's word that there is no such resource).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use ztunnel_proto::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DeltaDiscoveryResponse};
use ztunnel_proto::xds_types::ResourceKind;

/// Demands waiting for the client task to take them: beyond this, a
/// demand is not made and its connection goes on with what the state has.
const QUEUE: usize = 1024;

/// One name asked for, and how its asker is told it arrived.
#[derive(Debug)]
pub struct Demanded {
    name: Arc<str>,
    answered: oneshot::Sender<()>,
}

/// The data path's handle: asks the xDS client for Address resources.
#[derive(Debug, Clone)]
pub struct Demand {
    sender: mpsc::Sender<Demanded>,
}

/// A new handle and the receiver the client task takes its demands from.
pub fn channel() -> (Demand, mpsc::Receiver<Demanded>) {
    let (sender, receiver) = mpsc::channel(QUEUE);
    (Demand { sender }, receiver)
}

impl Demand {
    /// Asks for the Address resource `name` and waits until a response
    /// carries it or `within` passes; whether it came. The caller looks in
    /// the state again either way.
    pub async fn fetch(&self, name: &str, within: Duration) -> bool {
        let (answered, arrived) = oneshot::channel();
        let demanded = Demanded {
            name: Arc::from(name),
            answered,
        };
        if self.sender.try_send(demanded).is_err() {
            tracing::debug!(name, "on-demand queue full or closed; not asked");
            return false;
        }
        matches!(tokio::time::timeout(within, arrived).await, Ok(Ok(())))
    }
}

/// The client task's record of the names asked for: those subscribed on
/// the stream, and the waiters of each name not answered yet.
#[derive(Debug, Default)]
pub struct Pending {
    subscribed: BTreeSet<Arc<str>>,
    waiting: HashMap<Arc<str>, Vec<oneshot::Sender<()>>>,
}

impl Pending {
    /// Records a demand. The subscription to send for it, unless its name
    /// was subscribed already on this stream.
    pub fn add(&mut self, demanded: Demanded) -> Option<DeltaDiscoveryRequest> {
        let Demanded { name, answered } = demanded;
        self.waiting
            .entry(Arc::clone(&name))
            .or_default()
            .push(answered);
        if !self.subscribed.insert(Arc::clone(&name)) {
            return None;
        }
        Some(DeltaDiscoveryRequest {
            type_url: ResourceKind::Address.type_url().to_owned(),
            resource_names_subscribe: vec![name.to_string()],
            ..DeltaDiscoveryRequest::default()
        })
    }

    /// The names `response` answers, when any waits: its resources' names
    /// and aliases, and its removals. Taken before the response is applied,
    /// answered after.
    pub fn answered_by(&self, response: &DeltaDiscoveryResponse) -> Vec<String> {
        if self.waiting.is_empty() || response.type_url != ResourceKind::Address.type_url() {
            return Vec::new();
        }
        let carried = response
            .resources
            .iter()
            .flat_map(|resource| std::iter::once(&resource.name).chain(&resource.aliases))
            .chain(&response.removed_resources);
        carried
            .filter(|name| self.waiting.contains_key(name.as_str()))
            .cloned()
            .collect()
    }

    /// Wakes the waiters of `names`, now that the state has their
    /// response.
    pub fn answer(&mut self, names: Vec<String>) {
        for name in names {
            for waiter in self.waiting.remove(name.as_str()).unwrap_or_default() {
                // The asker may have given up: nothing to tell.
                let _ = waiter.send(());
            }
        }
    }

    /// Every name subscribed, for a new stream's first Address request.
    pub fn subscribed(&self) -> Vec<String> {
        self.subscribed
            .iter()
            .map(|name| name.to_string())
            .collect()
    }
}

/// How long a connection waits for an address it asked for.
pub const WAIT: Duration = Duration::from_secs(5);

#[cfg(test)]
mod tests;
