//! The procfs scan (KUBERNETES.md A5, "Finding a running pod's netns from
//! the host") against real processes: a pod made of a network namespace
//! with an address and a pause process inside it, in a cgroup v2
//! directory named after the pod's UID as the kubelet's systemd driver
//! names it (`ztunnel_test_support::pause`). The tests need root and a
//! writable cgroup v2 hierarchy, and skip with the reason where either is
//! missing.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test

use std::collections::HashMap;
use std::fs::File;
use std::net::IpAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use nix::fcntl::{FcntlArg, FdFlag, fcntl};
use tempfile::TempDir;
use ztunnel_cni::agent::procfs::{self, PodNetns, PodUid};
use ztunnel_test_support::netns::{self, NetNs};
use ztunnel_test_support::pause::{PauseError, PauseProcess};
use ztunnel_test_support::skip::skip;

/// The pod's address, inside its own namespace only.
const POD_IP: &str = "198.18.200.7";
/// `POD_IP` as an IPv4-mapped IPv6 address.
const POD_IP_MAPPED: &str = "::ffff:198.18.200.7";
/// An address no test pod has.
const OTHER_IP: &str = "198.18.200.8";

/// Numbers the pods of this test process, for unique UIDs.
static PODS: AtomicUsize = AtomicUsize::new(0);

/// A running pod: its pause process (and any more), in its cgroup, and
/// its netns.
struct Pod {
    /// Dropped before the netns, as a runtime stops a pod.
    pause: PauseProcess,
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
        let pause = match PauseProcess::start(&netns, uid.as_str()) {
            Ok(pause) => pause,
            Err(error @ PauseError::CgroupUnavailable(_)) => return Err(error.to_string()),
            Err(error) => panic!("{error}"),
        };
        Ok(Pod { pause, netns, uid })
    }
}

/// The test pod, or `None` (skipped, with why there cannot be one here).
fn pod_or_skip() -> Option<Pod> {
    let reason = match netns::unavailable() {
        Some(reason) => reason,
        None => match Pod::start() {
            Ok(pod) => return Some(pod),
            Err(reason) => reason,
        },
    };
    skip(reason);
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
    assert_eq!(netns.pid, pod.pause.pid());
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
    assert_eq!(
        found.get(&pod.uid).map(|netns| netns.pid),
        Some(pod.pause.pid())
    );
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
    let younger = pod.pause.add_process(&pod.netns).unwrap();
    let found = scan(&[(&pod.uid, &[ip(POD_IP)])]);
    let netns = &found[&pod.uid];
    assert_ne!(netns.pid, younger);
    assert_eq!(netns.pid, pod.pause.pid());
}
