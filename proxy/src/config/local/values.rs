//! Scalar forms of the local config file that name mesh values: addresses
//! `"<network>/<ip>"`, CIDR VIPs, `namespace/hostname` keys, identities and
//! gateway destinations. A policy's CIDRs and string matches are forms of
//! the policy's own types (`cidr.rs`, `rbac/form.rs`).
//!
//! Each is parsed inside deserialization, so that a bad value is reported
//! with the line and column of the value itself.

use std::fmt;
use std::marker::PhantomData;

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use ztunnel_certs::identity::Identity;
use ztunnel_proto::ports::HBONE_PORT;

use crate::cidr::{Cidr, parse_ip, parse_prefix_len};
use crate::state::{
    GatewayAddress, GatewayDestination, Interner, NamespacedHostname, NetworkAddress, NetworkCidr,
};

/// A value written as one string in the file.
pub(super) trait TextForm: Sized {
    /// What the form looks like, for "expected ..." messages.
    const EXPECTING: &'static str;

    /// Parses the text, or says what is wrong with it.
    fn parse_text(text: &str) -> Result<Self, String>;
}

/// A [`TextForm`] value read from a YAML string.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct Text<T>(pub T);

impl<'de, T: TextForm> Deserialize<'de> for Text<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_str(TextVisitor(PhantomData))
    }
}

struct TextVisitor<T>(PhantomData<T>);

impl<T: TextForm> Visitor<'_> for TextVisitor<T> {
    type Value = Text<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(T::EXPECTING)
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
        T::parse_text(text).map(Text).map_err(E::custom)
    }
}

/// `"<network>/<ip>"`; the network may be empty (`"/10.96.0.10"`) or left
/// out with its slash (`"10.96.0.10"`).
impl TextForm for NetworkAddress {
    const EXPECTING: &'static str = "an address \"<network>/<ip>\"";

    fn parse_text(text: &str) -> Result<Self, String> {
        let (network, ip) = text.split_once('/').unwrap_or(("", text));
        Ok(NetworkAddress {
            network: network.into(),
            address: parse_ip(ip).map_err(|e| e.to_string())?,
        })
    }
}

/// `"<network>/<ip>/<length>"`, or `"<ip>/<length>"` on the default network.
impl TextForm for NetworkCidr {
    const EXPECTING: &'static str = "a CIDR VIP \"<network>/<ip>/<length>\"";

    fn parse_text(text: &str) -> Result<Self, String> {
        let Some((address, length)) = text.rsplit_once('/') else {
            return Err(format!(
                "invalid CIDR VIP {text:?}: expected {}",
                Self::EXPECTING
            ));
        };
        let address = NetworkAddress::parse_text(address)?;
        let cidr = parse_prefix_len(length)
            .and_then(|length| Cidr::new(address.address, length))
            .map_err(|e| e.to_string())?;
        Ok(NetworkCidr {
            network: address.network,
            cidr,
        })
    }
}

/// `"<namespace>/<hostname>"`.
impl TextForm for NamespacedHostname {
    const EXPECTING: &'static str = "a key \"<namespace>/<hostname>\"";

    fn parse_text(text: &str) -> Result<Self, String> {
        text.parse()
            .map_err(|e: crate::state::ResourceError| e.to_string())
    }
}

/// `"spiffe://<trust-domain>/ns/<namespace>/sa/<service-account>"`.
impl TextForm for Identity {
    const EXPECTING: &'static str = "a SPIFFE identity";

    fn parse_text(text: &str) -> Result<Self, String> {
        text.parse()
            .map_err(|e| format!("invalid identity {text:?}: {e}"))
    }
}

/// A waypoint or network gateway: `destination` is `"<network>/<ip>"` or
/// `{namespace, hostname}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct GatewayForm {
    destination: GatewayDestinationForm,
    #[serde(default = "default_hbone_port")]
    hbone_mtls_port: u16,
}

/// The HBONE port of a gateway that names none (WIRE.md §1).
fn default_hbone_port() -> u16 {
    HBONE_PORT
}

impl GatewayForm {
    /// The typed gateway, made of shared strings from `interner`.
    pub(super) fn to_gateway(&self, interner: &mut Interner) -> GatewayAddress {
        interner.gateway(&GatewayAddress {
            destination: self.destination.0.clone(),
            hbone_mtls_port: self.hbone_mtls_port,
        })
    }
}

impl From<GatewayForm> for GatewayAddress {
    fn from(form: GatewayForm) -> Self {
        GatewayAddress {
            destination: form.destination.0,
            hbone_mtls_port: form.hbone_mtls_port,
        }
    }
}

struct GatewayDestinationForm(GatewayDestination);

impl<'de> Deserialize<'de> for GatewayDestinationForm {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(GatewayDestinationVisitor)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HostnameForm {
    namespace: String,
    hostname: String,
}

struct GatewayDestinationVisitor;

impl<'de> Visitor<'de> for GatewayDestinationVisitor {
    type Value = GatewayDestinationForm;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"<network>/<ip>\" or {namespace, hostname}")
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
        let address = NetworkAddress::parse_text(text).map_err(E::custom)?;
        Ok(GatewayDestinationForm(GatewayDestination::Address(address)))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        let form = HostnameForm::deserialize(de::value::MapAccessDeserializer::new(map))?;
        Ok(GatewayDestinationForm(GatewayDestination::Hostname(
            NamespacedHostname {
                namespace: form.namespace.into(),
                hostname: form.hostname.into(),
            },
        )))
    }
}
