//! The pod table (KUBERNETES.md E2–E4): one case per line, each with its
//! reason.

use serde_json::{Value, json};

use super::super::tests::{kube_pod, object};
use super::*;

fn convert(patch: Value) -> Pod {
    convert_with(patch, &ConvertSettings::default())
}

fn convert_with(patch: Value, settings: &ConvertSettings) -> Pod {
    let object = kube_pod("shop", "web-7d4b9-x2k", "10.0.0.1", patch);
    let outcome = pod(&object, &HashMap::new(), settings);
    assert_eq!(outcome.problems, [], "{object:?}");
    outcome.entry.unwrap()
}

#[test]
fn identity_fields_come_from_metadata_and_spec() {
    let pod = convert(json!({"metadata": {"labels": {"app": "web"}}}));
    assert_eq!(pod.name, "web-7d4b9-x2k");
    assert_eq!(pod.namespace, "shop");
    assert_eq!(pod.uid, "u-web-7d4b9-x2k", "the CA matches token pod-uids");
    assert_eq!(pod.service_account, "app");
    assert_eq!(pod.node_name.as_deref(), Some("node-a"));
    assert_eq!(pod.phase, PodPhase::Running);
    assert_eq!(pod.ips, [IpAddr::from([10, 0, 0, 1])]);
    assert_eq!(pod.labels.get("app").map(String::as_str), Some("web"));
    assert_eq!(pod.cluster_id.as_deref(), Some("Kubernetes"));
    assert_eq!(pod.network, "");
    assert_eq!(pod.workload_type, Some(WorkloadType::Pod), "always POD");
}

#[test]
fn derived_fields_follow_istiod() {
    let east = ConvertSettings {
        cluster_id: "east".into(),
        trust_domain: "example.org".into(),
        network: "net-2".into(),
        ..ConvertSettings::default()
    };
    let default = ConvertSettings::default();
    // (case, settings, patch, field, want)
    type Case<'a> = (
        &'a str,
        &'a ConvertSettings,
        Value,
        fn(&Pod) -> String,
        &'a str,
    );
    let cases: Vec<Case> = vec![
        (
            "uid is <cluster>//Pod/<ns>/<name>",
            &default,
            json!({}),
            |p| format!("{:?}", p.workload_uid),
            r#"Some("Kubernetes//Pod/shop/web-7d4b9-x2k")"#,
        ),
        (
            "uid carries the cluster id",
            &east,
            json!({}),
            |p| format!("{:?}", p.workload_uid),
            r#"Some("east//Pod/shop/web-7d4b9-x2k")"#,
        ),
        (
            "trust domain cluster.local is sent empty",
            &default,
            json!({}),
            |p| format!("{:?}", p.trust_domain),
            r#"Some("")"#,
        ),
        (
            "another trust domain is sent",
            &east,
            json!({}),
            |p| format!("{:?}", p.trust_domain),
            r#"Some("example.org")"#,
        ),
        (
            "network from the settings",
            &east,
            json!({}),
            |p| p.network.clone(),
            "net-2",
        ),
        (
            "no service account is default",
            &default,
            json!({"spec": {"serviceAccountName": null}}),
            |p| p.service_account.clone(),
            "default",
        ),
        (
            "unscheduled: no node",
            &default,
            json!({"spec": {"nodeName": null}}),
            |p| format!("{:?}", p.node_name),
            "None",
        ),
        (
            "podIPs win over podIP",
            &default,
            json!({"status": {"podIP": "10.0.0.1", "podIPs": [{"ip": "10.0.0.1"}, {"ip": "fd00::1"}]}}),
            |p| format!("{:?}", p.ips),
            "[10.0.0.1, fd00::1]",
        ),
        (
            "podIP without podIPs",
            &default,
            json!({"status": {"podIPs": null, "podIP": "10.0.0.7"}}),
            |p| format!("{:?}", p.ips),
            "[10.0.0.7]",
        ),
        (
            "no IP yet",
            &default,
            json!({"status": {"podIPs": null, "podIP": null}}),
            |p| format!("{:?}", p.ips),
            "[]",
        ),
        (
            "phase Pending",
            &default,
            json!({"status": {"phase": "Pending"}}),
            |p| format!("{:?}", p.phase),
            "Pending",
        ),
        (
            "no phase yet is Pending",
            &default,
            json!({"status": {"phase": null}}),
            |p| format!("{:?}", p.phase),
            "Pending",
        ),
        (
            "phase Succeeded",
            &default,
            json!({"status": {"phase": "Succeeded"}}),
            |p| format!("{:?}", p.phase),
            "Succeeded",
        ),
        (
            "phase Failed",
            &default,
            json!({"status": {"phase": "Failed"}}),
            |p| format!("{:?}", p.phase),
            "Failed",
        ),
        (
            "an unknown phase is Unknown",
            &default,
            json!({"status": {"phase": "Sleeping"}}),
            |p| format!("{:?}", p.phase),
            "Unknown",
        ),
        (
            "hostNetwork",
            &default,
            json!({"spec": {"hostNetwork": true}}),
            |p| p.host_network.to_string(),
            "true",
        ),
        (
            "pod network",
            &default,
            json!({}),
            |p| p.host_network.to_string(),
            "false",
        ),
    ];
    for (case, settings, patch, field, want) in cases {
        assert_eq!(field(&convert_with(patch, settings)), want, "{case}");
    }
}

