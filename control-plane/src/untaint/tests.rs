//! The untaint decisions, one case per line with its reason.

use k8s_openapi::api::core::v1::{NodeSpec, PodCondition, PodSpec, PodStatus};

use super::*;

fn pod(node: Option<&str>, phase: &str, ready: Option<&str>) -> Pod {
    Pod {
        spec: Some(PodSpec {
            node_name: node.map(str::to_owned),
            ..PodSpec::default()
        }),
        status: Some(PodStatus {
            phase: Some(phase.to_owned()),
            conditions: ready.map(|status| {
                vec![PodCondition {
                    type_: "Ready".to_owned(),
                    status: status.to_owned(),
                    ..PodCondition::default()
                }]
            }),
            ..PodStatus::default()
        }),
        ..Pod::default()
    }
}

fn taint(key: &str, effect: &str) -> Taint {
    Taint {
        key: key.to_owned(),
        effect: effect.to_owned(),
        ..Taint::default()
    }
}

fn node(taints: Option<Vec<Taint>>) -> Node {
    Node {
        spec: Some(NodeSpec {
            taints,
            ..NodeSpec::default()
        }),
        ..Node::default()
    }
}

#[test]
fn only_a_ready_agent_pod_on_a_node_untaints_it() {
    let cases = [
        (
            pod(Some("n1"), "Running", Some("True")),
            Some("n1"),
            "ready and running",
        ),
        (
            pod(Some("n1"), "Running", Some("False")),
            None,
            "running, not ready",
        ),
        (
            pod(Some("n1"), "Pending", None),
            None,
            "no Ready condition yet",
        ),
        (
            pod(Some("n1"), "Failed", Some("True")),
            None,
            "failed pods never count",
        ),
        (
            pod(None, "Running", Some("True")),
            None,
            "not bound to a node",
        ),
    ];
    for (pod, expected, reason) in &cases {
        assert_eq!(node_to_untaint(pod), *expected, "{reason}");
    }
}

#[test]
fn every_taint_with_the_key_goes_whatever_its_effect_and_the_others_stay() {
    let key = DEFAULT_TAINT_KEY;
    let other = taint("dedicated", "NoSchedule");
    let cases = [
        (node(None), None, "no taints: nothing to patch"),
        (
            node(Some(vec![other.clone()])),
            None,
            "only other taints: nothing to patch",
        ),
        (
            node(Some(vec![taint(key, "NoSchedule"), other.clone()])),
            Some(vec![other.clone()]),
            "ours removed, the other kept",
        ),
        (
            node(Some(vec![
                taint(key, "NoSchedule"),
                taint(key, "NoExecute"),
            ])),
            Some(vec![]),
            "the effect is not checked: both go",
        ),
    ];
    for (node, expected, reason) in &cases {
        assert_eq!(without_taint(node, key), *expected, "{reason}");
    }
}
