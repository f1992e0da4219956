//! rustls configuration for the mesh: the one crypto provider, TLS 1.3 only,
//! ALPN `h2`.

use std::sync::Arc;

use rustls::crypto::CryptoProvider;

/// The crypto provider every TLS config in the project uses: aws-lc-rs,
/// limited to the TLS 1.3 AES-GCM suites of WIRE.md §4 (no ChaCha20).
pub fn provider() -> Arc<CryptoProvider> {
    let mut provider = rustls::crypto::aws_lc_rs::default_provider();
    provider.cipher_suites = vec![
        rustls::crypto::aws_lc_rs::cipher_suite::TLS13_AES_256_GCM_SHA384,
        rustls::crypto::aws_lc_rs::cipher_suite::TLS13_AES_128_GCM_SHA256,
    ];
    Arc::new(provider)
}

/// Installs [`provider`] as the process default, so that no library code path
/// can panic over an ambiguous default when both providers are linked in.
/// Call it first thing in every `main`. A second call is harmless.
pub fn install_provider() {
    // Err means a default is already installed; only ours is ever installed.
    let _ = CryptoProvider::install_default(Arc::unwrap_or_clone(provider()));
}
