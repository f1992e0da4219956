//! Certificate revocation lists (Istio's `CRL_PATH`): peers whose
//! certificate, or an intermediate of its chain, a loaded list revokes are
//! refused by both verifiers (`verify.rs`), and connections already open
//! to such a peer are told so when the list is installed
//! (`revocation/open.rs`). A certificate whose issuer has no list loaded is
//! judged as before, and a list past its nextUpdate still applies: a stale
//! list must not turn every peer away.
//!
//! The lists in force are process-wide: the verifiers live inside TLS
//! configurations built once per workload certificate, while the lists
//! change on their own schedule (the proxy re-reads the file). Reading and
//! watching the file, and closing a connection whose peer is revoked, are
//! the proxy's business; this module parses, holds and judges.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, PoisonError, RwLock};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, CertificateRevocationListDer};
use webpki::{CertRevocationList, OwnedCertRevocationList};

mod open;

pub use open::{PeerChain, PeerRole, Revocation, Tracked};

use open::OpenConnections;

/// The process's lists and the connections judged against them.
static PROCESS: LazyLock<Arc<Revocations>> = LazyLock::new(Arc::default);

/// Why a revocation file was refused.
#[derive(Debug, thiserror::Error)]
pub enum RevocationError {
    /// The PEM text is malformed.
    #[error("revocation list PEM is malformed")]
    Pem(#[from] rustls_pki_types::pem::Error),
    /// A list does not parse as an X.509 CRL.
    #[error("revocation list {index} does not parse: {error:?}")]
    Der {
        /// Position of the list in the file, from 0.
        index: usize,
        /// What webpki found wrong with it.
        error: webpki::Error,
    },
}

/// Parsed revocation lists; cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct RevocationLists(Arc<[CertRevocationList<'static>]>);

impl RevocationLists {
    /// Parses a file's content: PEM `X509 CRL` blocks (other blocks are
    /// skipped), or one DER list. An empty file revokes nothing.
    pub fn parse(bytes: &[u8]) -> Result<Self, RevocationError> {
        let ders: Vec<CertificateRevocationListDer<'static>> = if bytes.is_empty() {
            Vec::new()
        } else if bytes.starts_with(b"-----BEGIN") {
            CertificateRevocationListDer::pem_slice_iter(bytes).collect::<Result<_, _>>()?
        } else {
            vec![CertificateRevocationListDer::from(bytes.to_vec())]
        };
        let lists = ders
            .iter()
            .enumerate()
            .map(|(index, der)| {
                OwnedCertRevocationList::from_der(der.as_ref())
                    .map(CertRevocationList::from)
                    .map_err(|error| RevocationError::Der { index, error })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(RevocationLists(lists.into()))
    }

    /// How many lists.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there is no list.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// References to each list, as webpki's options take them.
    pub(crate) fn refs(&self) -> Vec<&CertRevocationList<'static>> {
        self.0.iter().collect()
    }

