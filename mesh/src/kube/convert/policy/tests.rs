//! The policy table (KUBERNETES.md E7–E10): one case per line, each with
//! its reason.

use serde_json::{Value, json};

use super::super::tests::{merged, object};
use super::*;
use crate::Labels;

/// Rules → clauses → matches, as `Policy::rules`.
type Rules = Vec<Vec<Vec<PolicyMatch>>>;

fn kube_policy(namespace: &str, patch: Value) -> AuthorizationPolicy {
    object(merged(
        json!({"metadata": {"name": "p", "namespace": namespace}, "spec": {}}),
        patch,
    ))
}

fn convert_with(namespace: &str, patch: Value, settings: &ConvertSettings) -> Outcome<Policy> {
    policy(&kube_policy(namespace, patch), settings)
}

/// The policy of `spec` in namespace `shop`, which must convert cleanly.
fn converted(spec: Value) -> Policy {
    let outcome = convert_with("shop", json!({"spec": spec}), &ConvertSettings::default());
    assert_eq!(outcome.problems, []);
    outcome.entry.unwrap()
}

/// The rules of an ALLOW policy with these spec rules.
fn rules(spec_rules: Value) -> Rules {
    converted(json!({"rules": spec_rules})).rules
}

fn exact(text: &str) -> StringMatch {
    StringMatch::Exact(text.to_owned())
}

fn cidr(text: &str) -> Cidr {
    text.parse().unwrap()
}

fn account(namespace: &str, service_account: &str) -> ServiceAccountMatch {
    ServiceAccountMatch {
        namespace: namespace.to_owned(),
        service_account: service_account.to_owned(),
    }
}

#[test]
fn scope_follows_selector_and_root_namespace() {
    let selector = json!({"spec": {"selector": {"matchLabels": {"app": "web"}}}});
    let web = Labels::from([("app".to_owned(), "web".to_owned())]);
    // (case, namespace, patch, scope, selector, all namespaces)
    let cases = [
        (
            "no selector: its namespace",
            "shop",
            json!({}),
            PolicyScope::Namespace,
            None,
            false,
        ),
        (
            "no selector in the root namespace: the mesh",
            "istio-system",
            json!({}),
            PolicyScope::Global,
            None,
            false,
        ),
        (
            "selector: the pods it picks",
            "shop",
            selector.clone(),
            PolicyScope::WorkloadSelector,
            Some(web.clone()),
            false,
        ),
        (
            "selector in the root namespace: pods of every namespace",
            "istio-system",
            selector,
            PolicyScope::WorkloadSelector,
            Some(web),
            true,
        ),
        (
            "empty selector: every pod of its namespace",
            "shop",
            json!({"spec": {"selector": {}}}),
            PolicyScope::WorkloadSelector,
            Some(Labels::new()),
            false,
        ),
    ];
    for (case, namespace, patch, scope, selector, all_namespaces) in cases {
        let policy = convert_with(namespace, patch, &ConvertSettings::default())
            .entry
            .unwrap();
        assert_eq!(
            (policy.scope, policy.selector, policy.all_namespaces),
            (scope, selector, all_namespaces),
            "{case}"
        );
    }
    let elsewhere = ConvertSettings {
        root_namespace: "mesh-root".into(),
        ..ConvertSettings::default()
    };
    let policy = convert_with("mesh-root", json!({}), &elsewhere)
        .entry
        .unwrap();
    assert_eq!(
        policy.scope,
        PolicyScope::Global,
        "root namespace from the settings"
    );
}

