//! The HBONE client connection pool (WIRE.md §4 "Connection pool"): h2
//! connections keyed by who talks to whom, shared by the streams to one
//! destination.
//!
//! The rules are pure functions over plain data ([`choose`], [`should_release`]);
//! [`Pool`] only keeps the handles and calls them:
//! - streams per connection are capped at min(`max_streams_per_connection`,
//!   the peer's SETTINGS_MAX_CONCURRENT_STREAMS); a full connection is skipped;
//! - callers racing for a key share dials: a caller waits for a dial in
//!   progress rather than starting its own, unless spreading calls for one;
//! - beyond istio/ztunnel, streams spread over up to
//!   `max_connections_per_key` connections: a new stream goes to the
//!   least-loaded connection (a dial in progress counts its waiters), and a
//!   new connection is dialed instead when even that one already carries
//!   `spread_threshold` streams and the key has room for another connection;
//! - connections unused for `unused_release_timeout`, or no longer ready
//!   (GOAWAY, error), leave the pool.
//!
//! Dialing (TCP, TLS, h2) is `hbone/client.rs`; the caller passes it in.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use http::HeaderMap;
use tokio::sync::watch;
use ztunnel_certs::identity::Identity;

use crate::config::PoolSettings;
use crate::drain::DrainWatcher;
use crate::hbone::{ActiveStream, Authority, H2Stream, HboneConnection, HboneError};

/// How many times a caller waits for another caller's dial before giving
/// up: each wait ends with a dial done, so this only trips if dials keep
/// producing connections that fill up before the waiter gets a turn.
const MAX_WAIT_ROUNDS: usize = 8;

/// Which connections may carry a stream: the same source identity and IP,
/// to the same address, expecting the same server identities.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PoolKey {
    source: Identity,
    /// Sorted and deduplicated, so that the order a caller lists them in
    /// does not split the pool.
    destinations: Arc<[Identity]>,
    destination: SocketAddr,
    source_ip: IpAddr,
}

impl PoolKey {
    /// A key; `destinations` is the expected server identity set.
    pub fn new(
        source: Identity,
        mut destinations: Vec<Identity>,
        destination: SocketAddr,
        source_ip: IpAddr,
    ) -> PoolKey {
        destinations.sort();
        destinations.dedup();
        PoolKey {
            source,
            destinations: destinations.into(),
            destination,
            source_ip,
        }
    }

    /// The server identities a connection for this key was verified against.
    pub fn destinations(&self) -> &[Identity] {
        &self.destinations
    }

    /// The HBONE address dialed.
    pub fn destination(&self) -> SocketAddr {
        self.destination
    }
}

/// The pool's limits (`POOL_*` configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolConfig {
    /// `POOL_MAX_STREAMS_PER_CONNECTION`; the peer's limit applies too.
    pub max_streams_per_connection: usize,
    /// How many connections one key spreads over; 1 behaves as istio/ztunnel.
    pub max_connections_per_key: usize,
    /// A new connection is dialed when the least-loaded one carries this
    /// many streams; 1 gives each of the first streams its own connection
    /// (and its own TCP flow and core), so parallel bulk streams scale.
    pub spread_threshold: usize,
    /// `POOL_UNUSED_RELEASE_TIMEOUT`.
    pub unused_release_timeout: Duration,
}

impl Default for PoolConfig {
    fn default() -> PoolConfig {
        PoolConfig {
            max_streams_per_connection: 100,
            // Four connections cover the parallel bulk streams of a typical
            // client while keeping handshakes per destination few.
            max_connections_per_key: 4,
            spread_threshold: 1,
            unused_release_timeout: Duration::from_secs(5 * 60),
        }
    }
}

impl From<&PoolSettings> for PoolConfig {
    /// The configured limits; the spread stays the default's.
    fn from(settings: &PoolSettings) -> PoolConfig {
        PoolConfig {
            max_streams_per_connection: settings.max_streams_per_connection as usize,
            max_connections_per_key: settings.max_connections_per_key,
            unused_release_timeout: settings.unused_release_timeout,
            ..PoolConfig::default()
        }
    }
}

/// One pooled connection as the decision sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotView {
    /// An established connection.
    Open {
        /// Streams open on it.
        active: usize,
        /// The peer's SETTINGS_MAX_CONCURRENT_STREAMS.
        peer_limit: usize,
        /// Whether it still accepts new streams.
        ready: bool,
    },
    /// A dial in progress, with the callers waiting for it (not counting
    /// the dialer).
    Dialing {
        /// Callers waiting for this dial.
        waiters: usize,
    },
}

/// What a caller should do for a new stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    /// Open the stream on the connection at this index.
    Use(usize),
    /// Wait for the dial at this index, then decide again.
    Wait(usize),
    /// Dial a new connection and use it.
    Dial,
}

