//! The certificate issuer: holds the signing key and CA chain, signs workload
//! certificates the way istiod does (WIRE.md §2), and builds the response
//! chain of WIRE.md §3.
//!
//! It works on PEM text and takes `now` as an argument; reading and writing
//! key files is the CA's state directory's business (`ca/state_dir.rs`).
//! Who may have which identity is decided before the issuer is called
//! (`ca/authz.rs`).

use std::net::IpAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType, SerialNumber,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use x509_parser::certificate::X509Certificate;
use x509_parser::prelude::FromDer;
use zeroize::{Zeroize, Zeroizing};

use crate::identity::Identity;

mod signing_request;

pub use signing_request::{CsrError, KeyKind, MAX_CSR_BYTES, SigningRequest};

/// How far NotBefore is backdated, so that peers with a slightly slow clock
/// accept a fresh certificate (istiod uses the same 2 minutes).
const BACKDATE: Duration = Duration::from_secs(120);

/// Lifetime of a generated root: long enough that rotation is a planned
/// event, not a surprise.
const ROOT_LIFETIME: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// Lifetime of the CA's own serving certificate, clamped to the signer's.
const SERVING_LIFETIME: Duration = Duration::from_secs(365 * 24 * 3600);

/// Signs workload certificates and knows the chain to hand out with them.
#[derive(Debug)]
pub struct Issuer {
    /// The key and name that sign leaves: the intermediate if there is one,
    /// else the root.
    signer: rcgen::Issuer<'static, KeyPair>,
    /// Leaves never outlive their signer (WIRE.md §2).
    signer_not_after: SystemTime,
    /// Intermediates, signer first, each one PEM certificate ending in `\n`.
    intermediates_pem: Vec<String>,
    /// The same, as DER, for the CA's own TLS chain.
    intermediates_der: Vec<CertificateDer<'static>>,
    /// The root and the extra roots, as one PEM bundle: the last element of
    /// every response.
    root_bundle_pem: String,
    /// The same roots as DER, for clients that want trust anchors.
    roots_der: Vec<CertificateDer<'static>>,
}

impl Issuer {
    /// Builds an issuer from PEM material, checking that keys match their
    /// certificates and that the intermediate chain leads to the root.
    pub fn new(material: &SigningMaterial) -> Result<Self, IssuerError> {
        let root = single_certificate(&material.root_cert_pem, "root certificate")?;
        let mut roots_der = vec![root.clone()];
        if let Some(extra) = &material.extra_roots_pem {
            for cert in certificates(extra, "extra roots")? {
                if !roots_der.contains(&cert) {
                    roots_der.push(cert);
                }
            }
        }
        let root_bundle_pem = roots_der.iter().map(|der| pem_certificate(der)).collect();

        let (signer_der, signer_key, intermediates_der, what) = match &material.intermediate {
            Some(intermediate) => {
                let chain = certificates(&intermediate.chain_pem, "intermediate chain")?;
                check_chain(&chain, &root)?;
                let key = parse_key(&intermediate.key_pem, "intermediate key")?;
                let signer = chain.first().cloned().ok_or(IssuerError::NoCertificate {
                    what: "intermediate chain",
                })?;
                (signer, key, chain, "intermediate")
            }
            None => {
                let key_pem = material
                    .root_key_pem
                    .as_ref()
                    .ok_or(IssuerError::NoSigningKey)?;
                let key = parse_key(key_pem, "root key")?;
                (root.clone(), key, Vec::new(), "root")
            }
        };
        let signer_not_after = check_signer(&signer_der, &signer_key, what)?;
        let signer = rcgen::Issuer::from_ca_cert_der(&signer_der, signer_key)?;
        Ok(Issuer {
            signer,
            signer_not_after,
            intermediates_pem: intermediates_der
                .iter()
                .map(|d| pem_certificate(d))
                .collect(),
            intermediates_der,
            root_bundle_pem,
            roots_der,
        })
    }

    /// Signs a workload certificate for `identity` over the request's key
    /// and returns the response chain of WIRE.md §3: leaf, each intermediate
    /// as its own element, then the whole root bundle as the last element.
    pub fn sign_workload(
        &self,
        request: &SigningRequest,
        identity: &Identity,
        ttl: Duration,
        now: SystemTime,
    ) -> Result<Vec<String>, IssuerError> {
        let mut params = self.leaf_params(ttl, now)?;
        params.subject_alt_names = vec![SanType::URI(identity.as_str().try_into()?)];
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let leaf = params.signed_by(request.public_key(), &self.signer)?;
        let mut chain = Vec::with_capacity(self.intermediates_pem.len() + 2);
        chain.push(pem_certificate(leaf.der()));
        chain.extend(self.intermediates_pem.iter().cloned());
        chain.push(self.root_bundle_pem.clone());
        Ok(chain)
    }

