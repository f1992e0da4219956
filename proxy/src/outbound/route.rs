//! The outbound decision, as a pure function: given the original destination
//! of a captured connection, tunnel it over HBONE (to the destination's
//! ztunnel or to a waypoint: to whom, with what `:authority`, expecting which
//! identities), tunnel it twice through another network's gateway, pass it
//! through as plain TCP, look up the address of an endpoint known by
//! hostname first, or refuse it. The rows of AMBIENT.md §2.1 in their
//! order are [`route`]'s body; which of a hostname's addresses to dial is
//! [`ResolveRoute::resolved`]. Moving the bytes and asking DNS are
//! `outbound.rs`'s business; what a gateway address names in the store is
//! `state/gateway.rs`'s.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use ztunnel_certs::identity::Identity;
use ztunnel_proto::ports::HBONE_PORT;

use crate::hbone::Authority;
use crate::ports::PROXY_PORTS;
use crate::state::{
    Destination, Endpoint, EndpointAddress, GatewayAddress, GatewayDestination, GatewayTarget,
    InboundProtocol, Resolution, Service, State, Workload, find_gateway, select_upstream,
    service_endpoint,
};

/// Where a captured outbound connection goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// Through an HBONE tunnel, to the destination's ztunnel or to a waypoint.
    Hbone(HboneRoute),
    /// Through an HBONE tunnel to another network's gateway, inside which a
    /// second one reaches the service there (AMBIENT.md §3.4).
    DoubleHbone(DoubleHboneRoute),
    /// As plain TCP to `target`; `workload` is the destination when known.
    Passthrough {
        /// The address to dial.
        target: SocketAddr,
        /// The known destination workload, for metrics and logs.
        workload: Option<Arc<Workload>>,
        /// The service whose VIP was dialled, if any.
        service: Option<Arc<Service>>,
    },
    /// To an endpoint known by hostname only: its addresses are looked up
    /// first (AMBIENT.md §4.6), then it is dialled as its IP would be.
    Resolve(ResolveRoute),
    /// Not at all.
    Refuse(RouteRefusal),
}

/// A connection to an endpoint addressed by hostname, waiting for the
/// hostname's addresses. Route and resolution are apart so that the route
/// stays a synchronous decision over the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolveRoute {
    /// The name to look up: the endpoint workload's `hostname`.
    pub hostname: Arc<str>,
    /// The connection's original destination, whose IP family the
    /// address dialled should have.
    pub original: IpAddr,
    /// The endpoint chosen, its port the one to deliver to.
    pub endpoint: Endpoint,
}

/// A workload reached at a known address: through an HBONE tunnel to its
/// ztunnel, or as plain TCP when it takes no tunnel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Direct {
    /// Through an HBONE tunnel to the workload's ztunnel.
    Hbone(HboneRoute),
    /// As plain TCP to `target`.
    Tcp {
        /// The address to dial.
        target: SocketAddr,
        /// The destination workload.
        workload: Arc<Workload>,
        /// The service whose VIP was dialled, if any.
        service: Option<Arc<Service>>,
    },
}

impl From<Direct> for Route {
    fn from(direct: Direct) -> Route {
        match direct {
            Direct::Hbone(hbone) => Route::Hbone(hbone),
            Direct::Tcp {
                target,
                workload,
                service,
            } => Route::Passthrough {
                target,
                workload: Some(workload),
                service,
            },
        }
    }
}

impl ResolveRoute {
    /// Where the connection goes once the hostname resolved to
    /// `addresses` (AMBIENT.md §4.6): to one of them of the original
    /// destination's family, else one of the other family, drawn with
    /// `pick`; tunnelled or not as the workload takes traffic. `None` when
    /// `addresses` is empty.
    pub fn resolved(&self, addresses: &[IpAddr], pick: u64) -> Option<Direct> {
        let ip = pick_address(addresses, self.original, pick)?;
        Some(at_address(ip, self.endpoint.clone()))
    }
}

