//! Tests for the mesh registry: file format (both forms), cross-entry
//! checks, indexes, and reload.

use std::net::IpAddr;
use std::path::PathBuf;

use ztunnel_certs::error_chain::ErrorChain;

use super::*;

const PODS: &str = "\
- name: ztunnel-a
  namespace: istio-system
  uid: uid-za
  serviceAccount: ztunnel
  nodeName: node-a
  phase: Running
  ips: [10.0.0.2]
- name: app-1
  namespace: default
  uid: uid-app-1
  serviceAccount: app
  nodeName: node-a
  phase: Pending
- name: broken-1
  namespace: default
  uid: uid-broken-1
  serviceAccount: broken
  nodeName: node-a
  phase: Failed
- name: unscheduled
  namespace: default
  uid: uid-u
  serviceAccount: lonely
";

fn write(dir: &tempfile::TempDir, content: &str) -> PathBuf {
    let path = dir.path().join("pods.yaml");
    std::fs::write(&path, content).unwrap();
    path
}

#[test]
fn file_is_indexed_by_pod_and_by_node() {
    let dir = tempfile::tempdir().unwrap();
    let registry = FileRegistry::load(&write(&dir, PODS)).unwrap();
    let snapshot = registry.snapshot();
    assert_eq!(snapshot.len(), 4);
    let ztunnel = snapshot.pod("istio-system", "ztunnel-a").unwrap();
    assert_eq!(ztunnel.uid, "uid-za");
    assert_eq!(ztunnel.node_name.as_deref(), Some("node-a"));
    assert_eq!(ztunnel.ips, vec![IpAddr::from([10, 0, 0, 2])]);
    assert_eq!(
        snapshot.pod("default", "unscheduled").unwrap().phase,
        PodPhase::Running
    );
    assert!(snapshot.pod("default", "ztunnel-a").is_none());

    assert!(
        snapshot.has_live_pod("node-a", "default", "app"),
        "pending counts"
    );
    assert!(
        !snapshot.has_live_pod("node-a", "default", "broken"),
        "failed does not"
    );
    assert!(!snapshot.has_live_pod("node-b", "default", "app"));
    assert!(!snapshot.has_live_pod("", "default", "lonely"));
}

#[test]
fn bad_files_are_refused_with_their_line() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "unknown field",
            "- name: a\n  namespace: n\n  uid: u\n  serviceAccount: s\n  nodename: x\n",
            5,
        ),
        (
            "bad phase",
            "- name: a\n  namespace: n\n  uid: u\n  serviceAccount: s\n  phase: Sleeping\n",
            5,
        ),
        (
            "bad ip",
            "- name: a\n  namespace: n\n  uid: u\n  serviceAccount: s\n  ips: [1.2.3]\n",
            5,
        ),
        (
            "missing uid",
            "- name: a\n  namespace: n\n  serviceAccount: s\n",
            1,
        ),
        ("not a list", "name: a\n", 1),
    ];
    for (name, content, want_line) in cases {
        let path = write(&dir, content);
        match FileRegistry::load(&path) {
            Err(RegistryError::Parse { line, path: at, .. }) => {
                assert_eq!(line, want_line, "{name}");
                assert_eq!(at, path, "{name}");
            }
            other => panic!("{name}: {other:?}"),
        }
    }
    let duplicate = "- {name: a, namespace: n, uid: u1, serviceAccount: s}\n- {name: a, namespace: n, uid: u2, serviceAccount: s}\n";
    assert!(matches!(
        FileRegistry::load(&write(&dir, duplicate)),
        Err(RegistryError::Invalid {
            source: MeshError::DuplicatePod { .. },
            ..
        })
    ));
    assert!(
        FileRegistry::load(&write(&dir, "\n"))
            .unwrap()
            .snapshot()
            .is_empty()
    );
    assert!(matches!(
        FileRegistry::load(&dir.path().join("absent.yaml")),
        Err(RegistryError::Read { .. })
    ));
}

#[test]
fn reload_swaps_good_files_and_keeps_the_last_good_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, PODS);
    let registry = FileRegistry::load(&path).unwrap();
    let before = registry.snapshot();
    assert!(
        !registry.reload().unwrap(),
        "unchanged content is not a reload"
    );

    std::fs::write(
        &path,
        PODS.replace(
            "nodeName: node-a\n  phase: Pending",
            "nodeName: node-b\n  phase: Pending",
        ),
    )
    .unwrap();
    assert!(registry.reload().unwrap());
    let moved = registry.snapshot();
    assert!(moved.has_live_pod("node-b", "default", "app"));
    assert!(!moved.has_live_pod("node-a", "default", "app"));
    assert!(
        before.has_live_pod("node-a", "default", "app"),
        "old snapshots stay intact"
    );

    std::fs::write(&path, "- name: [oops\n").unwrap();
    assert!(matches!(
        registry.reload(),
        Err(RegistryError::Parse { line: 1, .. })
    ));
    assert!(
        registry.snapshot().has_live_pod("node-b", "default", "app"),
        "last good kept"
    );
}

