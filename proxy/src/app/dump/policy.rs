//! `policies[]` of `/config_dump` (AMBIENT.md §6.4): each policy with its
//! rules three arrays deep (rules, clauses, matches), each match listing
//! only its non-empty conditions.

use serde::Serialize;

use crate::cidr::Cidr;
use crate::rbac::{Action, Match, Policy, Scope, ServiceAccountMatch, StringMatch};
use crate::state::State;

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct PolicyDump<'a> {
    name: &'a str,
    namespace: &'a str,
    scope: &'static str,
    action: &'static str,
    rules: Vec<Vec<Vec<MatchDump<'a>>>>,
    dry_run: bool,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct MatchDump<'a> {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    namespaces: Vec<StringMatchDump<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    not_namespaces: Vec<StringMatchDump<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    service_accounts: Vec<ServiceAccountDump<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    not_service_accounts: Vec<ServiceAccountDump<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    principals: Vec<StringMatchDump<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    not_principals: Vec<StringMatchDump<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    source_ips: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    not_source_ips: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    destination_ips: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    not_destination_ips: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    destination_ports: Vec<u16>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    not_destination_ports: Vec<u16>,
}

/// `{"Exact":s}`, `{"Prefix":s}`, `{"Suffix":s}` or `{"Presence":[]}`.
#[derive(Serialize)]
enum StringMatchDump<'a> {
    Exact(&'a str),
    Prefix(&'a str),
    Suffix(&'a str),
    Presence(),
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ServiceAccountDump<'a> {
    namespace: &'a str,
    service_account: &'a str,
}

/// Every policy, sorted by resource name.
pub(super) fn policies(state: &State) -> Vec<PolicyDump<'_>> {
    let mut policies: Vec<_> = state.policies().collect();
    policies.sort_by(|a, b| a.0.cmp(b.0));
    policies
        .into_iter()
        .map(|(_, policy)| policy_dump(policy))
        .collect()
}

fn policy_dump(policy: &Policy) -> PolicyDump<'_> {
    PolicyDump {
        name: &policy.name,
        namespace: &policy.namespace,
        scope: match policy.scope {
            Scope::Global => "Global",
            Scope::Namespace => "Namespace",
            Scope::WorkloadSelector => "WorkloadSelector",
        },
        action: match policy.action {
            Action::Allow => "Allow",
            Action::Deny => "Deny",
        },
        rules: policy
            .rules
            .iter()
            .map(|rule| {
                rule.clauses
                    .iter()
                    .map(|clause| clause.matches.iter().map(match_dump).collect())
                    .collect()
            })
            .collect(),
        dry_run: policy.dry_run,
    }
}

fn match_dump(conditions: &Match) -> MatchDump<'_> {
    let cidrs = |cidrs: &[Cidr]| cidrs.iter().map(ToString::to_string).collect();
    MatchDump {
        namespaces: strings(&conditions.namespaces),
        not_namespaces: strings(&conditions.not_namespaces),
        service_accounts: accounts(&conditions.service_accounts),
        not_service_accounts: accounts(&conditions.not_service_accounts),
        principals: strings(&conditions.principals),
        not_principals: strings(&conditions.not_principals),
        source_ips: cidrs(&conditions.source_ips),
        not_source_ips: cidrs(&conditions.not_source_ips),
        destination_ips: cidrs(&conditions.destination_ips),
        not_destination_ips: cidrs(&conditions.not_destination_ips),
        destination_ports: conditions.destination_ports.clone(),
        not_destination_ports: conditions.not_destination_ports.clone(),
    }
}

fn strings(matches: &[StringMatch]) -> Vec<StringMatchDump<'_>> {
    matches.iter().map(string_match).collect()
}

fn accounts(matches: &[ServiceAccountMatch]) -> Vec<ServiceAccountDump<'_>> {
    matches
        .iter()
        .map(|account| ServiceAccountDump {
            namespace: &account.namespace,
            service_account: &account.service_account,
        })
        .collect()
}

fn string_match(condition: &StringMatch) -> StringMatchDump<'_> {
    match condition {
        StringMatch::Exact(value) => StringMatchDump::Exact(value),
        StringMatch::Prefix(value) => StringMatchDump::Prefix(value),
        StringMatch::Suffix(value) => StringMatchDump::Suffix(value),
        StringMatch::Presence => StringMatchDump::Presence(),
    }
}
