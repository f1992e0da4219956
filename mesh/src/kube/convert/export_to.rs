//! Who sees a Service or ServiceEntry, as istiod's ambient index decides it
//! for ztunnel (`pilot/pkg/serviceregistry/ambient/services.go`,
//! `pilot/pkg/model/serviceentry_visibility.go`).
//!
//! `exportTo` (the `networking.istio.io/exportTo` annotation of a Service,
//! a ServiceEntry's `spec.exportTo`) plays no part there: istiod's ambient
//! index never reads it, and the mesh config's API says so ("ambient
//! ignores `exportTo`"). A Kubernetes Service is sent to every ztunnel,
//! `PUBLIC`. A ServiceEntry's visibility is the mesh config's
//! `serviceEntryVisibility`: the first policy whose every rule matches the
//! entry's namespace labels, else the default; `NONE` leaves the entry's
//! services out, `NAMESPACE` limits them to clients of their namespace
//! (ztunnel's lookups honour it), `PUBLIC` (also the unset default) is
//! everyone's.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde::Deserialize;

use super::waypoint::selects;

/// A visibility as the mesh config writes it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum ConfiguredVisibility {
    /// Unset: `PUBLIC`.
    #[default]
    #[serde(rename = "VISIBILITY_UNSPECIFIED")]
    Unspecified,
    /// No dataplane is configured for the entry.
    #[serde(rename = "NONE")]
    None,
    /// Only clients of the entry's namespace.
    #[serde(rename = "NAMESPACE")]
    Namespace,
    /// Everyone the control plane configures.
    #[serde(rename = "PUBLIC")]
    Public,
}

/// The mesh config's `serviceEntryVisibility`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceEntryVisibility {
    /// Where no policy matches.
    #[serde(default)]
    pub default_visibility: ConfiguredVisibility,
    /// In order; the first whose rules all match decides.
    #[serde(default)]
    pub policies: Vec<VisibilityPolicy>,
}

/// One policy of [`ServiceEntryVisibility`].
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VisibilityPolicy {
    /// The visibility of the entries it matches.
    #[serde(default)]
    pub visibility: ConfiguredVisibility,
    /// All must match; none matches every entry.
    #[serde(default)]
    pub matching_rules: Vec<MatchRule>,
}

/// One rule of a [`VisibilityPolicy`]: a matcher of the entry's namespace.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MatchRule {
    /// The entry's namespace's labels. A rule without a matcher never
    /// matches, as istiod compiles one it does not know.
    #[serde(default)]
    pub namespace_selector: Option<LabelSelector>,
}

/// A ServiceEntry's services' visibility, once decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Visibility {
    /// Left out.
    Hidden,
    /// Only clients of its namespace.
    Namespace,
    /// Everyone's.
    Public,
}

/// The visibility of a ServiceEntry of a namespace labelled
/// `namespace_labels`, under `config` (`None`: the mesh config has no
/// `serviceEntryVisibility`, everything is public).
pub fn service_entry_visibility(
    config: Option<&ServiceEntryVisibility>,
    namespace_labels: Option<&BTreeMap<String, String>>,
) -> Visibility {
    let Some(config) = config else {
        return Visibility::Public;
    };
    let matched = config.policies.iter().find(|policy| {
        policy.matching_rules.iter().all(|rule| {
            rule.namespace_selector
                .as_ref()
                .is_some_and(|selector| selects(selector, namespace_labels))
        })
    });
    match matched.map_or(config.default_visibility, |policy| policy.visibility) {
        ConfiguredVisibility::None => Visibility::Hidden,
        ConfiguredVisibility::Namespace => Visibility::Namespace,
        ConfiguredVisibility::Public | ConfiguredVisibility::Unspecified => Visibility::Public,
    }
}

#[cfg(test)]
mod tests;
