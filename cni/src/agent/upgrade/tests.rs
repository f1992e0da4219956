#![allow(clippy::unwrap_used, clippy::panic)] // tests: a panic is a failed test

use k8s_openapi::api::core::v1::{
    Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, PodSpec,
};

use super::*;

const DS: &str = "istio-cni-node";

fn node(name: &str, labels: &[(&str, &str)]) -> NodeFacts {
    NodeFacts {
        name: name.to_owned(),
        labels: labels
            .iter()
            .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
            .collect(),
    }
}

/// The chart's node: Linux, in zone a, its kernel generation 6.
fn linux_node() -> NodeFacts {
    node(
        "node-a",
        &[
            ("kubernetes.io/os", "linux"),
            ("zone", "a"),
            ("kernel", "6"),
        ],
    )
}

fn requirement(key: &str, operator: &str, values: &[&str]) -> NodeSelectorRequirement {
    NodeSelectorRequirement {
        key: key.to_owned(),
        operator: operator.to_owned(),
        values: (!values.is_empty()).then(|| values.iter().map(|v| (*v).to_owned()).collect()),
    }
}

/// A pod template with `node_selector` labels and required node affinity
/// `terms`: each term a list of label expressions and a list of fields.
type Terms<'a> = &'a [(&'a [NodeSelectorRequirement], &'a [NodeSelectorRequirement])];

fn spec(node_selector: &[(&str, &str)], terms: Option<Terms<'_>>) -> PodSpec {
    let terms = terms.map(|terms| {
        terms
            .iter()
            .map(|(labels, fields)| NodeSelectorTerm {
                match_expressions: (!labels.is_empty()).then(|| labels.to_vec()),
                match_fields: (!fields.is_empty()).then(|| fields.to_vec()),
            })
            .collect()
    });
    PodSpec {
        node_selector: (!node_selector.is_empty()).then(|| {
            node_selector
                .iter()
                .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
                .collect()
        }),
        affinity: terms.map(|node_selector_terms| Affinity {
            node_affinity: Some(NodeAffinity {
                required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                    node_selector_terms,
                }),
                ..NodeAffinity::default()
            }),
            ..Affinity::default()
        }),
        ..PodSpec::default()
    }
}

fn daemon_set(deleting: bool, template: &PodSpec, node: Option<NodeFacts>) -> Observation {
    Observation::DaemonSet(DaemonSetFacts {
        name: DS.to_owned(),
        deleting,
        placement: Placement::of(Some(template)),
        node,
    })
}

#[test]
fn the_installation_stays_only_while_the_daemon_set_will_start_the_next_agent_here() {
    use ExitPolicy::{Keep, Remove, SafeUpgrade};
    let linux = spec(&[("kubernetes.io/os", "linux")], None);
    let windows = spec(&[("kubernetes.io/os", "windows")], None);
    let in_zone_b = [requirement("zone", "In", &["b"])];
    let zone_b = spec(&[("kubernetes.io/os", "linux")], Some(&[(&in_zone_b, &[])]));
    let bad_operator = [requirement("zone", "Near", &["a"])];
    let unreadable = spec(&[], Some(&[(&bad_operator, &[])]));
    let replaced = || Exit::Keep(Reason::Replaced(DS.to_owned()));
    let gone = || Observation::DaemonSetGone(DS.to_owned());
    #[rustfmt::skip]
    let cases: Vec<(&str, ExitPolicy, Observation, Exit)> = vec![
        ("an upgrade or a reboot: the DaemonSet stays and still selects the node",
            SafeUpgrade, daemon_set(false, &linux, Some(linux_node())), replaced()),
        ("a template without placement runs everywhere",
            SafeUpgrade, daemon_set(false, &PodSpec::default(), Some(linux_node())), replaced()),
        ("helm uninstall: the DaemonSet is gone",
            SafeUpgrade, gone(), Exit::Remove(Reason::DaemonSetGone(DS.to_owned()))),
        ("helm uninstall caught early: the DaemonSet is being deleted",
            SafeUpgrade, daemon_set(true, &linux, Some(linux_node())),
            Exit::Remove(Reason::DaemonSetDeleting(DS.to_owned()))),
        ("the nodeSelector no longer matches the node",
            SafeUpgrade, daemon_set(false, &windows, Some(linux_node())),
            Exit::Remove(Reason::NodeNotSelected(DS.to_owned()))),
        ("the required node affinity no longer matches the node",
            SafeUpgrade, daemon_set(false, &zone_b, Some(linux_node())),
            Exit::Remove(Reason::NodeNotSelected(DS.to_owned()))),
        ("the node is gone from the API",
            SafeUpgrade, daemon_set(false, &linux, None), Exit::Remove(Reason::NodeGone)),
        ("a placement the scheduler would refuse cannot promise another agent",
            SafeUpgrade, daemon_set(false, &unreadable, Some(linux_node())),
            Exit::Remove(Reason::PlacementUnreadable(DS.to_owned(), PlacementError::Invalid {
                key: "zone".into(), operator: "Near".into(), why: "no such operator" }))),
        ("a pod no DaemonSet controls has no successor",
            SafeUpgrade, Observation::NotFromDaemonSet, Exit::Remove(Reason::NotFromDaemonSet)),
        ("an unanswered question is a doubt, and doubt removes",
            SafeUpgrade, Observation::Unanswered("forbidden".into()),
            Exit::Remove(Reason::Unanswered("forbidden".into()))),
        ("the registry source has no API to ask",
            SafeUpgrade, Observation::NoApi, Exit::Remove(Reason::NoApi)),
        ("--keep-cni-on-exit keeps even after an uninstall",
            Keep, gone(), Exit::Keep(Reason::KeepFlag)),
        ("--keep-cni-on-exit needs no API",
            Keep, Observation::NoApi, Exit::Keep(Reason::KeepFlag)),
        ("AMBIENT_DISABLE_SAFE_UPGRADE removes even during an upgrade",
            Remove, daemon_set(false, &linux, Some(linux_node())),
            Exit::Remove(Reason::SafeUpgradeDisabled)),
    ];
    for (reason, policy, observation, expected) in cases {
        assert_eq!(decide(policy, &observation), expected, "{reason}");
    }
}

