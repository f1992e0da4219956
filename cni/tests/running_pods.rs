//! Pods that were running before their namespace joined the mesh
//! (KUBERNETES.md A5, A6): the agent, with its pods from a real API
//! server, finds each one's netns through procfs (a pause process in the
//! pod's netns and in a cgroup named after its uid, as a runtime leaves
//! it), installs its rules and hands it to ztunnel, with no CNI event and
//! no restart of the pod; and takes it out again when it opts out or is
//! deleted. A fake ztunnel on the ZDS socket sees what the agent hands
//! over. Needs root, `ip`, `iptables`, a writable cgroup v2 hierarchy and
//! the API server binaries; skips, with the reason, without them.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test

use std::collections::BTreeSet;
use std::time::Instant;

use ztunnel_proto::istio::workload::zds::workload_request::Payload;
use ztunnel_test_support::cni;
use ztunnel_test_support::kube::objects::{PodSpecForTest, delete_pod, ensure_namespace};
use ztunnel_test_support::skip::skip;

use api::{Cluster, NODE, Node};
use rules::our_rules;
use running_agent::Agent;
use running_pod::RunningPod;
use ztunnel::{FakeZtunnel, Received};

#[path = "support/api.rs"]
mod api;
#[path = "support/rules.rs"]
mod rules;
#[path = "support/running_agent.rs"]
mod running_agent;
#[path = "support/running_pod.rs"]
mod running_pod;
#[path = "e2e/ztunnel.rs"]
mod ztunnel;

/// The namespace that joins the mesh while its pods run.
const LATE: &str = "late";
/// The label that enrolls a namespace or a pod (KUBERNETES.md A1).
const DATAPLANE_MODE: &str = "istio.io/dataplane-mode";

/// A pod of `LATE` named `name` with address `ip`, on the agent's node,
/// running before the test labels anything.
fn start_pod(cluster: &Cluster, name: &str, ip: &str) -> Result<RunningPod, String> {
    let spec = PodSpecForTest {
        namespace: LATE.to_owned(),
        name: name.to_owned(),
        service_account: format!("{name}-account"),
        node: NODE.to_owned(),
        ..PodSpecForTest::default()
    };
    RunningPod::start(&cluster.runtime, &cluster.admin, &spec, ip)
}

#[test]
fn running_pods_join_and_leave_the_mesh_without_a_restart() {
    if let Some(reason) = cni::unavailable() {
        skip(reason);
        return;
    }
    let Some(cluster) = Cluster::start() else {
        return;
    };
    cluster
        .runtime
        .block_on(ensure_namespace(&cluster.admin, LATE, &[]))
        .unwrap();
    let pods = match ["api-0", "api-1"]
        .iter()
        .zip(["198.18.40.2", "198.18.41.2"])
        .map(|(name, ip)| start_pod(&cluster, name, ip))
        .collect::<Result<Vec<_>, _>>()
    {
        Ok(pods) => pods,
        Err(reason) => {
            skip(reason);
            return;
        }
    };
    let node = Node::new();
    let agent = Agent::start(node.config(&cluster.agent_kubeconfig));
    let ztunnel = FakeZtunnel::connect(&node.zds_socket());
    assert!(ztunnel.read_snapshot().is_empty());

    labelling_the_namespace_enrolls_its_running_pods(&cluster, &pods, &ztunnel);
    unlabelling_it_takes_them_out(&cluster, &pods, &ztunnel);
    agent.stop();
    drop(ztunnel);

    // Labelled while the agent is away: its start enrolls them.
    label(&cluster, &["namespace", LATE], "ambient");
    let agent = Agent::start(node.config(&cluster.agent_kubeconfig));
    let ztunnel = FakeZtunnel::connect(&node.zds_socket());
    let snapshot = ztunnel.read_snapshot();
    let mut enrolled = added_uids(snapshot.iter().map(|received| &received.payload));
    while enrolled.len() < pods.len() {
        let received = ztunnel.receive_and_ack();
        enrolled.extend(added_uids([&received.payload]));
    }
    assert_eq!(enrolled, uids(&pods), "enrolled on the agent's start");
    for pod in &pods {
        assert!(!our_rules(&pod.netns).is_empty(), "{}: rules", pod.name);
        cluster.wait_for_redirection(LATE, &pod.name, Some("enabled"));
    }

    a_pod_that_opts_out_or_is_deleted_leaves(&cluster, &pods, &ztunnel);
    agent.stop();
}