#[test]
fn tunnel_protocol_follows_the_redirection_annotation_and_tunnel_label() {
    let redirected =
        |value: &str| json!({"metadata": {"annotations": {REDIRECTION_ANNOTATION: value}}});
    let tunnel = |value: &str| json!({"metadata": {"labels": {TUNNEL_LABEL: value}}});
    // (case, patch, protocol, native tunnel)
    let cases = [
        (
            "not captured: plain TCP",
            json!({}),
            WorkloadProtocol::Tcp,
            false,
        ),
        (
            "redirection enabled: HBONE",
            redirected("enabled"),
            WorkloadProtocol::Hbone,
            false,
        ),
        (
            "redirection pending: not yet HBONE",
            redirected("pending"),
            WorkloadProtocol::Tcp,
            false,
        ),
        (
            "tunnel label http: HBONE, native",
            tunnel("http"),
            WorkloadProtocol::Hbone,
            true,
        ),
        (
            "tunnel label without http",
            tunnel("h2"),
            WorkloadProtocol::Tcp,
            false,
        ),
        (
            "tunnel label https is not http",
            tunnel("https"),
            WorkloadProtocol::Tcp,
            false,
        ),
        (
            "tlsMode=istio: legacy mTLS is off for ztunnel",
            json!({"metadata": {"labels": {"security.istio.io/tlsMode": "istio"}}}),
            WorkloadProtocol::Tcp,
            false,
        ),
        (
            "both: native wins",
            json!({"metadata": {"labels": {TUNNEL_LABEL: "http"},
                                "annotations": {REDIRECTION_ANNOTATION: "enabled"}}}),
            WorkloadProtocol::Hbone,
            true,
        ),
    ];
    for (case, patch, protocol, native) in cases {
        let pod = convert(patch);
        assert_eq!(
            (pod.protocol, pod.native_tunnel),
            (protocol, native),
            "{case}"
        );
    }
}

#[test]
fn ready_means_condition_ready_and_not_being_deleted() {
    let conditions = |status: &str| {
        json!({"status": {"conditions": [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Ready", "status": status},
        ]}})
    };
    // (case, patch, ready)
    let cases = [
        ("Ready True", conditions("True"), true),
        ("Ready False", conditions("False"), false),
        ("Ready Unknown", conditions("Unknown"), false),
        (
            "no conditions yet",
            json!({"status": {"conditions": null}}),
            false,
        ),
        (
            "Ready but being deleted",
            json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}),
            false,
        ),
    ];
    for (case, patch, ready) in cases {
        assert_eq!(convert(patch).ready, Some(ready), "{case}");
    }
}

