//! Identity and PKI for the mesh: SPIFFE identities, workload keys and CSRs,
//! certificate parsing, rustls configurations with SPIFFE peer verification,
//! the certificate issuer, and the CA service (`ztunnel-ca`) that authorizes
//! every request against the node its caller runs on.

#![forbid(unsafe_code)]

pub mod ca;
pub mod cert;
pub mod csr;
pub mod identity;
pub mod issuer;
pub mod tls;