const MESH: &str = "\
pods:
- name: echo-1
  namespace: default
  uid: uid-echo-1
  serviceAccount: echo
  nodeName: node-a
  ips: [10.0.0.5]
  labels: {app: echo, version: v1}
- name: legacy
  namespace: default
  uid: uid-legacy
  serviceAccount: legacy
  nodeName: node-b
  ips: [10.0.0.6]
  protocol: TCP
  network: net-1
  clusterId: other
  workloadName: legacy-deploy
services:
- name: echo
  namespace: default
  hostname: echo.default.svc.cluster.local
  vips: [10.96.0.10, net-1/10.96.0.11, /fd00::10]
  ports: {80: 8080}
  selector: {app: echo}
- name: legacy
  namespace: default
  hostname: legacy.default.svc.cluster.local
  ports: {5432: 5432}
  endpoints: [uid-legacy]
policies:
- name: allow-app
  namespace: default
  scope: WorkloadSelector
  selector: {app: echo}
  action: Allow
  rules:
  - - - principals: [!Exact cluster.local/ns/default/sa/app, !Prefix cluster.local/ns/x/]
        sourceIps: [10.0.0.0/8, 192.168.1.1]
        destinationPorts: [8080]
    - - notNamespaces: [!Suffix -test, Presence]
        serviceAccounts: [{namespace: default, serviceAccount: app}]
- name: deny-all-dry
  namespace: istio-system
  scope: Global
  action: Deny
  dryRun: true
";

#[test]
fn map_form_holds_pods_services_and_policies() {
    let dir = tempfile::tempdir().unwrap();
    let snapshot = FileRegistry::load(&write(&dir, MESH)).unwrap().snapshot();
    assert_eq!(snapshot.len(), 2);
    let echo = snapshot.pod_by_uid("uid-echo-1").unwrap();
    assert_eq!(echo.protocol, WorkloadProtocol::Hbone, "HBONE by default");
    assert_eq!(echo.labels.get("app").map(String::as_str), Some("echo"));
    let legacy = snapshot.pod("default", "legacy").unwrap();
    assert_eq!(legacy.protocol, WorkloadProtocol::Tcp);
    assert_eq!(legacy.network, "net-1");
    assert_eq!(legacy.cluster_id.as_deref(), Some("other"));

    let [echo_service, legacy_service] = snapshot.services() else {
        panic!("two services")
    };
    assert_eq!(
        echo_service.vips,
        vec![
            NetworkAddress {
                network: String::new(),
                address: IpAddr::from([10, 96, 0, 10])
            },
            NetworkAddress {
                network: "net-1".into(),
                address: IpAddr::from([10, 96, 0, 11])
            },
            NetworkAddress {
                network: String::new(),
                address: "fd00::10".parse().unwrap()
            },
        ]
    );
    assert_eq!(echo_service.ports.get(&80), Some(&ServicePort::from(8080)));
    assert_eq!(
        legacy_service.endpoints.as_deref(),
        Some(&["uid-legacy".to_owned()][..])
    );

    let [allow, deny] = snapshot.policies() else {
        panic!("two policies")
    };
    assert_eq!(allow.scope, PolicyScope::WorkloadSelector);
    assert_eq!(allow.resource_name(), "default/allow-app");
    let first = &allow.rules[0][0][0];
    assert_eq!(
        first.principals,
        vec![
            StringMatch::Exact("cluster.local/ns/default/sa/app".into()),
            StringMatch::Prefix("cluster.local/ns/x/".into()),
        ]
    );
    assert_eq!(first.source_ips[0].to_string(), "10.0.0.0/8");
    assert_eq!(first.source_ips[1].to_string(), "192.168.1.1/32");
    assert_eq!(first.destination_ports, vec![8080]);
    let second = &allow.rules[0][1][0];
    assert_eq!(
        second.not_namespaces,
        vec![StringMatch::Suffix("-test".into()), StringMatch::Presence]
    );
    assert_eq!(second.service_accounts[0].service_account, "app");
    assert!(deny.dry_run);
    assert_eq!(deny.action, PolicyAction::Deny);
}

