//! Store and index behaviour.

use std::net::IpAddr;

use crate::cidr::Cidr;

use super::*;

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

fn key(text: &str) -> NamespacedHostname {
    text.parse().unwrap()
}

/// Uid of the workload indexed at `network`/`addr`.
fn owner<'a>(state: &'a State, network: &str, addr: &str) -> Option<&'a str> {
    state
        .workload_by_address(network, ip(addr))
        .map(|workload| &*workload.uid)
}

fn uids<'a>(workloads: impl Iterator<Item = &'a Arc<Workload>>) -> Vec<String> {
    workloads.map(|workload| workload.uid.to_string()).collect()
}

#[test]
fn workloads_are_found_by_uid_and_by_network_and_ip() {
    let mut state = State::new();
    let mut east = Workload::for_test("east", "default", &[ip("10.0.0.1")]);
    east.network = "east".into();
    state.insert_workload(east);
    state.insert_workload(Workload::for_test(
        "west",
        "default",
        &[ip("10.0.0.1"), ip("fd00::1")],
    ));

    assert_eq!(state.workload("east").unwrap().network.as_ref(), "east");
    assert_eq!(owner(&state, "east", "10.0.0.1"), Some("east"));
    assert_eq!(owner(&state, "", "10.0.0.1"), Some("west"));
    assert_eq!(owner(&state, "", "fd00::1"), Some("west"));
    assert_eq!(owner(&state, "", "::ffff:10.0.0.1"), Some("west"));
    assert!(state.workload_by_address("", ip("10.0.0.2")).is_none());
    assert!(state.workload_by_address("north", ip("10.0.0.1")).is_none());
}

#[test]
fn a_local_workload_is_found_by_pod_name_service_account_and_node() {
    let mut state = State::new();
    // A mesh around it: the lookup goes through the name index.
    for index in 0..1000 {
        let mut other = Workload::for_test(&format!("other-{index}"), "default", &[]);
        other.node = "node-b".into();
        state.insert_workload(other);
    }
    let mut pod = Workload::for_test("uid-pod", "default", &[ip("10.0.0.1")]);
    pod.name = "pod".into();
    pod.node = "node-a".into();
    state.insert_workload(pod.clone());
    // The same pod name in another namespace, on the same node.
    let mut elsewhere = Workload::for_test("uid-elsewhere", "shop", &[]);
    elsewhere.name = "pod".into();
    elsewhere.node = "node-a".into();
    state.insert_workload(elsewhere);
    let find = |state: &State, account: &str, node: Option<&str>| {
        state
            .local_workload("default", "pod", account, node)
            .map(|workload| workload.uid.to_string())
    };

    assert_eq!(
        find(&state, "default", Some("node-a")).as_deref(),
        Some("uid-pod")
    );
    assert_eq!(find(&state, "default", None).as_deref(), Some("uid-pod"));
    assert_eq!(find(&state, "default", Some("node-b")), None, "other node");
    assert_eq!(find(&state, "web", Some("node-a")), None, "other account");

    // Same pod name on another node (a restarted pod moved): both kept,
    // each found on its node; removing one leaves the other.
    let mut moved = pod.clone();
    moved.uid = "uid-moved".into();
    moved.node = "node-b".into();
    state.insert_workload(moved);
    assert_eq!(
        find(&state, "default", Some("node-b")).as_deref(),
        Some("uid-moved")
    );
    assert_eq!(
        find(&state, "default", None).as_deref(),
        Some("uid-moved"),
        "lowest uid"
    );
    state.remove_workload("uid-moved");
    assert_eq!(find(&state, "default", None).as_deref(), Some("uid-pod"));
    state.remove_workload("uid-pod");
    assert_eq!(find(&state, "default", None), None);
}