#[test]
fn placement_reads_node_selector_and_required_affinity_as_the_scheduler_does() {
    let req = requirement;
    let name_is = |name: &str| [req("metadata.name", "In", &[name])];
    #[rustfmt::skip]
    let cases: Vec<(&str, PodSpec, bool)> = vec![
        ("every nodeSelector label must match",
            spec(&[("kubernetes.io/os", "linux"), ("zone", "a")], None), true),
        ("one differing nodeSelector label is enough to refuse",
            spec(&[("kubernetes.io/os", "linux"), ("zone", "b")], None), false),
        ("terms are ORed",
            spec(&[], Some(&[(&[req("zone", "In", &["b"])], &[]), (&[req("zone", "In", &["a"])], &[])])), true),
        ("expressions in a term are ANDed",
            spec(&[], Some(&[(&[req("zone", "In", &["a"]), req("gpu", "Exists", &[])], &[])])), false),
        ("nodeSelector and affinity must both hold",
            spec(&[("kubernetes.io/os", "windows")], Some(&[(&[req("zone", "In", &["a"])], &[])])), false),
        ("NotIn holds for an absent label",
            spec(&[], Some(&[(&[req("gpu", "NotIn", &["yes"])], &[])])), true),
        ("NotIn refuses a listed value",
            spec(&[], Some(&[(&[req("zone", "NotIn", &["a", "b"])], &[])])), false),
        ("DoesNotExist",
            spec(&[], Some(&[(&[req("gpu", "DoesNotExist", &[])], &[])])), true),
        ("Gt compares integers",
            spec(&[], Some(&[(&[req("kernel", "Gt", &["5"])], &[])])), true),
        ("Lt compares integers",
            spec(&[], Some(&[(&[req("kernel", "Lt", &["6"])], &[])])), false),
        ("Gt on a label that is not an integer holds for no node",
            spec(&[], Some(&[(&[req("zone", "Gt", &["1"])], &[])])), false),
        ("matchFields on this node's name",
            spec(&[], Some(&[(&[], &name_is("node-a"))])), true),
        ("matchFields on another node's name",
            spec(&[], Some(&[(&[], &name_is("node-b"))])), false),
        ("matchFields NotIn another node's name",
            spec(&[], Some(&[(&[], &[req("metadata.name", "NotIn", &["node-b"])])])), true),
        ("an empty term selects no node",
            spec(&[], Some(&[(&[], &[])])), false),
        ("an empty term list selects no node",
            spec(&[], Some(&[])), false),
    ];
    let node = linux_node();
    for (reason, template, expected) in cases {
        let placement = Placement::of(Some(&template)).unwrap();
        assert_eq!(placement.selects(&node), expected, "{reason}");
    }
}

#[test]
fn requirements_the_scheduler_refuses_make_the_placement_unreadable() {
    let req = requirement;
    #[rustfmt::skip]
    let cases: Vec<(&str, NodeSelectorRequirement, bool)> = vec![
        ("In without values", req("zone", "In", &[]), false),
        ("Exists with values", req("zone", "Exists", &["a"]), false),
        ("Gt with two values", req("kernel", "Gt", &["1", "2"]), false),
        ("Lt with a word", req("kernel", "Lt", &["six"]), false),
        ("an unknown operator", req("zone", "Near", &["a"]), false),
        ("a field with Exists", req("metadata.name", "Exists", &[]), true),
        ("a field with two names", req("metadata.name", "In", &["a", "b"]), true),
    ];
    for (reason, requirement, as_field) in cases {
        let term: (&[NodeSelectorRequirement], &[NodeSelectorRequirement]) = if as_field {
            (&[], std::slice::from_ref(&requirement))
        } else {
            (std::slice::from_ref(&requirement), &[])
        };
        let template = spec(&[], Some(&[term]));
        assert!(Placement::of(Some(&template)).is_err(), "{reason}");
    }
}
