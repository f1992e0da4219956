//! Istio's `CRL_PATH`: the revocation lists peers are checked against,
//! read at start-up and read again whenever the file's content changes.
//! From the next handshake on a revoked peer is refused, and every open
//! HBONE connection (inbound on 15008, outbound in the pool) whose peer the
//! new lists revoke is closed at once, its streams with it
//! (`revocation/peer.rs`). Parsing, checking and tracking the open
//! connections are `ztunnel_certs::tls::revocation`'s; this module reads
//! the file.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ztunnel_certs::error_chain::ErrorChain;
use ztunnel_certs::tls::record::HandshakeError;
use ztunnel_certs::tls::revocation::{self, RevocationError, RevocationLists};

use crate::drain::DrainWatcher;

mod peer;

pub use peer::{PeerRevoked, RevocationWatch, WatchedPeer, revoked_while_open, until_revoked};

/// How often the file is read for changes: a revocation applies within
/// this long, for a read of a small file.
const POLL: Duration = Duration::from_secs(5);

/// Why the revocation file was refused at start-up.
#[derive(Debug, thiserror::Error)]
pub enum CrlError {
    /// The file exists but cannot be read.
    #[error("reading the revocation lists {path}")]
    Read {
        /// `CRL_PATH`.
        path: PathBuf,
        /// What the kernel said.
        source: std::io::Error,
    },
    /// The file does not hold revocation lists.
    #[error("the revocation lists {path}")]
    Parse {
        /// `CRL_PATH`.
        path: PathBuf,
        /// What is wrong with it.
        source: RevocationError,
    },
}

/// Whether a handshake failed because the peer's chain is revoked: the
/// `CERT_REVOKED` flag and `istio_crl_policy_rejections_total`.
pub fn revoked(error: &HandshakeError) -> bool {
    matches!(
        error,
        HandshakeError::Tls(rustls::Error::InvalidCertificate(
            rustls::CertificateError::Revoked
        ))
    )
}

/// Reads and installs the lists at start-up; a missing file installs none
/// (it is looked for again at every poll), a malformed one is an error.
/// Returns the content installed. From here on handshakes keep their
/// peer's chain, so that open connections can be judged against the lists
/// to come.
pub fn load(path: &Path) -> Result<Option<Vec<u8>>, CrlError> {
    revocation::track_connections();
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            tracing::warn!(path = %path.display(), "CRL_PATH does not exist yet: no certificate is revoked until it does");
            return Ok(None);
        }
        Err(source) => {
            return Err(CrlError::Read {
                path: path.to_owned(),
                source,
            });
        }
    };
    let lists = RevocationLists::parse(&bytes).map_err(|source| CrlError::Parse {
        path: path.to_owned(),
        source,
    })?;
    tracing::info!(path = %path.display(), lists = lists.len(), "revocation lists in force");
    revocation::install(lists);
    Ok(Some(bytes))
}

/// Reads the file every 5 s (`POLL`) until `drain` signals, and installs its
/// lists when its content changed. A changed file that does not parse
/// keeps the lists in force, with a warning.
pub async fn watch(path: PathBuf, mut installed: Option<Vec<u8>>, drain: DrainWatcher) {
    loop {
        tokio::select! {
            () = drain.signaled() => return,
            () = tokio::time::sleep(POLL) => {}
        }
        let Ok(bytes) = tokio::fs::read(&path).await else {
            continue;
        };
        if installed.as_ref() == Some(&bytes) {
            continue;
        }
        match RevocationLists::parse(&bytes) {
            Ok(lists) => {
                tracing::info!(path = %path.display(), lists = lists.len(), "revocation lists changed");
                revocation::install(lists);
                installed = Some(bytes);
            }
            Err(error) => tracing::warn!(
                path = %path.display(),
                error = %ErrorChain(&error),
                "the changed revocation lists do not parse; keeping those in force"
            ),
        }
    }
}

#[cfg(test)]
mod tests;