/// An HBONE tunnel to open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HboneRoute {
    /// The peer's HBONE listener: the workload IP, port 15008, or a
    /// waypoint instance's address and HBONE port.
    pub dial: SocketAddr,
    /// The CONNECT `:authority`: the workload IP and target port, or, to a
    /// waypoint, the original destination.
    pub authority: SocketAddr,
    /// Identities the peer may present.
    pub expected: Vec<Identity>,
    /// The workload dialled: the destination, or the waypoint instance.
    pub workload: Arc<Workload>,
    /// The service whose VIP was dialled, if any.
    pub service: Option<Arc<Service>>,
    /// The waypoint the hop goes to, as the service or workload names it;
    /// `None` when the peer is the destination's own ztunnel. A waypoint
    /// hop never takes the same-node path: the waypoint, not the
    /// destination, must see the connection.
    pub waypoint: Option<GatewayAddress>,
}

/// A tunnel inside a tunnel: the outer one to another network's gateway,
/// pooled, the inner one through it to the service, never pooled
/// (AMBIENT.md §3.4, WIRE.md §4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DoubleHboneRoute {
    /// The gateway's HBONE address, dialled for the outer tunnel.
    pub dial: SocketAddr,
    /// The network gateway as the endpoint names it, for logs.
    pub gateway: GatewayAddress,
    /// The gateway workload reached, for metrics and logs.
    pub gateway_workload: Arc<Workload>,
    /// Identities the gateway may present: its workload's, and its
    /// service's `subject_alt_names` when it was reached through one.
    pub gateway_expected: Vec<Identity>,
    /// `<service hostname>:<service port>`, the `:authority` of both CONNECTs.
    pub authority: Authority,
    /// Identities the far end of the inner tunnel may present: only the
    /// service's `subject_alt_names`, since which workload behind the
    /// gateway takes it is not ours to know. An empty list fails every
    /// handshake.
    pub expected: Vec<Identity>,
    /// The endpoint picked beyond the gateway (a workload, often istiod's
    /// stand-in for a whole network, or the service's waypoint).
    pub workload: Arc<Workload>,
    /// The service dialled: only a service's name crosses a gateway.
    pub service: Arc<Service>,
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
    /// service serves and no hostname, or it is on another network that
    /// has no gateway.
    #[error("no valid routing destination for workload {0}")]
    NoValidDestination(Arc<str>),
    /// The waypoint of the service or workload names nothing in the store,
    /// or nothing of it can be dialled.
    #[error("unknown waypoint: {0} not found")]
    UnknownWaypoint(GatewayAddress),
    /// The network gateway of a remote endpoint names nothing in the
    /// store, or nothing of it can be dialled.
    #[error("unknown network gateway: {0} not found")]
    UnknownNetworkGateway(GatewayAddress),
    /// A workload on another network reached without a service: a network
    /// gateway forwards by service name only.
    #[error("workload {0} is on another network and was not addressed through a service")]
    NoService(Arc<str>),
}

/// Decides where a connection from the workload `source`, whose client is
/// at `source_ip`, to `dst` goes, in the order of AMBIENT.md §2.1. `pick`
/// is the connection's random number: it samples a service's weighted
/// waypoints and spreads connections across endpoints.
///
/// Addresses are looked up on the source's network, which is `NETWORK`
/// for the pods a proxy serves.
pub fn route(
    state: &State,
    source: &Workload,
    source_ip: IpAddr,
    dst: SocketAddr,
    pick: u64,
) -> Route {
    // Row 0.
    if dst.ip().is_loopback() && PROXY_PORTS.contains(&dst.port()) {
        return Route::Refuse(RouteRefusal::SelfCall);
    }
    let dst = SocketAddr::new(dst.ip().to_canonical(), dst.port());
    let client = Client {
        workload: source,
        ip: source_ip.to_canonical(),
    };
    decide(state, &client, dst, pick).unwrap_or_else(Route::Refuse)
}

