//! Local config file parsing: a realistic file, every form, and errors that
//! name the file, the line and what is wrong.

use std::net::IpAddr;
use std::path::Path;

use ztunnel_certs::error_chain::ErrorChain;

use super::*;
use crate::cidr::Cidr;
use crate::rbac::{Action, Scope, ServiceAccountMatch, StringMatch};
use crate::state::{
    ApplicationTunnelProtocol, HealthPolicy, IpFamilies, LoadBalancingMode, RoutingScope,
    Visibility, WorkloadType,
};
use crate::state::{
    Destination, GatewayDestination, HealthStatus, InboundProtocol, NamespacedHostname,
    NetworkMode, Workload, select_upstream,
};

const EXAMPLE: &str = r#"
# Two nodes' worth of workloads, one service, and policies.
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
  services:
    default/server.default.svc.cluster.local:
      80: 8080
- uid: Kubernetes//Pod/default/server-1
  name: server-1
  namespace: default
  serviceAccount: server
  workloadIps: ["10.0.0.11"]
  protocol: HBONE
  status: Unhealthy
  capacity: 2
  waypoint:
    destination: {namespace: default, hostname: waypoint.default.svc.cluster.local}
  services:
    default/server.default.svc.cluster.local: {80: 9090}
- uid: Kubernetes//Pod/legacy/db-0
  name: db-0
  namespace: legacy
  trustDomain: example.org
  clusterId: east
  network: net-east
  workloadIps: ["10.1.0.5"]
  networkMode: HostNetwork
  workloadType: pod
  hostname: db-0.legacy
  nativeTunnel: true
  applicationTunnel: {protocol: PROXY, port: 15088}
  networkGateway: {destination: "net-east/192.0.2.1", hboneMtlsPort: 15009}
  services: {}

services:
- name: server
  namespace: default
  hostname: server.default.svc.cluster.local
  vips: ["/10.96.0.10", "net-east/10.97.0.10"]
  cidrVips: ["10.128.0.0/16", "net-east/10.129.0.0/16"]
  ports: {80: 8080, 443: 0}
  subjectAltNames: ["spiffe://cluster.local/ns/default/sa/server-canary"]
  loadBalancer:
    routingPreferences: [Zone, Region]
    mode: Failover
    healthPolicy: OnlyHealthy
  ipFamilies: Dual
  canonical: true
  visibility: Namespace
  weightedWaypoints:
  - destination: {destination: "/10.0.0.99"}
    weight: 3
  endpoints: {}

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
        notNamespaces: [!Exact "kube-system"]
        serviceAccounts: [{namespace: client, serviceAccount: client}]
        notServiceAccounts: [{namespace: client, serviceAccount: banned}]
        sourceIps: ["10.0.0.0/8", "10.0.0.1"]
        notSourceIps: ["10.0.9.0/24"]
        destinationIps: ["10.0.0.10/32"]
        notDestinationIps: ["fd00::/8"]
        destinationPorts: [8080]
        notDestinationPorts: [9090]
- name: deny-legacy
  namespace: istio-system
  scope: Global
  action: Deny
  dryRun: true
  rules:
  - - - namespaces: [!Exact legacy]
- name: default-ns
  namespace: default
  scope: Namespace
  action: Allow
"#;

fn parse_example() -> LocalConfig {
    parse(EXAMPLE, Path::new("example.yaml")).unwrap_or_else(|error| panic!("{error}"))
}

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

fn key(text: &str) -> NamespacedHostname {
    text.parse().unwrap()
}

