//! The procfs scan (KUBERNETES.md A5, "Finding a running pod's netns from
//! the host") against real processes: a pod made of a network namespace
//! with an address, sleeping processes inside it, and a cgroup v2
//! directory named after the pod's UID, as the kubelet's systemd driver
//! names it. The tests need root and a writable cgroup v2 hierarchy, and
//! skip with the reason where either is missing.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test

use std::collections::HashMap;
use std::fs::File;
use std::net::IpAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use nix::fcntl::{FcntlArg, FdFlag, fcntl};
use tempfile::TempDir;
use ztunnel_cni::agent::procfs::{self, PodNetns, PodUid};
use ztunnel_test_support::netns::{self, NetNs};
use ztunnel_test_support::wait;

/// The pod's address, inside its own namespace only.
const POD_IP: &str = "198.18.200.7";
/// `POD_IP` as an IPv4-mapped IPv6 address.
const POD_IP_MAPPED: &str = "::ffff:198.18.200.7";
/// An address no test pod has.
const OTHER_IP: &str = "198.18.200.8";
/// Where cgroup v2 is mounted: alone (unified mode) or beside the v1
/// hierarchies (hybrid mode).
const CGROUP2_ROOTS: [&str; 2] = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"];
/// How long a process, a netns or a cgroup may take to settle.
const SETTLE: Duration = Duration::from_secs(5);

static PODS: AtomicUsize = AtomicUsize::new(0);

/// A sleeping process, killed (by its PID) and reaped on drop.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A pod's cgroup, `<root>/zt-test-<pid>-<n>.slice/zt-test-<pid>-<n>-pod<uid with _>.slice`,
/// removed on drop once its processes are gone.
struct Cgroup {
    slice: PathBuf,
    pod: PathBuf,
}

impl Cgroup {
    /// Creates the cgroup, or tells why cgroup v2 cannot be used here.
    fn create(n: usize, uid: &PodUid) -> Result<Cgroup, String> {
        let root = CGROUP2_ROOTS
            .iter()
            .map(Path::new)
            .find(|root| root.join("cgroup.controllers").exists())
            .ok_or_else(|| format!("no cgroup v2 hierarchy at {CGROUP2_ROOTS:?}"))?;
        let name = format!("zt-test-{}-{n}", std::process::id());
        let slice = root.join(format!("{name}.slice"));
        std::fs::create_dir(&slice)
            .map_err(|error| format!("cgroup v2 at {} is not writable: {error}", root.display()))?;
        let systemd_uid = uid.as_str().replace('-', "_");
        let cgroup = Cgroup {
            pod: slice.join(format!("{name}-pod{systemd_uid}.slice")),
            slice,
        };
        std::fs::create_dir(&cgroup.pod)
            .map_err(|error| format!("cannot create a nested cgroup: {error}"))?;
        Ok(cgroup)
    }

    /// Moves process `pid` into the pod's cgroup.
    fn add(&self, pid: u32) -> Result<(), String> {
        std::fs::write(self.pod.join("cgroup.procs"), pid.to_string())
            .map_err(|error| format!("cannot move a process into a cgroup v2: {error}"))
    }
}

impl Drop for Cgroup {
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

/// A running pod: its processes, its cgroup and its netns.
struct Pod {
    /// Dropped first: a cgroup can be removed only once it is empty.
    processes: Vec<Process>,
    cgroup: Cgroup,
    netns: NetNs,
    uid: PodUid,
}

impl Pod {
    /// A pod with `POD_IP` and a fresh UID; `Err` tells why it cannot be
    /// made here.
    fn start() -> Result<Pod, String> {
        let n = PODS.fetch_add(1, Ordering::Relaxed);
        let uid: PodUid = format!("{:08x}-{n:04x}-4000-8000-00000000cafe", std::process::id())
            .parse()
            .unwrap();
        let netns = NetNs::create("procfs").unwrap();
        netns
            .exec(&[
                "ip", "link", "add", "v0", "type", "veth", "peer", "name", "v1",
            ])
            .unwrap();
        netns
            .exec(&["ip", "addr", "add", &format!("{POD_IP}/32"), "dev", "v0"])
            .unwrap();
        netns.exec(&["ip", "link", "set", "v0", "up"]).unwrap();
        let cgroup = Cgroup::create(n, &uid)?;
        let mut pod = Pod {
            processes: Vec::new(),
            cgroup,
            netns,
            uid,
        };
        pod.spawn()?;
        Ok(pod)
    }

    /// Starts one more process in the pod; returns its PID.
    fn spawn(&mut self) -> Result<u32, String> {
        let child = self
            .netns
            .command("sleep")
            .arg("600")
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let process = Process(child);
        let pid = process.0.id();
        self.processes.push(process);
        self.cgroup.add(pid)?;
        // `ip netns exec` enters the namespace, then becomes `sleep`.
        let inode = id(&self.netns.path());
        let proc_netns = PathBuf::from(format!("/proc/{pid}/ns/net"));
        let entered = wait::until(SETTLE, || {
            std::fs::metadata(&proc_netns).is_ok_and(|m| (m.dev(), m.ino()) == inode)
                && std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .is_ok_and(|c| c == "sleep\n")
        });
        assert!(entered, "process {pid} did not enter {}", self.netns.name());
        Ok(pid)
    }

