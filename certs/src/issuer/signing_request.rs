//! CA-side validation of a certificate signing request: size bound, PEM and
//! DER parsing, signature check, and the key-type policy.
//!
//! Only the public key survives validation. The CSR's subject and SANs are
//! deliberately dropped: the certificate carries the identity the CA
//! authorized, never the one the caller asked for (WIRE.md §2). Building the
//! client-side CSR is `csr.rs`'s business.

use rcgen::SubjectPublicKeyInfo;
use rustls_pki_types::CertificateSigningRequestDer;
use rustls_pki_types::pem::PemObject;
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::oid_registry::{
    OID_EC_P256, OID_KEY_TYPE_EC_PUBLIC_KEY, OID_PKCS1_RSAENCRYPTION, OID_PKCS1_SHA256WITHRSA,
    OID_PKCS1_SHA384WITHRSA, OID_PKCS1_SHA512WITHRSA, OID_SIG_ECDSA_WITH_SHA256,
    OID_SIG_ECDSA_WITH_SHA384,
};
use x509_parser::prelude::FromDer;

/// Largest CSR accepted, in bytes of PEM. A P-256 CSR is under 1 KiB and an
/// RSA-8192 one under 3 KiB; 64 KiB bounds what a caller can make us parse.
pub const MAX_CSR_BYTES: usize = 64 * 1024;

/// Smallest RSA modulus accepted, in bits (NIST SP 800-131A).
const MIN_RSA_BITS: usize = 2048;

/// Largest RSA modulus accepted, in bits: the limit of the verifier, and a
/// bound on the cost of one signature check.
const MAX_RSA_BITS: usize = 8192;

/// A CSR whose signature verified and whose key the CA accepts.
#[derive(Debug)]
pub struct SigningRequest {
    /// The requester's public key, the only part of the CSR the certificate uses.
    public_key: SubjectPublicKeyInfo,
    /// What kind of key it is, for logs.
    key_kind: KeyKind,
}

impl SigningRequest {
    /// Validates a PEM `CERTIFICATE REQUEST` as the CA receives it.
    pub fn from_pem(pem: &str) -> Result<Self, CsrError> {
        if pem.len() > MAX_CSR_BYTES {
            return Err(CsrError::TooLarge { len: pem.len() });
        }
        let der = CertificateSigningRequestDer::from_pem_slice(pem.as_bytes())
            .map_err(|_| CsrError::Pem)?;
        Self::from_der(der.as_ref())
    }

    /// Validates a DER PKCS#10 request.
    pub fn from_der(der: &[u8]) -> Result<Self, CsrError> {
        if der.len() > MAX_CSR_BYTES {
            return Err(CsrError::TooLarge { len: der.len() });
        }
        let (rest, request) = X509CertificationRequest::from_der(der).map_err(|_| CsrError::Der)?;
        if !rest.is_empty() {
            return Err(CsrError::TrailingData);
        }
        let key_kind = key_kind(&request)?;
        check_signature_algorithm(&request, key_kind)?;
        request
            .verify_signature()
            .map_err(|_| CsrError::Signature)?;
        let spki = request.certification_request_info.subject_pki.raw;
        let public_key = SubjectPublicKeyInfo::from_der(spki).map_err(|_| CsrError::PublicKey)?;
        Ok(SigningRequest {
            public_key,
            key_kind,
        })
    }

    /// The requester's public key, ready to be certified.
    pub fn public_key(&self) -> &SubjectPublicKeyInfo {
        &self.public_key
    }

    /// The kind of key requested.
    pub fn key_kind(&self) -> KeyKind {
        self.key_kind
    }
}

/// The key types a workload may ask a certificate for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    /// ECDSA on NIST P-256, what ztunnel generates.
    EcdsaP256,
    /// RSA with a modulus of this many bits.
    Rsa {
        /// Modulus length.
        bits: usize,
    },
}

