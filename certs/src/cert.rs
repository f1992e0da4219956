//! Parsed X.509 certificates and the workload certificate a CA response
//! becomes (WIRE.md §2 and §3 "Client checks").
//!
//! A [`Certificate`] is parsed once, at the edge, into the facts the mesh uses:
//! identities from URI SANs, the validity window, the CA flag. Verifying a
//! peer's chain is `tls/verify.rs`'s business; making the CSR is `csr.rs`'s.

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustls::ServerConfig;
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::{self, PemObject};
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use x509_parser::certificate::X509Certificate;
use x509_parser::error::X509Error;
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::FromDer;

use crate::identity::Identity;
use crate::tls::{self, RootsError, TrustRoots};

/// The context-specific tag of `uniformResourceIdentifier` in `GeneralName`
/// (RFC 5280 §4.2.1.6). x509-parser reports a URI that is not UTF-8 as
/// `Invalid` with this tag; it still counts as a URI SAN.
const URI_TAG: u32 = 6;

/// One parsed X.509 certificate, with the DER it came from.
#[derive(Clone)]
pub struct Certificate {
    /// The encoded certificate, kept for presenting it in TLS and for webpki.
    der: CertificateDer<'static>,
    /// Every URI SAN that is a valid identity, in certificate order.
    identities: Vec<Identity>,
    /// The first URI SAN, if it is a valid identity: the certificate's own.
    identity: Option<Identity>,
    /// Every URI SAN, valid identity or not: a peer must carry exactly one.
    uri_san_count: usize,
    not_before: SystemTime,
    not_after: SystemTime,
    /// The serial number in decimal, as operators' tools print it.
    serial: String,
    /// basicConstraints CA:true; a peer's leaf must not be a CA.
    is_ca: bool,
}

