//! The PROXY protocol version 2 header written to an application tunnel
//! before the tunnelled bytes (WIRE.md §4): who connected and where to,
//! with the client's SPIFFE identity, since the tunnel's listener sees only
//! ztunnel. Only the encoding of the header; when one is written is the
//! inbound listeners' business, which addresses it names the decision's.
//!
//! Layout (haproxy's proxy-protocol.txt, §2.2): the 12-byte signature, one
//! byte of version and command, one of address family and transport, the
//! big-endian length of what follows, the addresses (source IP,
//! destination IP, source port, destination port), then TLVs of a type
//! byte, a big-endian 16-bit length and the value.

use std::net::{IpAddr, SocketAddr};

/// What opens every version 2 header.
pub const SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";

/// Version 2 (high nibble), command PROXY (low nibble): the connection was
/// relayed for a client, and the addresses are that client's.
const VERSION_2_PROXY: u8 = 0x21;
/// TCP over IPv4 (family 1, transport STREAM 1).
const TCP_OVER_IPV4: u8 = 0x11;
/// TCP over IPv6 (family 2, transport STREAM 1).
const TCP_OVER_IPV6: u8 = 0x21;

/// The TLV type Istio gives the client's SPIFFE URI, in the range the
/// protocol leaves to applications (0xE0 and up are custom; Istio took
/// 0xD0, which its proxies read).
pub const SPIFFE_IDENTITY_TLV: u8 = 0xD0;

/// The fixed part before the addresses: signature, version and command,
/// family and transport, length.
const FIXED_LENGTH: usize = 16;
/// A TLV's type byte and length.
const TLV_HEAD_LENGTH: usize = 3;

/// Why a header cannot be written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// The identity does not fit the 16-bit length the header carries.
    #[error("identity of {0} bytes does not fit a PROXY header")]
    IdentityTooLong(usize),
}

