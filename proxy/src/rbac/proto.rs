//! Conversion from `istio.security.Authorization` (WIRE.md §9).
//!
//! An unknown `scope` or `action` rejects the policy. Bad entries inside it,
//! an IP address of the wrong length or prefix and a `StringMatch` with no
//! variant, are dropped and the rest applies as if they were absent (§7).

use ztunnel_certs::error_chain::ErrorChain;
use ztunnel_proto::istio::security as wire;

use super::{
    Action, Clause, Match, Policy, PolicyError, Rule, Scope, ServiceAccountMatch, StringMatch,
};
use crate::cidr::Cidr;
use crate::cidr::ip_from_bytes;

impl TryFrom<&wire::Authorization> for Policy {
    type Error = PolicyError;

    fn try_from(policy: &wire::Authorization) -> Result<Self, Self::Error> {
        let scope = match wire::Scope::try_from(policy.scope) {
            Ok(wire::Scope::Global) => Scope::Global,
            Ok(wire::Scope::Namespace) => Scope::Namespace,
            Ok(wire::Scope::WorkloadSelector) => Scope::WorkloadSelector,
            Err(unknown) => return Err(PolicyError::UnknownScope(unknown)),
        };
        let action = match wire::Action::try_from(policy.action) {
            Ok(wire::Action::Allow) => Action::Allow,
            Ok(wire::Action::Deny) => Action::Deny,
            Err(unknown) => return Err(PolicyError::UnknownAction(unknown)),
        };
        Ok(Policy {
            name: policy.name.as_str().into(),
            namespace: policy.namespace.as_str().into(),
            scope,
            action,
            dry_run: policy.dry_run,
            rules: policy.rules.iter().map(rule_from_wire).collect(),
        })
    }
}

fn rule_from_wire(rule: &wire::Rule) -> Rule {
    Rule {
        clauses: rule
            .clauses
            .iter()
            .map(|clause| Clause {
                matches: clause.matches.iter().map(match_from_wire).collect(),
            })
            .collect(),
    }
}

fn match_from_wire(m: &wire::Match) -> Match {
    Match {
        namespaces: string_matches(&m.namespaces),
        not_namespaces: string_matches(&m.not_namespaces),
        principals: string_matches(&m.principals),
        not_principals: string_matches(&m.not_principals),
        source_ips: cidrs(&m.source_ips),
        not_source_ips: cidrs(&m.not_source_ips),
        destination_ips: cidrs(&m.destination_ips),
        not_destination_ips: cidrs(&m.not_destination_ips),
        destination_ports: ports(&m.destination_ports),
        not_destination_ports: ports(&m.not_destination_ports),
        service_accounts: service_accounts(&m.service_accounts),
        not_service_accounts: service_accounts(&m.not_service_accounts),
    }
}

fn string_matches(matches: &[wire::StringMatch]) -> Vec<StringMatch> {
    use wire::string_match::MatchType;
    matches
        .iter()
        .filter_map(|m| match &m.match_type {
            Some(MatchType::Exact(value)) => Some(StringMatch::Exact(value.as_str().into())),
            Some(MatchType::Prefix(value)) => Some(StringMatch::Prefix(value.as_str().into())),
            Some(MatchType::Suffix(value)) => Some(StringMatch::Suffix(value.as_str().into())),
            Some(MatchType::Presence(())) => Some(StringMatch::Presence),
            None => {
                tracing::debug!("dropping string match with no variant");
                None
            }
        })
        .collect()
}

fn cidrs(addresses: &[wire::Address]) -> Vec<Cidr> {
    addresses
        .iter()
        .filter_map(|address| {
            let cidr = ip_from_bytes(&address.address).and_then(|ip| Cidr::new(ip, address.length));
            match cidr {
                Ok(cidr) => Some(cidr),
                Err(error) => {
                    tracing::debug!(error = %ErrorChain(&error), "dropping address match");
                    None
                }
            }
        })
        .collect()
}

/// Ports are truncated to 16 bits (WIRE.md §9).
fn ports(ports: &[u32]) -> Vec<u16> {
    ports.iter().map(|&port| (port & 0xffff) as u16).collect()
}

fn service_accounts(accounts: &[wire::ServiceAccountMatch]) -> Vec<ServiceAccountMatch> {
    accounts
        .iter()
        .map(|account| ServiceAccountMatch {
            namespace: account.namespace.as_str().into(),
            service_account: account.service_account.as_str().into(),
        })
        .collect()
}

#[cfg(test)]
mod tests;
