//! Writing and reading `baggage`, each against the wire's shape.

use http::HeaderValue;

use super::*;

/// Every label set: a Deployment's pod in a zone.
pub(in crate::hbone) const FULL: WorkloadLabels<'static> = WorkloadLabels {
    cluster_id: "Kubernetes",
    namespace: "default",
    workload_type: "deployment",
    workload_name: "productpage-v1",
    canonical_name: "productpage",
    canonical_revision: "v1",
    region: "eu-west-1",
    zone: "eu-west-1a",
};

#[test]
fn baggage_lists_labels_in_wire_order_without_empty_ones() {
    let cases = [
        (
            FULL,
            "k8s.cluster.name=Kubernetes,k8s.namespace.name=default,\
             k8s.deployment.name=productpage-v1,service.name=productpage,\
             service.version=v1,cloud.region=eu-west-1,cloud.availability_zone=eu-west-1a",
        ),
        (
            WorkloadLabels {
                region: "",
                zone: "",
                canonical_revision: "",
                ..FULL
            },
            "k8s.cluster.name=Kubernetes,k8s.namespace.name=default,\
             k8s.deployment.name=productpage-v1,service.name=productpage",
        ),
        (
            WorkloadLabels {
                workload_type: "pod",
                cluster_id: "",
                ..FULL
            },
            "k8s.namespace.name=default,k8s.pod.name=productpage-v1,\
             service.name=productpage,service.version=v1,cloud.region=eu-west-1,\
             cloud.availability_zone=eu-west-1a",
        ),
        // No type: the workload name has no key to go under.
        (
            WorkloadLabels {
                workload_type: "",
                region: "",
                zone: "",
                ..FULL
            },
            "k8s.cluster.name=Kubernetes,k8s.namespace.name=default,\
             service.name=productpage,service.version=v1",
        ),
        (WorkloadLabels::default(), ""),
    ];
    for (labels, expected) in cases {
        assert_eq!(baggage(&labels).unwrap(), expected, "{labels:?}");
    }
}

fn some(value: &str) -> Option<Arc<str>> {
    Some(Arc::from(value))
}

#[test]
fn baggage_is_read_as_istio_reads_it() {
    let productpage = Baggage {
        cluster: some("Kubernetes"),
        namespace: some("default"),
        workload_name: some("productpage-v1"),
        canonical_name: some("productpage"),
        canonical_revision: some("v1"),
        region: some("eu-west-1"),
        zone: some("eu-west-1a"),
    };
    let rows: &[(&[&str], Baggage, &str)] = &[
        (
            &["k8s.cluster.name=Kubernetes,k8s.namespace.name=default,\
                 k8s.deployment.name=productpage-v1,service.name=productpage,\
                 service.version=v1,cloud.region=eu-west-1,cloud.availability_zone=eu-west-1a"],
            productpage.clone(),
            "every key we write",
        ),
        (
            &[
                "k8s.cluster.name=Kubernetes,k8s.namespace.name=default",
                "k8s.deployment.name=productpage-v1,service.name=productpage",
                "service.version=v1",
                "cloud.region=eu-west-1,cloud.availability_zone=eu-west-1a",
            ],
            productpage,
            "several header lines add up",
        ),
        (
            &["k8s.pod.name=a", "k8s.job.name=b"],
            Baggage {
                workload_name: some("b"),
                ..Baggage::default()
            },
            "any workload type names the workload; the later wins",
        ),
        (
            &["k8s.cronjob.name=nightly,service.name=,k8s.namespace.name="],
            Baggage {
                workload_name: some("nightly"),
                ..Baggage::default()
            },
            "empty values name nothing",
        ),
        (
            &["service.name=a,service.name="],
            Baggage::default(),
            "a later empty value unsets an earlier one",
        ),
        (
            &["k8s.namespace.name=a=b,k8s.replicaset.name=x,noequals,,=v,user.id=7"],
            Baggage {
                namespace: some("a"),
                ..Baggage::default()
            },
            "a value ends at its next =; unknown keys and bare members are passed over",
        ),
        (&[], Baggage::default(), "no header"),
        (&[""], Baggage::default(), "an empty header"),
    ];
    for (values, expected, why) in rows {
        let values: Vec<HeaderValue> = values
            .iter()
            .map(|value| HeaderValue::from_str(value).unwrap())
            .collect();
        assert_eq!(&Baggage::parse(&values), expected, "{why}");
    }
}

#[test]
fn a_header_that_is_not_visible_ascii_gives_nothing() {
    let values = [
        HeaderValue::from_static("k8s.namespace.name=default"),
        HeaderValue::from_bytes(b"service.name=caf\xc3\xa9").unwrap(),
    ];
    assert!(Baggage::parse(&values).is_empty());
}

#[test]
fn what_we_write_reads_back() {
    let written = baggage(&FULL).unwrap();
    let read = Baggage::parse([&written]);
    assert_eq!(read.namespace.as_deref(), Some("default"));
    assert_eq!(read.workload_name.as_deref(), Some("productpage-v1"));
    assert_eq!(read.canonical_name.as_deref(), Some("productpage"));
    assert_eq!(read.canonical_revision.as_deref(), Some("v1"));
    assert_eq!(read.cluster.as_deref(), Some("Kubernetes"));
    assert_eq!(read.zone.as_deref(), Some("eu-west-1a"));
}
