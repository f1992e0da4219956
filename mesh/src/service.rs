//! One service of the mesh file: a hostname, its VIPs and ports, and which
//! pods serve it (a label selector, or an explicit list of pod uids).
//!
//! Checks that need the rest of the file (unknown endpoint uids, duplicate
//! hostnames) are `snapshot.rs`'s.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use serde::{Deserialize, Deserializer};

use super::pod::Labels;
use super::text_value;

/// One service, as the mesh file spells it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Service {
    /// Service name.
    pub name: String,
    /// Service namespace.
    pub namespace: String,
    /// Fully qualified hostname, e.g. `echo.default.svc.cluster.local`.
    pub hostname: String,
    /// Virtual IPs, `"<network>/<ip>"` or a bare IP on the default network.
    /// None makes a headless service.
    #[serde(default)]
    pub vips: Vec<NetworkAddress>,
    /// Service port → target port on the endpoints.
    pub ports: BTreeMap<u16, u16>,
    /// Endpoints are the Running pods of the service's namespace carrying
    /// these labels. Exclusive with `endpoints`.
    #[serde(default)]
    pub selector: Option<Labels>,
    /// Endpoints named by pod uid, for pods no label selector describes.
    /// Exclusive with `selector`.
    #[serde(default)]
    pub endpoints: Option<Vec<String>>,
}

impl Service {
    /// The xDS resource name and `Workload.services` key:
    /// `<namespace>/<hostname>` (WIRE.md §7).
    pub fn resource_name(&self) -> String {
        format!("{}/{}", self.namespace, self.hostname)
    }
}

/// An IP on a network: `"<network>/<ip>"`, `"/<ip>"` or `"<ip>"` (the last
/// two on the default network, whose name is empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkAddress {
    /// Network name; empty is the default network.
    pub network: String,
    /// The address.
    pub address: IpAddr,
}

impl FromStr for NetworkAddress {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (network, ip) = text.rsplit_once('/').unwrap_or(("", text));
        let address = ip
            .parse::<IpAddr>()
            .map_err(|_| format!("invalid address {text:?}: expected \"<network>/<ip>\""))?;
        Ok(NetworkAddress {
            network: network.to_owned(),
            address,
        })
    }
}

impl fmt::Display for NetworkAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.address)
    }
}

impl<'de> Deserialize<'de> for NetworkAddress {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        text_value(deserializer, "an address \"<network>/<ip>\"")
    }
}
