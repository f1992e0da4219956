//! The CA service (`ztunnel-ca`): authenticates callers by their
//! service-account token, authorizes the identity each certificate carries
//! against the mesh registry, and signs with the [`Issuer`].
//!
//! Decisions are pure functions (`authn`, `authz`); `service` is the gRPC
//! shell around them and `server` the TLS listener, which also serves the
//! delta xDS of `crate::xds` from the same registry; `slots` and
//! `connection` bound what unauthenticated peers may hold on it, and
//! `authenticator` what their tokens may cost (on Kubernetes, checked
//! against the API server's `published_keys` before any TokenReview). The
//! signing material comes from files, from the state directory
//! (`state_dir`), or on Kubernetes from the Secrets istiod uses
//! (`signing_secret`).

use std::net::IpAddr;
use std::sync::Arc;

use ztunnel_certs::issuer::{Issuer, TtlPolicy};

use authenticator::Authenticator;
use authz::NodeAgentAccount;
use connection::ConnectionLimits;
use metrics::CaMetrics;
use ztunnel_mesh::PodRegistry;

pub mod authenticator;
pub mod authn;
pub mod authz;
pub mod connection;
pub mod denial_log;
pub mod metrics;
pub mod published_keys;
pub mod server;
pub mod service;
pub mod signing_secret;
pub mod slots;
pub mod state_dir;
pub mod token;
pub mod token_keys;

/// Everything the CA serves with, parsed and loaded.
pub struct CaConfig {
    /// The mesh trust domain; every issued identity is in it.
    pub trust_domain: String,
    /// Signs workload certificates and the CA's own serving certificate.
    pub issuer: Arc<Issuer>,
    /// Default and maximum workload certificate lifetimes.
    pub ttl: TtlPolicy,
    /// Who service-account tokens belong to: local keys, or the API
    /// server's TokenReview.
    pub authenticator: Arc<Authenticator>,
    /// Node agents allowed to request the identities of pods on their node,
    /// and to subscribe to xDS.
    pub trusted_node_accounts: Vec<NodeAgentAccount>,
    /// The mesh file: pods and their nodes (what impersonation is
    /// authorized against), services and policies (what xDS serves).
    pub registry: Arc<dyn PodRegistry>,
    /// Counters, shared with the `/metrics` endpoint.
    pub metrics: Arc<CaMetrics>,
    /// DNS names of the CA's serving certificate.
    pub serving_dns_names: Vec<String>,
    /// IP addresses of the CA's serving certificate.
    pub serving_ips: Vec<IpAddr>,
    /// What an established connection may cost before it authenticates.
    pub connections: ConnectionLimits,
}
