//! Conversion of `istio.security.Authorization`: every field, rejections,
//! and dropped entries.

use ztunnel_proto::istio::security as wire;

use super::*;
use crate::rbac::Connection;

fn string_match(match_type: Option<wire::string_match::MatchType>) -> wire::StringMatch {
    wire::StringMatch { match_type }
}

fn address(bytes: Vec<u8>, length: u32) -> wire::Address {
    wire::Address {
        address: bytes,
        length,
    }
}

fn with_match(m: wire::Match) -> wire::Authorization {
    wire::Authorization {
        name: "allow-client".into(),
        namespace: "server-ns".into(),
        scope: wire::Scope::WorkloadSelector as i32,
        action: wire::Action::Deny as i32,
        rules: vec![wire::Rule {
            clauses: vec![wire::Clause { matches: vec![m] }],
        }],
        dry_run: true,
        extensions: vec![],
    }
}

fn only_match(policy: &Policy) -> &Match {
    &policy.rules[0].clauses[0].matches[0]
}

#[test]
fn every_field_is_carried_over() {
    use wire::string_match::MatchType;
    let account = |namespace: &str, service_account: &str| wire::ServiceAccountMatch {
        namespace: namespace.into(),
        service_account: service_account.into(),
    };
    let m = wire::Match {
        namespaces: vec![string_match(Some(MatchType::Exact("a".into())))],
        not_namespaces: vec![string_match(Some(MatchType::Prefix("b".into())))],
        principals: vec![string_match(Some(MatchType::Suffix("c".into())))],
        not_principals: vec![string_match(Some(MatchType::Presence(())))],
        source_ips: vec![address(vec![10, 0, 0, 0], 8)],
        not_source_ips: vec![address(vec![10, 1, 0, 0], 16)],
        destination_ips: vec![address(vec![0; 16], 0)],
        not_destination_ips: vec![address(vec![192, 168, 1, 1], 32)],
        destination_ports: vec![80],
        not_destination_ports: vec![81],
        service_accounts: vec![account("ns", "sa")],
        not_service_accounts: vec![account("ns", "other")],
        extensions: vec![],
    };
    let policy = Policy::try_from(&with_match(m)).unwrap();
    assert_eq!(policy.name.as_ref(), "allow-client");
    assert_eq!(policy.namespace.as_ref(), "server-ns");
    assert_eq!(policy.scope, Scope::WorkloadSelector);
    assert_eq!(policy.action, Action::Deny);
    assert!(policy.dry_run);
    let cidr = |cidr: &Cidr| cidr.to_string();
    let m = only_match(&policy);
    assert_eq!(m.namespaces, [StringMatch::Exact("a".into())]);
    assert_eq!(m.not_namespaces, [StringMatch::Prefix("b".into())]);
    assert_eq!(m.principals, [StringMatch::Suffix("c".into())]);
    assert_eq!(m.not_principals, [StringMatch::Presence]);
    assert_eq!(
        m.source_ips.iter().map(cidr).collect::<Vec<_>>(),
        ["10.0.0.0/8"]
    );
    assert_eq!(
        m.not_source_ips.iter().map(cidr).collect::<Vec<_>>(),
        ["10.1.0.0/16"]
    );
    assert_eq!(
        m.destination_ips.iter().map(cidr).collect::<Vec<_>>(),
        ["::/0"]
    );
    assert_eq!(
        m.not_destination_ips.iter().map(cidr).collect::<Vec<_>>(),
        ["192.168.1.1/32"]
    );
    assert_eq!(m.destination_ports, [80]);
    assert_eq!(m.not_destination_ports, [81]);
    assert_eq!(m.service_accounts[0].service_account.as_ref(), "sa");
    assert_eq!(m.not_service_accounts[0].service_account.as_ref(), "other");
}

#[test]
fn unknown_scope_or_action_rejects_the_policy() {
    let mut policy = with_match(wire::Match::default());
    policy.action = 7;
    let error = Policy::try_from(&policy).unwrap_err();
    assert_eq!(
        error.to_string(),
        "decode error: unknown enumeration value 7"
    );
    assert!(matches!(error, PolicyError::UnknownAction(_)));

    let mut policy = with_match(wire::Match::default());
    policy.scope = 3;
    let error = Policy::try_from(&policy).unwrap_err();
    assert_eq!(
        error.to_string(),
        "decode error: unknown enumeration value 3"
    );
    assert!(matches!(error, PolicyError::UnknownScope(_)));
}

#[test]
fn bad_entries_are_dropped_and_the_rest_applies() {
    let m = wire::Match {
        principals: vec![
            string_match(None),
            string_match(Some(wire::string_match::MatchType::Exact("kept".into()))),
        ],
        namespaces: vec![string_match(None)],
        source_ips: vec![
            address(vec![10, 0, 0], 24),
            address(vec![10, 0, 0, 0], 33),
            address(vec![0; 16], 129),
            address(vec![10, 0, 0, 0], 24),
        ],
        // Ports are truncated to 16 bits.
        destination_ports: vec![65536 + 443],
        ..Default::default()
    };
    let policy = Policy::try_from(&with_match(m)).unwrap();
    let m = only_match(&policy);
    assert_eq!(m.principals, [StringMatch::Exact("kept".into())]);
    assert!(
        m.namespaces.is_empty(),
        "a list of only bad entries reads as absent"
    );
    assert_eq!(
        m.source_ips
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        ["10.0.0.0/24"]
    );
    assert_eq!(m.destination_ports, [443]);
}

#[test]
fn a_match_whose_entries_are_all_dropped_is_skipped() {
    let m = wire::Match {
        principals: vec![string_match(None)],
        ..Default::default()
    };
    let policy = Policy::try_from(&with_match(m)).unwrap();
    assert!(only_match(&policy).is_empty());
    let connection = Connection {
        source_identity: None,
        source_ip: "10.0.0.1".parse().unwrap(),
        destination_ip: "10.0.0.2".parse().unwrap(),
        destination_port: 80,
        destination_namespace: "server-ns".into(),
        destination_workload: "server".into(),
    };
    assert!(!policy.matches(&connection));
}