#[test]
fn workloads_converted_with_one_interner_share_one_copy_of_what_they_repeat() {
    let mut interner = Interner::new();
    let wire = |uid: &str, node: &str| proto::Workload {
        uid: uid.into(),
        name: uid.into(),
        namespace: "default".into(),
        node: node.into(),
        canonical_name: "echo".into(),
        services: [(
            "default/echo.default.svc".to_owned(),
            proto::PortList::default(),
        )]
        .into(),
        ..proto::Workload::default()
    };
    let a = Workload::from_proto(&wire("a", "node-a"), &mut interner).unwrap();
    let b = Workload::from_proto(&wire("b", "node-a"), &mut interner).unwrap();
    assert!(Arc::ptr_eq(&a.namespace, &b.namespace));
    assert!(Arc::ptr_eq(&a.node, &b.node));
    assert!(Arc::ptr_eq(&a.group, &b.group));
    assert_eq!(a.group.canonical_name.as_ref(), "echo");
    assert_eq!(a.services, b.services);
    assert_eq!(
        a.services.shared_count(),
        3,
        "one copy held by both and the interner"
    );
    assert_eq!(a.identity.shared_count(), b.identity.shared_count());
    assert!(a.identity.shared_count() >= 3);

    // Churn through values no workload keeps: the interner does not grow
    // with what it has seen, only with what is held.
    for index in 0..20_000 {
        let churn = Workload::from_proto(&wire("churn", &format!("node-{index}")), &mut interner);
        drop(churn);
    }
    assert!(interner.len() < 4 * 1024, "{} values kept", interner.len());
    let c = Workload::from_proto(&wire("c", "node-a"), &mut interner).unwrap();
    assert!(Arc::ptr_eq(&c.node, &a.node), "values still held are kept");
}

#[test]
fn host_network_workloads_are_stored_but_not_indexed_by_ip() {
    let mut state = State::new();
    let mut host = Workload::for_test("host", "kube-system", &[ip("192.168.1.10")]);
    host.network_mode = NetworkMode::HostNetwork;
    state.insert_workload(host);
    assert!(state.workload("host").is_some());
    assert!(state.workload_by_address("", ip("192.168.1.10")).is_none());
}

#[test]
fn replacing_a_workload_reindexes_its_addresses_and_services() {
    let mut state = State::new();
    let mut old = Workload::for_test("pod", "default", &[ip("10.0.0.1")]);
    old.services.insert(
        key("default/a.default.svc.cluster.local"),
        Default::default(),
    );
    state.insert_workload(old);
    let mut new = Workload::for_test("pod", "default", &[ip("10.0.0.2")]);
    new.services.insert(
        key("default/b.default.svc.cluster.local"),
        Default::default(),
    );
    let replaced = state.insert_workload(new);

    assert_eq!(*replaced.unwrap().addresses, [ip("10.0.0.1")]);
    assert!(state.workload_by_address("", ip("10.0.0.1")).is_none());
    assert_eq!(owner(&state, "", "10.0.0.2"), Some("pod"));
    assert!(uids(state.endpoints(&key("default/a.default.svc.cluster.local"))).is_empty());
    assert_eq!(
        uids(state.endpoints(&key("default/b.default.svc.cluster.local"))),
        ["pod"]
    );

    assert!(state.remove_workload("pod").is_some());
    assert!(state.remove_workload("pod").is_none());
    assert!(state.workload_by_address("", ip("10.0.0.2")).is_none());
    assert!(uids(state.endpoints(&key("default/b.default.svc.cluster.local"))).is_empty());
}

#[test]
fn removing_the_older_owner_of_a_shared_ip_keeps_the_newer_indexed() {
    let mut state = State::new();
    state.insert_workload(Workload::for_test("old", "default", &[ip("10.0.0.1")]));
    state.insert_workload(Workload::for_test("new", "default", &[ip("10.0.0.1")]));
    assert_eq!(owner(&state, "", "10.0.0.1"), Some("new"));
    state.remove_workload("old");
    assert_eq!(owner(&state, "", "10.0.0.1"), Some("new"));
}

