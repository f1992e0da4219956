//! Workload keys and certificate signing requests (WIRE.md §2, "CSR sent by
//! ztunnel"): a fresh ECDSA P-256 key for every request and a PEM CSR whose
//! only content is the requested identity as a URI SAN.
//!
//! Sending the CSR to the CA is the proxy's business; checking the CA's answer
//! is `cert.rs`'s; how the key is kept in memory, `private_key.rs`'s.

use std::fmt;

use rcgen::string::Ia5String;
use rcgen::{CertificateParams, DistinguishedName, SanType};
use rustls_pki_types::PrivateKeyDer;

use crate::identity::Identity;
use crate::private_key::PrivateKey;

/// A certificate signing request together with the private key it was made
/// for. The key never leaves the node: only [`CertRequest::csr_pem`] is sent.
pub struct CertRequest {
    /// The PEM `CERTIFICATE REQUEST`, ready for `IstioCertificateRequest.csr`.
    csr_pem: String,
    /// The PKCS#8 private key, needed again when the CA's certificate comes
    /// back and is paired with it for TLS; wiped when the request is dropped.
    private_key: PrivateKey,
}

/// Why a CSR could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CsrBuildError {
    /// The crypto library failed to generate a P-256 key pair.
    #[error("generating the ECDSA P-256 key failed")]
    KeyGeneration(#[source] rcgen::Error),
    /// The identity cannot be written as an IA5String URI SAN.
    #[error("identity cannot be encoded as a URI SAN")]
    SanEncoding(#[source] rcgen::Error),
    /// Encoding or signing the CSR failed.
    #[error("encoding the CSR failed")]
    Encoding(#[source] rcgen::Error),
}

impl CertRequest {
    /// Generates a fresh ECDSA P-256 key and a CSR for `identity`, signed
    /// ECDSA-SHA256. The subject is empty and the SAN extension holds the
    /// identity's URI and nothing else, as istiod expects (it ignores both and
    /// uses only the public key, but other CAs may not).
    pub fn generate(identity: &Identity) -> Result<CertRequest, CsrBuildError> {
        let (private_key, key) = PrivateKey::generate().map_err(CsrBuildError::KeyGeneration)?;
        let uri = Ia5String::try_from(identity.as_str()).map_err(CsrBuildError::SanEncoding)?;

        let mut params = CertificateParams::default();
        // rcgen's default subject is a placeholder CN; the CSR must carry none.
        params.distinguished_name = DistinguishedName::new();
        params.subject_alt_names = vec![SanType::URI(uri)];

        let csr = params
            .serialize_request(&key)
            .map_err(CsrBuildError::Encoding)?;
        let csr_pem = csr.pem().map_err(CsrBuildError::Encoding)?;
        Ok(CertRequest {
            csr_pem,
            private_key,
        })
    }

    /// The PEM-encoded CSR.
    pub fn csr_pem(&self) -> &str {
        &self.csr_pem
    }

    /// A copy of the PKCS#8 private key the CSR was signed with, for
    /// rustls, which wipes it (`private_key.rs`).
    pub fn private_key(&self) -> PrivateKeyDer<'static> {
        self.private_key.to_rustls()
    }
}

impl fmt::Debug for CertRequest {
    /// Shows the CSR only: the private key must never reach a log.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertRequest")
            .field("csr_pem", &self.csr_pem)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use rcgen::{CertificateSigningRequestParams, KeyPair};
    use rustls_pki_types::CertificateSigningRequestDer;
    use rustls_pki_types::pem::PemObject;
    use x509_parser::certification_request::X509CertificationRequest;
    use x509_parser::extensions::{GeneralName, ParsedExtension};
    use x509_parser::oid_registry::OID_SIG_ECDSA_WITH_SHA256;
    use x509_parser::prelude::FromDer;

    use super::*;

    #[test]
    fn csr_round_trip_carries_only_the_identity_and_a_valid_signature() {
        let identity: Identity = "spiffe://cluster.local/ns/default/sa/bookinfo"
            .parse()
            .unwrap();
        let request = CertRequest::generate(&identity).unwrap();
        assert!(
            request
                .csr_pem()
                .starts_with("-----BEGIN CERTIFICATE REQUEST-----")
        );

        // rcgen's parser verifies the signature and decodes the SANs.
        let params = CertificateSigningRequestParams::from_pem(request.csr_pem()).unwrap();
        assert_eq!(
            params.params.distinguished_name.iter().count(),
            0,
            "subject is empty"
        );
        let uri = Ia5String::try_from(identity.as_str()).unwrap();
        assert_eq!(params.params.subject_alt_names, vec![SanType::URI(uri)]);

        // And x509-parser, independently: ECDSA-SHA256 signature that verifies.
        let der =
            CertificateSigningRequestDer::from_pem_slice(request.csr_pem().as_bytes()).unwrap();
        let (rest, csr) = X509CertificationRequest::from_der(der.as_ref()).unwrap();
        assert!(rest.is_empty());
        csr.verify_signature().unwrap();
        assert_eq!(csr.signature_algorithm.algorithm, OID_SIG_ECDSA_WITH_SHA256);
        assert_eq!(csr.certification_request_info.subject.iter().count(), 0);
        let extensions: Vec<_> = csr.requested_extensions().unwrap().collect();
        let [ParsedExtension::SubjectAlternativeName(san)] = extensions[..] else {
            panic!("expected exactly one SAN extension, got {extensions:?}");
        };
        assert_eq!(san.general_names, vec![GeneralName::URI(identity.as_str())]);
    }

    #[test]
    fn private_key_matches_the_csr_and_is_fresh_each_time() {
        let identity: Identity = "spiffe://td/ns/a/sa/b".parse().unwrap();
        let first = CertRequest::generate(&identity).unwrap();
        let second = CertRequest::generate(&identity).unwrap();
        assert_ne!(first.private_key(), second.private_key());

        let params = CertificateSigningRequestParams::from_pem(first.csr_pem()).unwrap();
        let PrivateKeyDer::Pkcs8(pkcs8) = first.private_key() else {
            panic!("key is not PKCS#8");
        };
        let key = KeyPair::try_from(&pkcs8).unwrap();
        assert_eq!(
            key.public_key_raw(),
            rcgen::PublicKeyData::der_bytes(&params.public_key)
        );
    }

    #[test]
    fn debug_output_leaves_the_key_out() {
        let identity: Identity = "spiffe://td/ns/a/sa/b".parse().unwrap();
        let request = CertRequest::generate(&identity).unwrap();
        let shown = format!("{request:?} {request:#?}");
        assert!(shown.contains("CERTIFICATE REQUEST"));
        assert!(!shown.contains("private_key"));
        let PrivateKeyDer::Pkcs8(key) = request.private_key() else {
            panic!("key is not PKCS#8");
        };
        let key_bytes = format!("{:?}", key.secret_pkcs8_der());
        assert!(!shown.contains(&key_bytes[1..key_bytes.len() - 1]));
    }
}
