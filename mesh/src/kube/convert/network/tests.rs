//! Which Gateways are gateways into other networks, with which port and
//! identity (AMBIENT.md §3.2).

use serde_json::{Value, json};

use super::super::tests::merged;
use super::super::waypoint::tests::gateway;
use super::*;

#[test]
fn network_gateways_come_from_remote_and_east_west_gateways_with_a_network() {
    let remote = |patch: Value| {
        gateway(
            "istio-system",
            "remote",
            merged(
                json!({"metadata": {"labels": {"topology.istio.io/network": "net-2"}},
                       "spec": {"gatewayClassName": "istio-remote",
                                "listeners": [{"name": "mesh", "port": 15009, "protocol": "HBONE"}]},
                       "status": {"addresses": [{"type": "IPAddress", "value": "192.0.2.7"}]}}),
                patch,
            ),
        )
    };
    let found = network_gateways(&[remote(json!({}))]);
    assert_eq!(
        found,
        [NetworkGateway {
            network: "net-2".into(),
            namespace: "istio-system".into(),
            service_account: "remote-istio-remote".into(),
            destination: GatewayDestination::Address(NetworkAddress {
                network: "net-2".into(),
                address: "192.0.2.7".parse().unwrap(),
            }),
            hbone_mtls_port: 15009,
        }]
    );
    assert_eq!(
        found[0].workload_uid(),
        "NetworkGateway/net-2/192.0.2.7/15009"
    );
    let annotated =
        remote(json!({"metadata": {"annotations": {"gateway.istio.io/service-account": "ew"}}}));
    assert_eq!(network_gateways(&[annotated])[0].service_account, "ew");
    let unlabelled = remote(json!({"metadata": {"labels": null}}));
    assert_eq!(network_gateways(&[unlabelled]), [], "no network label");
    let waypoint = remote(json!({"spec": {"gatewayClassName": "istio-waypoint"}}));
    assert_eq!(
        network_gateways(&[waypoint]),
        [],
        "a waypoint is no network gateway"
    );
    let east_west = |mode: &str| {
        remote(
            json!({"spec": {"gatewayClassName": "istio-east-west", "listeners": [
            {"name": "mesh", "port": 15008, "protocol": "HBONE", "tls": {"mode": mode}}]}}),
        )
    };
    let terminating = network_gateways(&[east_west("Terminate")]);
    assert_eq!(
        terminating[0].hbone_mtls_port, 0,
        "an east-west gateway's port is unknown"
    );
    assert_eq!(terminating[0].service_account, "remote");
    assert_eq!(network_gateways(&[east_west("Passthrough")]), []);
}