/// Picks where a new stream goes; see the module doc for the rules.
pub fn choose(slots: &[SlotView], config: &PoolConfig) -> Choice {
    let max_streams = config.max_streams_per_connection.max(1);
    // (load, is a dial, index) of every slot that can take one more stream.
    let usable = slots
        .iter()
        .enumerate()
        .filter_map(|(index, slot)| match *slot {
            SlotView::Open {
                active,
                peer_limit,
                ready,
            } => (ready && active < max_streams.min(peer_limit)).then_some((active, false, index)),
            // The dialer's own stream counts as one.
            SlotView::Dialing { waiters } => {
                (waiters + 1 < max_streams).then_some((waiters + 1, true, index))
            }
        });
    let (count, best) = usable.fold((0, None), |(count, best), candidate| {
        let best = match best {
            Some(current) if current <= candidate => Some(current),
            _ => Some(candidate),
        };
        (count + 1, best)
    });
    match best {
        Some((load, dialing, index))
            if load < config.spread_threshold.max(1)
                || count >= config.max_connections_per_key.max(1) =>
        {
            if dialing {
                Choice::Wait(index)
            } else {
                Choice::Use(index)
            }
        }
        _ => Choice::Dial,
    }
}

/// Whether an established connection leaves the pool at `now`: when it is
/// no longer ready, or has carried no stream since `idle_since` for the
/// release timeout. Its open streams keep running either way.
pub fn should_release(
    ready: bool,
    active: usize,
    idle_since: Option<Instant>,
    now: Instant,
    unused_release_timeout: Duration,
) -> bool {
    if !ready {
        return true;
    }
    match idle_since {
        Some(since) if active == 0 => {
            now.saturating_duration_since(since) >= unused_release_timeout
        }
        _ => false,
    }
}

/// When a connection became unused, as of `now`: `None` while it carries
/// streams, else the first time it was seen without any.
pub fn idle_since(active: usize, previous: Option<Instant>, now: Instant) -> Option<Instant> {
    (active == 0).then(|| previous.unwrap_or(now))
}

/// Why no stream slot could be had.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// Dialing failed, for this caller or for the dial it waited for.
    #[error("dialing the HBONE connection failed")]
    Dial(#[source] Arc<HboneError>),
    /// Other callers' dials kept filling up before this caller got a slot.
    #[error("no pooled connection had room after {MAX_WAIT_ROUNDS} dials")]
    Contended,
}

/// A stream slot on a pooled connection, counted from the moment it is
/// handed out; send the CONNECT with [`Checkout::send_connect`].
#[derive(Debug)]
pub struct Checkout {
    connection: HboneConnection,
    slot: ActiveStream,
}

impl Checkout {
    /// The connection the stream goes on.
    pub fn connection(&self) -> &HboneConnection {
        &self.connection
    }

    /// Sends the CONNECT on the reserved slot.
    pub async fn send_connect(
        self,
        authority: &Authority,
        headers: HeaderMap,
    ) -> Result<H2Stream, HboneError> {
        self.connection
            .send_connect_reserved(self.slot, authority, headers)
            .await
    }
}

/// How a dial ended, as its waiters see it: `None` while it runs.
type DialOutcome = Option<Result<(), Arc<HboneError>>>;

/// The pool. Cheap to clone; clones share the connections.
#[derive(Debug, Clone)]
pub struct Pool {
    inner: Arc<Mutex<Inner>>,
    config: PoolConfig,
}

#[derive(Debug, Default)]
struct Inner {
    keys: HashMap<PoolKey, Vec<Slot>>,
    next_id: u64,
}

#[derive(Debug)]
struct Slot {
    /// Tells a slot apart after others were removed around it.
    id: u64,
    state: SlotState,
}

#[derive(Debug)]
enum SlotState {
    Dialing {
        waiters: usize,
        /// `Some` once the dial ended; `Err` is shared with every waiter.
        done: watch::Receiver<DialOutcome>,
    },
    Open {
        connection: HboneConnection,
        idle_since: Option<Instant>,
    },
}

/// What a caller does after deciding under the lock.
enum Step {
    Done(Checkout),
    Wait(watch::Receiver<DialOutcome>),
    Dial(DialGuard),
}

impl Pool {
    /// An empty pool with `config`.
    pub fn new(config: PoolConfig) -> Pool {
        Pool {
            inner: Arc::default(),
            config,
        }
    }

    /// A stream slot for `key`: on a pooled connection, after another
    /// caller's dial, or on a new connection from `dial` (called at most
    /// once, and bounded in time by the caller's connect timeout).
    pub async fn checkout<F, Fut>(&self, key: &PoolKey, dial: F) -> Result<Checkout, PoolError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<HboneConnection, HboneError>>,
    {
        for _round in 0..MAX_WAIT_ROUNDS {
            match self.decide(key, Instant::now()) {
                Step::Done(checkout) => return Ok(checkout),
                Step::Wait(mut done) => {
                    // An Err means the dialer was cancelled: decide again.
                    if let Ok(outcome) = done.wait_for(Option::is_some).await
                        && let Some(Err(error)) = outcome.as_ref()
                    {
                        return Err(PoolError::Dial(Arc::clone(error)));
                    }
                }
                Step::Dial(guard) => return self.finish_dial(guard, dial().await),
            }
        }
        Err(PoolError::Contended)
    }

