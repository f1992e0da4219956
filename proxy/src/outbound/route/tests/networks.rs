//! The outbound decision across networks: endpoints and waypoints behind
//! another network's gateway (AMBIENT.md §2.1 row 4, §3.4, §3.5).

use super::*;

/// The default network and the network `far` behind an east-west gateway,
/// reached by address (`far/10.22.1.1`, HBONE on 15009) or by the name of
/// its service (whose endpoint maps 15009 to 15008), as in
/// `build_request_double_hbone`.
const NETWORKS: &str = r#"
workloads:
- uid: client
  name: client
  namespace: default
  serviceAccount: client
  workloadIps: [10.0.0.1]
  protocol: HBONE
  services: {}
- uid: NetworkGateway/far/10.22.1.1/15009
  name: NetworkGateway/far/10.22.1.1/15009
  namespace: istio-system
  serviceAccount: eastwest
  network: far
  workloadIps: [10.22.1.1]
  protocol: HBONE
  services: {}
- uid: eastwest-pod
  name: eastwest-pod
  namespace: istio-system
  serviceAccount: eastwest
  network: far
  workloadIps: [127.0.0.5]
  protocol: HBONE
  services:
    istio-system/eastwest.istio-system.svc.cluster.local: {15009: 15008}
- uid: far/SplitHorizonWorkload/example.com
  name: far/SplitHorizonWorkload/example.com
  namespace: default
  network: far
  workloadIps: []
  protocol: HBONE
  networkGateway: {destination: far/10.22.1.1, hboneMtlsPort: 15009}
  services:
    default/example.com: {80: 8080}
- uid: far/SplitHorizonWorkload/example.org
  name: far/SplitHorizonWorkload/example.org
  namespace: default
  network: far
  workloadIps: []
  protocol: HBONE
  networkGateway:
    destination: {namespace: istio-system, hostname: eastwest.istio-system.svc.cluster.local}
    hboneMtlsPort: 15009
  services:
    default/example.org: {80: 8080}
- uid: near-sick
  name: near-sick
  namespace: default
  workloadIps: [10.0.0.7]
  protocol: HBONE
  status: Unhealthy
  services:
    default/failover.default.svc.cluster.local: {80: 8080}
- uid: far/SplitHorizonWorkload/failover
  name: far/SplitHorizonWorkload/failover
  namespace: default
  network: far
  workloadIps: []
  protocol: HBONE
  networkGateway: {destination: far/10.22.1.1, hboneMtlsPort: 15009}
  services:
    default/failover.default.svc.cluster.local: {80: 8080}
- uid: near-well
  name: near-well
  namespace: default
  serviceAccount: near
  workloadIps: [10.0.0.8]
  protocol: HBONE
  services:
    default/prefer-near.default.svc.cluster.local: {80: 8080}
- uid: far/SplitHorizonWorkload/prefer-near
  name: far/SplitHorizonWorkload/prefer-near
  namespace: default
  network: far
  workloadIps: []
  protocol: HBONE
  capacity: 1000
  networkGateway: {destination: far/10.22.1.1, hboneMtlsPort: 15009}
  services:
    default/prefer-near.default.svc.cluster.local: {80: 8080}
- uid: far-no-gateway
  name: far-no-gateway
  namespace: default
  network: far
  workloadIps: [10.30.0.1]
  protocol: HBONE
  services:
    default/wrong.default.svc.cluster.local: {80: 8080}
- uid: far-lost-gateway
  name: far-lost-gateway
  namespace: default
  network: far
  workloadIps: []
  protocol: HBONE
  networkGateway: {destination: far/10.99.9.9}
  services:
    default/lost-gateway.default.svc.cluster.local: {80: 8080}
- uid: far-waypoint
  name: far-waypoint
  namespace: default
  serviceAccount: waypoint
  network: far
  workloadIps: [10.40.0.1]
  protocol: HBONE
  networkGateway: {destination: far/10.22.1.1, hboneMtlsPort: 15009}
  services:
    default/far-waypoint.default.svc.cluster.local: {15008: 15008}
- uid: behind-far-waypoint
  name: behind-far-waypoint
  namespace: default
  workloadIps: [10.0.0.9]
  protocol: HBONE
  waypoint: {destination: far/10.40.0.1}
  services: {}
services:
- name: eastwest
  namespace: istio-system
  hostname: eastwest.istio-system.svc.cluster.local
  vips: [far/10.22.2.2]
  ports: {15009: 15009}
  subjectAltNames: ["spiffe://cluster.local/ns/istio-system/sa/eastwest-alias"]
- name: example
  namespace: default
  hostname: example.com
  vips: [/10.96.1.1]
  ports: {80: 8080}
  subjectAltNames: ["spiffe://cluster.local/ns/default/sa/remote"]