#[test]
fn map_form_parse_errors_carry_the_line_of_the_value() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("unknown top-level key", "pods: []\nworkloads: []\n", 2),
        (
            "unknown service key",
            "services:\n- name: s\n  namespace: n\n  hostname: h\n  ports: {}\n  vip: []\n",
            6,
        ),
        (
            "bad vip",
            "services:\n- name: s\n  namespace: n\n  hostname: h\n  ports: {}\n  vips:\n  - 10.0.0.1\n  - net/10.0.300.1\n",
            8,
        ),
        (
            "prefix too long",
            "policies:\n- name: p\n  namespace: n\n  scope: Global\n  action: Allow\n  rules:\n  - - - sourceIps:\n        - 10.0.0.0/33\n",
            8,
        ),
        (
            "bad string match",
            "policies:\n- name: p\n  namespace: n\n  scope: Global\n  action: Allow\n  rules: [[[{principals: [!Regex a]}]]]\n",
            6,
        ),
        (
            "bad protocol",
            "pods:\n- {name: a, namespace: n, uid: u, serviceAccount: s}\n- {name: b, namespace: n, uid: v, serviceAccount: s, protocol: mTLS}\n",
            3,
        ),
        (
            "bad port",
            "services:\n- {name: s, namespace: n, hostname: h, ports: {80: 70000}}\n",
            2,
        ),
        (
            "bad port written as a string",
            "services:\n- {name: s, namespace: n, hostname: h, ports: {80: '70000'}}\n",
            2,
        ),
        (
            "unknown port key",
            "services:\n- name: s\n  namespace: n\n  hostname: h\n  ports:\n    80: {target: 8080}\n",
            6,
        ),
    ];
    for (name, content, want_line) in cases {
        match FileRegistry::load(&write(&dir, content)) {
            Err(RegistryError::Parse { line, .. }) => assert_eq!(line, want_line, "{name}"),
            other => panic!("{name}: {other:?}"),
        }
    }
}

