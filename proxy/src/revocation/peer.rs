//! Open HBONE connections watched for revocation: the proxy's side of the
//! tracking in `ztunnel_certs::tls::revocation`. Where `CRL_PATH` is
//! configured, each mTLS connection's peer chain, kept by its handshake, is
//! tracked while the connection is open; once a list installed meanwhile
//! revokes the peer, the connection's owner (the HBONE server's connection
//! loop, the HBONE client's driver) closes it at once, and each of its
//! streams stops and reports `CERT_REVOKED` ([`PeerRevoked`]). The warning
//! and the count are here, so both directions say it alike.

use std::sync::Arc;

use ztunnel_certs::identity::Identity;
use ztunnel_certs::tls::TrustRoots;
use ztunnel_certs::tls::revocation::{self, PeerChain, PeerRole, Revocation, Tracked};

use crate::config::Config;
use crate::metrics::{Metrics, Reporter};

/// Why a stream ended: a revocation list installed while its connection
/// was open revokes the connection's peer.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("connection closed: peer certificate revoked by CRL")]
pub struct PeerRevoked;

/// How the peers of a proxy's new connections in one direction are
/// watched: the roots they are verified against, and where a revocation
/// is counted.
#[derive(Clone)]
pub struct RevocationWatch {
    roots: TrustRoots,
    metrics: Arc<Metrics>,
    reporter: Reporter,
}

impl RevocationWatch {
    /// The watch of connections as `reporter` (inbound peers are clients,
    /// outbound ones servers), verified against `roots`, counted on
    /// `metrics`; `None` without `CRL_PATH` in `config`, so that a
    /// connection then costs nothing here.
    pub fn configured(
        config: &Config,
        metrics: &Arc<Metrics>,
        reporter: Reporter,
        roots: &TrustRoots,
    ) -> Option<Self> {
        config.crl_path.as_ref()?;
        Some(RevocationWatch {
            roots: roots.clone(),
            metrics: Arc::clone(metrics),
            reporter,
        })
    }

    /// Starts watching `peer`, whose handshake kept `chain`. A handshake
    /// that kept none (it began before tracking was turned on) leaves the
    /// connection unwatched: warned and counted.
    pub fn watch(self, chain: Option<PeerChain>, peer: &Identity) -> Option<WatchedPeer> {
        let role = match self.reporter {
            Reporter::Destination => PeerRole::Client,
            Reporter::Source => PeerRole::Server,
        };
        let Some(chain) = chain else {
            tracing::warn!(
                %peer,
                reporter = self.reporter.as_str(),
                "no peer chain kept by the handshake: this connection stays open if a revocation list revokes its peer"
            );
            self.metrics.record_crl_untracked(self.reporter);
            return None;
        };
        Some(WatchedPeer {
            tracked: revocation::track(chain, self.roots, role),
            peer: peer.clone(),
            metrics: self.metrics,
            reporter: self.reporter,
        })
    }
}

/// An open connection's peer, tracked against the revocation lists until
/// this is dropped.
#[derive(Debug)]
pub struct WatchedPeer {
    tracked: Tracked,
    peer: Identity,
    metrics: Arc<Metrics>,
    reporter: Reporter,
}

impl WatchedPeer {
    /// What each stream of the connection holds, to stop with it and to
    /// report why.
    pub fn revocation(&self) -> &Revocation {
        self.tracked.revocation()
    }

    /// Resolves once a list revokes the peer, warned and counted: the
    /// connection must then close at once.
    ///
    /// Cancel safe: the wait holds nothing of its own, and the warning and
    /// the count follow it with no await between.
    pub async fn revoked(&self) {
        self.tracked.revocation().revoked().await;
        tracing::warn!(
            peer = %self.peer,
            reporter = self.reporter.as_str(),
            "closing an HBONE connection and its streams: a revocation list now revokes the peer's certificate"
        );
        self.metrics.record_crl_rejection(self.reporter);
    }
}

/// Resolves once `revocation` fires; never without one.
pub async fn until_revoked(revocation: Option<&Revocation>) {
    match revocation {
        Some(revocation) => revocation.revoked().await,
        None => std::future::pending().await,
    }
}

/// Whether the connection a stream ran on was closed for its peer's
/// revocation.
pub fn revoked_while_open(revocation: Option<&Revocation>) -> bool {
    revocation.is_some_and(Revocation::is_revoked)
}
