//! The inbound decision, as a pure function: may a connection that arrived
//! for a local workload (over HBONE with a verified peer identity, or as
//! captured plaintext with none) reach it, and where is the application
//! dialled. The answer carries its HTTP status so that one place decides
//! what a refusal means on the wire (WIRE.md §4).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use ztunnel_certs::identity::Identity;

use crate::hbone::{Authority, InboundRefusal};
use crate::metrics::ResponseFlags;
use crate::ports::PROXY_PORTS;
use crate::rbac::{Connection, DenyReason, DryRunMatch, PolicyName, Verdict, authorize};
use crate::state::{
    ApplicationTunnel, ApplicationTunnelProtocol, GatewayTarget, Service, State, Workload,
    find_gateway,
};

/// What arrived, in plain data.
#[derive(Debug, Clone)]
pub struct Arrival {
    /// The peer's verified identity; `None` for plaintext (15006).
    pub peer_identity: Option<Identity>,
    /// The client's IP (the TCP peer of the tunnel or of the plaintext
    /// connection).
    pub source_ip: IpAddr,
    /// That peer's port, for the access log and the metrics' address.
    pub source_port: u16,
    /// The local address the connection arrived on: the IP of the local
    /// workload it is for.
    pub local_ip: IpAddr,
    /// The destination the connection is reported with: the CONNECT
    /// `:authority` when it is an address (for a hostname, the local IP
    /// with the authority's port), or the original destination for
    /// plaintext. What the client asked for is the [`Authority`] given to
    /// [`admit`].
    pub target: SocketAddr,
}

/// An accepted connection: dial `upstream` for `workload`.
#[derive(Debug, Clone)]
pub struct Admitted {
    /// The local destination workload.
    pub workload: Arc<Workload>,
    /// The application address: the IP the connection arrived on, with the
    /// authority's port (a hostname's mapped port), or the application
    /// tunnel's port when it names one.
    pub upstream: SocketAddr,
    /// For an application tunnel speaking PROXY, the destination its header
    /// carries: the authority, or for a hostname the service's VIP on our
    /// network with the authority's port.
    pub proxy_destination: Option<SocketAddr>,
    /// The authorization inputs, kept to re-check the connection when
    /// policies change.
    pub connection: Connection,
    /// Dry-run policies that matched, for the log.
    pub dry_run: Vec<DryRunMatch>,
    /// The ALLOW policy that let the connection in; `None` where the
    /// workload has none. For the log.
    pub allowed_by: Option<PolicyName>,
}

impl Admitted {
    /// Where a PROXY application tunnel is dialled when
    /// `LOCALHOST_APP_TUNNEL` holds: loopback of the upstream's family, on
    /// its port, so that only ztunnel reaches the tunnel's listener. `None`
    /// dials `upstream` itself, from the client's IP where the sockets
    /// allow.
    pub fn loopback_dial(&self, localhost_app_tunnel: bool) -> Option<SocketAddr> {
        if !localhost_app_tunnel || self.proxy_destination.is_none() {
            return None;
        }
        let loopback = match self.upstream {
            SocketAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
            SocketAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
        };
        Some(SocketAddr::new(loopback, self.upstream.port()))
    }
}

/// Why an inbound connection is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The authority's IP is not the address the connection arrived on, and
    /// the local workload is neither an application tunnel nor the
    /// waypoint of what the authority names.
    #[error("ip mismatch: {local} != {authority}")]
    AuthorityMismatch {
        /// The address the connection arrived on.
        local: IpAddr,
        /// The authority's IP.
        authority: IpAddr,
    },
    /// No local workload has the IP the connection arrived on.
    #[error("unknown destination workload {0}")]
    UnknownWorkload(IpAddr),
    /// No service has the authority's hostname.
    #[error("unknown service hostname {0}")]
    UnknownHostname(Arc<str>),
    /// The service named by hostname maps its port to no number for the
    /// local workload.
    #[error("no target port for {hostname}:{port}")]
    NoTargetPort {
        /// The service hostname.
        hostname: Arc<str>,
        /// The service port asked for.
        port: u16,
    },
    /// A PROXY header needs an address for a hostname authority, and its
    /// service has no VIP on our network.
    #[error("no VIP on this network for {0}")]
    NoServiceVip(Arc<str>),
    /// The target port is one of ztunnel's own.
    #[error("attempted recursive call to ourselves")]
    SelfCall,
    /// The workload's application tunnel speaks PROXY but names no port: the
    /// header would go to whichever port the client asked for.
    #[error("the destination's PROXY application tunnel names no port")]
    ProxyTunnelWithoutPort,
    /// Authorization policy refused it.
    #[error("{0}")]
    Denied(DenyReason),
}

