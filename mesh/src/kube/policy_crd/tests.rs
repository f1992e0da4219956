//! The AuthorizationPolicy type against objects as the API server sends
//! them, and the CRD manifest against the type.

use k8s_openapi::Resource;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps,
};
use serde_json::json;

use super::*;

const CRD: &str =
    include_str!("../../../../deploy/crds/authorizationpolicies.security.istio.io.yaml");

#[test]
fn a_policy_from_the_api_server_reads_with_unknown_fields_ignored() {
    let policy: AuthorizationPolicy = serde_json::from_value(json!({
        "apiVersion": "security.istio.io/v1",
        "kind": "AuthorizationPolicy",
        "metadata": {"name": "p", "namespace": "shop", "annotations": {"istio.io/dry-run": "true"}},
        "spec": {
            "selector": {"matchLabels": {"app": "web"}},
            "action": "DENY",
            "rules": [{
                "from": [{"source": {"principals": ["a"], "trustDomains": ["td"], "newField": 1}}],
                "to": [{"operation": {"ports": ["80"], "methods": ["GET"]}}],
                "when": [{"key": "source.ip", "values": ["10.0.0.1"], "notValues": ["10.0.0.2"]}],
            }],
            "futureField": {"x": 1},
        },
        "status": {"conditions": []},
    }))
    .unwrap();
    assert_eq!(policy.metadata.name.as_deref(), Some("p"));
    assert_eq!(policy.spec.action, Some(Action::Deny));
    let selector = policy.spec.selector.as_ref().unwrap();
    assert_eq!(
        selector.match_labels.get("app").map(String::as_str),
        Some("web")
    );
    let rule = &policy.spec.rules[0];
    let source = rule.from[0].source.as_ref().unwrap();
    assert_eq!(
        (
            source.principals.as_slice(),
            source.trust_domains.as_slice()
        ),
        (&["a".to_owned()][..], &["td".to_owned()][..])
    );
    let operation = rule.to[0].operation.as_ref().unwrap();
    assert_eq!(operation.ports, ["80"], "ports are strings in Istio's API");
    assert_eq!(rule.when[0].not_values, ["10.0.0.2"]);

    let empty: AuthorizationPolicy =
        serde_json::from_value(json!({"metadata": {"name": "e", "namespace": "n"}})).unwrap();
    assert_eq!(
        empty.spec,
        AuthorizationPolicySpec::default(),
        "no spec is an empty spec"
    );
    assert_eq!(
        empty.spec.action, None,
        "absent action (ALLOW) stays absent"
    );
}

#[test]
fn a_policy_writes_with_its_api_version_and_kind_and_reads_back() {
    let policy = AuthorizationPolicy {
        metadata: ObjectMeta {
            name: Some("p".into()),
            namespace: Some("shop".into()),
            ..ObjectMeta::default()
        },
        spec: AuthorizationPolicySpec {
            action: Some(Action::Allow),
            rules: vec![Rule {
                to: vec![RuleTo {
                    operation: Some(Operation {
                        ports: vec!["80".into()],
                        ..Operation::default()
                    }),
                }],
                ..Rule::default()
            }],
            ..AuthorizationPolicySpec::default()
        },
    };
    let written = serde_json::to_value(&policy).unwrap();
    assert_eq!(
        written,
        json!({
            "apiVersion": "security.istio.io/v1",
            "kind": "AuthorizationPolicy",
            "metadata": {"name": "p", "namespace": "shop"},
            "spec": {"action": "ALLOW", "rules": [{"to": [{"operation": {"ports": ["80"]}}]}]},
        })
    );
    assert_eq!(
        serde_json::from_value::<AuthorizationPolicy>(written).unwrap(),
        policy
    );
}

#[test]
fn kube_rs_finds_the_policies_where_the_api_server_serves_them() {
    type Policy = AuthorizationPolicy;
    assert_eq!(
        <Policy as ::kube::Resource>::plural(&()),
        "authorizationpolicies"
    );
    assert_eq!(
        <Policy as ::kube::Resource>::url_path(&(), Some("shop")),
        "/apis/security.istio.io/v1/namespaces/shop/authorizationpolicies"
    );
    assert_eq!(
        <Policy as ::kube::Resource>::api_version(&()),
        "security.istio.io/v1"
    );
}

#[test]
fn the_crd_manifest_names_the_type_and_has_a_structural_schema() {
    let crd: CustomResourceDefinition = serde_yaml_ng::from_str(CRD).unwrap();
    let spec = &crd.spec;
    assert_eq!(
        crd.metadata.name.as_deref(),
        Some(
            format!(
                "{}.{}",
                AuthorizationPolicy::URL_PATH_SEGMENT,
                AuthorizationPolicy::GROUP
            )
            .as_str()
        )
    );
    assert_eq!(spec.group, AuthorizationPolicy::GROUP);
    assert_eq!(spec.names.kind, AuthorizationPolicy::KIND);
    assert_eq!(spec.names.plural, AuthorizationPolicy::URL_PATH_SEGMENT);
    assert_eq!(spec.names.singular.as_deref(), Some("authorizationpolicy"));
    assert_eq!(
        spec.names.short_names.as_deref(),
        Some(&["ap".to_owned()][..])
    );
    assert_eq!(spec.scope, "Namespaced");
    let [version] = &spec.versions[..] else {
        panic!("one version")
    };
    assert_eq!(version.name, AuthorizationPolicy::VERSION);
    assert!(version.served && version.storage);
    assert!(
        version
            .subresources
            .as_ref()
            .and_then(|s| s.status.as_ref())
            .is_some()
    );
    let schema = version
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .unwrap();
    assert_structural(schema, "");

    let spec_schema = &schema.properties.as_ref().unwrap()["spec"];
    let action = &spec_schema.properties.as_ref().unwrap()["action"];
    let values: Vec<String> = action
        .enum_
        .iter()
        .flatten()
        .map(|value| value.0.to_string())
        .collect();
    assert_eq!(
        values,
        [r#""ALLOW""#, r#""DENY""#, r#""AUDIT""#, r#""CUSTOM""#]
    );
    let status = &schema.properties.as_ref().unwrap()["status"];
    assert_eq!(status.x_kubernetes_preserve_unknown_fields, Some(true));
}

/// What the API server requires of a structural schema, as far as this
/// manifest uses it: every node typed, objects with either properties or
/// additionalProperties, arrays with items.
pub(in crate::kube) fn assert_structural(schema: &JSONSchemaProps, path: &str) {
    let kind = schema.type_.as_deref();
    assert!(kind.is_some(), "{path}: no type");
    assert!(
        !(schema.properties.is_some() && schema.additional_properties.is_some()),
        "{path}: properties and additionalProperties"
    );
    for (name, property) in schema.properties.iter().flatten() {
        assert_eq!(kind, Some("object"), "{path}: properties on a non-object");
        assert_structural(property, &format!("{path}.{name}"));
    }
    if kind == Some("array") {
        let items = schema.items.as_ref().expect("array without items");
        let k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaPropsOrArray::Schema(items) = items else {
            panic!("{path}: items must be one schema")
        };
        assert_structural(items, &format!("{path}[]"));
    }
    if let Some(k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaPropsOrBool::Schema(values)) =
        &schema.additional_properties
    {
        assert_structural(values, &format!("{path}{{}}"));
    }
}
