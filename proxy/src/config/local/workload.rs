//! `workloads[]` entries of the local config file (WIRE.md §11) and their
//! conversion into [`Workload`].

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::Deserialize;
use ztunnel_certs::identity::IdentityError;

use super::values::{GatewayForm, Text};
use crate::state::intern::GroupParts;
use crate::state::workload::{identity_of, or_default};
use crate::state::{
    ApplicationTunnel, ApplicationTunnelProtocol, DEFAULT_CLUSTER_ID, HealthStatus,
    InboundProtocol, Interner, NamespacedHostname, NetworkMode, PortMap, Workload, WorkloadType,
};

/// One `workloads[]` entry as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct WorkloadForm {
    uid: String,
    name: String,
    namespace: String,
    workload_ips: Vec<IpAddr>,
    #[serde(default)]
    protocol: ProtocolForm,
    #[serde(default)]
    network_mode: NetworkModeForm,
    #[serde(default)]
    trust_domain: String,
    #[serde(default)]
    service_account: String,
    #[serde(default)]
    network: String,
    #[serde(default)]
    workload_name: String,
    #[serde(default)]
    workload_type: WorkloadTypeForm,
    #[serde(default)]
    canonical_name: String,
    #[serde(default)]
    canonical_revision: String,
    #[serde(default)]
    hostname: String,
    #[serde(default)]
    node: String,
    #[serde(default)]
    native_tunnel: bool,
    #[serde(default)]
    application_tunnel: Option<ApplicationTunnelForm>,
    #[serde(default)]
    authorization_policies: Vec<String>,
    #[serde(default)]
    status: StatusForm,
    #[serde(default)]
    cluster_id: String,
    #[serde(default)]
    locality: Option<LocalityForm>,
    #[serde(default = "default_capacity")]
    capacity: u32,
    #[serde(default)]
    waypoint: Option<GatewayForm>,
    #[serde(default)]
    network_gateway: Option<GatewayForm>,
    services: BTreeMap<Text<NamespacedHostname>, PortMap>,
}

fn default_capacity() -> u32 {
    1
}

impl WorkloadForm {
    /// The uid, to name the entry in errors.
    pub(super) fn uid(&self) -> &str {
        &self.uid
    }

    /// The typed workload, every repeated value taken from `interner` and
    /// nothing borrowed from the form: what the store keeps is allocated
    /// here, not by the parse. Its identity must be buildable: a local
    /// workload exists to be served or reached, which needs one.
    pub(super) fn to_workload(&self, interner: &mut Interner) -> Result<Workload, IdentityError> {
        let identity = identity_of(
            interner,
            &self.trust_domain,
            &self.namespace,
            &self.service_account,
        )?;
        let locality = self.locality.as_ref();
        let part = |part: fn(&LocalityForm) -> &str| locality.map_or("", part);
        let group = interner.group(GroupParts {
            canonical_name: &self.canonical_name,
            canonical_revision: &self.canonical_revision,
            workload_type: self.workload_type.into(),
            workload_name: &self.workload_name,
            cluster_id: or_default(&self.cluster_id, DEFAULT_CLUSTER_ID),
            region: part(|locality| &locality.region),
            zone: part(|locality| &locality.zone),
            subzone: part(|locality| &locality.subzone),
        });
        let services = self
            .services
            .iter()
            .map(|(key, ports)| {
                let key = interner.key(&key.0.namespace, &key.0.hostname);
                (key, ports.clone())
            })
            .collect();
        let converted = Workload {
            uid: self.uid.as_str().into(),
            name: self.name.as_str().into(),
            namespace: interner.str(&self.namespace),
            addresses: self
                .workload_ips
                .iter()
                .map(|ip| ip.to_canonical())
                .collect(),
            hostname: interner.str(&self.hostname),
            network: interner.str(&self.network),
            protocol: self.protocol.into(),
            identity,
            waypoint: self
                .waypoint
                .as_ref()
                .map(|gateway| Box::new(gateway.to_gateway(interner))),
            network_gateway: self
                .network_gateway
                .as_ref()
                .map(|gateway| Box::new(gateway.to_gateway(interner))),
            node: interner.str(&self.node),
            group,
            native_tunnel: self.native_tunnel,
            authorization_policies: self
                .authorization_policies
                .iter()
                .map(|name| interner.str(name))
                .collect(),
            status: self.status.into(),
            services: interner.services(services),
            application_tunnel: self.application_tunnel.as_ref().map(Into::into),
            network_mode: self.network_mode.into(),
            capacity: self.capacity,
        };
        interner.sweep_if_grown();
        Ok(converted)
    }
}

#[derive(Clone, Copy, Default, Deserialize)]
enum ProtocolForm {
    #[default]
    #[serde(rename = "TCP")]
    Tcp,
    #[serde(rename = "HBONE")]
    Hbone,
}

impl From<ProtocolForm> for InboundProtocol {
    fn from(form: ProtocolForm) -> Self {
        match form {
            ProtocolForm::Tcp => InboundProtocol::Tcp,
            ProtocolForm::Hbone => InboundProtocol::Hbone,
        }
    }
}

#[derive(Clone, Copy, Default, Deserialize)]
enum NetworkModeForm {
    #[default]
    Standard,
    HostNetwork,
}

impl From<NetworkModeForm> for NetworkMode {
    fn from(form: NetworkModeForm) -> Self {
        match form {
            NetworkModeForm::Standard => NetworkMode::Standard,
            NetworkModeForm::HostNetwork => NetworkMode::HostNetwork,
        }
    }
}

#[derive(Clone, Copy, Default, Deserialize)]
enum StatusForm {
    #[default]
    Healthy,
    Unhealthy,
}

impl From<StatusForm> for HealthStatus {
    fn from(form: StatusForm) -> Self {
        match form {
            StatusForm::Healthy => HealthStatus::Healthy,
            StatusForm::Unhealthy => HealthStatus::Unhealthy,
        }
    }
}

/// Lower-case, as telemetry prints it.
#[derive(Clone, Copy, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
enum WorkloadTypeForm {
    #[default]
    Deployment,
    Cronjob,
    Pod,
    Job,
}

impl From<WorkloadTypeForm> for WorkloadType {
    fn from(form: WorkloadTypeForm) -> Self {
        match form {
            WorkloadTypeForm::Deployment => WorkloadType::Deployment,
            WorkloadTypeForm::Cronjob => WorkloadType::CronJob,
            WorkloadTypeForm::Pod => WorkloadType::Pod,
            WorkloadTypeForm::Job => WorkloadType::Job,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ApplicationTunnelForm {
    #[serde(default)]
    protocol: ApplicationTunnelProtocolForm,
    #[serde(default)]
    port: Option<u16>,
}

#[derive(Clone, Copy, Default, Deserialize)]
enum ApplicationTunnelProtocolForm {
    #[default]
    #[serde(rename = "NONE")]
    None,
    #[serde(rename = "PROXY")]
    Proxy,
}

impl From<&ApplicationTunnelForm> for ApplicationTunnel {
    fn from(form: &ApplicationTunnelForm) -> Self {
        let protocol = match form.protocol {
            ApplicationTunnelProtocolForm::None => ApplicationTunnelProtocol::None,
            ApplicationTunnelProtocolForm::Proxy => ApplicationTunnelProtocol::Proxy,
        };
        ApplicationTunnel {
            protocol,
            port: form.port.filter(|port| *port != 0),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LocalityForm {
    #[serde(default)]
    region: String,
    #[serde(default)]
    zone: String,
    #[serde(default)]
    subzone: String,
}
