//! Which process stands for each pod (KUBERNETES.md A5, steps 2.1, 2.5
//! and 2.6): the pure decision over what the scan gathered. Gathering is
//! in `process.rs`.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::fs::Metadata;
use std::os::unix::fs::MetadataExt;

use super::uid::PodUid;

/// A network namespace's identity: its nsfs device and inode, the same for
/// every path and fd that refers to it while it lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct NetnsId {
    /// The nsfs device.
    pub(super) dev: u64,
    /// The namespace's inode.
    pub(super) inode: u64,
}

impl NetnsId {
    /// The identity of the namespace `metadata` was taken from (a `stat`
    /// of `<pid>/ns/net`, or an `fstat` of an open namespace).
    pub(super) fn of(metadata: &Metadata) -> NetnsId {
        NetnsId {
            dev: metadata.dev(),
            inode: metadata.ino(),
        }
    }
}

/// A process of a wanted pod, as the scan saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Candidate {
    /// The process, to open its netns once chosen.
    pub(super) pid: u32,
    /// The pod its cgroup names.
    pub(super) uid: PodUid,
    /// Start time in clock ticks since boot (`stat` field 22).
    pub(super) start_time: u64,
    /// The namespace the process is in.
    pub(super) netns: NetnsId,
    /// Whether that namespace holds one of the pod's IPs.
    pub(super) matches_ip: bool,
}

/// The process chosen for each pod, from candidates in scan order:
/// - a candidate whose netns does not hold a pod IP is ignored, and
///   claims nothing;
/// - the first matching candidate in a netns claims it for its pod, and
///   candidates of other pods in that netns are ignored;
/// - of a pod's remaining candidates the oldest (least start time) wins,
///   the earlier in scan order on a tie.
pub(super) fn choose(candidates: &[Candidate]) -> HashMap<PodUid, &Candidate> {
    let mut owners: HashMap<NetnsId, &PodUid> = HashMap::new();
    let mut chosen: HashMap<PodUid, &Candidate> = HashMap::new();
    for candidate in candidates.iter().filter(|candidate| candidate.matches_ip) {
        let owner = *owners.entry(candidate.netns).or_insert(&candidate.uid);
        if *owner != candidate.uid {
            continue;
        }
        match chosen.entry(candidate.uid.clone()) {
            Entry::Vacant(slot) => {
                slot.insert(candidate);
            }
            Entry::Occupied(mut best) => {
                if candidate.start_time < best.get().start_time {
                    best.insert(candidate);
                }
            }
        }
    }
    chosen
}
