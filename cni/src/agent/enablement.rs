//! Whether a pod belongs in the ambient mesh (KUBERNETES.md A2): the
//! exclusions first (host network, sidecar-injected, excluded namespaces,
//! ztunnel's own pods, finished pods), then the list of
//! `{podSelector, namespaceSelector}` pairs with Kubernetes label-selector
//! semantics. Pure: the caller brings the Pod and its namespace's labels.
//!
//! Where the Pod and namespace come from is `kube.rs`'s; what the agent
//! does with the answer is `source.rs`'s.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use k8s_openapi::api::core::v1::Pod;
use serde::Deserialize;

/// The label that enrolls (`ambient`) or opts out (`none`), on a pod or a
/// namespace.
pub const DATAPLANE_MODE_LABEL: &str = "istio.io/dataplane-mode";
/// The annotation sidecar injection leaves on a pod; such a pod has its
/// own proxy and is never enrolled.
pub const SIDECAR_STATUS_ANNOTATION: &str = "sidecar.istio.io/status";
/// The annotation with which a pod turns the agent's DNS capture on or
/// off for itself (AMBIENT.md §5.7).
pub const DNS_CAPTURE_ANNOTATION: &str = "ambient.istio.io/dns-capture";
/// Namespaces left out unless configured otherwise.
pub const DEFAULT_EXCLUDED_NAMESPACES: &[&str] = &["kube-system"];
/// Where ztunnel runs unless configured otherwise.
pub const DEFAULT_SYSTEM_NAMESPACE: &str = "istio-system";

/// The label (and its value) that marks ztunnel's own pods in the system
/// namespace: they carry the proxy and cannot be redirected to themselves.
const ZTUNNEL_APP_LABEL: (&str, &str) = ("app", "ztunnel");

/// How a label-selector requirement compares a label's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum Operator {
    /// The key is present with one of the values.
    In,
    /// The key is absent, or present with none of the values.
    NotIn,
    /// The key is present, whatever its value.
    Exists,
    /// The key is absent.
    DoesNotExist,
}

/// One `matchExpressions` entry.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Requirement {
    /// The label key.
    pub key: String,
    /// How the value is compared.
    pub operator: Operator,
    /// The values `In` and `NotIn` compare against; empty for the others.
    #[serde(default)]
    pub values: Vec<String>,
}

impl Requirement {
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let value = labels.get(&self.key);
        let listed = value.is_some_and(|value| self.values.contains(value));
        match self.operator {
            Operator::In => listed,
            Operator::NotIn => !listed,
            Operator::Exists => value.is_some(),
            Operator::DoesNotExist => value.is_none(),
        }
    }
}

/// A Kubernetes `LabelSelector`: every `matchLabels` pair and every
/// requirement must hold; an empty selector matches every label set.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LabelSelector {
    /// Labels that must be present with exactly these values.
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
    /// Further requirements, all of which must hold.
    #[serde(default)]
    pub match_expressions: Vec<Requirement>,
}

impl LabelSelector {
    /// Whether `labels` satisfy the selector.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels
            .iter()
            .all(|(key, value)| labels.get(key) == Some(value))
            && self
                .match_expressions
                .iter()
                .all(|requirement| requirement.matches(labels))
    }

    /// Checks what the API server would refuse: `In`/`NotIn` without
    /// values, `Exists`/`DoesNotExist` with values.
    fn check(&self) -> Result<(), EnablementError> {
        for requirement in &self.match_expressions {
            let (key, operator) = (requirement.key.clone(), requirement.operator);
            let wants_values = matches!(operator, Operator::In | Operator::NotIn);
            match (wants_values, requirement.values.is_empty()) {
                (true, true) => return Err(EnablementError::MissingValues { key, operator }),
                (false, false) => return Err(EnablementError::UnexpectedValues { key, operator }),
                _ => {}
            }
        }
        Ok(())
    }
}

