//! Which sandbox of a pod a DEL is about. A pod keeps its name and uid
//! across sandboxes: when an ADD fails (the agent did not answer in time),
//! the runtime tears that sandbox down and retries with a new one, and the
//! DEL of the old sandbox can reach the agent after the new one has joined
//! the mesh. The pod set holds one sandbox per pod, so a DEL is matched to
//! it by netns as well as by uid. What is done with the answer is
//! `mesh.rs`'s.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::agent::pods::PodRecord;

/// What a DEL does to the pod recorded under its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum DelTarget {
    /// Nothing is recorded under the pod's name.
    NotRecorded,
    /// The recorded pod has another uid: a pod of the same name made since.
    AnotherPod,
    /// The recorded netns is live and is not the DEL's: the DEL is for
    /// another sandbox of the same pod, and the recorded one stays.
    AnotherSandbox,
    /// The DEL is for the recorded sandbox, or the recorded netns is gone
    /// (the record is stale whichever sandbox the DEL is for): the pod
    /// leaves the mesh.
    Recorded,
}

/// A DEL's sandbox as the agent sees it.
#[derive(Debug, Clone, Copy)]
pub(super) struct DelSandbox<'a> {
    /// The pod's uid from the runtime; empty when it gave none.
    pub uid: &'a str,
    /// The DEL's netns path as the agent sees it; `None` when the runtime
    /// sent none (it may have removed the netns already).
    pub netns: Option<&'a Path>,
    /// The inode of that netns while it exists: the same netns can be
    /// recorded under another path (`<procfs>/<pid>/ns/net` for a pod
    /// found running).
    pub netns_inode: Option<u64>,
}

impl<'a> DelSandbox<'a> {
    /// The DEL for `uid` naming `netns` (empty: none), looked up on disk.
    pub(super) fn seen(uid: &'a str, netns: &'a str) -> DelSandbox<'a> {
        let netns = (!netns.is_empty()).then_some(Path::new(netns));
        DelSandbox {
            uid,
            netns,
            netns_inode: netns
                .and_then(|path| std::fs::metadata(path).ok())
                .map(|metadata| metadata.ino()),
        }
    }
}

/// The recorded pod's sandbox as the agent sees it.
#[derive(Debug, Clone, Copy)]
pub(super) struct RecordedSandbox<'a> {
    /// The recorded pod's uid.
    pub uid: &'a str,
    /// The recorded netns path.
    pub netns: &'a Path,
    /// The inode of the recorded netns while it is still there
    /// ([`PodRecord::live_netns_inode`]).
    pub live_inode: Option<u64>,
}

impl<'a> RecordedSandbox<'a> {
    /// The sandbox of `record`, looked up on disk.
    pub(super) fn of(record: &'a PodRecord) -> RecordedSandbox<'a> {
        RecordedSandbox {
            uid: &record.uid,
            netns: &record.netns,
            live_inode: record.live_netns_inode(),
        }
    }
}

/// What `del` does to `recorded`, the pod recorded under its name.
pub(super) fn target(del: &DelSandbox<'_>, recorded: Option<&RecordedSandbox<'_>>) -> DelTarget {
    let Some(recorded) = recorded else {
        return DelTarget::NotRecorded;
    };
    if !del.uid.is_empty() && del.uid != recorded.uid {
        return DelTarget::AnotherPod;
    }
    if del.netns == Some(recorded.netns) {
        return DelTarget::Recorded;
    }
    match recorded.live_inode {
        None => DelTarget::Recorded,
        Some(live) if del.netns_inode == Some(live) => DelTarget::Recorded,
        Some(_) => DelTarget::AnotherSandbox,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use DelTarget::{AnotherPod, AnotherSandbox, NotRecorded, Recorded};

    #[test]
    fn a_del_leaves_a_live_sandbox_it_does_not_name() {
        const RECORDED: &str = "/var/run/netns/cni-2";
        const OTHER: &str = "/var/run/netns/cni-1";
        const PROCFS: &str = "/proc/42/ns/net";
        // (reason, DEL uid, DEL netns, DEL netns inode, recorded netns,
        // recorded live inode, target)
        #[rustfmt::skip]
        let cases = [
            ("nothing recorded", "uid-1", RECORDED, Some(2), "", None, NotRecorded),
            ("a pod of the same name made since", "uid-0", RECORDED, Some(2), RECORDED, Some(2), AnotherPod),
            ("the recorded sandbox", "uid-1", RECORDED, Some(2), RECORDED, Some(2), Recorded),
            ("the recorded sandbox, already gone", "uid-1", RECORDED, None, RECORDED, None, Recorded),
            ("the recorded sandbox, no uid given", "", RECORDED, Some(2), RECORDED, Some(2), Recorded),
            ("an earlier sandbox, still there", "uid-1", OTHER, Some(1), RECORDED, Some(2), AnotherSandbox),
            ("an earlier sandbox, gone", "uid-1", OTHER, None, RECORDED, Some(2), AnotherSandbox),
            ("an earlier sandbox, no uid given", "", OTHER, Some(1), RECORDED, Some(2), AnotherSandbox),
            ("no netns, the recorded one live", "uid-1", "", None, RECORDED, Some(2), AnotherSandbox),
            ("no netns, the recorded one gone", "uid-1", "", None, RECORDED, None, Recorded),
            ("another netns, the recorded one gone", "uid-1", OTHER, Some(1), RECORDED, None, Recorded),
            ("the recorded netns under the runtime's path", "uid-1", OTHER, Some(2), PROCFS, Some(2), Recorded),
            ("another netns than a pod found running", "uid-1", OTHER, Some(1), PROCFS, Some(2), AnotherSandbox),
            ("a pod found running whose process is gone", "uid-1", OTHER, Some(1), PROCFS, None, Recorded),
        ];
        for (reason, uid, netns, netns_inode, recorded_netns, live_inode, want) in cases {
            let del = DelSandbox {
                uid,
                netns: (!netns.is_empty()).then_some(Path::new(netns)),
                netns_inode,
            };
            let recorded = (!recorded_netns.is_empty()).then(|| RecordedSandbox {
                uid: "uid-1",
                netns: Path::new(recorded_netns),
                live_inode,
            });
            assert_eq!(target(&del, recorded.as_ref()), want, "{reason}");
        }
    }

    #[test]
    fn a_del_netns_is_looked_up_on_disk() {
        let netns = tempfile::NamedTempFile::new().unwrap();
        let path = netns.path().to_str().unwrap();
        let seen = DelSandbox::seen("uid-1", path);
        assert_eq!(seen.netns, Some(netns.path()));
        assert!(seen.netns_inode.is_some());
        let gone = DelSandbox::seen("uid-1", "/nonexistent/netns");
        assert_eq!(
            (gone.netns, gone.netns_inode),
            (Some(Path::new("/nonexistent/netns")), None)
        );
        assert_eq!(DelSandbox::seen("uid-1", "").netns, None);
    }
}