- name: example-org
  namespace: default
  hostname: example.org
  vips: [/10.96.1.2]
  ports: {80: 8080}
  subjectAltNames: ["spiffe://cluster.local/ns/default/sa/remote"]
- name: failover
  namespace: default
  hostname: failover.default.svc.cluster.local
  vips: [/10.96.1.3]
  ports: {80: 8080}
  subjectAltNames: ["spiffe://cluster.local/ns/default/sa/remote"]
  loadBalancer: {mode: Failover, routingPreferences: [Network]}
- name: prefer-near
  namespace: default
  hostname: prefer-near.default.svc.cluster.local
  vips: [/10.96.1.4]
  ports: {80: 8080}
  loadBalancer: {mode: Failover, routingPreferences: [Network]}
- name: wrong
  namespace: default
  hostname: wrong.default.svc.cluster.local
  vips: [/10.96.1.5]
  ports: {80: 8080}
- name: lost-gateway
  namespace: default
  hostname: lost-gateway.default.svc.cluster.local
  vips: [/10.96.1.6]
  ports: {80: 8080}
- name: remote-waypointed
  namespace: default
  hostname: remote-waypointed.default.svc.cluster.local
  vips: [/10.96.1.7]
  ports: {80: 8080}
  subjectAltNames: ["spiffe://cluster.local/ns/default/sa/remote"]
  waypoint:
    destination: {namespace: default, hostname: far-waypoint.default.svc.cluster.local}
- name: far-waypoint
  namespace: default
  hostname: far-waypoint.default.svc.cluster.local
  vips: [far/10.40.9.9]
  ports: {15008: 15008}
"#;

/// Network gateways: every case of AMBIENT.md §3.4 and §3.5 (istio/ztunnel's
/// `build_request_double_hbone`, `build_request_failover_to_remote`,
/// `build_request_wrong_network`).
#[test]
fn endpoints_on_another_network_are_reached_through_its_gateway() {
    let state = state(NETWORKS);
    let cases: &[(&str, &str, &str, &str)] = &[
        (
            "row 4 (build_request_double_hbone): a gateway named by address is dialled \
             exactly there; the authority is the service's name",
            "client",
            "10.96.1.1:80",
            "double 10.22.1.1:15009 expect=istio-system/eastwest authority=example.com:80 \
             inner-expect=default/remote to=far/SplitHorizonWorkload/example.com",
        ),
        (
            "row 4 (build_request_double_hbone): a gateway named by service: its endpoint, \
             with the endpoint's port mapping (15009 to 15008)",
            "client",
            "10.96.1.2:80",
            "double 127.0.0.5:15008 expect=istio-system/eastwest,istio-system/eastwest-alias \
             authority=example.org:80 inner-expect=default/remote \
             to=far/SplitHorizonWorkload/example.org",
        ),
        (
            "row 4 (build_request_failover_to_remote): the local endpoint is unhealthy, \
             so failover reaches the remote one",
            "client",
            "10.96.1.3:80",
            "double 10.22.1.1:15009 expect=istio-system/eastwest \
             authority=failover.default.svc.cluster.local:80 inner-expect=default/remote \
             to=far/SplitHorizonWorkload/failover",
        ),
        (
            "row 4 (build_request_wrong_network): a remote endpoint with an IP but no \
             gateway is refused",
            "client",
            "10.96.1.5:80",
            "refuse: no valid routing destination for workload far-no-gateway",
        ),
        (
            "row 4: a gateway that names nothing is refused",
            "client",
            "10.96.1.6:80",
            "refuse: unknown network gateway: far/10.99.9.9:15008 not found",
        ),
        (
            "row 2: a service's waypoint on another network is reached through that \
             network's gateway, with the service's name",
            "client",
            "10.96.1.7:80",
            "double 10.22.1.1:15009 expect=istio-system/eastwest \
             authority=remote-waypointed.default.svc.cluster.local:80 \
             inner-expect=default/remote to=far-waypoint",
        ),
        (
            "row 5: a pod's waypoint on another network, addressed by pod IP: \
             no service name to cross the gateway with",
            "client",
            "10.0.0.9:80",
            "refuse: workload far-waypoint is on another network and was not addressed \
             through a service",
        ),
    ];
    check(&state, cases);
}

#[test]
fn failover_keeps_a_healthy_endpoint_on_the_own_network_whatever_the_far_capacity() {
    let state = state(NETWORKS);
    for pick in 0..1000 {
        assert_eq!(
            describe(&route_from(&state, "client", None, "10.96.1.4:80", pick)),
            "hbone 10.0.0.8:15008 authority=10.0.0.8:8080 expect=default/near to=near-well",
            "pick {pick}"
        );
    }
}
