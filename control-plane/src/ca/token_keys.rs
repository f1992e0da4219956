//! The public keys service-account tokens are verified with: a JWKS document
//! (what the Kubernetes API server publishes at `/openid/v1/jwks`) or PEM
//! `PUBLIC KEY` blocks. Only RS256 (RSA) and ES256 (P-256) keys are accepted,
//! so that a symmetric or weak key can never be configured by accident.
//!
//! Verifying a token is `authn.rs`'s business; minting one is `token.rs`'s.

use std::path::{Path, PathBuf};

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet, KeyAlgorithm};
use jsonwebtoken::{Algorithm, DecodingKey};
use rustls_pki_types::SubjectPublicKeyInfoDer;
use rustls_pki_types::pem::PemObject;
use x509_parser::oid_registry::{OID_EC_P256, OID_KEY_TYPE_EC_PUBLIC_KEY, OID_PKCS1_RSAENCRYPTION};
use x509_parser::prelude::FromDer;
use x509_parser::x509::SubjectPublicKeyInfo;

/// The keys a token signature may verify with.
#[derive(Clone)]
pub struct TokenKeys {
    /// In file order; a token is tried against the key its `kid` names, else
    /// against each key whose algorithm matches.
    keys: Vec<VerifyingKey>,
}

impl TokenKeys {
    /// Reads a JWKS (JSON) or PEM file, telling them apart by the first byte.
    pub fn load(path: &Path) -> Result<Self, TokenKeysError> {
        let bytes = std::fs::read(path).map_err(|source| TokenKeysError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&bytes)
    }

    /// Parses JWKS JSON (starts with `{`) or PEM.
    pub fn parse(bytes: &[u8]) -> Result<Self, TokenKeysError> {
        let first = bytes.iter().find(|byte| !byte.is_ascii_whitespace());
        if first == Some(&b'{') {
            Self::from_jwks(bytes)
        } else {
            Self::from_pem(bytes)
        }
    }

    /// Parses a JWKS document.
    pub fn from_jwks(json: &[u8]) -> Result<Self, TokenKeysError> {
        let set: JwkSet =
            serde_json::from_slice(json).map_err(|e| TokenKeysError::Jwks(e.to_string()))?;
        let mut keys = Vec::with_capacity(set.keys.len());
        for (index, jwk) in set.keys.iter().enumerate() {
            let algorithm = match &jwk.algorithm {
                AlgorithmParameters::RSA(_) => Algorithm::RS256,
                AlgorithmParameters::EllipticCurve(ec) if ec.curve == EllipticCurve::P256 => {
                    Algorithm::ES256
                }
                _ => return Err(TokenKeysError::UnsupportedJwk { index }),
            };
            let declared_ok = match jwk.common.key_algorithm {
                None => true,
                Some(KeyAlgorithm::RS256) => algorithm == Algorithm::RS256,
                Some(KeyAlgorithm::ES256) => algorithm == Algorithm::ES256,
                Some(_) => false,
            };
            if !declared_ok {
                return Err(TokenKeysError::UnsupportedJwk { index });
            }
            let key = DecodingKey::from_jwk(jwk).map_err(|_| TokenKeysError::BadJwk { index })?;
            keys.push(VerifyingKey {
                kid: jwk.common.key_id.clone(),
                algorithm,
                key,
            });
        }
        Self::non_empty(keys)
    }