/// One entry of the enablement list: a pod is selected when both its own
/// labels and its namespace's labels match.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EnablementSelector {
    /// Compared with the pod's labels; absent = any pod.
    #[serde(default)]
    pub pod_selector: LabelSelector,
    /// Compared with the namespace's labels; absent = any namespace.
    #[serde(default)]
    pub namespace_selector: LabelSelector,
}

impl EnablementSelector {
    /// Whether this entry selects a pod with `pod_labels` in a namespace
    /// with `namespace_labels`.
    pub fn matches(
        &self,
        pod_labels: &BTreeMap<String, String>,
        namespace_labels: &BTreeMap<String, String>,
    ) -> bool {
        self.pod_selector.matches(pod_labels) && self.namespace_selector.matches(namespace_labels)
    }

    /// Istio's default list: a pod labelled `ambient` anywhere, or a pod
    /// not labelled `none` in a namespace labelled `ambient`. Together
    /// they make the pod's label win over its namespace's.
    pub fn istio_defaults() -> Vec<EnablementSelector> {
        vec![
            EnablementSelector {
                pod_selector: LabelSelector {
                    match_labels: BTreeMap::from([(
                        DATAPLANE_MODE_LABEL.to_owned(),
                        "ambient".to_owned(),
                    )]),
                    match_expressions: Vec::new(),
                },
                namespace_selector: LabelSelector::default(),
            },
            EnablementSelector {
                pod_selector: LabelSelector {
                    match_labels: BTreeMap::new(),
                    match_expressions: vec![Requirement {
                        key: DATAPLANE_MODE_LABEL.to_owned(),
                        operator: Operator::NotIn,
                        values: vec!["none".to_owned()],
                    }],
                },
                namespace_selector: LabelSelector {
                    match_labels: BTreeMap::from([(
                        DATAPLANE_MODE_LABEL.to_owned(),
                        "ambient".to_owned(),
                    )]),
                    match_expressions: Vec::new(),
                },
            },
        ]
    }

    /// Parses the `AMBIENT_ENABLEMENT_SELECTOR` format: a YAML list of
    /// `{podSelector, namespaceSelector}`.
    pub fn parse_list(yaml: &str) -> Result<Vec<EnablementSelector>, EnablementError> {
        let list: Vec<EnablementSelector> = serde_yaml_ng::from_str(yaml)?;
        for entry in &list {
            entry.pod_selector.check()?;
            entry.namespace_selector.check()?;
        }
        Ok(list)
    }
}

/// What decides enrollment besides the pod and its namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnablementSettings {
    /// A pod is enrolled when any entry selects it.
    pub selectors: Vec<EnablementSelector>,
    /// Namespaces whose pods are never enrolled.
    pub excluded_namespaces: BTreeSet<String>,
    /// Where ztunnel runs; its pods there are never enrolled.
    pub system_namespace: String,
}

impl Default for EnablementSettings {
    /// Istio's defaults: its selector list, `kube-system` excluded,
    /// `istio-system` as the system namespace.
    fn default() -> EnablementSettings {
        EnablementSettings {
            selectors: EnablementSelector::istio_defaults(),
            excluded_namespaces: DEFAULT_EXCLUDED_NAMESPACES
                .iter()
                .map(|namespace| (*namespace).to_owned())
                .collect(),
            system_namespace: DEFAULT_SYSTEM_NAMESPACE.to_owned(),
        }
    }
}

/// Whether a pod is enrolled, and if not, why not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enrollment {
    /// The pod belongs in the mesh.
    Enrolled,
    /// The pod shares the node's network; there is no pod netns to redirect.
    HostNetwork,
    /// The pod was injected with a sidecar proxy.
    SidecarInjected,
    /// The pod's namespace is excluded.
    ExcludedNamespace,
    /// The pod is a ztunnel in the system namespace.
    Ztunnel,
    /// The pod has finished (`Succeeded` or `Failed`).
    Terminal,
    /// No entry of the enablement list selects the pod.
    NotSelected,
}

