//! One Istio AuthorizationPolicy → one mesh [`Policy`] (KUBERNETES.md
//! E7–E10): what is sent (no targetRef, ALLOW or DENY, dry-run only when
//! enabled), its scope, and its rules as ztunnel enforces them: each rule a
//! group of clauses (`to`, `from`, then one per `when`), HTTP-only fields
//! dropping the rule of an ALLOW policy and left out of a DENY one.
//!
//! Which pods a selector policy attaches to is `xds/resources.rs`'s; this
//! file only says whether it looks beyond its namespace.

use super::{ConvertSettings, Outcome, ProblemReason, name_and_namespace, value};
use crate::kube::policy_crd::{Action, AuthorizationPolicy, Condition, Operation, Rule, Source};
use crate::{
    Cidr, Policy, PolicyAction, PolicyMatch, PolicyScope, ServiceAccountMatch, StringMatch,
};

/// Marks a policy whose matches are logged, not enforced.
const DRY_RUN_ANNOTATION: &str = "istio.io/dry-run";

/// The mesh policy of an AuthorizationPolicy, or why it is not sent.
pub(super) fn policy(object: &AuthorizationPolicy, settings: &ConvertSettings) -> Outcome<Policy> {
    let (name, namespace) = match name_and_namespace(&object.metadata) {
        Ok(names) => names,
        Err(reason) => return Outcome::left_out(reason),
    };
    let spec = &object.spec;
    if spec.target_ref.is_some() || !spec.target_refs.is_empty() {
        return Outcome::left_out(ProblemReason::TargetRefNotSent);
    }
    let action = match spec.action.unwrap_or(Action::Allow) {
        Action::Allow => PolicyAction::Allow,
        Action::Deny => PolicyAction::Deny,
        Action::Audit => return unsupported("AUDIT"),
        Action::Custom => return unsupported("CUSTOM"),
    };
    let dry_run = value(&object.metadata.annotations, DRY_RUN_ANNOTATION).is_some_and(is_true);
    if dry_run && !settings.enable_dry_run_policies {
        return Outcome::left_out(ProblemReason::DryRunNotSent);
    }
    let in_root_namespace = namespace == settings.root_namespace;
    let (scope, selector) = match &spec.selector {
        None if in_root_namespace => (PolicyScope::Global, None),
        None => (PolicyScope::Namespace, None),
        Some(selector) => (
            PolicyScope::WorkloadSelector,
            Some(selector.match_labels.clone()),
        ),
    };
    let (rules, problems) = rules(&spec.rules, action, &namespace);
    Outcome {
        entry: Some(Policy {
            all_namespaces: selector.is_some() && in_root_namespace,
            name,
            namespace,
            scope,
            action,
            dry_run,
            selector,
            rules,
        }),
        problems,
    }
}

/// The rules ztunnel enforces, and the problem of the fields it cannot: an
/// ALLOW rule with an HTTP-only field is dropped (without them it would
/// allow more than written); a DENY rule is kept without them, denying
/// what its remaining fields name (a match left empty never matches).
fn rules(
    spec_rules: &[Rule],
    action: PolicyAction,
    namespace: &str,
) -> (Vec<Vec<Vec<PolicyMatch>>>, Vec<ProblemReason>) {
    let mut rules = Vec::with_capacity(spec_rules.len());
    let mut unsupported_fields: Vec<String> = Vec::new();
    let mut dropped = 0;
    for rule in spec_rules {
        let fields = http_only_fields(rule);
        for field in &fields {
            if !unsupported_fields.contains(field) {
                unsupported_fields.push(field.clone());
            }
        }
        if action == PolicyAction::Allow && !fields.is_empty() {
            dropped += 1;
            continue;
        }
        rules.push(clauses(rule, namespace));
    }
    let problems = match (unsupported_fields.is_empty(), action) {
        (true, _) => Vec::new(),
        (false, PolicyAction::Allow) => vec![ProblemReason::AllowRulesDropped {
            rules: dropped,
            fields: unsupported_fields,
        }],
        (false, PolicyAction::Deny) => vec![ProblemReason::DenyFieldsIgnored {
            fields: unsupported_fields,
        }],
    };
    (rules, problems)
}

fn unsupported(action: &'static str) -> Outcome<Policy> {
    Outcome::left_out(ProblemReason::UnsupportedAction { action })
}

/// A boolean annotation as Go's `strconv.ParseBool` reads it; anything
/// else is false.
fn is_true(text: &str) -> bool {
    matches!(text, "1" | "t" | "T" | "true" | "TRUE" | "True")
}

/// The `when` keys ztunnel enforces; any other key needs HTTP.
const L4_CONDITION_KEYS: [&str; 5] = [
    "source.ip",
    "source.namespace",
    "source.principal",
    "destination.ip",
    "destination.port",
];