#[test]
fn a_shared_ip_goes_to_a_pod_then_an_hbone_workload_then_the_last_inserted() {
    // istiod's uids: `cluster//Pod/namespace/name` for a pod.
    const POD: &str = "cluster1//Pod/default/";
    const ENTRY: &str = "cluster1/networking.istio.io/WorkloadEntry/default/";
    /// Why; the workloads inserted in order, as (name, HBONE); the one
    /// removed after; the owner.
    type Row<'a> = (&'a str, &'a [(&'a str, bool)], Option<&'a str>, &'a str);
    #[rustfmt::skip]
    let cases: &[Row] = &[
        ("a pod over a workload entry inserted later", &[("pod", false), ("entry", false)], None, "pod"),
        ("a pod over an HBONE workload entry", &[("entry", true), ("pod", false)], None, "pod"),
        ("an HBONE pod over a plain pod", &[("hbone-pod", true), ("pod", false)], None, "hbone-pod"),
        ("an HBONE entry over a plain entry", &[("hbone-entry", true), ("entry", false)], None, "hbone-entry"),
        ("equals: the last inserted", &[("pod", false), ("pod-2", false)], None, "pod-2"),
        ("removing the owner leaves it to the next", &[("entry", false), ("pod", false)], Some("pod"), "entry"),
    ];
    for (why, workloads, removed, want) in cases {
        let uid = |name: &str| {
            let prefix = if name.contains("pod") { POD } else { ENTRY };
            format!("{prefix}{name}")
        };
        let mut state = State::new();
        for (name, hbone) in *workloads {
            let mut workload = Workload::for_test(&uid(name), "default", &[ip("10.0.0.1")]);
            if *hbone {
                workload.protocol = InboundProtocol::Hbone;
            }
            state.insert_workload(workload);
        }
        if let Some(name) = removed {
            state.remove_workload(&uid(name));
        }
        assert_eq!(
            owner(&state, "", "10.0.0.1"),
            Some(uid(want).as_str()),
            "{why}"
        );
    }
}

#[test]
fn endpoints_come_from_workload_service_maps_in_either_arrival_order() {
    let echo = key("default/echo.default.svc.cluster.local");
    let mut state = State::new();
    for uid in ["pod-c", "pod-a"] {
        let mut workload = Workload::for_test(uid, "default", &[]);
        workload.services.insert(echo.clone(), Default::default());
        state.insert_workload(workload);
    }
    state.insert_workload(Workload::for_test("other", "default", &[]));
    // The service arrives after its endpoints.
    state.insert_service(Service::for_test(
        "default",
        "echo.default.svc.cluster.local",
        &[],
        &[],
    ));
    assert_eq!(uids(state.endpoints(&echo)), ["pod-a", "pod-c"]);
    // Removing the service does not forget which workloads name it.
    state.remove_service(&echo);
    assert_eq!(uids(state.endpoints(&echo)), ["pod-a", "pod-c"]);
}

#[test]
fn services_are_found_by_key_vip_and_hostname() {
    let mut state = State::new();
    state.insert_service(Service::for_test(
        "default",
        "echo.default.svc.cluster.local",
        &[ip("10.96.0.1")],
        &[(80, 8080)],
    ));
    let echo = key("default/echo.default.svc.cluster.local");
    assert_eq!(state.service(&echo).unwrap().ports.get(&80), Some(&8080));
    assert_eq!(
        state.service_by_vip("", ip("10.96.0.1")).unwrap().key(),
        echo
    );
    assert!(state.service_by_vip("other", ip("10.96.0.1")).is_none());
    assert_eq!(
        state
            .service_by_hostname("echo.default.svc.cluster.local")
            .unwrap()
            .key(),
        echo
    );

    // A replacement with a new VIP drops the old one.
    state.insert_service(Service::for_test(
        "default",
        "echo.default.svc.cluster.local",
        &[ip("10.96.0.2")],
        &[],
    ));
    assert!(state.service_by_vip("", ip("10.96.0.1")).is_none());
    assert!(state.service_by_vip("", ip("10.96.0.2")).is_some());
    state.remove_service(&echo);
    assert!(state.service_by_vip("", ip("10.96.0.2")).is_none());
    assert!(
        state
            .service_by_hostname("echo.default.svc.cluster.local")
            .is_none()
    );
}

