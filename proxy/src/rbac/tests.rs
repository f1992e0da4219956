//! Matching tables: how each kind of a Match compares, and how rules,
//! clauses and matches combine. The decision over several policies is
//! tested in `authorize/tests.rs`, with the fixtures below.

use super::*;

/// A peer identity used throughout.
pub(super) const CLIENT: &str = "spiffe://cluster.local/ns/client-ns/sa/client-sa";

/// A connection from `identity` (None = plaintext) at 10.0.0.1 to 10.0.0.2:8080.
pub(super) fn from(identity: Option<&str>) -> Connection {
    Connection {
        source_identity: identity.map(|id| id.parse().unwrap()),
        source_ip: "10.0.0.1".parse().unwrap(),
        destination_ip: "10.0.0.2".parse().unwrap(),
        destination_port: 8080,
        destination_namespace: "server-ns".into(),
        destination_workload: "server".into(),
    }
}

/// One rule holding one clause holding `matches`.
pub(super) fn rules_of(matches: Vec<Match>) -> Vec<Rule> {
    vec![Rule {
        clauses: vec![Clause { matches }],
    }]
}

/// A NAMESPACE policy of `server-ns`.
pub(super) fn policy(name: &str, action: Action, dry_run: bool, rules: Vec<Rule>) -> Policy {
    Policy {
        action,
        dry_run,
        rules,
        ..Policy::for_test("server-ns", name, Scope::Namespace)
    }
}

fn exact(value: &str) -> StringMatch {
    StringMatch::Exact(value.into())
}

fn prefix(value: &str) -> StringMatch {
    StringMatch::Prefix(value.into())
}

fn suffix(value: &str) -> StringMatch {
    StringMatch::Suffix(value.into())
}

fn cidr(text: &str) -> Cidr {
    let (ip, len) = text.split_once('/').unwrap();
    Cidr::new(ip.parse().unwrap(), len.parse().unwrap()).unwrap()
}

fn account(namespace: &str, service_account: &str) -> ServiceAccountMatch {
    ServiceAccountMatch {
        namespace: namespace.into(),
        service_account: service_account.into(),
    }
}

