//! The CA's signing material on Kubernetes, kept in Secrets of the control
//! plane's namespace as istiod keeps it, so that every replica and every
//! restart signs with one root:
//!
//! - `cacerts`, the operator's (keys `ca-cert.pem`, `ca-key.pem`,
//!   `root-cert.pem`, `cert-chain.pem`), wins when it exists: `ca-cert.pem`
//!   and `ca-key.pem` sign, `root-cert.pem` holds the root (and any
//!   further roots), `cert-chain.pem` the chain from the signer up;
//! - else `istio-ca-secret` (type `istio.io/ca-root`, keys `ca-cert.pem`,
//!   `ca-key.pem`): a self-signed root. When absent, a root is generated
//!   as the state directory does (`ztunnel_certs::issuer::generate_root`)
//!   and the Secret created; a replica that loses the create race (409
//!   AlreadyExists) reads the winner's. An existing Secret is never
//!   overwritten.
//!
//! Reading the Secrets into [`SigningMaterial`] is pure ([`choose`],
//! [`plugged_material`], [`self_signed_material`], [`self_signed_secret`]);
//! [`load`] is the shell that calls the API. Checking that keys match
//! their certificates is the issuer's (`Issuer::new`). Publishing the
//! root to ztunnel is `crate::root_configmap`'s. The role:
//! `deploy/rbac/control-plane-ca.yaml`.

use std::collections::BTreeMap;
use std::time::SystemTime;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::PostParams;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use ztunnel_certs::issuer::{
    IntermediateMaterial, IssuerError, SecretPem, SigningMaterial, generate_root, pem_certificate,
};

/// The operator's signing material (istiod's plugged-in CA).
pub const PLUGGED_SECRET: &str = "cacerts";
/// The self-signed root istiod (and this CA) generates and keeps.
pub const SELF_SIGNED_SECRET: &str = "istio-ca-secret";
/// The type istiod gives [`SELF_SIGNED_SECRET`].
pub const SELF_SIGNED_TYPE: &str = "istio.io/ca-root";
/// The signing certificate.
pub const CA_CERT_KEY: &str = "ca-cert.pem";
/// The signing certificate's private key.
pub const CA_KEY_KEY: &str = "ca-key.pem";
/// The root (and any further roots), what workloads trust; the same key
/// names the root in the `istio-ca-root-cert` ConfigMap.
pub const ROOT_CERT_KEY: &str = "root-cert.pem";
/// The chain from the signing certificate up to the root.
pub const CERT_CHAIN_KEY: &str = "cert-chain.pem";

/// A Secret's `data`.
pub type SecretData = BTreeMap<String, ByteString>;

/// Where the signing material comes from, in istiod's order of precedence.
#[derive(Debug, Clone, PartialEq)]
pub enum Choice {
    /// The operator's `cacerts`.
    Plugged(Secret),
    /// The self-signed root in `istio-ca-secret`.
    Stored(Secret),
    /// Neither exists: generate a root and create `istio-ca-secret`.
    Generate,
}

/// The signing material, and the Secret it was read from.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// What the issuer is built from.
    pub material: SigningMaterial,
    /// The Secret's name ([`PLUGGED_SECRET`] or [`SELF_SIGNED_SECRET`]),
    /// for the messages that name it.
    pub secret: &'static str,
}

/// `cacerts` when present, else `istio-ca-secret` when present, else a
/// root to generate.
pub fn choose(plugged: Option<Secret>, stored: Option<Secret>) -> Choice {
    match (plugged, stored) {
        (Some(plugged), _) => Choice::Plugged(plugged),
        (None, Some(stored)) => Choice::Stored(stored),
        (None, None) => Choice::Generate,
    }
}