    /// Releases connections that are no longer ready or unused for the
    /// release timeout, as of `now`.
    pub fn release_idle(&self, now: Instant) {
        let mut inner = self.lock();
        for slots in inner.keys.values_mut() {
            self.sweep(slots, now);
        }
        inner.keys.retain(|_key, slots| !slots.is_empty());
    }

    /// Calls [`Pool::release_idle`] every quarter of the release timeout
    /// until the drain starts.
    pub async fn release_idle_until_drained(self, drain: DrainWatcher) {
        let period = (self.config.unused_release_timeout / 4).max(Duration::from_secs(1));
        let mut ticks = tokio::time::interval(period);
        // Bounded in time by the drain.
        loop {
            tokio::select! {
                _ = ticks.tick() => self.release_idle(Instant::now()),
                () = drain.signaled() => return,
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // The lock guards plain bookkeeping that every step leaves
        // consistent, so a panic elsewhere does not make it unusable.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn decide(&self, key: &PoolKey, now: Instant) -> Step {
        let mut inner = self.lock();
        let next_id = inner.next_id;
        let slots = inner.keys.entry(key.clone()).or_default();
        self.sweep(slots, now);
        let views: Vec<SlotView> = slots.iter().map(view).collect();
        let chosen = match choose(&views, &self.config) {
            Choice::Use(index) | Choice::Wait(index) => slots.get_mut(index),
            Choice::Dial => None,
        };
        match chosen.map(|slot| &mut slot.state) {
            Some(SlotState::Open {
                connection,
                idle_since,
            }) => {
                *idle_since = None;
                let slot = connection.reserve();
                return Step::Done(Checkout {
                    connection: connection.clone(),
                    slot,
                });
            }
            Some(SlotState::Dialing { waiters, done }) => {
                *waiters += 1;
                return Step::Wait(done.clone());
            }
            None => {}
        }
        let (sender, done) = watch::channel(None);
        slots.push(Slot {
            id: next_id,
            state: SlotState::Dialing { waiters: 0, done },
        });
        inner.next_id += 1;
        Step::Dial(DialGuard {
            pool: Arc::clone(&self.inner),
            key: key.clone(),
            id: next_id,
            sender: Some(sender),
        })
    }

    fn finish_dial(
        &self,
        mut guard: DialGuard,
        dialed: Result<HboneConnection, HboneError>,
    ) -> Result<Checkout, PoolError> {
        let sender = guard.sender.take();
        let mut inner = self.lock();
        let slots = inner.keys.entry(guard.key.clone()).or_default();
        let position = slots.iter().position(|slot| slot.id == guard.id);
        let outcome = match dialed {
            Ok(connection) => {
                let slot = connection.reserve();
                let state = SlotState::Open {
                    connection: connection.clone(),
                    idle_since: None,
                };
                match position.and_then(|index| slots.get_mut(index)) {
                    Some(entry) => entry.state = state,
                    None => slots.push(Slot {
                        id: guard.id,
                        state,
                    }),
                }
                Ok(Checkout { connection, slot })
            }
            Err(error) => {
                if let Some(index) = position {
                    slots.remove(index);
                }
                Err(Arc::new(error))
            }
        };
        drop(inner);
        if let Some(sender) = sender {
            let shared = outcome.as_ref().map(|_| ()).map_err(Arc::clone);
            sender.send_replace(Some(shared));
        }
        outcome.map_err(PoolError::Dial)
    }

    fn sweep(&self, slots: &mut Vec<Slot>, now: Instant) {
        let timeout = self.config.unused_release_timeout;
        slots.retain_mut(|slot| match &mut slot.state {
            SlotState::Dialing { .. } => true,
            SlotState::Open {
                connection,
                idle_since: since,
            } => {
                let active = connection.active_streams();
                *since = idle_since(active, *since, now);
                !should_release(connection.is_ready(), active, *since, now, timeout)
            }
        });
    }
}

/// The decision's view of a slot.
fn view(slot: &Slot) -> SlotView {
    match &slot.state {
        SlotState::Dialing { waiters, .. } => SlotView::Dialing { waiters: *waiters },
        SlotState::Open { connection, .. } => SlotView::Open {
            active: connection.active_streams(),
            peer_limit: connection.peer_max_concurrent_streams(),
            ready: connection.is_ready(),
        },
    }
}

/// Removes a dial's placeholder if the dialing caller is cancelled, so that
/// its waiters decide again instead of waiting for ever.
struct DialGuard {
    pool: Arc<Mutex<Inner>>,
    key: PoolKey,
    id: u64,
    /// Taken when the dial finishes; still here means it was cancelled.
    sender: Option<watch::Sender<DialOutcome>>,
}

impl Drop for DialGuard {
    fn drop(&mut self) {
        if self.sender.is_none() {
            return;
        }
        let mut inner = self.pool.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(slots) = inner.keys.get_mut(&self.key) {
            slots.retain(|slot| slot.id != self.id);
        }
        // Dropping the sender wakes the waiters with an error: decide again.
    }
}

#[cfg(test)]
mod tests;