#[test]
fn contradictory_entries_are_refused() {
    let pod = |name: &str, uid: &str, ip: &str| {
        format!("- {{name: {name}, namespace: n, uid: {uid}, serviceAccount: s, ips: [{ip}]}}\n")
    };
    let two_pods = format!(
        "{}{}",
        pod("a", "ua", "10.0.0.1"),
        pod("b", "ub", "10.0.0.2")
    );
    let service = |extra: &str| {
        format!(
            "pods:\n{two_pods}services:\n- {{name: s, namespace: n, hostname: h, ports: {{80: 80}}{extra}}}\n"
        )
    };
    let policy =
        |extra: &str| format!("policies:\n- {{name: p, namespace: n, action: Allow{extra}}}\n");
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "duplicate uid",
            format!("{}{}", pod("a", "u", "10.0.0.1"), pod("b", "u", "10.0.0.2")),
            "uid u appears twice",
        ),
        (
            "duplicate ip",
            format!(
                "{}{}",
                pod("a", "ua", "10.0.0.1"),
                pod("b", "ub", "10.0.0.1")
            ),
            "both have IP 10.0.0.1",
        ),
        ("slash in uid", pod("a", "n/a", "10.0.0.1"), "contains '/'"),
        ("empty uid", pod("a", "''", "10.0.0.1"), "uid is empty"),
        (
            "no identity",
            "- {name: a, namespace: 'n+1', uid: ua, serviceAccount: s, ips: [10.0.0.1]}\n".into(),
            "pod n+1/a: no valid identity: identity namespace contains a forbidden character",
        ),
        (
            "selector and endpoints",
            service(", selector: {app: a}, endpoints: [ua]"),
            "both set",
        ),
        (
            "empty selector",
            service(", selector: {}"),
            "selector is empty",
        ),
        (
            "unknown endpoint",
            service(", endpoints: [ua, nope]"),
            "endpoint nope",
        ),
        (
            "subject alt name that is no identity",
            service(", subjectAltNames: ['spiffe://cluster.local/ns/n/sa/s', 'db.example']"),
            "subjectAltNames entry \"db.example\" is not a SPIFFE identity",
        ),
        (
            "zero port",
            format!(
                "pods:\n{two_pods}services:\n- {{name: s, namespace: n, hostname: h, ports: {{80: 0}}}}\n"
            ),
            "port 0",
        ),
        (
            "duplicate hostname",
            "services:\n- {name: s, namespace: n, hostname: h, ports: {}}\n- {name: t, namespace: n, hostname: h, ports: {}}\n"
                .to_owned(),
            "both have hostname n/h",
        ),
        (
            "a waypoint naming two services of one name (a ServiceEntry's hosts)",
            "services:\n- {name: s, namespace: n, hostname: h, ports: {}}\n- {name: s, namespace: n, hostname: i, ports: {}}\n\
             - {name: t, namespace: n, hostname: t, ports: {}, waypoint: {service: s}}\n"
                .to_owned(),
            "service n/s names several services; a waypoint must name one",
        ),
        (
            "selector policy without selector",
            policy(", scope: WorkloadSelector"),
            "needs a selector",
        ),
        (
            "namespace policy with selector",
            policy(", scope: Namespace, selector: {app: a}"),
            "only for scope WorkloadSelector",
        ),
        (
            "duplicate policy",
            "policies:\n- {name: p, namespace: n, scope: Global, action: Allow}\n- {name: p, namespace: n, scope: Global, action: Deny}\n"
                .to_owned(),
            "policy n/p appears twice",
        ),
        (
            "workload uid that is another pod's uid",
            format!(
                "{}- {{name: b, namespace: n, uid: ub, serviceAccount: s, workloadUid: ua}}\n",
                pod("a", "ua", "10.0.0.1")
            ),
            "uid ua appears twice",
        ),
        (
            "empty workload uid",
            "- {name: a, namespace: n, uid: ua, serviceAccount: s, workloadUid: ''}\n".to_owned(),
            "workloadUid is empty",
        ),
        (
            "empty target port name",
            "services:\n- {name: s, namespace: n, hostname: h, ports: {80: ''}}\n".to_owned(),
            "targetPort is empty",
        ),
        (
            "namespace policy across namespaces",
            policy(", scope: Namespace, allNamespaces: true"),
            "allNamespaces is only for scope WorkloadSelector",
        ),
        (
            "duplicate peer authentication",
            "peerAuthentications:\n- {name: p, namespace: n}\n- {name: p, namespace: n, mode: Strict}\n"
                .to_owned(),
            "peer authentication n/p appears twice",
        ),
        (
            "a policy named as a PeerAuthentication's converted one",
            "policies:\n- {name: istio_converted_static_strict, namespace: istio-system, scope: Global, action: Deny}\npeerAuthentications:\n- {name: p, namespace: n}\n"
                .to_owned(),
            "policy istio-system/istio_converted_static_strict appears twice",
        ),
        (
            "empty root namespace",
            "rootNamespace: ''\n".to_owned(),
            "rootNamespace is empty",
        ),
    ];
    let dir = tempfile::tempdir().unwrap();
    for (name, content, want) in cases {
        match FileRegistry::load(&write(&dir, &content)) {
            Err(error @ RegistryError::Invalid { .. }) => {
                let message = ErrorChain(&error).to_string();
                assert!(message.contains(want), "{name}: {message}");
            }
            other => panic!("{name}: {other:?}\n{content}"),
        }
    }
    // The same IP on two networks, on a finished pod, or on pods on their
    // node's network, is no conflict.
    let fine = format!(
        "{}- {{name: b, namespace: n, uid: ub, serviceAccount: s, ips: [10.0.0.1], network: other}}\n- {{name: c, namespace: n, uid: uc, serviceAccount: s, ips: [10.0.0.1], phase: Succeeded}}\n- {{name: d, namespace: n, uid: ud, serviceAccount: s, ips: [10.0.0.1], hostNetwork: true}}\n",
        pod("a", "ua", "10.0.0.1")
    );
    assert_eq!(
        FileRegistry::load(&write(&dir, &fine))
            .unwrap()
            .snapshot()
            .len(),
        4
    );
}

#[test]
fn reloads_are_announced_and_bad_edits_reported_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, MESH);
    let registry = FileRegistry::load(&path).unwrap();
    let mut changes = registry.changes();
    assert!(
        !changes.has_changed().unwrap(),
        "the current snapshot counts as seen"
    );

    std::fs::write(&path, MESH.replace("10.0.0.5", "10.0.0.7")).unwrap();
    assert!(registry.reload().unwrap());
    assert!(changes.has_changed().unwrap());
    let announced = std::sync::Arc::clone(&changes.borrow_and_update());
    assert!(std::sync::Arc::ptr_eq(&announced, &registry.snapshot()));
    assert_eq!(
        announced.pod_by_uid("uid-echo-1").unwrap().ips,
        vec![IpAddr::from([10, 0, 0, 7])]
    );

    std::fs::write(&path, "pods: [oops\n").unwrap();
    assert!(registry.reload().is_err());
    assert!(
        !registry.reload().unwrap(),
        "the same bad content is reported once"
    );
    assert!(
        !changes.has_changed().unwrap(),
        "a bad edit announces nothing"
    );
    assert_eq!(registry.snapshot().services().len(), 2, "last good kept");
}

