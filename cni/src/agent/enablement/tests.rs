//! One case per row of KUBERNETES.md A2's precedence table and per
//! exclusion, each with its reason; the selector semantics; the YAML form.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Pod, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::*;

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
        .collect()
}

/// Label pairs as the cases write them.
type Pairs = &'static [(&'static str, &'static str)];

/// A pod as the cases describe it.
#[derive(Default)]
struct PodCase {
    namespace: &'static str,
    labels: Pairs,
    annotations: Pairs,
    host_network: bool,
    phase: Option<&'static str>,
}

impl PodCase {
    fn pod(&self) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("app-0".to_owned()),
                namespace: Some(self.namespace.to_owned()),
                labels: Some(labels(self.labels)),
                annotations: Some(labels(self.annotations)),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                host_network: Some(self.host_network),
                ..PodSpec::default()
            }),
            status: Some(PodStatus {
                phase: self.phase.map(str::to_owned),
                ..PodStatus::default()
            }),
        }
    }
}

const AMBIENT: Pairs = &[(DATAPLANE_MODE_LABEL, "ambient")];
const NONE: Pairs = &[(DATAPLANE_MODE_LABEL, "none")];
const OTHER: Pairs = &[(DATAPLANE_MODE_LABEL, "foo")];
const NO_LABELS: Pairs = &[];

#[test]
fn enrollment_follows_the_precedence_table_and_the_exclusions() {
    #[rustfmt::skip]
    let cases: &[(&str, PodCase, Pairs, Enrollment)] = &[
        // The precedence table, one row each (pod label wins).
        ("pod ambient, namespace unlabelled: rule 1", PodCase { namespace: "apps", labels: AMBIENT, ..PodCase::default() }, NO_LABELS, Enrollment::Enrolled),
        ("pod ambient, namespace none: rule 1 ignores the namespace", PodCase { namespace: "apps", labels: AMBIENT, ..PodCase::default() }, NONE, Enrollment::Enrolled),
        ("pod none, namespace ambient: the pod opts out", PodCase { namespace: "apps", labels: NONE, ..PodCase::default() }, AMBIENT, Enrollment::NotSelected),
        ("pod unlabelled, namespace ambient: NotIn matches a missing key", PodCase { namespace: "apps", labels: NO_LABELS, ..PodCase::default() }, AMBIENT, Enrollment::Enrolled),
        ("pod foo, namespace ambient: rule 2", PodCase { namespace: "apps", labels: OTHER, ..PodCase::default() }, AMBIENT, Enrollment::Enrolled),
        ("pod unlabelled, namespace unlabelled", PodCase { namespace: "apps", labels: NO_LABELS, ..PodCase::default() }, NO_LABELS, Enrollment::NotSelected),
        ("pod foo, namespace foo", PodCase { namespace: "apps", labels: OTHER, ..PodCase::default() }, OTHER, Enrollment::NotSelected),
        // The exclusions, each on a pod the selectors would enroll.
        ("host network comes first", PodCase { namespace: "apps", labels: AMBIENT, host_network: true, ..PodCase::default() }, AMBIENT, Enrollment::HostNetwork),
        ("a sidecar-injected pod has its own proxy", PodCase { namespace: "apps", labels: AMBIENT, annotations: &[(SIDECAR_STATUS_ANNOTATION, "{}")], ..PodCase::default() }, AMBIENT, Enrollment::SidecarInjected),
        ("kube-system is excluded by default", PodCase { namespace: "kube-system", labels: AMBIENT, ..PodCase::default() }, AMBIENT, Enrollment::ExcludedNamespace),
        ("a ztunnel pod in the system namespace", PodCase { namespace: "istio-system", labels: &[("app", "ztunnel"), (DATAPLANE_MODE_LABEL, "ambient")], ..PodCase::default() }, AMBIENT, Enrollment::Ztunnel),
        ("app=ztunnel elsewhere is an ordinary pod", PodCase { namespace: "apps", labels: &[("app", "ztunnel")], ..PodCase::default() }, AMBIENT, Enrollment::Enrolled),
        ("another pod of the system namespace is not excluded by name", PodCase { namespace: "istio-system", labels: AMBIENT, ..PodCase::default() }, NO_LABELS, Enrollment::Enrolled),
        ("a succeeded pod has finished", PodCase { namespace: "apps", labels: AMBIENT, phase: Some("Succeeded"), ..PodCase::default() }, AMBIENT, Enrollment::Terminal),
        ("a failed pod has finished", PodCase { namespace: "apps", labels: AMBIENT, phase: Some("Failed"), ..PodCase::default() }, AMBIENT, Enrollment::Terminal),
        ("a pending pod is still coming up", PodCase { namespace: "apps", labels: AMBIENT, phase: Some("Pending"), ..PodCase::default() }, AMBIENT, Enrollment::Enrolled),
    ];
    let settings = EnablementSettings::default();
    for (reason, pod, namespace_labels, expected) in cases {
        let got = should_enroll(&pod.pod(), &labels(namespace_labels), &settings);
        assert_eq!(got, *expected, "{reason}");
    }
}

