//! `/config_dump` read back by a strict reader written from AMBIENT.md §6
//! (what istio/ztunnel prints and istioctl reads), not from our renderer:
//! unknown keys and missing required keys are refused, enum values are
//! checked by name, and every level's keys must come sorted.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use ztunnel_certs::cert::WorkloadCertificate;
use ztunnel_certs::csr::CertRequest;
use ztunnel_certs::identity::Identity;
use ztunnel_certs::issuer::{Issuer, SigningMaterial, SigningRequest, generate_root};

use super::*;
use crate::config::WorkloadInfo;
use crate::identity::manager::CertificateState;
use crate::tracker::ShownProtocol;

mod reader;

use reader::{
    ActionRead, ApplicationTunnelRead, CidrVipRead, ConnectionProtocolRead, ConnectionRead,
    ConnectionsRead, EndpointRead, GatewayRead, HealthPolicyRead, IpFamiliesRead, LoadBalancerRead,
    LocalityRead, MatchRead, ModeRead, NetworkModeRead, PodInfoRead, PodStateName, PolicyScopeRead,
    Protocol, ScopeRead, ServiceAccountRead, Sorted, Status, StringMatchRead, Top, VisibilityRead,
    WeightedWaypointRead, WorkloadTypeRead,
};

// ---- The mesh under test. ----

/// Every resource kind with its optional parts: a workload behind a
/// waypoint, one behind a network gateway, a service with endpoints, a
/// waypoint, a weighted split and a load balancer, policies with each match.
const MESH: &str = r#"
workloads:
- uid: Kubernetes//Pod/default/server-0
  name: server-0
  namespace: default
  serviceAccount: server
  workloadIps: ["10.0.0.10", "fd00::10"]
  protocol: HBONE
  node: node-b
  canonicalName: server
  canonicalRevision: v1
  workloadName: server
  workloadType: deployment
  authorizationPolicies: [default/allow-client]
  locality: {region: eu, zone: eu-1}
  waypoint:
    destination: {namespace: default, hostname: waypoint.default.svc.cluster.local}
  services:
    default/server.default.svc.cluster.local: {80: 8080}
- uid: Kubernetes//Pod/remote/db-0
  name: db-0
  namespace: remote
  trustDomain: example.org
  clusterId: east
  network: net-east
  workloadIps: ["10.1.0.5"]
  protocol: HBONE
  workloadType: pod
  applicationTunnel: {protocol: PROXY}
  networkGateway: {destination: "net-east/192.0.2.1", hboneMtlsPort: 15009}
  services: {}
- uid: Kubernetes//Pod/legacy/plain-0
  name: plain-0
  namespace: legacy
  workloadIps: ["10.0.0.20"]
  networkMode: HostNetwork
  status: Unhealthy
  capacity: 2
  nativeTunnel: true
  services:
    default/server.default.svc.cluster.local: {80: 9090}

services:
- name: server
  namespace: default
  hostname: server.default.svc.cluster.local
  vips: ["/10.96.0.10", "net-east/10.97.0.10"]
  cidrVips: ["net-east/10.129.0.0/16"]
  ports: {80: 8080, 443: 0}
  subjectAltNames: ["spiffe://cluster.local/ns/default/sa/server-canary"]
  waypoint: {destination: "/10.0.0.99", hboneMtlsPort: 15008}
  weightedWaypoints:
  - destination: {destination: "/10.0.0.98"}
    weight: 3
  loadBalancer:
    routingPreferences: [Zone, Network]
    mode: Failover
    healthPolicy: OnlyHealthy
  ipFamilies: Dual
  canonical: true
  visibility: Namespace

policies:
- name: allow-client
  namespace: default
  scope: WorkloadSelector
  action: Allow
  rules:
  - - - principals: [!Exact "cluster.local/ns/client/sa/client"]
        notPrincipals: [!Prefix "cluster.local/ns/evil/"]
        namespaces:
        - !Suffix "-prod"
        - !Presence
        serviceAccounts: [{namespace: client, serviceAccount: client}]
        sourceIps: ["10.0.0.0/8"]
        notDestinationIps: ["fd00::/8"]
        destinationPorts: [8080]
