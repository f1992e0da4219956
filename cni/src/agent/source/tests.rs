//! `admit`: what an add takes from the API's Pod, and what it refuses.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::*;
use crate::event::{IpConfig, IpNet};

const NODE: &str = "node-a";

fn api_pod(uid: Option<&str>, node: Option<&str>, service_account: Option<&str>) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some("web-0".to_owned()),
            namespace: Some("shop".to_owned()),
            uid: uid.map(str::to_owned),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: node.map(str::to_owned),
            service_account_name: service_account.map(str::to_owned),
            ..PodSpec::default()
        }),
        status: None,
    }
}

fn event(runtime_uid: &str) -> CmdAdd {
    CmdAdd {
        netns: "/var/run/netns/pod".to_owned(),
        pod_name: "web-0".to_owned(),
        pod_namespace: "shop".to_owned(),
        ips: vec![IpConfig {
            interface: Some(0),
            address: IpNet::parse_cidr("198.18.30.2/24").unwrap(),
            gateway: None,
        }],
        pod_uid: runtime_uid.to_owned(),
        deadline: None,
    }
}

fn ambient_namespace() -> BTreeMap<String, String> {
    BTreeMap::from([("istio.io/dataplane-mode".to_owned(), "ambient".to_owned())])
}

/// What `admit` answered, reduced to something a table can hold.
fn outcome(result: Result<PodRecord, ResolveError>) -> String {
    match result {
        Ok(record) => format!("uid {} account {}", record.uid, record.service_account),
        Err(error) => error.to_string(),
    }
}

#[test]
fn identity_comes_from_the_pod_object_and_refusals_say_why() {
    #[rustfmt::skip]
    let cases: &[(&str, Pod, &str, bool, &str)] = &[
        ("no runtime uid: the API's uid and account", api_pod(Some("u1"), Some(NODE), Some("web")), "", true, "uid u1 account web"),
        ("the runtime's uid agrees", api_pod(Some("u1"), Some(NODE), Some("web")), "u1", true, "uid u1 account web"),
        ("no account named: Kubernetes' default", api_pod(Some("u1"), Some(NODE), None), "", true, "uid u1 account default"),
        ("the runtime's uid differs: another pod of that name", api_pod(Some("u1"), Some(NODE), Some("web")), "u0", true, "pod shop/web-0: the runtime says uid u0, the pod source says u1"),
        ("scheduled elsewhere", api_pod(Some("u1"), Some("node-b"), Some("web")), "", true, "pod shop/web-0 is on node node-b, not this one"),
        ("not scheduled", api_pod(Some("u1"), None, Some("web")), "", true, "pod shop/web-0 is on node none (not scheduled), not this one"),
        ("not selected for ambient", api_pod(Some("u1"), Some(NODE), Some("web")), "", false, "pod shop/web-0 is not enrolled in ambient: no ambient enablement selector matches it"),
        ("no uid in the API", api_pod(None, Some(NODE), Some("web")), "", true, "pod shop/web-0 has no uid in the API server"),
    ];
    let enablement = EnablementSettings::default();
    for (reason, pod, runtime_uid, ambient, expected) in cases {
        let namespace_labels = if *ambient {
            ambient_namespace()
        } else {
            BTreeMap::new()
        };
        let got = outcome(admit(
            pod,
            &event(runtime_uid),
            NODE,
            &namespace_labels,
            &enablement,
        ));
        assert_eq!(got, *expected, "{reason}");
    }
}

#[test]
fn the_record_takes_netns_and_addresses_from_the_event() {
    let pod = api_pod(Some("u1"), Some(NODE), Some("web"));
    let enablement = EnablementSettings::default();
    let record = admit(&pod, &event(""), NODE, &ambient_namespace(), &enablement).unwrap();
    assert_eq!(record.netns, PathBuf::from("/var/run/netns/pod"));
    assert_eq!(
        record.ips,
        vec!["198.18.30.2".parse::<std::net::IpAddr>().unwrap()]
    );
    assert_eq!(
        (record.namespace.as_str(), record.name.as_str()),
        ("shop", "web-0")
    );
}
