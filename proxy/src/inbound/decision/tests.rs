//! The inbound decision's table tests.

use std::path::Path;

use super::*;
use crate::config::local;
use crate::state::{
    ApplicationTunnel, ApplicationTunnelProtocol, GatewayAddress, GatewayDestination,
    InboundProtocol, NetworkAddress, PortMap, Service,
};

const STATE: &str = r#"
workloads:
- uid: uid-server
  name: server-0
  namespace: default
  serviceAccount: server
  workloadIps: [198.18.1.10]
  protocol: HBONE
  services: {}
policies:
- name: only-client
  namespace: default
  scope: Namespace
  action: Allow
  rules:
  - - - principals: [!Exact "cluster.local/ns/default/sa/client"]
- name: no-admin-port
  namespace: default
  scope: Namespace
  action: Deny
  rules:
  - - - destinationPorts: [9000]
"#;

fn arrival(identity: Option<&str>, target: &str) -> Arrival {
    Arrival {
        peer_identity: identity.map(|id| id.parse().unwrap()),
        source_ip: "198.18.0.10".parse().unwrap(),
        source_port: 40000,
        local_ip: "198.18.1.10".parse().unwrap(),
        target: target.parse().unwrap(),
    }
}

/// [`admit`] of an arrival whose authority is its target, as for
/// plaintext and same-node connections.
fn admit_at(
    state: &State,
    local: impl Fn(&Workload) -> bool,
    arrival: &Arrival,
) -> Result<Admitted, Refusal> {
    admit(
        state,
        "",
        local,
        arrival,
        &Authority::Address(arrival.target),
    )
}

#[test]
fn admissions() {
    let state = local::parse(STATE, Path::new("t.yaml"))
        .unwrap()
        .into_state();
    let client = Some("spiffe://cluster.local/ns/default/sa/client");
    let other = Some("spiffe://cluster.local/ns/default/sa/other");
    let admitted = admit_at(&state, |_| true, &arrival(client, "198.18.1.10:8080")).unwrap();
    assert_eq!(admitted.upstream, "198.18.1.10:8080".parse().unwrap());
    assert_eq!(admitted.workload.name.as_ref(), "server-0");

    let cases: &[(Option<&str>, &str, u16)] = &[
        (client, "198.18.1.11:8080", 400),
        (client, "198.18.1.10:15008", 503),
        (client, "198.18.1.10:15006", 503),
        (other, "198.18.1.10:8080", 401),
        (None, "198.18.1.10:8080", 401),
        (client, "198.18.1.10:9000", 401),
    ];
    for (identity, target, status) in cases {
        let refusal = admit_at(&state, |_| true, &arrival(*identity, target)).unwrap_err();
        assert_eq!(
            refusal.answer().refusal.status().as_u16(),
            *status,
            "{identity:?} → {target}: {refusal}"
        );
    }
    let not_local = admit_at(&state, |_| false, &arrival(client, "198.18.1.10:8080"));
    let status = not_local.unwrap_err().answer().refusal.status();
    assert_eq!(status.as_u16(), 503);
}

#[test]
fn every_refusal_has_one_status_and_one_flag() {
    let ip: IpAddr = "198.18.1.10".parse().unwrap();
    let denied = DenyReason::NotAllowed;
    let cases = [
        (
            Refusal::AuthorityMismatch {
                local: ip,
                authority: "198.18.1.11".parse().unwrap(),
            },
            400,
            ResponseFlags::Connect,
        ),
        (Refusal::UnknownWorkload(ip), 503, ResponseFlags::Connect),
        (
            Refusal::UnknownHostname("a.b".into()),
            503,
            ResponseFlags::Connect,
        ),
        (
            Refusal::NoTargetPort {
                hostname: "a.b".into(),
                port: 80,
            },
            503,
            ResponseFlags::Connect,
        ),
        (
            Refusal::NoServiceVip("a.b".into()),
            503,
            ResponseFlags::Connect,
        ),
        (Refusal::SelfCall, 503, ResponseFlags::Connect),
        (Refusal::ProxyTunnelWithoutPort, 503, ResponseFlags::Connect),
        (Refusal::Denied(denied), 401, ResponseFlags::Deny),
    ];
    for (refusal, status, flags) in cases {
        let answer = refusal.answer();
        assert_eq!(answer.refusal.status().as_u16(), status, "{refusal}");
        assert_eq!(answer.flags, flags, "{refusal}");
    }
    assert_eq!(RefusalAnswer::UNREACHABLE.refusal.status().as_u16(), 503);
    assert_eq!(RefusalAnswer::UNREACHABLE.flags, ResponseFlags::Connect);
}