#[test]
fn host_vips_win_over_cidr_vips_and_the_longest_prefix_wins() {
    let mut state = State::new();
    let mut wide = Service::for_test("default", "wide", &[], &[]);
    wide.cidr_vips.push(NetworkCidr {
        network: "".into(),
        cidr: Cidr::new(ip("10.0.0.0"), 8).unwrap(),
    });
    let mut narrow = Service::for_test("default", "narrow", &[], &[]);
    narrow.cidr_vips.push(NetworkCidr {
        network: "".into(),
        cidr: Cidr::new(ip("10.1.0.0"), 16).unwrap(),
    });
    state.insert_service(wide);
    state.insert_service(narrow);
    state.insert_service(Service::for_test("default", "host", &[ip("10.1.2.3")], &[]));
    let hostname = |addr: &str| {
        state
            .service_by_vip("", ip(addr))
            .map(|s| s.hostname.to_string())
    };
    assert_eq!(hostname("10.1.2.3").as_deref(), Some("host"));
    assert_eq!(hostname("10.1.2.4").as_deref(), Some("narrow"));
    assert_eq!(hostname("10.2.0.1").as_deref(), Some("wide"));
    assert_eq!(hostname("11.0.0.1"), None);
}

#[test]
fn the_canonical_service_wins_a_hostname_shared_across_namespaces() {
    let mut state = State::new();
    state.insert_service(Service::for_test("alpha", "db.example.com", &[], &[]));
    let mut canonical = Service::for_test("zeta", "db.example.com", &[], &[]);
    canonical.canonical = true;
    state.insert_service(canonical);
    assert_eq!(state.services_by_hostname("db.example.com").count(), 2);
    assert_eq!(
        state
            .service_by_hostname("db.example.com")
            .unwrap()
            .namespace
            .as_ref(),
        "zeta"
    );

    state.remove_service(&key("zeta/db.example.com"));
    assert_eq!(
        state
            .service_by_hostname("db.example.com")
            .unwrap()
            .namespace
            .as_ref(),
        "alpha"
    );
}

#[test]
fn policies_are_indexed_by_scope() {
    let mut state = State::new();
    state.insert_policy(
        "istio-system/mesh".into(),
        Policy::for_test("istio-system", "mesh", Scope::Global),
    );
    state.insert_policy(
        "default/ns".into(),
        Policy::for_test("default", "ns", Scope::Namespace),
    );
    state.insert_policy(
        "default/sel".into(),
        Policy::for_test("default", "sel", Scope::WorkloadSelector),
    );
    let names = |policies: Vec<&Arc<Policy>>| -> Vec<String> {
        policies.iter().map(|p| p.name.to_string()).collect()
    };
    assert_eq!(names(state.global_policies().collect()), ["mesh"]);
    assert_eq!(names(state.namespace_policies("default").collect()), ["ns"]);
    assert!(state.namespace_policies("istio-system").next().is_none());
    assert_eq!(state.policy("default/sel").unwrap().name.as_ref(), "sel");

    // Re-scoping a policy moves it between indexes; order is by resource name.
    state.insert_policy(
        "default/ns".into(),
        Policy::for_test("default", "ns", Scope::Global),
    );
    assert_eq!(names(state.global_policies().collect()), ["ns", "mesh"]);
    assert!(state.namespace_policies("default").next().is_none());
    state.remove_policy("istio-system/mesh");
    assert_eq!(names(state.global_policies().collect()), ["ns"]);
}

#[test]
fn replace_all_forgets_everything_not_given() {
    let mut state = State::new();
    state.insert_workload(Workload::for_test("gone", "default", &[ip("10.0.0.1")]));
    state.insert_service(Service::for_test(
        "default",
        "gone",
        &[ip("10.96.0.1")],
        &[],
    ));
    state.insert_policy(
        "default/gone".into(),
        Policy::for_test("default", "gone", Scope::Global),
    );

    state.replace_all(
        [Workload::for_test("kept", "default", &[ip("10.0.0.2")])],
        [Service::for_test(
            "default",
            "kept",
            &[ip("10.96.0.2")],
            &[],
        )],
        [(
            Arc::from("default/kept"),
            Policy::for_test("default", "kept", Scope::Global),
        )],
    );
    assert!(state.workload_by_address("", ip("10.0.0.1")).is_none());
    assert!(state.service_by_vip("", ip("10.96.0.1")).is_none());
    assert!(state.policy("default/gone").is_none());
    assert_eq!(state.workloads().count(), 1);
    assert_eq!(state.services().count(), 1);
    assert_eq!(state.policies().count(), 1);
    assert_eq!(state.global_policies().count(), 1);
}