#[test]
fn a_pod_without_spec_status_or_labels_is_judged_by_its_namespace() {
    let pod = Pod {
        metadata: ObjectMeta {
            namespace: Some("apps".to_owned()),
            ..ObjectMeta::default()
        },
        ..Pod::default()
    };
    let settings = EnablementSettings::default();
    assert_eq!(
        should_enroll(&pod, &labels(AMBIENT), &settings),
        Enrollment::Enrolled
    );
    assert_eq!(
        should_enroll(&pod, &labels(NO_LABELS), &settings),
        Enrollment::NotSelected
    );
}

#[test]
fn excluded_namespaces_and_system_namespace_come_from_the_settings() {
    let settings = EnablementSettings {
        excluded_namespaces: BTreeSet::from(["batch".to_owned()]),
        system_namespace: "mesh-system".to_owned(),
        ..EnablementSettings::default()
    };
    let in_batch = PodCase {
        namespace: "batch",
        labels: AMBIENT,
        ..PodCase::default()
    };
    let in_kube_system = PodCase {
        namespace: "kube-system",
        labels: AMBIENT,
        ..PodCase::default()
    };
    let ztunnel = PodCase {
        namespace: "mesh-system",
        labels: &[("app", "ztunnel"), (DATAPLANE_MODE_LABEL, "ambient")],
        ..PodCase::default()
    };
    let no_ns = labels(NO_LABELS);
    assert_eq!(
        should_enroll(&in_batch.pod(), &no_ns, &settings),
        Enrollment::ExcludedNamespace
    );
    assert_eq!(
        should_enroll(&in_kube_system.pod(), &no_ns, &settings),
        Enrollment::Enrolled
    );
    assert_eq!(
        should_enroll(&ztunnel.pod(), &no_ns, &settings),
        Enrollment::Ztunnel
    );
}