/// Why a certificate or a CA response was refused.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// The PEM text is malformed.
    #[error("certificate PEM is malformed")]
    Pem(#[from] pem::Error),
    /// A PEM that must hold exactly one certificate holds some other number.
    #[error("expected exactly one certificate in the PEM, found {found}")]
    CertificateCount {
        /// How many certificates the PEM held.
        found: usize,
    },
    /// The DER is not an X.509 certificate.
    #[error("certificate DER does not parse")]
    Der(#[source] X509Error),
    /// Bytes follow the certificate inside its DER.
    #[error("certificate DER has trailing bytes")]
    TrailingData,
    /// An extension this module reads (SAN, basicConstraints) is malformed or
    /// repeated.
    #[error("certificate extension is malformed")]
    Extension(#[source] X509Error),
    /// A SAN has an embedded NUL, the classic trick to make one name read as
    /// another; the whole certificate is refused rather than the SAN skipped.
    #[error("a subject alternative name contains an embedded NUL")]
    NulInSan,
    /// A validity time cannot be represented as a `SystemTime`.
    #[error("certificate validity time is out of range")]
    ValidityOutOfRange,
    /// The CA returned no certificate at all.
    #[error("CA response holds no certificates")]
    EmptyChain,
    /// The CA returned only the leaf, so there is nothing to trust peers by.
    #[error("no root certificate present")]
    NoRoot,
    /// The root bundle (the response's last element) is unusable.
    #[error("CA response root bundle")]
    Roots(#[from] RootsError),
    /// The leaf is not for the identity that was requested.
    #[error("CA issued a certificate for {found:?}, requested {requested}")]
    IdentityMismatch {
        /// The identity the CSR asked for (boxed, like `found`, to keep
        /// every `Result` of this module small).
        requested: Box<Identity>,
        /// The leaf's first URI SAN identity, if any.
        found: Option<Box<Identity>>,
    },
    /// The private key does not load, or is not the leaf's key.
    #[error("private key does not fit the leaf certificate")]
    Key(#[source] rustls::Error),
}

impl Certificate {
    /// Parses one DER certificate.
    pub fn from_der(der: CertificateDer<'static>) -> Result<Self, CertError> {
        let (rest, x509) =
            X509Certificate::from_der(der.as_ref()).map_err(|error| match error {
                x509_parser::nom::Err::Error(e) | x509_parser::nom::Err::Failure(e) => {
                    CertError::Der(e)
                }
                x509_parser::nom::Err::Incomplete(_) => {
                    CertError::Der(X509Error::InvalidCertificate)
                }
            })?;
        if !rest.is_empty() {
            return Err(CertError::TrailingData);
        }
        let UriSans {
            identities,
            identity,
            count: uri_san_count,
        } = uri_sans(&x509)?;
        let not_before = system_time(x509.validity().not_before.timestamp())?;
        let not_after = system_time(x509.validity().not_after.timestamp())?;
        let serial = x509.serial.to_string();
        let is_ca = x509
            .basic_constraints()
            .map_err(CertError::Extension)?
            .is_some_and(|constraints| constraints.value.ca);
        // Ends the borrow of `der`, which moves into the result.
        drop(x509);
        Ok(Certificate {
            der,
            identities,
            identity,
            uri_san_count,
            not_before,
            not_after,
            serial,
            is_ca,
        })
    }

    /// Parses a PEM that holds exactly one certificate.
    pub fn from_pem(pem: &str) -> Result<Self, CertError> {
        let [der] = <[_; 1]>::try_from(parse_pem_bundle(pem)?)
            .map_err(|all: Vec<_>| CertError::CertificateCount { found: all.len() })?;
        Self::from_der(der)
    }

    /// The encoded certificate.
    pub fn der(&self) -> &CertificateDer<'static> {
        &self.der
    }

    /// The identities of every URI SAN that parses as one, in certificate
    /// order. URI SANs that are not identities are skipped (WIRE.md §2).
    pub fn identities(&self) -> &[Identity] {
        &self.identities
    }

    /// The certificate's own identity: its first URI SAN, if that is one.
    pub fn identity(&self) -> Option<&Identity> {
        self.identity.as_ref()
    }

    /// How many URI SANs the certificate carries, identities or not.
    pub fn uri_san_count(&self) -> usize {
        self.uri_san_count
    }

    /// The start of the validity window.
    pub fn not_before(&self) -> SystemTime {
        self.not_before
    }

    /// The end of the validity window.
    pub fn not_after(&self) -> SystemTime {
        self.not_after
    }

    /// The serial number, in decimal.
    pub fn serial(&self) -> &str {
        &self.serial
    }

    /// Whether basicConstraints says CA:true.
    pub fn is_ca(&self) -> bool {
        self.is_ca
    }
}

impl fmt::Debug for Certificate {
    /// Shows the parsed facts, not the DER bytes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Certificate")
            .field("identities", &self.identities)
            .field("uri_san_count", &self.uri_san_count)
            .field("not_before", &self.not_before)
            .field("not_after", &self.not_after)
            .field("serial", &self.serial)
            .field("is_ca", &self.is_ca)
            .finish()
    }
}

/// A workload's certificate as the CA returned it: the leaf, the
/// intermediates, the trust roots for peers, and the key, already paired for
/// rustls.
#[derive(Clone)]
pub struct WorkloadCertificate {
    leaf: Certificate,
    intermediates: Vec<Certificate>,
    /// The roots from the response's last element: the trust anchors for
    /// every peer this workload talks to.
    roots: TrustRoots,
    /// Leaf and intermediates with the loaded signing key, checked to match
    /// once here rather than on every TLS config built from it.
    certified_key: Arc<CertifiedKey>,
    /// The server configuration presenting this certificate, built by the
    /// first handshake that needs it and shared by every later one: it
    /// lives and is replaced with the certificate.
    server_config: OnceLock<Arc<ServerConfig>>,
}

impl WorkloadCertificate {
    /// Builds the workload certificate from `IstioCertificateResponse.cert_chain`
    /// and the key the CSR was made with, applying WIRE.md §3 "Client checks":
    /// the chain is leaf first, intermediates, then one element holding one or
    /// more root PEMs; a chain of only the leaf is refused. When `requested` is
    /// given (impersonation), the leaf's first URI SAN must equal it.
    pub fn from_ca_response(
        cert_chain: &[String],
        private_key: PrivateKeyDer<'static>,
        requested: Option<&Identity>,
    ) -> Result<Self, CertError> {
        let [leaf_pem, rest @ ..] = cert_chain else {
            return Err(CertError::EmptyChain);
        };
        let [intermediate_pems @ .., roots_pem] = rest else {
            return Err(CertError::NoRoot);
        };
        let leaf = Certificate::from_pem(leaf_pem)?;
        let intermediates = intermediate_pems
            .iter()
            .map(|pem| Certificate::from_pem(pem))
            .collect::<Result<Vec<_>, _>>()?;
        let roots = TrustRoots::from_pem_bundle(roots_pem)?;
        if let Some(requested) = requested
            && leaf.identity() != Some(requested)
        {
            return Err(CertError::IdentityMismatch {
                requested: Box::new(requested.clone()),
                found: leaf.identity().cloned().map(Box::new),
            });
        }
        let presented = std::iter::once(&leaf)
            .chain(&intermediates)
            .map(|cert| cert.der.clone())
            .collect();
        let certified_key = CertifiedKey::from_der(presented, private_key, &tls::provider())
            .map_err(CertError::Key)?;
        Ok(WorkloadCertificate {
            leaf,
            intermediates,
            roots,
            certified_key: Arc::new(certified_key),
            server_config: OnceLock::new(),
        })
    }

    /// The workload's own certificate.
    pub fn leaf(&self) -> &Certificate {
        &self.leaf
    }

    /// The intermediates between the leaf and a root, leaf side first.
    pub fn intermediates(&self) -> &[Certificate] {
        &self.intermediates
    }

    /// The chain the workload presents in a handshake: the leaf, then the
    /// intermediates.
    pub fn presented(&self) -> &[CertificateDer<'static>] {
        &self.certified_key.cert
    }

    /// The roots peers are verified against.
    pub fn roots(&self) -> &TrustRoots {
        &self.roots
    }

    /// The workload's identity: the leaf's first URI SAN.
    pub fn identity(&self) -> Option<&Identity> {
        self.leaf.identity()
    }

    /// The TLS server configuration that presents this certificate and
    /// accepts clients of its trust domain ([`tls::server_config`]), built
    /// once per certificate.
    pub fn server_config(&self) -> Result<Arc<ServerConfig>, tls::TlsError> {
        if let Some(config) = self.server_config.get() {
            return Ok(Arc::clone(config));
        }
        let config = Arc::new(tls::server_config(self)?);
        // Two first handshakes may race: both configs are equal, one is kept.
        Ok(Arc::clone(self.server_config.get_or_init(|| config)))
    }

    /// The chain (leaf, intermediates) and signing key, as rustls presents them.
    pub fn certified_key(&self) -> &Arc<CertifiedKey> {
        &self.certified_key
    }
}

impl fmt::Debug for WorkloadCertificate {
    /// Leaves the key out: it must never reach a log.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkloadCertificate")
            .field("leaf", &self.leaf)
            .field("intermediates", &self.intermediates)
            .field("roots", &self.roots)
            .finish_non_exhaustive()
    }
}

/// Splits a PEM bundle into its certificates, in order. Sections that are not
/// certificates are skipped; a bundle without any certificate gives an empty
/// list, which callers that need one turn into their own error.
pub fn parse_pem_bundle(pem: &str) -> Result<Vec<CertificateDer<'static>>, pem::Error> {
    CertificateDer::pem_slice_iter(pem.as_bytes()).collect()
}