#[test]
fn what_is_sent_follows_action_target_and_dry_run() {
    let dry_run = |value: &str| json!({"metadata": {"annotations": {DRY_RUN_ANNOTATION: value}}});
    let enabled = ConvertSettings {
        enable_dry_run_policies: true,
        ..ConvertSettings::default()
    };
    let default = ConvertSettings::default();
    let target =
        json!({"kind": "Gateway", "group": "gateway.networking.k8s.io", "name": "waypoint"});
    // (case, settings, patch, (action, dry run) if sent, problem)
    let cases = [
        (
            "no action is ALLOW",
            &default,
            json!({}),
            Some((PolicyAction::Allow, false)),
            None,
        ),
        (
            "ALLOW",
            &default,
            json!({"spec": {"action": "ALLOW"}}),
            Some((PolicyAction::Allow, false)),
            None,
        ),
        (
            "DENY",
            &default,
            json!({"spec": {"action": "DENY"}}),
            Some((PolicyAction::Deny, false)),
            None,
        ),
        (
            "AUDIT is not sent",
            &default,
            json!({"spec": {"action": "AUDIT"}}),
            None,
            Some(ProblemReason::UnsupportedAction { action: "AUDIT" }),
        ),
        (
            "CUSTOM is not sent",
            &default,
            json!({"spec": {"action": "CUSTOM", "provider": {"name": "ext-authz"}}}),
            None,
            Some(ProblemReason::UnsupportedAction { action: "CUSTOM" }),
        ),
        (
            "targetRef: for waypoints",
            &default,
            json!({"spec": {"targetRef": target}}),
            None,
            Some(ProblemReason::TargetRefNotSent),
        ),
        (
            "targetRefs: for waypoints",
            &default,
            json!({"spec": {"targetRefs": [target]}}),
            None,
            Some(ProblemReason::TargetRefNotSent),
        ),
        (
            "empty targetRefs: for pods",
            &default,
            json!({"spec": {"targetRefs": []}}),
            Some((PolicyAction::Allow, false)),
            None,
        ),
        (
            "dry-run, disabled: not sent",
            &default,
            dry_run("true"),
            None,
            Some(ProblemReason::DryRunNotSent),
        ),
        (
            "dry-run, enabled: sent as dry-run",
            &enabled,
            dry_run("true"),
            Some((PolicyAction::Allow, true)),
            None,
        ),
        (
            "dry-run written 1",
            &enabled,
            dry_run("1"),
            Some((PolicyAction::Allow, true)),
            None,
        ),
        (
            "dry-run false",
            &default,
            dry_run("false"),
            Some((PolicyAction::Allow, false)),
            None,
        ),
        (
            "dry-run unparsable is false",
            &default,
            dry_run("yes"),
            Some((PolicyAction::Allow, false)),
            None,
        ),
    ];
    for (case, settings, patch, sent, problem) in cases {
        let outcome = convert_with("shop", patch, settings);
        let got = outcome.entry.map(|policy| (policy.action, policy.dry_run));
        assert_eq!(
            (got, outcome.problems),
            (sent, problem.into_iter().collect()),
            "{case}"
        );
    }
}

#[test]
fn rules_become_groups_of_clauses() {
    let ports = |ports: &[u16]| PolicyMatch {
        destination_ports: ports.to_vec(),
        ..PolicyMatch::default()
    };
    let namespaces = |names: &[&str]| PolicyMatch {
        namespaces: names.iter().map(|name| exact(name)).collect(),
        ..PolicyMatch::default()
    };
    // (case, spec rules, rules → clauses → matches)
    let cases: Vec<(&str, Value, Rules)> = vec![
        (
            "no rules: zero groups (ALLOW matches nothing)",
            json!([]),
            vec![],
        ),
        (
            "rule {}: a group of zero clauses (matches everything)",
            json!([{}]),
            vec![vec![]],
        ),
        (
            "all to[] entries: one clause, a match each",
            json!([{"to": [{"operation": {"ports": ["80"]}}, {"operation": {"ports": ["443", "8443"]}}]}]),
            vec![vec![vec![ports(&[80]), ports(&[443, 8443])]]],
        ),
        (
            "all from[] entries: one clause, a match each",
            json!([{"from": [{"source": {"namespaces": ["a"]}}, {"source": {"namespaces": ["b"]}}]}]),
            vec![vec![vec![namespaces(&["a"]), namespaces(&["b"])]]],
        ),
        (
            "each when[]: its own clause",
            json!([{"when": [{"key": "destination.port", "values": ["80"]},
                             {"key": "source.namespace", "values": ["a"]}]}]),
            vec![vec![vec![ports(&[80])], vec![namespaces(&["a"])]]],
        ),
        (
            "order: to, from, then when",
            json!([{"when": [{"key": "source.namespace", "values": ["w"]}],
                    "from": [{"source": {"namespaces": ["f"]}}],
                    "to": [{"operation": {"ports": ["1"]}}]}]),
            vec![vec![
                vec![ports(&[1])],
                vec![namespaces(&["f"])],
                vec![namespaces(&["w"])],
            ]],
        ),
        (
            "rules are OR-ed groups",
            json!([{"to": [{"operation": {"ports": ["1"]}}]}, {"from": [{"source": {"namespaces": ["a"]}}]}]),
            vec![vec![vec![ports(&[1])]], vec![vec![namespaces(&["a"])]]],
        ),
        (
            "an entry without operation or source: an empty match",
            json!([{"to": [{}], "from": [{}]}]),
            vec![vec![
                vec![PolicyMatch::default()],
                vec![PolicyMatch::default()],
            ]],
        ),
    ];
    for (case, spec_rules, want) in cases {
        assert_eq!(rules(spec_rules), want, "{case}");
    }
}

