//! The accounting behind the connection bound, as plain data: how many
//! slots each pod holds, and whether one more may be taken. No locks, no
//! metrics, no logs: `capacity.rs` holds this behind its lock and says
//! what each outcome means to operators.
//!
//! A pod's share is what it may hold now:
//! - never less than the floor (`MIN_CONNECTIONS_PER_POD`), while any slot
//!   is free;
//! - otherwise at most the bound divided among the pods holding slots
//!   (the asking one counted), so that pods busy at once converge on equal
//!   parts as their connections come and go;
//! - and never so much that the free slots fall below what the other
//!   served pods lack of their floor: a pod that has not yet connected
//!   finds its floor free, however early and hard its neighbours pushed.
//!
//! Slots already held are never taken back: a pod over its share after a
//! neighbour arrived keeps its connections and is refused new ones until
//! enough of them close.

use std::collections::HashMap;

/// One served pod's entry in the ledger, from [`Ledger::join`] on.
pub type PodId = u64;

/// Why a pod was refused a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Every slot of the node is taken.
    NodeLimit,
    /// The pod holds its share; the rest is other pods'.
    PodShare,
}

impl Refusal {
    /// The `reason` label of `ztunnel_connections_refused_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::NodeLimit => "node_limit",
            Refusal::PodShare => "pod_share",
        }
    }

    /// Its place in [`Account::refused`].
    fn index(self) -> usize {
        match self {
            Refusal::NodeLimit => 0,
            Refusal::PodShare => 1,
        }
    }
}

/// What the decision about one more slot for one pod depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// Slots of the node (`MAX_CONNECTIONS`).
    pub limit: usize,
    /// What each pod may hold whatever its neighbours do.
    pub floor: usize,
    /// Slots held over every pod.
    pub total: usize,
    /// Pods holding at least one slot, the asking one included.
    pub active: usize,
    /// Slots the asking pod holds.
    pub held: usize,
    /// What the other served pods lack of their floor.
    pub others_lack: usize,
}

/// The most slots the pod of `counts` may hold now (see the module's
/// header); it is admitted one more while it holds fewer.
pub fn share(counts: Counts) -> usize {
    let fair = counts.limit / counts.active.max(1);
    let others_hold = counts.total.saturating_sub(counts.held);
    let unreserved = counts
        .limit
        .saturating_sub(others_hold)
        .saturating_sub(counts.others_lack);
    counts.floor.max(fair.min(unreserved))
}

/// Whether the pod of `counts` may take one more slot.
pub fn decide(counts: Counts) -> Result<(), Refusal> {
    if counts.total >= counts.limit {
        Err(Refusal::NodeLimit)
    } else if counts.held >= share(counts) {
        Err(Refusal::PodShare)
    } else {
        Ok(())
    }
}

/// What taking a slot came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Taken {
    /// The slot is the pod's until [`Ledger::give_back`].
    Admitted {
        /// Refusals of the node-wide episode this admission ends, when
        /// the node had refused since its last admission.
        node_episode_ended: Option<u64>,
        /// Refusals of the pod's episode this admission ends.
        pod_episode_ended: Option<u64>,
    },
    /// No slot.
    Refused {
        /// Why.
        refusal: Refusal,
        /// Whether this is the first refusal of an episode of its kind
        /// (node-wide for [`Refusal::NodeLimit`], the pod's for
        /// [`Refusal::PodShare`]), to be told once rather than per
        /// connection of a flood.
        episode_started: bool,
    },
}

/// One pod's account.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Account {
    /// Slots it holds.
    pub held: usize,
    /// Whether its proxy still serves it: a pod that left keeps its
    /// account until its last slot is given back, without a floor.
    pub served: bool,
    /// Refusals since its last admission; more than zero is an episode.
    pub refused_in_episode: u64,
    /// Refusals over its life, by [`Refusal`] (node limit, pod share).
    pub refused: [u64; 2],
}

/// The node-wide sums, kept as accounts change so that a decision does
/// not walk every pod.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Totals {
    /// Slots of the node.
    limit: usize,
    /// See [`Counts::floor`].
    floor: usize,
    /// Slots held over every pod.
    held: usize,
    /// Pods holding at least one slot.
    active: usize,
    /// What the served pods lack of their floor.
    lack: usize,
    /// Node-wide refusals since the last admission.
    refused_in_episode: u64,
}

impl Totals {
    /// What `account` lacks of its floor: nothing once its pod left.
    fn lack_of(&self, account: &Account) -> usize {
        if account.served {
            self.floor.saturating_sub(account.held)
        } else {
            0
        }
    }

