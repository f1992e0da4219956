//! The control plane (`ztunnel-ca`): the CA service that authorizes every
//! certificate request against the node its caller runs on, and the delta
//! xDS server that shares its port and its mesh source; on Kubernetes also
//! the controllers that publish the CA's root (`root_configmap`) and
//! untaint nodes (`untaint`). The mesh itself (file or Kubernetes) is
//! `ztunnel-mesh`'s; keys, certificates and the issuer are
//! `ztunnel-certs`'.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod ca;
pub mod kubernetes;
pub mod root_configmap;
pub mod service_entry_status;
pub mod untaint;
pub mod waypoint_status;
pub mod xds;