#[test]
fn workload_name_comes_from_the_label_or_the_controller() {
    let owned = |kind: &str, owner: &str, labels: Value| {
        json!({"metadata": {
            "generateName": "x-",
            "labels": labels,
            "ownerReferences": [{"apiVersion": "v1", "kind": kind, "name": owner, "uid": "o",
                                 "controller": true}],
        }})
    };
    let hash = json!({"pod-template-hash": "7d4b9"});
    // (case, patch, workload name)
    let cases = [
        ("bare pod: its own name", json!({}), "web-7d4b9-x2k"),
        (
            "label wins",
            json!({"metadata": {"labels": {"service.istio.io/workload-name": "shop-web"}}}),
            "shop-web",
        ),
        (
            "ReplicaSet minus its hash",
            owned("ReplicaSet", "web-7d4b9", hash.clone()),
            "web",
        ),
        (
            "Argo rollout ReplicaSet minus its hash",
            owned(
                "ReplicaSet",
                "canary-5f6",
                json!({"rollouts-pod-template-hash": "5f6"}),
            ),
            "canary",
        ),
        (
            "ReplicaSet without hash label",
            owned("ReplicaSet", "web-7d4b9", json!({})),
            "web-7d4b9",
        ),
        (
            "ReplicaSet whose name lacks the hash",
            owned("ReplicaSet", "web", hash),
            "web",
        ),
        (
            "Job of a CronJob",
            owned("Job", "backup-29012345", json!({})),
            "backup",
        ),
        ("plain Job", owned("Job", "migrate", json!({})), "migrate"),
        (
            "ReplicationController of a DeploymentConfig",
            owned(
                "ReplicationController",
                "api-3",
                json!({"deploymentconfig": "api"}),
            ),
            "api",
        ),
        (
            "plain ReplicationController",
            owned("ReplicationController", "api-3", json!({})),
            "api-3",
        ),
        (
            "other controller: its name",
            owned("DaemonSet", "agent", json!({})),
            "agent",
        ),
        (
            "controller but no generateName",
            json!({"metadata": {"ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db", "uid": "o", "controller": true}]}}),
            "web-7d4b9-x2k",
        ),
        (
            "owner that is not the controller",
            json!({"metadata": {"generateName": "x-", "ownerReferences": [
                {"apiVersion": "v1", "kind": "ReplicaSet", "name": "rs", "uid": "o"}]}}),
            "web-7d4b9-x2k",
        ),
    ];
    for (case, patch, want) in cases {
        assert_eq!(
            convert(patch).workload_name.as_deref(),
            Some(want),
            "{case}"
        );
    }
}

#[test]
fn a_cron_job_is_found_from_its_jobs_scheduled_time_suffix() {
    // (job, cron job)
    let cases = [
        ("backup-29012345", Some("backup")),         // 8 digits
        ("backup-2901234567", Some("backup")),       // 10 digits
        ("backup-290123456789", None),               // 12 digits: not a schedule
        ("backup-2901234", None),                    // 7 digits
        ("nightly-db-29012345", Some("nightly-db")), // the last dash separates
        ("backup-2901234a", None),                   // not all digits
        ("-29012345", None),                         // no name before the dash
        ("backup", None),
    ];
    for (job, want) in cases {
        assert_eq!(cron_job_name(job), want, "{job}");
    }
}