- name: deny-legacy
  namespace: istio-system
  scope: Global
  action: Deny
  dryRun: true
  rules:
  - - - namespaces: [!Exact legacy]
"#;

/// 2026-01-02T03:06:05Z: certificates are signed then, valid from two
/// minutes before (the issuer's backdating) for an hour.
const SIGNED_AT: u64 = 1_767_323_165;

fn state() -> State {
    crate::config::local::parse(MESH, Path::new("mesh.yaml"))
        .unwrap_or_else(|error| panic!("{error}"))
        .into_state()
}

fn certificate(identity: &Identity) -> WorkloadCertificate {
    let now = UNIX_EPOCH + Duration::from_secs(SIGNED_AT);
    let root = generate_root("cluster.local", now).unwrap();
    let issuer = Issuer::new(&SigningMaterial {
        root_cert_pem: root.cert_pem,
        root_key_pem: Some(root.key_pem),
        ..SigningMaterial::default()
    })
    .unwrap();
    let request = CertRequest::generate(identity).unwrap();
    let signing = SigningRequest::from_pem(request.csr_pem()).unwrap();
    let chain = issuer
        .sign_workload(&signing, identity, Duration::from_secs(3600), now)
        .unwrap();
    WorkloadCertificate::from_ca_response(&chain, request.private_key(), Some(identity)).unwrap()
}

fn summaries() -> Vec<CertificateSummary> {
    let available: Identity = "spiffe://cluster.local/ns/default/sa/server"
        .parse()
        .unwrap();
    let failing: Identity = "spiffe://cluster.local/ns/legacy/sa/default"
        .parse()
        .unwrap();
    let pending: Identity = "spiffe://cluster.local/ns/remote/sa/default"
        .parse()
        .unwrap();
    vec![
        CertificateSummary {
            certificate: Some(Arc::new(certificate(&available))),
            identity: available,
            state: CertificateState::Available,
            refresh_at: None,
        },
        CertificateSummary {
            identity: failing,
            state: CertificateState::Failed {
                error: "CA unreachable".to_owned(),
                attempts: 2,
            },
            certificate: None,
            refresh_at: Some(SystemTime::now()),
        },
        CertificateSummary {
            identity: pending,
            state: CertificateState::Pending,
            certificate: None,
            refresh_at: None,
        },
    ]
}

/// The running pod's connections: inbound over HBONE and plaintext,
/// outbound each way a connection leaves.
fn connections() -> ConnectionsShown {
    let item = |src: &str, original_dst: Option<&str>, actual_dst: &str, protocol| Shown {
        src: src.parse().unwrap(),
        original_dst: original_dst.map(|addr| addr.parse().unwrap()),
        actual_dst: actual_dst.parse().unwrap(),
        protocol,
    };
    ConnectionsShown {
        inbound: vec![
            item("10.0.0.9:41000", None, "10.0.0.1:8080", ShownProtocol::Tcp),
            item(
                "10.0.0.7:40000",
                Some("10.0.0.1:8080"),
                "10.0.0.1:8080",
                ShownProtocol::Hbone,
            ),
        ],
        outbound: vec![
            item(
                "10.0.0.1:50002",
                Some("10.96.0.30:80"),
                "10.0.0.30:80",
                ShownProtocol::Tcp,
            ),
            item(
                "10.0.0.1:50001",
                Some("10.96.0.20:80"),
                "172.16.0.1:15008",
                ShownProtocol::DoubleHbone,
            ),
            item(
                "10.0.0.1:50000",
                Some("10.96.0.10:80"),
                "10.0.0.2:15008",
                ShownProtocol::Hbone,
            ),
        ],
    }
}

