//! The pod UID in a process's `/proc/<pid>/cgroup` (KUBERNETES.md A5,
//! step 2.3): which pod a process belongs to, as the kubelet's cgroup
//! layout tells it. Pure; reading the file is the caller's.
//!
//! Each line is `hierarchy:controllers:path`: one per hierarchy under
//! cgroup v1, a single `0::/...` under v2, both in hybrid mode. The kubelet
//! puts every container of a pod below a directory named after the pod's
//! UID: `pod<uid>` with the cgroupfs driver
//! (`/kubepods/besteffort/pod1234abcd-5678-.../<container>`) and
//! `kubepods-<qos>-pod<uid with _>.slice` with the systemd driver, the
//! container runtime adding its own last component (`cri-containerd-<id>.scope`,
//! `crio-<id>.scope`, a bare id).

use super::uid::PodUid;

/// Marks the pod's component; the UID follows it directly.
const POD_PREFIX: &[u8] = b"pod";
/// The systemd unit type of a container's cgroup, trimmed from the path.
const SCOPE_SUFFIX: &[u8] = b".scope";

/// The pod UID named in a cgroup file, if any. Every UID found, on any
/// line, must be the same one: a process cannot be in two pods.
pub(super) fn pod_uid(cgroup: &[u8]) -> Result<Option<PodUid>, CgroupError> {
    let mut found: Option<PodUid> = None;
    for (index, line) in cgroup.split(|byte| *byte == b'\n').enumerate() {
        if line.is_empty() {
            continue;
        }
        let path = path_of(line).ok_or(CgroupError::Malformed { line: index + 1 })?;
        let path = path.strip_suffix(SCOPE_SUFFIX).unwrap_or(path);
        for uid in path.split(|byte| *byte == b'/').flat_map(uids_in) {
            match &found {
                None => found = Some(uid),
                Some(first) if *first == uid => {}
                Some(first) => {
                    return Err(CgroupError::Conflicting {
                        first: first.clone(),
                        second: uid,
                    });
                }
            }
        }
    }
    Ok(found)
}

/// The path of a `hierarchy:controllers:path` line: the hierarchy is a
/// number, the controllers may be empty (v2) and the path is absolute and
/// may itself hold `:`.
fn path_of(line: &[u8]) -> Option<&[u8]> {
    let mut fields = line.splitn(3, |byte| *byte == b':');
    let hierarchy = fields.next()?;
    let _controllers = fields.next()?;
    let path = fields.next()?;
    let numbered = !hierarchy.is_empty() && hierarchy.iter().all(u8::is_ascii_digit);
    (numbered && path.starts_with(b"/")).then_some(path)
}

/// The pod UIDs in one path component: each `pod` that starts the
/// component or follows punctuation, directly followed by a UUID that ends
/// the component or is followed by punctuation. `kubepods` and `libpod-`
/// do not qualify.
fn uids_in(component: &[u8]) -> impl Iterator<Item = PodUid> + '_ {
    (0..component.len()).filter_map(move |at| {
        let rest = component.get(at..)?.strip_prefix(POD_PREFIX)?;
        let after_boundary = match at.checked_sub(1) {
            None => true,
            Some(before) => component.get(before)?.is_ascii_punctuation(),
        };
        if !after_boundary {
            return None;
        }
        let (uid, taken) = PodUid::parse_prefix(rest)?;
        match rest.get(taken) {
            None => Some(uid),
            Some(next) if next.is_ascii_punctuation() => Some(uid),
            Some(_) => None,
        }
    })
}

/// Why a cgroup file names no single pod.
#[derive(Debug, thiserror::Error)]
pub(super) enum CgroupError {
    /// A line is not `hierarchy:controllers:/path`.
    #[error("line {line} is not `hierarchy:controllers:/path`")]
    Malformed {
        /// The line, counted from 1.
        line: usize,
    },
    /// Two lines (or components) name different pods.
    #[error("names two pods: {first} and {second}")]
    Conflicting {
        /// The UID found first.
        first: PodUid,
        /// The other UID.
        second: PodUid,
    },
}
