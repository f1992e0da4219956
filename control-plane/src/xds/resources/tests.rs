//! The conversion table: which pods become workloads and with which
//! fields, which services and policies attach to which workloads, and the
//! canonical encoding.

use std::collections::HashMap;

use prost::Message;
use ztunnel_proto::istio::security::{Address as PolicyAddress, Scope};

use super::*;
use ztunnel_mesh::MeshFile;

const TD: &str = "example.org";

fn snapshot(yaml: &str) -> MeshSnapshot {
    let file: MeshFile = serde_yaml_ng::from_str(yaml).unwrap();
    MeshSnapshot::new(file).unwrap()
}

/// Workloads by uid and services by resource name.
fn convert(yaml: &str) -> (HashMap<String, Workload>, HashMap<String, ProtoService>) {
    let mut workloads = HashMap::new();
    let mut services = HashMap::new();
    for (name, resource) in addresses(&snapshot(yaml), TD) {
        match resource.r#type {
            Some(address::Type::Workload(workload)) => {
                assert_eq!(name, workload.uid, "resource name = uid (WIRE.md §7)");
                workloads.insert(name, workload);
            }
            Some(address::Type::Service(service)) => {
                assert_eq!(name, format!("{}/{}", service.namespace, service.hostname));
                services.insert(name, service);
            }
            None => panic!("{name}: empty Address"),
        }
    }
    (workloads, services)
}

const PODS: &str = "\
pods:
- {name: web-1, namespace: shop, uid: u-web-1, serviceAccount: web, nodeName: node-a, ips: [10.0.0.1],
   labels: {app: web, version: v2, tier: front}}
- {name: web-2, namespace: shop, uid: u-web-2, serviceAccount: web, nodeName: node-b, phase: Pending, ips: [10.0.0.2],
   labels: {app: web, tier: front}}
- {name: web-other, namespace: other, uid: u-web-o, serviceAccount: web, nodeName: node-a, ips: [10.0.1.1],
   labels: {app: web}}
- {name: db-1, namespace: shop, uid: u-db-1, serviceAccount: db, nodeName: node-b, ips: ['fd00::1', '::ffff:10.0.0.9'],
   protocol: TCP, network: net-2, clusterId: east, workloadName: db,
   labels: {service.istio.io/canonical-name: database, app.kubernetes.io/version: '14'}}
- {name: done, namespace: shop, uid: u-done, serviceAccount: web, nodeName: node-a, phase: Succeeded, ips: [10.0.0.3]}
- {name: failed, namespace: shop, uid: u-failed, serviceAccount: web, nodeName: node-a, phase: Failed, ips: [10.0.0.4]}
- {name: no-ip, namespace: shop, uid: u-no-ip, serviceAccount: web, nodeName: node-a}
- {name: ztunnel-a, namespace: istio-system, uid: u-zt, serviceAccount: ztunnel, nodeName: node-a}
";

