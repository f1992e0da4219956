//! Addresses as bytes and blocks: an IP from its wire bytes or its text, and
//! a CIDR with its text form `"<ip>/<length>"`, which the local config file
//! reads and `/config_dump` writes.
//! The leaf under both the state (workloads, services) and the policies
//! (`rbac`), which match connections against CIDRs; where an address sits
//! in the mesh (network, gateway) is `state/network.rs`.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

/// Why an address or a block is refused. From the wire, the messages are
/// those a NACK carries (WIRE.md §7); from text, those the local config
/// file's errors show.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    /// Text that is not an IP address.
    #[error("invalid IP address {0:?}")]
    IpText(String),
    /// Text after a `/` that is not a prefix length.
    #[error("invalid prefix length {0:?}")]
    PrefixLengthText(String),
    /// An IP address is neither 4 nor 16 bytes.
    #[error("failed to parse address, had {0} bytes")]
    Length(usize),
    /// A prefix length is above 32 (IPv4) or 128 (IPv6).
    #[error("invalid cidr: prefix length {length} is above {max}")]
    PrefixLength {
        /// The length given.
        length: u32,
        /// The family's maximum.
        max: u8,
    },
}

/// A block of addresses: an IP with a prefix length.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Cidr {
    /// The first address of the block; host bits are zero.
    address: IpAddr,
    prefix_len: u8,
}

impl Cidr {
    /// The block `address/prefix_len`. Host bits of `address` are cleared, so
    /// `10.1.2.3/8` is `10.0.0.0/8`.
    pub fn new(address: IpAddr, prefix_len: u32) -> Result<Self, AddressError> {
        let address = address.to_canonical();
        let max = max_prefix_len(address);
        let prefix_len = u8::try_from(prefix_len)
            .ok()
            .filter(|len| *len <= max)
            .ok_or(AddressError::PrefixLength {
                length: prefix_len,
                max,
            })?;
        Ok(Cidr {
            address: mask(address, prefix_len),
            prefix_len,
        })
    }

    /// The block holding only `address`.
    pub fn host(address: IpAddr) -> Self {
        let address = address.to_canonical();
        Cidr {
            address,
            prefix_len: max_prefix_len(address),
        }
    }

    /// The first address of the block.
    pub fn address(&self) -> IpAddr {
        self.address
    }

    /// The prefix length.
    pub fn prefix_len(&self) -> u8 {
        self.prefix_len
    }

    /// Whether `ip` is inside the block. An IPv4-mapped IPv6 address counts
    /// as its IPv4 address; otherwise the families must be equal.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        ip.is_ipv4() == self.address.is_ipv4() && mask(ip, self.prefix_len) == self.address
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.address, self.prefix_len)
    }
}

/// `"<ip>/<length>"`, or a bare IP for the block of that host alone.
impl FromStr for Cidr {
    type Err = AddressError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.split_once('/') {
            None => Ok(Cidr::host(parse_ip(text)?)),
            Some((ip, length)) => Cidr::new(parse_ip(ip)?, parse_prefix_len(length)?),
        }
    }
}

/// As [`Display`](fmt::Display) writes it, which is how `/config_dump`
/// shows a policy's CIDRs.
impl Serialize for Cidr {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// As [`FromStr`] reads it, from one string, which is how the local config
/// file writes a policy's CIDRs; a bad one is reported at the value.
impl<'de> Deserialize<'de> for Cidr {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_str(CidrVisitor)
    }
}

struct CidrVisitor;

impl Visitor<'_> for CidrVisitor {
    type Value = Cidr;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a CIDR \"<ip>/<length>\"")
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
        text.parse().map_err(E::custom)
    }
}

/// An IP address from its text; an IPv4-mapped IPv6 address is its IPv4
/// address.
pub fn parse_ip(text: &str) -> Result<IpAddr, AddressError> {
    text.parse::<IpAddr>()
        .map(|ip| ip.to_canonical())
        .map_err(|_| AddressError::IpText(text.to_owned()))
}

/// A prefix length from its text; whether it fits the family is
/// [`Cidr::new`]'s check.
pub fn parse_prefix_len(text: &str) -> Result<u32, AddressError> {
    text.parse()
        .map_err(|_| AddressError::PrefixLengthText(text.to_owned()))
}

/// 32 for IPv4, 128 for IPv6.
pub fn max_prefix_len(address: IpAddr) -> u8 {
    match address {
        IpAddr::V4(_) => 32,
        IpAddr::V6(_) => 128,
    }
}

/// Clears the bits after the first `prefix_len`; `prefix_len` is in range.
fn mask(address: IpAddr, prefix_len: u8) -> IpAddr {
    match address {
        IpAddr::V4(v4) => {
            let bits = u32::from(v4);
            let kept = bits.checked_shr(32 - u32::from(prefix_len)).unwrap_or(0);
            let masked = kept.checked_shl(32 - u32::from(prefix_len)).unwrap_or(0);
            IpAddr::V4(Ipv4Addr::from(masked))
        }
        IpAddr::V6(v6) => {
            let bits = u128::from(v6);
            let kept = bits.checked_shr(128 - u32::from(prefix_len)).unwrap_or(0);
            let masked = kept.checked_shl(128 - u32::from(prefix_len)).unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from(masked))
        }
    }
}

/// An IP from its raw bytes: 4 for IPv4, 16 for IPv6 (WIRE.md §8).
pub fn ip_from_bytes(bytes: &[u8]) -> Result<IpAddr, AddressError> {
    if let Ok(v4) = <[u8; 4]>::try_from(bytes) {
        return Ok(IpAddr::from(v4));
    }
    if let Ok(v6) = <[u8; 16]>::try_from(bytes) {
        return Ok(IpAddr::from(v6).to_canonical());
    }
    Err(AddressError::Length(bytes.len()))
}