#[test]
fn workloads_parse_with_their_forms_and_defaults() {
    let config = parse_example();
    let [server, unhealthy, db] = &config.workloads[..] else {
        panic!("three workloads")
    };

    assert_eq!(server.uid.as_ref(), "Kubernetes//Pod/default/server-0");
    assert_eq!(*server.addresses, [ip("10.0.0.10"), ip("fd00::10")]);
    assert_eq!(server.protocol, InboundProtocol::Hbone);
    assert_eq!(
        server.identity.as_str(),
        "spiffe://cluster.local/ns/default/sa/server"
    );
    assert_eq!(server.group.cluster_id.as_ref(), "Kubernetes");
    assert_eq!(server.capacity, 1);
    assert_eq!(server.status, HealthStatus::Healthy);
    assert_eq!(server.group.locality.zone.as_ref(), "eu-1");
    assert_eq!(
        *server.authorization_policies,
        [Arc::<str>::from("default/allow-client")]
    );
    let ports = server
        .services
        .get(&key("default/server.default.svc.cluster.local"))
        .unwrap();
    assert_eq!(ports.get(&80), Some(&8080));

    assert_eq!(unhealthy.status, HealthStatus::Unhealthy);
    assert_eq!(unhealthy.capacity, 2);
    assert_eq!(
        unhealthy.waypoint.as_ref().unwrap().destination,
        GatewayDestination::Hostname(key("default/waypoint.default.svc.cluster.local"))
    );
    assert_eq!(unhealthy.waypoint.as_ref().unwrap().hbone_mtls_port, 15008);

    assert_eq!(
        db.protocol,
        InboundProtocol::Tcp,
        "TCP is the default protocol"
    );
    assert_eq!(
        db.identity.as_str(),
        "spiffe://example.org/ns/legacy/sa/default"
    );
    assert_eq!(db.group.cluster_id.as_ref(), "east");
    assert_eq!(db.network.as_ref(), "net-east");
    assert_eq!(db.network_mode, NetworkMode::HostNetwork);
    assert_eq!(db.group.workload_type, WorkloadType::Pod);
    assert!(db.native_tunnel);
    let tunnel = db.application_tunnel.unwrap();
    assert_eq!(
        (tunnel.protocol, tunnel.port),
        (ApplicationTunnelProtocol::Proxy, Some(15088))
    );
    let gateway = db.network_gateway.as_ref().unwrap();
    assert_eq!(gateway.hbone_mtls_port, 15009);
    assert!(
        matches!(&gateway.destination, GatewayDestination::Address(a) if a.to_string() == "net-east/192.0.2.1")
    );
}

#[test]
fn services_parse_with_vips_ports_and_balancing() {
    let config = parse_example();
    let [service] = &config.services[..] else {
        panic!("one service")
    };
    let vips: Vec<String> = service.vips.iter().map(ToString::to_string).collect();
    assert_eq!(vips, ["/10.96.0.10", "net-east/10.97.0.10"]);
    let cidrs: Vec<String> = service
        .cidr_vips
        .iter()
        .map(|vip| format!("{}/{}", vip.network, vip.cidr))
        .collect();
    assert_eq!(cidrs, ["/10.128.0.0/16", "net-east/10.129.0.0/16"]);
    assert_eq!(
        service
            .ports
            .iter()
            .map(|(s, t)| (*s, *t))
            .collect::<Vec<_>>(),
        [(80, 8080), (443, 0)]
    );
    assert_eq!(
        service.subject_alt_names[0].as_str(),
        "spiffe://cluster.local/ns/default/sa/server-canary"
    );
    let balancing = service.load_balancing.as_ref().unwrap();
    assert_eq!(
        balancing.routing_preferences,
        [RoutingScope::Zone, RoutingScope::Region]
    );
    assert_eq!(balancing.mode, LoadBalancingMode::Failover);
    assert_eq!(balancing.health_policy, HealthPolicy::OnlyHealthy);
    assert_eq!(service.ip_families, IpFamilies::Dual);
    assert!(service.canonical);
    assert_eq!(service.visibility, Visibility::Namespace);
    assert_eq!(service.weighted_waypoints[0].weight, 3);
    assert_eq!(
        service.weighted_waypoints[0].destination.hbone_mtls_port,
        15008
    );
}