#[test]
fn address_resources_decode_to_a_workload_or_a_service_or_are_rejected() {
    use ztunnel_proto::istio::workload as proto;
    let workload = proto::Address {
        r#type: Some(proto::address::Type::Workload(proto::Workload {
            uid: "pod".into(),
            namespace: "default".into(),
            addresses: vec![vec![10, 0, 0, 1]],
            ..Default::default()
        })),
    };
    let service = proto::Address {
        r#type: Some(proto::address::Type::Service(proto::Service {
            namespace: "default".into(),
            hostname: "echo".into(),
            ..Default::default()
        })),
    };
    let mut state = State::new();
    state.insert_address(AddressResource::try_from(&workload).unwrap());
    state.insert_address(AddressResource::try_from(&service).unwrap());
    assert!(state.workload_by_address("", ip("10.0.0.1")).is_some());
    assert!(state.service(&key("default/echo")).is_some());

    let empty = AddressResource::try_from(&proto::Address { r#type: None }).unwrap_err();
    assert_eq!(
        empty.to_string(),
        "address has neither workload nor service"
    );
}

#[test]
fn the_workloads_of_a_node_follow_inserts_replacements_and_removals() {
    let mut state = State::new();
    let on = |node: &str, uid: &str| {
        let mut workload = Workload::for_test(uid, "default", &[]);
        workload.node = node.into();
        workload
    };
    state.insert_workload(on("node-a", "a1"));
    state.insert_workload(on("node-a", "a2"));
    state.insert_workload(on("node-b", "b1"));
    state.insert_workload(on("", "nowhere"));
    let sorted = |state: &State, node: &str| {
        let mut uids = uids(state.workloads_on_node(node));
        uids.sort();
        uids
    };
    assert_eq!(sorted(&state, "node-a"), ["a1", "a2"]);
    assert_eq!(sorted(&state, ""), ["nowhere"]);

    // a2 moves to node-b; a1 goes.
    state.insert_workload(on("node-b", "a2"));
    state.remove_workload("a1");
    assert!(sorted(&state, "node-a").is_empty());
    assert_eq!(sorted(&state, "node-b"), ["a2", "b1"]);
    assert!(sorted(&state, "node-c").is_empty());
}

#[test]
fn applicable_policies_follow_scope_and_workload_names() {
    let mut state = State::new();
    state.insert_policy(
        "istio-system/mesh".into(),
        Policy::for_test("istio-system", "mesh", Scope::Global),
    );
    state.insert_policy(
        "server-ns/ns-wide".into(),
        Policy::for_test("server-ns", "ns-wide", Scope::Namespace),
    );
    state.insert_policy(
        "other-ns/other".into(),
        Policy::for_test("other-ns", "other", Scope::Namespace),
    );
    state.insert_policy(
        "server-ns/selected".into(),
        Policy::for_test("server-ns", "selected", Scope::WorkloadSelector),
    );
    state.insert_policy(
        "server-ns/unselected".into(),
        Policy::for_test("server-ns", "unselected", Scope::WorkloadSelector),
    );

    let mut workload = Workload::for_test("server", "server-ns", &[]);
    workload.authorization_policies = Box::new([
        Arc::from("server-ns/selected"),
        Arc::from("server-ns/not-yet-known"),
        Arc::from("istio-system/mesh"),
        Arc::from("server-ns/ns-wide"),
    ]);
    let names: Vec<&str> = state
        .applicable_policies(&workload)
        .map(|p| &*p.name)
        .collect();
    assert_eq!(
        names,
        ["mesh", "ns-wide", "selected"],
        "named policies that apply by scope are not repeated"
    );

    let bystander = Workload::for_test("bystander", "third-ns", &[]);
    let names: Vec<&str> = state
        .applicable_policies(&bystander)
        .map(|p| &*p.name)
        .collect();
    assert_eq!(names, ["mesh"]);

    // A named policy that arrives after the workload takes effect then.
    state.insert_policy(
        "server-ns/not-yet-known".into(),
        Policy::for_test("server-ns", "late", Scope::WorkloadSelector),
    );
    assert_eq!(state.applicable_policies(&workload).count(), 4);
}
