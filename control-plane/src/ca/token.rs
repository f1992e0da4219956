//! Minting Kubernetes-style projected service-account tokens (ES256), for
//! `ztunnel-ca token`, the demo, and tests: real tokens, verified the real
//! way by `authn.rs`. The signing key lives in the CA's state directory
//! (`state_dir.rs`); its public half is published as a JWKS.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use rcgen::KeyPair;
use serde::Serialize;
use ztunnel_certs::issuer::SecretPem;

use super::token_keys::{TokenKeys, TokenKeysError};

/// Signs tokens with one P-256 key.
pub struct TokenSigner {
    /// The jsonwebtoken form of the private key.
    key: EncodingKey,
    /// PKCS#8 PEM of the private key, for the state directory; wiped when
    /// the signer is dropped.
    private_key_pem: SecretPem,
    /// Uncompressed public point (0x04 ‖ x ‖ y), for the JWKS.
    public_point: Vec<u8>,
    /// Key id: a digest of the public key, so tokens name the key that signed them.
    kid: String,
}

impl TokenSigner {
    /// A signer with a fresh P-256 key.
    pub fn generate() -> Result<Self, TokenError> {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
            .map_err(|e| TokenError::Key(e.to_string()))?;
        Self::from_pem(&SecretPem::new(key.serialize_pem()))
    }

    /// A signer from a PKCS#8 PEM P-256 private key.
    pub fn from_pem(private_key_pem: &str) -> Result<Self, TokenError> {
        let pair = KeyPair::from_pem_and_sign_algo(private_key_pem, &rcgen::PKCS_ECDSA_P256_SHA256)
            .map_err(|e| TokenError::Key(e.to_string()))?;
        let key = EncodingKey::from_ec_pem(private_key_pem.as_bytes())
            .map_err(|e| TokenError::Key(e.to_string()))?;
        let public_point = pair.public_key_raw().to_vec();
        let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &public_point);
        let kid = URL_SAFE_NO_PAD.encode(digest.as_ref().get(..16).unwrap_or_default());
        Ok(TokenSigner {
            key,
            private_key_pem: SecretPem::new(private_key_pem.to_owned()),
            public_point,
            kid,
        })
    }

    /// The private key, PKCS#8 PEM.
    pub fn private_key_pem(&self) -> &str {
        &self.private_key_pem
    }

    /// The key id tokens carry in their header.
    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// The public key as a JWKS document, what `serve` verifies tokens with.
    pub fn jwks_json(&self) -> String {
        let (x, y) = self
            .public_point
            .get(1..)
            .map(|xy| xy.split_at(xy.len() / 2))
            .unwrap_or_default();
        let jwks = serde_json::json!({
            "keys": [{
                "kty": "EC",
                "crv": "P-256",
                "alg": "ES256",
                "use": "sig",
                "kid": self.kid,
                "x": URL_SAFE_NO_PAD.encode(x),
                "y": URL_SAFE_NO_PAD.encode(y),
            }]
        });
        jwks.to_string()
    }

    /// The verification keys matching this signer.
    pub fn verifying_keys(&self) -> Result<TokenKeys, TokenError> {
        Ok(TokenKeys::from_jwks(self.jwks_json().as_bytes())?)
    }

    /// Mints a token issued at `now`.
    pub fn mint(&self, token: &PodToken, now: SystemTime) -> Result<String, TokenError> {
        let iat = now
            .duration_since(UNIX_EPOCH)
            .map_err(|_| TokenError::Time)?
            .as_secs();
        let exp = iat
            .checked_add(token.ttl.as_secs())
            .ok_or(TokenError::Time)?;
        let claims = Claims {
            iss: &token.issuer,
            sub: format!(
                "system:serviceaccount:{}:{}",
                token.namespace, token.service_account
            ),
            aud: &token.audiences,
            exp,
            iat,
            nbf: iat,
            jti: URL_SAFE_NO_PAD.encode(rand::random::<[u8; 12]>()),
            kubernetes: KubernetesClaims {
                namespace: &token.namespace,
                serviceaccount: NameUid {
                    name: &token.service_account,
                    uid: "",
                },
                pod: NameUid {
                    name: &token.pod_name,
                    uid: &token.pod_uid,
                },
                node: token
                    .node_name
                    .as_deref()
                    .map(|name| NameUid { name, uid: "" }),
            },
        };
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(self.kid.clone());
        Ok(jsonwebtoken::encode(&header, &claims, &self.key)?)
    }
}

impl std::fmt::Debug for TokenSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The private key is never printed.
        f.debug_struct("TokenSigner")
            .field("kid", &self.kid)
            .finish()
    }
}

/// What a pod-bound token says about its holder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodToken {
    /// `iss`.
    pub issuer: String,
    /// `aud`.
    pub audiences: Vec<String>,
    /// Pod namespace.
    pub namespace: String,
    /// Pod service account.
    pub service_account: String,
    /// Pod name.
    pub pod_name: String,
    /// Pod UID.
    pub pod_uid: String,
    /// Node the pod runs on, as Kubernetes 1.30+ puts in the token.
    pub node_name: Option<String>,
    /// `exp − iat`.
    pub ttl: Duration,
}

/// Why a signer could not be built or a token not minted.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The key could not be generated or does not parse as a PKCS#8 P-256 key.
    #[error("token signing key: {0}")]
    Key(String),
    /// Encoding or signing the token failed.
    #[error("token signing failed")]
    Sign(#[from] jsonwebtoken::errors::Error),
    /// `now` is before 1970 or `now + ttl` overflows.
    #[error("token times are out of range")]
    Time,
    /// The published JWKS does not parse back (a bug).
    #[error("token signer JWKS")]
    Jwks(#[from] TokenKeysError),
}

/// The JSON claims of a projected service-account token.
#[derive(Serialize)]
struct Claims<'a> {
    iss: &'a str,
    sub: String,
    aud: &'a [String],
    exp: u64,
    iat: u64,
    nbf: u64,
    jti: String,
    #[serde(rename = "kubernetes.io")]
    kubernetes: KubernetesClaims<'a>,
}

#[derive(Serialize)]
struct KubernetesClaims<'a> {
    namespace: &'a str,
    serviceaccount: NameUid<'a>,
    pod: NameUid<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    node: Option<NameUid<'a>>,
}

#[derive(Serialize)]
struct NameUid<'a> {
    name: &'a str,
    uid: &'a str,
}