/// What a refused inbound connection answers on the wire and how it is
/// counted: the one mapping of WIRE.md §4's statuses and the metrics'
/// response flags. A tunnelled connection gets the refusal's `:status`; a
/// plaintext one is closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RefusalAnswer {
    /// The HBONE response.
    pub refusal: InboundRefusal,
    /// The `response_flags` of its metrics.
    pub flags: ResponseFlags,
}

impl RefusalAnswer {
    /// Admitted, but the application could not be dialled.
    pub const UNREACHABLE: RefusalAnswer = RefusalAnswer {
        refusal: InboundRefusal::Unavailable("application unreachable"),
        flags: ResponseFlags::Connect,
    };
}

impl Refusal {
    /// The answer to this refusal.
    pub fn answer(&self) -> RefusalAnswer {
        let (refusal, flags) = match self {
            Refusal::AuthorityMismatch { .. } => (
                InboundRefusal::BadRequest("authority does not match the destination"),
                ResponseFlags::Connect,
            ),
            Refusal::UnknownWorkload(_) => (
                InboundRefusal::Unavailable("unknown destination workload"),
                ResponseFlags::Connect,
            ),
            Refusal::UnknownHostname(_) => (
                InboundRefusal::Unavailable("unknown service hostname"),
                ResponseFlags::Connect,
            ),
            Refusal::NoTargetPort { .. } => (
                InboundRefusal::Unavailable("no target port for the service port"),
                ResponseFlags::Connect,
            ),
            Refusal::NoServiceVip(_) => (
                InboundRefusal::Unavailable("no service VIP for the PROXY header"),
                ResponseFlags::Connect,
            ),
            Refusal::SelfCall => (
                InboundRefusal::Unavailable("recursive call to ztunnel"),
                ResponseFlags::Connect,
            ),
            Refusal::ProxyTunnelWithoutPort => (
                InboundRefusal::Unavailable("application tunnel without a port"),
                ResponseFlags::Connect,
            ),
            Refusal::Denied(_) => (InboundRefusal::Denied, ResponseFlags::Deny),
        };
        RefusalAnswer { refusal, flags }
    }
}

