#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test
//! ServiceEntries end to end, on the one-node in-pod cluster whose control
//! plane reads them from its mesh file and converts them as istiod does:
//! two entries without addresses, one with a static endpoint (the server
//! pod's address) and one resolved by DNS. Each gets a VIP from the
//! control plane's allocator; the client pod's resolver asks for the
//! hosts, ztunnel's DNS proxy answers with the VIPs (the cluster's
//! nameserver never hears of them), and a connection to a VIP reaches the
//! server's echo through ztunnel: to the static endpoint, and to the
//! address ztunnel looked up for the DNS entry's host (`resolve.rs`,
//! through the node's nameserver, a test nameserver that knows the name).
//!
//! Needs root, `ip`, `iptables`, containernetworking-plugins and the
//! glibc resolver's `getent`; skips with the reason otherwise.

use std::net::{IpAddr, SocketAddr};
use std::process::Command;

use ztunnel_test_support::cluster::{self, Binaries, Cluster, PodSpec};
use ztunnel_test_support::netns::ResolvConf;
use ztunnel_test_support::skip::skip;

use nameserver::Nameserver;
use support::{APP_PORT, eventually, logs, metric};

#[path = "support/cluster.rs"]
mod support;

#[path = "support/nameserver.rs"]
mod nameserver;

/// The port both entries declare, sent to the echo's port.
const ENTRY_PORT: u16 = 80;
/// The static entry's host.
const STATIC_HOST: &str = "static.echo.internal";
/// The DNS entry's host, which the test nameserver resolves to the server.
const DNS_HOST: &str = "dns.echo.internal";

/// The running cluster with its nameserver and the resolv.confs that
/// name it (the client pod's, and the node's, which ztunnel reads).
struct Setup {
    cluster: Cluster,
    nameserver: Nameserver,
    _resolv_confs: [ResolvConf; 2],
}

fn start(tag: &str) -> Option<Setup> {
    if let Some(reason) = cluster::unavailable() {
        skip(format_args!("{tag}: {reason}"));
        return None;
    }
    let specs = [
        PodSpec::new("client", "default", "client", "node-a"),
        PodSpec::new("server", "default", "server", "node-a"),
    ];
    let binaries = Binaries::from_target_dir().unwrap();
    let mut cluster = Cluster::start(&["node-a"], &specs, &["default"], binaries).unwrap();
    let node = cluster.node("node-a").unwrap();
    let nameserver = Nameserver::start(&node.ns, node.ip).unwrap();
    let resolv_conf = format!("nameserver {}\noptions timeout:2 attempts:2\n", node.ip);
    // ztunnel runs in the node's namespace: `ip netns exec` mounts this
    // over /etc/resolv.conf, and its hostname lookups go to the nameserver.
    let node_resolv_conf = ResolvConf::write(node.ns.name(), &resolv_conf).unwrap();
    cluster.set_ztunnel_env("DNS_UPSTREAMS", &nameserver.addr.to_string());
    cluster.start_ztunnel("node-a").unwrap();
    for spec in &specs {
        cluster.add_pod(spec).unwrap().serve_echo(APP_PORT).unwrap();
    }
    let client_ns = cluster.pod("client").unwrap().ns.name().to_owned();
    let client_resolv_conf = ResolvConf::write(&client_ns, &resolv_conf).unwrap();
    let server = cluster.pod("server").unwrap().ip;
    nameserver.add(&format!("{DNS_HOST}."), server);
    let entries = format!(
        "\
- metadata: {{name: static-echo, namespace: default}}
  spec:
    hosts: [{STATIC_HOST}]
    ports: [{{number: {ENTRY_PORT}, name: tcp-echo, protocol: TCP, targetPort: {APP_PORT}}}]
    resolution: STATIC
    endpoints: [{{address: {server}}}]
- metadata: {{name: dns-echo, namespace: default}}
  spec:
    hosts: [{DNS_HOST}]
    ports: [{{number: {ENTRY_PORT}, name: tcp-echo, protocol: TCP, targetPort: {APP_PORT}}}]
    resolution: DNS
"
    );
    cluster.mesh().set_service_entries(&entries).unwrap();
    // The two pods and the entries' two endpoints: the static address, and
    // the DNS host as a workload of its own.
    let node = cluster.node("node-a").unwrap();
    assert!(
        eventually(|| node.known_workloads().len() == 4),
        "ztunnel knows {:?}",
        node.known_workloads()
    );
    Some(Setup {
        cluster,
        nameserver,
        _resolv_confs: [node_resolv_conf, client_resolv_conf],
    })
}

impl Setup {
    /// The IPv4 addresses the client pod's system resolver gives `name`.
    fn resolve(&self, name: &str) -> Vec<IpAddr> {
        let client = self.cluster.pod("client").unwrap();
        let output = Command::new("ip")
            .args([
                "netns",
                "exec",
                client.ns.name(),
                "getent",
                "ahostsv4",
                name,
            ])
            .output()
            .unwrap();
        let mut addresses: Vec<IpAddr> = String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(|line| line.split_whitespace().next()?.parse().ok())
            .collect();
        addresses.sort();
        addresses.dedup();
        addresses
    }

    /// Whether the client's bytes to `vip` come back from the server.
    fn echoes(&self, vip: IpAddr) -> bool {
        let client = self.cluster.pod("client").unwrap();
        client.echoes(SocketAddr::new(vip, ENTRY_PORT))
    }
}

#[test]
fn service_entry_hosts_get_vips_answered_by_the_dns_proxy_and_routed_by_ztunnel() {
    let Some(setup) = start("service-entry") else {
        return;
    };
    let mut vips = Vec::new();
    for host in [STATIC_HOST, DNS_HOST] {
        let mut addresses = Vec::new();
        assert!(
            eventually(|| {
                addresses = setup.resolve(host);
                !addresses.is_empty()
            }),
            "{host} resolves in the client pod:\n{}",
            logs(&setup.cluster)
        );
        let [vip] = addresses[..] else {
            panic!("{host}: one VIP, not {addresses:?}");
        };
        assert!(
            vip.to_string().starts_with("240.240."),
            "{host}: a VIP of istiod's range, not {vip}"
        );
        vips.push(vip);
    }
    assert_ne!(vips[0], vips[1], "each entry its own VIP");
    let asked = setup.nameserver.asked();
    assert!(
        !asked
            .iter()
            .any(|line| line.ends_with(&format!(" {STATIC_HOST}."))),
        "the DNS proxy answered the static host itself: {asked:?}"
    );

    for (host, vip) in [STATIC_HOST, DNS_HOST].iter().zip(&vips) {
        assert!(
            eventually(|| setup.echoes(*vip)),
            "{host} at {vip} reaches the server's echo:\n{}",
            logs(&setup.cluster)
        );
    }
    assert!(
        setup
            .nameserver
            .asked()
            .iter()
            .any(|line| line.ends_with(&format!(" {DNS_HOST}."))),
        "ztunnel looked the DNS entry's host up: {:?}",
        setup.nameserver.asked()
    );
    let lookups = metric(
        &setup.cluster,
        "node-a",
        "istio_on_demand_dns_total",
        &[&format!("hostname=\"{DNS_HOST}\"")],
    );
    assert!(lookups >= 1.0, "each connection's lookup is counted");
}