    fn pid(&self, index: usize) -> u32 {
        self.processes[index].0.id()
    }
}

/// The test pod, or why there cannot be one here (printed; the test then
/// passes without checking anything).
fn pod_or_skip() -> Option<Pod> {
    let reason = match netns::unavailable() {
        Some(reason) => reason,
        None => match Pod::start() {
            Ok(pod) => return Some(pod),
            Err(reason) => reason,
        },
    };
    eprintln!("skipped: {reason}");
    None
}

/// The procfs to scan: `/proc`, or, where this process may not look at
/// `/proc/1/ns/net` (a sandbox whose init is off limits), a directory of
/// links to every process of `/proc`, with this test process standing in
/// as pid 1 so the host netns is the one the tests run in.
struct Procfs {
    path: PathBuf,
    _links: Option<TempDir>,
}

fn procfs() -> Procfs {
    if std::fs::metadata("/proc/1/ns/net").is_ok() {
        return Procfs {
            path: PathBuf::from(procfs::DEFAULT_PROCFS),
            _links: None,
        };
    }
    eprintln!(
        "/proc/1/ns/net cannot be looked at here: scanning links to /proc with this process as pid 1"
    );
    let links = TempDir::new().unwrap();
    std::os::unix::fs::symlink(
        format!("/proc/{}", std::process::id()),
        links.path().join("1"),
    )
    .unwrap();
    for entry in std::fs::read_dir("/proc").unwrap() {
        let name = entry.unwrap().file_name();
        let Some(name) = name.to_str() else { continue };
        if name != "1" && name.bytes().all(|byte| byte.is_ascii_digit()) {
            std::os::unix::fs::symlink(Path::new("/proc").join(name), links.path().join(name))
                .unwrap();
        }
    }
    Procfs {
        path: links.path().to_owned(),
        _links: Some(links),
    }
}

/// The netns identity (device, inode) of a path.
fn id(path: &Path) -> (u64, u64) {
    let metadata = std::fs::metadata(path).unwrap();
    (metadata.dev(), metadata.ino())
}

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

/// Scans for the pods in `wanted`, each with its IPs.
fn scan(wanted: &[(&PodUid, &[IpAddr])]) -> HashMap<PodUid, PodNetns> {
    let wanted = wanted
        .iter()
        .map(|(uid, ips)| ((*uid).clone(), ips.to_vec()))
        .collect();
    procfs::scan(&procfs().path, &wanted).unwrap()
}

/// A UID no test pod has.
fn unused_uid() -> PodUid {
    format!("{:08x}-ffff-4000-8000-00000000cafe", std::process::id())
        .parse()
        .unwrap()
}

#[test]
fn a_running_pods_netns_is_found_through_its_cgroup_and_its_ip() {
    let Some(pod) = pod_or_skip() else { return };
    let mut found = scan(&[(&pod.uid, &[ip(POD_IP)])]);
    let netns = found.remove(&pod.uid).expect("the pod is found");
    assert!(found.is_empty());
    assert_eq!(netns.pid, pod.pid(0));
    let flags = FdFlag::from_bits_truncate(fcntl(&netns.netns, FcntlArg::F_GETFD).unwrap());
    assert!(
        flags.contains(FdFlag::FD_CLOEXEC),
        "the netns fd is close-on-exec"
    );
    let metadata = File::from(netns.netns).metadata().unwrap();
    assert_eq!((metadata.dev(), metadata.ino()), id(&pod.netns.path()));
    assert_eq!(netns.inode, metadata.ino());
}

#[test]
fn a_pod_ip_given_as_ipv4_mapped_ipv6_matches_its_ipv4_address() {
    let Some(pod) = pod_or_skip() else { return };
    let found = scan(&[(&pod.uid, &[ip(POD_IP_MAPPED)])]);
    assert_eq!(found.get(&pod.uid).map(|netns| netns.pid), Some(pod.pid(0)));
}

#[test]
fn a_netns_without_the_pods_ip_is_not_taken() {
    let Some(pod) = pod_or_skip() else { return };
    assert!(scan(&[(&pod.uid, &[ip(OTHER_IP)])]).is_empty());
    assert!(scan(&[(&pod.uid, &[])]).is_empty());
}

#[test]
fn only_wanted_pods_are_returned() {
    let Some(pod) = pod_or_skip() else { return };
    let unused = unused_uid();
    assert!(scan(&[(&unused, &[ip(POD_IP)])]).is_empty());
    let found = scan(&[(&pod.uid, &[ip(POD_IP)]), (&unused, &[ip(POD_IP)])]);
    assert_eq!(found.keys().collect::<Vec<_>>(), [&pod.uid]);
}

#[test]
fn a_younger_process_of_the_pod_does_not_replace_the_oldest() {
    let Some(mut pod) = pod_or_skip() else { return };
    // Start times count clock ticks (usually 10 ms): wait past one.
    std::thread::sleep(Duration::from_millis(100));
    let younger = pod.spawn().unwrap();
    let found = scan(&[(&pod.uid, &[ip(POD_IP)])]);
    let netns = &found[&pod.uid];
    assert_ne!(netns.pid, younger);
    assert_eq!(netns.pid, pod.pid(0));
}