#[test]
fn label_selectors_follow_kubernetes_semantics() {
    let requirement = |key: &str, operator, values: &[&str]| LabelSelector {
        match_labels: BTreeMap::new(),
        match_expressions: vec![Requirement {
            key: key.to_owned(),
            operator,
            values: values.iter().map(|value| (*value).to_owned()).collect(),
        }],
    };
    #[rustfmt::skip]
    let cases: &[(&str, LabelSelector, Pairs, bool)] = &[
        ("an empty selector matches no labels", LabelSelector::default(), NO_LABELS, true),
        ("an empty selector matches any labels", LabelSelector::default(), OTHER, true),
        ("matchLabels needs the value", LabelSelector { match_labels: labels(AMBIENT), ..LabelSelector::default() }, OTHER, false),
        ("matchLabels needs the key", LabelSelector { match_labels: labels(AMBIENT), ..LabelSelector::default() }, NO_LABELS, false),
        ("matchLabels with extra labels", LabelSelector { match_labels: labels(AMBIENT), ..LabelSelector::default() }, &[(DATAPLANE_MODE_LABEL, "ambient"), ("app", "web")], true),
        ("In with a listed value", requirement("tier", Operator::In, &["web", "db"]), &[("tier", "db")], true),
        ("In with another value", requirement("tier", Operator::In, &["web"]), &[("tier", "db")], false),
        ("In with the key missing", requirement("tier", Operator::In, &["web"]), NO_LABELS, false),
        ("NotIn with a listed value", requirement("tier", Operator::NotIn, &["web"]), &[("tier", "web")], false),
        ("NotIn with another value", requirement("tier", Operator::NotIn, &["web"]), &[("tier", "db")], true),
        ("NotIn with the key missing", requirement("tier", Operator::NotIn, &["web"]), NO_LABELS, true),
        ("Exists with the key", requirement("tier", Operator::Exists, &[]), &[("tier", "")], true),
        ("Exists without it", requirement("tier", Operator::Exists, &[]), NO_LABELS, false),
        ("DoesNotExist without the key", requirement("tier", Operator::DoesNotExist, &[]), NO_LABELS, true),
        ("DoesNotExist with it", requirement("tier", Operator::DoesNotExist, &[]), &[("tier", "web")], false),
    ];
    for (reason, selector, pod_labels, expected) in cases {
        assert_eq!(selector.matches(&labels(pod_labels)), *expected, "{reason}");
    }
}

#[test]
fn the_yaml_form_of_istios_defaults_parses_to_the_defaults() {
    let yaml = r#"
- podSelector:
    matchLabels: {istio.io/dataplane-mode: ambient}
- podSelector:
    matchExpressions:
      - {key: istio.io/dataplane-mode, operator: NotIn, values: [none]}
  namespaceSelector:
    matchLabels: {istio.io/dataplane-mode: ambient}
"#;
    assert_eq!(
        EnablementSelector::parse_list(yaml).unwrap(),
        EnablementSelector::istio_defaults()
    );
}

#[test]
fn an_empty_yaml_list_enrolls_nothing() {
    let settings = EnablementSettings {
        selectors: EnablementSelector::parse_list("[]").unwrap(),
        ..EnablementSettings::default()
    };
    let pod = PodCase {
        namespace: "apps",
        labels: AMBIENT,
        ..PodCase::default()
    };
    assert_eq!(
        should_enroll(&pod.pod(), &labels(AMBIENT), &settings),
        Enrollment::NotSelected
    );
}

#[test]
fn malformed_selector_lists_are_refused() {
    #[rustfmt::skip]
    let cases: &[(&str, &str)] = &[
        ("not a list", "podSelector: {}"),
        ("a misspelt field", "- podSelectr: {}"),
        ("an unknown operator", "- podSelector: {matchExpressions: [{key: a, operator: Equals, values: [b]}]}"),
        ("In without values", "- podSelector: {matchExpressions: [{key: a, operator: In}]}"),
        ("Exists with values", "- namespaceSelector: {matchExpressions: [{key: a, operator: Exists, values: [b]}]}"),
    ];
    for (reason, yaml) in cases {
        assert!(
            EnablementSelector::parse_list(yaml).is_err(),
            "{reason}: {yaml}"
        );
    }
}

#[test]
fn a_pods_dns_capture_annotation_is_read_as_true_or_false_in_any_case() {
    let annotated = |value: Option<&str>| {
        let annotations: Vec<(&str, &str)> = value
            .map(|value| vec![(DNS_CAPTURE_ANNOTATION, value)])
            .unwrap_or_default();
        Pod {
            metadata: ObjectMeta {
                annotations: Some(labels(&annotations)),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        }
    };
    for (value, want) in [
        (None, None),
        (Some("true"), Some(true)),
        (Some("False"), Some(false)),
        (Some("FALSE"), Some(false)),
        // Anything else leaves the agent's setting.
        (Some("off"), None),
        (Some(""), None),
    ] {
        assert_eq!(dns_capture(&annotated(value)), want, "{value:?}");
    }
}
