//! `policies[]` entries of the local config file (WIRE.md §11) and their
//! conversion into [`Policy`]. Rules are written as nested lists: a rule is a
//! list of clauses, a clause a list of matches.

use std::sync::Arc;

use serde::Deserialize;

use super::values::{StringMatchForm, Text};
use crate::cidr::Cidr;
use crate::rbac::{Action, Clause, Match, Policy, Rule, Scope, ServiceAccountMatch, StringMatch};

/// One `policies[]` entry as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct PolicyForm {
    name: String,
    namespace: String,
    scope: ScopeForm,
    action: ActionForm,
    #[serde(default)]
    dry_run: bool,
    #[serde(default)]
    rules: Vec<Vec<Vec<MatchForm>>>,
}

impl PolicyForm {
    /// The resource name local policies are stored under: `namespace/name`.
    pub(super) fn resource_name(&self) -> Arc<str> {
        format!("{}/{}", self.namespace, self.name).into()
    }
}

/// Nothing is borrowed from the form: what the store keeps is allocated
/// here, not by the parse.
impl From<&PolicyForm> for Policy {
    fn from(form: &PolicyForm) -> Self {
        Policy {
            name: form.name.as_str().into(),
            namespace: form.namespace.as_str().into(),
            scope: match &form.scope {
                ScopeForm::Global => Scope::Global,
                ScopeForm::Namespace => Scope::Namespace,
                ScopeForm::WorkloadSelector => Scope::WorkloadSelector,
            },
            action: match &form.action {
                ActionForm::Allow => Action::Allow,
                ActionForm::Deny => Action::Deny,
            },
            dry_run: form.dry_run,
            rules: form
                .rules
                .iter()
                .map(|clauses| Rule {
                    clauses: clauses
                        .iter()
                        .map(|matches| Clause {
                            matches: matches.iter().map(Into::into).collect(),
                        })
                        .collect(),
                })
                .collect(),
        }
    }
}

#[derive(Deserialize)]
enum ScopeForm {
    Global,
    Namespace,
    WorkloadSelector,
}

#[derive(Deserialize)]
enum ActionForm {
    Allow,
    Deny,
}

#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
struct MatchForm {
    namespaces: Vec<StringMatchForm>,
    not_namespaces: Vec<StringMatchForm>,
    principals: Vec<StringMatchForm>,
    not_principals: Vec<StringMatchForm>,
    source_ips: Vec<Text<Cidr>>,
    not_source_ips: Vec<Text<Cidr>>,
    destination_ips: Vec<Text<Cidr>>,
    not_destination_ips: Vec<Text<Cidr>>,
    destination_ports: Vec<u16>,
    not_destination_ports: Vec<u16>,
    service_accounts: Vec<ServiceAccountForm>,
    not_service_accounts: Vec<ServiceAccountForm>,
}

impl From<&MatchForm> for Match {
    fn from(form: &MatchForm) -> Self {
        Match {
            namespaces: string_matches(&form.namespaces),
            not_namespaces: string_matches(&form.not_namespaces),
            principals: string_matches(&form.principals),
            not_principals: string_matches(&form.not_principals),
            source_ips: cidrs(&form.source_ips),
            not_source_ips: cidrs(&form.not_source_ips),
            destination_ips: cidrs(&form.destination_ips),
            not_destination_ips: cidrs(&form.not_destination_ips),
            destination_ports: form.destination_ports.clone(),
            not_destination_ports: form.not_destination_ports.clone(),
            service_accounts: form.service_accounts.iter().map(Into::into).collect(),
            not_service_accounts: form.not_service_accounts.iter().map(Into::into).collect(),
        }
    }
}

/// Copies of the matches, their text in fresh allocations.
fn string_matches(forms: &[StringMatchForm]) -> Vec<StringMatch> {
    let copy = |text: &Arc<str>| Arc::<str>::from(&**text);
    forms
        .iter()
        .map(|form| match &form.0 {
            StringMatch::Exact(text) => StringMatch::Exact(copy(text)),
            StringMatch::Prefix(text) => StringMatch::Prefix(copy(text)),
            StringMatch::Suffix(text) => StringMatch::Suffix(copy(text)),
            StringMatch::Presence => StringMatch::Presence,
        })
        .collect()
}

fn cidrs(forms: &[Text<Cidr>]) -> Vec<Cidr> {
    forms.iter().map(|form| form.0).collect()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ServiceAccountForm {
    namespace: String,
    service_account: String,
}

impl From<&ServiceAccountForm> for ServiceAccountMatch {
    fn from(form: &ServiceAccountForm) -> Self {
        ServiceAccountMatch {
            namespace: form.namespace.as_str().into(),
            service_account: form.service_account.as_str().into(),
        }
    }
}