/// A running pod and one whose proxy has stopped.
fn pods() -> Vec<(PodInfo, Option<ConnectionsShown>)> {
    let pod = |uid: &str, name: &str| PodInfo {
        uid: uid.into(),
        workload: WorkloadInfo {
            namespace: "default".into(),
            name: name.into(),
            service_account: "server".into(),
        },
    };
    vec![
        (pod("0d2c-pod-uid", "server-0"), Some(connections())),
        (pod("1e3f-pod-uid", "server-1"), None),
    ]
}

fn config() -> Config {
    let mut config = Config::from_args(["ztunnel"]).unwrap();
    config.istio_version = "1.28.0".to_owned();
    config.drain_deadline = Duration::from_millis(25_500);
    config
}

/// The dump as the admin server sends it, read strictly.
fn read(pods: Option<&[(PodInfo, Option<ConnectionsShown>)]>) -> (Top, String) {
    read_with_file(pods, None)
}

/// [`read`], with `file` as the local file's content.
fn read_with_file(
    pods: Option<&[(PodInfo, Option<ConnectionsShown>)]>,
    file: Option<&State>,
) -> (Top, String) {
    let rendered = render(&state(), file, &summaries(), pods, &config());
    let text = serde_json::to_string_pretty(&rendered).unwrap();
    serde_json::from_str::<Sorted>(&text).unwrap_or_else(|error| panic!("unsorted: {error}"));
    let top = serde_json::from_str(&text).unwrap_or_else(|error| panic!("{error}\n{text}"));
    (top, text)
}

// ---- What a reader of each kind finds. ----

#[test]
fn every_workload_reads_with_its_waypoint_gateway_and_defaults() {
    let (dump, _) = read(None);
    let uids: Vec<_> = dump.workloads.iter().map(|w| w.uid.as_deref()).collect();
    assert_eq!(
        uids,
        [
            Some("Kubernetes//Pod/default/server-0"),
            Some("Kubernetes//Pod/legacy/plain-0"),
            Some("Kubernetes//Pod/remote/db-0"),
        ],
        "sorted by uid"
    );
    let [server, plain, db] = &dump.workloads[..] else {
        unreachable!()
    };

    assert_eq!(
        (server.name.as_str(), server.namespace.as_str()),
        ("server-0", "default")
    );
    assert_eq!(server.protocol, Protocol::Hbone);
    assert_eq!(server.workload_name.as_deref(), Some("server"));
    assert_eq!(server.canonical_revision.as_deref(), Some("v1"));
    assert_eq!(server.workload_ips.len(), 2);
    assert_eq!(
        server.waypoint,
        Some(GatewayRead {
            destination: "default/waypoint.default.svc.cluster.local".to_owned(),
            hbone_mtls_port: 15008,
        }),
        "a hostname waypoint reads as namespace/hostname"
    );
    assert_eq!(server.network_gateway, None);
    assert_eq!(server.status, Status::Healthy);
    assert_eq!(server.network_mode, NetworkModeRead::Standard);
    assert_eq!(server.workload_type, Some(WorkloadTypeRead::Deployment));
    assert_eq!(server.service_account.as_deref(), Some("server"));
    assert_eq!(server.trust_domain.as_deref(), Some("cluster.local"));
    assert_eq!(server.cluster_id, "Kubernetes");
    assert_eq!(server.node.as_deref(), Some("node-b"));
    assert_eq!(server.canonical_name.as_deref(), Some("server"));
    assert_eq!(
        server.services.as_deref(),
        Some(&["default/server.default.svc.cluster.local".to_owned()][..])
    );
    assert_eq!(
        server.authorization_policies.as_deref(),
        Some(&["default/allow-client".to_owned()][..])
    );
    assert_eq!(
        server.locality,
        Some(LocalityRead {
            region: "eu".into(),
            zone: "eu-1".into(),
            subzone: String::new()
        })
    );
    assert_eq!(server.capacity, 1);

    assert_eq!(
        db.network_gateway,
        Some(GatewayRead {
            destination: "net-east/192.0.2.1".to_owned(),
            hbone_mtls_port: 15009,
        }),
        "an address gateway reads as network/ip"
    );
    assert_eq!(db.network.as_deref(), Some("net-east"));
    assert_eq!(db.cluster_id, "east");
    assert_eq!(db.trust_domain.as_deref(), Some("example.org"));
    assert_eq!(
        db.application_tunnel,
        Some(ApplicationTunnelRead {
            protocol: "PROXY".into(),
            port: None
        }),
        "no port reads as null"
    );
    assert_eq!(db.services, None, "no services: the key is left out");

    assert_eq!(plain.protocol, Protocol::Tcp);
    assert_eq!(plain.network_mode, NetworkModeRead::HostNetwork);
    assert_eq!(plain.status, Status::Unhealthy);
    assert_eq!(plain.native_tunnel, Some(true));
    assert_eq!(plain.capacity, 2);
    assert_eq!(plain.locality, None);
    assert_eq!(plain.hostname, None);
}