#[test]
fn policies_parse_every_match_kind() {
    let config = parse_example();
    let names: Vec<&str> = config.policies.keys().map(|name| &**name).collect();
    assert_eq!(
        names,
        [
            "default/allow-client",
            "default/default-ns",
            "istio-system/deny-legacy"
        ]
    );

    let allow = &config.policies["default/allow-client"];
    assert_eq!(
        (allow.scope, allow.action, allow.dry_run),
        (Scope::WorkloadSelector, Action::Allow, false)
    );
    let m = &allow.rules[0].clauses[0].matches[0];
    assert_eq!(
        m.principals,
        [StringMatch::Exact(
            "cluster.local/ns/client/sa/client".into()
        )]
    );
    assert_eq!(
        m.not_principals,
        [StringMatch::Prefix("cluster.local/ns/evil/".into())]
    );
    assert_eq!(
        m.namespaces,
        [StringMatch::Suffix("-prod".into()), StringMatch::Presence]
    );
    assert_eq!(m.not_namespaces, [StringMatch::Exact("kube-system".into())]);
    let sa = |ns: &str, sa: &str| ServiceAccountMatch {
        namespace: ns.into(),
        service_account: sa.into(),
    };
    assert_eq!(m.service_accounts, [sa("client", "client")]);
    assert_eq!(m.not_service_accounts, [sa("client", "banned")]);
    let cidrs = |list: &[Cidr]| list.iter().map(ToString::to_string).collect::<Vec<_>>();
    assert_eq!(cidrs(&m.source_ips), ["10.0.0.0/8", "10.0.0.1/32"]);
    assert_eq!(cidrs(&m.not_source_ips), ["10.0.9.0/24"]);
    assert_eq!(cidrs(&m.destination_ips), ["10.0.0.10/32"]);
    assert_eq!(cidrs(&m.not_destination_ips), ["fd00::/8"]);
    assert_eq!(m.destination_ports, [8080]);
    assert_eq!(m.not_destination_ports, [9090]);

    let deny = &config.policies["istio-system/deny-legacy"];
    assert_eq!(
        (deny.scope, deny.action, deny.dry_run),
        (Scope::Global, Action::Deny, true)
    );
    let namespace_wide = &config.policies["default/default-ns"];
    assert!(namespace_wide.rules.is_empty());
}

#[test]
fn every_string_match_form_parses() {
    let cases = [
        ("!Exact \"a/b\"", StringMatch::Exact("a/b".into())),
        ("!Exact a", StringMatch::Exact("a".into())),
        (
            "!Prefix \"cluster.local/\"",
            StringMatch::Prefix("cluster.local/".into()),
        ),
        ("!Suffix \"/sa/b\"", StringMatch::Suffix("/sa/b".into())),
        ("!Presence", StringMatch::Presence),
        ("!Presence null", StringMatch::Presence),
        ("!Presence []", StringMatch::Presence),
        ("!Presence {}", StringMatch::Presence),
        ("Presence", StringMatch::Presence),
    ];
    for (form, want) in cases {
        let text = format!(
            "policies:\n- name: p\n  namespace: ns\n  scope: Global\n  action: Allow\n  rules:\n  - - - principals:\n        - {form}\n"
        );
        let config = parse(&text, Path::new("p.yaml")).unwrap_or_else(|e| panic!("{form}: {e}"));
        let m = &config.policies["ns/p"].rules[0].clauses[0].matches[0];
        assert_eq!(m.principals, [want], "{form}");
    }
}

/// A minimal workload entry with `extra` lines added (each indented two spaces).
fn workload_with(extra: &str) -> String {
    format!(
        "workloads:\n- uid: u\n  name: n\n  namespace: ns\n  workloadIps: [\"10.0.0.1\"]\n  services: {{}}\n{extra}"
    )
}