#[test]
fn pods_become_workloads_with_the_wire_fields() {
    let (workloads, _) = convert(PODS);
    let mut uids: Vec<&str> = workloads.keys().map(String::as_str).collect();
    uids.sort_unstable();
    assert_eq!(
        uids,
        ["u-db-1", "u-web-1", "u-web-2", "u-web-o"],
        "Running or Pending, with an IP"
    );

    let web = &workloads["u-web-1"];
    let want = Workload {
        uid: "u-web-1".into(),
        name: "web-1".into(),
        namespace: "shop".into(),
        addresses: vec![vec![10, 0, 0, 1]],
        network: String::new(),
        tunnel_protocol: TunnelProtocol::Hbone as i32,
        trust_domain: TD.into(),
        service_account: "web".into(),
        node: "node-a".into(),
        canonical_name: "web".into(),
        canonical_revision: "v2".into(),
        workload_type: WorkloadType::Pod as i32,
        workload_name: "web-1".into(),
        status: WorkloadStatus::Healthy as i32,
        cluster_id: DEFAULT_CLUSTER_ID.into(),
        ..Workload::default()
    };
    assert_eq!(web, &want);

    // (uid, field, got, want)
    let cases: [(&str, &str, String, String); 10] = [
        (
            "u-web-2",
            "status",
            format!("{:?}", workloads["u-web-2"].status()),
            "Unhealthy".into(),
        ),
        (
            "u-web-2",
            "revision",
            workloads["u-web-2"].canonical_revision.clone(),
            "latest".into(),
        ),
        (
            "u-db-1",
            "protocol",
            format!("{:?}", workloads["u-db-1"].tunnel_protocol()),
            "None".into(),
        ),
        (
            "u-db-1",
            "addresses",
            format!(
                "{:?}",
                workloads["u-db-1"]
                    .addresses
                    .iter()
                    .map(Vec::len)
                    .collect::<Vec<_>>()
            ),
            "[16, 4]".into(),
        ),
        (
            "u-db-1",
            "network",
            workloads["u-db-1"].network.clone(),
            "net-2".into(),
        ),
        (
            "u-db-1",
            "cluster",
            workloads["u-db-1"].cluster_id.clone(),
            "east".into(),
        ),
        (
            "u-db-1",
            "workload type",
            format!("{:?}", workloads["u-db-1"].workload_type()),
            "Deployment".into(),
        ),
        (
            "u-db-1",
            "workload name",
            workloads["u-db-1"].workload_name.clone(),
            "db".into(),
        ),
        (
            "u-db-1",
            "canonical name",
            workloads["u-db-1"].canonical_name.clone(),
            "database".into(),
        ),
        (
            "u-db-1",
            "canonical revision",
            workloads["u-db-1"].canonical_revision.clone(),
            "14".into(),
        ),
    ];
    for (uid, field, got, want) in cases {
        assert_eq!(got, want, "{uid} {field}");
    }
}

#[test]
fn services_list_their_endpoints_and_become_resources() {
    let mesh = format!(
        "{PODS}services:
- {{name: web, namespace: shop, hostname: web.shop.svc.cluster.local, vips: [10.96.0.1, net-2/10.96.0.2],
   ports: {{80: 8080, 443: 8443}}, selector: {{app: web}}}}
- {{name: front, namespace: shop, hostname: front.shop.svc.cluster.local, ports: {{81: 8081}},
   selector: {{tier: front, app: web}}}}
- {{name: db, namespace: shop, hostname: db.shop.svc.cluster.local, ports: {{5432: 5432}},
   endpoints: [u-db-1, u-done]}}
- {{name: empty, namespace: shop, hostname: empty.shop.svc.cluster.local, ports: {{1: 1}}}}
"
    );
    let (workloads, services) = convert(&mesh);
    let keys = |uid: &str| {
        let mut keys: Vec<&str> = workloads[uid].services.keys().map(String::as_str).collect();
        keys.sort_unstable();
        keys
    };
    // (uid, the services it is an endpoint of)
    let cases: [(&str, &[&str]); 4] = [
        (
            "u-web-1",
            &[
                "shop/front.shop.svc.cluster.local",
                "shop/web.shop.svc.cluster.local",
            ],
        ),
        ("u-web-2", &[]), // Pending: not an endpoint
        ("u-web-o", &[]), // another namespace
        ("u-db-1", &["shop/db.shop.svc.cluster.local"]),
    ];
    for (uid, want) in cases {
        assert_eq!(keys(uid), want, "{uid}");
    }
    let ports = &workloads["u-web-1"].services["shop/web.shop.svc.cluster.local"].ports;
    let pairs: Vec<(u32, u32)> = ports
        .iter()
        .map(|p| (p.service_port, p.target_port))
        .collect();
    assert_eq!(pairs, [(80, 8080), (443, 8443)]);

    let web = &services["shop/web.shop.svc.cluster.local"];
    assert_eq!(web.name, "web");
    assert_eq!(web.namespace, "shop");
    let vips: Vec<(&str, &[u8], Option<u32>)> = web
        .addresses
        .iter()
        .map(|a| (a.network.as_str(), a.address.as_slice(), a.length))
        .collect();
    assert_eq!(
        vips,
        [
            ("", &[10, 96, 0, 1][..], None),
            ("net-2", &[10, 96, 0, 2][..], None)
        ]
    );
    assert_eq!(web.ports.len(), 2);
    assert_eq!(
        services.len(),
        4,
        "a service without endpoints is still served"
    );
}

