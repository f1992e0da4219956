//! Authorization: which identity an authenticated caller's certificate
//! carries. A pure function over the caller, the request, and a registry
//! snapshot, evaluated on every request (WIRE.md §3 "Impersonation").
//!
//! Either way the caller's own pod must be in the registry, with the
//! token's uid and service account, and live (pending or running,
//! [`Pod::is_live`]): a token outlives its pod's end by up to the review
//! cache's seconds, and a finished pod needs no certificate. Without
//! impersonation the answer is then the caller's own identity. With it, a
//! trusted node agent gets another identity only if a live pod with that
//! identity runs on the node the registry puts the agent's own pod on.

use std::fmt;
use std::str::FromStr;

use ztunnel_certs::identity::{Identity, IdentityError};

use super::authn::{AuthnError, Caller};
use ztunnel_mesh::{MeshSnapshot, Pod};

/// The default trusted node agent: ztunnel in `istio-system`.
pub const DEFAULT_TRUSTED_NODE_ACCOUNT: &str = "istio-system/ztunnel";

/// A namespace/service-account allowed to request other identities for the
/// pods on its node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeAgentAccount {
    /// Namespace of the node agent.
    pub namespace: String,
    /// Service account of the node agent.
    pub service_account: String,
}

impl FromStr for NodeAgentAccount {
    type Err = IdentityError;

    /// Parses `namespace/service-account`, with the same character rules as
    /// an identity.
    fn from_str(value: &str) -> Result<Self, Self::Err> {
        let (namespace, service_account) = value.split_once('/').ok_or(IdentityError::Shape)?;
        // Borrow the identity parser's checks for the two parts.
        let identity = Identity::new("node-agent.invalid", namespace, service_account)?;
        Ok(NodeAgentAccount {
            namespace: identity.namespace().to_owned(),
            service_account: identity.service_account().to_owned(),
        })
    }
}

impl fmt::Display for NodeAgentAccount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.service_account)
    }
}

/// Why a request was denied. Every variant is logged and counted by its
/// [`label`](Denial::label); the caller only sees an opaque message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Denial {
    /// The token did not authenticate.
    #[error("authentication failed")]
    Authentication(#[from] AuthnError),
    /// The caller's namespace and service account do not form a valid identity.
    #[error("caller namespace/service account is not a valid identity: {0}")]
    InvalidCallerIdentity(IdentityError),
    /// The caller impersonates but is not a trusted node agent.
    #[error("caller is not a trusted node agent")]
    UntrustedCaller,
    /// The requested identity does not parse.
    #[error("requested identity is invalid: {0}")]
    InvalidRequestedIdentity(IdentityError),
    /// The requested identity is in another trust domain than the CA's.
    #[error("requested identity is in trust domain {requested}, not {ours}")]
    ForeignTrustDomain {
        /// The requested trust domain.
        requested: String,
        /// The CA's.
        ours: String,
    },
    /// The caller's pod is not in the registry.
    #[error("caller pod is not in the registry")]
    CallerPodNotFound,
    /// The registry's pod has another UID than the token's.
    #[error("caller pod UID does not match the registry")]
    CallerPodUidMismatch,
    /// The registry's pod runs as another service account than the token's.
    #[error("caller pod service account does not match the registry")]
    CallerPodServiceAccountMismatch,
    /// The caller's pod has finished, or its node stopped reporting.
    #[error("caller pod is not live")]
    CallerPodNotLive,
    /// The registry has no node for the caller's pod.
    #[error("caller pod is not scheduled on a node")]
    CallerPodNotScheduled,
    /// The token's node claim disagrees with the registry.
    #[error("token node claim disagrees with the registry")]
    NodeClaimMismatch,
    /// No live pod with the requested identity runs on the caller's node.
    #[error("no live pod with the requested identity on the caller's node")]
    NoPodOnNode,
}