/// The connecting side: the workload, and its client's address (the pod
/// IP in shared mode), which tells a waypoint's own traffic apart.
struct Client<'a> {
    workload: &'a Workload,
    ip: IpAddr,
}

/// Rows 1 to 6 of AMBIENT.md §2.1.
fn decide(
    state: &State,
    client: &Client<'_>,
    dst: SocketAddr,
    pick: u64,
) -> Result<Route, RouteRefusal> {
    let source = client.workload;
    // Row 1: a workload IP wins over a VIP here, unlike the lookup of row 3.
    let addressed = addressed_service(state, &source.network, dst.ip());
    // Row 2: a service's waypoint, Passthrough services included.
    if let Some(service) = addressed
        && let Some(waypoint) = sample_waypoint(service, pick)
    {
        return to_waypoint(
            state,
            source,
            waypoint,
            dst,
            Some(service),
            second_draw(pick),
        );
    }
    // Row 3.
    let upstream = match select_upstream(state, source, dst, pick) {
        Destination::Workload(upstream) => upstream,
        Destination::NoHealthyEndpoint { service } => {
            return Err(RouteRefusal::NoHealthyEndpoint(service.hostname.clone()));
        }
        Destination::Passthrough | Destination::Unknown => {
            return Ok(Route::Passthrough {
                target: dst,
                workload: None,
                service: None,
            });
        }
    };
    // Row 4: "same network" compares the workloads' own network fields.
    if upstream.workload.network != source.network {
        return through_gateway(
            state,
            source,
            upstream.workload,
            upstream.service,
            dst,
            pick,
        );
    }
    // Row 5: only traffic to a workload's own IP goes to its waypoint, and
    // not when the waypoint itself sends it on.
    if addressed.is_none()
        && let Some(waypoint) = upstream.workload.waypoint.as_deref()
        && !from_waypoint(state, waypoint, client)
    {
        return to_waypoint(state, source, waypoint, dst, None, pick);
    }
    // Row 6.
    direct(upstream, dst.ip())
}

/// The service `ip` addresses, when it is a VIP and no workload's IP.
fn addressed_service<'s>(state: &'s State, network: &str, ip: IpAddr) -> Option<&'s Arc<Service>> {
    match state.workload_by_address(network, ip) {
        Some(_) => None,
        None => state.service_by_vip(network, ip),
    }
}

/// The waypoint of `service` for one connection: one of its weighted
/// waypoints, drawn with `pick` in proportion to the weights; its
/// `waypoint` when it has none or their weights are all 0.
pub fn sample_waypoint(service: &Service, pick: u64) -> Option<&GatewayAddress> {
    let total: u64 = service
        .weighted_waypoints
        .iter()
        .map(|waypoint| u64::from(waypoint.weight))
        .sum();
    let Some(mut point) = pick.checked_rem(total) else {
        return service.waypoint.as_ref();
    };
    for waypoint in &service.weighted_waypoints {
        let weight = u64::from(waypoint.weight);
        if point < weight {
            return Some(&waypoint.destination);
        }
        point -= weight;
    }
    service.waypoint.as_ref()
}