    /// Parses one or more PEM `PUBLIC KEY` (SubjectPublicKeyInfo) blocks.
    pub fn from_pem(pem: &[u8]) -> Result<Self, TokenKeysError> {
        let blocks = SubjectPublicKeyInfoDer::pem_slice_iter(pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| TokenKeysError::Pem)?;
        let mut keys = Vec::with_capacity(blocks.len());
        for (index, der) in blocks.iter().enumerate() {
            let unsupported = TokenKeysError::UnsupportedPemKey { index };
            let Ok((_, spki)) = SubjectPublicKeyInfo::from_der(der.as_ref()) else {
                return Err(unsupported);
            };
            let bits = spki.subject_public_key.as_ref();
            let oid = &spki.algorithm.algorithm;
            let (algorithm, key) = if *oid == OID_PKCS1_RSAENCRYPTION {
                (Algorithm::RS256, DecodingKey::from_rsa_der(bits))
            } else if *oid == OID_KEY_TYPE_EC_PUBLIC_KEY
                && spki
                    .algorithm
                    .parameters
                    .as_ref()
                    .and_then(|p| p.as_oid().ok())
                    .is_some_and(|curve| curve == OID_EC_P256)
            {
                (Algorithm::ES256, DecodingKey::from_ec_der(bits))
            } else {
                return Err(unsupported);
            };
            keys.push(VerifyingKey {
                kid: None,
                algorithm,
                key,
            });
        }
        Self::non_empty(keys)
    }

    /// How many keys there are.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether there are none (never true for a successfully parsed set).
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Whether a key is named `kid`.
    pub fn names(&self, kid: &str) -> bool {
        self.keys.iter().any(|key| key.kid.as_deref() == Some(kid))
    }

    /// Whether `other` holds keys of the same names and algorithms, in the
    /// same order: for logging a change of the key set.
    pub fn same_names(&self, other: &TokenKeys) -> bool {
        let name = |key: &VerifyingKey| (key.kid.clone(), key.algorithm);
        self.keys.iter().map(name).eq(other.keys.iter().map(name))
    }

    /// The keys to try for a token: those whose `kid` matches, or all of
    /// them when none matches (PEM keys have no `kid`).
    pub(super) fn candidates<'a>(
        &'a self,
        kid: Option<&str>,
    ) -> impl Iterator<Item = &'a VerifyingKey> + 'a {
        let named = kid.is_some_and(|kid| self.names(kid));
        let kid = kid.map(str::to_owned);
        self.keys
            .iter()
            .filter(move |key| !named || key.kid.as_deref() == kid.as_deref())
    }

    fn non_empty(keys: Vec<VerifyingKey>) -> Result<Self, TokenKeysError> {
        if keys.is_empty() {
            return Err(TokenKeysError::Empty);
        }
        Ok(TokenKeys { keys })
    }
}

impl std::fmt::Debug for TokenKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kids: Vec<_> = self
            .keys
            .iter()
            .map(|k| (k.kid.as_deref().unwrap_or("-"), k.algorithm))
            .collect();
        f.debug_struct("TokenKeys").field("keys", &kids).finish()
    }
}

/// One verification key.
#[derive(Clone)]
pub(super) struct VerifyingKey {
    /// The JWK `kid`, when the key came from a JWKS that names it.
    pub(super) kid: Option<String>,
    /// RS256 or ES256: the only algorithm this key verifies.
    pub(super) algorithm: Algorithm,
    /// The key itself.
    pub(super) key: DecodingKey,
}

/// Why a key file was refused.
#[derive(Debug, thiserror::Error)]
pub enum TokenKeysError {
    /// The file could not be read.
    #[error("cannot read token keys {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The JSON is not a JWKS document.
    #[error("token keys are not a JWKS document: {0}")]
    Jwks(String),
    /// A JWK is not an RS256 or ES256 (P-256) public key.
    #[error("JWK {index} is not an RS256 or ES256 P-256 public key")]
    UnsupportedJwk {
        /// Position in `keys`.
        index: usize,
    },
    /// A JWK's components do not decode.
    #[error("JWK {index} does not decode")]
    BadJwk {
        /// Position in `keys`.
        index: usize,
    },
    /// The PEM has a malformed `PUBLIC KEY` block.
    #[error("token keys PEM is malformed")]
    Pem,
    /// A PEM key is not an RSA or P-256 public key.
    #[error("PEM public key {index} is not an RSA or P-256 key")]
    UnsupportedPemKey {
        /// Position among the PEM blocks.
        index: usize,
    },
    /// The file holds no usable key.
    #[error("token keys hold no key")]
    Empty,
}
