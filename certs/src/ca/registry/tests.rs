//! Tests for the pod registry: file format, indexes, and reload.

use super::*;

const PODS: &str = "\
- name: ztunnel-a
  namespace: istio-system
  uid: uid-za
  serviceAccount: ztunnel
  nodeName: node-a
  phase: Running
  ips: [10.0.0.2]
- name: app-1
  namespace: default
  uid: uid-app-1
  serviceAccount: app
  nodeName: node-a
  phase: Pending
- name: broken-1
  namespace: default
  uid: uid-broken-1
  serviceAccount: broken
  nodeName: node-a
  phase: Failed
- name: unscheduled
  namespace: default
  uid: uid-u
  serviceAccount: lonely
";

fn write(dir: &tempfile::TempDir, content: &str) -> PathBuf {
    let path = dir.path().join("pods.yaml");
    std::fs::write(&path, content).unwrap();
    path
}

#[test]
fn file_is_indexed_by_pod_and_by_node() {
    let dir = tempfile::tempdir().unwrap();
    let registry = FileRegistry::load(&write(&dir, PODS)).unwrap();
    let snapshot = registry.snapshot();
    assert_eq!(snapshot.len(), 4);
    let ztunnel = snapshot.pod("istio-system", "ztunnel-a").unwrap();
    assert_eq!(ztunnel.uid, "uid-za");
    assert_eq!(ztunnel.node_name.as_deref(), Some("node-a"));
    assert_eq!(ztunnel.ips, vec![IpAddr::from([10, 0, 0, 2])]);
    assert_eq!(
        snapshot.pod("default", "unscheduled").unwrap().phase,
        PodPhase::Running
    );
    assert!(snapshot.pod("default", "ztunnel-a").is_none());

    assert!(
        snapshot.has_live_pod("node-a", "default", "app"),
        "pending counts"
    );
    assert!(
        !snapshot.has_live_pod("node-a", "default", "broken"),
        "failed does not"
    );
    assert!(!snapshot.has_live_pod("node-b", "default", "app"));
    assert!(!snapshot.has_live_pod("", "default", "lonely"));
}

#[test]
fn bad_files_are_refused_with_their_line() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "unknown field",
            "- name: a\n  namespace: n\n  uid: u\n  serviceAccount: s\n  nodename: x\n",
            5,
        ),
        (
            "bad phase",
            "- name: a\n  namespace: n\n  uid: u\n  serviceAccount: s\n  phase: Sleeping\n",
            5,
        ),
        (
            "bad ip",
            "- name: a\n  namespace: n\n  uid: u\n  serviceAccount: s\n  ips: [1.2.3]\n",
            5,
        ),
        (
            "missing uid",
            "- name: a\n  namespace: n\n  serviceAccount: s\n",
            1,
        ),
        ("not a list", "name: a\n", 1),
    ];
    for (name, content, want_line) in cases {
        let path = write(&dir, content);
        match FileRegistry::load(&path) {
            Err(RegistryError::Parse { line, path: at, .. }) => {
                assert_eq!(line, want_line, "{name}");
                assert_eq!(at, path, "{name}");
            }
            other => panic!("{name}: {other:?}"),
        }
    }
    let duplicate = "- {name: a, namespace: n, uid: u1, serviceAccount: s}\n- {name: a, namespace: n, uid: u2, serviceAccount: s}\n";
    assert!(matches!(
        FileRegistry::load(&write(&dir, duplicate)),
        Err(RegistryError::DuplicatePod { .. })
    ));
    assert!(
        FileRegistry::load(&write(&dir, "\n"))
            .unwrap()
            .snapshot()
            .is_empty()
    );
    assert!(matches!(
        FileRegistry::load(&dir.path().join("absent.yaml")),
        Err(RegistryError::Read { .. })
    ));
}

#[test]
fn reload_swaps_good_files_and_keeps_the_last_good_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, PODS);
    let registry = FileRegistry::load(&path).unwrap();
    let before = registry.snapshot();
    assert!(
        !registry.reload().unwrap(),
        "unchanged content is not a reload"
    );

    std::fs::write(
        &path,
        PODS.replace(
            "nodeName: node-a\n  phase: Pending",
            "nodeName: node-b\n  phase: Pending",
        ),
    )
    .unwrap();
    assert!(registry.reload().unwrap());
    let moved = registry.snapshot();
    assert!(moved.has_live_pod("node-b", "default", "app"));
    assert!(!moved.has_live_pod("node-a", "default", "app"));
    assert!(
        before.has_live_pod("node-a", "default", "app"),
        "old snapshots stay intact"
    );

    std::fs::write(&path, "- name: [oops\n").unwrap();
    assert!(matches!(
        registry.reload(),
        Err(RegistryError::Parse { line: 1, .. })
    ));
    assert!(
        registry.snapshot().has_live_pod("node-b", "default", "app"),
        "last good kept"
    );
}
