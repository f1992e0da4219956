//! `workloads[]` entries of the local config file (WIRE.md §11) and their
//! conversion into [`Workload`].

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use serde::Deserialize;
use ztunnel_certs::identity::IdentityError;

use super::values::{GatewayForm, Text};
use crate::state::workload::{identity_of, or_default};
use crate::state::{
    ApplicationTunnel, ApplicationTunnelProtocol, DEFAULT_CLUSTER_ID, HealthStatus,
    InboundProtocol, Locality, NamespacedHostname, NetworkMode, PortMap, Workload, WorkloadGroup,
    WorkloadType,
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

    /// The typed workload. Its identity must be buildable: a local workload
    /// exists to be served or reached, which needs one.
    pub(super) fn into_workload(self) -> Result<Workload, IdentityError> {
        let identity = identity_of(&self.trust_domain, &self.namespace, &self.service_account)?;
        Ok(Workload {
            uid: self.uid.into(),
            name: self.name.into(),
            namespace: self.namespace.into(),
            addresses: self
                .workload_ips
                .into_iter()
                .map(|ip| ip.to_canonical())
                .collect(),
            hostname: self.hostname.into(),
            network: self.network.into(),
            protocol: self.protocol.into(),
            identity,
            waypoint: self.waypoint.map(|gateway| Box::new(gateway.into())),
            network_gateway: self.network_gateway.map(|gateway| Box::new(gateway.into())),
            node: self.node.into(),
            group: Arc::new(WorkloadGroup {
                canonical_name: self.canonical_name.into(),
                canonical_revision: self.canonical_revision.into(),
                workload_type: self.workload_type.into(),
                workload_name: self.workload_name.into(),
                cluster_id: or_default(&self.cluster_id, DEFAULT_CLUSTER_ID),
                locality: self.locality.map(Into::into).unwrap_or_default(),
            }),
            native_tunnel: self.native_tunnel,
            authorization_policies: self
                .authorization_policies
                .into_iter()
                .map(Into::into)
                .collect(),
            status: self.status.into(),
            services: self
                .services
                .into_iter()
                .map(|(key, ports)| (key.0, ports))
                .collect(),
            application_tunnel: self.application_tunnel.map(Into::into),
            network_mode: self.network_mode.into(),
            capacity: self.capacity,
        })
    }
}

#[derive(Default, Deserialize)]
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

#[derive(Default, Deserialize)]
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

#[derive(Default, Deserialize)]
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
#[derive(Default, Deserialize)]
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

#[derive(Default, Deserialize)]
enum ApplicationTunnelProtocolForm {
    #[default]
    #[serde(rename = "NONE")]
    None,
    #[serde(rename = "PROXY")]
    Proxy,
}

impl From<ApplicationTunnelForm> for ApplicationTunnel {
    fn from(form: ApplicationTunnelForm) -> Self {
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

impl From<LocalityForm> for Locality {
    fn from(form: LocalityForm) -> Self {
        Locality {
            region: form.region.into(),
            zone: form.zone.into(),
            subzone: form.subzone.into(),
        }
    }
}
