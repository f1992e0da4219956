//! Addresses as the mesh names them: an IP on a network, a CIDR, a
//! `namespace/hostname` pair, and the address of a gateway or waypoint.
//!
//! Conversions from the wire forms live here too, so that every resource
//! applies the same WIRE.md §7 rules to its addresses. Text forms of the local
//! config file are parsed in `config/local`.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;
use std::sync::Arc;

use ztunnel_proto::istio::workload as proto;

use super::ResourceError;
use crate::cidr::{Cidr, ip_from_bytes, max_prefix_len};

/// An IP address inside one network. Two networks may reuse the same IPs, so
/// an IP alone does not name an endpoint.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NetworkAddress {
    /// Network name; empty is the default network.
    pub network: Arc<str>,
    /// The address, in canonical form (an IPv4-mapped IPv6 address is IPv4).
    pub address: IpAddr,
}

impl fmt::Display for NetworkAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.address)
    }
}

/// A CIDR inside one network: a service VIP that covers a range.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NetworkCidr {
    /// Network name; empty is the default network.
    pub network: Arc<str>,
    /// The range.
    pub cidr: Cidr,
}

/// `namespace/hostname`: the key of a service, in the store and in a
/// workload's `services` map.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NamespacedHostname {
    /// Kubernetes namespace of the service.
    pub namespace: Arc<str>,
    /// The service's FQDN.
    pub hostname: Arc<str>,
}

impl FromStr for NamespacedHostname {
    type Err = ResourceError;

    /// Splits at the first `/`; a key without one is rejected (WIRE.md §7).
    fn from_str(key: &str) -> Result<Self, Self::Err> {
        let (namespace, hostname) = split_key(key)?;
        Ok(NamespacedHostname {
            namespace: namespace.into(),
            hostname: hostname.into(),
        })
    }
}

impl fmt::Display for NamespacedHostname {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.hostname)
    }
}

/// The namespace and hostname of a `namespace/hostname` key, split at the
/// first `/`; a key without one is rejected (WIRE.md §7).
pub(crate) fn split_key(key: &str) -> Result<(&str, &str), ResourceError> {
    key.split_once('/')
        .ok_or_else(|| ResourceError::NamespacedHostname(key.into()))
}

/// Where a waypoint or network gateway is reached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GatewayAddress {
    /// Its address or its service name.
    pub destination: GatewayDestination,
    /// Its HBONE port, normally 15008.
    pub hbone_mtls_port: u16,
}

/// A gateway is named either by address or by service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GatewayDestination {
    /// A workload or VIP address.
    Address(NetworkAddress),
    /// A service, resolved through the store when used.
    Hostname(NamespacedHostname),
}

/// `namespace/hostname:port` or `network/ip:port`, as refusals and logs name
/// a gateway.
impl fmt::Display for GatewayAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.destination {
            GatewayDestination::Hostname(name) => write!(f, "{name}")?,
            GatewayDestination::Address(address) => {
                write!(f, "{}/{}", address.network, address.address)?;
            }
        }
        write!(f, ":{}", self.hbone_mtls_port)
    }
}

impl TryFrom<&proto::GatewayAddress> for GatewayAddress {
    type Error = ResourceError;

    fn try_from(gateway: &proto::GatewayAddress) -> Result<Self, Self::Error> {
        use proto::gateway_address::Destination;
        let destination = match &gateway.destination {
            Some(Destination::Address(address)) => {
                // A gateway is one host; a prefix length is checked but unused.
                let (address, _prefix) = network_address_from_proto(address)?;
                GatewayDestination::Address(address)
            }
            Some(Destination::Hostname(name)) => GatewayDestination::Hostname(NamespacedHostname {
                namespace: name.namespace.as_str().into(),
                hostname: name.hostname.as_str().into(),
            }),
            None => return Err(ResourceError::GatewayWithoutDestination),
        };
        Ok(GatewayAddress {
            destination,
            hbone_mtls_port: port_from_proto(gateway.hbone_mtls_port)?,
        })
    }
}

/// The address and, when the message carries a prefix shorter than a host's,
/// that prefix length. A prefix above the family's maximum is rejected.
pub(crate) fn network_address_from_proto(
    address: &proto::NetworkAddress,
) -> Result<(NetworkAddress, Option<u8>), ResourceError> {
    let ip = ip_from_bytes(&address.address)?;
    let prefix = match address.length {
        None => None,
        Some(length) => {
            let cidr = Cidr::new(ip, length)?;
            (cidr.prefix_len() < max_prefix_len(ip)).then_some(cidr.prefix_len())
        }
    };
    Ok((
        NetworkAddress {
            network: address.network.as_str().into(),
            address: ip,
        },
        prefix,
    ))
}

/// A port number from its `uint32` wire form.
pub(crate) fn port_from_proto(port: u32) -> Result<u16, ResourceError> {
    u16::try_from(port).map_err(|_| ResourceError::PortOutOfRange(port))
}