    /// Issues the CA's own TLS serving certificate, with a fresh P-256 key,
    /// for the given DNS names and IP addresses.
    pub fn sign_server(
        &self,
        dns_names: &[String],
        ips: &[IpAddr],
        now: SystemTime,
    ) -> Result<ServingCertificate, IssuerError> {
        let mut key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let mut params = self.leaf_params(SERVING_LIFETIME, now)?;
        params.subject_alt_names = dns_names
            .iter()
            .map(|name| Ok(SanType::DnsName(name.as_str().try_into()?)))
            .chain(ips.iter().map(|ip| Ok(SanType::IpAddress(*ip))))
            .collect::<Result<_, rcgen::Error>>()?;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let leaf = params.signed_by(&key, &self.signer)?;
        let mut chain = vec![leaf.der().clone()];
        chain.extend(self.intermediates_der.iter().cloned());
        let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        // rcgen's copy; the one returned goes to rustls, which wipes it.
        key.zeroize();
        Ok(ServingCertificate { chain, key: der })
    }

    /// The root bundle, PEM: what clients put in their trust store.
    pub fn root_bundle_pem(&self) -> &str {
        &self.root_bundle_pem
    }

    /// The roots as DER, the root first.
    pub fn roots(&self) -> &[CertificateDer<'static>] {
        &self.roots_der
    }

    /// When the signing certificate expires; no leaf outlives it.
    pub fn signer_not_after(&self) -> SystemTime {
        self.signer_not_after
    }

    /// Parameters shared by every leaf: empty subject (so the SAN extension is
    /// critical), CA:false, backdated NotBefore, NotAfter clamped to the signer.
    fn leaf_params(
        &self,
        ttl: Duration,
        now: SystemTime,
    ) -> Result<CertificateParams, IssuerError> {
        if now >= self.signer_not_after {
            return Err(IssuerError::SignerExpired);
        }
        let not_after = now
            .checked_add(ttl)
            .map_or(self.signer_not_after, |end| end.min(self.signer_not_after));
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params.is_ca = IsCa::ExplicitNoCa;
        params.not_before = (now.checked_sub(BACKDATE).unwrap_or(now)).into();
        params.not_after = not_after.into();
        params.serial_number = Some(random_serial());
        params.use_authority_key_identifier_extension = true;
        Ok(params)
    }
}

/// Workload certificate lifetimes: the default, and the most a caller may ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TtlPolicy {
    /// Used when the request asks for 0 or less.
    default: Duration,
    /// Requests above this are refused.
    max: Duration,
}

impl TtlPolicy {
    /// A policy; a default above the maximum is lowered to it.
    pub fn new(default: Duration, max: Duration) -> Self {
        TtlPolicy {
            default: default.min(max),
            max,
        }
    }

    /// The lifetime to issue for a request's `validity_duration` (seconds):
    /// 0 or less means the default, above the maximum is refused.
    pub fn resolve(&self, requested_secs: i64) -> Result<Duration, IssuerError> {
        let Ok(requested) = u64::try_from(requested_secs) else {
            return Ok(self.default);
        };
        if requested == 0 {
            return Ok(self.default);
        }
        let requested = Duration::from_secs(requested);
        if requested > self.max {
            return Err(IssuerError::TtlTooLong {
                requested_secs,
                max_secs: self.max.as_secs(),
            });
        }
        Ok(requested)
    }

    /// The lifetime used when a request does not ask for one.
    pub fn default_ttl(&self) -> Duration {
        self.default
    }

    /// The longest lifetime a request may ask for.
    pub fn max_ttl(&self) -> Duration {
        self.max
    }
}

/// A private key's PEM text, wiped when dropped: signing material is read
/// at start-up and at each rotation, and its text would otherwise stay in
/// freed memory for the process's life.
pub type SecretPem = Zeroizing<String>;

/// The PEM inputs an [`Issuer`] is built from. `Debug` leaves the keys out.
#[derive(Clone, Default)]
pub struct SigningMaterial {
    /// The root certificate (one PEM certificate).
    pub root_cert_pem: String,
    /// The root key. Needed only when there is no intermediate, so that an
    /// operator can keep the root key offline.
    pub root_key_pem: Option<SecretPem>,
    /// An intermediate that signs instead of the root.
    pub intermediate: Option<IntermediateMaterial>,
    /// More roots to trust, e.g. the previous root during a rotation.
    pub extra_roots_pem: Option<String>,
}