#[test]
fn locality_comes_from_the_pods_node() {
    let node = |name: &str, labels: Value| -> Arc<Node> {
        Arc::new(object(
            json!({"metadata": {"name": name, "labels": labels}}),
        ))
    };
    let nodes = [
        node(
            "node-a",
            json!({REGION_LABEL: "eu", ZONE_LABEL: "eu-1", SUBZONE_LABEL: "rack-3"}),
        ),
        node("node-b", json!({"kubernetes.io/os": "linux"})),
    ];
    let localities = localities(&nodes);
    let on = |node: Value| {
        let object = kube_pod("shop", "p", "10.0.0.1", json!({"spec": {"nodeName": node}}));
        pod(&object, &localities, &ConvertSettings::default())
            .entry
            .unwrap()
            .locality
    };
    let want = Locality {
        region: "eu".into(),
        zone: "eu-1".into(),
        subzone: "rack-3".into(),
    };
    assert_eq!(on(json!("node-a")), Some(want), "node labels");
    assert_eq!(on(json!("node-b")), None, "a node without topology labels");
    assert_eq!(on(json!("node-z")), None, "a node not seen");
    assert_eq!(on(Value::Null), None, "unscheduled");
}

#[test]
fn named_tcp_ports_of_containers_and_sidecars_can_be_targets() {
    let patch = json!({"spec": {
        "containers": [
            {"name": "app", "ports": [
                {"name": "http", "containerPort": 8080},
                {"name": "dns", "containerPort": 5353, "protocol": "UDP"},
                {"containerPort": 9090},
                {"name": "admin", "containerPort": 15000, "protocol": "TCP"},
            ]},
            {"name": "other", "ports": [{"name": "http", "containerPort": 8081}]},
        ],
        "initContainers": [
            {"name": "sidecar", "restartPolicy": "Always",
             "ports": [{"name": "metrics", "containerPort": 9100}]},
            {"name": "setup", "ports": [{"name": "setup", "containerPort": 1000}]},
        ],
    }});
    let ports: Vec<(String, u16)> = convert(patch).container_ports.into_iter().collect();
    assert_eq!(
        ports,
        [
            ("admin".to_owned(), 15000),
            ("http".to_owned(), 8080),    // the first container's wins
            ("metrics".to_owned(), 9100), // a sidecar runs alongside
        ],
        "UDP, unnamed and run-once init container ports are not targets"
    );
}

#[test]
fn pods_missing_what_the_model_needs_are_left_out() {
    // (case, patch, reason)
    let cases = [
        (
            "no uid",
            json!({"metadata": {"uid": null}}),
            ProblemReason::MissingField {
                field: "metadata.uid",
            },
        ),
        (
            "empty uid",
            json!({"metadata": {"uid": ""}}),
            ProblemReason::MissingField {
                field: "metadata.uid",
            },
        ),
        (
            "no name",
            json!({"metadata": {"name": null}}),
            ProblemReason::MissingField {
                field: "metadata.name",
            },
        ),
        (
            "no namespace",
            json!({"metadata": {"namespace": null}}),
            ProblemReason::MissingField {
                field: "metadata.namespace",
            },
        ),
        (
            "slash in uid",
            json!({"metadata": {"uid": "a/b"}}),
            ProblemReason::SlashInUid { uid: "a/b".into() },
        ),
    ];
    for (case, patch, reason) in cases {
        let object = kube_pod("shop", "p", "10.0.0.1", patch);
        let outcome = pod(&object, &HashMap::new(), &ConvertSettings::default());
        assert_eq!(
            (outcome.entry, outcome.problems),
            (None, vec![reason]),
            "{case}"
        );
    }
    let object = kube_pod(
        "shop",
        "p",
        "10.0.0.1",
        json!({"status": {"podIPs": [{"ip": "10.0.0.1"}, {"ip": "bad"}]}}),
    );
    let outcome = pod(&object, &HashMap::new(), &ConvertSettings::default());
    assert_eq!(
        outcome.entry.map(|pod| pod.ips),
        Some(vec![IpAddr::from([10, 0, 0, 1])])
    );
    assert_eq!(
        outcome.problems,
        [ProblemReason::BadAddress {
            address: "bad".into()
        }],
        "kept without it"
    );
}