    /// The counts `account`'s next slot is decided on.
    fn counts(&self, account: &Account) -> Counts {
        Counts {
            limit: self.limit,
            floor: if account.served { self.floor } else { 0 },
            total: self.held,
            active: self.active + usize::from(account.held == 0),
            held: account.held,
            others_lack: self.lack - self.lack_of(account),
        }
    }
}

/// The slots of a node, by pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ledger {
    totals: Totals,
    pods: HashMap<PodId, Account>,
    /// The id the next pod to join gets.
    next: PodId,
}

impl Ledger {
    /// A node of `limit` slots, each pod's floor `floor` (both at least
    /// one; the floor at most the limit).
    pub fn new(limit: usize, floor: usize) -> Ledger {
        let limit = limit.max(1);
        Ledger {
            totals: Totals {
                limit,
                floor: floor.clamp(1, limit),
                held: 0,
                active: 0,
                lack: 0,
                refused_in_episode: 0,
            },
            pods: HashMap::new(),
            next: 0,
        }
    }

    /// Slots of the node.
    pub fn limit(&self) -> usize {
        self.totals.limit
    }

    /// Slots held over every pod.
    #[cfg(test)]
    pub fn total(&self) -> usize {
        self.totals.held
    }

    /// A new served pod, holding nothing.
    pub fn join(&mut self) -> PodId {
        let pod = self.next;
        self.next += 1;
        self.pods.insert(
            pod,
            Account {
                served: true,
                ..Account::default()
            },
        );
        self.totals.lack += self.totals.floor;
        pod
    }

    /// `pod` is no longer served: its floor is no longer kept free. Its
    /// account goes once it holds nothing; whether it went is returned.
    pub fn leave(&mut self, pod: PodId) -> bool {
        let Some(account) = self.pods.get_mut(&pod) else {
            return false;
        };
        self.totals.lack -= self.totals.lack_of(account);
        account.served = false;
        if account.held == 0 {
            self.pods.remove(&pod);
            return true;
        }
        false
    }

    /// One more slot for `pod`, or why not. A pod no longer served is
    /// refused as over its share.
    pub fn take(&mut self, pod: PodId) -> Taken {
        let Ledger { totals, pods, .. } = self;
        let Some(account) = pods.get_mut(&pod).filter(|account| account.served) else {
            return Taken::Refused {
                refusal: Refusal::PodShare,
                episode_started: false,
            };
        };
        match decide(totals.counts(account)) {
            Ok(()) => {
                totals.lack -= usize::from(totals.lack_of(account) > 0);
                totals.active += usize::from(account.held == 0);
                totals.held += 1;
                account.held += 1;
                let ended = |refused: &mut u64| (*refused > 0).then(|| std::mem::take(refused));
                Taken::Admitted {
                    node_episode_ended: ended(&mut totals.refused_in_episode),
                    pod_episode_ended: ended(&mut account.refused_in_episode),
                }
            }
            Err(refusal) => {
                account.refused[refusal.index()] += 1;
                let in_episode = match refusal {
                    Refusal::NodeLimit => &mut totals.refused_in_episode,
                    Refusal::PodShare => &mut account.refused_in_episode,
                };
                *in_episode += 1;
                Taken::Refused {
                    refusal,
                    episode_started: *in_episode == 1,
                }
            }
        }
    }

    /// `pod` gives one slot back. Whether its account went with it (the
    /// pod had left and this was its last slot) is returned.
    pub fn give_back(&mut self, pod: PodId) -> bool {
        let Ledger { totals, pods, .. } = self;
        let Some(account) = pods.get_mut(&pod) else {
            return false;
        };
        let Some(held) = account.held.checked_sub(1) else {
            return false;
        };
        account.held = held;
        totals.held -= 1;
        totals.lack += usize::from(account.served && held < totals.floor);
        if held > 0 {
            return false;
        }
        totals.active -= 1;
        if account.served {
            return false;
        }
        pods.remove(&pod);
        true
    }

    /// `pod`'s account, if it has one.
    #[cfg(test)]
    pub fn account(&self, pod: PodId) -> Option<&Account> {
        self.pods.get(&pod)
    }

    /// What `pod` may hold now, had it asked: its [`share`].
    pub fn share_of(&self, pod: PodId) -> usize {
        self.pods
            .get(&pod)
            .map_or(0, |account| share(self.totals.counts(account)))
    }

    /// Every account, for the per-pod metrics.
    pub fn accounts(&self) -> impl Iterator<Item = (PodId, &Account)> {
        self.pods.iter().map(|(pod, account)| (*pod, account))
    }
}

#[cfg(test)]
mod tests;