#[test]
fn workload_selector_policies_attach_to_the_pods_they_select() {
    let mesh = format!(
        "{PODS}policies:
- {{name: web-v2, namespace: shop, scope: WorkloadSelector, selector: {{app: web, version: v2}}, action: Allow}}
- {{name: all-web, namespace: shop, scope: WorkloadSelector, selector: {{app: web}}, action: Deny}}
- {{name: whole-ns, namespace: shop, scope: WorkloadSelector, selector: {{}}, action: Deny}}
- {{name: ns, namespace: shop, scope: Namespace, action: Allow}}
- {{name: global, namespace: istio-system, scope: Global, action: Allow}}
"
    );
    let (workloads, _) = convert(&mesh);
    // (uid, the policies it lists, sorted)
    let cases: [(&str, &[&str]); 4] = [
        ("u-web-1", &["shop/all-web", "shop/web-v2", "shop/whole-ns"]),
        ("u-web-2", &["shop/all-web", "shop/whole-ns"]), // Pending pods are protected too
        ("u-web-o", &[]),                                // another namespace
        ("u-db-1", &["shop/whole-ns"]),
    ];
    for (uid, want) in cases {
        assert_eq!(workloads[uid].authorization_policies, want, "{uid}");
    }
}

#[test]
fn peer_auth_workloads_list_the_policies_their_peer_authentications_make() {
    let mesh = format!(
        "{PODS}policies:
- {{name: all-web, namespace: shop, scope: WorkloadSelector, selector: {{app: web}}, action: Deny}}
peerAuthentications:
- {{name: default, namespace: shop, mode: Strict}}
- {{name: web-v2, namespace: shop, selector: {{version: v2}}, portLevelMtls: {{9090: Permissive}}}}
"
    );
    let (workloads, _) = convert(&mesh);
    // (uid, the policies it lists: selector ones sorted, then the
    // PeerAuthentications', as istiod appends them)
    let cases: [(&str, &[&str]); 4] = [
        (
            "u-web-1",
            &["shop/all-web", "shop/converted_peer_authentication_web-v2"],
        ),
        (
            "u-web-2",
            &["shop/all-web", "istio-system/istio_converted_static_strict"],
        ),
        ("u-web-o", &[]), // another namespace, no PeerAuthentication
        ("u-db-1", &["istio-system/istio_converted_static_strict"]),
    ];
    for (uid, want) in cases {
        assert_eq!(workloads[uid].authorization_policies, want, "{uid}");
    }

    let authorizations: HashMap<String, Authorization> =
        authorizations(&snapshot(&mesh)).into_iter().collect();
    let strict = &authorizations["istio-system/istio_converted_static_strict"];
    assert_eq!(strict.scope, Scope::WorkloadSelector as i32);
    assert_eq!(strict.action, proto_security::Action::Deny as i32);
    let refused = &strict.rules[0].clauses[0].matches[0].not_principals[0];
    assert_eq!(
        refused.match_type,
        Some(MatchType::Presence(())),
        "peers without an identity"
    );
    let exception = &authorizations["shop/converted_peer_authentication_web-v2"];
    let clauses: Vec<&proto_security::Match> = exception.rules[0]
        .clauses
        .iter()
        .map(|clause| &clause.matches[0])
        .collect();
    assert_eq!(clauses[0].not_destination_ports, [9090]);
    assert_eq!(clauses[1].not_principals.len(), 1);
    assert_eq!(authorizations.len(), 3);
}