/// An intermediate CA: its chain, signer first, and the signer's key.
/// `Debug` leaves the key out.
#[derive(Clone)]
pub struct IntermediateMaterial {
    /// One or more PEM certificates; the first is the signing one, each is
    /// signed by the next, and the last by the root.
    pub chain_pem: String,
    /// The signing intermediate's private key.
    pub key_pem: SecretPem,
}

/// A root certificate and key generated by [`generate_root`]. `Debug`
/// leaves the key out.
#[derive(Clone)]
pub struct GeneratedRoot {
    /// The self-signed root, PEM.
    pub cert_pem: String,
    /// Its PKCS#8 private key, PEM.
    pub key_pem: SecretPem,
}

/// What `Debug` shows in place of a private key.
const ELIDED: &str = "elided";

impl std::fmt::Debug for SigningMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningMaterial")
            .field("root_cert_pem", &self.root_cert_pem)
            .field("root_key_pem", &self.root_key_pem.as_ref().map(|_| ELIDED))
            .field("intermediate", &self.intermediate)
            .field("extra_roots_pem", &self.extra_roots_pem)
            .finish()
    }
}

impl std::fmt::Debug for IntermediateMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IntermediateMaterial")
            .field("chain_pem", &self.chain_pem)
            .field("key_pem", &ELIDED)
            .finish()
    }
}

impl std::fmt::Debug for GeneratedRoot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GeneratedRoot")
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &ELIDED)
            .finish()
    }
}

/// The CA's own TLS serving certificate.
#[derive(Debug)]
pub struct ServingCertificate {
    /// Leaf first, then the intermediates.
    pub chain: Vec<CertificateDer<'static>>,
    /// The leaf's key.
    pub key: PrivateKeyDer<'static>,
}

/// What went wrong while loading signing material or signing.
#[derive(Debug, thiserror::Error)]
pub enum IssuerError {
    /// A PEM input holds no certificate.
    #[error("{what} holds no PEM certificate")]
    NoCertificate {
        /// Which input.
        what: &'static str,
    },
    /// A certificate does not parse as X.509.
    #[error("{what} does not parse as an X.509 certificate")]
    BadCertificate {
        /// Which input.
        what: &'static str,
    },
    /// A private key does not parse, or is of a type we cannot sign with.
    #[error("{what} is not a P-256, P-384 or RSA private key in PEM")]
    BadKey {
        /// Which input.
        what: &'static str,
    },
    /// Neither a root key nor an intermediate was given.
    #[error("a root key or an intermediate is needed to sign")]
    NoSigningKey,
    /// A private key does not belong to its certificate.
    #[error("{what} key does not match its certificate")]
    KeyMismatch {
        /// Which input.
        what: &'static str,
    },
    /// A signing certificate lacks BasicConstraints CA:true.
    #[error("{what} is not a CA certificate")]
    NotCa {
        /// Which input.
        what: &'static str,
    },
    /// The intermediate chain does not lead to the root.
    #[error("intermediate certificate {index} is not signed by the next certificate or the root")]
    BrokenChain {
        /// Position in the intermediate chain, 0 = signer.
        index: usize,
    },
    /// A requested lifetime is longer than the policy's maximum.
    #[error("requested TTL {requested_secs}s is longer than the maximum {max_secs}s")]
    TtlTooLong {
        /// Seconds requested.
        requested_secs: i64,
        /// The maximum, in seconds.
        max_secs: u64,
    },
    /// The signing certificate has expired.
    #[error("the signing certificate has expired")]
    SignerExpired,
    /// rcgen refused to build or sign the certificate.
    #[error("certificate generation failed")]
    Generate(#[from] rcgen::Error),
}

/// Generates a self-signed ECDSA P-256 root named after the trust domain.
pub fn generate_root(trust_domain: &str, now: SystemTime) -> Result<GeneratedRoot, IssuerError> {
    let mut key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let mut params = CertificateParams::default();
    let mut name = DistinguishedName::new();
    name.push(DnType::OrganizationName, trust_domain);
    name.push(DnType::CommonName, format!("{trust_domain} root CA"));
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.not_before = now.checked_sub(BACKDATE).unwrap_or(now).into();
    params.not_after = now.checked_add(ROOT_LIFETIME).unwrap_or(now).into();
    params.serial_number = Some(random_serial());
    let cert = params.self_signed(&key)?;
    let key_pem = Zeroizing::new(key.serialize_pem());
    // rcgen's DER copy of the key, which it does not wipe itself.
    key.zeroize();
    Ok(GeneratedRoot {
        cert_pem: pem_certificate(cert.der()),
        key_pem,
    })
}

/// Encodes one certificate as PEM with 64-column lines and a trailing `\n`.
pub fn pem_certificate(der: &[u8]) -> String {
    let body = base64::engine::general_purpose::STANDARD.encode(der);
    let mut pem = String::with_capacity(body.len() + body.len() / 64 + 60);
    pem.push_str("-----BEGIN CERTIFICATE-----\n");
    for line in body.as_bytes().chunks(64) {
        pem.push_str(std::str::from_utf8(line).unwrap_or_default());
        pem.push('\n');
    }
    pem.push_str("-----END CERTIFICATE-----\n");
    pem
}

/// Every certificate in a PEM text, at least one.
fn certificates(
    pem: &str,
    what: &'static str,
) -> Result<Vec<CertificateDer<'static>>, IssuerError> {
    let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| IssuerError::NoCertificate { what })?;
    if certs.is_empty() {
        return Err(IssuerError::NoCertificate { what });
    }
    for cert in &certs {
        X509Certificate::from_der(cert).map_err(|_| IssuerError::BadCertificate { what })?;
    }
    Ok(certs)
}

