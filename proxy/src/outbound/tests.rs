//! The one mapping of outbound failures to metrics' response flags; a
//! connection to an endpoint known by hostname, end to end, in
//! `tests/hostname.rs`; open connections closed when a revocation list
//! revokes their peer, in both directions, in `tests/revocation.rs`.

use std::io;
use std::sync::Arc;

use http::StatusCode;

use super::*;

mod hostname;
mod revocation;

fn io_error() -> io::Error {
    io::ErrorKind::ConnectionRefused.into()
}

fn tunnel(error: HboneError) -> OutboundError {
    OutboundError::Tunnel(Arc::new(error))
}

#[test]
fn every_outbound_failure_maps_to_one_flag() {
    let invalid_header = http::HeaderValue::from_bytes(b"\n").unwrap_err();
    let cases = [
        (OutboundError::UnknownSource, ResponseFlags::IdentityError),
        (
            OutboundError::Certificate(FetchError::Stopped),
            ResponseFlags::IdentityError,
        ),
        (
            OutboundError::Connect {
                addr: "198.18.0.1:80".parse().unwrap(),
                source: io::ErrorKind::TimedOut.into(),
            },
            ResponseFlags::Connect,
        ),
        (
            tunnel(HboneError::Connect(io_error())),
            ResponseFlags::Connect,
        ),
        (
            tunnel(HboneError::Tls(io_error().into())),
            ResponseFlags::TlsFailure,
        ),
        (
            tunnel(HboneError::Tls(
                rustls::Error::InvalidCertificate(rustls::CertificateError::Revoked).into(),
            )),
            ResponseFlags::CertRevoked,
        ),
        (tunnel(HboneError::NoAlpnH2), ResponseFlags::Connect),
        (
            tunnel(HboneError::H2(h2::Reason::PROTOCOL_ERROR.into())),
            ResponseFlags::H2HandshakeFailure,
        ),
        (
            tunnel(HboneError::Status(StatusCode::UNAUTHORIZED)),
            ResponseFlags::Deny,
        ),
        (
            tunnel(HboneError::Status(StatusCode::SERVICE_UNAVAILABLE)),
            ResponseFlags::Connect,
        ),
        (OutboundError::PoolContended, ResponseFlags::Connect),
        (
            OutboundError::Resolve(ResolveError::NoAddress("app.test".into())),
            ResponseFlags::Connect,
        ),
        (
            OutboundError::Headers(invalid_header.into()),
            ResponseFlags::Connect,
        ),
    ];
    for (error, expected) in cases {
        assert_eq!(flags(&error), expected, "{error:?}");
    }
}

#[test]
fn a_same_node_refusal_maps_like_the_hbone_answer_it_stands_for() {
    let refusals = [
        InboundRefusal::Denied,
        InboundRefusal::BadRequest("authority does not match the destination"),
        InboundRefusal::Unavailable("application unreachable"),
    ];
    for refusal in refusals {
        let over_hbone = flags(&tunnel(HboneError::Status(refusal.status())));
        assert_eq!(
            flags(&OutboundError::SameNode(refusal)),
            over_hbone,
            "{refusal:?}"
        );
    }
    assert_eq!(
        flags(&OutboundError::SameNode(InboundRefusal::Denied)),
        ResponseFlags::Deny
    );
}

#[test]
fn a_pool_failure_is_the_dial_error_itself_not_a_wrapper() {
    let shared = Arc::new(HboneError::Tls(io_error().into()));
    let error = OutboundError::from(PoolError::Dial(Arc::clone(&shared)));
    assert!(matches!(&error, OutboundError::Tunnel(inner) if Arc::ptr_eq(inner, &shared)));
    assert_eq!(flags(&error), ResponseFlags::TlsFailure);
    let contended = OutboundError::from(PoolError::Contended);
    assert!(matches!(contended, OutboundError::PoolContended));
}