#[test]
fn source_and_operation_fields_map_to_match_fields() {
    let from = |source: Value| {
        let rules = rules(json!([{"from": [{"source": source}]}]));
        rules[0][0][0].clone()
    };
    let to = |operation: Value| {
        let rules = rules(json!([{"to": [{"operation": operation}]}]));
        rules[0][0][0].clone()
    };
    // (case, match, want)
    let cases = [
        (
            "principals",
            from(json!({"principals": ["cluster.local/ns/a/sa/b"]})),
            PolicyMatch {
                principals: vec![exact("cluster.local/ns/a/sa/b")],
                ..PolicyMatch::default()
            },
        ),
        (
            "notPrincipals",
            from(json!({"notPrincipals": ["x"]})),
            PolicyMatch {
                not_principals: vec![exact("x")],
                ..PolicyMatch::default()
            },
        ),
        (
            "namespaces",
            from(json!({"namespaces": ["a"]})),
            PolicyMatch {
                namespaces: vec![exact("a")],
                ..PolicyMatch::default()
            },
        ),
        (
            "notNamespaces",
            from(json!({"notNamespaces": ["a"]})),
            PolicyMatch {
                not_namespaces: vec![exact("a")],
                ..PolicyMatch::default()
            },
        ),
        (
            "ipBlocks",
            from(json!({"ipBlocks": ["10.0.0.0/8"]})),
            PolicyMatch {
                source_ips: vec![cidr("10.0.0.0/8")],
                ..PolicyMatch::default()
            },
        ),
        (
            "notIpBlocks",
            from(json!({"notIpBlocks": ["10.0.0.1"]})),
            PolicyMatch {
                not_source_ips: vec![cidr("10.0.0.1/32")],
                ..PolicyMatch::default()
            },
        ),
        (
            "serviceAccounts ns/sa",
            from(json!({"serviceAccounts": ["other/api"]})),
            PolicyMatch {
                service_accounts: vec![account("other", "api")],
                ..PolicyMatch::default()
            },
        ),
        (
            "serviceAccounts bare: the policy's namespace",
            from(json!({"serviceAccounts": ["api"]})),
            PolicyMatch {
                service_accounts: vec![account("shop", "api")],
                ..PolicyMatch::default()
            },
        ),
        (
            "notServiceAccounts",
            from(json!({"notServiceAccounts": ["api", "x/y"]})),
            PolicyMatch {
                not_service_accounts: vec![account("shop", "api"), account("x", "y")],
                ..PolicyMatch::default()
            },
        ),
        (
            "trustDomains silently ignored",
            from(json!({"trustDomains": ["td"], "notTrustDomains": ["x"]})),
            PolicyMatch::default(),
        ),
        (
            "ports",
            to(json!({"ports": ["80"]})),
            PolicyMatch {
                destination_ports: vec![80],
                ..PolicyMatch::default()
            },
        ),
        (
            "notPorts",
            to(json!({"notPorts": ["22"]})),
            PolicyMatch {
                not_destination_ports: vec![22],
                ..PolicyMatch::default()
            },
        ),
    ];
    for (case, got, want) in cases {
        assert_eq!(got, want, "{case}");
    }
}