#[test]
fn policies_become_authorizations() {
    let mesh = "policies:
- name: p
  namespace: shop
  scope: WorkloadSelector
  selector: {app: web}
  action: Deny
  dryRun: true
  rules:
  - - - principals: [!Exact a, !Prefix b, !Suffix c, Presence]
        notNamespaces: [!Exact x]
        sourceIps: [10.1.0.0/16, 'fd00::/8']
        notDestinationIps: [10.2.0.1]
        destinationPorts: [8080]
        notDestinationPorts: [22]
        serviceAccounts: [{namespace: shop, serviceAccount: web}]
      - {}
    - []
  - []
";
    let all = authorizations(&snapshot(mesh));
    let [(name, policy)] = &all[..] else {
        panic!("one policy: {all:?}")
    };
    assert_eq!(name, "shop/p");
    assert_eq!(
        (policy.name.as_str(), policy.namespace.as_str()),
        ("p", "shop")
    );
    assert_eq!(policy.scope(), Scope::WorkloadSelector);
    assert_eq!(policy.action(), proto_security::Action::Deny);
    assert!(policy.dry_run);
    let shape: Vec<Vec<usize>> = policy
        .rules
        .iter()
        .map(|rule| rule.clauses.iter().map(|c| c.matches.len()).collect())
        .collect();
    assert_eq!(
        shape,
        [vec![2, 0], vec![]],
        "rules → clauses → matches kept"
    );

    let first = &policy.rules[0].clauses[0].matches[0];
    let kinds: Vec<Option<MatchType>> = first
        .principals
        .iter()
        .map(|m| m.match_type.clone())
        .collect();
    assert_eq!(
        kinds,
        [
            Some(MatchType::Exact("a".into())),
            Some(MatchType::Prefix("b".into())),
            Some(MatchType::Suffix("c".into())),
            Some(MatchType::Presence(())),
        ]
    );
    assert_eq!(first.not_namespaces.len(), 1);
    assert_eq!(
        first.source_ips,
        [
            PolicyAddress {
                address: vec![10, 1, 0, 0],
                length: 16
            },
            PolicyAddress {
                address: "fd00::"
                    .parse::<std::net::Ipv6Addr>()
                    .unwrap()
                    .octets()
                    .to_vec(),
                length: 8
            },
        ]
    );
    assert_eq!(
        first.not_destination_ips,
        [PolicyAddress {
            address: vec![10, 2, 0, 1],
            length: 32
        }]
    );
    assert_eq!(
        (
            first.destination_ports.clone(),
            first.not_destination_ports.clone()
        ),
        (vec![8080], vec![22])
    );
    assert_eq!(first.service_accounts[0].service_account, "web");
}

#[test]
fn workload_encoding_is_canonical() {
    let mut workload = Workload {
        uid: "u".into(),
        ..Workload::default()
    };
    for port in 0..16u32 {
        workload.services.insert(
            format!("ns/svc-{port}"),
            PortList {
                ports: vec![Port {
                    service_port: port,
                    target_port: port + 1,
                    ..Port::default()
                }],
            },
        );
    }
    let address = Address {
        r#type: Some(address::Type::Workload(workload)),
    };
    let first = encode_address(address.clone());
    assert_eq!(
        Address::decode(first.as_slice()).unwrap(),
        address,
        "decodes to the same message"
    );
    for _ in 0..16 {
        // A fresh HashMap iterates in another order.
        let Some(address::Type::Workload(original)) = &address.r#type else {
            unreachable!()
        };
        let rebuilt = Workload {
            services: original.services.clone().into_iter().collect(),
            ..original.clone()
        };
        let bytes = encode_address(Address {
            r#type: Some(address::Type::Workload(rebuilt)),
        });
        assert_eq!(bytes, first);
    }
}

/// A Kubernetes object from its JSON.
fn kube<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> std::sync::Arc<T> {
    std::sync::Arc::new(serde_json::from_value(value).unwrap())
}