#[test]
fn errors_name_the_file_the_line_and_the_problem() {
    #[rustfmt::skip]
    let cases: Vec<(&str, String, Option<usize>, &str)> = vec![
        ("unknown top-level key", "workloads: []\nextra: 1\n".into(), Some(2), "unknown field `extra`"),
        ("unknown workload key", workload_with("  serviceAcount: x\n"), Some(7), "unknown field `serviceAcount`"),
        ("bad workload IP", "workloads:\n- uid: u\n  name: n\n  namespace: ns\n  workloadIps:\n  - 10.0.0.1\n  - 10.0.0.300\n  services: {}\n".into(), Some(7), "invalid IP address"),
        ("missing required key", "workloads:\n- uid: u\n  name: n\n  namespace: ns\n  services: {}\n".into(), Some(2), "missing field `workloadIps`"),
        ("bad protocol", workload_with("  protocol: hbone\n"), Some(7), "unknown variant `hbone`"),
        ("bad workload type", workload_with("  workloadType: replicaset\n"), Some(7), "unknown variant `replicaset`"),
        ("services key without slash", "workloads:\n- uid: u\n  name: n\n  namespace: ns\n  workloadIps: []\n  services:\n    echo: {80: 80}\n".into(), Some(7), "failed to parse namespaced hostname: echo"),
        ("port out of range", "workloads:\n- uid: u\n  name: n\n  namespace: ns\n  workloadIps: []\n  services: {\"ns/h\": {80: 70000}}\n".into(), Some(6), "70000"),
        ("bad vip", "services:\n- name: s\n  namespace: ns\n  hostname: h\n  ports: {}\n  vips:\n  - \"/10.0.0.1\"\n  - \"net/not-an-ip\"\n".into(), Some(8), "invalid IP address \"not-an-ip\""),
        ("bad cidr vip", "services:\n- name: s\n  namespace: ns\n  hostname: h\n  ports: {}\n  vips: []\n  cidrVips: [\"10.0.0.0/33\"]\n".into(), Some(7), "prefix length 33 is above 32"),
        ("bad subject alt name", "services:\n- name: s\n  namespace: ns\n  hostname: h\n  ports: {}\n  vips: []\n  subjectAltNames: [\"server.example.com\"]\n".into(), Some(7), "invalid identity"),
        ("bad policy cidr", "policies:\n- name: p\n  namespace: ns\n  scope: Global\n  action: Deny\n  rules:\n  - - - sourceIps: [\"10.0.0.0/40\"]\n".into(), Some(7), "prefix length 40 is above 32"),
        ("bad policy ip", "policies:\n- name: p\n  namespace: ns\n  scope: Global\n  action: Deny\n  rules:\n  - - - sourceIps: [\"10.0.0/8\"]\n".into(), Some(7), "invalid IP address \"10.0.0\""),
        ("unknown string match tag", "policies:\n- name: p\n  namespace: ns\n  scope: Global\n  action: Deny\n  rules:\n  - - - principals: [!Regex \".*\"]\n".into(), Some(7), "unknown variant `Regex`"),
        ("untagged string match", "policies:\n- name: p\n  namespace: ns\n  scope: Global\n  action: Deny\n  rules:\n  - - - principals: [\"a\"]\n".into(), Some(7), "a string match"),
        ("unknown match key", "policies:\n- name: p\n  namespace: ns\n  scope: Global\n  action: Deny\n  rules:\n  - - - sourceIp: [\"10.0.0.1\"]\n".into(), Some(7), "unknown field `sourceIp`"),
        ("bad scope", "policies:\n- name: p\n  namespace: ns\n  scope: Cluster\n  action: Deny\n".into(), Some(4), "unknown variant `Cluster`"),
        ("not YAML", "workloads: [\n".into(), Some(2), "did not find expected"),
    ];
    for (name, text, line, needle) in cases {
        let error = parse(&text, Path::new("/etc/ztunnel/local.yaml")).expect_err(name);
        let message = error.to_string();
        assert!(
            message.starts_with("/etc/ztunnel/local.yaml: "),
            "{name}: {message}"
        );
        assert!(message.contains(needle), "{name}: {message}");
        let LocalConfigError::Syntax { line: got, .. } = error else {
            panic!("{name}: {message}")
        };
        assert_eq!(got, line, "{name}: {message}");
    }
}