/// What a certificate's URI SANs say about identity.
#[derive(Default)]
struct UriSans {
    identities: Vec<Identity>,
    identity: Option<Identity>,
    count: usize,
}

/// Reads the URI SANs, refusing any string SAN with an embedded NUL.
fn uri_sans(x509: &X509Certificate<'_>) -> Result<UriSans, CertError> {
    let Some(san) = x509
        .subject_alternative_name()
        .map_err(CertError::Extension)?
    else {
        return Ok(UriSans::default());
    };
    let mut sans = UriSans::default();
    for name in &san.value.general_names {
        let bytes = match name {
            GeneralName::URI(text) | GeneralName::DNSName(text) | GeneralName::RFC822Name(text) => {
                text.as_bytes()
            }
            GeneralName::Invalid(_, raw) => raw,
            _ => continue,
        };
        if bytes.contains(&0) {
            return Err(CertError::NulInSan);
        }
        let parsed = match name {
            GeneralName::URI(uri) => uri.parse::<Identity>().ok(),
            GeneralName::Invalid(tag, _) if tag.0 == URI_TAG => None,
            _ => continue,
        };
        if sans.count == 0 {
            sans.identity.clone_from(&parsed);
        }
        sans.count += 1;
        sans.identities.extend(parsed);
    }
    Ok(sans)
}

/// Seconds since the Unix epoch, either side of it, as a `SystemTime`.
fn system_time(seconds: i64) -> Result<SystemTime, CertError> {
    let offset = Duration::from_secs(seconds.unsigned_abs());
    let time = if seconds >= 0 {
        UNIX_EPOCH.checked_add(offset)
    } else {
        UNIX_EPOCH.checked_sub(offset)
    };
    time.ok_or(CertError::ValidityOutOfRange)
}

#[cfg(test)]
mod tests;