/// A Running, Ready pod on node-a serving a port named `http`, with
/// `metadata` keys added to its metadata.
fn kube_pod(
    namespace: &str,
    name: &str,
    ip: &str,
    metadata: serde_json::Value,
) -> serde_json::Value {
    let mut pod = serde_json::json!({
        "metadata": {"name": name, "namespace": namespace, "uid": format!("u-{name}")},
        "spec": {"nodeName": "node-a", "serviceAccountName": "web", "containers": [
            {"name": "app", "ports": [{"name": "http", "containerPort": 8080}]}]},
        "status": {"phase": "Running", "podIPs": [{"ip": ip}],
                   "conditions": [{"type": "Ready", "status": "True"}]},
    });
    if let (Some(into), serde_json::Value::Object(extra)) =
        (pod["metadata"].as_object_mut(), metadata)
    {
        into.extend(extra);
    }
    pod
}

#[test]
fn a_converted_kubernetes_cluster_gives_istiods_workload_fields() {
    use serde_json::json;
    use ztunnel_mesh::kube::convert::{ConvertSettings, KubeObjects, convert};
    use ztunnel_proto::istio::workload::{Locality, NetworkMode, load_balancing};

    let web = kube_pod(
        "shop",
        "web-7d4b9-abc",
        "10.0.0.1",
        json!({
            "generateName": "web-7d4b9-",
            "labels": {"app": "web", "pod-template-hash": "7d4b9"},
            "annotations": {"ambient.istio.io/redirection": "enabled"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d4b9",
                                 "uid": "rs", "controller": true}],
        }),
    );
    let mut starting = kube_pod(
        "shop",
        "web-starting",
        "10.0.0.2",
        json!({"labels": {"app": "web"}}),
    );
    starting["status"] = json!({"phase": "Pending", "podIPs": [{"ip": "10.0.0.2"}]});
    starting["spec"]["containers"] = json!([]);
    let mut native = kube_pod(
        "shop",
        "backup-29012345-x",
        "192.168.0.10",
        json!({
            "generateName": "backup-29012345-",
            "labels": {"networking.istio.io/tunnel": "http"},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "backup-29012345",
                                 "uid": "job", "controller": true}],
        }),
    );
    native["spec"]["hostNetwork"] = json!(true);
    let elsewhere = kube_pod(
        "other",
        "api",
        "10.0.1.1",
        json!({"labels": {"app": "web"}}),
    );
    let mut done = kube_pod(
        "shop",
        "done",
        "10.0.0.3",
        json!({"labels": {"app": "web"}}),
    );
    done["status"]["phase"] = json!("Succeeded");

    let objects = KubeObjects {
        pods: [web, starting, native, elsewhere, done].map(kube).to_vec(),
        nodes: vec![kube(json!({"metadata": {"name": "node-a", "labels": {
            "topology.kubernetes.io/region": "eu", "topology.kubernetes.io/zone": "eu-1"}}}))],
        services: vec![kube(json!({
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {"clusterIPs": ["10.96.0.1"], "selector": {"app": "web"},
                     "internalTrafficPolicy": "Local",
                     "ports": [{"name": "http", "port": 80, "targetPort": "http"},
                               {"name": "tls-admin", "port": 443, "targetPort": 8443}]},
        }))],
        authorization_policies: vec![
            kube(
                json!({"metadata": {"name": "mesh-web", "namespace": "istio-system"},
                        "spec": {"selector": {"matchLabels": {"app": "web"}}}}),
            ),
            kube(json!({"metadata": {"name": "local", "namespace": "shop"},
                        "spec": {"selector": {"matchLabels": {"app": "web"}}, "action": "DENY"}})),
        ],
        ..KubeObjects::default()
    };
    let conversion = convert(&objects, &ConvertSettings::default());
    assert_eq!(conversion.problems, []);
    let snapshot = MeshSnapshot::new(conversion.mesh).unwrap();
    let mut workloads = HashMap::new();
    let mut services = HashMap::new();
    for (name, resource) in addresses(&snapshot, TD) {
        match resource.r#type {
            Some(address::Type::Workload(workload)) => {
                assert_eq!(name, workload.uid, "resource name = uid");
                workloads.insert(name, workload);
            }
            Some(address::Type::Service(service)) => {
                services.insert(name, service);
            }
            None => panic!("{name}: empty Address"),
        }
    }
    let mut uids: Vec<&str> = workloads.keys().map(String::as_str).collect();
    uids.sort_unstable();
    assert_eq!(
        uids,
        [
            "Kubernetes//Pod/other/api",
            "Kubernetes//Pod/shop/backup-29012345-x",
            "Kubernetes//Pod/shop/web-7d4b9-abc",
            "Kubernetes//Pod/shop/web-starting",
        ],
        "live pods with an IP, named <cluster>//Pod/<ns>/<name>"
    );

    let hostname = "shop/web.shop.svc.cluster.local";
    let ports = |pairs: &[(u32, u32)]| PortList {
        ports: pairs
            .iter()
            .map(|(service_port, target_port)| Port {
                service_port: *service_port,
                target_port: *target_port,
                ..Port::default()
            })
            .collect(),
    };
    let want = Workload {
        uid: "Kubernetes//Pod/shop/web-7d4b9-abc".into(),
        name: "web-7d4b9-abc".into(),
        namespace: "shop".into(),
        addresses: vec![vec![10, 0, 0, 1]],
        tunnel_protocol: TunnelProtocol::Hbone as i32,
        trust_domain: String::new(), // cluster.local is sent empty
        service_account: "web".into(),
        node: "node-a".into(),
        canonical_name: "web".into(),
        canonical_revision: "latest".into(),
        workload_type: WorkloadType::Pod as i32,
        workload_name: "web".into(), // the ReplicaSet minus its hash
        authorization_policies: vec!["istio-system/mesh-web".into(), "shop/local".into()],
        status: WorkloadStatus::Healthy as i32,
        cluster_id: "Kubernetes".into(),
        services: [(hostname.to_owned(), ports(&[(80, 8080), (443, 8443)]))].into(),
        locality: Some(Locality {
            region: "eu".into(),
            zone: "eu-1".into(),
            subzone: String::new(),
        }),
        network_mode: NetworkMode::Standard as i32,
        ..Workload::default()
    };
    assert_eq!(workloads["Kubernetes//Pod/shop/web-7d4b9-abc"], want);

    let starting = &workloads["Kubernetes//Pod/shop/web-starting"];
    assert_eq!(starting.status(), WorkloadStatus::Unhealthy, "not ready");
    assert_eq!(
        starting.tunnel_protocol(),
        TunnelProtocol::None,
        "not captured"
    );
    assert_eq!(
        starting.services[hostname],
        ports(&[(443, 8443)]),
        "a member while starting; no port named http, so port 80 is left out for it"
    );

    let native = &workloads["Kubernetes//Pod/shop/backup-29012345-x"];
    assert_eq!(
        (
            native.tunnel_protocol(),
            native.native_tunnel,
            native.network_mode()
        ),
        (TunnelProtocol::Hbone, true, NetworkMode::HostNetwork)
    );
    assert_eq!(
        (
            native.workload_name.as_str(),
            native.canonical_name.as_str()
        ),
        ("backup", "backup"),
        "the CronJob of its Job; canonical name falls back to it"
    );
    assert_eq!(
        workloads["Kubernetes//Pod/other/api"].authorization_policies,
        ["istio-system/mesh-web"],
        "a root-namespace selector policy attaches across namespaces"
    );

    let service = &services[hostname];
    let service_ports: Vec<(u32, u32, i32)> = service
        .ports
        .iter()
        .map(|port| (port.service_port, port.target_port, port.app_protocol))
        .collect();
    assert_eq!(
        service_ports,
        [
            (80, 0, proto_workload::AppProtocol::Http11 as i32), // named target: 0
            (443, 8443, proto_workload::AppProtocol::Tls as i32),
        ]
    );
    let balancing = service.load_balancing.as_ref().unwrap();
    assert_eq!(
        (balancing.routing_preference.as_slice(), balancing.mode()),
        (
            &[load_balancing::Scope::Node as i32][..],
            load_balancing::Mode::Strict
        )
    );
    assert!(service.canonical);
    assert_eq!(service.ip_families(), proto_workload::IpFamilies::Automatic);
}

mod entries;
