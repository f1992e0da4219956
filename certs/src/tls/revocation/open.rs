//! The open connections judged against each new set of revocation lists.
//! A tracked connection is an entry here until its [`Tracked`] handle is
//! dropped; an install lists the entries, sieves their chains by issuer and
//! serial, and lets webpki judge the few a list names. A connection learns
//! the verdict through its [`Revocation`]; closing it is the proxy's
//! business.
//!
//! Tracking costs a connection one map insert and one removal under a
//! mutex held for nothing else; the chain is the one the handshake kept.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use rustls::CertificateError;
use rustls_pki_types::{CertificateDer, UnixTime};
use tokio::sync::watch;
use webpki::KeyUsage;

use super::{Chain, RevocationLists, Revocations};
use crate::tls::TrustRoots;
use crate::tls::verify::verify_chain;

/// Which side of the handshake the peer took, which decides the key usage
/// its chain was verified for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerRole {
    /// The peer dialled us: its chain was verified for clientAuth.
    Client,
    /// We dialled the peer: its chain was verified for serverAuth.
    Server,
}

impl PeerRole {
    fn usage(self) -> KeyUsage {
        match self {
            PeerRole::Client => KeyUsage::client_auth(),
            PeerRole::Server => KeyUsage::server_auth(),
        }
    }
}

/// A verified peer's chain as its handshake presented it, kept so that the
/// connection can be judged again when new lists are installed. Handshakes
/// keep one only once [`super::track_connections`] was called.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerChain {
    certificates: Chain,
    /// The lists' generation when the handshake began (see
    /// [`Revocations`]).
    generation: u64,
    /// When the handshake ended. The chain is judged as of then: judged
    /// now, a certificate that has expired since would fail for its age,
    /// which is not a revocation.
    established: UnixTime,
}

impl PeerChain {
    /// The chain `presented` by the peer of a handshake that began in
    /// `generation`; `None` when the peer presented none.
    pub(crate) fn capture(
        presented: Option<&[CertificateDer<'static>]>,
        generation: u64,
    ) -> Option<PeerChain> {
        let presented = presented.filter(|certificates| !certificates.is_empty())?;
        Some(PeerChain {
            certificates: presented.into(),
            generation,
            established: UnixTime::now(),
        })
    }

    /// The peer's certificates, leaf first.
    pub fn certificates(&self) -> &[CertificateDer<'static>] {
        &self.certificates
    }

    pub(super) fn generation(&self) -> u64 {
        self.generation
    }
}

/// Whether `lists` revoke a certificate of `chain`, which reached `roots`
/// as `role` at its handshake. webpki decides, as the handshake's verifier
/// did; the sieve before it spares the chains no list names.
pub(crate) fn revokes(
    lists: &RevocationLists,
    chain: &PeerChain,
    roots: &TrustRoots,
    role: PeerRole,
) -> bool {
    if !chain.certificates.iter().any(|cert| lists.names(cert)) {
        return false;
    }
    let Some((leaf, intermediates)) = chain.certificates.split_first() else {
        return false;
    };
    let algorithms = crate::tls::provider().signature_verification_algorithms;
    let verdict = verify_chain(
        leaf,
        intermediates,
        roots,
        chain.established,
        role.usage(),
        &algorithms,
        Some(lists),
    );
    matches!(
        verdict,
        Err(rustls::Error::InvalidCertificate(CertificateError::Revoked))
    )
}

/// Fires once the lists revoke a tracked connection's peer. Cheap to
/// clone: each stream of the connection may hold one.
#[derive(Debug, Clone)]
pub struct Revocation(watch::Receiver<bool>);

impl Revocation {
    /// Whether the peer was found revoked.
    pub fn is_revoked(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves once the peer is found revoked; never, if the connection
    /// stops being tracked first.
    ///
    /// Cancel safe: each call waits on a receiver of its own.
    pub async fn revoked(&self) {
        let mut receiver = self.0.clone();
        if receiver.wait_for(|revoked| *revoked).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// A connection tracked against the lists; dropping it ends the tracking.
pub struct Tracked {
    registry: Arc<Revocations>,
    id: u64,
    revocation: Revocation,
}

impl Tracked {
    /// What fires when the peer is revoked.
    pub fn revocation(&self) -> &Revocation {
        &self.revocation
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.registry.untrack(self.id);
    }
}

impl fmt::Debug for Tracked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tracked")
            .field("id", &self.id)
            .field("revoked", &self.revocation.is_revoked())
            .finish()
    }
}

/// One tracked connection: what it is judged by, and how it is told.
pub(super) struct Entry {
    chain: PeerChain,
    roots: TrustRoots,
    role: PeerRole,
    revoked: watch::Sender<bool>,
}

impl Entry {
    /// Tells the connection if `lists` revoke its peer; once told, it is
    /// not judged again.
    pub(super) fn judge(&self, lists: &RevocationLists) {
        if !*self.revoked.borrow() && revokes(lists, &self.chain, &self.roots, self.role) {
            self.revoked.send_replace(true);
        }
    }
}

/// The tracked connections, by an id of their own.
#[derive(Default)]
pub(super) struct OpenConnections {
    entries: Mutex<HashMap<u64, Arc<Entry>>>,
    next_id: AtomicU64,
}

impl OpenConnections {
    /// Tracks a connection in `registry`; returns its handle, and its entry
    /// to judge at once if need be.
    pub(super) fn insert(
        &self,
        registry: Arc<Revocations>,
        chain: PeerChain,
        roots: TrustRoots,
        role: PeerRole,
    ) -> (Tracked, Arc<Entry>) {
        let (sender, receiver) = watch::channel(false);
        let entry = Arc::new(Entry {
            chain,
            roots,
            role,
            revoked: sender,
        });
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(id, Arc::clone(&entry));
        let tracked = Tracked {
            registry,
            id,
            revocation: Revocation(receiver),
        };
        (tracked, entry)
    }

    pub(super) fn remove(&self, id: u64) {
        self.lock().remove(&id);
    }

    /// Judges every tracked connection against `lists`. Listed under the
    /// lock, judged outside it: webpki's checks must not hold up
    /// connections opening and closing.
    pub(super) fn judge_all(&self, lists: &RevocationLists) {
        let entries: Vec<Arc<Entry>> = self.lock().values().cloned().collect();
        for entry in entries {
            entry.judge(lists);
        }
    }

    /// How many connections are tracked.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Arc<Entry>>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
