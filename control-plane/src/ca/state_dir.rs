//! The CA's state directory: the generated root (`root-cert.pem`,
//! `root-key.pem`) and the local token signing key (`token-key.pem`, with its
//! public half in `token-jwks.json`). Each is created on first use and
//! reused after; private keys are written with mode 0600.
//!
//! Files are created atomically and only if absent
//! (`ztunnel_process::state_file`), so that `serve` and `token` started
//! together agree on one key.

use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use ztunnel_certs::issuer::{GeneratedRoot, IssuerError, SecretPem, generate_root};
use ztunnel_process::state_file::{self, StateFileError};

use super::token::{TokenError, TokenSigner};

/// Root certificate file name.
pub const ROOT_CERT_FILE: &str = "root-cert.pem";
/// Root key file name.
pub const ROOT_KEY_FILE: &str = "root-key.pem";
/// Token signing key file name.
pub const TOKEN_KEY_FILE: &str = "token-key.pem";
/// Token verification JWKS file name.
pub const TOKEN_JWKS_FILE: &str = "token-jwks.json";

/// Mode of private key files: owner read/write only.
const PRIVATE_MODE: u32 = 0o600;
/// Mode of public files.
const PUBLIC_MODE: u32 = 0o644;
/// Mode of the directory itself.
const DIR_MODE: u32 = 0o700;

/// A directory the CA keeps generated keys in.
#[derive(Debug, Clone)]
pub struct StateDir {
    /// The directory.
    path: PathBuf,
}

impl StateDir {
    /// Opens the directory, creating it (mode 0700) if needed.
    pub fn open(path: &Path) -> Result<Self, StateDirError> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(DIR_MODE)
            .create(path)
            .map_err(|source| io_error(path, source))?;
        Ok(StateDir {
            path: path.to_owned(),
        })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The path of a file in the directory.
    pub fn file(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// The root certificate and key, generated for `trust_domain` if absent.
    pub fn root(
        &self,
        trust_domain: &str,
        now: SystemTime,
    ) -> Result<GeneratedRoot, StateDirError> {
        let cert_path = self.file(ROOT_CERT_FILE);
        let key_path = self.file(ROOT_KEY_FILE);
        match (cert_path.exists(), key_path.exists()) {
            (true, true) => {}
            (false, false) => {
                let root = generate_root(trust_domain, now)?;
                state_file::create_if_absent(&key_path, root.key_pem.as_bytes(), PRIVATE_MODE)?;
                state_file::create_if_absent(&cert_path, root.cert_pem.as_bytes(), PUBLIC_MODE)?;
                tracing::info!(path = %cert_path.display(), "generated a new root");
            }
            (true, false) => {
                return Err(StateDirError::HalfRoot {
                    present: cert_path,
                    absent: key_path,
                });
            }
            (false, true) => {
                return Err(StateDirError::HalfRoot {
                    present: key_path,
                    absent: cert_path,
                });
            }
        }
        Ok(GeneratedRoot {
            cert_pem: read(&cert_path)?,
            key_pem: SecretPem::new(read(&key_path)?),
        })
    }

    /// The token signer, generated if absent, with its JWKS kept up to date.
    pub fn token_signer(&self) -> Result<TokenSigner, StateDirError> {
        let key_path = self.file(TOKEN_KEY_FILE);
        if !key_path.exists() {
            let signer = TokenSigner::generate()?;
            state_file::create_if_absent(
                &key_path,
                signer.private_key_pem().as_bytes(),
                PRIVATE_MODE,
            )?;
        }
        let signer = TokenSigner::from_pem(&SecretPem::new(read(&key_path)?))?;
        let jwks_path = self.file(TOKEN_JWKS_FILE);
        let jwks = signer.jwks_json();
        if read(&jwks_path).ok().as_deref() != Some(jwks.as_str()) {
            state_file::replace(&jwks_path, jwks.as_bytes(), PUBLIC_MODE)?;
        }
        Ok(signer)
    }
}

/// Why the state directory could not be used.
#[derive(Debug, thiserror::Error)]
pub enum StateDirError {
    /// A file or the directory could not be read or written.
    #[error("state directory {path}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// Only one of the root certificate and key exists.
    #[error("state directory has {present} but not {absent}; restore or remove it")]
    HalfRoot {
        /// The file found.
        present: PathBuf,
        /// The file missing.
        absent: PathBuf,
    },
    /// A file could not be written.
    #[error(transparent)]
    File(#[from] StateFileError),
    /// Generating the root failed.
    #[error("generating the root")]
    Root(#[from] IssuerError),
    /// The token key could not be generated or read.
    #[error("token key")]
    Token(#[from] TokenError),
}

fn io_error(path: &Path, source: io::Error) -> StateDirError {
    StateDirError::Io {
        path: path.to_owned(),
        source,
    }
}

fn read(path: &Path) -> Result<String, StateDirError> {
    std::fs::read_to_string(path).map_err(|source| io_error(path, source))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn root_and_token_key_are_created_once_with_private_modes() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::open(&dir.path().join("state")).unwrap();
        let first = state.root("cluster.local", SystemTime::now()).unwrap();
        let again = state.root("cluster.local", SystemTime::now()).unwrap();
        assert_eq!(first.cert_pem, again.cert_pem, "reused, not regenerated");
        let mode = |name: &str| {
            std::fs::metadata(state.file(name))
                .unwrap()
                .permissions()
                .mode()
                & 0o777
        };
        assert_eq!(mode(ROOT_KEY_FILE), 0o600);

        let signer = state.token_signer().unwrap();
        assert_eq!(mode(TOKEN_KEY_FILE), 0o600);
        assert_eq!(state.token_signer().unwrap().kid(), signer.kid());
        let jwks = std::fs::read_to_string(state.file(TOKEN_JWKS_FILE)).unwrap();
        assert_eq!(jwks, signer.jwks_json());

        std::fs::remove_file(state.file(ROOT_CERT_FILE)).unwrap();
        assert!(matches!(
            state.root("cluster.local", SystemTime::now()),
            Err(StateDirError::HalfRoot { .. })
        ));
    }
}
