//! The trust anchors peers are verified against. Several roots are held at
//! once: during a root rotation the CA's bundle carries the old and the new
//! root, and peers issued by either keep working.

use std::fmt;
use std::sync::Arc;

use rustls_pki_types::pem;
use rustls_pki_types::{CertificateDer, TrustAnchor};

use crate::cert::parse_pem_bundle;

/// A set of one or more root certificates, cheap to clone.
#[derive(Clone)]
pub struct TrustRoots {
    /// The roots as given, for anyone who needs to show or forward them.
    certificates: Arc<[CertificateDer<'static>]>,
    /// The same roots in the form webpki verifies chains against.
    anchors: Arc<[TrustAnchor<'static>]>,
}

/// Why a set of roots could not be built.
#[derive(Debug, thiserror::Error)]
pub enum RootsError {
    /// No certificate was given: nothing could ever be trusted.
    #[error("no root certificate present")]
    Empty,
    /// The PEM bundle is malformed.
    #[error("root bundle PEM is malformed")]
    Pem(#[from] pem::Error),
    /// A certificate cannot serve as a trust anchor.
    #[error("root certificate {index} is not a usable trust anchor")]
    NotATrustAnchor {
        /// Position of the certificate in the bundle, from 0.
        index: usize,
        /// What webpki found wrong with it.
        source: webpki::Error,
    },
}

impl TrustRoots {
    /// Builds the set from DER certificates; at least one is required.
    pub fn from_der(certificates: Vec<CertificateDer<'static>>) -> Result<Self, RootsError> {
        if certificates.is_empty() {
            return Err(RootsError::Empty);
        }
        let anchors = certificates
            .iter()
            .enumerate()
            .map(|(index, der)| {
                webpki::anchor_from_trusted_cert(der)
                    .map(|anchor| anchor.to_owned())
                    .map_err(|source| RootsError::NotATrustAnchor { index, source })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(TrustRoots {
            certificates: certificates.into(),
            anchors: anchors.into(),
        })
    }

    /// Builds the set from a PEM bundle of one or more root certificates, as
    /// found in the last element of a CA response.
    pub fn from_pem_bundle(pem: &str) -> Result<Self, RootsError> {
        Self::from_der(parse_pem_bundle(pem)?)
    }

    /// The root certificates, in the order given.
    pub fn certificates(&self) -> &[CertificateDer<'static>] {
        &self.certificates
    }

    /// The roots as webpki trust anchors.
    pub(crate) fn anchors(&self) -> &[TrustAnchor<'static>] {
        &self.anchors
    }
}

impl fmt::Debug for TrustRoots {
    /// Counts the roots; their bytes say nothing to a reader.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TrustRoots")
            .field("roots", &self.certificates.len())
            .finish()
    }
}