#[test]
fn a_service_reads_with_vips_ports_endpoints_and_waypoints() {
    let (dump, _) = read(None);
    let [service] = &dump.services[..] else {
        panic!("one service: {:?}", dump.services)
    };
    assert_eq!(service.name, "server");
    assert_eq!(service.namespace, "default");
    assert_eq!(service.hostname, "server.default.svc.cluster.local");
    assert_eq!(service.vips, ["/10.96.0.10", "net-east/10.97.0.10"]);
    assert_eq!(
        service.cidr_vips,
        Some(vec![CidrVipRead {
            network: "net-east".into(),
            cidr: "10.129.0.0/16".into()
        }])
    );
    assert_eq!(service.ports, BTreeMap::from([(80, 8080), (443, 0)]));
    assert_eq!(
        service.endpoints.keys().collect::<Vec<_>>(),
        ["Kubernetes//Pod/default/server-0"],
        "the unhealthy workload is not an endpoint under OnlyHealthy"
    );
    assert_eq!(
        service.endpoints["Kubernetes//Pod/default/server-0"],
        EndpointRead {
            workload_uid: "Kubernetes//Pod/default/server-0".into(),
            port: BTreeMap::from([(80, 8080)]),
            status: Status::Healthy,
        }
    );
    assert_eq!(
        service.subject_alt_names,
        ["spiffe://cluster.local/ns/default/sa/server-canary"]
    );
    assert_eq!(
        service.waypoint.as_ref().map(|w| w.destination.as_str()),
        Some("/10.0.0.99"),
        "istioctl cuts vips and waypoint addresses at the first /"
    );
    assert_eq!(
        service.weighted_waypoints,
        Some(vec![WeightedWaypointRead {
            destination: GatewayRead {
                destination: "/10.0.0.98".into(),
                hbone_mtls_port: 15008
            },
            weight: 3,
        }])
    );
    assert_eq!(
        service.load_balancer,
        Some(LoadBalancerRead {
            routing_preferences: vec![ScopeRead::Zone, ScopeRead::Network],
            mode: ModeRead::Failover,
            health_policy: HealthPolicyRead::OnlyHealthy,
        })
    );
    assert_eq!(service.ip_families, Some(IpFamiliesRead::Dual));
    assert!(service.canonical);
    assert_eq!(service.visibility, VisibilityRead::Namespace);
}

