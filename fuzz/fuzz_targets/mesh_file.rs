//! Fuzzes the mesh file (`--mesh`, the control plane's and the demo's
//! source): the YAML as `FileRegistry` reads it (`MeshFile`, either form),
//! the checks across entries (`MeshSnapshot::new`), and what the control
//! plane then serves over xDS.
//!
//! Properties: no panic; in an accepted mesh every pod is found by its
//! namespace and name and by its uid, every pod not Failed counts as live
//! on its node, and nothing is lost; every Address and Authorization
//! resource the control plane builds from it is accepted by the proxy's
//! xDS core (no NACK).

#![no_main]

use libfuzzer_sys::fuzz_target;
use ztunnel_fuzz::check_served_to_proxy;
use ztunnel_mesh::{MeshFile, MeshSnapshot, PodPhase};

fuzz_target!(|data: &[u8]| {
    // As the registry reads it: blank is an empty mesh.
    let file: MeshFile = if data.iter().all(u8::is_ascii_whitespace) {
        MeshFile::default()
    } else {
        match serde_yaml_ng::from_slice(data) {
            Ok(file) => file,
            Err(_) => return,
        }
    };
    let Ok(snapshot) = MeshSnapshot::new(file.clone()) else {
        return;
    };
    assert_eq!(snapshot.pods(), file.pods.as_slice());
    assert_eq!(snapshot.services(), file.services.as_slice());
    assert_eq!(snapshot.policies(), file.policies.as_slice());
    for pod in snapshot.pods() {
        assert_eq!(snapshot.pod(&pod.namespace, &pod.name), Some(pod));
        assert_eq!(snapshot.pod_by_uid(&pod.uid), Some(pod));
        if let (Some(node), true) = (&pod.node_name, pod.phase != PodPhase::Failed) {
            assert!(snapshot.has_live_pod(node, &pod.namespace, &pod.service_account));
        }
    }
    check_served_to_proxy(&snapshot, "cluster.local");
});
