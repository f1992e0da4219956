//! The in-pod rules against a real netns's iptables and policy routing:
//! what the agent's start-up reconciliation reports as a repair must be
//! one, and its re-install over intact rules must not disturb them. Needs
//! root, `ip` and `iptables`; skips, with the reason, without them.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test

use std::io::Read;
use std::net::IpAddr;
use std::process::Stdio;
use std::time::Duration;

use ztunnel_cni::agent::rules::{self, RuleSettings};
use ztunnel_cni::agent::{DEFAULT_PROBE_SNAT_IPV4, DEFAULT_PROBE_SNAT_IPV6};
use ztunnel_test_support::netns::{self, NetNs};
use ztunnel_test_support::skip::skip;

use support::rules::our_rules;

mod support {
    #[path = "rules.rs"]
    pub mod rules;
}

#[test]
fn an_install_over_intact_rules_is_no_repair_and_one_over_missing_rules_is() {
    if let Some(reason) = netns::unavailable() {
        skip(reason);
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

/// The policy-routing rule that brings the application's replies back to
/// ztunnel, as `ip monitor` prints it.
const REPLY_RULE: &str = "32764:\tfrom all fwmark 0x111/0xfff lookup 100";

#[test]
fn a_reinstall_over_intact_rules_never_takes_the_reply_route_away() {
    if let Some(reason) = netns::unavailable() {
        skip(reason);
        return;
    }
    let pod = NetNs::create("rules-gap").unwrap();
    let ips: [IpAddr; 1] = ["198.18.60.2".parse().unwrap()];
    let settings = RuleSettings {
        probe_snat_ipv4: DEFAULT_PROBE_SNAT_IPV4,
        probe_snat_ipv6: DEFAULT_PROBE_SNAT_IPV6,
        dns_capture: false,
        virtual_interfaces: Vec::new(),
    };
    rules::install(&pod.path(), &ips, &settings).unwrap();
    let mut monitor = pod
        .command("ip")
        .args(["-4", "monitor", "rule"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // Time for the monitor to subscribe; the repair below proves it did.
    std::thread::sleep(Duration::from_millis(300));

    // The agent's start-up repair over a pod whose rules are intact: a
    // moment without the rule sends the replies of the pod's open
    // connections out to the clients' real addresses, whose resets end them.
    rules::install(&pod.path(), &ips, &settings).unwrap();
    // A rule that is really missing is put back.
    pod.exec(&["ip", "-4", "rule", "del", "pref", "32764"])
        .unwrap();
    rules::install(&pod.path(), &ips, &settings).unwrap();
    std::thread::sleep(Duration::from_millis(300));

    monitor.kill().unwrap();
    let mut seen = String::new();
    monitor
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut seen)
        .unwrap();
    monitor.wait().unwrap();
    let events: Vec<&str> = seen.lines().map(str::trim_end).collect();
    assert_eq!(
        events,
        [format!("Deleted {REPLY_RULE}").as_str(), REPLY_RULE],
        "only the test's own delete and the repair's add change the rule"
    );
    let shown = pod.exec(&["ip", "-4", "rule", "show"]).unwrap();
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert_eq!(shown.matches(REPLY_RULE).count(), 1, "{shown}");
}