/// A second random number from the connection's one, for a draw that must
/// not follow the first: the endpoint of a waypoint sampled with `pick`,
/// or of a gateway after the endpoint behind it. splitmix64's mixing step,
/// so that numbers close together land far apart.
fn second_draw(pick: u64) -> u64 {
    let mut z = pick.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Whether the connection comes from the waypoint `waypoint` names
/// (istio/ztunnel's `check_from_waypoint`): one of its instances has the
/// client's identity and owns the client's IP.
fn from_waypoint(state: &State, waypoint: &GatewayAddress, client: &Client<'_>) -> bool {
    let is_client = |instance: &Workload| {
        instance.identity == client.workload.identity && instance.addresses.contains(&client.ip)
    };
    match find_gateway(state, waypoint) {
        Some(GatewayTarget::Workload(instance)) => is_client(&instance),
        Some(GatewayTarget::Service(service)) => state
            .endpoints(&service.key())
            .any(|instance| is_client(instance)),
        None => false,
    }
}

/// The hop to `waypoint` for a connection to `dst` (through `service` when
/// it was service-addressed): always HBONE, with the original destination
/// as `:authority`. A waypoint on another network is reached through its
/// network's gateway.
fn to_waypoint(
    state: &State,
    source: &Workload,
    waypoint: &GatewayAddress,
    dst: SocketAddr,
    service: Option<&Arc<Service>>,
    pick: u64,
) -> Result<Route, RouteRefusal> {
    let unknown = || RouteRefusal::UnknownWaypoint(waypoint.clone());
    let hop = resolve_hop(state, source, waypoint, dst.ip(), HopKind::Waypoint, pick)
        .ok_or_else(unknown)?;
    if hop.workload.network != source.network {
        return through_gateway(state, source, hop.workload, service.cloned(), dst, pick);
    }
    Ok(Route::Hbone(HboneRoute {
        dial: hop.dial.ok_or_else(unknown)?,
        authority: dst,
        expected: hop.expected,
        workload: hop.workload,
        service: service.cloned(),
        waypoint: Some(waypoint.clone()),
    }))
}

/// The double tunnel to `workload`, an endpoint of `service` on another
/// network, through its network's gateway; `dst` is the original
/// destination, whose port is the service port.
fn through_gateway(
    state: &State,
    source: &Workload,
    workload: Arc<Workload>,
    service: Option<Arc<Service>>,
    dst: SocketAddr,
    pick: u64,
) -> Result<Route, RouteRefusal> {
    let Some(service) = service else {
        return Err(RouteRefusal::NoService(workload.uid.clone()));
    };
    let Some(gateway) = workload.network_gateway.as_deref() else {
        return Err(RouteRefusal::NoValidDestination(workload.uid.clone()));
    };
    let unknown = || RouteRefusal::UnknownNetworkGateway(gateway.clone());
    let hop = resolve_hop(
        state,
        source,
        gateway,
        dst.ip(),
        HopKind::NetworkGateway,
        second_draw(pick),
    )
    .ok_or_else(unknown)?;
    Ok(Route::DoubleHbone(DoubleHboneRoute {
        dial: hop.dial.ok_or_else(unknown)?,
        gateway: gateway.clone(),
        gateway_workload: hop.workload,
        gateway_expected: hop.expected,
        authority: Authority::Hostname {
            host: service.hostname.clone(),
            port: dst.port(),
        },
        expected: service.subject_alt_names.clone(),
        workload,
        service,
    }))
}

/// The tunnel to the destination's own ztunnel, or plain TCP to a
/// workload that takes no tunnel; for an endpoint known by hostname, the
/// lookup of its address first, whose family should be `original`'s.
fn direct(upstream: Endpoint, original: IpAddr) -> Result<Route, RouteRefusal> {
    let ip = match upstream.address {
        EndpointAddress::Ip(ip) => ip,
        EndpointAddress::Hostname => {
            return Ok(Route::Resolve(ResolveRoute {
                hostname: upstream.workload.hostname.clone(),
                original,
                endpoint: upstream,
            }));
        }
        EndpointAddress::NetworkGateway | EndpointAddress::Unreachable => {
            return Err(RouteRefusal::NoValidDestination(
                upstream.workload.uid.clone(),
            ));
        }
    };
    Ok(at_address(ip, upstream).into())
}

/// The workload of `upstream` reached at `ip` and the endpoint's port.
fn at_address(ip: IpAddr, upstream: Endpoint) -> Direct {
    let addr = SocketAddr::new(ip, upstream.port);
    match upstream.protocol() {
        InboundProtocol::Hbone => Direct::Hbone(HboneRoute {
            dial: SocketAddr::new(ip, HBONE_PORT),
            authority: addr,
            expected: upstream.expected_identities(),
            workload: upstream.workload,
            service: upstream.service,
            waypoint: None,
        }),
        InboundProtocol::Tcp => Direct::Tcp {
            target: addr,
            workload: upstream.workload,
            service: upstream.service,
        },
    }
}

/// What a gateway address is resolved for: the two differ in how a
/// service's endpoint is picked and what is dialled when it is named by
/// address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum HopKind {
    /// A waypoint (AMBIENT.md §2.2): a service's endpoint is picked in
    /// waypoint mode and dialled, whatever named the service.
    Waypoint,
    /// A network gateway (AMBIENT.md §3.4 step 1): a service's endpoint
    /// is picked as for any connection to the service; named by address,
    /// that address is dialled exactly.
    NetworkGateway,
}

