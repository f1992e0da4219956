//! One process of the scan (KUBERNETES.md A5, steps 2.1 to 2.5): its
//! netns, start time and pod, and whether its netns holds one of the
//! pod's IPs. Which process stands for a pod is decided in `choose.rs`.

use std::collections::HashMap;
use std::fs::File;
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use crate::agent::netns::{self, NetnsError};

use super::addresses::{self, AddressesError};
use super::cgroup::{self, CgroupError};
use super::choose::{Candidate, NetnsId};
use super::uid::PodUid;

/// Where this process's open fds appear as paths. [`netns::run_in`]
/// enters a netns by path, and the path of an fd already open names that
/// very netns, even once the process it was opened through has exited.
const OWN_FDS: &str = "/proc/self/fd";
/// `stat` field 22, the start time, counted among the fields after the
/// command name's closing `)` (field 3 is the first of them), from 0.
const START_TIME_AFTER_COMMAND: usize = 19;

/// Whether each (netns, pod) checked so far holds one of the pod's IPs.
/// A pod's processes share its netns, so the netns is entered once per
/// pod rather than once per process.
pub(super) type Verified = HashMap<(NetnsId, PodUid), bool>;

/// The candidate the process at `process` (`<procfs>/<pid>`) makes, or
/// `None` when it is in the host netns, its cgroup names no pod, or the
/// pod is not wanted.
pub(super) fn examine(
    process: &Path,
    pid: u32,
    host: NetnsId,
    wanted: &HashMap<PodUid, Vec<IpAddr>>,
    verified: &mut Verified,
) -> Result<Option<Candidate>, ProcessError> {
    let netns_path = process.join("ns/net");
    let metadata = std::fs::metadata(&netns_path).map_err(|source| ProcessError::Read {
        path: netns_path.clone(),
        source,
    })?;
    let netns = NetnsId::of(&metadata);
    if netns == host {
        return Ok(None);
    }
    let Some(uid) = cgroup::pod_uid(&read(&process.join("cgroup"))?)? else {
        return Ok(None);
    };
    let Some(pod_ips) = wanted.get(&uid) else {
        return Ok(None);
    };
    let start_time = start_time(&read(&process.join("stat"))?)?;
    let key = (netns, uid);
    let matches_ip = match verified.get(&key) {
        Some(matches) => *matches,
        None => {
            let file = open_netns(&netns_path, netns)?;
            let outcome = holds_any(&file, pod_ips);
            // A netns that cannot be entered or listed counts as not the
            // pod's for the rest of the scan, so it is tried once.
            verified.insert(key.clone(), matches!(outcome, Ok(true)));
            outcome?
        }
    };
    let (netns, uid) = key;
    Ok(Some(Candidate {
        pid,
        uid,
        start_time,
        netns,
        matches_ip,
    }))
}

/// Opens the netns at `path` (`<procfs>/<pid>/ns/net`), close-on-exec as
/// every `File` is, and checks that it is still the one seen as
/// `expected`: a process that exited and whose pid was reused since is
/// [`ProcessError::Replaced`].
pub(super) fn open_netns(path: &Path, expected: NetnsId) -> Result<File, ProcessError> {
    let read_error = |source| ProcessError::Read {
        path: path.to_owned(),
        source,
    };
    let file = File::open(path).map_err(read_error)?;
    let opened = NetnsId::of(&file.metadata().map_err(read_error)?);
    if opened != expected {
        return Err(ProcessError::Replaced);
    }
    Ok(file)
}

/// Whether the open `netns` holds one of `pod_ips`, looked at from a
/// thread inside it.
fn holds_any(netns: &File, pod_ips: &[IpAddr]) -> Result<bool, ProcessError> {
    if pod_ips.is_empty() {
        return Ok(false);
    }
    let path = Path::new(OWN_FDS).join(netns.as_raw_fd().to_string());
    let present = netns::run_in(&path, addresses::listed_here)??;
    Ok(addresses::includes_any(&present, pod_ips))
}

/// The start time (clock ticks after boot) in the text of `<pid>/stat`.
/// The command name, field 2, is in parentheses and may itself hold
/// spaces, `)` and bytes that are not UTF-8, so fields are counted from
/// its last `)`.
pub(super) fn start_time(stat: &[u8]) -> Result<u64, ProcessError> {
    let close = stat
        .iter()
        .rposition(|byte| *byte == b')')
        .ok_or(ProcessError::Stat("no `)` after the command name"))?;
    let field = stat
        .get(close + 1..)
        .unwrap_or_default()
        .split(u8::is_ascii_whitespace)
        .filter(|field| !field.is_empty())
        .nth(START_TIME_AFTER_COMMAND)
        .ok_or(ProcessError::Stat("fewer than 22 fields"))?;
    decimal(field).ok_or(ProcessError::Stat("the start time is not a number"))
}

/// A non-empty run of ASCII digits that fits in a `u64`; nothing else (no
/// sign, no spaces).
pub(super) fn decimal(text: &[u8]) -> Option<u64> {
    if text.is_empty() {
        return None;
    }
    text.iter().try_fold(0u64, |value, byte| {
        let digit = char::from(*byte).to_digit(10)?;
        value.checked_mul(10)?.checked_add(u64::from(digit))
    })
}

/// Reads a whole procfs file.
fn read(path: &Path) -> Result<Vec<u8>, ProcessError> {
    std::fs::read(path).map_err(|source| ProcessError::Read {
        path: path.to_owned(),
        source,
    })
}

/// Why a process could not be examined; the scan skips it.
#[derive(Debug, thiserror::Error)]
pub(super) enum ProcessError {
    /// A file of the process cannot be read: it exited, or we may not.
    #[error("cannot read {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The read error.
        source: std::io::Error,
    },
    /// `<pid>/stat` is not in the kernel's format.
    #[error("unexpected stat: {0}")]
    Stat(&'static str),
    /// `<pid>/cgroup` is malformed or names two pods.
    #[error("cgroup")]
    Cgroup(#[from] CgroupError),
    /// The pid's netns changed between two looks: the process exited and
    /// its pid went to another.
    #[error("the process was replaced while it was examined")]
    Replaced,
    /// The netns could not be entered.
    #[error(transparent)]
    Enter(#[from] NetnsError),
    /// The netns's addresses could not be listed.
    #[error(transparent)]
    Addresses(#[from] AddressesError),
}

impl ProcessError {
    /// Whether this is what a scan meets in passing (a process exited, or
    /// may not be read) rather than a cgroup layout or netns the scan
    /// cannot make sense of, which may hide a pod and is worth a warning.
    pub(super) fn is_routine(&self) -> bool {
        matches!(
            self,
            ProcessError::Read { .. } | ProcessError::Stat(_) | ProcessError::Replaced
        )
    }
}