#[test]
fn match_kinds_table() {
    let with_id = Some(CLIENT);
    let other_td = Some("spiffe://other.domain/ns/client-ns/sa/client-sa");
    let d = Match::default;
    // One case a line: (name, match, peer identity, whether it matches).
    #[rustfmt::skip]
    let cases: Vec<(&str, Match, Option<&str>, bool)> = vec![
        // principals: compared against the identity without spiffe://
        ("principal exact", Match { principals: vec![exact("cluster.local/ns/client-ns/sa/client-sa")], ..d() }, with_id, true),
        ("principal exact keeps no spiffe://", Match { principals: vec![exact(CLIENT)], ..d() }, with_id, false),
        ("principal prefix", Match { principals: vec![prefix("cluster.local/ns/client-ns/")], ..d() }, with_id, true),
        ("principal prefix miss", Match { principals: vec![prefix("cluster.local/ns/other/")], ..d() }, with_id, false),
        ("principal suffix", Match { principals: vec![suffix("/sa/client-sa")], ..d() }, with_id, true),
        ("principal suffix miss", Match { principals: vec![suffix("/sa/other")], ..d() }, with_id, false),
        ("principal presence", Match { principals: vec![StringMatch::Presence], ..d() }, with_id, true),
        ("principal any of several", Match { principals: vec![exact("x"), suffix("client-sa")], ..d() }, with_id, true),
        ("principal is not a regex", Match { principals: vec![exact("cluster.local/ns/.*/sa/client-sa")], ..d() }, with_id, false),
        ("no identity: presence never hits", Match { principals: vec![StringMatch::Presence], ..d() }, None, false),
        ("no identity: empty prefix never hits", Match { principals: vec![prefix("")], ..d() }, None, false),
        ("no identity: empty exact never hits", Match { principals: vec![exact("")], ..d() }, None, false),
        ("not_principal hit", Match { not_principals: vec![suffix("client-sa")], ..d() }, with_id, false),
        ("not_principal miss", Match { not_principals: vec![suffix("other")], ..d() }, with_id, true),
        ("no identity: not_principal presence passes", Match { not_principals: vec![StringMatch::Presence], ..d() }, None, true),
        // namespaces: the identity's namespace, empty without identity
        ("namespace exact", Match { namespaces: vec![exact("client-ns")], ..d() }, with_id, true),
        ("namespace exact miss", Match { namespaces: vec![exact("server-ns")], ..d() }, with_id, false),
        ("namespace prefix", Match { namespaces: vec![prefix("client-")], ..d() }, with_id, true),
        ("namespace suffix", Match { namespaces: vec![suffix("-ns")], ..d() }, with_id, true),
        ("namespace presence", Match { namespaces: vec![StringMatch::Presence], ..d() }, with_id, true),
        ("no identity: namespace presence misses", Match { namespaces: vec![StringMatch::Presence], ..d() }, None, false),
        ("no identity: namespace compares as empty", Match { namespaces: vec![exact("")], ..d() }, None, true),
        ("no identity: namespace exact misses", Match { namespaces: vec![exact("client-ns")], ..d() }, None, false),
        ("not_namespace hit", Match { not_namespaces: vec![exact("client-ns")], ..d() }, with_id, false),
        ("not_namespace miss", Match { not_namespaces: vec![exact("other")], ..d() }, with_id, true),
        ("no identity: not_namespace presence passes", Match { not_namespaces: vec![StringMatch::Presence], ..d() }, None, true),
        // service accounts: namespace + SA, trust domain ignored
        ("service account", Match { service_accounts: vec![account("client-ns", "client-sa")], ..d() }, with_id, true),
        ("service account, other trust domain", Match { service_accounts: vec![account("client-ns", "client-sa")], ..d() }, other_td, true),
        ("service account, wrong SA", Match { service_accounts: vec![account("client-ns", "other")], ..d() }, with_id, false),
        ("service account, wrong namespace", Match { service_accounts: vec![account("other", "client-sa")], ..d() }, with_id, false),
        ("no identity: service account never hits", Match { service_accounts: vec![account("", "")], ..d() }, None, false),
        ("not_service_account hit", Match { not_service_accounts: vec![account("client-ns", "client-sa")], ..d() }, with_id, false),
        ("not_service_account miss", Match { not_service_accounts: vec![account("client-ns", "x")], ..d() }, with_id, true),
        ("no identity: not_service_account passes", Match { not_service_accounts: vec![account("client-ns", "client-sa")], ..d() }, None, true),
        // IPs: CIDR contains
        ("source ip in cidr", Match { source_ips: vec![cidr("10.0.0.0/24")], ..d() }, with_id, true),
        ("source ip host", Match { source_ips: vec![cidr("10.0.0.1/32")], ..d() }, with_id, true),
        ("source ip outside", Match { source_ips: vec![cidr("10.0.1.0/24")], ..d() }, with_id, false),
        ("source ip /0 matches every IPv4", Match { source_ips: vec![cidr("0.0.0.0/0")], ..d() }, None, true),
        ("source ip other family", Match { source_ips: vec![cidr("::/0")], ..d() }, with_id, false),
        ("not_source_ip hit", Match { not_source_ips: vec![cidr("10.0.0.1/32")], ..d() }, with_id, false),
        ("not_source_ip miss", Match { not_source_ips: vec![cidr("192.168.0.0/16")], ..d() }, with_id, true),
        ("destination ip", Match { destination_ips: vec![cidr("10.0.0.2/32")], ..d() }, with_id, true),
        ("destination ip miss", Match { destination_ips: vec![cidr("10.0.0.1/32")], ..d() }, with_id, false),
        ("not_destination_ip hit", Match { not_destination_ips: vec![cidr("10.0.0.0/8")], ..d() }, with_id, false),
        ("not_destination_ip miss", Match { not_destination_ips: vec![cidr("10.0.0.1/32")], ..d() }, with_id, true),
        // ports: destination port after translation
        ("port", Match { destination_ports: vec![80, 8080], ..d() }, with_id, true),
        ("port miss", Match { destination_ports: vec![80], ..d() }, with_id, false),
        ("not_port hit", Match { not_destination_ports: vec![8080], ..d() }, with_id, false),
        ("not_port miss", Match { not_destination_ports: vec![80], ..d() }, with_id, true),
        // kinds combine with AND; positive and negative lists of a kind too
        ("all kinds pass", Match { principals: vec![StringMatch::Presence], source_ips: vec![cidr("10.0.0.0/8")], destination_ports: vec![8080], namespaces: vec![exact("client-ns")], service_accounts: vec![account("client-ns", "client-sa")], ..d() }, with_id, true),
        ("one kind fails", Match { principals: vec![StringMatch::Presence], destination_ports: vec![9090], ..d() }, with_id, false),
        ("positive hit but negative hit", Match { principals: vec![prefix("cluster.local/")], not_principals: vec![suffix("client-sa")], ..d() }, with_id, false),
        ("positive hit and negative miss", Match { source_ips: vec![cidr("10.0.0.0/8")], not_source_ips: vec![cidr("10.0.0.9/32")], ..d() }, with_id, true),
    ];
    for (name, m, identity, want) in cases {
        let policy = policy("p", Action::Allow, false, rules_of(vec![m]));
        assert_eq!(policy.matches(&from(identity)), want, "{name}");
    }
}