#[test]
fn policies_read_with_their_rules_three_arrays_deep() {
    let (dump, _) = read(None);
    let [allow, deny] = &dump.policies[..] else {
        panic!("two policies: {:?}", dump.policies)
    };
    assert_eq!(
        (
            allow.name.as_str(),
            &allow.scope,
            &allow.action,
            allow.dry_run
        ),
        (
            "allow-client",
            &PolicyScopeRead::WorkloadSelector,
            &ActionRead::Allow,
            false
        )
    );
    assert_eq!(
        allow.rules,
        [[[MatchRead {
            namespaces: Some(vec![
                StringMatchRead::Suffix("-prod".into()),
                StringMatchRead::Presence([]),
            ]),
            principals: Some(vec![StringMatchRead::Exact(
                "cluster.local/ns/client/sa/client".into()
            )]),
            not_principals: Some(vec![StringMatchRead::Prefix(
                "cluster.local/ns/evil/".into()
            )]),
            service_accounts: Some(vec![ServiceAccountRead {
                namespace: "client".into(),
                service_account: "client".into(),
            }]),
            source_ips: Some(vec!["10.0.0.0/8".into()]),
            not_destination_ips: Some(vec!["fd00::/8".into()]),
            destination_ports: Some(vec![8080]),
            ..MatchRead::default()
        }]]]
    );
    assert_eq!(
        (
            deny.namespace.as_str(),
            &deny.scope,
            &deny.action,
            deny.dry_run
        ),
        (
            "istio-system",
            &PolicyScopeRead::Global,
            &ActionRead::Deny,
            true
        )
    );
}

#[test]
fn certificates_read_with_chain_roots_serials_and_validity_and_no_key() {
    let (dump, text) = read(None);
    let states: Vec<_> = dump.certificates.iter().map(|c| c.state.as_str()).collect();
    assert_eq!(
        states,
        ["Available", "Unavailable: CA unreachable", "Initializing"]
    );
    let available = &dump.certificates[0];
    assert_eq!(
        available.identity,
        "spiffe://cluster.local/ns/default/sa/server"
    );
    let [leaf] = &available.cert_chain[..] else {
        panic!("the leaf alone: {:?}", available.cert_chain)
    };
    let [root] = &available.root_certs[..] else {
        panic!("one root: {:?}", available.root_certs)
    };
    assert_eq!(leaf.valid_from, "2026-01-02T03:04:05Z");
    assert_eq!(leaf.expiration_time, "2026-01-02T04:06:05Z");
    assert_eq!(root.valid_from, "2026-01-02T03:04:05Z");
    for cert in [leaf, root] {
        let pem = base64::engine::general_purpose::STANDARD
            .decode(&cert.pem)
            .unwrap();
        let pem = String::from_utf8(pem).unwrap();
        assert!(pem.starts_with("-----BEGIN CERTIFICATE-----\n"), "{pem}");
        assert!(
            !cert.serial_number.is_empty()
                && cert.serial_number.bytes().all(|b| b.is_ascii_digit()),
            "decimal serial: {}",
            cert.serial_number
        );
    }
    assert_ne!(leaf.serial_number, root.serial_number);
    assert!(dump.certificates[1].cert_chain.is_empty());
    assert!(!text.contains("PRIVATE"), "no key in the dump");
}

#[test]
fn the_top_level_has_istios_keys_and_pods_only_in_shared_mode() {
    let (dedicated, _) = read(None);
    assert!(dedicated.workload_state.is_none());
    assert!(dedicated.staged_services.is_empty());
    assert!(dedicated.static_config.workloads.is_empty());
    assert!(dedicated.static_config.services.is_empty());
    assert!(dedicated.static_config.policies.is_empty());
    assert_eq!(dedicated.version.version, env!("CARGO_PKG_VERSION"));
    assert_eq!(dedicated.version.istio_version, "1.28.0");
    assert!(!dedicated.version.git_revision.is_empty());
    assert_eq!(dedicated.config.self_termination_deadline.secs, 25);
    assert_eq!(
        dedicated.config.self_termination_deadline.nanos,
        500_000_000
    );
    assert!(dedicated.config.num_worker_threads >= 1);

    let pods = pods();
    let (shared, _) = read(Some(&pods));
    let state = shared.workload_state.expect("workloadState in shared mode");
    let pod = &state["0d2c-pod-uid"];
    assert_eq!(
        pod.info,
        PodInfoRead {
            name: "server-0".into(),
            namespace: "default".into(),
            service_account: "server".into(),
        }
    );
    assert_eq!(pod.state, PodStateName::Up);
    assert!(
        pod.connections.is_some(),
        "a running proxy lists its connections"
    );
    assert!(
        state["1e3f-pod-uid"].connections.is_none(),
        "a stopped proxy has none"
    );
}