#[test]
fn the_keys_a_kubernetes_pod_fills_can_be_written_in_the_file() {
    let mesh = "\
pods:
- name: web-1
  namespace: shop
  uid: u-web-1
  serviceAccount: web
  workloadUid: Kubernetes//Pod/shop/web-1
  workloadType: Pod
  nativeTunnel: true
  hostNetwork: true
  locality: {region: eu, zone: eu-1}
  ready: false
  trustDomain: ''
  containerPorts: {http: 8080}
services:
- name: web
  namespace: shop
  hostname: web.shop.svc.cluster.local
  ports: {80: http, 81: 8081, 82: '8082', 443: {targetPort: https, appProtocol: TLS}}
  selector: {app: web}
  ipFamilies: Dual
  loadBalancing: {routingPreference: [Network, Zone], mode: Failover, healthPolicy: AllowAll}
  canonical: true
policies:
- {name: p, namespace: istio-system, scope: WorkloadSelector, selector: {app: web}, allNamespaces: true, action: Allow}
";
    let dir = tempfile::tempdir().unwrap();
    let snapshot = FileRegistry::load(&write(&dir, mesh)).unwrap().snapshot();
    let pod = snapshot.pod("shop", "web-1").unwrap();
    assert_eq!(pod.resource_name(), "Kubernetes//Pod/shop/web-1");
    assert_eq!(pod.workload_type, Some(WorkloadType::Pod));
    assert!(pod.native_tunnel && pod.host_network);
    assert_eq!(pod.locality.as_ref().map(|l| l.zone.as_str()), Some("eu-1"));
    assert_eq!((pod.ready, pod.is_healthy()), (Some(false), false));
    assert_eq!(pod.trust_domain.as_deref(), Some(""));
    assert_eq!(pod.container_ports.get("http"), Some(&8080));

    let [service] = snapshot.services() else {
        panic!("one service")
    };
    let ports: Vec<(u16, TargetPort, AppProtocol)> = service
        .ports
        .iter()
        .map(|(port, to)| (*port, to.target.clone(), to.app_protocol))
        .collect();
    assert_eq!(
        ports,
        [
            (80, TargetPort::Name("http".into()), AppProtocol::Unknown),
            (81, TargetPort::Number(8081), AppProtocol::Unknown),
            (82, TargetPort::Number(8082), AppProtocol::Unknown),
            (443, TargetPort::Name("https".into()), AppProtocol::Tls),
        ]
    );
    assert_eq!(service.ip_families, IpFamilies::Dual);
    let balancing = service.load_balancing.as_ref().unwrap();
    assert_eq!(
        balancing.routing_preference,
        [LocalityScope::Network, LocalityScope::Zone]
    );
    assert_eq!(
        (balancing.mode, balancing.health_policy),
        (LoadBalancingMode::Failover, HealthPolicy::AllowAll)
    );
    assert!(service.canonical);
    assert!(snapshot.policies()[0].all_namespaces);
}

#[test]
fn peer_auth_the_file_holds_peer_authentications_under_its_root_namespace() {
    let file = "\
rootNamespace: mesh-root
pods:
- {name: web-1, namespace: shop, uid: u-web-1, serviceAccount: web, ips: [10.0.0.1], labels: {app: web}}
peerAuthentications:
- {name: default, namespace: mesh-root, mode: Strict}
- name: web
  namespace: shop
  selector: {app: web}
  portLevelMtls: {9090: Permissive}
";
    let dir = tempfile::tempdir().unwrap();
    let snapshot = FileRegistry::load(&write(&dir, file)).unwrap().snapshot();
    assert_eq!(snapshot.root_namespace(), "mesh-root");
    assert_eq!(snapshot.peer_authentications().len(), 2);
    assert_eq!(
        snapshot.peer_authentications()[1].port_level_mtls[&9090],
        MtlsMode::Permissive
    );
    let names: Vec<String> = snapshot
        .peer_authentication_policies()
        .iter()
        .map(Policy::resource_name)
        .collect();
    assert_eq!(
        names,
        [
            "mesh-root/istio_converted_static_strict",
            "shop/converted_peer_authentication_web"
        ]
    );
    let pod = snapshot.pod("shop", "web-1").unwrap();
    assert_eq!(
        snapshot.peer_authentication_policies_of(pod),
        ["shop/converted_peer_authentication_web"],
        "the workload's own policy holds the inherited STRICT"
    );
    let without = FileRegistry::load(&write(&dir, "pods: []\n"))
        .unwrap()
        .snapshot();
    assert_eq!(without.root_namespace(), DEFAULT_ROOT_NAMESPACE);
    assert!(without.peer_authentication_policies().is_empty());
}