#[test]
fn semantic_errors_name_the_entry() {
    let bad_identity = workload_with("  serviceAccount: \"a b\"\n");
    let error = parse(&bad_identity, Path::new("f.yaml")).unwrap_err();
    assert!(
        matches!(error, LocalConfigError::Identity { ref uid, .. } if uid == "u"),
        "{error}"
    );
    let shown = ErrorChain(&error).to_string();
    assert!(
        shown.starts_with("f.yaml: workload u: invalid identity: "),
        "{shown}"
    );

    let cases = [
        (format!("{}- uid: u\n  name: n2\n  namespace: ns\n  workloadIps: []\n  services: {{}}\n", workload_with("")), "duplicate workload u"),
        ("services:\n- {name: s, namespace: ns, hostname: h, vips: [], ports: {}}\n- {name: t, namespace: ns, hostname: h, vips: [], ports: {}}\n".to_string(), "duplicate service ns/h"),
        ("policies:\n- {name: p, namespace: ns, scope: Global, action: Allow}\n- {name: p, namespace: ns, scope: Namespace, action: Deny}\n".to_string(), "duplicate policy ns/p"),
    ];
    for (text, message) in cases {
        let error = parse(&text, Path::new("f.yaml")).unwrap_err();
        assert_eq!(error.to_string(), format!("f.yaml: {message}"));
    }
}

#[test]
fn files_without_content_are_empty_configs() {
    for text in ["", "\n", "# nothing yet\n", "---\n# still nothing\n"] {
        assert_eq!(
            parse(text, Path::new("f.yaml")).unwrap(),
            LocalConfig::default(),
            "{text:?}"
        );
    }
    let config = parse(
        "workloads: []\nservices: []\npolicies: []\n",
        Path::new("f.yaml"),
    )
    .unwrap();
    assert_eq!(config, LocalConfig::default());
}

#[test]
fn load_reads_the_file_and_reports_a_missing_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("local.yaml");
    std::fs::write(&path, EXAMPLE).unwrap();
    assert_eq!(load(&path).unwrap(), parse_example());

    let missing = dir.path().join("missing.yaml");
    let error = load(&missing).unwrap_err();
    assert!(matches!(error, LocalConfigError::Read { .. }));
    assert!(ErrorChain(&error).to_string().starts_with(&format!(
        "{}: cannot read local config: ",
        missing.display()
    )));
}

#[test]
fn the_loaded_state_routes_and_authorizes() {
    let state = parse_example().into_state();
    // The VIP reaches the one healthy endpoint, with the service's port mapping.
    let client = Workload::for_test("uid-client", "default", &[]);
    let Destination::Workload(upstream) =
        select_upstream(&state, &client, "10.96.0.10:80".parse().unwrap(), 1)
    else {
        panic!("VIP should resolve");
    };
    assert_eq!(upstream.workload.name.as_ref(), "server-0");
    assert_eq!(
        upstream.socket_addr(),
        Some("10.0.0.10:8080".parse().unwrap())
    );
    assert_eq!(upstream.expected_identities().len(), 2);

    // The host-network workload is stored but not found by IP.
    assert!(state.workload("Kubernetes//Pod/legacy/db-0").is_some());
    assert!(
        state
            .workload_by_address("net-east", ip("10.1.0.5"))
            .is_none()
    );

    let server = state.workload("Kubernetes//Pod/default/server-0").unwrap();
    let names: Vec<&str> = state
        .applicable_policies(server)
        .map(|p| &*p.name)
        .collect();
    assert_eq!(names, ["deny-legacy", "default-ns", "allow-client"]);

    // A new file replaces everything.
    let mut state = state;
    parse("workloads: []\n", Path::new("f.yaml"))
        .unwrap()
        .apply(&mut state);
    assert_eq!(
        state.workloads().count() + state.services().count() + state.policies().count(),
        0
    );
}