#[test]
fn when_conditions_on_l4_keys_map_to_match_fields() {
    let when = |key: &str, values: &[&str], not_values: &[&str]| {
        let rules =
            rules(json!([{"when": [{"key": key, "values": values, "notValues": not_values}]}]));
        rules[0][0][0].clone()
    };
    // (case, match, want)
    let cases = [
        (
            "source.ip",
            when("source.ip", &["10.0.0.0/8"], &["10.1.0.0/16"]),
            PolicyMatch {
                source_ips: vec![cidr("10.0.0.0/8")],
                not_source_ips: vec![cidr("10.1.0.0/16")],
                ..PolicyMatch::default()
            },
        ),
        (
            "source.namespace",
            when("source.namespace", &["a"], &["b"]),
            PolicyMatch {
                namespaces: vec![exact("a")],
                not_namespaces: vec![exact("b")],
                ..PolicyMatch::default()
            },
        ),
        (
            "source.principal",
            when("source.principal", &["p*"], &["*q"]),
            PolicyMatch {
                principals: vec![StringMatch::Prefix("p".into())],
                not_principals: vec![StringMatch::Suffix("q".into())],
                ..PolicyMatch::default()
            },
        ),
        (
            "destination.ip",
            when("destination.ip", &["fd00::/8"], &["fd00::1"]),
            PolicyMatch {
                destination_ips: vec![cidr("fd00::/8")],
                not_destination_ips: vec![cidr("fd00::1/128")],
                ..PolicyMatch::default()
            },
        ),
        (
            "destination.port",
            when("destination.port", &["80"], &["81"]),
            PolicyMatch {
                destination_ports: vec![80],
                not_destination_ports: vec![81],
                ..PolicyMatch::default()
            },
        ),
    ];
    for (case, got, want) in cases {
        assert_eq!(got, want, "{case}");
    }
}

#[test]
fn strings_ips_and_ports_convert_as_istiod_does() {
    // (value, string match)
    let strings = [
        ("*", StringMatch::Presence),
        ("*.example", StringMatch::Suffix(".example".into())),
        (
            "cluster.local/ns/a/*",
            StringMatch::Prefix("cluster.local/ns/a/".into()),
        ),
        ("*a*", StringMatch::Suffix("a*".into())), // a leading * decides
        ("a", exact("a")),
        ("", exact("")),
    ];
    for (text, want) in strings {
        assert_eq!(string_match(text), want, "{text:?}");
    }
    // (value, kept as)
    let ips = [
        ("10.1.2.3/8", Some("10.1.2.3/8")), // not masked
        ("10.1.2.3", Some("10.1.2.3/32")),  // a host
        ("fd00::1", Some("fd00::1/128")),
        ("10.0.0.0/33", None), // prefix too long: dropped
        ("10.0.0", None),
        ("bad", None),
    ];
    for (text, want) in ips {
        let got = cidrs(&[text.to_owned()]).first().map(ToString::to_string);
        assert_eq!(got.as_deref(), want, "{text}");
    }
    // (value, kept as)
    let ports = [
        ("80", Some(80)),
        ("0", Some(0)),
        ("65535", Some(65535)),
        ("65536", None), // too large: dropped silently
        ("-1", None),
        ("+80", None),
        ("http", None),
        (" 80", None),
        ("", None),
    ];
    for (text, want) in ports {
        assert_eq!(
            super::ports(&[text.to_owned()]).first().copied(),
            want,
            "{text:?}"
        );
    }
}