impl Denial {
    /// A short stable name for the metric label and logs.
    pub fn label(&self) -> &'static str {
        match self {
            Denial::Authentication(error) => error.label(),
            Denial::InvalidCallerIdentity(_) => "invalid_caller_identity",
            Denial::UntrustedCaller => "untrusted_caller",
            Denial::InvalidRequestedIdentity(_) => "invalid_requested_identity",
            Denial::ForeignTrustDomain { .. } => "foreign_trust_domain",
            Denial::CallerPodNotFound => "caller_pod_not_found",
            Denial::CallerPodUidMismatch => "caller_pod_uid_mismatch",
            Denial::CallerPodServiceAccountMismatch => "caller_pod_service_account_mismatch",
            Denial::CallerPodNotLive => "caller_pod_not_live",
            Denial::CallerPodNotScheduled => "caller_pod_not_scheduled",
            Denial::NodeClaimMismatch => "node_claim_mismatch",
            Denial::NoPodOnNode => "no_pod_on_node",
        }
    }

    /// The opaque message istiod returns for this kind of denial.
    pub fn public_message(&self) -> &'static str {
        match self {
            Denial::Authentication(_) | Denial::InvalidCallerIdentity(_) => {
                "request authenticate failure"
            }
            _ => "request impersonation authentication failure",
        }
    }
}

/// Decides the identity a certificate is issued for.
///
/// `impersonate` is the non-empty `ImpersonatedIdentity` of the request;
/// `trust_domain` is the CA's.
pub fn authorize(
    caller: &Caller,
    impersonate: Option<&str>,
    trust_domain: &str,
    trusted_node_accounts: &[NodeAgentAccount],
    registry: &MeshSnapshot,
) -> Result<Identity, Denial> {
    let own = Identity::new(trust_domain, &caller.namespace, &caller.service_account)
        .map_err(Denial::InvalidCallerIdentity)?;
    let Some(requested) = impersonate else {
        caller_pod(caller, registry)?;
        return Ok(own);
    };

    trusted_node_agent(caller, trusted_node_accounts)?;
    let requested: Identity = requested
        .parse()
        .map_err(Denial::InvalidRequestedIdentity)?;
    if requested.trust_domain() != trust_domain {
        return Err(Denial::ForeignTrustDomain {
            requested: requested.trust_domain().to_owned(),
            ours: trust_domain.to_owned(),
        });
    }
    let node = caller_node(caller, registry)?;
    if !registry.has_live_pod(node, requested.namespace(), requested.service_account()) {
        return Err(Denial::NoPodOnNode);
    }
    Ok(requested)
}

/// Whether the caller's namespace and service account are those of a
/// trusted node agent.
pub fn trusted_node_agent(
    caller: &Caller,
    trusted_node_accounts: &[NodeAgentAccount],
) -> Result<(), Denial> {
    let trusted = trusted_node_accounts.iter().any(|account| {
        account.namespace == caller.namespace && account.service_account == caller.service_account
    });
    if trusted {
        Ok(())
    } else {
        Err(Denial::UntrustedCaller)
    }
}

/// The caller's pod in the registry: it must exist with the token's UID
/// and service account, and be live.
pub fn caller_pod<'a>(caller: &Caller, registry: &'a MeshSnapshot) -> Result<&'a Pod, Denial> {
    let pod = registry
        .pod(&caller.namespace, &caller.pod_name)
        .ok_or(Denial::CallerPodNotFound)?;
    if pod.uid != caller.pod_uid {
        return Err(Denial::CallerPodUidMismatch);
    }
    if pod.service_account != caller.service_account {
        return Err(Denial::CallerPodServiceAccountMismatch);
    }
    if !pod.is_live() {
        return Err(Denial::CallerPodNotLive);
    }
    Ok(pod)
}

/// The node the caller's pod ([`caller_pod`]) runs on, from the registry:
/// it must be scheduled on the node the token claims (if it claims one).
pub fn caller_node<'a>(caller: &Caller, registry: &'a MeshSnapshot) -> Result<&'a str, Denial> {
    let pod = caller_pod(caller, registry)?;
    // The node comes from the registry, never from the caller.
    let node = pod
        .node_name
        .as_deref()
        .ok_or(Denial::CallerPodNotScheduled)?;
    if caller
        .node_name
        .as_deref()
        .is_some_and(|claimed| claimed != node)
    {
        return Err(Denial::NodeClaimMismatch);
    }
    Ok(node)
}

#[cfg(test)]
mod tests;
