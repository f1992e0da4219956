//! Finding running pods' network namespaces from the host through procfs
//! (KUBERNETES.md A5, "Finding a running pod's netns from the host"): the
//! way to a pod enrolled after it started, when no CNI event carried its
//! netns path.
//!
//! [`scan`] looks at every process: a process outside the host netns
//! whose cgroup names a wanted pod, in a netns that holds one of that
//! pod's IPs, is a candidate; the oldest candidate of each pod gives the
//! pod's netns, returned as an open fd ready for ZDS.
//!
//! | Module | Owns |
//! |---|---|
//! | `uid` | [`PodUid`], the canonical pod UID |
//! | `cgroup` | the pod UID in a process's cgroup file |
//! | `process` | one process: its netns, start time, pod and IP check |
//! | `addresses` | a netns's interface addresses and the match with pod IPs |
//! | `choose` | which process stands for each pod |

use std::collections::HashMap;
use std::net::IpAddr;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use ztunnel_certs::error_chain::ErrorChain;

use choose::{NetnsId, choose};
use process::Verified;

mod addresses;
mod cgroup;
mod choose;
mod process;
#[cfg(test)]
mod tests;
mod uid;

pub use uid::{PodUid, PodUidError};

/// The host's procfs when the agent runs on the host; in a container the
/// host's `/proc` is mounted elsewhere (`/host/proc`).
pub const DEFAULT_PROCFS: &str = "/proc";

/// The agent's own netns, the host's stand-in in [`host_netns`].
const OWN_NETNS: &str = "/proc/self/ns/net";

/// A pod's network namespace, found by [`scan`].
#[derive(Debug)]
pub struct PodNetns {
    /// `<procfs>/<pid>/ns/net`, open and close-on-exec: what ztunnel gets
    /// over ZDS, valid however long the process lives.
    pub netns: OwnedFd,
    /// `<procfs>/<pid>/ns/net`: the path the agent records for the pod,
    /// naming this netns as long as the process lives.
    pub path: PathBuf,
    /// The process it was found through, for logs.
    pub pid: u32,
    /// The netns's inode, recorded to tell later whether `path` still
    /// names this netns.
    pub inode: u64,
}

/// The netns of each pod of `wanted` (pod UID → the pod's IPs, from
/// `status.podIPs`, else `status.podIP`) that runs on this host, found
/// through `procfs` ([`DEFAULT_PROCFS`], or the host's procfs mounted in
/// a container). A pod without a process, or whose netns holds none of
/// its IPs, is not in the result. A process that cannot be examined (it
/// exited meanwhile, or may not be read) is skipped and logged.
///
/// Blocking: it reads procfs and runs `ip` once per wanted pod inside its
/// netns; call it from a blocking thread.
pub fn scan(
    procfs: &Path,
    wanted: &HashMap<PodUid, Vec<IpAddr>>,
) -> Result<HashMap<PodUid, PodNetns>, ProcfsError> {
    if wanted.is_empty() {
        return Ok(HashMap::new());
    }
    let host = host_netns(procfs)?;
    let mut verified = Verified::new();
    let mut candidates = Vec::new();
    for pid in pids(procfs)? {
        let process = procfs.join(pid.to_string());
        match process::examine(&process, pid, host, wanted, &mut verified) {
            Ok(Some(candidate)) => candidates.push(candidate),
            Ok(None) => {}
            Err(error) if error.is_routine() => {
                tracing::debug!(pid, error = %ErrorChain(&error), "process skipped")
            }
            Err(error) => tracing::warn!(pid, error = %ErrorChain(&error), "process skipped"),
        }
    }
    let mut found = HashMap::new();
    for (uid, chosen) in choose(&candidates) {
        let path = procfs.join(chosen.pid.to_string()).join("ns/net");
        match process::open_netns(&path, chosen.netns) {
            Ok(file) => {
                tracing::debug!(uid = %uid, pid = chosen.pid, inode = chosen.netns.inode, "found a pod's netns");
                found.insert(
                    uid,
                    PodNetns {
                        netns: OwnedFd::from(file),
                        path,
                        pid: chosen.pid,
                        inode: chosen.netns.inode,
                    },
                );
            }
            Err(error) => {
                tracing::debug!(uid = %uid, pid = chosen.pid, error = %ErrorChain(&error), "the process chosen for a pod went away")
            }
        }
    }
    Ok(found)
}

/// The host's netns: pid 1's, as istio-cni takes it. Where pid 1's
/// namespaces may not be looked at (a sandbox that hides its init), the
/// agent's own netns stands in: the agent runs in the node's network
/// namespace, which is the one the host's processes share.
fn host_netns(procfs: &Path) -> Result<NetnsId, ProcfsError> {
    let host_path = procfs.join("1/ns/net");
    match std::fs::metadata(&host_path) {
        Ok(metadata) => Ok(NetnsId::of(&metadata)),
        Err(error) => match std::fs::metadata(OWN_NETNS) {
            Ok(metadata) => {
                tracing::debug!(path = %host_path.display(), error = %ErrorChain(&error), "pid 1's netns cannot be looked at; taking the agent's own as the host's");
                Ok(NetnsId::of(&metadata))
            }
            Err(_) => Err(ProcfsError::HostNetns {
                path: host_path,
                source: error,
            }),
        },
    }
}

/// The processes in `procfs` (its all-digit entries), ascending: the scan
/// order, which settles ties in `choose`.
fn pids(procfs: &Path) -> Result<Vec<u32>, ProcfsError> {
    let list_error = |source| ProcfsError::ListProcesses {
        path: procfs.to_owned(),
        source,
    };
    let mut pids = Vec::new();
    for entry in std::fs::read_dir(procfs).map_err(list_error)? {
        let name = entry.map_err(list_error)?.file_name();
        let pid = process::decimal(name.as_encoded_bytes()).and_then(|pid| u32::try_from(pid).ok());
        pids.extend(pid);
    }
    pids.sort_unstable();
    Ok(pids)
}

/// Why a scan could not be made at all; a process that cannot be examined
/// does not stop it.
#[derive(Debug, thiserror::Error)]
pub enum ProcfsError {
    /// The procfs directory cannot be listed.
    #[error("cannot list processes in {path}")]
    ListProcesses {
        /// The procfs directory.
        path: PathBuf,
        /// The listing error.
        source: std::io::Error,
    },
    /// Neither the host's netns (`<procfs>/1/ns/net`) nor the agent's own
    /// can be looked at, so processes in it could not be told from pods.
    #[error("cannot stat the host netns {path}")]
    HostNetns {
        /// `<procfs>/1/ns/net`.
        path: PathBuf,
        /// The stat error.
        source: std::io::Error,
    },
}
