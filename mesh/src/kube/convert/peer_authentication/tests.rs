//! The PeerAuthentication object table: one case per line, each with its
//! reason; and the age order.

use serde_json::{Value, json};

use super::super::tests::{merged, object};
use super::*;
use crate::Labels;

fn kube_peer_authentication(
    name: &str,
    created: &str,
    patch: Value,
) -> Arc<KubePeerAuthentication> {
    Arc::new(object(merged(
        json!({
            "metadata": {"name": name, "namespace": "shop", "creationTimestamp": created},
            "spec": {},
        }),
        patch,
    )))
}

#[test]
fn peer_auth_objects_convert_field_by_field() {
    let web = Labels::from([("app".to_owned(), "web".to_owned())]);
    // (case, patch, selector, mode, port modes, problems)
    #[allow(clippy::type_complexity)]
    let cases: [(
        &str,
        Value,
        Option<Labels>,
        MtlsMode,
        Vec<(u16, MtlsMode)>,
        Vec<ProblemReason>,
    ); 8] = [
        (
            "no spec: UNSET, namespace-wide",
            json!({}),
            None,
            MtlsMode::Unset,
            vec![],
            vec![],
        ),
        (
            "mtls without mode: UNSET",
            json!({"spec": {"mtls": {}}}),
            None,
            MtlsMode::Unset,
            vec![],
            vec![],
        ),
        (
            "STRICT",
            json!({"spec": {"mtls": {"mode": "STRICT"}}}),
            None,
            MtlsMode::Strict,
            vec![],
            vec![],
        ),
        (
            "PERMISSIVE",
            json!({"spec": {"mtls": {"mode": "PERMISSIVE"}}}),
            None,
            MtlsMode::Permissive,
            vec![],
            vec![],
        ),
        (
            "DISABLE",
            json!({"spec": {"mtls": {"mode": "DISABLE"}}}),
            None,
            MtlsMode::Disable,
            vec![],
            vec![],
        ),
        (
            "selector labels kept",
            json!({"spec": {"selector": {"matchLabels": {"app": "web"}}}}),
            Some(web.clone()),
            MtlsMode::Unset,
            vec![],
            vec![],
        ),
        (
            "port modes by number",
            json!({"spec": {"portLevelMtls": {"9090": {"mode": "PERMISSIVE"}, "8080": {}}}}),
            None,
            MtlsMode::Unset,
            vec![(8080, MtlsMode::Unset), (9090, MtlsMode::Permissive)],
            vec![],
        ),
        (
            "a key that is no port is skipped",
            json!({"spec": {"portLevelMtls": {"http": {"mode": "STRICT"}, "0": {"mode": "STRICT"}, "9090": {"mode": "STRICT"}}}}),
            None,
            MtlsMode::Unset,
            vec![(9090, MtlsMode::Strict)],
            vec![
                ProblemReason::BadPortKey {
                    key: "0".to_owned(),
                },
                ProblemReason::BadPortKey {
                    key: "http".to_owned(),
                },
            ],
        ),
    ];
    for (case, patch, selector, mode, ports, problems) in cases {
        let outcome = peer_authentication(&kube_peer_authentication(
            "p",
            "2026-01-01T00:00:00Z",
            patch,
        ));
        assert_eq!(outcome.problems, problems, "{case}");
        let entry = outcome.entry.expect(case);
        assert_eq!(entry.selector, selector, "{case}");
        assert_eq!(entry.mode, mode, "{case}");
        assert_eq!(entry.port_level_mtls, BTreeMap::from_iter(ports), "{case}");
    }
}

#[test]
fn peer_auth_objects_left_out() {
    // (case, object, problem)
    let cases = [
        (
            "an unknown mode",
            json!({"spec": {"mtls": {"mode": "OPTIONAL"}}}),
            ProblemReason::UnknownMtlsMode {
                mode: "OPTIONAL".to_owned(),
            },
        ),
        (
            "an unknown port mode",
            json!({"spec": {"portLevelMtls": {"80": {"mode": "x"}}}}),
            ProblemReason::UnknownMtlsMode {
                mode: "x".to_owned(),
            },
        ),
        (
            "no namespace",
            json!({"metadata": {"namespace": null}}),
            ProblemReason::MissingField {
                field: "metadata.namespace",
            },
        ),
    ];
    for (case, patch, problem) in cases {
        let outcome = peer_authentication(&kube_peer_authentication(
            "p",
            "2026-01-01T00:00:00Z",
            patch,
        ));
        assert_eq!(outcome, Outcome::left_out(problem), "{case}");
    }
}

#[test]
fn peer_auth_objects_are_read_oldest_first_then_by_name() {
    let objects = [
        kube_peer_authentication("newest", "2026-03-01T00:00:00Z", json!({})),
        kube_peer_authentication("b-same-second", "2026-02-01T00:00:00Z", json!({})),
        kube_peer_authentication("a-same-second", "2026-02-01T00:00:00Z", json!({})),
        kube_peer_authentication("oldest", "2026-01-01T00:00:00Z", json!({})),
    ];
    let mut problems = Vec::new();
    let names: Vec<String> = peer_authentications(&objects, &mut problems)
        .into_iter()
        .map(|entry| entry.name)
        .collect();
    assert_eq!(
        names,
        ["oldest", "a-same-second", "b-same-second", "newest"]
    );
    assert_eq!(problems, []);
}
