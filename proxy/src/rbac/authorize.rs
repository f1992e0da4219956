//! The authorization decision for one connection over the policies that
//! apply to its destination (WIRE.md §9 "Which policies apply" and
//! "Evaluation order"). Pure: logging the dry-run results and acting on the
//! verdict are the caller's.

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use ztunnel_certs::identity::Identity;

use super::{Action, Policy};

/// What authorization knows about a connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Connection {
    /// The peer's verified identity; `None` on plaintext (15006).
    pub source_identity: Option<Identity>,
    /// The client's IP.
    pub source_ip: IpAddr,
    /// The destination workload's IP.
    pub destination_ip: IpAddr,
    /// The destination port after service → target translation.
    pub destination_port: u16,
    /// Namespace of the destination workload, for logs.
    pub destination_namespace: Arc<str>,
    /// Uid of the destination workload, for logs and re-checks.
    pub destination_workload: Arc<str>,
}

/// `namespace/name` of a policy, as its message names it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PolicyName {
    /// The message's `namespace`.
    pub namespace: Arc<str>,
    /// The message's `name`.
    pub name: Arc<str>,
}

impl fmt::Display for PolicyName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// The outcome of [`authorize`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// What to do with the connection.
    pub verdict: Verdict,
    /// Dry-run policies that matched, deny ones first, for the caller to log.
    pub dry_run_matches: Vec<DryRunMatch>,
    /// The first enforced ALLOW policy that matched, for the log; `None`
    /// when the connection is allowed for want of any ALLOW policy, or
    /// denied.
    pub allowed_by: Option<PolicyName>,
}

impl Decision {
    /// Whether the connection may proceed.
    pub fn is_allowed(&self) -> bool {
        self.verdict == Verdict::Allow
    }
}

/// Allow or deny, with the reason for a denial.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The connection may proceed.
    Allow,
    /// The connection is refused: HBONE answers 401, 15006 closes.
    Deny(DenyReason),
}

/// Why a connection is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DenyReason {
    /// An enforced DENY policy matched.
    ExplicitlyDenied(PolicyName),
    /// Enforced ALLOW policies exist and none matched.
    NotAllowed,
}

/// The reasons as the destination ztunnel logs them (WIRE.md §9).
impl fmt::Display for DenyReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DenyReason::ExplicitlyDenied(policy) => write!(f, "explicitly denied by: {policy}"),
            DenyReason::NotAllowed => f.write_str("allow policies exist, but none allowed"),
        }
    }
}

/// A dry-run policy that matched: what it would have done.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DryRunMatch {
    /// The policy.
    pub policy: PolicyName,
    /// Its action, not taken.
    pub action: Action,
}

/// Decides a connection over `policies`, in WIRE.md §9 order:
/// 1. dry-run DENY matches are recorded;
/// 2. an enforced DENY match denies (`ExplicitlyDenied`, the first in order);
/// 3. dry-run ALLOW matches are recorded;
/// 4. no enforced ALLOW policy → allow;
/// 5. an enforced ALLOW match → allow;
/// 6. otherwise deny (`NotAllowed`).
///
/// The policies are walked once; dry-run ALLOW results are kept only when
/// step 3 is reached, so the output is as if the steps ran in turn.
pub fn authorize<'a>(
    connection: &Connection,
    policies: impl IntoIterator<Item = &'a Policy>,
) -> Decision {
    let mut dry_run_denies = Vec::new();
    let mut dry_run_allows = Vec::new();
    let mut denied_by: Option<&Policy> = None;
    let mut allow_policies_exist = false;
    let mut allowed_by: Option<&Policy> = None;
    for policy in policies {
        match (policy.action, policy.dry_run) {
            (Action::Deny, true) if policy.matches(connection) => dry_run_denies.push(policy),
            (Action::Deny, false) if denied_by.is_none() && policy.matches(connection) => {
                denied_by = Some(policy);
            }
            (Action::Allow, true) if policy.matches(connection) => dry_run_allows.push(policy),
            (Action::Allow, false) => {
                allow_policies_exist = true;
                if allowed_by.is_none() && policy.matches(connection) {
                    allowed_by = Some(policy);
                }
            }
            _ => {}
        }
    }
    let mut dry_run_matches: Vec<DryRunMatch> = dry_run_denies.iter().map(dry_run_match).collect();
    if let Some(policy) = denied_by {
        let reason = DenyReason::ExplicitlyDenied(policy.policy_name());
        return Decision {
            verdict: Verdict::Deny(reason),
            dry_run_matches,
            allowed_by: None,
        };
    }
    dry_run_matches.extend(dry_run_allows.iter().map(dry_run_match));
    let verdict = if !allow_policies_exist || allowed_by.is_some() {
        Verdict::Allow
    } else {
        Verdict::Deny(DenyReason::NotAllowed)
    };
    Decision {
        verdict,
        dry_run_matches,
        allowed_by: allowed_by.map(Policy::policy_name),
    }
}

fn dry_run_match(policy: &&Policy) -> DryRunMatch {
    DryRunMatch {
        policy: policy.policy_name(),
        action: policy.action,
    }
}

#[cfg(test)]
mod tests;