/// Appends to `out` the header of a TCP connection from `source` to
/// `destination`, with `identity` (a SPIFFE URI) as a
/// [`SPIFFE_IDENTITY_TLV`] when there is one. Two IPv4 addresses go as
/// IPv4; otherwise both go as IPv6, an IPv4 one mapped (`::ffff:a.b.c.d`),
/// since a header holds one family.
pub fn encode(
    out: &mut Vec<u8>,
    source: SocketAddr,
    destination: SocketAddr,
    identity: Option<&str>,
) -> Result<(), HeaderError> {
    let (family, addresses) = match (source.ip(), destination.ip()) {
        (IpAddr::V4(_), IpAddr::V4(_)) => (TCP_OVER_IPV4, 2 * 4),
        _ => (TCP_OVER_IPV6, 2 * 16),
    };
    let too_long =
        |_: std::num::TryFromIntError| HeaderError::IdentityTooLong(identity.map_or(0, str::len));
    let value_length = u16::try_from(identity.map_or(0, str::len)).map_err(too_long)?;
    let tlv = identity.map_or(0, |_| TLV_HEAD_LENGTH + usize::from(value_length));
    let length = u16::try_from(addresses + 2 * 2 + tlv).map_err(too_long)?;
    out.reserve(FIXED_LENGTH + usize::from(length));
    out.extend_from_slice(&SIGNATURE);
    out.push(VERSION_2_PROXY);
    out.push(family);
    out.extend_from_slice(&length.to_be_bytes());
    for address in [source.ip(), destination.ip()] {
        match (family, address) {
            (TCP_OVER_IPV4, IpAddr::V4(v4)) => out.extend_from_slice(&v4.octets()),
            (_, IpAddr::V4(v4)) => out.extend_from_slice(&v4.to_ipv6_mapped().octets()),
            (_, IpAddr::V6(v6)) => out.extend_from_slice(&v6.octets()),
        }
    }
    out.extend_from_slice(&source.port().to_be_bytes());
    out.extend_from_slice(&destination.port().to_be_bytes());
    if let Some(identity) = identity {
        out.push(SPIFFE_IDENTITY_TLV);
        out.extend_from_slice(&value_length.to_be_bytes());
        out.extend_from_slice(identity.as_bytes());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(source: &str, destination: &str, identity: Option<&str>) -> Vec<u8> {
        let mut out = Vec::new();
        encode(
            &mut out,
            source.parse().unwrap(),
            destination.parse().unwrap(),
            identity,
        )
        .unwrap();
        out
    }

    /// The expected bytes are written out by hand from haproxy's
    /// proxy-protocol.txt §2.2, not produced by the encoder: the signature
    /// "\x0D\x0A\x0D\x0A\x00\x0D\x0A\x51\x55\x49\x54\x0A", 0x21 for v2 PROXY,
    /// 0x11 TCP4 or 0x21 TCP6, the length, addresses, ports, TLVs.
    #[test]
    fn headers_match_the_specification_byte_for_byte() {
        let signature = [
            0x0D, 0x0A, 0x0D, 0x0A, 0x00, 0x0D, 0x0A, 0x51, 0x55, 0x49, 0x54, 0x0A,
        ];
        let mut ipv4 = signature.to_vec();
        ipv4.extend([0x21, 0x11, 0x00, 0x0C]);
        ipv4.extend([10, 0, 0, 1, 10, 0, 0, 2]);
        ipv4.extend([0xA4, 0x10, 0x1F, 0x90]); // 42000, 8080
        assert_eq!(header("10.0.0.1:42000", "10.0.0.2:8080", None), ipv4);

        let id = "spiffe://cluster.local/ns/default/sa/client";
        let mut with_identity = signature.to_vec();
        with_identity.extend([0x21, 0x11, 0x00, 12 + 3 + 43]);
        with_identity.extend([10, 0, 0, 1, 10, 0, 0, 2, 0xA4, 0x10, 0x1F, 0x90]);
        with_identity.extend([0xD0, 0x00, 43]);
        with_identity.extend(id.as_bytes());
        assert_eq!(id.len(), 43);
        assert_eq!(
            header("10.0.0.1:42000", "10.0.0.2:8080", Some(id)),
            with_identity
        );

        let mut ipv6 = signature.to_vec();
        ipv6.extend([0x21, 0x21, 0x00, 0x24]);
        ipv6.extend([0xFD, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        ipv6.extend([0xFD, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
        ipv6.extend([0x00, 0x50, 0x01, 0xBB]); // 80, 443
        assert_eq!(header("[fd00::1]:80", "[fd00::2]:443", None), ipv6);

        // Mixed families: both as IPv6, the IPv4 one mapped.
        let mut mixed = signature.to_vec();
        mixed.extend([0x21, 0x21, 0x00, 0x24]);
        mixed.extend([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 10, 0, 0, 1]);
        mixed.extend([0xFD, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
        mixed.extend([0x00, 0x50, 0x01, 0xBB]);
        assert_eq!(header("10.0.0.1:80", "[fd00::2]:443", None), mixed);
    }

    #[test]
    fn the_header_is_appended_to_what_the_buffer_holds() {
        let mut out = b"kept".to_vec();
        encode(
            &mut out,
            "10.0.0.1:1".parse().unwrap(),
            "10.0.0.2:2".parse().unwrap(),
            None,
        )
        .unwrap();
        assert_eq!(&out[..4], b"kept");
        assert_eq!(&out[4..16], &SIGNATURE);
        assert_eq!(out.len(), 4 + 16 + 12);
    }

    #[test]
    fn an_identity_too_long_for_the_length_field_is_refused() {
        let long = "x".repeat(usize::from(u16::MAX));
        let mut out = Vec::new();
        let refused = encode(
            &mut out,
            "10.0.0.1:1".parse().unwrap(),
            "10.0.0.2:2".parse().unwrap(),
            Some(&long),
        );
        assert_eq!(refused, Err(HeaderError::IdentityTooLong(long.len())));
        assert!(out.is_empty(), "nothing written");
        // The longest that fits: the length field is all ones.
        // (the length counts the addresses, ports and TLVs, not the fixed 16 bytes)
        let longest = "x".repeat(usize::from(u16::MAX) - 12 - 3);
        encode(
            &mut out,
            "10.0.0.1:1".parse().unwrap(),
            "10.0.0.2:2".parse().unwrap(),
            Some(&longest),
        )
        .unwrap();
        assert_eq!(&out[14..16], &[0xFF, 0xFF]);
    }
}
