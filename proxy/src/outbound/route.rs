//! The outbound decision, as a pure function: given the original destination
//! of a captured connection, tunnel it over HBONE (to whom, with what
//! `:authority`, expecting which identities), pass it through as plain TCP,
//! or refuse it. Moving the bytes is `outbound.rs`'s business.

use std::net::SocketAddr;
use std::sync::Arc;

use ztunnel_certs::identity::Identity;
use ztunnel_proto::ports::HBONE_PORT;

use crate::state::{
    Destination, EndpointAddress, InboundProtocol, Service, State, Workload, select_upstream,
};

/// Ports a connection must never be sent back to: ztunnel's own listeners.
pub const PROXY_PORTS: [u16; 3] = [15001, 15006, HBONE_PORT];

/// Where a captured outbound connection goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// Through an HBONE tunnel.
    Hbone(HboneRoute),
    /// As plain TCP to `target`; `workload` is the destination when known.
    Passthrough {
        /// The address to dial.
        target: SocketAddr,
        /// The known destination workload, for metrics and logs.
        workload: Option<Arc<Workload>>,
        /// The service whose VIP was dialled, if any.
        service: Option<Arc<Service>>,
    },
    /// Not at all.
    Refuse(RouteRefusal),
}

/// An HBONE tunnel to open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HboneRoute {
    /// The peer ztunnel's HBONE listener: the workload IP, port 15008.
    pub dial: SocketAddr,
    /// The CONNECT `:authority`: the workload IP and target port.
    pub authority: SocketAddr,
    /// Identities the peer may present.
    pub expected: Vec<Identity>,
    /// The destination workload.
    pub workload: Arc<Workload>,
    /// The service whose VIP was dialled, if any.
    pub service: Option<Arc<Service>>,
}

/// Why an outbound connection is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteRefusal {
    /// The destination is one of the proxy's own ports on loopback.
    #[error("attempted recursive call to ourselves")]
    SelfCall,
    /// A service VIP with no endpoint to send to.
    #[error("no healthy endpoint for service {0}")]
    NoHealthyEndpoint(Arc<str>),
    /// The chosen endpoint has no address to dial: no IP of a family its
    /// service serves, no hostname, and (on another network) no gateway.
    #[error("no valid routing destination for workload {0}")]
    NoValidDestination(Arc<str>),
    /// The chosen endpoint is on another network behind a network gateway,
    /// which this proxy does not tunnel through.
    #[error("workload {0} is on another network; network gateways are not supported")]
    OtherNetwork(Arc<str>),
    /// The chosen endpoint is addressed by hostname, which this proxy does
    /// not resolve.
    #[error("workload {0} is addressed by hostname; resolving it is not supported")]
    Hostname(Arc<str>),
}

