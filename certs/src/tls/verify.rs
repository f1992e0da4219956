//! The peer checks both sides share (WIRE.md §4): the chain to our trust
//! roots, verified with webpki, and the SPIFFE rules on the leaf — not a CA,
//! exactly one URI SAN, and that SAN a valid identity. What each side then
//! requires of the identity lives in `client.rs` and `server.rs`.

use std::sync::Arc;

use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::{CertificateError, CommonState, OtherError};
use rustls_pki_types::{CertificateDer, UnixTime};
use webpki::{
    ExpirationPolicy, KeyUsage, RevocationCheckDepth, RevocationOptionsBuilder, UnknownStatusPolicy,
};

use crate::cert::{CertError, Certificate};
use crate::error_chain::ErrorChain;
use crate::identity::Identity;
use crate::tls::TrustRoots;
use crate::tls::revocation::RevocationLists;

/// Why a peer whose chain verified was still refused. It reaches rustls as
/// `CertificateError::Other`, so a caller can downcast the handshake error to
/// it.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// The peer's leaf does not parse, or has a SAN with an embedded NUL.
    /// The cause is in the message, not behind `source()`: rustls's error,
    /// which carries this one, prints it but hands out no source.
    #[error("peer certificate: {}", ErrorChain(.0))]
    Certificate(CertError),
    /// The peer's leaf is a CA certificate.
    #[error("peer certificate is a CA (basicConstraints CA:true)")]
    CaLeaf,
    /// The peer's leaf carries no URI SAN, or more than one: its identity
    /// would be missing or ambiguous.
    #[error("peer certificate must carry exactly one URI SAN, found {0}")]
    UriSanCount(usize),
    /// The peer's only URI SAN is not a SPIFFE workload identity.
    #[error("peer URI SAN is not a SPIFFE workload identity")]
    NotAnIdentity,
    /// The server's identity is not one the client expected to reach.
    #[error("server identity {0} is not one of the expected identities")]
    UnexpectedIdentity(Identity),
    /// The client belongs to a trust domain other than ours.
    #[error("client identity {identity} is outside trust domain {trust_domain}")]
    ForeignTrustDomain {
        /// The client's identity.
        identity: Identity,
        /// Our own trust domain.
        trust_domain: String,
    },
}

impl From<PeerError> for rustls::Error {
    fn from(error: PeerError) -> Self {
        rustls::Error::InvalidCertificate(CertificateError::Other(OtherError(Arc::new(error))))
    }
}

/// The identity a verified peer presented, read from its leaf, for
/// authorization. `None` before the handshake completes or when the peer sent
/// no certificate; the verifiers have already refused any leaf without exactly
/// one identity.
pub fn peer_identity(conn: &CommonState) -> Option<Identity> {
    let leaf = conn.peer_certificates()?.first()?;
    let cert = Certificate::from_der(leaf.clone().into_owned()).ok()?;
    cert.identity().cloned()
}

