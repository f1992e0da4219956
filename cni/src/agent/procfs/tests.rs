use std::collections::BTreeMap;
use std::net::IpAddr;

use super::addresses::{includes_any, parse};
use super::cgroup::{CgroupError, pod_uid};
use super::choose::{Candidate, NetnsId, choose};
use super::process::{decimal, start_time};
use super::uid::PodUid;

const UID: &str = "1234abcd-5678-90ab-cdef-1234567890ab";
const OTHER_UID: &str = "99999999-8888-7777-6666-555555555555";
const CONTAINER: &str = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";

/// What a cgroup file should give.
#[derive(Debug, PartialEq)]
enum Pod {
    Uid(&'static str),
    None,
    Malformed,
    Conflicting,
}

fn pod_of(cgroup: &str) -> Pod {
    match pod_uid(cgroup.as_bytes()) {
        Ok(Some(uid)) if uid.as_str() == UID => Pod::Uid(UID),
        Ok(Some(uid)) if uid.as_str() == OTHER_UID => Pod::Uid(OTHER_UID),
        Ok(Some(uid)) => panic!("unexpected uid {uid}"),
        Ok(None) => Pod::None,
        Err(CgroupError::Malformed { .. }) => Pod::Malformed,
        Err(CgroupError::Conflicting { .. }) => Pod::Conflicting,
    }
}

/// A cgroup v1 file (hybrid: with the v2 line) whose every hierarchy
/// holds `path`, as the kubelet places a container.
fn v1(path: &str) -> String {
    let controllers = [
        "name=systemd",
        "pids",
        "blkio",
        "freezer",
        "devices",
        "memory",
        "cpuset",
        "cpu,cpuacct",
        "net_cls,net_prio",
        "hugetlb",
        "perf_event",
        "rdma",
    ];
    let mut file: String = controllers
        .iter()
        .enumerate()
        .map(|(index, name)| format!("{}:{name}:{path}\n", controllers.len() - index))
        .collect();
    file.push_str(&format!("0::{path}\n"));
    file
}

#[test]
fn the_pod_uid_is_read_from_every_kubelet_cgroup_layout() {
    let systemd = "1234abcd_5678_90ab_cdef_1234567890ab";
    let cases: Vec<(&str, String, Pod)> = vec![
        (
            "v2, systemd driver, containerd",
            format!(
                "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{systemd}.slice/cri-containerd-{CONTAINER}.scope\n"
            ),
            Pod::Uid(UID),
        ),
        (
            "v2, systemd driver, cri-o",
            format!(
                "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{systemd}.slice/crio-{CONTAINER}.scope\n"
            ),
            Pod::Uid(UID),
        ),
        (
            "v2, systemd driver, cri-o's conmon",
            format!(
                "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{systemd}.slice/crio-conmon-{CONTAINER}.scope\n"
            ),
            Pod::Uid(UID),
        ),
        (
            "v2, systemd driver, guaranteed QoS (no QoS slice)",
            format!(
                "0::/kubepods.slice/kubepods-pod{systemd}.slice/cri-containerd-{CONTAINER}.scope\n"
            ),
            Pod::Uid(UID),
        ),
        (
            "v2, cgroupfs driver, containerd (bare container id)",
            format!("0::/kubepods/besteffort/pod{UID}/{CONTAINER}\n"),
            Pod::Uid(UID),
        ),
        (
            "v2, cgroupfs driver, cri-o",
            format!("0::/kubepods/burstable/pod{UID}/crio-{CONTAINER}\n"),
            Pod::Uid(UID),
        ),
        (
            "v2 seen from inside a cgroup namespace",
            format!(
                "0::/../../kubepods-besteffort-pod{systemd}.slice/cri-containerd-{CONTAINER}.scope\n"
            ),
            Pod::Uid(UID),
        ),
        (
            "v1, systemd driver, many lines",
            v1(&format!(
                "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{systemd}.slice/cri-containerd-{CONTAINER}.scope"
            )),
            Pod::Uid(UID),
        ),
        (
            "v1, cgroupfs driver, many lines",
            v1(&format!("/kubepods/besteffort/pod{UID}/{CONTAINER}")),
            Pod::Uid(UID),
        ),
        (
            "a .scope suffix on the pod's own component",
            format!("0::/kubepods/pod{UID}.scope\n"),
            Pod::Uid(UID),
        ),
        (
            "any punctuation between the groups",
            "0::/kubepods/pod1234abcd-5678_90ab.cdef:1234567890ab/x\n".into(),
            Pod::Uid(UID),
        ),
        (
            "upper-case hex is normalised",
            "0::/kubepods/pod1234ABCD-5678-90AB-CDEF-1234567890AB/x\n".into(),
            Pod::Uid(UID),
        ),
        (
            "one UID in both spellings",
            format!("1:name=systemd:/kubepods-pod{systemd}.slice\n0::/kubepods/pod{UID}\n"),
            Pod::Uid(UID),
        ),
        (
            "a system service",
            "0::/system.slice/containerd.service\n".into(),
            Pod::None,
        ),
        ("the root cgroup", "0::/\n".into(), Pod::None),
        (
            "a QoS slice without a pod",
            "0::/kubepods.slice/kubepods-besteffort.slice\n".into(),
            Pod::None,
        ),
        (
            "a podman container (libpod)",
            format!("0::/machine.slice/libpod-{CONTAINER}.scope\n"),
            Pod::None,
        ),
        (
            "pod not after punctuation",
            format!("0::/kubepods/xpod{UID}/x\n"),
            Pod::None,
        ),
        (
            "hex right after the UID",
            format!("0::/kubepods/pod{UID}0/x\n"),
            Pod::None,
        ),
        (
            "a group one digit short",
            "0::/kubepods/pod1234abcd-5678-90ab-cdef-1234567890a/x\n".into(),
            Pod::None,
        ),
        (
            "no separators",
            "0::/kubepods/pod1234abcd567890abcdef1234567890ab/x\n".into(),
            Pod::None,
        ),
        (
            "pod followed by no UID",
            "0::/kubepods/podnotauid/x\n".into(),
            Pod::None,
        ),
        ("an empty file", String::new(), Pod::None),
        (
            "two pods on two lines",
            format!("1:name=systemd:/kubepods/pod{OTHER_UID}/x\n0::/kubepods/pod{UID}/x\n"),
            Pod::Conflicting,
        ),
        (
            "two pods in one path",
            format!("0::/kubepods/pod{UID}/pod{OTHER_UID}\n"),
            Pod::Conflicting,
        ),
        ("no fields", "garbage\n".into(), Pod::Malformed),
        (
            "hierarchy not a number",
            format!("x::/kubepods/pod{UID}\n"),
            Pod::Malformed,
        ),
        (
            "relative path",
            format!("0::kubepods/pod{UID}\n"),
            Pod::Malformed,
        ),
    ];
    for (reason, cgroup, expected) in cases {
        assert_eq!(pod_of(&cgroup), expected, "{reason}: {cgroup}");
    }
}

#[test]
fn a_pod_uid_from_the_api_is_parsed_strictly() {
    assert_eq!(UID.parse::<PodUid>().unwrap().as_str(), UID);
    assert_eq!(UID.to_uppercase().parse::<PodUid>().unwrap().as_str(), UID);
    let bad = [
        "",
        "1234abcd_5678_90ab_cdef_1234567890ab",
        "1234abcd-5678-90ab-cdef-1234567890ab0",
        "{1234abcd-5678-90ab-cdef-1234567890ab}",
        "1234abcd-5678-90ab-cdef-1234567890a",
        "1234abcg-5678-90ab-cdef-1234567890ab",
    ];
    for text in bad {
        assert!(text.parse::<PodUid>().is_err(), "{text:?}");
    }
}

/// A `stat` line of a process named `command` that started at `start`.
fn stat(command: &[u8], start: &str) -> Vec<u8> {
    let mut line = b"4242 (".to_vec();
    line.extend_from_slice(command);
    line.extend_from_slice(b") S 1 4242 4242 0 -1 4194560 255 0 0 0 0 0 0 0 20 0 1 0 ");
    line.extend_from_slice(start.as_bytes());
    line.extend_from_slice(b" 2990080 396 18446744073709551615 94413747580928 0 0 0\n");
    line
}

#[test]
fn the_start_time_is_field_22_counted_from_the_last_parenthesis() {
    let real = b"8036 (sleep) S 8031 8031 4365 0 -1 4194560 255 0 0 0 0 0 0 0 20 0 1 0 337674 2990080 396 18446744073709551615 94413747580928 94413747598857 140734223884320 0 0 0 0 6 0 1 0 0 17 0 0 0 0 0 0 94413747612944 94413747614208 94414289670144 140734223891149 140734223891157 140734223891157 140734223892457 0\n";
    let cases: Vec<(&str, Vec<u8>, Option<u64>)> = vec![
        ("a real line", real.to_vec(), Some(337_674)),
        ("a plain name", stat(b"sleep", "100"), Some(100)),
        ("spaces in the name", stat(b"my worker 1", "101"), Some(101)),
        (
            "`)` and spaces in the name",
            stat(b"a) b) 7 8 9", "102"),
            Some(102),
        ),
        ("`(` in the name", stat(b"((x", "103"), Some(103)),
        (
            "bytes that are not UTF-8",
            stat(b"\xff\xfe )", "104"),
            Some(104),
        ),
        ("no parenthesis", b"4242 sleep S 1".to_vec(), None),
        ("too few fields", b"4242 (sleep) S 1 4242\n".to_vec(), None),
        (
            "a start time that is not a number",
            stat(b"sleep", "1x"),
            None,
        ),
        ("a signed start time", stat(b"sleep", "+5"), None),
    ];
    for (reason, line, expected) in cases {
        assert_eq!(start_time(&line).ok(), expected, "{reason}");
    }
}

#[test]
fn decimals_are_digits_only() {
    assert_eq!(decimal(b"0"), Some(0));
    assert_eq!(decimal(b"4194304"), Some(4_194_304));
    assert_eq!(decimal(b"18446744073709551615"), Some(u64::MAX));
    for text in [
        &b""[..],
        b"+1",
        b"-1",
        b"12a",
        b" 1",
        b"18446744073709551616",
        b"self",
    ] {
        assert_eq!(decimal(text), None, "{:?}", String::from_utf8_lossy(text));
    }
}

/// Pod UID → the pid chosen for it.
type Chosen = Vec<(&'static str, u32)>;

fn candidate(pid: u32, uid: &str, start_time: u64, netns: u64, matches_ip: bool) -> Candidate {
    Candidate {
        pid,
        uid: uid.parse().unwrap(),
        start_time,
        netns: NetnsId {
            dev: 4,
            inode: netns,
        },
        matches_ip,
    }
}

#[test]
fn choose_keeps_the_oldest_matching_process_of_each_pod() {
    const A: &str = UID;
    const B: &str = OTHER_UID;
    let cases: Vec<(&str, Vec<Candidate>, Chosen)> = vec![
        (
            "one matching process",
            vec![candidate(10, A, 100, 1, true)],
            vec![(A, 10)],
        ),
        (
            "no pod IP in its netns",
            vec![candidate(10, A, 100, 1, false)],
            vec![],
        ),
        (
            "the older process wins, seen second",
            vec![
                candidate(10, A, 200, 1, true),
                candidate(20, A, 100, 1, true),
            ],
            vec![(A, 20)],
        ),
        (
            "the older process wins, seen first",
            vec![
                candidate(10, A, 100, 1, true),
                candidate(20, A, 200, 1, true),
            ],
            vec![(A, 10)],
        ),
        (
            "a tie goes to the first in scan order",
            vec![
                candidate(10, A, 100, 1, true),
                candidate(20, A, 100, 1, true),
            ],
            vec![(A, 10)],
        ),
        (
            "an older process in a netns without the IP is not chosen",
            vec![
                candidate(10, A, 50, 2, false),
                candidate(20, A, 100, 1, true),
            ],
            vec![(A, 20)],
        ),
        (
            "a netns claimed by one pod is not another's",
            vec![
                candidate(10, A, 200, 1, true),
                candidate(20, B, 100, 1, true),
            ],
            vec![(A, 10)],
        ),
        (
            "a netns without the IP claims nothing",
            vec![
                candidate(10, B, 100, 1, false),
                candidate(20, A, 200, 1, true),
            ],
            vec![(A, 20)],
        ),
        (
            "two pods in two netns",
            vec![
                candidate(10, A, 100, 1, true),
                candidate(20, B, 100, 2, true),
                candidate(30, A, 300, 1, true),
                candidate(40, B, 50, 2, true),
            ],
            vec![(A, 10), (B, 40)],
        ),
    ];
    for (reason, candidates, expected) in cases {
        let chosen: BTreeMap<String, u32> = choose(&candidates)
            .into_iter()
            .map(|(uid, candidate)| (uid.to_string(), candidate.pid))
            .collect();
        let expected: BTreeMap<String, u32> = expected
            .into_iter()
            .map(|(uid, pid)| (uid.to_owned(), pid))
            .collect();
        assert_eq!(chosen, expected, "{reason}");
    }
}

#[test]
fn addresses_are_read_from_ip_json_and_matched_unmapped() {
    let json = r#"[{"ifindex":1,"ifname":"lo","flags":["LOOPBACK"],"addr_info":[]},
        {"ifindex":3,"ifname":"v0","addr_info":[
            {"family":"inet","local":"198.18.200.7","prefixlen":32,"scope":"global"},
            {"family":"inet6","local":"fe80::1","prefixlen":64,"scope":"link"}]},
        {"ifindex":4,"ifname":"v1"}]"#;
    let present = parse(json).unwrap();
    let ip = |text: &str| text.parse::<IpAddr>().unwrap();
    assert_eq!(present, [ip("198.18.200.7"), ip("fe80::1")]);
    assert!(includes_any(&present, &[ip("198.18.200.7")]));
    assert!(includes_any(&present, &[ip("::ffff:198.18.200.7")]));
    assert!(includes_any(
        &[ip("::ffff:198.18.200.7")],
        &[ip("198.18.200.7")]
    ));
    assert!(includes_any(&present, &[ip("198.18.200.9"), ip("fe80::1")]));
    assert!(!includes_any(&present, &[ip("198.18.200.8")]));
    assert!(!includes_any(&present, &[]));
    assert!(!includes_any(&[], &[ip("198.18.200.7")]));

    assert!(parse(r#"[{"addr_info":[{"local":"198.18.200.300"}]}]"#).is_err());
    assert!(parse("Object \"addr\" is unknown").is_err());
}
