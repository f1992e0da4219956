//! Where traffic is sent instead of straight to a workload: waypoints (a
//! proxy a service's or a pod's traffic goes through, AMBIENT.md §1) and
//! network gateways (the way into another network, §3.2), as the mesh
//! model spells them. The mesh file writes them by hand; the Kubernetes
//! conversion derives them from Gateway API objects
//! (`kube/convert/waypoint.rs`). What they become on the wire is
//! `xds/resources.rs`'s business.
//!
//! A waypoint may name a service of the mesh by name; `MeshSnapshot::new`
//! turns that into the service's hostname (and refuses an unknown name),
//! so readers of a snapshot see hostnames and addresses only.

use std::fmt;
use std::net::IpAddr;

use serde::Deserialize;

use super::service::NetworkAddress;

/// The port waypoints and gateways take HBONE on when none is given:
/// HBONE's port (`ztunnel_proto::ports::HBONE_PORT`, which this crate does
/// not depend on). istiod always sends it for waypoints.
pub const WAYPOINT_HBONE_PORT: u16 = 15008;

/// A waypoint or gateway: what it is, and the port it takes HBONE on.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "GatewayAddressForm")]
pub struct GatewayAddress {
    /// Where it is.
    pub destination: GatewayDestination,
    /// The port it takes HBONE on.
    pub hbone_mtls_port: u16,
}

impl GatewayAddress {
    /// A waypoint at `destination` on HBONE's port.
    pub fn waypoint(destination: GatewayDestination) -> Self {
        GatewayAddress {
            destination,
            hbone_mtls_port: WAYPOINT_HBONE_PORT,
        }
    }
}

/// Where a waypoint or gateway is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GatewayDestination {
    /// A service of the mesh file by name: `<name>` (the referrer's
    /// namespace) or `<namespace>/<name>`. Only the file writes this;
    /// `MeshSnapshot::new` replaces it with the service's hostname.
    Service {
        /// The service's namespace; absent, the referrer's.
        namespace: Option<String>,
        /// The service's name.
        name: String,
    },
    /// A service (or a workload with that hostname) in a namespace.
    Hostname {
        /// The namespace.
        namespace: String,
        /// The fully qualified hostname.
        hostname: String,
    },
    /// An address on a network: a service VIP or a workload IP.
    Address(NetworkAddress),
}

impl fmt::Display for GatewayDestination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GatewayDestination::Service {
                namespace: Some(namespace),
                name,
            } => write!(f, "service {namespace}/{name}"),
            GatewayDestination::Service {
                namespace: None,
                name,
            } => write!(f, "service {name}"),
            GatewayDestination::Hostname {
                namespace,
                hostname,
            } => write!(f, "{namespace}/{hostname}"),
            GatewayDestination::Address(address) => write!(f, "{address}"),
        }
    }
}

/// The file's spelling of a [`GatewayAddress`]: exactly one of `service`
/// (`name` or `namespace/name`), `hostname` (with `namespace`) or
/// `address` (`"<network>/<ip>"`), and an optional `port`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GatewayAddressForm {
    #[serde(default)]
    service: Option<String>,
    #[serde(default)]
    hostname: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    address: Option<NetworkAddress>,
    #[serde(default = "default_port")]
    port: u16,
}

fn default_port() -> u16 {
    WAYPOINT_HBONE_PORT
}

impl TryFrom<GatewayAddressForm> for GatewayAddress {
    type Error = String;

    fn try_from(form: GatewayAddressForm) -> Result<Self, String> {
        let destination = match (form.service, form.hostname, form.namespace, form.address) {
            (Some(service), None, None, None) => match service.split_once('/') {
                Some((namespace, name)) => GatewayDestination::Service {
                    namespace: Some(namespace.to_owned()),
                    name: name.to_owned(),
                },
                None => GatewayDestination::Service {
                    namespace: None,
                    name: service,
                },
            },
            (None, Some(hostname), Some(namespace), None) => GatewayDestination::Hostname {
                namespace,
                hostname,
            },
            (None, None, None, Some(address)) => GatewayDestination::Address(address),
            _ => {
                return Err(
                    "expected one of {service}, {hostname, namespace} or {address}, \
                     each with an optional port"
                        .to_owned(),
                );
            }
        };
        if form.port == 0 {
            return Err("port 0: a waypoint takes HBONE on a port".to_owned());
        }
        Ok(GatewayAddress {
            destination,
            hbone_mtls_port: form.port,
        })
    }
}

/// One waypoint of a weighted set (a canary beside the primary).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WeightedWaypoint {
    /// The waypoint.
    pub waypoint: GatewayAddress,
    /// Its share is weight / sum of weights; 0 takes no traffic.
    pub weight: u32,
}

/// How a waypoint's own pods take traffic handed to them by their node's
/// proxy (`Workload.application_tunnel`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApplicationTunnel {
    /// What is written before the bytes.
    pub protocol: TunnelHeader,
    /// The port it listens on; 0 keeps the original port.
    #[serde(default)]
    pub port: u16,
}

/// `ApplicationTunnel.protocol`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum TunnelHeader {
    /// The bytes as they came.
    #[serde(rename = "NONE")]
    None,
    /// A PROXY protocol v2 header first.
    #[serde(rename = "PROXY")]
    Proxy,
}

/// A gateway into a network, for workloads of that network reached from
/// another one. It is also sent as a workload of its own, so node proxies
/// know its identity.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "NetworkGatewayForm")]
pub struct NetworkGateway {
    /// The network it leads into.
    pub network: String,
    /// The namespace it runs in (its identity's).
    pub namespace: String,
    /// Its service account (its identity's).
    pub service_account: String,
    /// Where it is: an address on `network` or a hostname in `namespace`.
    pub destination: GatewayDestination,
    /// The port it takes HBONE on; 0 when it is not known, which keeps it
    /// from being any workload's gateway.
    pub hbone_mtls_port: u16,
}

impl NetworkGateway {
    /// Its workload's uid and name: `NetworkGateway/<network>/<addr>/<port>`.
    pub fn workload_uid(&self) -> String {
        let address = match &self.destination {
            GatewayDestination::Address(address) => address.address.to_string(),
            GatewayDestination::Hostname { hostname, .. } => hostname.clone(),
            GatewayDestination::Service { name, .. } => name.clone(),
        };
        format!(
            "NetworkGateway/{}/{address}/{}",
            self.network, self.hbone_mtls_port
        )
    }
}

/// The file's spelling of a [`NetworkGateway`]: `address` (an IP on
/// `network`) or `hostname`, not both.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct NetworkGatewayForm {
    #[serde(default)]
    network: String,
    namespace: String,
    service_account: String,
    #[serde(default)]
    address: Option<IpAddr>,
    #[serde(default)]
    hostname: Option<String>,
    #[serde(default = "default_port")]
    port: u16,
}

impl TryFrom<NetworkGatewayForm> for NetworkGateway {
    type Error = String;

    fn try_from(form: NetworkGatewayForm) -> Result<Self, String> {
        let destination = match (form.address, form.hostname) {
            (Some(address), None) => GatewayDestination::Address(NetworkAddress {
                network: form.network.clone(),
                address,
            }),
            (None, Some(hostname)) => GatewayDestination::Hostname {
                namespace: form.namespace.clone(),
                hostname,
            },
            _ => return Err("a network gateway has an address or a hostname".to_owned()),
        };
        Ok(NetworkGateway {
            network: form.network,
            namespace: form.namespace,
            service_account: form.service_account,
            destination,
            hbone_mtls_port: form.port,
        })
    }
}
