//! Identity and PKI for the mesh: SPIFFE identities, workload keys and CSRs,
//! certificate parsing, rustls configurations with SPIFFE peer verification,
//! the certificate issuer, the CA service (`ztunnel-ca`) that authorizes
//! every request against the node its caller runs on, and the delta xDS
//! server that shares its port and its mesh file.

#![forbid(unsafe_code)]

pub mod ca;
pub mod cert;
pub mod csr;
pub mod identity;
pub mod issuer;
pub mod tls;
pub mod xds;