impl Enrollment {
    /// Whether the pod belongs in the mesh.
    pub fn is_enrolled(self) -> bool {
        self == Enrollment::Enrolled
    }
}

impl fmt::Display for Enrollment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Enrollment::Enrolled => "enrolled",
            Enrollment::HostNetwork => "it uses the host network",
            Enrollment::SidecarInjected => "it has a sidecar (sidecar.istio.io/status)",
            Enrollment::ExcludedNamespace => "its namespace is excluded",
            Enrollment::Ztunnel => "it is a ztunnel pod",
            Enrollment::Terminal => "it has finished",
            Enrollment::NotSelected => "no ambient enablement selector matches it",
        })
    }
}

/// Decides whether `pod`, in a namespace labelled `namespace_labels`,
/// belongs in the mesh: the exclusions in order, then the selectors.
pub fn should_enroll(
    pod: &Pod,
    namespace_labels: &BTreeMap<String, String>,
    settings: &EnablementSettings,
) -> Enrollment {
    let metadata = &pod.metadata;
    let namespace = metadata.namespace.as_deref().unwrap_or_default();
    let no_labels = BTreeMap::new();
    let labels = metadata.labels.as_ref().unwrap_or(&no_labels);
    let spec = pod.spec.as_ref();
    let phase = pod
        .status
        .as_ref()
        .and_then(|status| status.phase.as_deref());
    let (app_key, app_value) = ZTUNNEL_APP_LABEL;
    if spec.and_then(|spec| spec.host_network).unwrap_or(false) {
        Enrollment::HostNetwork
    } else if metadata
        .annotations
        .as_ref()
        .is_some_and(|annotations| annotations.contains_key(SIDECAR_STATUS_ANNOTATION))
    {
        Enrollment::SidecarInjected
    } else if settings.excluded_namespaces.contains(namespace) {
        Enrollment::ExcludedNamespace
    } else if namespace == settings.system_namespace
        && labels.get(app_key).map(String::as_str) == Some(app_value)
    {
        Enrollment::Ztunnel
    } else if matches!(phase, Some("Succeeded" | "Failed")) {
        Enrollment::Terminal
    } else if settings
        .selectors
        .iter()
        .any(|selector| selector.matches(labels, namespace_labels))
    {
        Enrollment::Enrolled
    } else {
        Enrollment::NotSelected
    }
}

/// Why an enablement list could not be read.
#[derive(Debug, thiserror::Error)]
pub enum EnablementError {
    /// The text is not a YAML list of `{podSelector, namespaceSelector}`.
    #[error("ambient enablement selectors")]
    Yaml(#[from] serde_yaml_ng::Error),
    /// An `In` or `NotIn` requirement lists no values.
    #[error("ambient enablement selectors: key {key}: operator {operator:?} needs values")]
    MissingValues {
        /// The requirement's key.
        key: String,
        /// Its operator.
        operator: Operator,
    },
    /// An `Exists` or `DoesNotExist` requirement lists values.
    #[error("ambient enablement selectors: key {key}: operator {operator:?} takes no values")]
    UnexpectedValues {
        /// The requirement's key.
        key: String,
        /// Its operator.
        operator: Operator,
    },
}

/// The pod's own DNS capture choice: its [`DNS_CAPTURE_ANNOTATION`],
/// `true` or `false` in any case; `None` when absent or another value,
/// leaving the agent's setting.
pub fn dns_capture(pod: &Pod) -> Option<bool> {
    let value = pod
        .metadata
        .annotations
        .as_ref()?
        .get(DNS_CAPTURE_ANNOTATION)?;
    if value.eq_ignore_ascii_case("true") {
        Some(true)
    } else if value.eq_ignore_ascii_case("false") {
        Some(false)
    } else {
        None
    }
}

#[cfg(test)]
mod tests;
