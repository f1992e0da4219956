//! Decision tables: the WIRE.md §9 evaluation order with dry-run and
//! deny-over-allow, the denial texts, and which policies apply.

use super::*;
use crate::rbac::tests::{CLIENT, from, policy, rules_of};
use crate::rbac::{Match, Rule};

/// Rules that match the fixture connection (port 8080).
fn hit() -> Vec<Rule> {
    rules_of(vec![Match {
        destination_ports: vec![8080],
        ..Match::default()
    }])
}

/// Rules that do not match the fixture connection.
fn miss() -> Vec<Rule> {
    rules_of(vec![Match {
        destination_ports: vec![1],
        ..Match::default()
    }])
}

fn denied_by(name: &str) -> Verdict {
    Verdict::Deny(DenyReason::ExplicitlyDenied(PolicyName {
        namespace: "server-ns".into(),
        name: name.into(),
    }))
}

#[test]
fn evaluation_order_table() {
    let allow = |name, rules| policy(name, Action::Allow, false, rules);
    let deny = |name, rules| policy(name, Action::Deny, false, rules);
    let dry_allow = |name, rules| policy(name, Action::Allow, true, rules);
    let dry_deny = |name, rules| policy(name, Action::Deny, true, rules);
    let not_allowed = || Verdict::Deny(DenyReason::NotAllowed);
    // One case a line: (name, policies in order, verdict, dry-run matches logged).
    #[rustfmt::skip]
    let cases: Vec<(&str, Vec<Policy>, Verdict, Vec<&str>)> = vec![
        ("no policies allow", vec![], Verdict::Allow, vec![]),
        ("a deny that does not match allows", vec![deny("d", miss())], Verdict::Allow, vec![]),
        ("a matching deny denies", vec![deny("d", hit())], denied_by("d"), vec![]),
        ("deny wins over a matching allow", vec![allow("a", hit()), deny("d", hit())], denied_by("d"), vec![]),
        ("the first matching deny is named", vec![deny("d1", miss()), deny("d2", hit()), deny("d3", hit())], denied_by("d2"), vec![]),
        ("an allow that does not match denies", vec![allow("a", miss())], not_allowed(), vec![]),
        ("a matching allow allows", vec![allow("a", hit())], Verdict::Allow, vec![]),
        ("any matching allow allows", vec![allow("a1", miss()), allow("a2", hit())], Verdict::Allow, vec![]),
        ("a zero-rule allow exists but never allows", vec![allow("a", vec![])], not_allowed(), vec![]),
        ("a zero-rule deny never denies", vec![deny("d", vec![])], Verdict::Allow, vec![]),
        ("a dry-run deny only logs", vec![dry_deny("dd", hit())], Verdict::Allow, vec!["dd"]),
        ("a dry-run deny that misses is not logged", vec![dry_deny("dd", miss())], Verdict::Allow, vec![]),
        ("a dry-run allow alone is not an allow policy", vec![dry_allow("da", miss())], Verdict::Allow, vec![]),
        ("a dry-run allow does not allow", vec![dry_allow("da", hit()), allow("a", miss())], not_allowed(), vec!["da"]),
        ("a dry-run deny does not deny past an allow", vec![dry_deny("dd", hit()), allow("a", hit())], Verdict::Allow, vec!["dd"]),
        ("an enforced deny stops before dry-run allows are logged", vec![dry_allow("da", hit()), dry_deny("dd", hit()), deny("d", hit())], denied_by("d"), vec!["dd"]),
        ("dry-run denies are logged before dry-run allows", vec![dry_allow("da", hit()), dry_deny("dd", hit()), allow("a", hit())], Verdict::Allow, vec!["dd", "da"]),
    ];
    for (name, policies, verdict, dry_run) in cases {
        let decision = authorize(&from(Some(CLIENT)), &policies);
        assert_eq!(decision.verdict, verdict, "{name}");
        let logged: Vec<&str> = decision
            .dry_run_matches
            .iter()
            .map(|m| &*m.policy.name)
            .collect();
        assert_eq!(logged, dry_run, "{name}");
        assert_eq!(decision.is_allowed(), verdict == Verdict::Allow, "{name}");
    }
}

#[test]
fn the_first_allow_policy_that_matched_is_named_for_the_log() {
    let allow = |name, rules| policy(name, Action::Allow, false, rules);
    let deny = |name, rules| policy(name, Action::Deny, false, rules);
    let dry_allow = |name, rules| policy(name, Action::Allow, true, rules);
    let allowed_by = |policies: &[Policy]| {
        authorize(&from(Some(CLIENT)), policies)
            .allowed_by
            .map(|policy| policy.name.to_string())
    };
    let rows: &[(&str, Vec<Policy>, Option<&str>)] = &[
        ("no policies: allowed by none", vec![], None),
        (
            "the first of two that match",
            vec![allow("a", hit()), allow("b", hit())],
            Some("a"),
        ),
        (
            "past one that misses",
            vec![allow("a", miss()), allow("b", hit())],
            Some("b"),
        ),
        (
            "none matches: denied, by none",
            vec![allow("a", miss())],
            None,
        ),
        (
            "a deny wins: none",
            vec![allow("a", hit()), deny("d", hit())],
            None,
        ),
        (
            "a dry-run allow never allows",
            vec![dry_allow("da", hit())],
            None,
        ),
    ];
    for (reason, policies, expected) in rows {
        assert_eq!(allowed_by(policies).as_deref(), *expected, "{reason}");
    }
}

#[test]
fn plaintext_connections_are_judged_on_source_ip_only() {
    let by_principal = policy(
        "p",
        Action::Allow,
        false,
        rules_of(vec![Match {
            principals: vec![crate::rbac::StringMatch::Presence],
            ..Match::default()
        }]),
    );
    let decision = authorize(&from(None), [&by_principal]);
    assert_eq!(decision.verdict, Verdict::Deny(DenyReason::NotAllowed));
    assert!(authorize(&from(Some(CLIENT)), [&by_principal]).is_allowed());
}

#[test]
fn dry_run_matches_carry_the_action_not_taken() {
    let policies = [
        policy("dd", Action::Deny, true, hit()),
        policy("da", Action::Allow, true, hit()),
    ];
    let decision = authorize(&from(None), &policies);
    let actions: Vec<Action> = decision.dry_run_matches.iter().map(|m| m.action).collect();
    assert_eq!(actions, [Action::Deny, Action::Allow]);
}

#[test]
fn deny_reasons_read_as_the_destination_ztunnel_logs_them() {
    let by = DenyReason::ExplicitlyDenied(PolicyName {
        namespace: "ns".into(),
        name: "deny-all".into(),
    });
    assert_eq!(by.to_string(), "explicitly denied by: ns/deny-all");
    assert_eq!(
        DenyReason::NotAllowed.to_string(),
        "allow policies exist, but none allowed"
    );
}