#[test]
fn a_policy_change_is_seen_by_the_recheck() {
    let mut state = local::parse(STATE, Path::new("t.yaml"))
        .unwrap()
        .into_state();
    let other = Some("spiffe://cluster.local/ns/default/sa/other");
    let admitted = {
        let open = STATE.replace("sa/client", "sa/other");
        let state = local::parse(&open, Path::new("t.yaml"))
            .unwrap()
            .into_state();
        admit_at(&state, |_| true, &arrival(other, "198.18.1.10:8080")).unwrap()
    };
    assert!(still_allowed(&state, &admitted.connection).is_err());
    state.remove_policy("default/only-client");
    assert!(still_allowed(&state, &admitted.connection).is_ok());
}

/// The sandwich fixture of istio/ztunnel's inbound tests (AMBIENT.md
/// §2.3): a client pod, a server pod with its service, a waypoint pod with
/// its service; every service maps port 80 to 8080.
const CLIENT: &str = "10.0.0.1";
const SERVER: &str = "10.0.0.2";
const SERVER_VIP: &str = "10.10.0.1";
const WAYPOINT: &str = "10.0.0.3";
const WAYPOINT_VIP: &str = "10.10.0.2";
const SERVER_HOST: &str = "server.default.svc.cluster.local";
/// The waypoint's application tunnel port.
const TUNNEL_PORT: u16 = 15088;