/// The single certificate of a PEM text.
fn single_certificate(
    pem: &str,
    what: &'static str,
) -> Result<CertificateDer<'static>, IssuerError> {
    certificates(pem, what)?
        .into_iter()
        .next()
        .ok_or(IssuerError::NoCertificate { what })
}

/// Parses a PKCS#8, PKCS#1 or SEC1 PEM key of a type rcgen can sign with.
fn parse_key(pem: &str, what: &'static str) -> Result<KeyPair, IssuerError> {
    // Wiped once rcgen has its own copy (which the issuer keeps for life).
    let der = Zeroizing::new(
        PrivateKeyDer::from_pem_slice(pem.as_bytes()).map_err(|_| IssuerError::BadKey { what })?,
    );
    [
        &rcgen::PKCS_ECDSA_P256_SHA256,
        &rcgen::PKCS_ECDSA_P384_SHA384,
        &rcgen::PKCS_RSA_SHA256,
    ]
    .into_iter()
    .find_map(|algorithm| KeyPair::from_der_and_sign_algo(&der, algorithm).ok())
    .map(|mut pair| {
        // rcgen keeps a DER copy beside the crypto library's parsed key,
        // and has no `Drop` to wipe it: signing needs only the parsed key,
        // which aws-lc cleanses when it frees it.
        pair.zeroize();
        pair
    })
    .ok_or(IssuerError::BadKey { what })
}

/// Checks that the signing certificate is a CA whose public key is `key`'s,
/// and returns its NotAfter.
fn check_signer(der: &[u8], key: &KeyPair, what: &'static str) -> Result<SystemTime, IssuerError> {
    let (_, cert) =
        X509Certificate::from_der(der).map_err(|_| IssuerError::BadCertificate { what })?;
    if !cert.is_ca() {
        return Err(IssuerError::NotCa { what });
    }
    if cert.public_key().subject_public_key.as_ref() != key.public_key_raw() {
        return Err(IssuerError::KeyMismatch { what });
    }
    let not_after = cert.validity().not_after.timestamp();
    let secs = u64::try_from(not_after).unwrap_or(0);
    Ok(UNIX_EPOCH + Duration::from_secs(secs))
}

/// Checks that each intermediate is a CA signed by the next one, and the
/// last by the root.
fn check_chain(chain: &[CertificateDer<'_>], root: &CertificateDer<'_>) -> Result<(), IssuerError> {
    let what = "intermediate chain";
    let (_, root) =
        X509Certificate::from_der(root).map_err(|_| IssuerError::BadCertificate { what })?;
    let parsed = chain
        .iter()
        .map(|der| X509Certificate::from_der(der).map(|(_, cert)| cert))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| IssuerError::BadCertificate { what })?;
    for (index, cert) in parsed.iter().enumerate() {
        if !cert.is_ca() {
            return Err(IssuerError::NotCa { what });
        }
        let parent = parsed.get(index + 1).unwrap_or(&root);
        cert.verify_signature(Some(parent.public_key()))
            .map_err(|_| IssuerError::BrokenChain { index })?;
    }
    Ok(())
}

/// A random positive 128-bit serial number (RFC 5280 allows up to 20 bytes).
fn random_serial() -> SerialNumber {
    let mut bytes: [u8; 16] = rand::random();
    // Clear the top bit so the DER INTEGER is positive without a pad byte.
    bytes[0] &= 0x7f;
    SerialNumber::from_slice(&bytes)
}

#[cfg(test)]
mod tests;