#[test]
fn http_only_fields_drop_allow_rules_and_are_left_out_of_deny_rules() {
    let l4 = json!({"to": [{"operation": {"ports": ["80"]}}]});
    let methods_and_ports = json!({"to": [{"operation": {"methods": ["GET"], "ports": ["8080"]}}]});
    let methods_only = json!({"to": [{"operation": {"methods": ["GET"]}}]});
    let header = json!({"when": [{"key": "request.headers[x-id]", "values": ["1"]}]});
    let request_principals = json!({"from": [{"source": {"requestPrincipals": ["*"]}}]});
    let remote_ips =
        json!({"from": [{"source": {"remoteIpBlocks": ["1.2.3.4"], "namespaces": ["a"]}}]});
    let ports = |ports: &[u16]| PolicyMatch {
        destination_ports: ports.to_vec(),
        ..PolicyMatch::default()
    };
    let empty = PolicyMatch::default;
    let fields = |fields: &[&str]| {
        fields
            .iter()
            .map(|field| (*field).to_owned())
            .collect::<Vec<_>>()
    };
    // (case, action, spec rules, rules, problem)
    let cases = [
        (
            "ALLOW: an HTTP rule is dropped whole, others kept",
            "ALLOW",
            json!([l4, methods_and_ports]),
            vec![vec![vec![ports(&[80])]]],
            ProblemReason::AllowRulesDropped {
                rules: 1,
                fields: fields(&["to.operation.methods"]),
            },
        ),
        (
            "ALLOW: all rules dropped leaves zero groups, allowing nothing",
            "ALLOW",
            json!([methods_only, header, request_principals]),
            vec![],
            ProblemReason::AllowRulesDropped {
                rules: 3,
                fields: fields(&[
                    "to.operation.methods",
                    "when.key=request.headers[x-id]",
                    "from.source.requestPrincipals",
                ]),
            },
        ),
        (
            "DENY methods+ports: the whole port is denied",
            "DENY",
            json!([methods_and_ports]),
            vec![vec![vec![ports(&[8080])]]],
            ProblemReason::DenyFieldsIgnored {
                fields: fields(&["to.operation.methods"]),
            },
        ),
        (
            "DENY methods only: an empty match, the rule cannot match",
            "DENY",
            json!([methods_only]),
            vec![vec![vec![empty()]]],
            ProblemReason::DenyFieldsIgnored {
                fields: fields(&["to.operation.methods"]),
            },
        ),
        (
            "DENY when on a request attribute: an empty match, the rule cannot match",
            "DENY",
            json!([header]),
            vec![vec![vec![empty()]]],
            ProblemReason::DenyFieldsIgnored {
                fields: fields(&["when.key=request.headers[x-id]"]),
            },
        ),
        (
            "DENY remoteIpBlocks: unsupported, the rest of the source denies",
            "DENY",
            json!([remote_ips]),
            vec![vec![vec![PolicyMatch {
                namespaces: vec![exact("a")],
                ..PolicyMatch::default()
            }]]],
            ProblemReason::DenyFieldsIgnored {
                fields: fields(&["from.source.remoteIpBlocks"]),
            },
        ),
    ];
    for (case, action, spec_rules, want, problem) in cases {
        let patch = json!({"spec": {"action": action, "rules": spec_rules}});
        let outcome = convert_with("shop", patch, &ConvertSettings::default());
        assert_eq!(outcome.problems, std::slice::from_ref(&problem), "{case}");
        assert_ne!(
            problem.effect(),
            super::super::Effect::Dropped,
            "{case}: still sent"
        );
        assert_eq!(outcome.entry.unwrap().rules, want, "{case}");
    }
    // (field, rule using it)
    let every_http_field = [
        (
            "to.operation.hosts",
            json!({"to": [{"operation": {"hosts": ["a"]}}]}),
        ),
        (
            "to.operation.notHosts",
            json!({"to": [{"operation": {"notHosts": ["a"]}}]}),
        ),
        (
            "to.operation.methods",
            json!({"to": [{"operation": {"methods": ["GET"]}}]}),
        ),
        (
            "to.operation.notMethods",
            json!({"to": [{"operation": {"notMethods": ["GET"]}}]}),
        ),
        (
            "to.operation.paths",
            json!({"to": [{"operation": {"paths": ["/"]}}]}),
        ),
        (
            "to.operation.notPaths",
            json!({"to": [{"operation": {"notPaths": ["/"]}}]}),
        ),
        (
            "from.source.requestPrincipals",
            json!({"from": [{"source": {"requestPrincipals": ["a"]}}]}),
        ),
        (
            "from.source.notRequestPrincipals",
            json!({"from": [{"source": {"notRequestPrincipals": ["a"]}}]}),
        ),
        (
            "from.source.remoteIpBlocks",
            json!({"from": [{"source": {"remoteIpBlocks": ["1.1.1.1"]}}]}),
        ),
        (
            "from.source.notRemoteIpBlocks",
            json!({"from": [{"source": {"notRemoteIpBlocks": ["1.1.1.1"]}}]}),
        ),
        (
            "when.key=request.auth.claims[iss]",
            json!({"when": [{"key": "request.auth.claims[iss]", "values": ["a"]}]}),
        ),
        (
            "when.key=remote.ip",
            json!({"when": [{"key": "remote.ip", "values": ["1.1.1.1"]}]}),
        ),
        (
            "when.key=connection.sni",
            json!({"when": [{"key": "connection.sni", "values": ["a"]}]}),
        ),
    ];
    for (field, rule) in every_http_field {
        let rule: Rule = object(rule);
        assert_eq!(http_only_fields(&rule), [field]);
    }
    let l4_rule: Rule = object(
        json!({"when": [{"key": "source.ip", "values": ["1.1.1.1"]}],
                                      "from": [{"source": {"ipBlocks": ["1.1.1.1"], "trustDomains": ["td"]}}],
                                      "to": [{"operation": {"ports": ["1"], "methods": []}}]}),
    );
    assert_eq!(
        http_only_fields(&l4_rule),
        Vec::<String>::new(),
        "L4 fields and empty lists"
    );
}
