//! A pod's pause process, as a container runtime keeps one: a sleeping
//! process inside the pod's network namespace, in a cgroup v2 directory
//! named after the pod's UID the way the kubelet's systemd cgroup driver
//! names it (`…/<slice>-pod<uid with _ for ->.slice`). The node agent
//! finds a running pod's netns by scanning procfs for exactly that
//! (KUBERNETES.md A5); a network namespace alone, with no process in it,
//! is invisible to such a scan.
//!
//! Each process is killed (by its PID) and reaped on drop, and the cgroup
//! directories are removed after it. Where cgroup v2 is not mounted or not
//! writable, [`PauseProcess::start`] says why
//! ([`PauseError::CgroupUnavailable`]), so tests can skip with the reason
//! ([`crate::skip::skip`]); any other error fails them.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::netns::NetNs;
use crate::wait;

/// Where cgroup v2 is mounted: alone (unified mode) or beside the v1
/// hierarchies (hybrid mode).
const CGROUP2_ROOTS: [&str; 2] = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"];

/// How long a process may take to enter its namespace, and a killed one
/// to leave its cgroup.
const SETTLE: Duration = Duration::from_secs(5);

/// How long the process sleeps: longer than any test run, yet a process
/// left behind by a test run that was itself killed goes away within a
/// day.
const SLEEP_SECONDS: &str = "86400";

/// A pod's pause process, with any further processes a test adds, and the
/// pod's cgroup they all run in.
#[derive(Debug)]
pub struct PauseProcess {
    /// Oldest first. Dropped before the cgroup: a cgroup can be removed
    /// only once it is empty.
    processes: Vec<Running>,
    cgroup: PodCgroup,
}

impl PauseProcess {
    /// Creates the cgroup of the pod with `uid` and starts the pause
    /// process in it, inside `netns`; returns once the process runs
    /// there.
    pub fn start(netns: &NetNs, uid: &str) -> Result<PauseProcess, PauseError> {
        let mut pause = PauseProcess {
            processes: Vec::new(),
            cgroup: PodCgroup::create(uid)?,
        };
        pause.add_process(netns)?;
        Ok(pause)
    }

    /// Starts one more process of the pod, in its cgroup and in `netns`
    /// (the pod's); returns its PID once it runs there.
    pub fn add_process(&mut self, netns: &NetNs) -> Result<u32, PauseError> {
        let child = netns
            .command("sleep")
            .arg(SLEEP_SECONDS)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .map_err(PauseError::Spawn)?;
        let process = Running(child);
        let pid = process.0.id();
        // Kept before it is moved, so a failed move still kills it.
        self.processes.push(process);
        self.cgroup.add(pid)?;
        // `ip netns exec` enters the namespace, then becomes `sleep`.
        let netns_id = file_id(&netns.path());
        let proc_netns = PathBuf::from(format!("/proc/{pid}/ns/net"));
        let entered = wait::until(SETTLE, || {
            file_id(&proc_netns).is_some_and(|id| Some(id) == netns_id)
                && std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .is_ok_and(|comm| comm == "sleep\n")
        });
        if !entered {
            return Err(PauseError::NetnsNotEntered {
                pid,
                netns: netns.name().to_owned(),
            });
        }
        Ok(pid)
    }

    /// The pause process's PID: the pod's oldest process.
    pub fn pid(&self) -> u32 {
        self.pids().first().copied().unwrap_or_default()
    }

    /// Every process of the pod, oldest first.
    pub fn pids(&self) -> Vec<u32> {
        self.processes
            .iter()
            .map(|process| process.0.id())
            .collect()
    }

    /// The pod's cgroup directory.
    pub fn cgroup(&self) -> &Path {
        &self.cgroup.pod
    }
}

/// Why a pause process could not be started.
#[derive(Debug, thiserror::Error)]
pub enum PauseError {
    /// cgroup v2 is not mounted, or this process may not create cgroups
    /// or move processes there: tests skip with this reason.
    #[error("cgroup v2 cannot be used here: {0}")]
    CgroupUnavailable(String),
    /// The process could not be started.
    #[error("starting the pause process")]
    Spawn(#[source] std::io::Error),
    /// The process did not enter the pod's namespace in time.
    #[error("process {pid} did not enter network namespace {netns}")]
    NetnsNotEntered {
        /// The process.
        pid: u32,
        /// The namespace's name.
        netns: String,
    },
}

/// A process we started, killed (by its PID) and reaped on drop.
#[derive(Debug)]
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A pod's cgroup,
/// `<root>/zt-test-<pid>-<n>.slice/zt-test-<pid>-<n>-pod<uid with _>.slice`,
/// removed on drop once its processes are gone.
#[derive(Debug)]
struct PodCgroup {
    /// The slice above the pod's, standing in for the kubelet's QoS slice.
    slice: PathBuf,
    /// The pod's own.
    pod: PathBuf,
}

impl PodCgroup {
    fn create(uid: &str) -> Result<PodCgroup, PauseError> {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let root = CGROUP2_ROOTS
            .iter()
            .map(Path::new)
            .find(|root| root.join("cgroup.controllers").exists())
            .ok_or_else(|| {
                PauseError::CgroupUnavailable(format!(
                    "no cgroup v2 hierarchy at {CGROUP2_ROOTS:?}"
                ))
            })?;
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!("zt-test-{}-{n}", std::process::id());
        let slice = root.join(format!("{name}.slice"));
        std::fs::create_dir(&slice).map_err(|error| {
            PauseError::CgroupUnavailable(format!("{} is not writable: {error}", root.display()))
        })?;
        // The systemd driver writes the UID with `_` for `-`: a `-` in a
        // unit name means nesting.
        let cgroup = PodCgroup {
            pod: slice.join(format!("{name}-pod{}.slice", uid.replace('-', "_"))),
            slice,
        };
        std::fs::create_dir(&cgroup.pod).map_err(|error| {
            PauseError::CgroupUnavailable(format!("cannot create a nested cgroup: {error}"))
        })?;
        Ok(cgroup)
    }

    /// Moves process `pid` into the pod's cgroup.
    fn add(&self, pid: u32) -> Result<(), PauseError> {
        std::fs::write(self.pod.join("cgroup.procs"), pid.to_string()).map_err(|error| {
            PauseError::CgroupUnavailable(format!("cannot move a process into a cgroup: {error}"))
        })
    }
}

impl Drop for PodCgroup {
    fn drop(&mut self) {
        // A killed process leaves its cgroup a moment after it is reaped.
        for dir in [&self.pod, &self.slice] {
            wait::until(SETTLE, || match std::fs::remove_dir(dir) {
                Ok(()) => true,
                Err(error) => error.kind() == std::io::ErrorKind::NotFound,
            });
        }
    }
}

/// The (device, inode) of a file, which names a namespace.
fn file_id(path: &Path) -> Option<(u64, u64)> {
    let metadata = std::fs::metadata(path).ok()?;
    Some((metadata.dev(), metadata.ino()))
}
