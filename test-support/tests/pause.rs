//! A pod's pause process: it runs in the pod's netns and in a cgroup named
//! after the pod's uid as the kubelet's systemd driver names it, and
//! dropping it leaves neither process nor cgroup behind. Needs root and a
//! writable cgroup v2 hierarchy; skips with the reason otherwise.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use ztunnel_test_support::netns::{self, NetNs};
use ztunnel_test_support::pause::{PauseError, PauseProcess};
use ztunnel_test_support::skip::skip;

const UID: &str = "0b7e9d1c-5a2f-4c3e-8d4a-1f2e3d4c5b6a";

fn netns_id(path: &Path) -> (u64, u64) {
    let metadata = std::fs::metadata(path).unwrap();
    (metadata.dev(), metadata.ino())
}

#[test]
fn the_pause_process_runs_in_the_pods_netns_and_cgroup_until_dropped() {
    if let Some(reason) = netns::unavailable() {
        skip(reason);
        return;
    }
    let netns = NetNs::create("pause").unwrap();
    let mut pause = match PauseProcess::start(&netns, UID) {
        Ok(pause) => pause,
        Err(error @ PauseError::CgroupUnavailable(_)) => {
            skip(error);
            return;
        }
        Err(error) => panic!("{error}"),
    };
    let second = pause.add_process(&netns).unwrap();
    let pids = pause.pids();
    assert_eq!(pids, [pause.pid(), second]);

    let cgroup = pause.cgroup().to_owned();
    let pod_slice = cgroup.file_name().unwrap().to_str().unwrap();
    assert!(
        pod_slice.ends_with("-pod0b7e9d1c_5a2f_4c3e_8d4a_1f2e3d4c5b6a.slice"),
        "{pod_slice}"
    );
    for pid in &pids {
        let proc_dir = format!("/proc/{pid}");
        let line = std::fs::read_to_string(format!("{proc_dir}/cgroup")).unwrap();
        assert!(
            line.lines()
                .any(|line| line.starts_with("0::/") && line.ends_with(pod_slice)),
            "process {pid} is in the pod's cgroup: {line}"
        );
        assert_eq!(
            netns_id(Path::new(&format!("{proc_dir}/ns/net"))),
            netns_id(&netns.path())
        );
    }

    drop(pause);
    for pid in pids {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "process {pid} is reaped"
        );
    }
    assert!(!cgroup.exists(), "the pod's cgroup is removed");
    assert!(
        !cgroup.parent().unwrap().exists(),
        "the slice above it is removed"
    );
}