/// How the server is bound to the waypoint.
#[derive(Debug, Clone, Copy)]
enum Binding {
    None,
    /// The server workload's `waypoint`, by this address.
    Workload(&'static str),
    /// The server service's `waypoint`, by this address.
    Service(&'static str),
}

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

fn waypoint_address(address: &str) -> GatewayAddress {
    GatewayAddress {
        destination: GatewayDestination::Address(NetworkAddress {
            network: "".into(),
            address: ip(address),
        }),
        hbone_mtls_port: 15008,
    }
}

fn sandwich(binding: Binding, tunnel: Option<ApplicationTunnel>) -> State {
    let mut state = State::new();
    for (name, vip) in [("waypoint", WAYPOINT_VIP), ("server", SERVER_VIP)] {
        let host = format!("{name}.default.svc.cluster.local");
        let mut service = Service::for_test("default", &host, &[ip(vip)], &[(80, 8080)]);
        if let (Binding::Service(address), "server") = (binding, name) {
            service.waypoint = Some(waypoint_address(address));
        }
        state.insert_service(service);
    }
    for (name, address) in [
        ("waypoint", WAYPOINT),
        ("client", CLIENT),
        ("server", SERVER),
    ] {
        let mut workload = Workload::for_test(name, "default", &[ip(address)]);
        workload.protocol = InboundProtocol::Hbone;
        let key = format!("default/{name}.default.svc.cluster.local");
        if name != "client" {
            workload
                .services
                .insert(key.parse().unwrap(), PortMap::new());
        }
        match (binding, name) {
            (Binding::Workload(address), "server") => {
                workload.waypoint = Some(Box::new(waypoint_address(address)));
            }
            (_, "waypoint") => workload.application_tunnel = tunnel,
            _ => {}
        }
        state.insert_workload(workload);
    }
    state
}

fn tunnel_arrival(socket_destination: &str, authority: &Authority) -> Arrival {
    let local_ip = ip(socket_destination);
    let target = match authority {
        Authority::Address(address) => *address,
        Authority::Hostname { port, .. } => SocketAddr::new(local_ip, *port),
    };
    Arrival {
        peer_identity: Some(
            "spiffe://cluster.local/ns/default/sa/client"
                .parse()
                .unwrap(),
        ),
        source_ip: ip(CLIENT),
        source_port: 40000,
        local_ip,
        target,
    }
}

/// istio/ztunnel's `test_find_inbound_upstream` and
/// `test_build_inbound_request`: where a tunnel to the server, straight or
/// through its waypoint, is delivered, and which mismatches are refused.
#[test]
fn a_sandwiched_waypoint_accepts_the_authorities_it_stands_for() {
    use Binding::{None as Unbound, Service as ServiceBound, Workload as WorkloadBound};
    let proxy = Some(ApplicationTunnel {
        protocol: ApplicationTunnelProtocol::Proxy,
        port: Some(TUNNEL_PORT),
    });
    let address = |ip: &str| Authority::Address(SocketAddr::new(ip.parse().unwrap(), 8080));
    let host = Authority::Hostname {
        host: SERVER_HOST.into(),
        port: 80,
    };
    let plain = Some(ApplicationTunnel {
        protocol: ApplicationTunnelProtocol::None,
        port: Some(TUNNEL_PORT),
    });
    let waypoint_host = Authority::Hostname {
        host: "waypoint.default.svc.cluster.local".into(),
        port: 80,
    };
    // (why, binding, the waypoint's tunnel, socket destination, authority,
    //  upstream and the PROXY header's destination, or the status)
    #[rustfmt::skip]
    let cases: Vec<Row> = vec![
        ("no waypoint, to the pod", Unbound, None, SERVER, address(SERVER), Ok((SERVER, 8080, None))),
        ("no waypoint, service hostname mapped 80 to 8080", Unbound, None, SERVER, host.clone(), Ok((SERVER, 8080, None))),
        ("workload waypoint named by its pod", WorkloadBound(WAYPOINT), None, WAYPOINT, address(SERVER), Ok((WAYPOINT, 8080, None))),
        ("workload waypoint named by its VIP", WorkloadBound(WAYPOINT_VIP), None, WAYPOINT, address(SERVER), Ok((WAYPOINT, 8080, None))),
        ("workload waypoint with a PROXY tunnel", WorkloadBound(WAYPOINT_VIP), proxy, WAYPOINT, address(SERVER), Ok((WAYPOINT, TUNNEL_PORT, Some((SERVER, 8080))))),
        ("service waypoint named by its pod", ServiceBound(WAYPOINT), None, WAYPOINT, address(SERVER_VIP), Ok((WAYPOINT, 8080, None))),
        ("service waypoint named by its VIP", ServiceBound(WAYPOINT_VIP), None, WAYPOINT, address(SERVER_VIP), Ok((WAYPOINT, 8080, None))),
        ("service waypoint with a PROXY tunnel", ServiceBound(WAYPOINT_VIP), proxy, WAYPOINT, address(SERVER_VIP), Ok((WAYPOINT, TUNNEL_PORT, Some((SERVER_VIP, 8080))))),
        ("a PROXY tunnel takes any authority, its app decides", Unbound, proxy, WAYPOINT, address(CLIENT), Ok((WAYPOINT, TUNNEL_PORT, Some((CLIENT, 8080))))),
        ("a hostname at a PROXY tunnel: the header names the VIP", Unbound, proxy, WAYPOINT, waypoint_host.clone(), Ok((WAYPOINT, TUNNEL_PORT, Some((WAYPOINT_VIP, 80))))),
        ("a plain tunnel moves the port and writes no header", Unbound, plain, WAYPOINT, address(SERVER), Ok((WAYPOINT, TUNNEL_PORT, None))),
        ("the server asked for another IP", Unbound, None, SERVER, address(CLIENT), Err(400)),
        ("a waypoint nothing is bound to", Unbound, None, WAYPOINT, address(CLIENT), Err(400)),
        ("service-bound waypoint, pod authority", ServiceBound(WAYPOINT), None, WAYPOINT, address(SERVER), Err(400)),
        ("workload-bound waypoint, VIP authority", WorkloadBound(WAYPOINT), None, WAYPOINT, address(SERVER_VIP), Err(400)),
        ("service waypoint by VIP, pod authority", ServiceBound(WAYPOINT_VIP), None, WAYPOINT, address(SERVER), Err(400)),
        ("an unknown hostname", Unbound, None, SERVER, Authority::Hostname { host: "nope.default.svc".into(), port: 80 }, Err(503)),
        ("a hostname port the service does not map", Unbound, None, SERVER, Authority::Hostname { host: SERVER_HOST.into(), port: 81 }, Err(503)),
        ("ztunnel's own port", Unbound, None, SERVER, Authority::Address(SocketAddr::new(ip(SERVER), 15008)), Err(503)),
        ("ztunnel's own port, before the tunnel's port", Unbound, proxy, WAYPOINT, Authority::Address(SocketAddr::new(ip(WAYPOINT), 15006)), Err(503)),
    ];
    for (why, binding, tunnel, socket_destination, authority, expected) in cases {
        let state = sandwich(binding, tunnel);
        let arrival = tunnel_arrival(socket_destination, &authority);
        let got = admit(&state, "", |_| true, &arrival, &authority);
        match (got, expected) {
            (Ok(admitted), Ok((upstream_ip, port, header))) => {
                let upstream = SocketAddr::new(ip(upstream_ip), port);
                assert_eq!(admitted.upstream, upstream, "{why}");
                let header = header.map(|(address, port)| SocketAddr::new(ip(address), port));
                assert_eq!(admitted.proxy_destination, header, "{why}");
                let rbac = &admitted.connection;
                let seen = SocketAddr::new(rbac.destination_ip, rbac.destination_port);
                assert_eq!(seen, upstream, "{why}: RBAC sees the delivered address");
            }
            (Err(refusal), Err(status)) => {
                let answered = refusal.answer().refusal.status().as_u16();
                assert_eq!(answered, status, "{why}: {refusal}");
            }
            (got, expected) => panic!("{why}: got {got:?}, expected {expected:?}"),
        }
    }
}

/// A row of the sandwich table: why, the binding, the waypoint's tunnel,
/// the socket's destination, the authority, and what is expected.
type Row = (
    &'static str,
    Binding,
    Option<ApplicationTunnel>,
    &'static str,
    Authority,
    Expected,
);

/// A row's outcome: the upstream IP and port with the PROXY header's
/// destination, or the refusal's status.
type Expected = Result<(&'static str, u16, Option<(&'static str, u16)>), u16>;

#[test]
fn a_proxy_tunnel_is_dialled_on_loopback_unless_told_otherwise() {
    let proxy = Some(ApplicationTunnel {
        protocol: ApplicationTunnelProtocol::Proxy,
        port: Some(TUNNEL_PORT),
    });
    let plain = proxy.map(|tunnel| ApplicationTunnel {
        protocol: ApplicationTunnelProtocol::None,
        ..tunnel
    });
    let authority = Authority::Address(SocketAddr::new(ip(SERVER), 8080));
    let arrival = tunnel_arrival(WAYPOINT, &authority);
    let admitted = |tunnel| {
        let state = sandwich(Binding::Workload(WAYPOINT), tunnel);
        admit(&state, "", |_| true, &arrival, &authority).unwrap()
    };
    let loopback: SocketAddr = "127.0.0.1:15088".parse().unwrap();
    assert_eq!(admitted(proxy).loopback_dial(true), Some(loopback));
    assert_eq!(admitted(proxy).loopback_dial(false), None);
    assert_eq!(admitted(plain).loopback_dial(true), None);
    assert_eq!(admitted(None).loopback_dial(true), None);

    let mut v6 = admitted(proxy);
    v6.upstream = "[fd00::3]:15088".parse().unwrap();
    assert_eq!(v6.loopback_dial(true), Some("[::1]:15088".parse().unwrap()));
}

/// A plaintext connection (15006, no verified peer) to a workload with an
/// application tunnel goes to the port it was sent to, with no header, as
/// istio/ztunnel's passthrough sends it: a client outside the mesh never
/// reaches the tunnel's listener, which only ztunnel may dial.
#[test]
fn plaintext_never_enters_an_application_tunnel() {
    let proxy = Some(ApplicationTunnel {
        protocol: ApplicationTunnelProtocol::Proxy,
        port: Some(TUNNEL_PORT),
    });
    let plain = proxy.map(|tunnel| ApplicationTunnel {
        protocol: ApplicationTunnelProtocol::None,
        ..tunnel
    });
    let original = SocketAddr::new(ip(WAYPOINT), 8080);
    let authority = Authority::Address(original);
    let mut arrival = tunnel_arrival(WAYPOINT, &authority);
    arrival.peer_identity = None;
    for tunnel in [proxy, plain] {
        let state = sandwich(Binding::None, tunnel);
        let admitted = admit(&state, "", |_| true, &arrival, &authority).unwrap();
        assert_eq!(admitted.upstream, original, "{tunnel:?}");
        assert_eq!(admitted.proxy_destination, None, "{tunnel:?}");
        assert_eq!(admitted.loopback_dial(true), None, "{tunnel:?}");
    }
    // The same connection over HBONE, with its peer verified, is tunnelled.
    let state = sandwich(Binding::None, proxy);
    let arrival = tunnel_arrival(WAYPOINT, &authority);
    let admitted = admit(&state, "", |_| true, &arrival, &authority).unwrap();
    assert_eq!(
        admitted.upstream,
        SocketAddr::new(ip(WAYPOINT), TUNNEL_PORT)
    );
    assert_eq!(admitted.proxy_destination, Some(original));
}

/// A PROXY tunnel that names no port would send its header to whatever
/// port the client asked for, any loopback listener of the pod: refused.
#[test]
fn a_proxy_tunnel_without_a_port_is_refused() {
    let portless = Some(ApplicationTunnel {
        protocol: ApplicationTunnelProtocol::Proxy,
        port: None,
    });
    let state = sandwich(Binding::None, portless);
    let authority = Authority::Address(SocketAddr::new(ip(WAYPOINT), 8080));
    let arrival = tunnel_arrival(WAYPOINT, &authority);
    let refusal = admit(&state, "", |_| true, &arrival, &authority).unwrap_err();
    assert_eq!(refusal, Refusal::ProxyTunnelWithoutPort);
    assert_eq!(refusal.answer().refusal.status().as_u16(), 503);

    // A plain tunnel without a port only keeps the client's port.
    let plain = Some(ApplicationTunnel {
        protocol: ApplicationTunnelProtocol::None,
        port: None,
    });
    let state = sandwich(Binding::None, plain);
    let admitted = admit(&state, "", |_| true, &arrival, &authority).unwrap();
    assert_eq!(admitted.upstream, SocketAddr::new(ip(WAYPOINT), 8080));
}

#[test]
fn a_hostname_at_a_proxy_tunnel_needs_a_vip_on_our_network_ipv4_first() {
    let proxy = Some(ApplicationTunnel {
        protocol: ApplicationTunnelProtocol::Proxy,
        port: Some(TUNNEL_PORT),
    });
    let mut state = sandwich(Binding::None, proxy);
    let host = "waypoint.default.svc.cluster.local";
    let vip = |network: &str, address: &str| NetworkAddress {
        network: network.into(),
        address: ip(address),
    };
    let key = format!("default/{host}").parse().unwrap();
    let mut service = state.service(&key).unwrap().as_ref().clone();
    service.vips = vec![
        vip("far", "10.20.0.1"),
        vip("", "fd00::2"),
        vip("", "10.10.0.7"),
    ];
    state.insert_service(service.clone());
    let authority = Authority::Hostname {
        host: host.into(),
        port: 80,
    };
    let arrival = tunnel_arrival(WAYPOINT, &authority);
    let admitted = admit(&state, "", |_| true, &arrival, &authority).unwrap();
    assert_eq!(
        admitted.proxy_destination,
        Some("10.10.0.7:80".parse().unwrap())
    );
    assert_eq!(
        admitted.upstream,
        SocketAddr::new(ip(WAYPOINT), TUNNEL_PORT),
        "the tunnel's port"
    );

    service.vips = vec![vip("far", "10.20.0.1"), vip("", "fd00::2")];
    state.insert_service(service.clone());
    let admitted = admit(&state, "", |_| true, &arrival, &authority).unwrap();
    assert_eq!(
        admitted.proxy_destination,
        Some("[fd00::2]:80".parse().unwrap())
    );

    service.vips = vec![vip("far", "10.20.0.1")];
    state.insert_service(service);
    let refusal = admit(&state, "", |_| true, &arrival, &authority).unwrap_err();
    assert_eq!(refusal, Refusal::NoServiceVip(host.into()));
    assert_eq!(refusal.answer().refusal.status().as_u16(), 503);
}

#[test]
fn a_mismatch_names_both_addresses() {
    let state = sandwich(Binding::None, None);
    let authority = Authority::Address(SocketAddr::new(ip(CLIENT), 8080));
    let refusal = admit(
        &state,
        "",
        |_| true,
        &tunnel_arrival(SERVER, &authority),
        &authority,
    )
    .unwrap_err();
    assert_eq!(refusal.to_string(), "ip mismatch: 10.0.0.2 != 10.0.0.1");
}

#[test]
fn a_hostname_prefers_the_service_in_the_local_namespace_and_its_own_port_mapping() {
    let mut state = sandwich(Binding::None, None);
    // The same hostname elsewhere, mapping 80 to 9999, and canonical: a
    // plain hostname lookup would pick it.
    let mut elsewhere = Service::for_test("other", SERVER_HOST, &[ip("10.10.0.9")], &[(80, 9999)]);
    elsewhere.canonical = true;
    state.insert_service(elsewhere);
    let authority = Authority::Hostname {
        host: SERVER_HOST.into(),
        port: 80,
    };
    let arrival = tunnel_arrival(SERVER, &authority);
    let admitted = admit(&state, "", |_| true, &arrival, &authority).unwrap();
    assert_eq!(admitted.upstream, SocketAddr::new(ip(SERVER), 8080));

    // The endpoint's own mapping wins over the service's target port.
    let mut server = state.workload("server").unwrap().as_ref().clone();
    let key = format!("default/{SERVER_HOST}").parse().unwrap();
    server.services = [(key, PortMap::from([(80, 7070)]))].into_iter().collect();
    state.insert_workload(server);
    let admitted = admit(&state, "", |_| true, &arrival, &authority).unwrap();
    assert_eq!(admitted.upstream, SocketAddr::new(ip(SERVER), 7070));
}

/// The receiving half of istio/ztunnel's `test_x_forwarded_network_header`
/// (AMBIENT.md §3.5): a CONNECT forwarded from another network came
/// through its gateway, so the source IP is the gateway's and names no
/// client workload.
#[test]
fn a_connect_from_another_network_has_no_source_workload() {
    let mut state = State::new();
    let mut client = Workload::for_test("client", "default", &[ip(CLIENT)]);
    client.network = "net-a".into();
    state.insert_workload(client);
    let cases = [
        ("no header: the source is looked up", None, Some("client")),
        ("our network", Some("net-a"), Some("client")),
        ("our network, case aside", Some("NET-A"), Some("client")),
        ("another network", Some("net-b"), None),
        ("an empty name is another network", Some(""), None),
    ];
    for (why, forwarded, expected) in cases {
        let source = source_workload(&state, "net-a", ip(CLIENT), forwarded);
        let uid = source.as_ref().map(|workload| workload.uid.as_ref());
        assert_eq!(uid, expected, "{why}");
    }
    let on_the_default_network = source_workload(&state, "", ip(CLIENT), None);
    assert!(
        on_the_default_network.is_none(),
        "IPs are looked up per network"
    );
}

#[test]
fn the_inbound_service_is_the_one_named_else_the_first_whose_target_port_matches() {
    let state = local::parse(
        r#"
workloads:
- uid: uid-web
  name: web-0
  namespace: shop
  serviceAccount: web
  workloadIps: [198.18.1.20]
  protocol: HBONE
  services:
    shop/admin.shop.svc.cluster.local: {9000: 9000}
    shop/named.shop.svc.cluster.local: {81: 8081}
    shop/web.shop.svc.cluster.local: {80: 8080}
services:
- {name: admin, namespace: shop, hostname: admin.shop.svc.cluster.local, vips: [], ports: {9000: 9000}}
- {name: named, namespace: shop, hostname: named.shop.svc.cluster.local, vips: [], ports: {81: 0}}
- {name: web, namespace: shop, hostname: web.shop.svc.cluster.local, vips: [], ports: {80: 8080}}
- {name: other, namespace: shop, hostname: other.shop.svc.cluster.local, vips: [], ports: {80: 8080}}
"#,
        Path::new("t.yaml"),
    )
    .unwrap()
    .into_state();
    let workload = state.workload("uid-web").unwrap().clone();
    let guess = |host: Option<&str>, port| {
        inbound_service(&state, &workload, host, port).map(|service| service.name.to_string())
    };
    let rows: &[(Option<&str>, u16, Option<&str>, &str)] = &[
        (
            None,
            8080,
            Some("web"),
            "the service whose target port is the one dialled",
        ),
        (None, 9000, Some("admin"), "another port, another service"),
        (
            None,
            8081,
            Some("named"),
            "a named port: the workload's own mapping",
        ),
        (None, 7000, None, "no service of the workload has it"),
        (
            Some("admin.shop.svc.cluster.local"),
            8080,
            Some("admin"),
            "the client named it",
        ),
        (
            Some("other.shop.svc.cluster.local"),
            8080,
            Some("web"),
            "a named service the workload is no endpoint of is not believed",
        ),
    ];
    for (host, port, expected, reason) in rows {
        assert_eq!(guess(*host, *port).as_deref(), *expected, "{reason}");
    }
}
