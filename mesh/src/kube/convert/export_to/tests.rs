//! Visibility as istiod resolves it (`serviceentry_visibility_test.go`'s
//! cases, one row each), and through the mesh file to the services.

use super::*;
use crate::MeshFile;

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
        .collect()
}

fn config(yaml: &str) -> ServiceEntryVisibility {
    serde_yaml_ng::from_str(yaml).unwrap()
}

/// istiod's own case: NAMESPACE by default, PUBLIC for namespaces
/// labelled `se-visibility: public`.
const PUBLIC_BY_LABEL: &str = "\
defaultVisibility: NAMESPACE
policies:
- visibility: PUBLIC
  matchingRules:
  - namespaceSelector: {matchLabels: {se-visibility: public}}
";

/// The mesh config (YAML), the namespace's labels, the visibility, why.
type Row<'a> = (
    Option<&'a str>,
    Option<&'a BTreeMap<String, String>>,
    Visibility,
    &'a str,
);

#[test]
fn export_to_visibility_follows_the_mesh_configs_policies_as_istiod_resolves_them() {
    let public = labels(&[("se-visibility", "public")]);
    let other = labels(&[("other", "x")]);
    let rows: &[Row<'_>] = &[
        (
            None,
            Some(&public),
            Visibility::Public,
            "no serviceEntryVisibility: public",
        ),
        (
            Some(PUBLIC_BY_LABEL),
            Some(&public),
            Visibility::Public,
            "the policy matches",
        ),
        (
            Some(PUBLIC_BY_LABEL),
            Some(&other),
            Visibility::Namespace,
            "no policy: the default",
        ),
        (
            Some(PUBLIC_BY_LABEL),
            None,
            Visibility::Namespace,
            "a namespace without labels",
        ),
        (
            Some(
                "defaultVisibility: NAMESPACE\npolicies:\n- visibility: PUBLIC\n  matchingRules:\n  - namespaceSelector: {matchLabels: {se-visibility: public}}\n  - namespaceSelector: {matchLabels: {team: a}}\n",
            ),
            Some(&public),
            Visibility::Namespace,
            "every rule must match",
        ),
        (
            Some(
                "defaultVisibility: NAMESPACE\npolicies:\n- visibility: PUBLIC\n  matchingRules:\n  - namespaceSelector: {matchExpressions: [{key: k, operator: BadOperator}]}\n",
            ),
            Some(&public),
            Visibility::Namespace,
            "a selector istiod cannot compile never matches",
        ),
        (
            Some(
                "defaultVisibility: PUBLIC\npolicies:\n- visibility: NONE\n  matchingRules:\n  - {}\n",
            ),
            Some(&public),
            Visibility::Public,
            "a rule without a matcher never matches",
        ),
        (
            Some("policies:\n- visibility: NONE\n"),
            Some(&other),
            Visibility::Hidden,
            "a policy without rules matches everything",
        ),
        (
            Some(
                "policies:\n- visibility: NAMESPACE\n  matchingRules:\n  - namespaceSelector: {}\n",
            ),
            Some(&other),
            Visibility::Namespace,
            "an empty selector matches every namespace",
        ),
        (
            Some("{}"),
            Some(&other),
            Visibility::Public,
            "unspecified default: public",
        ),
    ];
    for (yaml, namespace, expected, why) in rows {
        let config = yaml.map(config);
        assert_eq!(
            service_entry_visibility(config.as_ref(), *namespace),
            *expected,
            "{why}"
        );
    }
}

/// A mesh file with one ServiceEntry whose `exportTo` says `.`, under
/// `visibility` (a `serviceEntryVisibility:` block, or none).
fn services_of(visibility: &str) -> Vec<crate::Service> {
    let text = format!(
        "\
serviceEntries:
- metadata: {{name: api, namespace: shop}}
  spec:
    hosts: [api.example.com]
    addresses: [10.99.0.1]
    exportTo: [\".\"]
    ports: [{{number: 443, name: https, protocol: TLS}}]
    resolution: DNS
{visibility}"
    );
    let file: MeshFile = serde_yaml_ng::from_str(&text).unwrap();
    file.services
}

#[test]
fn export_to_is_ignored_and_the_mesh_configs_visibility_reaches_the_services() {
    let [service] = &services_of("")[..] else {
        panic!("one service");
    };
    assert_eq!(
        service.visibility,
        crate::ServiceVisibility::Public,
        "exportTo: [.] changes nothing in ambient"
    );
    let namespace = services_of("serviceEntryVisibility: {defaultVisibility: NAMESPACE}\n");
    assert_eq!(
        namespace
            .iter()
            .map(|service| service.visibility)
            .collect::<Vec<_>>(),
        [crate::ServiceVisibility::Namespace]
    );
    assert!(
        services_of("serviceEntryVisibility: {defaultVisibility: NONE}\n").is_empty(),
        "NONE: no dataplane, no service"
    );
}