/// Verifies that `end_entity` chains through `intermediates` to one of
/// `roots` at `now`, for `usage` (serverAuth or clientAuth), and that none
/// of `lists` revokes a certificate of the chain. The handshakes pass the
/// lists in force; an open connection is judged again against new ones.
pub(crate) fn verify_chain(
    end_entity: &CertificateDer<'_>,
    intermediates: &[CertificateDer<'_>],
    roots: &TrustRoots,
    now: UnixTime,
    usage: KeyUsage,
    algorithms: &WebPkiSupportedAlgorithms,
    lists: Option<&RevocationLists>,
) -> Result<(), rustls::Error> {
    let cert = webpki::EndEntityCert::try_from(end_entity).map_err(pki_error)?;
    let refs = lists.map(RevocationLists::refs);
    let revocation = match &refs {
        Some(refs) => Some(
            RevocationOptionsBuilder::new(refs)
                .map_err(|_| rustls::Error::General("empty revocation lists".to_owned()))?
                .with_depth(RevocationCheckDepth::Chain)
                // An issuer without a list: judged as without CRL_PATH.
                .with_status_policy(UnknownStatusPolicy::Allow)
                // A stale list still revokes; it does not refuse everyone.
                .with_expiration_policy(ExpirationPolicy::Ignore)
                .build(),
        ),
        None => None,
    };
    cert.verify_for_usage(
        algorithms.all,
        roots.anchors(),
        intermediates,
        now,
        usage,
        revocation,
        None,
    )
    .map_err(pki_error)?;
    Ok(())
}

/// The one identity a verified leaf may carry.
pub(crate) fn leaf_identity(end_entity: &CertificateDer<'_>) -> Result<Identity, PeerError> {
    let cert =
        Certificate::from_der(end_entity.clone().into_owned()).map_err(PeerError::Certificate)?;
    if cert.is_ca() {
        return Err(PeerError::CaLeaf);
    }
    if cert.uri_san_count() != 1 {
        return Err(PeerError::UriSanCount(cert.uri_san_count()));
    }
    cert.identity().cloned().ok_or(PeerError::NotAnIdentity)
}

/// Maps webpki's verdict onto rustls's error, so that rustls sends the right
/// alert and callers can match on the common cases.
fn pki_error(error: webpki::Error) -> rustls::Error {
    use webpki::Error;
    let certificate_error = match error {
        Error::BadDer | Error::BadDerTime | Error::TrailingData(_) => CertificateError::BadEncoding,
        Error::CertNotValidYet { time, not_before } => {
            CertificateError::NotValidYetContext { time, not_before }
        }
        Error::CertExpired { time, not_after } => {
            CertificateError::ExpiredContext { time, not_after }
        }
        Error::InvalidCertValidity => CertificateError::Expired,
        Error::UnknownIssuer => CertificateError::UnknownIssuer,
        Error::CertRevoked => CertificateError::Revoked,
        Error::InvalidSignatureForPublicKey => CertificateError::BadSignature,
        Error::RequiredEkuNotFoundContext(_) => CertificateError::InvalidPurpose,
        other => CertificateError::Other(OtherError(Arc::new(other))),
    };
    rustls::Error::InvalidCertificate(certificate_error)
}

#[cfg(test)]
mod tests {
    use rcgen::string::Ia5String;
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, SanType};

    use super::*;

    fn self_signed(uris: &[&str], is_ca: bool) -> CertificateDer<'static> {
        let mut params = CertificateParams::default();
        params.subject_alt_names = uris
            .iter()
            .map(|uri| SanType::URI(Ia5String::try_from(*uri).unwrap()))
            .collect();
        if is_ca {
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        }
        let key = KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().clone()
    }

    /// webpki already refuses a CA leaf in the handshake; this check stands
    /// on its own so that the rule does not rest on webpki's defaults.
    #[test]
    fn leaf_identity_applies_the_spiffe_rules() {
        const ID: &str = "spiffe://td/ns/a/sa/b";
        let ok = leaf_identity(&self_signed(&[ID], false)).unwrap();
        assert_eq!(ok.as_str(), ID);
        type Case = (&'static [&'static str], bool, fn(&PeerError) -> bool);
        let cases: [Case; 4] = [
            (&[ID], true, |e| matches!(e, PeerError::CaLeaf)),
            (&[], false, |e| matches!(e, PeerError::UriSanCount(0))),
            (&[ID, ID], false, |e| matches!(e, PeerError::UriSanCount(2))),
            (&["spiffe://td/x"], false, |e| {
                matches!(e, PeerError::NotAnIdentity)
            }),
        ];
        for (uris, is_ca, expect) in cases {
            let error = leaf_identity(&self_signed(uris, is_ca)).unwrap_err();
            assert!(expect(&error), "{uris:?} ca={is_ca}: {error}");
        }
    }
}