/// The material of an operator's `cacerts`, read as istiod reads it. When
/// the signing certificate is one of the roots, the root signs; else it
/// signs as an intermediate, followed by the other certificates of
/// `ca-cert.pem` and `cert-chain.pem` (optional) that are not roots. The
/// first certificate of `root-cert.pem` is the root, the others are
/// handed out with it.
pub fn plugged_material(data: &SecretData) -> Result<SigningMaterial, SigningSecretError> {
    let secret = PLUGGED_SECRET;
    let signing_certs = certificates(data, secret, CA_CERT_KEY)?;
    let key_pem = SecretPem::new(text(data, secret, CA_KEY_KEY)?);
    let roots = certificates(data, secret, ROOT_CERT_KEY)?;
    let chain = match data.get(CERT_CHAIN_KEY) {
        Some(bytes) if !bytes.0.is_empty() => certificates(data, secret, CERT_CHAIN_KEY)?,
        _ => Vec::new(),
    };
    let (root, extra_roots) = split_first(&roots, secret, ROOT_CERT_KEY)?;
    let (signer, _) = split_first(&signing_certs, secret, CA_CERT_KEY)?;
    if roots.contains(signer) {
        let others: Vec<_> = roots.iter().filter(|cert| *cert != signer).collect();
        return Ok(SigningMaterial {
            root_cert_pem: pem_certificate(signer),
            root_key_pem: Some(key_pem),
            intermediate: None,
            extra_roots_pem: bundle(others),
        });
    }
    let mut intermediates: Vec<&CertificateDer<'static>> = Vec::new();
    for cert in signing_certs.iter().chain(&chain) {
        if !roots.contains(cert) && !intermediates.contains(&cert) {
            intermediates.push(cert);
        }
    }
    Ok(SigningMaterial {
        root_cert_pem: pem_certificate(root),
        root_key_pem: None,
        intermediate: Some(IntermediateMaterial {
            chain_pem: intermediates
                .into_iter()
                .map(|d| pem_certificate(d))
                .collect(),
            key_pem,
        }),
        extra_roots_pem: bundle(extra_roots.iter().collect()),
    })
}

/// The material of `istio-ca-secret`: the self-signed `ca-cert.pem` signs
/// with `ca-key.pem`; the certificates of `root-cert.pem`, when istiod
/// left any there, are handed out with it.
pub fn self_signed_material(data: &SecretData) -> Result<SigningMaterial, SigningSecretError> {
    let secret = SELF_SIGNED_SECRET;
    let signing_certs = certificates(data, secret, CA_CERT_KEY)?;
    let (root, _) = split_first(&signing_certs, secret, CA_CERT_KEY)?;
    let roots = match data.get(ROOT_CERT_KEY) {
        Some(bytes) if !bytes.0.is_empty() => certificates(data, secret, ROOT_CERT_KEY)?,
        _ => Vec::new(),
    };
    Ok(SigningMaterial {
        root_cert_pem: pem_certificate(root),
        root_key_pem: Some(SecretPem::new(text(data, secret, CA_KEY_KEY)?)),
        intermediate: None,
        extra_roots_pem: bundle(roots.iter().filter(|cert| *cert != root).collect()),
    })
}

/// `istio-ca-secret` holding a generated root, as istiod creates it.
pub fn self_signed_secret(namespace: &str, cert_pem: &str, key_pem: &str) -> Secret {
    let data = [(CA_CERT_KEY, cert_pem), (CA_KEY_KEY, key_pem)]
        .into_iter()
        .map(|(key, pem)| (key.to_owned(), ByteString(pem.as_bytes().to_vec())))
        .collect();
    Secret {
        metadata: ObjectMeta {
            name: Some(SELF_SIGNED_SECRET.to_owned()),
            namespace: Some(namespace.to_owned()),
            ..ObjectMeta::default()
        },
        type_: Some(SELF_SIGNED_TYPE.to_owned()),
        data: Some(data),
        ..Secret::default()
    }
}

/// Reads the signing material from `namespace`'s Secrets, creating
/// `istio-ca-secret` with a root generated for `trust_domain` when neither
/// exists.
pub async fn load(
    client: &kube::Client,
    namespace: &str,
    trust_domain: &str,
    now: SystemTime,
) -> Result<Loaded, SigningSecretError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let plugged = read(&secrets, PLUGGED_SECRET).await?;
    let stored = match plugged {
        Some(_) => None,
        None => read(&secrets, SELF_SIGNED_SECRET).await?,
    };
    let (secret, created) = match choose(plugged, stored) {
        Choice::Plugged(secret) => {
            tracing::info!(
                namespace,
                secret = PLUGGED_SECRET,
                "signing with the operator's CA"
            );
            let material = plugged_material(&data(&secret))?;
            return Ok(Loaded {
                material,
                secret: PLUGGED_SECRET,
            });
        }
        Choice::Stored(secret) => (secret, false),
        Choice::Generate => create(&secrets, namespace, trust_domain, now).await?,
    };
    tracing::info!(
        namespace,
        secret = SELF_SIGNED_SECRET,
        created,
        "signing with the self-signed root"
    );
    Ok(Loaded {
        material: self_signed_material(&data(&secret))?,
        secret: SELF_SIGNED_SECRET,
    })
}

