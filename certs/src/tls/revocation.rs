//! Certificate revocation lists (Istio's `CRL_PATH`): peers whose
//! certificate, or an intermediate of its chain, a loaded list revokes are
//! refused by both verifiers (`verify.rs`). A certificate whose issuer has
//! no list loaded is judged as before, and a list past its nextUpdate still
//! applies: a stale list must not turn every peer away.
//!
//! The lists in force are process-wide: the verifiers live inside TLS
//! configurations built once per workload certificate, while the lists
//! change on their own schedule (the proxy re-reads the file). Reading and
//! watching the file is the proxy's business; this module parses and holds.

use std::sync::{Arc, PoisonError, RwLock};

use rustls_pki_types::CertificateRevocationListDer;
use rustls_pki_types::pem::PemObject;
use webpki::{CertRevocationList, OwnedCertRevocationList};

/// The lists the verifiers check against; empty until [`install`].
static IN_FORCE: RwLock<Option<RevocationLists>> = RwLock::new(None);

/// Why a revocation file was refused.
#[derive(Debug, thiserror::Error)]
pub enum RevocationError {
    /// The PEM text is malformed.
    #[error("revocation list PEM is malformed")]
    Pem(#[from] rustls_pki_types::pem::Error),
    /// A list does not parse as an X.509 CRL.
    #[error("revocation list {index} does not parse: {error:?}")]
    Der {
        /// Position of the list in the file, from 0.
        index: usize,
        /// What webpki found wrong with it.
        error: webpki::Error,
    },
}

/// Parsed revocation lists; cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct RevocationLists(Arc<[CertRevocationList<'static>]>);

impl RevocationLists {
    /// Parses a file's content: PEM `X509 CRL` blocks (other blocks are
    /// skipped), or one DER list. An empty file revokes nothing.
    pub fn parse(bytes: &[u8]) -> Result<Self, RevocationError> {
        let ders: Vec<CertificateRevocationListDer<'static>> = if bytes.is_empty() {
            Vec::new()
        } else if bytes.starts_with(b"-----BEGIN") {
            CertificateRevocationListDer::pem_slice_iter(bytes).collect::<Result<_, _>>()?
        } else {
            vec![CertificateRevocationListDer::from(bytes.to_vec())]
        };
        let lists = ders
            .iter()
            .enumerate()
            .map(|(index, der)| {
                OwnedCertRevocationList::from_der(der.as_ref())
                    .map(CertRevocationList::from)
                    .map_err(|error| RevocationError::Der { index, error })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(RevocationLists(lists.into()))
    }

    /// How many lists.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there is no list.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Puts `lists` in force for every verification from now on.
pub fn install(lists: RevocationLists) {
    *IN_FORCE.write().unwrap_or_else(PoisonError::into_inner) = Some(lists);
}

/// The lists in force, if any.
pub(crate) fn in_force() -> Option<RevocationLists> {
    IN_FORCE
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
        .filter(|lists| !lists.is_empty())
}

impl RevocationLists {
    /// References to each list, as webpki's options take them.
    pub(crate) fn refs(&self) -> Vec<&CertRevocationList<'static>> {
        self.0.iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use rcgen::{
        BasicConstraints, CertificateParams, CertificateRevocationListParams, DistinguishedName,
        DnType, IsCa, Issuer, KeyIdMethod, KeyPair, KeyUsagePurpose, RevocationReason,
        RevokedCertParams, SanType, SerialNumber,
    };
    use rustls_pki_types::{CertificateDer, UnixTime};
    use webpki::KeyUsage;

    use super::*;
    use crate::tls::TrustRoots;
    use crate::tls::verify::verify_chain;

    /// A CA of its own, with a name no other CA has (a list applies to the
    /// CAs of its issuer's name, so the lists installed here change no other
    /// test's verdict), and leaves it signs.
    struct Ca {
        der: CertificateDer<'static>,
        issuer: Issuer<'static, KeyPair>,
    }

    fn ca() -> Ca {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let number = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, format!("revocation test CA {number}"));
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Ca {
            der: cert.der().clone(),
            issuer: Issuer::new(params, key),
        }
    }

    fn leaf(ca: &Ca, serial: u8) -> CertificateDer<'static> {
        let mut params = CertificateParams::default();
        params.serial_number = Some(SerialNumber::from_slice(&[serial]));
        params.subject_alt_names = vec![SanType::URI(
            "spiffe://cluster.local/ns/a/sa/b".try_into().unwrap(),
        )];
        let key = KeyPair::generate().unwrap();
        params.signed_by(&key, &ca.issuer).unwrap().der().clone()
    }

    fn crl_pem(ca: &Ca, revoked: u8) -> String {
        let now = time::OffsetDateTime::now_utc();
        CertificateRevocationListParams {
            this_update: now - time::Duration::hours(1),
            // Already past: a stale list still revokes.
            next_update: now - time::Duration::minutes(1),
            crl_number: SerialNumber::from_slice(&[1]),
            issuing_distribution_point: None,
            revoked_certs: vec![RevokedCertParams {
                serial_number: SerialNumber::from_slice(&[revoked]),
                revocation_time: now - time::Duration::hours(1),
                reason_code: Some(RevocationReason::KeyCompromise),
                invalidity_date: None,
            }],
            key_identifier_method: KeyIdMethod::Sha256,
        }
        .signed_by(&ca.issuer)
        .unwrap()
        .pem()
        .unwrap()
    }

    fn verify(ca: &Ca, leaf: &CertificateDer<'_>) -> Result<(), rustls::Error> {
        let roots = TrustRoots::from_der(vec![ca.der.clone()]).unwrap();
        let now = UnixTime::since_unix_epoch(
            SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap_or(Duration::ZERO),
        );
        let algorithms = crate::tls::provider().signature_verification_algorithms;
        verify_chain(leaf, &[], &roots, now, KeyUsage::client_auth(), &algorithms)
    }

    #[test]
    fn a_revoked_peer_is_refused_and_the_others_pass() {
        let ca = ca();
        let (revoked, kept) = (leaf(&ca, 7), leaf(&ca, 8));
        assert!(verify(&ca, &revoked).is_ok(), "before any list");

        let lists = RevocationLists::parse(crl_pem(&ca, 7).as_bytes()).unwrap();
        assert_eq!(lists.len(), 1);
        install(lists);
        let error = verify(&ca, &revoked).unwrap_err();
        assert_eq!(
            error,
            rustls::Error::InvalidCertificate(rustls::CertificateError::Revoked)
        );
        assert!(verify(&ca, &kept).is_ok());
        // A peer of a CA without a list is judged as before.
        let other = self::ca();
        assert!(verify(&other, &leaf(&other, 7)).is_ok());
        install(RevocationLists::default());
        assert!(verify(&ca, &revoked).is_ok(), "lists taken out of force");
    }

    #[test]
    fn revocation_files_parse_as_pem_der_or_empty() {
        let ca = ca();
        let pem = crl_pem(&ca, 1);
        assert_eq!(RevocationLists::parse(pem.as_bytes()).unwrap().len(), 1);
        let der = CertificateRevocationListDer::pem_slice_iter(pem.as_bytes())
            .next()
            .unwrap()
            .unwrap();
        assert_eq!(RevocationLists::parse(der.as_ref()).unwrap().len(), 1);
        assert!(RevocationLists::parse(b"").unwrap().is_empty());
        assert!(RevocationLists::parse(b"not a list").is_err());
    }
}
