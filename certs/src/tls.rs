//! rustls configuration for the mesh: the one crypto provider, TLS 1.3 only,
//! ALPN `h2`, and SPIFFE peer verification in both directions (WIRE.md §4).
//!
//! The dialing side is `tls/client.rs`, the accepting side `tls/server.rs`,
//! the checks they share `tls/verify.rs`, the trust anchors `tls/roots.rs`,
//! the revocation lists those checks apply `tls/revocation.rs`,
//! and the record layer that takes over an established connection from
//! rustls `tls/record.rs`.

use std::sync::{Arc, OnceLock};

use rustls::crypto::CryptoProvider;

mod client;
pub mod record;
pub mod revocation;
mod roots;
mod server;
mod verify;

pub use client::{client_config, dummy_server_name};
pub use roots::{RootsError, TrustRoots};
pub use server::server_config;
pub use verify::{PeerError, peer_identity};

/// The ALPN protocol HBONE runs over: HTTP/2, offered by the client and set on
/// the server.
pub const ALPN_H2: &[u8] = b"h2";

/// Why a TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// rustls refused the protocol versions or the provider.
    #[error("building the rustls configuration failed")]
    Config(#[from] rustls::Error),
    /// A client config was asked for with no identity to accept: every
    /// handshake would fail.
    #[error("no expected server identity given")]
    NoExpectedIdentity,
    /// Our own certificate has no identity, so there is no trust domain to
    /// admit clients from.
    #[error("our certificate carries no SPIFFE identity")]
    NoOwnIdentity,
}

/// Which key exchange groups every handshake offers and accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeyExchange {
    /// aws-lc-rs's groups as rustls orders them: X25519, P-256, P-384, then
    /// the hybrid X25519MLKEM768.
    #[default]
    Classical,
    /// `COMPLIANCE_POLICY=pqc`: the hybrid post-quantum X25519MLKEM768
    /// only, as istio/ztunnel configures it; a peer that cannot do it is
    /// refused at the handshake.
    PostQuantum,
}

/// The groups of the process, set once by [`install_provider_for`] before
/// any TLS config is built.
static KEY_EXCHANGE: OnceLock<KeyExchange> = OnceLock::new();

/// The crypto provider every TLS config in the project uses: aws-lc-rs,
/// limited to its own TLS 1.3 AES-GCM suites of WIRE.md §4 (no ChaCha20),
/// with the key exchange groups installed for the process.
/// rustls's record encryption serves only the handshake and stock peers in
/// tests: the data path seals its records itself (`tls/record.rs`).
pub fn provider() -> Arc<CryptoProvider> {
    provider_for(KEY_EXCHANGE.get().copied().unwrap_or_default())
}

/// [`provider`] with the groups of `key_exchange`.
pub fn provider_for(key_exchange: KeyExchange) -> Arc<CryptoProvider> {
    let mut provider = rustls::crypto::aws_lc_rs::default_provider();
    provider.cipher_suites = vec![
        rustls::crypto::aws_lc_rs::cipher_suite::TLS13_AES_256_GCM_SHA384,
        rustls::crypto::aws_lc_rs::cipher_suite::TLS13_AES_128_GCM_SHA256,
    ];
    if key_exchange == KeyExchange::PostQuantum {
        provider.kx_groups = vec![rustls::crypto::aws_lc_rs::kx_group::X25519MLKEM768];
    }
    Arc::new(provider)
}

/// Installs [`provider`] as the process default, so that no library code path
/// can panic over an ambiguous default when both providers are linked in.
/// Call it first thing in every `main`. A second call is harmless.
pub fn install_provider() {
    install_provider_for(KeyExchange::Classical);
}

/// [`install_provider`] with the groups of `key_exchange` for every TLS
/// config built from then on; the first call's groups stay.
pub fn install_provider_for(key_exchange: KeyExchange) {
    // Err means the groups (and below, a default) are set already.
    let _ = KEY_EXCHANGE.set(key_exchange);
    let _ = CryptoProvider::install_default(Arc::unwrap_or_clone(provider()));
}
