//! The whole-mesh conversion: what is kept when objects contradict each
//! other, that the result always passes the snapshot's checks, and that
//! it does not depend on input order. Also the objects the other test
//! tables build on.

use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::*;
use crate::MeshSnapshot;

/// A Kubernetes object from its JSON.
pub(super) fn object<T: DeserializeOwned>(value: Value) -> T {
    serde_json::from_value(value).unwrap()
}

/// `patch` over `base`, as a JSON merge patch: objects merge, `null`
/// removes, anything else replaces.
pub(super) fn merged(mut base: Value, patch: Value) -> Value {
    merge(&mut base, patch);
    base
}

fn merge(base: &mut Value, patch: Value) {
    match (base, patch) {
        (Value::Object(base), Value::Object(patch)) => {
            for (key, value) in patch {
                if value.is_null() {
                    base.remove(&key);
                } else {
                    merge(base.entry(key).or_insert(Value::Null), value);
                }
            }
        }
        (base, patch) => *base = patch,
    }
}

/// A Running, Ready pod `namespace/name` with uid `u-<name>`, IP `ip` and
/// service account `app` on `node-a`, with `patch` merged in.
pub(super) fn kube_pod(namespace: &str, name: &str, ip: &str, patch: Value) -> KubePod {
    object(merged(
        json!({
            "metadata": {"name": name, "namespace": namespace, "uid": format!("u-{name}")},
            "spec": {"nodeName": "node-a", "serviceAccountName": "app", "containers": []},
            "status": {
                "phase": "Running",
                "podIP": ip,
                "podIPs": [{"ip": ip}],
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }),
        patch,
    ))
}

fn objects(pods: Vec<KubePod>) -> KubeObjects {
    KubeObjects {
        pods: pods.into_iter().map(Arc::new).collect(),
        ..KubeObjects::default()
    }
}

fn reasons(conversion: &Conversion) -> Vec<(String, ProblemReason)> {
    conversion
        .problems
        .iter()
        .map(|problem| {
            let item = format!("{} {}/{}", problem.kind, problem.namespace, problem.name);
            (item, problem.reason.clone())
        })
        .collect()
}

fn pod_names(conversion: &Conversion) -> Vec<String> {
    let pods = &conversion.mesh.pods;
    pods.iter()
        .map(|pod| format!("{}/{}", pod.namespace, pod.name))
        .collect()
}

#[test]
fn settings_default_to_istiods_defaults() {
    let settings = ConvertSettings::default();
    assert_eq!(settings.cluster_id, "Kubernetes");
    assert_eq!(settings.trust_domain, "cluster.local");
    assert_eq!(settings.cluster_domain, "cluster.local");
    assert_eq!(settings.root_namespace, "istio-system");
    assert_eq!(settings.network, "");
    assert!(!settings.enable_dry_run_policies);
}

#[test]
fn a_pod_without_uid_is_reported_and_the_rest_kept() {
    let no_uid = kube_pod("shop", "b", "10.0.0.2", json!({"metadata": {"uid": null}}));
    let conversion = convert(
        &objects(vec![
            kube_pod("shop", "a", "10.0.0.1", json!({})),
            no_uid,
            kube_pod("shop", "c", "10.0.0.3", json!({})),
        ]),
        &ConvertSettings::default(),
    );
    assert_eq!(pod_names(&conversion), ["shop/a", "shop/c"]);
    assert_eq!(
        reasons(&conversion),
        [(
            "Pod shop/b".to_owned(),
            ProblemReason::MissingField {
                field: "metadata.uid"
            }
        )]
    );
    assert_eq!(
        conversion.problems[0].to_string(),
        "Pod shop/b: metadata.uid is missing"
    );
    assert_eq!(conversion.problems[0].reason.effect(), Effect::Dropped);
    MeshSnapshot::new(conversion.mesh).unwrap();
}

#[test]
fn a_pod_whose_names_make_no_identity_is_left_out() {
    // Found by the k8s_convert fuzz target: a namespace with a '+' (which
    // the API server never admits) became a workload the proxy rejects.
    let conversion = convert(
        &objects(vec![
            kube_pod("sho+p", "web-0", "10.0.0.1", json!({})),
            kube_pod("shop", "web-1", "10.0.0.2", json!({})),
            kube_pod(
                "shop",
                "web-2",
                "10.0.0.3",
                json!({"spec": {"serviceAccountName": "a/b"}}),
            ),
        ]),
        &ConvertSettings::default(),
    );
    assert_eq!(pod_names(&conversion), ["shop/web-1"]);
    let problems: Vec<String> = conversion
        .problems
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        problems,
        [
            "Pod sho+p/web-0: no valid identity: identity namespace contains a forbidden character",
            "Pod shop/web-2: no valid identity: identity service account contains a forbidden character",
        ]
    );
    assert_eq!(conversion.problems[0].reason.effect(), Effect::Dropped);
    MeshSnapshot::new(conversion.mesh).unwrap();
}