/// Decides an arrival asking for `authority` against the state (AMBIENT.md
/// §2.3). `local` limits the destination to the workloads this proxy
/// serves (the dedicated workload, or the pod whose namespace the listener
/// is in); the one the connection arrived for is found by the local IP.
pub fn admit(
    state: &State,
    network: &str,
    local: impl Fn(&Workload) -> bool,
    arrival: &Arrival,
    authority: &Authority,
) -> Result<Admitted, Refusal> {
    let workload = state
        .workload_by_address(network, arrival.local_ip)
        .filter(|workload| local(workload))
        .cloned()
        .ok_or(Refusal::UnknownWorkload(arrival.local_ip))?;
    // An application tunnel carries only connections whose peer was
    // verified (HBONE): it is where the application (a waypoint) reads who
    // connected. A plaintext connection goes to its original destination
    // with no header, as istio/ztunnel's passthrough sends it, so that a
    // client outside the mesh never reaches the tunnel's listener.
    let tunnel = workload
        .application_tunnel
        .filter(|_| arrival.peer_identity.is_some());
    let (port, service) = match authority {
        Authority::Address(address) => {
            let tunnelled = tunnel.is_some();
            check_destination(
                state,
                network,
                &workload,
                tunnelled,
                arrival.local_ip,
                address.ip(),
            )?;
            (address.port(), None)
        }
        Authority::Hostname { host, port } => {
            let (target, service) = service_target_port(state, &workload, host, *port)?;
            (target, Some(service))
        }
    };
    if PROXY_PORTS.contains(&port) {
        return Err(Refusal::SelfCall);
    }
    if let Some(ApplicationTunnel {
        protocol: ApplicationTunnelProtocol::Proxy,
        port: None,
    }) = tunnel
    {
        // Without a port of its own, the header would go to whatever port
        // the client named: any loopback listener of the pod.
        return Err(Refusal::ProxyTunnelWithoutPort);
    }
    let port = tunnel.and_then(|tunnel| tunnel.port).unwrap_or(port);
    let upstream = SocketAddr::new(arrival.local_ip, port);
    let proxy_destination = match tunnel.map(|tunnel| tunnel.protocol) {
        Some(ApplicationTunnelProtocol::Proxy) => {
            Some(header_destination(network, authority, service.as_deref())?)
        }
        Some(ApplicationTunnelProtocol::None) | None => None,
    };
    let connection = Connection {
        source_identity: arrival.peer_identity.clone(),
        source_ip: arrival.source_ip,
        destination_ip: upstream.ip(),
        destination_port: upstream.port(),
        destination_namespace: workload.namespace.clone(),
        destination_workload: workload.uid.clone(),
    };
    let decision = authorize(&connection, state.applicable_policies(&workload));
    match decision.verdict {
        Verdict::Allow => Ok(Admitted {
            workload,
            upstream,
            proxy_destination,
            connection,
            dry_run: decision.dry_run_matches,
            allowed_by: decision.allowed_by,
        }),
        Verdict::Deny(reason) => Err(Refusal::Denied(reason)),
    }
}

/// An `ip:port` authority other than the address the connection arrived
/// on is allowed in a waypoint sandwich only: the connection goes into the
/// local workload's application tunnel (`tunnelled`: the application reads
/// the authority from the PROXY header and decides), or the workload
/// stands behind the waypoint of what the authority names.
fn check_destination(
    state: &State,
    network: &str,
    workload: &Workload,
    tunnelled: bool,
    local_ip: IpAddr,
    authority: IpAddr,
) -> Result<(), Refusal> {
    let authority = authority.to_canonical();
    let allowed = authority == local_ip
        || tunnelled
        || is_waypoint_of(state, network, workload, local_ip, authority);
    match allowed {
        true => Ok(()),
        false => Err(Refusal::AuthorityMismatch {
            local: local_ip,
            authority,
        }),
    }
}

/// Whether `workload` (reached at `local_ip`) is the waypoint of the
/// workload or service (in that order, as the outbound side looks an
/// address up) at `target` on `network`: the waypoint resolves to a service
/// it is an endpoint of, or to a workload owning `local_ip`.
fn is_waypoint_of(
    state: &State,
    network: &str,
    workload: &Workload,
    local_ip: IpAddr,
    target: IpAddr,
) -> bool {
    let waypoint = match state.workload_by_address(network, target) {
        Some(target) => target.waypoint.as_deref(),
        None => match state.service_by_vip(network, target) {
            Some(service) => service.waypoint.as_ref(),
            None => None,
        },
    };
    match waypoint.and_then(|waypoint| find_gateway(state, waypoint)) {
        Some(GatewayTarget::Workload(waypoint)) => waypoint.addresses.contains(&local_ip),
        Some(service @ GatewayTarget::Service(_)) => service.has_instance(state, workload),
        None => false,
    }
}

