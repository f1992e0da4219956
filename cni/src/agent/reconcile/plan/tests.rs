#![allow(clippy::unwrap_used)] // tests: a panic is a failed test

use std::collections::BTreeMap;
use std::path::PathBuf;

use k8s_openapi::api::core::v1::{Pod, PodIP, PodSpec, PodStatus};
use kube::api::ObjectMeta;

use super::*;

fn api_pod(name: &str, uid: &str, enrollment: Enrollment) -> ApiPod {
    ApiPod {
        uid: uid.into(),
        name: name.into(),
        namespace: "shop".into(),
        service_account: "web".into(),
        ips: vec!["198.18.10.2".parse().unwrap()],
        enrollment,
        redirection: Some(Redirection::Enabled),
        dns_capture: None,
    }
}

fn record(name: &str, uid: &str) -> PodRecord {
    PodRecord {
        uid: uid.into(),
        name: name.into(),
        namespace: "shop".into(),
        service_account: "web".into(),
        netns: PathBuf::from(format!("/run/netns/{name}")),
        netns_inode: None,
        ips: vec!["198.18.10.2".parse().unwrap()],
        dns_capture: None,
    }
}

fn alive(_: &PodRecord) -> bool {
    true
}

fn gone(_: &PodRecord) -> bool {
    false
}

#[test]
fn each_case_of_a_pod_and_its_record_gets_its_step() {
    let enrolled = api_pod("web-0", "u1", Enrollment::Enrolled);
    let pending = ApiPod {
        redirection: Some(Redirection::Pending),
        ..enrolled.clone()
    };
    let without_ip = ApiPod {
        ips: Vec::new(),
        redirection: None,
        ..enrolled.clone()
    };
    let opted_out = api_pod("web-0", "u1", Enrollment::NotSelected);
    let finished = api_pod("web-0", "u1", Enrollment::Terminal);
    let replaced = api_pod("web-0", "u2", Enrollment::Enrolled);
    let held = record("web-0", "u1");
    let steps = |api: Vec<ApiPod>, held: Vec<PodRecord>, alive: fn(&PodRecord) -> bool| {
        plan(&api, &held, alive)
    };
    #[rustfmt::skip]
    let cases: Vec<(&str, Vec<Step>, Vec<Step>)> = vec![
        ("held and enabled: nothing to do",
            steps(vec![enrolled.clone()], vec![held.clone()], alive), vec![]),
        ("labelled in while running: found through procfs",
            steps(vec![enrolled.clone()], vec![], alive), vec![Step::Find(enrolled.clone())]),
        ("held, but its netns is gone: found again",
            steps(vec![enrolled.clone()], vec![held.clone()], gone), vec![Step::Find(enrolled.clone())]),
        ("held and pending: handed over again",
            steps(vec![pending.clone()], vec![held.clone()], alive), vec![Step::Refresh(pending.clone(), held.clone())]),
        ("no address yet: its CNI ADD enrolls it",
            steps(vec![without_ip], vec![], alive), vec![]),
        ("label removed: taken out, rules and annotation too",
            steps(vec![opted_out.clone()], vec![held.clone()], alive), vec![Step::Remove(held.clone(), Removal::OptedOut)]),
        ("never enrolled and not held: left alone",
            steps(vec![opted_out], vec![], alive), vec![]),
        ("finished: taken out as deleted",
            steps(vec![finished], vec![held.clone()], alive), vec![Step::Remove(held.clone(), Removal::Deleted)]),
        ("not in the watch: the API server is asked first",
            steps(vec![], vec![held.clone()], alive), vec![Step::Confirm(held.clone())]),
        ("replaced under the same name: the old one out first, the new one found",
            steps(vec![replaced.clone()], vec![held.clone()], alive),
            vec![Step::Remove(held.clone(), Removal::Deleted), Step::Find(replaced)]),
    ];
    for (reason, got, want) in cases {
        assert_eq!(got, want, "{reason}");
    }
}

#[test]
fn a_pod_object_becomes_what_the_pass_needs() {
    let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
            .collect()
    };
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some("web-0".into()),
            namespace: Some("shop".into()),
            uid: Some("u1".into()),
            annotations: Some(labels(&[("ambient.istio.io/redirection", "pending")])),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: Some("node-a".into()),
            ..PodSpec::default()
        }),
        status: Some(PodStatus {
            phase: Some("Running".into()),
            pod_ip: Some("198.18.10.9".into()),
            pod_ips: Some(vec![
                PodIP {
                    ip: "::ffff:198.18.10.2".into(),
                },
                PodIP {
                    ip: "not an address".into(),
                },
            ]),
            ..PodStatus::default()
        }),
    };
    let settings = EnablementSettings::default();
    let ambient = labels(&[("istio.io/dataplane-mode", "ambient")]);
    let seen = ApiPod::of(&pod, &ambient, &settings).unwrap();
    assert_eq!(seen.service_account, "default", "no account named");
    assert_eq!(
        seen.ips,
        ["198.18.10.2".parse::<IpAddr>().unwrap()],
        "podIPs win, unmapped, the unparsable one dropped"
    );
    assert_eq!(seen.redirection, Some(Redirection::Pending));
    assert_eq!(seen.enrollment, Enrollment::Enrolled);
    assert_eq!(
        ApiPod::of(&pod, &labels(&[]), &settings)
            .unwrap()
            .enrollment,
        Enrollment::NotSelected
    );
    let only_pod_ip = Pod {
        status: Some(PodStatus {
            pod_ip: Some("198.18.10.9".into()),
            ..PodStatus::default()
        }),
        ..pod.clone()
    };
    assert_eq!(
        ApiPod::of(&only_pod_ip, &ambient, &settings).unwrap().ips,
        ["198.18.10.9".parse::<IpAddr>().unwrap()]
    );
    let without_uid = Pod {
        metadata: ObjectMeta {
            uid: None,
            ..pod.metadata.clone()
        },
        ..pod
    };
    assert_eq!(ApiPod::of(&without_uid, &ambient, &settings), None);
}
