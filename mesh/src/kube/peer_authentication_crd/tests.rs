//! The PeerAuthentication type against objects as the API server sends
//! them, and the CRD manifest against the type.

use k8s_openapi::Resource;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::json;

use super::*;

const CRD: &str =
    include_str!("../../../../deploy/crds/peerauthentications.security.istio.io.yaml");

#[test]
fn peer_auth_an_object_from_the_api_server_reads_with_unknown_fields_ignored() {
    let object: PeerAuthentication = serde_json::from_value(json!({
        "apiVersion": "security.istio.io/v1beta1",
        "kind": "PeerAuthentication",
        "metadata": {"name": "p", "namespace": "shop"},
        "spec": {
            "selector": {"matchLabels": {"app": "web"}},
            "mtls": {"mode": "STRICT"},
            "portLevelMtls": {"9090": {"mode": "PERMISSIVE"}},
            "futureField": 1,
        },
    }))
    .unwrap();
    assert_eq!(
        object.spec.mtls.and_then(|mtls| mtls.mode).as_deref(),
        Some("STRICT")
    );
    assert_eq!(
        object.spec.port_level_mtls["9090"].mode.as_deref(),
        Some("PERMISSIVE")
    );
    assert_eq!(
        object
            .spec
            .selector
            .map(|selector| selector.match_labels.len()),
        Some(1)
    );
}

#[test]
fn peer_auth_the_crd_manifest_names_the_type_and_serves_both_versions() {
    let crd: CustomResourceDefinition = serde_yaml_ng::from_str(CRD).unwrap();
    let spec = &crd.spec;
    assert_eq!(
        crd.metadata.name,
        Some(format!(
            "{}.{}",
            PeerAuthentication::URL_PATH_SEGMENT,
            PeerAuthentication::GROUP
        ))
    );
    assert_eq!(spec.group, PeerAuthentication::GROUP);
    assert_eq!(spec.names.kind, PeerAuthentication::KIND);
    assert_eq!(spec.names.plural, PeerAuthentication::URL_PATH_SEGMENT);
    assert_eq!(spec.scope, "Namespaced");
    let versions: Vec<(&str, bool, bool)> = spec
        .versions
        .iter()
        .map(|version| (version.name.as_str(), version.served, version.storage))
        .collect();
    assert_eq!(
        versions,
        [
            (PeerAuthentication::VERSION, true, true),
            ("v1beta1", true, false)
        ]
    );
    for version in &spec.versions {
        let schema = version
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .unwrap();
        super::super::policy_crd::tests::assert_structural(schema, "");
    }
}
