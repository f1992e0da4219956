//! A workload's private key in memory: held in a type that wipes its
//! bytes when dropped and never shows them in `Debug`. Making the key and
//! its CSR is `csr.rs`'s business; pairing it with the CA's certificate is
//! `cert.rs`'s.
//!
//! Where the key's bytes live, and who wipes each copy:
//! - rcgen's `KeyPair` keeps a DER copy and has no `Drop`; [`PrivateKey::generate`]
//!   takes that copy over and wipes the `KeyPair`'s (rcgen's `zeroize` feature).
//! - rustls-pki-types' key types implement `Zeroize` but not `Drop`
//!   (rustls-pki-types 1.16 `src/lib.rs`): a `PrivateKeyDer` dropped as it is
//!   leaves the key in freed memory. This type wipes the one it holds.
//! - The copy [`PrivateKey::to_rustls`] hands to rustls is wiped by rustls:
//!   the aws-lc-rs `KeyProvider::load_private_key`, which
//!   `CertifiedKey::from_der` calls, wraps it in `Zeroizing` before parsing
//!   (rustls 0.23.46 `src/crypto/aws_lc_rs/mod.rs`).
//! - The parsed key inside aws-lc is freed with `OPENSSL_free`, which
//!   cleanses the allocation (aws-lc `crypto/mem.c`).

use std::fmt;

use rcgen::KeyPair;
use rustls_pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use zeroize::{Zeroize, ZeroizeOnDrop};

/// A PKCS#8 private key, wiped from memory when dropped.
#[derive(Zeroize, ZeroizeOnDrop)]
pub struct PrivateKey(PrivatePkcs8KeyDer<'static>);

impl PrivateKey {
    /// Generates a fresh ECDSA P-256 key; rcgen's copy of its bytes is
    /// wiped once taken over. Returns rcgen's key pair for signing, which
    /// keeps only the crypto library's parsed key.
    pub fn generate() -> Result<(PrivateKey, KeyPair), rcgen::Error> {
        let mut pair = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let key = PrivateKey(PrivatePkcs8KeyDer::from(pair.serialize_der()));
        pair.zeroize();
        Ok((key, pair))
    }

    /// A copy for rustls, which takes keys by value and wipes them (see
    /// the module documentation).
    pub fn to_rustls(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(self.0.clone_key())
    }
}

impl fmt::Debug for PrivateKey {
    /// Never the key: it must not reach a log.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PrivateKey(elided)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Compiles only for types that wipe themselves on drop.
    fn wiped_on_drop<T: ZeroizeOnDrop>() {}

    #[test]
    fn the_key_is_wiped_on_drop() {
        wiped_on_drop::<PrivateKey>();
        // What the derived `Drop` runs, observed on a live value.
        let (mut key, _) = PrivateKey::generate().unwrap();
        assert!(key.0.secret_pkcs8_der().iter().any(|byte| *byte != 0));
        key.zeroize();
        assert!(key.0.secret_pkcs8_der().is_empty());
    }

    #[test]
    fn debug_never_shows_the_key() {
        let (key, pair) = PrivateKey::generate().unwrap();
        let shown = format!("{key:?} {key:#?}");
        assert_eq!(shown, "PrivateKey(elided) PrivateKey(elided)");
        let der = key.0.secret_pkcs8_der();
        assert!(!shown.contains(&format!("{der:?}")));
        // rcgen's own copy is gone once taken over.
        assert!(pair.serialized_der().is_empty());
    }
}