/// The port a `host:port` authority reaches on `workload` (WIRE.md §4):
/// the service with that hostname, in the workload's namespace if there is
/// one, else the one a hostname lookup finds; the port from the workload's
/// own mapping of the service port, else the service's target port.
fn service_target_port(
    state: &State,
    workload: &Workload,
    host: &Arc<str>,
    port: u16,
) -> Result<(u16, Arc<Service>), Refusal> {
    let service = state
        .services_by_hostname(host)
        .find(|service| service.namespace == workload.namespace)
        .or_else(|| state.service_by_hostname(host))
        .ok_or_else(|| Refusal::UnknownHostname(host.clone()))?;
    let own = workload
        .services
        .get(&service.key())
        .and_then(|ports| ports.get(&port))
        .copied();
    match own.or_else(|| service.ports.get(&port).copied()) {
        Some(target) if target != 0 => Ok((target, service.clone())),
        _ => Err(Refusal::NoTargetPort {
            hostname: host.clone(),
            port,
        }),
    }
}

/// The destination a PROXY header names: the authority's address, or for
/// a hostname its service's VIP on `network`, IPv4 first, with the
/// authority's port (the header carries no names).
fn header_destination(
    network: &str,
    authority: &Authority,
    service: Option<&Service>,
) -> Result<SocketAddr, Refusal> {
    let (host, port) = match authority {
        Authority::Address(address) => return Ok(*address),
        Authority::Hostname { host, port } => (host, *port),
    };
    let vips = service
        .into_iter()
        .flat_map(|service| &service.vips)
        .filter(|vip| *vip.network == *network)
        .map(|vip| vip.address);
    let mut vips = vips.clone().filter(IpAddr::is_ipv4).chain(vips);
    match vips.next() {
        Some(vip) => Ok(SocketAddr::new(vip, port)),
        None => Err(Refusal::NoServiceVip(host.clone())),
    }
}

/// The workload the connection's source is reported as: the one owning
/// the source IP on our network, unless `forwarded_network` (the CONNECT's
/// `x-forwarded-network`) names another network, case aside: the
/// connection then came through a network gateway, whose IP the source is,
/// and the client's workload is unknown here (AMBIENT.md §3.5).
/// Authorization is not affected: it sees that IP with the peer's identity.
pub fn source_workload(
    state: &State,
    network: &str,
    source_ip: IpAddr,
    forwarded_network: Option<&str>,
) -> Option<Arc<Workload>> {
    let through_gateway =
        forwarded_network.is_some_and(|forwarded| !forwarded.eq_ignore_ascii_case(network));
    if through_gateway {
        return None;
    }
    state.workload_by_address(network, source_ip).cloned()
}

/// Re-checks an open connection after a policy change.
pub fn still_allowed(state: &State, connection: &Connection) -> Result<(), DenyReason> {
    let Some(workload) = state.workload(&connection.destination_workload) else {
        // The workload is gone: nothing to check its connections against;
        // its proxy is being torn down.
        return Ok(());
    };
    match authorize(connection, state.applicable_policies(workload)).verdict {
        Verdict::Allow => Ok(()),
        Verdict::Deny(reason) => Err(reason),
    }
}

/// The service a connection to `workload` on `port` most likely came
/// for, for the `destination_service*` labels and the log, as
/// istio/ztunnel guesses it: among the services `workload` is an endpoint
/// of, the one the client named (`host`: the `Forwarded` header's host, or
/// the hostname a CONNECT asked for), else the first with `port` among its
/// target ports (the service's own mapping, or the workload's for a named
/// port). `None` when no service of the workload fits.
pub fn inbound_service<'s>(
    state: &'s State,
    workload: &Workload,
    host: Option<&str>,
    port: u16,
) -> Option<&'s Arc<Service>> {
    let services = || {
        workload
            .services
            .iter()
            .filter_map(|(key, endpoint_ports)| Some((state.service(key)?, endpoint_ports)))
    };
    if let Some(host) = host
        && let Some((named, _)) = services().find(|(service, _)| &*service.hostname == host)
    {
        return Some(named);
    }
    services()
        .find(|(service, endpoint_ports)| {
            service.ports.iter().any(|(service_port, target_port)| {
                *target_port == port || endpoint_ports.get(service_port) == Some(&port)
            })
        })
        .map(|(service, _)| service)
}

#[cfg(test)]
mod tests;