#[test]
fn contradicting_pods_are_resolved_in_name_order_and_the_mesh_still_loads() {
    let host = json!({"spec": {"hostNetwork": true}});
    let done = json!({"status": {"phase": "Succeeded"}});
    let pods = vec![
        // Given last, sorted first.
        kube_pod("a", "first", "10.0.0.1", json!({})),
        // Same uid as a/first: left out.
        kube_pod(
            "b",
            "clone",
            "10.0.0.9",
            json!({"metadata": {"uid": "u-first"}}),
        ),
        // Same IP as a/first, both live: kept without addresses.
        kube_pod("b", "same-ip", "10.0.0.1", json!({})),
        // A finished pod keeps its old IP: no conflict.
        kube_pod("b", "finished", "10.0.0.1", done),
        // Pods on their node's network share its IP.
        kube_pod("c", "host-1", "192.168.0.1", host.clone()),
        kube_pod("c", "host-2", "192.168.0.1", host),
        // A uid with a slash: left out.
        kube_pod(
            "d",
            "slash",
            "10.0.0.5",
            json!({"metadata": {"uid": "a/b"}}),
        ),
        // No namespace: left out.
        kube_pod(
            "",
            "lost",
            "10.0.0.6",
            json!({"metadata": {"namespace": null}}),
        ),
    ];
    let mut reversed = pods.clone();
    reversed.reverse();
    let settings = ConvertSettings::default();
    let conversion = convert(&objects(reversed), &settings);
    assert_eq!(
        conversion,
        convert(&objects(pods), &settings),
        "same objects, same mesh"
    );
    assert_eq!(
        pod_names(&conversion),
        ["a/first", "b/finished", "b/same-ip", "c/host-1", "c/host-2"]
    );
    let same_ip = &conversion.mesh.pods[2];
    assert!(same_ip.ips.is_empty(), "kept, without its address");
    let want = [
        (
            "Pod /lost",
            ProblemReason::MissingField {
                field: "metadata.namespace",
            },
        ),
        (
            "Pod b/clone",
            ProblemReason::DuplicateUid {
                uid: "u-first".into(),
                other: "a/first".into(),
            },
        ),
        (
            "Pod b/same-ip",
            ProblemReason::AddressInUse {
                address: [10, 0, 0, 1].into(),
                other: "a/first".into(),
            },
        ),
        (
            "Pod d/slash",
            ProblemReason::SlashInUid { uid: "a/b".into() },
        ),
    ]
    .map(|(item, reason)| (item.to_owned(), reason));
    assert_eq!(reasons(&conversion), want);
    MeshSnapshot::new(conversion.mesh).unwrap();
}