/// Decides where a connection from the workload `source` to `dst` goes.
/// `pick` spreads connections to a service across its endpoints.
pub fn route(state: &State, source: &Workload, dst: SocketAddr, pick: u64) -> Route {
    if dst.ip().is_loopback() && PROXY_PORTS.contains(&dst.port()) {
        return Route::Refuse(RouteRefusal::SelfCall);
    }
    match select_upstream(state, source, dst, pick) {
        Destination::Workload(upstream) => {
            let uid = || upstream.workload.uid.clone();
            // An endpoint on another network is reached only through its
            // network gateway, whatever its addresses (AMBIENT.md §2.1 row 4).
            if upstream.workload.network != source.network {
                return Route::Refuse(match upstream.workload.network_gateway {
                    Some(_) => RouteRefusal::OtherNetwork(uid()),
                    None => RouteRefusal::NoValidDestination(uid()),
                });
            }
            let addr = match upstream.address {
                EndpointAddress::Ip(ip) => SocketAddr::new(ip, upstream.port),
                EndpointAddress::Hostname => return Route::Refuse(RouteRefusal::Hostname(uid())),
                EndpointAddress::NetworkGateway | EndpointAddress::Unreachable => {
                    return Route::Refuse(RouteRefusal::NoValidDestination(uid()));
                }
            };
            match upstream.protocol() {
                InboundProtocol::Hbone => Route::Hbone(HboneRoute {
                    dial: SocketAddr::new(addr.ip(), HBONE_PORT),
                    authority: addr,
                    expected: upstream.expected_identities(),
                    workload: upstream.workload,
                    service: upstream.service,
                }),
                InboundProtocol::Tcp => Route::Passthrough {
                    target: addr,
                    workload: Some(upstream.workload),
                    service: upstream.service,
                },
            }
        }
        Destination::NoHealthyEndpoint { service } => {
            Route::Refuse(RouteRefusal::NoHealthyEndpoint(service.hostname.clone()))
        }
        Destination::Passthrough | Destination::Unknown => Route::Passthrough {
            target: dst,
            workload: None,
            service: None,
        },
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::local;

    const STATE: &str = r#"
workloads:
- uid: uid-server
  name: server-0
  namespace: default
  serviceAccount: server
  workloadIps: [198.18.1.10]
  protocol: HBONE
  services:
    default/echo.default.svc.cluster.local: {80: 8080}
- uid: uid-legacy
  name: legacy-0
  namespace: default
  workloadIps: [198.18.1.20]
  protocol: TCP
  services: {}
- uid: uid-sick
  name: sick-0
  namespace: default
  workloadIps: [198.18.1.30]
  protocol: HBONE
  status: Unhealthy
  services:
    default/sick.default.svc.cluster.local: {80: 8080}
services:
- name: echo
  namespace: default
  hostname: echo.default.svc.cluster.local
  vips: ["/198.19.0.10"]
  ports: {80: 8080}
  subjectAltNames: ["spiffe://cluster.local/ns/default/sa/echo-alias"]
- name: sick
  namespace: default
  hostname: sick.default.svc.cluster.local
  vips: ["/198.19.0.30"]
  ports: {80: 8080}
"#;

    fn state() -> State {
        local::parse(STATE, Path::new("test.yaml"))
            .unwrap()
            .into_state()
    }

    fn id(text: &str) -> Identity {
        text.parse().unwrap()
    }

    #[test]
    fn routes() {
        let state = state();
        let client = Workload::for_test("uid-client", "default", &[]);
        let route = |dst: &str| route(&state, &client, dst.parse().unwrap(), 0);

        let Route::Hbone(direct) = route("198.18.1.10:8080") else {
            panic!("workload IP must tunnel");
        };
        assert_eq!(direct.dial, "198.18.1.10:15008".parse().unwrap());
        assert_eq!(direct.authority, "198.18.1.10:8080".parse().unwrap());
        assert_eq!(
            direct.expected,
            [id("spiffe://cluster.local/ns/default/sa/server")]
        );
        assert!(direct.service.is_none());

        let Route::Hbone(via_vip) = route("198.19.0.10:80") else {
            panic!("service VIP must tunnel to its endpoint");
        };
        assert_eq!(via_vip.dial, "198.18.1.10:15008".parse().unwrap());
        assert_eq!(
            via_vip.authority,
            "198.18.1.10:8080".parse().unwrap(),
            "port mapped"
        );
        assert_eq!(
            via_vip.expected,
            [
                id("spiffe://cluster.local/ns/default/sa/server"),
                id("spiffe://cluster.local/ns/default/sa/echo-alias"),
            ]
        );

        let cases: &[(&str, Route)] = &[
            ("127.0.0.1:15001", Route::Refuse(RouteRefusal::SelfCall)),
            ("127.0.0.1:15006", Route::Refuse(RouteRefusal::SelfCall)),
            ("127.0.0.1:15008", Route::Refuse(RouteRefusal::SelfCall)),
            ("[::1]:15008", Route::Refuse(RouteRefusal::SelfCall)),
            (
                "198.19.0.30:80",
                Route::Refuse(RouteRefusal::NoHealthyEndpoint(
                    "sick.default.svc.cluster.local".into(),
                )),
            ),
            (
                "198.18.9.9:80",
                Route::Passthrough {
                    target: "198.18.9.9:80".parse().unwrap(),
                    workload: None,
                    service: None,
                },
            ),
            (
                "127.0.0.1:8080",
                Route::Passthrough {
                    target: "127.0.0.1:8080".parse().unwrap(),
                    workload: None,
                    service: None,
                },
            ),
        ];
        for (dst, want) in cases {
            assert_eq!(&route(dst), want, "{dst}");
        }

        // A workload that speaks plain TCP gets plain TCP.
        let Route::Passthrough {
            target, workload, ..
        } = route("198.18.1.20:9000")
        else {
            panic!("TCP workload must pass through");
        };
        assert_eq!(target, "198.18.1.20:9000".parse().unwrap());
        assert_eq!(workload.unwrap().name.as_ref(), "legacy-0");

        // A non-loopback address on a proxy port is tunnelled normally; the
        // peer refuses it.
        assert!(matches!(route("198.18.1.10:15008"), Route::Hbone(_)));
    }

    #[test]
    fn endpoints_this_proxy_cannot_reach_are_refused_and_passthrough_services_pass_through() {
        use crate::state::{
            GatewayAddress, GatewayDestination, LoadBalancing, LoadBalancingMode, NetworkAddress,
        };
        let ip = |text: &str| text.parse::<std::net::IpAddr>().unwrap();
        let key = |text: &str| text.parse::<crate::state::NamespacedHostname>().unwrap();
        let mut state = State::new();
        for (hostname, vip) in [("remote", "10.96.0.1"), ("named", "10.96.0.2")] {
            state.insert_service(Service::for_test(
                "default",
                hostname,
                &[ip(vip)],
                &[(80, 8080)],
            ));
        }
        let mut open = Service::for_test("default", "open", &[ip("10.96.0.3")], &[(80, 8080)]);
        open.load_balancing = Some(LoadBalancing {
            mode: LoadBalancingMode::Passthrough,
            ..LoadBalancing::default()
        });
        state.insert_service(open);
        let mut remote = Workload::for_test("remote-pod", "default", &[]);
        remote.network = "far".into();
        remote.network_gateway = Some(Box::new(GatewayAddress {
            destination: GatewayDestination::Address(NetworkAddress {
                network: "far".into(),
                address: ip("192.0.2.1"),
            }),
            hbone_mtls_port: 15009,
        }));
        remote
            .services
            .insert(key("default/remote"), Default::default());
        state.insert_workload(remote);
        let mut named = Workload::for_test("named-pod", "default", &[]);
        named.hostname = "db.example".into();
        named
            .services
            .insert(key("default/named"), Default::default());
        state.insert_workload(named);

        let client = Workload::for_test("uid-client", "default", &[]);
        let route = |dst: &str| route(&state, &client, dst.parse().unwrap(), 0);
        assert_eq!(
            route("10.96.0.1:80"),
            Route::Refuse(RouteRefusal::OtherNetwork("remote-pod".into()))
        );
        assert_eq!(
            route("10.96.0.2:80"),
            Route::Refuse(RouteRefusal::Hostname("named-pod".into()))
        );
        assert_eq!(
            route("10.96.0.3:80"),
            Route::Passthrough {
                target: "10.96.0.3:80".parse().unwrap(),
                workload: None,
                service: None,
            }
        );
    }
}
