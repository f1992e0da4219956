//! The node's side of kubelet probes (WIRE.md §6, "Host netns") in real
//! namespaces: `HostRules` run from a thread inside a test "node" netns
//! puts one jump and one SNAT rule however often it runs, keeps the probe
//! ipsets in step with the pods, and leaves nothing on uninstall; and a
//! connection from the node to an enrolled pod arrives from the probe
//! address. Needs root, `ip`, `iptables` and `ipset`; skips otherwise.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test

use std::io::ErrorKind;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::time::Duration;

use ztunnel_cni::agent::host_rules::{HostRules, SyncReport};
use ztunnel_cni::agent::netns::run_in;
use ztunnel_cni::agent::{DEFAULT_PROBE_SNAT_IPV4, DEFAULT_PROBE_SNAT_IPV6};
use ztunnel_test_support::netns::{self, NetNs, veth_pair};
use ztunnel_test_support::skip::skip;

const SET_V4: &str = "istio-inpod-probes-v4";
const SET_V6: &str = "istio-inpod-probes-v6";
const JUMP: &str = "-A POSTROUTING -j ISTIO_POSTRT";
/// A rule of someone else's that was in POSTROUTING first.
const MASQUERADE: &str = "-A POSTROUTING -s 198.18.0.0/15 -j MASQUERADE";
const SNAT_V4: &str = "-A ISTIO_POSTRT -p tcp -m owner --socket-exists -m set --match-set istio-inpod-probes-v4 dst -j SNAT --to-source 169.254.7.127";
const SNAT_V6: &str = "-A ISTIO_POSTRT -p tcp -m owner --socket-exists -m set --match-set istio-inpod-probes-v6 dst -j SNAT --to-source fd16:9254:7127:1337:ffff:ffff:ffff:ffff";
/// Long enough for a handshake over a veth on a loaded machine.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Why these tests cannot run here, if they cannot: the netns needs, plus
/// an `ipset` that works (the tool and the kernel's ip_set).
fn unavailable() -> Option<String> {
    if let Some(reason) = netns::unavailable() {
        return Some(reason);
    }
    match Command::new("ipset").args(["list", "-n"]).output() {
        Ok(output) if output.status.success() => None,
        Ok(output) => Some(format!(
            "`ipset list` fails here: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )),
        Err(_) => Some("`ipset` is not installed (apt-get install ipset)".into()),
    }
}

/// A fresh "node" netns, or `None` (skipped, with the reason).
fn node_or_skip(tag: &str) -> Option<NetNs> {
    if let Some(reason) = unavailable() {
        skip(reason);
        return None;
    }
    Some(NetNs::create(tag).unwrap())
}

/// The probe SNAT with the default probe addresses.
fn host_rules() -> HostRules {
    HostRules::new(DEFAULT_PROBE_SNAT_IPV4, DEFAULT_PROBE_SNAT_IPV6)
}

/// Runs `f` as the agent does: from a thread inside `node`'s netns.
fn in_node<R: Send>(node: &NetNs, f: impl FnOnce() -> R + Send) -> R {
    run_in(&node.path(), f).unwrap()
}

/// The rule lines (`-A ...`) of one family's nat table in `node`, or
/// `None` where that family's iptables does not work.
fn nat_rules(node: &NetNs, save_program: &str) -> Option<Vec<String>> {
    let saved = node.exec(&[save_program, "-t", "nat"]).ok()?;
    Some(
        String::from_utf8_lossy(&saved.stdout)
            .lines()
            .filter(|line| line.starts_with("-A "))
            .map(str::to_owned)
            .collect(),
    )
}

/// The names of the ipsets in `node`.
fn sets(node: &NetNs) -> Vec<String> {
    let listing = node.exec(&["ipset", "list", "-n"]).unwrap();
    String::from_utf8_lossy(&listing.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The members of `set` in `node`, sorted.
fn members(node: &NetNs, set: &str) -> Vec<IpAddr> {
    let saved = node.exec(&["ipset", "save", set]).unwrap();
    let mut members: Vec<IpAddr> = String::from_utf8_lossy(&saved.stdout)
        .lines()
        .filter_map(|line| line.strip_prefix(&format!("add {set} ")))
        .map(|member| member.split_whitespace().next().unwrap().parse().unwrap())
        .collect();
    members.sort();
    members
}

fn ips(texts: &[&str]) -> Vec<IpAddr> {
    texts.iter().map(|text| text.parse().unwrap()).collect()
}

#[test]
fn host_rules_installed_twice_keep_one_jump_on_top_and_one_rule_and_uninstalled_leave_nothing() {
    let Some(node) = node_or_skip("hostrules") else {
        return;
    };
    node.exec(&[
        "iptables",
        "-t",
        "nat",
        "-A",
        "POSTROUTING",
        "-s",
        "198.18.0.0/15",
        "-j",
        "MASQUERADE",
    ])
    .unwrap();
    // A copy left by an agent configured with another probe address.
    in_node(&node, || {
        HostRules::new(Ipv4Addr::new(198, 18, 255, 254), DEFAULT_PROBE_SNAT_IPV6).install()
    })
    .unwrap();
    for _ in 0..2 {
        in_node(&node, || host_rules().install()).unwrap();
    }
    assert_eq!(
        nat_rules(&node, "iptables-save").unwrap(),
        [JUMP, MASQUERADE, SNAT_V4]
    );
    match nat_rules(&node, "ip6tables-save") {
        Some(rules) => assert_eq!(rules, [JUMP, SNAT_V6]),
        None => eprintln!("ip6tables does not work here: IPv6 rules not checked"),
    }
    let present = sets(&node);
    assert!(
        present.iter().any(|set| set == SET_V4) && present.iter().any(|set| set == SET_V6),
        "{present:?}"
    );

    for _ in 0..2 {
        in_node(&node, || host_rules().uninstall()).unwrap();
    }
    assert_eq!(nat_rules(&node, "iptables-save").unwrap(), [MASQUERADE]);
    if let Some(rules) = nat_rules(&node, "ip6tables-save") {
        assert!(rules.is_empty(), "{rules:?}");
    }
    let saved = node.exec(&["iptables-save", "-t", "nat"]).unwrap();
    assert!(!String::from_utf8_lossy(&saved.stdout).contains("ISTIO_POSTRT"));
    assert!(sets(&node).is_empty(), "{:?}", sets(&node));
}

#[test]
fn host_rules_add_and_remove_pod_ips_in_the_sets_and_sync_rebuilds_them() {
    let Some(node) = node_or_skip("hostsets") else {
        return;
    };
    let rules = host_rules();
    in_node(&node, || rules.install()).unwrap();

    // Adding twice is fine; each IP goes to the set of its family.
    for _ in 0..2 {
        in_node(&node, || rules.add_pod(&ips(&["198.18.1.2", "2001:2::2"]))).unwrap();
    }
    assert_eq!(members(&node, SET_V4), ips(&["198.18.1.2"]));
    assert_eq!(members(&node, SET_V6), ips(&["2001:2::2"]));

    // Removing an IP that is not there is fine.
    in_node(&node, || rules.add_pod(&ips(&["198.18.1.3"]))).unwrap();
    in_node(&node, || {
        rules.remove_pod(&ips(&["198.18.1.2", "198.18.1.99"]))
    })
    .unwrap();
    assert_eq!(members(&node, SET_V4), ips(&["198.18.1.3"]));

    let wanted = ips(&["198.18.1.4", "198.18.1.3"]);
    let report = in_node(&node, || rules.sync(&wanted)).unwrap();
    assert_eq!(
        report,
        SyncReport {
            added: ips(&["198.18.1.4"]),
            removed: ips(&["2001:2::2"]),
        }
    );
    assert_eq!(members(&node, SET_V4), ips(&["198.18.1.3", "198.18.1.4"]));
    assert!(members(&node, SET_V6).is_empty());
    let again = in_node(&node, || rules.sync(&wanted)).unwrap();
    assert!(again.is_empty(), "{again:?}");

    in_node(&node, || rules.uninstall()).unwrap();
    assert!(sets(&node).is_empty(), "{:?}", sets(&node));
}

#[test]
fn host_rules_let_a_connection_from_the_node_reach_an_enrolled_pod_from_the_probe_address() {
    let Some(node) = node_or_skip("probenode") else {
        return;
    };
    let pod = NetNs::create("probepod").unwrap();
    veth_pair(&node, "198.18.2.1/24", &pod, "198.18.2.2/24").unwrap();
    pod.exec(&["ip", "route", "add", "default", "via", "198.18.2.1"])
        .unwrap();
    let listener = pod
        .run(|| TcpListener::bind("198.18.2.2:0"))
        .unwrap()
        .unwrap();
    let pod_address: SocketAddr = listener.local_addr().unwrap();
    // The in-pod rules let the probe address through unproxied; this
    // stands in for them by refusing every other source.
    pod.exec(&[
        "iptables",
        "-A",
        "INPUT",
        "-p",
        "tcp",
        "--dport",
        &pod_address.port().to_string(),
        "!",
        "-s",
        &DEFAULT_PROBE_SNAT_IPV4.to_string(),
        "-j",
        "REJECT",
        "--reject-with",
        "tcp-reset",
    ])
    .unwrap();
    let connect = || {
        node.run(|| TcpStream::connect_timeout(&pod_address, CONNECT_TIMEOUT))
            .unwrap()
    };
    let refused = |result: std::io::Result<TcpStream>| matches!(result, Err(error) if error.kind() == ErrorKind::ConnectionRefused);

    let rules = host_rules();
    let pod_ips = [pod_address.ip()];
    in_node(&node, || rules.install()).unwrap();
    assert!(
        refused(connect()),
        "a pod that is not enrolled sees the node's own address"
    );

    in_node(&node, || rules.add_pod(&pod_ips)).unwrap();
    let _client = connect().unwrap();
    let (_server, peer) = listener.accept().unwrap();
    assert_eq!(peer.ip(), IpAddr::from(DEFAULT_PROBE_SNAT_IPV4));

    in_node(&node, || rules.remove_pod(&pod_ips)).unwrap();
    assert!(refused(connect()), "a removed pod is no longer SNATed");
}

/// An agent outside the node's netns (istio-cni's chart without host
/// networking) keeps the rules in the netns it is given, from its own
/// thread: the node gets them, the agent's netns does not.
#[test]
fn host_rules_given_the_nodes_netns_act_there_from_anywhere() {
    let Some(node) = node_or_skip("hostnode") else {
        return;
    };
    let agent = NetNs::create("hostagent").unwrap();
    let rules = host_rules().in_netns(node.path());
    in_node(&agent, || -> Result<(), _> {
        rules.install()?;
        rules.add_pod(&ips(&["198.18.70.2"]))
    })
    .unwrap();
    assert_eq!(nat_rules(&node, "iptables-save").unwrap(), [JUMP, SNAT_V4]);
    assert_eq!(members(&node, SET_V4), ips(&["198.18.70.2"]));
    assert_eq!(
        nat_rules(&agent, "iptables-save").unwrap(),
        Vec::<String>::new()
    );
    assert!(sets(&agent).is_empty(), "{:?}", sets(&agent));
    in_node(&agent, || rules.uninstall()).unwrap();
    assert!(sets(&node).is_empty());
}