    /// Whether a list names `certificate`: one of its issuer's name lists
    /// its serial. A cheap sieve before webpki judges the whole chain,
    /// which also checks the list's signature; a certificate that does not
    /// parse is left to webpki too.
    pub(crate) fn names(&self, certificate: &CertificateDer<'_>) -> bool {
        let Ok(parsed) = webpki::EndEntityCert::try_from(certificate) else {
            return false;
        };
        self.0.iter().any(|list| {
            list.issuer() == parsed.issuer()
                && matches!(list.find_serial(parsed.serial()), Ok(Some(_)))
        })
    }
}

/// Puts `lists` in force for every verification from now on, and tells
/// each tracked open connection whose peer they revoke.
pub fn install(lists: RevocationLists) {
    PROCESS.install(lists);
}

/// Makes every handshake from now on keep its peer's chain, so that the
/// connection can be tracked: called once `CRL_PATH` is configured, before
/// any list is read. Without it a handshake keeps nothing.
pub fn track_connections() {
    PROCESS.tracking.store(true, Ordering::SeqCst);
}

/// Watches an open connection whose peer presented `chain`, verified
/// against `roots` as `role`: its [`Revocation`] fires once a list
/// installed after its handshake began revokes the chain. Dropping the
/// handle stops the watch.
pub fn track(chain: PeerChain, roots: crate::tls::TrustRoots, role: PeerRole) -> Tracked {
    Revocations::track(&PROCESS, chain, roots, role)
}

/// Watches a connection that had no handshake, between two workloads of
/// this process (the proxy's same-node path), as if `presented` (a chain
/// the process holds, leaf first) had just been presented by a peer in
/// `role`: it is judged at once against the lists in force, as a
/// handshake's verifier would, and then against every list installed
/// while it is tracked. `None` when connections are not tracked
/// ([`track_connections`]).
pub fn track_in_process(
    presented: &[CertificateDer<'static>],
    roots: crate::tls::TrustRoots,
    role: PeerRole,
) -> Option<Tracked> {
    Revocations::track_in_process(&PROCESS, presented, roots, role)
}

/// The lists in force, if any.
pub(crate) fn in_force() -> Option<RevocationLists> {
    PROCESS.in_force()
}

/// Where a handshake starting now is in the sequence of installed lists,
/// when connections are tracked; `None` otherwise.
pub(crate) fn watch_point() -> Option<u64> {
    PROCESS
        .tracking
        .load(Ordering::Relaxed)
        .then(|| PROCESS.generation.load(Ordering::SeqCst))
}

/// Lists in force, their generation, and the open connections tracked
/// against them. One per process ([`PROCESS`]); tests make their own.
#[derive(Default)]
pub(crate) struct Revocations {
    lists: RwLock<Option<RevocationLists>>,
    /// Counts installs. A connection whose handshake began in an earlier
    /// generation may have been verified against lists older than the
    /// latest, and missed by the re-check of the open connections too (it
    /// was not tracked yet): it is judged again when tracked.
    generation: AtomicU64,
    /// Whether handshakes keep their peer's chain ([`track_connections`]).
    tracking: AtomicBool,
    open: OpenConnections,
}

impl Revocations {
    /// See [`install`]. The lists are in force before the generation moves
    /// on, and the generation moves on before the open connections are
    /// listed: a connection tracked meanwhile is either listed, or sees the
    /// new generation and judges itself.
    pub(crate) fn install(&self, lists: RevocationLists) {
        *self.lists.write().unwrap_or_else(PoisonError::into_inner) = Some(lists.clone());
        self.generation.fetch_add(1, Ordering::SeqCst);
        if !lists.is_empty() {
            self.open.judge_all(&lists);
        }
    }

    /// See [`in_force`].
    pub(crate) fn in_force(&self) -> Option<RevocationLists> {
        self.lists
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .filter(|lists| !lists.is_empty())
    }

    /// See [`track`].
    pub(crate) fn track(
        this: &Arc<Self>,
        chain: PeerChain,
        roots: crate::tls::TrustRoots,
        role: PeerRole,
    ) -> Tracked {
        let began = chain.generation();
        let (tracked, entry) = this.open.insert(Arc::clone(this), chain, roots, role);
        // SeqCst, after the insert: see `install`.
        if this.generation.load(Ordering::SeqCst) != began
            && let Some(lists) = this.in_force()
        {
            entry.judge(&lists);
        }
        tracked
    }

    /// See [`track_in_process`]. The chain's generation is one before the
    /// current one, so that [`Revocations::track`] judges it at once
    /// against the lists in force.
    pub(crate) fn track_in_process(
        this: &Arc<Self>,
        presented: &[CertificateDer<'static>],
        roots: crate::tls::TrustRoots,
        role: PeerRole,
    ) -> Option<Tracked> {
        if !this.tracking.load(Ordering::Relaxed) {
            return None;
        }
        let current = this.generation.load(Ordering::SeqCst);
        let chain = PeerChain::capture(Some(presented), current.wrapping_sub(1))?;
        Some(Self::track(this, chain, roots, role))
    }

    /// See [`watch_point`], for this instance.
    #[cfg(test)]
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// Stops tracking connection `id`.
    fn untrack(&self, id: u64) {
        self.open.remove(id);
    }
}

/// The chain of certificates a peer presented, leaf first.
pub(crate) type Chain = Arc<[CertificateDer<'static>]>;

#[cfg(test)]
mod tests;