/// The HTTP-only fields a rule uses (E9), each named once.
fn http_only_fields(rule: &Rule) -> Vec<String> {
    let mut fields = Vec::new();
    let mut note = |used: bool, field: &str| {
        if used && !fields.iter().any(|known| known == field) {
            fields.push(field.to_owned());
        }
    };
    for operation in rule.to.iter().filter_map(|to| to.operation.as_ref()) {
        note(!operation.hosts.is_empty(), "to.operation.hosts");
        note(!operation.not_hosts.is_empty(), "to.operation.notHosts");
        note(!operation.methods.is_empty(), "to.operation.methods");
        note(!operation.not_methods.is_empty(), "to.operation.notMethods");
        note(!operation.paths.is_empty(), "to.operation.paths");
        note(!operation.not_paths.is_empty(), "to.operation.notPaths");
    }
    for source in rule.from.iter().filter_map(|from| from.source.as_ref()) {
        let request_principals = !source.request_principals.is_empty();
        note(request_principals, "from.source.requestPrincipals");
        let not_request_principals = !source.not_request_principals.is_empty();
        note(not_request_principals, "from.source.notRequestPrincipals");
        note(
            !source.remote_ip_blocks.is_empty(),
            "from.source.remoteIpBlocks",
        );
        note(
            !source.not_remote_ip_blocks.is_empty(),
            "from.source.notRemoteIpBlocks",
        );
    }
    for condition in &rule.when {
        let l4 = L4_CONDITION_KEYS.contains(&condition.key.as_str());
        note(!l4, &format!("when.key={}", condition.key));
    }
    fields
}

/// A rule as AND-ed clauses of OR-ed matches: all `to` entries make one
/// clause, all `from` entries another, and each `when` its own. HTTP-only
/// fields are not read; a match left with nothing never matches.
fn clauses(rule: &Rule, namespace: &str) -> Vec<Vec<PolicyMatch>> {
    let mut clauses = Vec::with_capacity(2 + rule.when.len());
    if !rule.to.is_empty() {
        clauses.push(
            rule.to
                .iter()
                .map(|to| to.operation.as_ref().map(to_match).unwrap_or_default())
                .collect(),
        );
    }
    if !rule.from.is_empty() {
        clauses.push(
            rule.from
                .iter()
                .map(|from| {
                    from.source
                        .as_ref()
                        .map(|source| from_match(source, namespace))
                        .unwrap_or_default()
                })
                .collect(),
        );
    }
    clauses.extend(
        rule.when
            .iter()
            .map(|condition| vec![when_match(condition)]),
    );
    clauses
}

fn to_match(operation: &Operation) -> PolicyMatch {
    PolicyMatch {
        destination_ports: ports(&operation.ports),
        not_destination_ports: ports(&operation.not_ports),
        ..PolicyMatch::default()
    }
}

/// `trustDomains`/`notTrustDomains` are not read: istiod ignores them for
/// ztunnel.
fn from_match(source: &Source, namespace: &str) -> PolicyMatch {
    PolicyMatch {
        namespaces: strings(&source.namespaces),
        not_namespaces: strings(&source.not_namespaces),
        principals: strings(&source.principals),
        not_principals: strings(&source.not_principals),
        source_ips: cidrs(&source.ip_blocks),
        not_source_ips: cidrs(&source.not_ip_blocks),
        service_accounts: service_accounts(&source.service_accounts, namespace),
        not_service_accounts: service_accounts(&source.not_service_accounts, namespace),
        ..PolicyMatch::default()
    }
}

/// One match from an L4 condition; an HTTP-only key gives an empty one.
fn when_match(condition: &Condition) -> PolicyMatch {
    let (values, not_values) = (&condition.values, &condition.not_values);
    match condition.key.as_str() {
        "source.ip" => PolicyMatch {
            source_ips: cidrs(values),
            not_source_ips: cidrs(not_values),
            ..PolicyMatch::default()
        },
        "source.namespace" => PolicyMatch {
            namespaces: strings(values),
            not_namespaces: strings(not_values),
            ..PolicyMatch::default()
        },
        "source.principal" => PolicyMatch {
            principals: strings(values),
            not_principals: strings(not_values),
            ..PolicyMatch::default()
        },
        "destination.ip" => PolicyMatch {
            destination_ips: cidrs(values),
            not_destination_ips: cidrs(not_values),
            ..PolicyMatch::default()
        },
        "destination.port" => PolicyMatch {
            destination_ports: ports(values),
            not_destination_ports: ports(not_values),
            ..PolicyMatch::default()
        },
        _ => PolicyMatch::default(),
    }
}

/// `*` → present, `*x` → suffix, `x*` → prefix, else exact.
fn string_match(text: &str) -> StringMatch {
    if text == "*" {
        StringMatch::Presence
    } else if let Some(suffix) = text.strip_prefix('*') {
        StringMatch::Suffix(suffix.to_owned())
    } else if let Some(prefix) = text.strip_suffix('*') {
        StringMatch::Prefix(prefix.to_owned())
    } else {
        StringMatch::Exact(text.to_owned())
    }
}

fn strings(values: &[String]) -> Vec<StringMatch> {
    values.iter().map(|text| string_match(text)).collect()
}

/// `a/n` or a bare IP; others are dropped.
fn cidrs(values: &[String]) -> Vec<Cidr> {
    values.iter().filter_map(|text| text.parse().ok()).collect()
}

/// Decimal ports up to 65535; others are dropped.
fn ports(values: &[String]) -> Vec<u16> {
    values
        .iter()
        .filter(|text| !text.is_empty() && text.bytes().all(|byte| byte.is_ascii_digit()))
        .filter_map(|text| text.parse().ok())
        .collect()
}

/// `ns/sa`, or a bare `sa` of the policy's namespace.
fn service_accounts(values: &[String], namespace: &str) -> Vec<ServiceAccountMatch> {
    values
        .iter()
        .map(|text| {
            let (namespace, service_account) = text.split_once('/').unwrap_or((namespace, text));
            ServiceAccountMatch {
                namespace: namespace.to_owned(),
                service_account: service_account.to_owned(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests;
