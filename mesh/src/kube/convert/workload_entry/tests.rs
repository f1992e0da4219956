//! The WorkloadEntry table: istiod's own cases (`workloads_test.go`
//! `TestWorkloadEntryWorkloads`, `ambientindex_workloadentry_test.go`),
//! one per row.

use serde_json::{Value, json};

use super::super::tests::{merged, object};
use super::*;
use crate::WorkloadProtocol;

fn convert_one(patch: Value) -> Outcome<WorkloadEntry> {
    let kube: KubeWorkloadEntry = object(merged(
        json!({"metadata": {"name": "name", "namespace": "ns"}, "spec": {"address": "1.2.3.4"}}),
        patch,
    ));
    let settings = ConvertSettings {
        cluster_id: "cluster0".to_owned(),
        network: "testnetwork".to_owned(),
        ..ConvertSettings::default()
    };
    workload_entry(&kube, &settings)
}

#[test]
fn workload_entry_objects_convert_as_istiod_converts_them() {
    let labels = |pairs: &[(&str, &str)]| -> crate::Labels {
        pairs
            .iter()
            .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
            .collect()
    };
    // (istiod's case, patch, address, labels, protocol and native tunnel,
    // network, workload name)
    #[allow(clippy::type_complexity)]
    let cases: [(
        &str,
        Value,
        EntryAddress,
        crate::Labels,
        (WorkloadProtocol, bool),
        &str,
        &str,
    ); 7] = [
        (
            "we with service",
            json!({"metadata": {"labels": {"app": "foo"}}}),
            EntryAddress::Ip("1.2.3.4".parse().unwrap()),
            labels(&[("app", "foo")]),
            (WorkloadProtocol::Tcp, false),
            "testnetwork",
            "name",
        ),
        (
            "we with tunnel label is HBONE",
            json!({"metadata": {"labels": {"app": "foo", "networking.istio.io/tunnel": "http"}}}),
            EntryAddress::Ip("1.2.3.4".parse().unwrap()),
            labels(&[("app", "foo"), ("networking.istio.io/tunnel", "http")]),
            (WorkloadProtocol::Hbone, true),
            "testnetwork",
            "name",
        ),
        (
            "we without labels",
            json!({}),
            EntryAddress::Ip("1.2.3.4".parse().unwrap()),
            labels(&[]),
            (WorkloadProtocol::Tcp, false),
            "testnetwork",
            "name",
        ),
        (
            "we spec labels (merged under the object's own)",
            json!({"metadata": {"labels": {"app": "meta"}}, "spec": {"labels": {"app": "spec", "version": "v1"}}}),
            EntryAddress::Ip("1.2.3.4".parse().unwrap()),
            labels(&[("app", "meta"), ("version", "v1")]),
            (WorkloadProtocol::Tcp, false),
            "testnetwork",
            "name",
        ),
        (
            "cross network we",
            json!({"spec": {"network": "remote-network"}}),
            EntryAddress::Ip("1.2.3.4".parse().unwrap()),
            labels(&[]),
            (WorkloadProtocol::Tcp, false),
            "remote-network",
            "name",
        ),
        (
            "EmptyAddrWorkloadEntries: no address, reachable through its network's gateway",
            json!({"spec": {"address": ""}}),
            EntryAddress::None,
            labels(&[]),
            (WorkloadProtocol::Tcp, false),
            "testnetwork",
            "name",
        ),
        (
            "a hostname address, and the auto-registration group as workload name",
            json!({"metadata": {"annotations": {"istio.io/autoRegistrationGroup": "vm-group",
                "ambient.istio.io/redirection": "enabled"}}, "spec": {"address": "vm.example.com"}}),
            EntryAddress::Hostname("vm.example.com".to_owned()),
            labels(&[]),
            (WorkloadProtocol::Hbone, false),
            "testnetwork",
            "vm-group",
        ),
    ];
    for (case, patch, address, labels, tunnel, network, workload_name) in cases {
        let outcome = convert_one(patch);
        assert_eq!(outcome.problems, [], "{case}");
        let entry = outcome.entry.expect(case);
        assert_eq!(
            entry.uid, "cluster0/networking.istio.io/WorkloadEntry/ns/name",
            "{case}"
        );
        assert_eq!(entry.address, address, "{case}");
        assert_eq!(entry.labels, labels, "{case}");
        assert_eq!((entry.protocol, entry.native_tunnel), tunnel, "{case}");
        assert_eq!(entry.network, network, "{case}");
        assert_eq!(entry.workload_name, workload_name, "{case}");
        assert_eq!(entry.service_entry, None, "{case}");
    }
}

#[test]
fn workload_entry_weight_locality_ports_and_service_account_are_kept() {
    let outcome = convert_one(
        json!({"spec": {"weight": 7, "locality": "region/zone/subzone",
        "serviceAccount": "vm", "ports": {"http": 8080, "bad": 70000}}}),
    );
    assert_eq!(outcome.problems, [ProblemReason::BadPort { port: 70000 }]);
    let entry = outcome.entry.unwrap();
    assert_eq!(entry.weight, Some(7));
    assert_eq!(entry.service_account, "vm");
    assert_eq!(entry.ports, BTreeMap::from([("http".to_owned(), 8080)]));
    assert_eq!(
        entry.locality,
        Some(Locality {
            region: "region".to_owned(),
            zone: "zone".to_owned(),
            subzone: "subzone".to_owned(),
        })
    );
    let unweighted = convert_one(json!({})).entry.unwrap();
    assert_eq!((unweighted.weight, unweighted.locality), (None, None));
}

#[test]
fn workload_entry_without_a_name_is_left_out() {
    let outcome = convert_one(json!({"metadata": {"name": null}}));
    assert_eq!(outcome.entry, None);
    assert_eq!(
        outcome.problems,
        [ProblemReason::MissingField {
            field: "metadata.name"
        }]
    );
}