/// One instance of a waypoint or gateway, chosen for a connection.
struct Hop {
    /// The instance.
    workload: Arc<Workload>,
    /// Where to dial it; `None` when it has no IP to dial (it may still be
    /// reached through its own network's gateway).
    dial: Option<SocketAddr>,
    /// Identities it may present: its own, then its service's SANs.
    expected: Vec<Identity>,
}

/// Resolves `gateway` to one instance (AMBIENT.md §2.2, §3.4): a workload
/// at its HBONE port, or an endpoint of a service. The IP family follows
/// the address the gateway is named by, else `original`, the
/// connection's destination. `None` when nothing matches.
fn resolve_hop(
    state: &State,
    source: &Workload,
    gateway: &GatewayAddress,
    original: IpAddr,
    kind: HopKind,
    pick: u64,
) -> Option<Hop> {
    let port = gateway.hbone_mtls_port;
    let named_ip = match &gateway.destination {
        GatewayDestination::Address(address) => Some(address.address),
        GatewayDestination::Hostname(_) => None,
    };
    match find_gateway(state, gateway)? {
        GatewayTarget::Workload(workload) => {
            let ip = named_ip.or_else(|| ip_of_family(&workload, original));
            Some(Hop {
                dial: ip.map(|ip| SocketAddr::new(ip, port)),
                expected: vec![workload.identity.clone()],
                workload,
            })
        }
        GatewayTarget::Service(service) => {
            let resolution = match kind {
                HopKind::Waypoint => Resolution::Waypoint,
                HopKind::NetworkGateway => Resolution::Standard,
            };
            let toward = SocketAddr::new(named_ip.unwrap_or(original), port);
            let Destination::Workload(endpoint) =
                service_endpoint(state, source, &service, toward, resolution, pick)
            else {
                return None;
            };
            let dial = match (kind, named_ip) {
                (HopKind::NetworkGateway, Some(ip)) => Some(SocketAddr::new(ip, port)),
                _ => endpoint.socket_addr(),
            };
            Some(Hop {
                dial,
                expected: endpoint.expected_identities(),
                workload: endpoint.workload,
            })
        }
    }
}

/// One of `addresses` of `original`'s family, else of the other, drawn
/// with `pick`.
fn pick_address(addresses: &[IpAddr], original: IpAddr, pick: u64) -> Option<IpAddr> {
    let of_family = |ipv6: bool| addresses.iter().filter(move |ip| ip.is_ipv6() == ipv6);
    let wanted = original.is_ipv6();
    let family = if of_family(wanted).next().is_some() {
        wanted
    } else {
        !wanted
    };
    let count = u64::try_from(of_family(family).count()).ok()?;
    let index = usize::try_from(pick.checked_rem(count)?).ok()?;
    of_family(family).nth(index).copied()
}

/// The first of the workload's IPs in `original`'s family, else its first.
fn ip_of_family(workload: &Workload, original: IpAddr) -> Option<IpAddr> {
    workload
        .addresses
        .iter()
        .find(|ip| ip.is_ipv6() == original.is_ipv6())
        .or_else(|| workload.addresses.first())
        .copied()
}

#[cfg(test)]
mod tests;