/// The namespace is labelled ambient: both pods are found and enrolled,
/// with their API identity and their netns, and annotated `enabled`.
fn labelling_the_namespace_enrolls_its_running_pods(
    cluster: &Cluster,
    pods: &[RunningPod],
    ztunnel: &FakeZtunnel,
) {
    let labelled = Instant::now();
    label(cluster, &["namespace", LATE], "ambient");
    let mut enrolled = BTreeSet::new();
    while enrolled.len() < pods.len() {
        let received = ztunnel.receive_and_ack();
        let Payload::Add(add) = &received.payload else {
            panic!("expected adds, got {:?}", received.payload);
        };
        assert_eq!(received.fds.len(), 1, "the pod's netns goes with the add");
        let info = add.workload_info.as_ref().unwrap();
        assert_eq!(info.namespace, LATE);
        assert_eq!(info.service_account, format!("{}-account", info.name));
        enrolled.insert(add.uid.clone());
    }
    eprintln!(
        "label to both pods handed to ztunnel: {:?}",
        labelled.elapsed()
    );
    assert_eq!(enrolled, uids(pods));
    for pod in pods {
        let rules = our_rules(&pod.netns);
        assert!(
            rules.iter().any(|rule| rule == "-A OUTPUT -j ISTIO_OUTPUT"),
            "{}: {rules:#?}",
            pod.name
        );
        cluster.wait_for_redirection(LATE, &pod.name, Some("enabled"));
    }
}

/// The label is removed: both pods leave ztunnel, lose their rules and
/// their annotation, and keep running.
fn unlabelling_it_takes_them_out(cluster: &Cluster, pods: &[RunningPod], ztunnel: &FakeZtunnel) {
    label(cluster, &["namespace", LATE], "");
    let mut removed = BTreeSet::new();
    while removed.len() < pods.len() {
        let received = ztunnel.receive_and_ack();
        let Payload::Del(del) = &received.payload else {
            panic!("expected dels, got {:?}", received.payload);
        };
        removed.insert(del.uid.clone());
    }
    assert_eq!(removed, uids(pods));
    for pod in pods {
        assert!(our_rules(&pod.netns).is_empty(), "{}: rules left", pod.name);
        cluster.wait_for_redirection(LATE, &pod.name, None);
    }
}

/// One pod opts out with its own label (rules and annotation removed), the
/// other is deleted from the API (ztunnel told).
fn a_pod_that_opts_out_or_is_deleted_leaves(
    cluster: &Cluster,
    pods: &[RunningPod],
    ztunnel: &FakeZtunnel,
) {
    let (opted_out, deleted) = (&pods[0], &pods[1]);
    label(cluster, &["pod", &opted_out.name, "-n", LATE], "none");
    let received = next_change(ztunnel, pods);
    assert!(
        matches!(&received.payload, Payload::Del(del) if del.uid == opted_out.uid),
        "{:?}",
        received.payload
    );
    assert!(our_rules(&opted_out.netns).is_empty());
    cluster.wait_for_redirection(LATE, &opted_out.name, None);
    assert!(!our_rules(&deleted.netns).is_empty(), "the other pod stays");

    cluster
        .runtime
        .block_on(delete_pod(&cluster.admin, LATE, &deleted.name))
        .unwrap();
    let received = next_change(ztunnel, pods);
    assert!(
        matches!(&received.payload, Payload::Del(del) if del.uid == deleted.uid),
        "{:?}",
        received.payload
    );
}

/// The next request that is not a repeated `add` of one of `pods`, all
/// enrolled: the agent's start-up scan and its watch can both enroll a pod
/// that was labelled while it was away, and a repeated `add` of a pod in
/// the same netns changes nothing for ztunnel (WIRE.md §5).
fn next_change(ztunnel: &FakeZtunnel, pods: &[RunningPod]) -> Received {
    for _ in 0..10 {
        let received = ztunnel.receive_and_ack();
        let repeated = matches!(&received.payload,
            Payload::Add(add) if pods.iter().any(|pod| pod.uid == add.uid));
        if !repeated {
            return received;
        }
    }
    panic!("more than 10 repeated adds of enrolled pods")
}

/// Sets `istio.io/dataplane-mode` on the object `target` (kubectl words,
/// e.g. `["namespace", "late"]`) to `value`, or removes it when `value`
/// is empty.
fn label(cluster: &Cluster, target: &[&str], value: &str) {
    let assignment = if value.is_empty() {
        format!("{DATAPLANE_MODE}-")
    } else {
        format!("{DATAPLANE_MODE}={value}")
    };
    let mut args = vec!["label"];
    args.extend_from_slice(target);
    args.extend(["--overwrite", assignment.as_str()]);
    cluster.api.kubectl(&args, None).unwrap();
}

/// The uids of the `add`s among `payloads`.
fn added_uids<'a>(payloads: impl IntoIterator<Item = &'a Payload>) -> BTreeSet<String> {
    payloads
        .into_iter()
        .filter_map(|payload| match payload {
            Payload::Add(add) => Some(add.uid.clone()),
            _ => None,
        })
        .collect()
}

fn uids(pods: &[RunningPod]) -> BTreeSet<String> {
    pods.iter().map(|pod| pod.uid.clone()).collect()
}
