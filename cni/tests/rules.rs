//! The in-pod rules against a real netns's iptables: what the agent's
//! start-up reconciliation reports as a repair must be one. Needs root,
//! `ip` and `iptables`; skips, with the reason, without them.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test

use std::net::IpAddr;

use ztunnel_cni::agent::rules::{self, RuleSettings};
use ztunnel_cni::agent::{DEFAULT_PROBE_SNAT_IPV4, DEFAULT_PROBE_SNAT_IPV6};
use ztunnel_test_support::netns::{self, NetNs};

use support::rules::our_rules;

mod support {
    #[path = "rules.rs"]
    pub mod rules;
}

#[test]
fn an_install_over_intact_rules_is_no_repair_and_one_over_missing_rules_is() {
    if let Some(reason) = netns::unavailable() {
        eprintln!("skipping: {reason}");
        return;
    }
    for dns_capture in [false, true] {
        let pod = NetNs::create("rules").unwrap();
        let ips: [IpAddr; 1] = ["198.18.60.2".parse().unwrap()];
        let settings = RuleSettings {
            probe_snat_ipv4: DEFAULT_PROBE_SNAT_IPV4,
            probe_snat_ipv6: DEFAULT_PROBE_SNAT_IPV6,
            dns_capture,
            virtual_interfaces: vec!["tap0".to_owned()],
        };
        assert!(
            rules::install(&pod.path(), &ips, &settings).unwrap(),
            "a first install puts rules in (dns={dns_capture})"
        );
        let installed = our_rules(&pod);
        assert!(
            !rules::install(&pod.path(), &ips, &settings).unwrap(),
            "iptables-save reads back exactly what was written (dns={dns_capture}): {installed:#?}"
        );
        assert_eq!(
            our_rules(&pod),
            installed,
            "a second install changes nothing"
        );
        pod.exec(&["iptables", "-t", "nat", "-F", "ISTIO_OUTPUT"])
            .unwrap();
        assert!(
            rules::install(&pod.path(), &ips, &settings).unwrap(),
            "flushed rules are a repair (dns={dns_capture})"
        );
        assert_eq!(our_rules(&pod), installed, "and are back as they were");
    }
}