#[test]
fn a_pods_connections_are_listed_by_direction_sorted_by_source() {
    let pods = pods();
    let (shared, _) = read(Some(&pods));
    let state = shared.workload_state.expect("workloadState in shared mode");
    let item = |src: &str, original_dst: Option<&str>, actual_dst: &str, protocol| ConnectionRead {
        src: src.parse().unwrap(),
        original_dst: original_dst.map(|addr| addr.parse().unwrap()),
        actual_dst: actual_dst.parse().unwrap(),
        protocol,
    };
    assert_eq!(
        state["0d2c-pod-uid"].connections,
        Some(ConnectionsRead {
            inbound: vec![
                item(
                    "10.0.0.7:40000",
                    Some("10.0.0.1:8080"),
                    "10.0.0.1:8080",
                    ConnectionProtocolRead::Hbone,
                ),
                item(
                    "10.0.0.9:41000",
                    None,
                    "10.0.0.1:8080",
                    ConnectionProtocolRead::Tcp,
                ),
            ],
            outbound: vec![
                item(
                    "10.0.0.1:50000",
                    Some("10.96.0.10:80"),
                    "10.0.0.2:15008",
                    ConnectionProtocolRead::Hbone,
                ),
                item(
                    "10.0.0.1:50001",
                    Some("10.96.0.20:80"),
                    "172.16.0.1:15008",
                    ConnectionProtocolRead::DoubleHbone,
                ),
                item(
                    "10.0.0.1:50002",
                    Some("10.96.0.30:80"),
                    "10.0.0.30:80",
                    ConnectionProtocolRead::Tcp,
                ),
            ],
        })
    );
}

#[test]
fn a_connection_item_must_have_every_key_and_no_other() {
    let pods = pods();
    let (_, text) = read(Some(&pods));
    let value: Value = serde_json::from_str(&text).unwrap();
    let inbound = &value["workloadState"]["0d2c-pod-uid"]["connections"]["inbound"];
    assert_eq!(inbound[1]["originalDst"], Value::Null, "shown as null");

    let mut extra = value.clone();
    extra["workloadState"]["0d2c-pod-uid"]["connections"]["inbound"][0]["surprise"] = json!(1);
    assert!(serde_json::from_value::<Top>(extra).is_err());

    let mut missing = value;
    if let Some(item) =
        missing["workloadState"]["0d2c-pod-uid"]["connections"]["inbound"][1].as_object_mut()
    {
        item.remove("originalDst");
    }
    assert!(serde_json::from_value::<Top>(missing).is_err());
}

#[test]
fn the_strict_reader_refuses_unknown_keys_and_missing_ones() {
    let (_, text) = read(None);
    let mut value: Value = serde_json::from_str(&text).unwrap();
    value["workloads"][0]["surprise"] = json!(1);
    assert!(serde_json::from_value::<Top>(value).is_err());

    let mut value: Value = serde_json::from_str(&text).unwrap();
    if let Some(service) = value["services"][0].as_object_mut() {
        service.remove("vips");
    }
    assert!(serde_json::from_value::<Top>(value).is_err());
}

#[test]
fn static_config_shows_the_local_file_in_the_same_shape() {
    let file = state();
    let (dump, _) = read_with_file(None, Some(&file));
    let statics = &dump.static_config;
    assert_eq!(statics.workloads.len(), 3);
    assert_eq!(statics.services.len(), 1);
    assert_eq!(statics.policies.len(), 2);
    assert_eq!(
        statics.workloads[0]
            .waypoint
            .as_ref()
            .map(|w| w.destination.as_str()),
        Some("default/waypoint.default.svc.cluster.local")
    );
}