/// Creates `istio-ca-secret` with a fresh root; when another replica
/// created it first, its Secret. The flag says whether this call made it.
async fn create(
    secrets: &Api<Secret>,
    namespace: &str,
    trust_domain: &str,
    now: SystemTime,
) -> Result<(Secret, bool), SigningSecretError> {
    let root = generate_root(trust_domain, now)?;
    let secret = self_signed_secret(namespace, &root.cert_pem, &root.key_pem);
    match secrets.create(&PostParams::default(), &secret).await {
        Ok(created) => Ok((created, true)),
        Err(kube::Error::Api(status)) if status.is_already_exists() => {
            // Another replica won the race; its root is the mesh's.
            tracing::info!(
                namespace,
                secret = SELF_SIGNED_SECRET,
                "another replica created the root first; using theirs"
            );
            let theirs = read(secrets, SELF_SIGNED_SECRET)
                .await?
                .ok_or(SigningSecretError::Vanished)?;
            Ok((theirs, false))
        }
        Err(source) => Err(SigningSecretError::Api {
            verb: "create",
            secret: SELF_SIGNED_SECRET,
            source,
        }),
    }
}

/// Why the signing material could not be read from, or stored in, the API.
#[derive(Debug, thiserror::Error)]
pub enum SigningSecretError {
    /// The API refused or failed a request.
    #[error(
        "cannot {verb} Secret {secret} (the role the control plane needs: deploy/rbac/control-plane-ca.yaml)"
    )]
    Api {
        /// `get` or `create`.
        verb: &'static str,
        /// The Secret's name.
        secret: &'static str,
        /// The client's error.
        source: kube::Error,
    },
    /// A key the Secret must have is absent or empty.
    #[error("Secret {secret} has no {key}")]
    MissingKey {
        /// The Secret's name.
        secret: &'static str,
        /// The key.
        key: &'static str,
    },
    /// A key's value is not PEM text.
    #[error("{key} in Secret {secret} is not PEM: {reason}")]
    NotPem {
        /// The Secret's name.
        secret: &'static str,
        /// The key.
        key: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Generating the root failed.
    #[error("generating the root")]
    Generate(#[from] IssuerError),
    /// `istio-ca-secret` already existed when created, then could not be
    /// found (deleted in between).
    #[error("Secret istio-ca-secret was created by another replica, then deleted; start again")]
    Vanished,
}

/// The Secret `name`, or `None` when it does not exist.
async fn read(
    secrets: &Api<Secret>,
    name: &'static str,
) -> Result<Option<Secret>, SigningSecretError> {
    secrets
        .get_opt(name)
        .await
        .map_err(|source| SigningSecretError::Api {
            verb: "get",
            secret: name,
            source,
        })
}

/// A Secret's `data`, empty when it has none.
fn data(secret: &Secret) -> SecretData {
    secret.data.clone().unwrap_or_default()
}

/// The value of `key`, as UTF-8 text; absent or empty is an error.
fn text(
    data: &SecretData,
    secret: &'static str,
    key: &'static str,
) -> Result<String, SigningSecretError> {
    let bytes = data
        .get(key)
        .filter(|bytes| !bytes.0.is_empty())
        .ok_or(SigningSecretError::MissingKey { secret, key })?;
    String::from_utf8(bytes.0.clone()).map_err(|_| SigningSecretError::NotPem {
        secret,
        key,
        reason: "not UTF-8 text",
    })
}

/// Every certificate of `key`'s PEM value, at least one.
fn certificates(
    data: &SecretData,
    secret: &'static str,
    key: &'static str,
) -> Result<Vec<CertificateDer<'static>>, SigningSecretError> {
    let pem = text(data, secret, key)?;
    // The PEM parser's own errors quote bytes; the key and a plain reason
    // say more to whoever fixes the Secret.
    let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| SigningSecretError::NotPem {
            secret,
            key,
            reason: "a certificate is cut short or badly encoded",
        })?;
    if certs.is_empty() {
        return Err(SigningSecretError::NotPem {
            secret,
            key,
            reason: "no certificate",
        });
    }
    Ok(certs)
}

/// The first certificate and the rest.
fn split_first<'a>(
    certs: &'a [CertificateDer<'static>],
    secret: &'static str,
    key: &'static str,
) -> Result<(&'a CertificateDer<'static>, &'a [CertificateDer<'static>]), SigningSecretError> {
    certs
        .split_first()
        .ok_or(SigningSecretError::MissingKey { secret, key })
}

/// One PEM bundle of `certs`, or `None` when there are none.
fn bundle(certs: Vec<&CertificateDer<'static>>) -> Option<String> {
    (!certs.is_empty()).then(|| certs.into_iter().map(|d| pem_certificate(d)).collect())
}

#[cfg(test)]
mod tests;