#[test]
fn a_mixed_cluster_converts_to_a_mesh_that_loads() {
    let service = |name: &str, spec: Value| -> Arc<KubeService> {
        Arc::new(object(json!({
            "metadata": {"name": name, "namespace": "shop"},
            "spec": spec,
        })))
    };
    let policy = |name: &str, namespace: &str, spec: Value| -> Arc<AuthorizationPolicy> {
        Arc::new(object(json!({
            "metadata": {"name": name, "namespace": namespace},
            "spec": spec,
        })))
    };
    let mut objects = objects(vec![
        kube_pod(
            "shop",
            "web",
            "10.0.0.1",
            json!({"metadata": {"labels": {"app": "web"}}}),
        ),
        kube_pod("shop", "db", "10.0.0.2", json!({})),
    ]);
    objects.services = vec![
        service(
            "web",
            json!({"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": "http"}]}),
        ),
        service("db", json!({"ports": [{"port": 5432}]})),
        service(
            "old",
            json!({"type": "ExternalName", "externalName": "x.example"}),
        ),
        service("bad", json!({"ports": [{"port": 80, "targetPort": 0}]})),
    ];
    objects.endpoint_slices = vec![Arc::new(object(json!({
        "metadata": {"name": "db-1", "namespace": "shop",
                     "labels": {"kubernetes.io/service-name": "db"}},
        "addressType": "IPv4",
        "endpoints": [
            {"addresses": ["10.0.0.2"],
             "targetRef": {"kind": "Pod", "name": "db", "namespace": "shop", "uid": "u-db"}},
            {"addresses": ["10.0.0.77"]},
        ],
    })))];
    objects.authorization_policies = vec![
        policy("deny-all", "shop", json!({"action": "DENY", "rules": [{}]})),
        policy("audit", "shop", json!({"action": "AUDIT"})),
        policy(
            "mesh",
            "istio-system",
            json!({"selector": {"matchLabels": {"app": "web"}}}),
        ),
    ];
    let conversion = convert(&objects, &ConvertSettings::default());
    let services: Vec<(&str, Option<&Vec<String>>)> = conversion
        .mesh
        .services
        .iter()
        .map(|service| (service.name.as_str(), service.endpoints.as_ref()))
        .collect();
    let db = vec!["u-db".to_owned()];
    assert_eq!(
        services,
        [("bad", Some(&Vec::new())), ("db", Some(&db)), ("web", None)],
        "sorted; ExternalName not sent; members from slices"
    );
    assert!(
        conversion.mesh.services[0].ports.is_empty(),
        "bad port left out"
    );
    let policies: Vec<&str> = conversion
        .mesh
        .policies
        .iter()
        .map(|p| p.name.as_str())
        .collect();
    assert_eq!(policies, ["mesh", "deny-all"], "namespace/name order");
    let want = [
        ("Service shop/bad", ProblemReason::BadPort { port: 0 }),
        (
            "EndpointSlice shop/db-1",
            ProblemReason::EndpointsWithoutPod { count: 1 },
        ),
        (
            "AuthorizationPolicy shop/audit",
            ProblemReason::UnsupportedAction { action: "AUDIT" },
        ),
    ]
    .map(|(item, reason)| (item.to_owned(), reason));
    assert_eq!(reasons(&conversion), want);
    MeshSnapshot::new(conversion.mesh).unwrap();
}

#[test]
fn every_problem_says_what_it_did_to_the_object() {
    // (reason, effect)
    let cases = [
        (ProblemReason::Duplicate, Effect::Dropped),
        (ProblemReason::TargetRefNotSent, Effect::NotSent),
        (ProblemReason::DryRunNotSent, Effect::NotSent),
        (
            ProblemReason::DenyFieldsIgnored {
                fields: vec!["to.operation.methods".into()],
            },
            Effect::Trimmed,
        ),
        (
            ProblemReason::BadAddress {
                address: "x".into(),
            },
            Effect::Trimmed,
        ),
    ];
    for (reason, effect) in cases {
        assert_eq!(reason.effect(), effect, "{reason}");
    }
    let dropped = ProblemReason::AllowRulesDropped {
        rules: 2,
        fields: vec![
            "to.operation.methods".into(),
            "when.key=request.auth.claims[iss]".into(),
        ],
    };
    assert_eq!(
        dropped.to_string(),
        "2 ALLOW rule(s) dropped: ztunnel does not support to.operation.methods, when.key=request.auth.claims[iss]"
    );
}