/// Why a CSR was refused. The `Display` text goes back to the caller inside
/// `CSR signing error (...)`, so it names the problem without echoing input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CsrError {
    /// The CSR is larger than [`MAX_CSR_BYTES`].
    #[error("CSR is {len} bytes, more than the {MAX_CSR_BYTES} allowed")]
    TooLarge {
        /// Size received.
        len: usize,
    },
    /// No `CERTIFICATE REQUEST` PEM block could be read.
    #[error("CSR is not a PEM CERTIFICATE REQUEST")]
    Pem,
    /// The DER inside the PEM block is not a PKCS#10 request.
    #[error("CSR does not parse as PKCS#10")]
    Der,
    /// Bytes follow the PKCS#10 structure inside the PEM block.
    #[error("CSR has trailing data")]
    TrailingData,
    /// The request is signed with an algorithm the CA does not accept.
    #[error("CSR signature algorithm is not ECDSA or RSA PKCS#1 with SHA-2")]
    SignatureAlgorithm,
    /// The signature does not verify with the CSR's own public key.
    #[error("CSR signature does not verify")]
    Signature,
    /// The key is neither P-256 nor RSA.
    #[error("CSR key must be ECDSA P-256 or RSA of at least {MIN_RSA_BITS} bits")]
    KeyType,
    /// The RSA modulus is shorter than 2048 or longer than 8192 bits.
    #[error("CSR RSA key has {bits} bits; allowed are {MIN_RSA_BITS} to {MAX_RSA_BITS}")]
    RsaKeySize {
        /// Modulus length found.
        bits: usize,
    },
    /// The public key is malformed.
    #[error("CSR public key is malformed")]
    PublicKey,
}

/// Applies the key-type policy: P-256, or RSA of an acceptable size.
fn key_kind(request: &X509CertificationRequest<'_>) -> Result<KeyKind, CsrError> {
    let spki = &request.certification_request_info.subject_pki;
    let algorithm = &spki.algorithm.algorithm;
    if *algorithm == OID_KEY_TYPE_EC_PUBLIC_KEY {
        let curve = spki
            .algorithm
            .parameters
            .as_ref()
            .and_then(|parameters| parameters.as_oid().ok())
            .ok_or(CsrError::KeyType)?;
        if curve != OID_EC_P256 {
            return Err(CsrError::KeyType);
        }
        // An uncompressed point: 0x04, then 32 bytes each of x and y.
        let point = spki.subject_public_key.as_ref();
        if point.len() != 65 || point.first() != Some(&0x04) {
            return Err(CsrError::PublicKey);
        }
        return Ok(KeyKind::EcdsaP256);
    }
    if *algorithm == OID_PKCS1_RSAENCRYPTION {
        let Ok(x509_parser::public_key::PublicKey::RSA(rsa)) = spki.parsed() else {
            return Err(CsrError::PublicKey);
        };
        let bits = modulus_bits(rsa.modulus);
        if !(MIN_RSA_BITS..=MAX_RSA_BITS).contains(&bits) {
            return Err(CsrError::RsaKeySize { bits });
        }
        return Ok(KeyKind::Rsa { bits });
    }
    Err(CsrError::KeyType)
}

/// Refuses SHA-1 and any algorithm that does not match the key type.
fn check_signature_algorithm(
    request: &X509CertificationRequest<'_>,
    key_kind: KeyKind,
) -> Result<(), CsrError> {
    let algorithm = &request.signature_algorithm.algorithm;
    let allowed = match key_kind {
        KeyKind::EcdsaP256 => {
            *algorithm == OID_SIG_ECDSA_WITH_SHA256 || *algorithm == OID_SIG_ECDSA_WITH_SHA384
        }
        KeyKind::Rsa { .. } => {
            *algorithm == OID_PKCS1_SHA256WITHRSA
                || *algorithm == OID_PKCS1_SHA384WITHRSA
                || *algorithm == OID_PKCS1_SHA512WITHRSA
        }
    };
    if allowed {
        Ok(())
    } else {
        Err(CsrError::SignatureAlgorithm)
    }
}

/// Bit length of a big-endian unsigned integer, ignoring leading zero bytes
/// (DER adds one when the top bit is set).
fn modulus_bits(modulus: &[u8]) -> usize {
    let significant = match modulus.iter().position(|byte| *byte != 0) {
        Some(start) => modulus.get(start..).unwrap_or_default(),
        None => return 0,
    };
    let top_bits = significant
        .first()
        .map_or(0, |byte| 8 - byte.leading_zeros() as usize);
    (significant.len().saturating_sub(1)) * 8 + top_bits
}

#[cfg(test)]
mod tests;
