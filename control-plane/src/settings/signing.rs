//! The CA's signing material when the flags name its files: the root
//! (`--root-cert`, `--root-key`), an intermediate that signs instead of
//! it, and extra roots to hand out. The root's other origins, the
//! Kubernetes Secrets and the state directory, are chosen in `main.rs`;
//! checking the material is `Issuer::new`'s business.

use std::path::{Path, PathBuf};

use anyhow::Context;
use ztunnel_certs::issuer::{IntermediateMaterial, SecretPem, SigningMaterial};

/// The flags, flattened into `serve`'s command line.
#[derive(Debug, clap::Args)]
pub(crate) struct SigningArgs {
    /// Root certificate (PEM). Without it, on Kubernetes the CA signs with
    /// the Secret `cacerts` of --pod-namespace (ca-cert.pem, ca-key.pem,
    /// root-cert.pem, cert-chain.pem, as istiod) if it exists, else with
    /// the root in the Secret `istio-ca-secret`, generated and stored there
    /// by the first replica to start; with a mesh file, a root is generated
    /// in --state-dir on first start and reused after.
    #[arg(long)]
    root_cert: Option<PathBuf>,
    /// Root private key (PEM). Not needed when an intermediate signs.
    #[arg(long, requires = "root_cert")]
    root_key: Option<PathBuf>,
    /// Intermediate chain (PEM, signing certificate first) that signs
    /// instead of the root.
    #[arg(long, requires_all = ["intermediate_key", "root_cert"])]
    intermediate_cert: Option<PathBuf>,
    /// Private key (PEM) of the signing intermediate.
    #[arg(long, requires = "intermediate_cert")]
    intermediate_key: Option<PathBuf>,
    /// More root certificates (PEM bundle) to hand out with the root, e.g.
    /// the previous root during a rotation.
    #[arg(long)]
    extra_roots: Option<PathBuf>,
}

impl SigningArgs {
    /// The root of `--root-cert` and its key, read from their files; `None`
    /// without `--root-cert`, when the root comes from elsewhere.
    pub(crate) fn root(&self) -> anyhow::Result<Option<SigningMaterial>> {
        let Some(cert) = &self.root_cert else {
            return Ok(None);
        };
        Ok(Some(SigningMaterial {
            root_cert_pem: read(cert)?,
            root_key_pem: self
                .root_key
                .as_deref()
                .map(read)
                .transpose()?
                .map(SecretPem::new),
            ..SigningMaterial::default()
        }))
    }

    /// Adds the intermediate and the extra roots of the flags to
    /// `material`, whichever origin its root has.
    pub(crate) fn add_intermediate_and_extra_roots(
        &self,
        material: &mut SigningMaterial,
    ) -> anyhow::Result<()> {
        if let (Some(cert), Some(key)) = (&self.intermediate_cert, &self.intermediate_key) {
            material.intermediate = Some(IntermediateMaterial {
                chain_pem: read(cert)?,
                key_pem: SecretPem::new(read(key)?),
            });
        }
        if let Some(path) = &self.extra_roots {
            let extra = material.extra_roots_pem.take().unwrap_or_default();
            material.extra_roots_pem = Some(extra + &read(path)?);
        }
        Ok(())
    }
}

/// The text of a PEM file; an error names the file.
fn read(path: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}