#[test]
fn ipv4_mapped_source_addresses_match_ipv4_cidrs() {
    let mut connection = from(None);
    connection.source_ip = "::ffff:10.0.0.1".parse().unwrap();
    let m = Match {
        source_ips: vec![cidr("10.0.0.0/24")],
        ..Match::default()
    };
    assert!(policy("p", Action::Allow, false, rules_of(vec![m])).matches(&connection));
}

#[test]
fn structure_table() {
    let hit = || Match {
        destination_ports: vec![8080],
        ..Match::default()
    };
    let miss = || Match {
        destination_ports: vec![1],
        ..Match::default()
    };
    let empty = Match::default;
    let clause = |matches: Vec<Match>| Clause { matches };
    let rule = |clauses: Vec<Clause>| Rule { clauses };
    // One case a line: (name, rules, whether the policy matches).
    #[rustfmt::skip]
    let cases: Vec<(&str, Vec<Rule>, bool)> = vec![
        ("zero rules never match", vec![], false),
        ("a rule with no clauses matches", vec![rule(vec![])], true),
        ("a clause with no matches counts as matched", vec![rule(vec![clause(vec![])])], true),
        ("a clause of only empty matches does not match", vec![rule(vec![clause(vec![empty()])])], false),
        ("an empty match is skipped, a hit beside it counts", vec![rule(vec![clause(vec![empty(), hit()])])], true),
        ("an empty match does not rescue a miss", vec![rule(vec![clause(vec![miss(), empty()])])], false),
        ("matches are OR-ed", vec![rule(vec![clause(vec![miss(), hit()])])], true),
        ("clauses are AND-ed", vec![rule(vec![clause(vec![hit()]), clause(vec![miss()])])], false),
        ("clauses all hit", vec![rule(vec![clause(vec![hit()]), clause(vec![hit()]), clause(vec![])])], true),
        ("rules are OR-ed", vec![rule(vec![clause(vec![miss()])]), rule(vec![clause(vec![hit()])])], true),
        ("no rule matches", vec![rule(vec![clause(vec![miss()])]), rule(vec![clause(vec![empty()])])], false),
    ];
    for (name, rules, want) in cases {
        let policy = policy("p", Action::Allow, false, rules);
        assert_eq!(policy.matches(&from(Some(CLIENT))), want, "{name}");
    }
}

/// The local config file's policies are parsed on a thread whose heap must
/// be empty when it ends; the store keeps a deep copy (`rbac/form.rs`).
#[test]
fn a_deep_copy_is_equal_and_shares_no_text() {
    let conditions = Match {
        namespaces: vec![exact("ns"), StringMatch::Presence],
        not_principals: vec![prefix("cluster.local/ns/evil/")],
        principals: vec![suffix("/sa/client")],
        not_namespaces: vec![exact("kube-system")],
        service_accounts: vec![account("client-ns", "client-sa")],
        not_service_accounts: vec![account("client-ns", "banned")],
        source_ips: vec![cidr("10.0.0.0/8")],
        destination_ports: vec![8080],
        ..Match::default()
    };
    let original = policy("p", Action::Deny, true, rules_of(vec![conditions]));
    let copy = original.deep_copy();
    assert_eq!(copy, original);

    let texts = |policy: &Policy| {
        let mut texts = vec![policy.name.clone(), policy.namespace.clone()];
        for m in policy
            .rules
            .iter()
            .flat_map(|r| &r.clauses)
            .flat_map(|c| &c.matches)
        {
            let strings = [
                &m.namespaces,
                &m.not_namespaces,
                &m.principals,
                &m.not_principals,
            ];
            for string in strings.into_iter().flatten() {
                if let StringMatch::Exact(t) | StringMatch::Prefix(t) | StringMatch::Suffix(t) =
                    string
                {
                    texts.push(t.clone());
                }
            }
            for a in m.service_accounts.iter().chain(&m.not_service_accounts) {
                texts.extend([a.namespace.clone(), a.service_account.clone()]);
            }
        }
        texts
    };
    let (original_texts, copied_texts) = (texts(&original), texts(&copy));
    assert_eq!(original_texts.len(), 10);
    for (original, copied) in original_texts.iter().zip(&copied_texts) {
        assert!(!Arc::ptr_eq(original, copied), "{original} is shared");
    }
}
