//! Identity and PKI for the mesh: SPIFFE identities, workload keys and CSRs,
//! certificate parsing, rustls configurations with SPIFFE peer verification,
//! and the certificate issuer. The CA service that decides who gets which
//! certificate is the control plane's (`control-plane/`).
//!
//! It also holds [`error_chain::ErrorChain`], how every crate of the
//! workspace prints an error with its causes: this is the lowest crate the
//! others share.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod cert;
pub mod csr;
pub mod error_chain;
pub mod identity;
pub mod issuer;
pub mod private_key;
pub mod tls;
