//! Addresses as bytes and blocks: an IP from its wire bytes and a CIDR.
//! The leaf under both the state (workloads, services) and the policies
//! (`rbac`), which match connections against CIDRs; where an address sits
//! in the mesh (network, gateway) is `state/network.rs`.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Why an address or a block is refused. The messages are those a NACK
/// carries (WIRE.md §7).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
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
