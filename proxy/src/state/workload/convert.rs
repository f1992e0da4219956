//! A workload from `istio.workload.Workload` (WIRE.md §8), applying the §7
//! rejection rules, its repeated values taken from the interner.

use ztunnel_certs::identity::{Identity, IdentityError};
use ztunnel_proto::istio::workload as proto;

use super::{
    ApplicationTunnel, ApplicationTunnelProtocol, DEFAULT_CLUSTER_ID, DEFAULT_SERVICE_ACCOUNT,
    DEFAULT_TRUST_DOMAIN, HealthStatus, InboundProtocol, NetworkMode, Workload, WorkloadType,
    or_default, port_map_from_proto,
};
use crate::cidr::ip_from_bytes;
use crate::state::ResourceError;
use crate::state::intern::{GroupParts, Interner};
use crate::state::network::{GatewayAddress, port_from_proto, split_key};

impl TryFrom<&proto::Workload> for Workload {
    type Error = ResourceError;

    /// Converts with an interner of its own: nothing is shared with other
    /// workloads. Sources that keep workloads use [`Workload::from_proto`].
    fn try_from(workload: &proto::Workload) -> Result<Self, Self::Error> {
        Workload::from_proto(workload, &mut Interner::new())
    }
}

impl Workload {
    /// Converts `workload`, taking every repeated value from `interner`.
    pub fn from_proto(
        workload: &proto::Workload,
        interner: &mut Interner,
    ) -> Result<Self, ResourceError> {
        let addresses = workload
            .addresses
            .iter()
            .map(|bytes| ip_from_bytes(bytes))
            .collect::<Result<_, _>>()?;
        let services = workload
            .services
            .iter()
            .map(|(key, ports)| {
                let (namespace, hostname) = split_key(key)?;
                Ok((
                    interner.key(namespace, hostname),
                    port_map_from_proto(&ports.ports)?,
                ))
            })
            .collect::<Result<_, ResourceError>>()?;
        let locality = workload.locality.as_ref();
        let part = |part: fn(&proto::Locality) -> &str| locality.map_or("", part);
        let group = interner.group(GroupParts {
            canonical_name: &workload.canonical_name,
            canonical_revision: &workload.canonical_revision,
            workload_type: workload_type_from_proto(workload.workload_type),
            workload_name: &workload.workload_name,
            cluster_id: or_default(&workload.cluster_id, DEFAULT_CLUSTER_ID),
            region: part(|locality| &locality.region),
            zone: part(|locality| &locality.zone),
            subzone: part(|locality| &locality.subzone),
        });
        let converted = Workload {
            uid: workload.uid.as_str().into(),
            name: workload.name.as_str().into(),
            namespace: interner.str(&workload.namespace),
            addresses,
            hostname: interner.str(&workload.hostname),
            network: interner.str(&workload.network),
            protocol: protocol_from_proto(workload.tunnel_protocol)?,
            identity: identity_of(
                interner,
                &workload.trust_domain,
                &workload.namespace,
                &workload.service_account,
            )
            .map_err(ResourceError::Identity)?,
            waypoint: gateway_from_proto(workload.waypoint.as_ref(), interner)?,
            network_gateway: gateway_from_proto(workload.network_gateway.as_ref(), interner)?,
            node: interner.str(&workload.node),
            group,
            native_tunnel: workload.native_tunnel,
            authorization_policies: workload
                .authorization_policies
                .iter()
                .map(|name| interner.str(name))
                .collect(),
            status: status_from_proto(workload.status)?,
            services: interner.services(services),
            application_tunnel: workload
                .application_tunnel
                .as_ref()
                .map(application_tunnel_from_proto)
                .transpose()?,
            network_mode: network_mode_from_proto(workload.network_mode)?,
            capacity: workload.capacity.unwrap_or(1),
        };
        interner.sweep_if_grown();
        Ok(converted)
    }
}

/// The shared identity of a workload's parts, empty ones defaulted
/// (WIRE.md §2).
pub(crate) fn identity_of(
    interner: &mut Interner,
    trust_domain: &str,
    namespace: &str,
    service_account: &str,
) -> Result<Identity, IdentityError> {
    interner.identity(
        or_default(trust_domain, DEFAULT_TRUST_DOMAIN),
        namespace,
        or_default(service_account, DEFAULT_SERVICE_ACCOUNT),
    )
}

fn gateway_from_proto(
    gateway: Option<&proto::GatewayAddress>,
    interner: &mut Interner,
) -> Result<Option<Box<GatewayAddress>>, ResourceError> {
    gateway
        .map(|gateway| {
            let gateway = GatewayAddress::try_from(gateway)?;
            Ok(Box::new(interner.gateway(&gateway)))
        })
        .transpose()
}

fn protocol_from_proto(value: i32) -> Result<InboundProtocol, ResourceError> {
    match proto::TunnelProtocol::try_from(value) {
        Ok(proto::TunnelProtocol::None) => Ok(InboundProtocol::Tcp),
        Ok(proto::TunnelProtocol::Hbone) => Ok(InboundProtocol::Hbone),
        Ok(proto::TunnelProtocol::LegacyIstioMtls) => Err(ResourceError::LegacyIstioMtls),
        Err(unknown) => Err(ResourceError::UnknownEnum {
            field: "tunnel_protocol",
            value: unknown,
        }),
    }
}

fn status_from_proto(value: i32) -> Result<HealthStatus, ResourceError> {
    match proto::WorkloadStatus::try_from(value) {
        Ok(proto::WorkloadStatus::Healthy) => Ok(HealthStatus::Healthy),
        Ok(proto::WorkloadStatus::Unhealthy) => Ok(HealthStatus::Unhealthy),
        Err(unknown) => Err(ResourceError::UnknownEnum {
            field: "status",
            value: unknown,
        }),
    }
}

fn network_mode_from_proto(value: i32) -> Result<NetworkMode, ResourceError> {
    match proto::NetworkMode::try_from(value) {
        Ok(proto::NetworkMode::Standard) => Ok(NetworkMode::Standard),
        Ok(proto::NetworkMode::HostNetwork) => Ok(NetworkMode::HostNetwork),
        Err(unknown) => Err(ResourceError::UnknownEnum {
            field: "network_mode",
            value: unknown,
        }),
    }
}

/// Unknown values read as `DEPLOYMENT` (WIRE.md §8): the type only labels telemetry.
fn workload_type_from_proto(value: i32) -> WorkloadType {
    match proto::WorkloadType::try_from(value) {
        Ok(proto::WorkloadType::Cronjob) => WorkloadType::CronJob,
        Ok(proto::WorkloadType::Pod) => WorkloadType::Pod,
        Ok(proto::WorkloadType::Job) => WorkloadType::Job,
        Ok(proto::WorkloadType::Deployment) | Err(_) => WorkloadType::Deployment,
    }
}

fn application_tunnel_from_proto(
    tunnel: &proto::ApplicationTunnel,
) -> Result<ApplicationTunnel, ResourceError> {
    use proto::application_tunnel::Protocol;
    let protocol = match Protocol::try_from(tunnel.protocol) {
        Ok(Protocol::None) => ApplicationTunnelProtocol::None,
        Ok(Protocol::Proxy) => ApplicationTunnelProtocol::Proxy,
        Err(unknown) => {
            return Err(ResourceError::UnknownEnum {
                field: "application_tunnel.protocol",
                value: unknown,
            });
        }
    };
    let port = Some(port_from_proto(tunnel.port)?).filter(|port| *port != 0);
    Ok(ApplicationTunnel { protocol, port })
}
