//! End-to-end tests of the plugin and the agent with real parts: network
//! namespaces, the real bridge and host-local plugins, our built
//! `ztunnel-cni`, the agent in-process on its own runtime, iptables inside
//! the pod namespace, and a fake ztunnel on the real ZDS socket. They need
//! root and skip, with the reason, where it or the tools are missing.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test

use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;
use ztunnel_cni::agent::{self, AgentConfig};
use ztunnel_proto::istio::workload::zds::workload_request::Payload;
use ztunnel_test_support::cni::{self, CniNetwork, PodSandbox};
use ztunnel_test_support::netns::NetNs;
use ztunnel_test_support::skip::skip;

use rules::our_rules;
use running_agent::Agent;
use ztunnel::FakeZtunnel;

#[path = "../support/rules.rs"]
mod rules;
#[path = "../support/running_agent.rs"]
mod running_agent;
mod ztunnel;

const PLUGIN: &str = env!("CARGO_BIN_EXE_ztunnel-cni");

macro_rules! skip_unless_available {
    () => {
        if let Some(reason) = cni::unavailable() {
            skip(reason);
            return;
        }
    };
}

// Declared after the macro, which its tests use.
mod retried_sandbox;

/// The registry used by most tests: two ambient pods and one elsewhere.
const PODS: &str = "
- {name: web-0, namespace: shop, uid: uid-web-0, serviceAccount: web, nodeName: node-a}
- {name: web-1, namespace: shop, uid: uid-web-1, serviceAccount: web, nodeName: node-a}
- {name: db-0, namespace: other, uid: uid-db-0, serviceAccount: db, nodeName: node-a}
- {name: dns-0, namespace: kube-system, uid: uid-dns-0, serviceAccount: dns, nodeName: node-a}
";

/// A node namespace, a temp dir for sockets, state and registry.
struct Node {
    dir: tempfile::TempDir,
    netns: NetNs,
}

impl Node {
    fn new(pods: &str) -> Node {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("pods.yaml"), pods).unwrap();
        Node {
            dir,
            netns: NetNs::create("node").unwrap(),
        }
    }

    fn plugin_socket(&self) -> PathBuf {
        self.dir.path().join("run/pluginevent.sock")
    }

    fn zds_socket(&self) -> PathBuf {
        self.dir.path().join("ztunnel/ztunnel.sock")
    }

    fn config(&self) -> AgentConfig {
        let mut config = AgentConfig::with_registry(self.dir.path().join("pods.yaml"));
        config.plugin_socket = self.plugin_socket();
        config.zds_socket = self.zds_socket();
        config.state_dir = self.dir.path().join("state");
        config.node_name = Some("node-a".into());
        config
    }

    fn network(&self, subnet: &str) -> CniNetwork {
        CniNetwork::new(
            &self.netns,
            subnet,
            Path::new(PLUGIN),
            &self.plugin_socket(),
        )
        .unwrap()
        .ambient_namespaces(&["shop"])
    }
}

/// `ip rule` lines of ours inside a pod namespace.
fn our_ip_rules(pod: &NetNs) -> Vec<String> {
    let rules = pod.exec(&["ip", "-4", "rule", "show"]).unwrap();
    String::from_utf8_lossy(&rules.stdout)
        .lines()
        .filter(|line| line.starts_with("32764:"))
        .map(str::to_owned)
        .collect()
}

fn table_100(pod: &NetNs) -> String {
    let routes = pod
        .exec(&["ip", "-4", "route", "show", "table", "100"])
        .unwrap();
    String::from_utf8_lossy(&routes.stdout).into_owned()
}

/// (dev, ino) of a namespace path or an fd.
fn identity(metadata: &std::fs::Metadata) -> (u64, u64) {
    (metadata.dev(), metadata.ino())
}

fn fd_identity(fd: &std::os::fd::OwnedFd) -> (u64, u64) {
    let stat = nix::sys::stat::fstat(fd).unwrap();
    (stat.st_dev, stat.st_ino)
}

fn netns_identity(pod: &PodSandbox<'_>) -> (u64, u64) {
    identity(&std::fs::metadata(pod.netns_path()).unwrap())
}

/// One raw HTTP/1.1 exchange on the plugin socket; returns status and body.
fn http(socket: &Path, method: &str, path: &str, body: &[u8]) -> (u16, String) {
    let mut stream = std::os::unix::net::UnixStream::connect(socket).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: unix\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    (status, body)
}

#[test]
fn ambient_pod_gets_rules_idempotently_and_del_removes_them() {
    skip_unless_available!();
    let node = Node::new(PODS);
    let _agent = Agent::start(node.config());
    let network = node.network("198.18.10.0/24");
    let pod_ns = NetNs::create("pod").unwrap();
    let pod = PodSandbox::new(&pod_ns, "shop", "web-0", "uid-web-0");

    let added = network.add(&pod).unwrap();
    assert!(
        added.plugin.success,
        "ADD failed: {} {}",
        added.plugin.stdout, added.plugin.stderr
    );
    assert_eq!(
        added.plugin.json().unwrap(),
        added.bridge_result,
        "prevResult passes through unchanged"
    );

    let rules = our_rules(&pod_ns);
    let has = |needle: &str| rules.iter().any(|rule| rule.contains(needle));
    assert!(
        has("-A OUTPUT -j ISTIO_OUTPUT") && has("-A PREROUTING -j ISTIO_PRERT"),
        "{rules:#?}"
    );
    assert!(
        rules
            .iter()
            .any(|r| r.starts_with("-A ISTIO_OUTPUT") && r.contains("--to-ports 15001")),
        "{rules:#?}"
    );
    assert!(
        rules.iter().any(|r| r.starts_with("-A ISTIO_PRERT")
            && r.contains("--dport 15008")
            && r.contains("--to-ports 15006")),
        "{rules:#?}"
    );
    assert!(
        has("-m mark --mark 0x539/0xfff -j CONNMARK --set-xmark 0x111/0xfff"),
        "{rules:#?}"
    );
    assert!(
        has("-m connmark --mark 0x111/0xfff -j CONNMARK --restore-mark"),
        "{rules:#?}"
    );
    assert!(
        has("-s 169.254.7.127/32 -p tcp -m tcp -j ACCEPT"),
        "{rules:#?}"
    );
    assert!(!has("15053"), "DNS capture is off by default: {rules:#?}");
    let ip_rules = our_ip_rules(&pod_ns);
    assert_eq!(ip_rules.len(), 1, "{ip_rules:?}");
    assert!(
        ip_rules[0].contains("fwmark 0x111/0xfff lookup 100"),
        "{ip_rules:?}"
    );
    assert!(
        table_100(&pod_ns).contains("local default dev lo"),
        "{}",
        table_100(&pod_ns)
    );

    // The runtime may repeat ADD; rules must not pile up.
    let config = network.plugin_config(Some(&added.bridge_result));
    let again = network.run_plugin("ADD", &pod, &config).unwrap();
    assert!(again.success, "{}", again.stdout);
    assert_eq!(our_rules(&pod_ns), rules);
    assert_eq!(our_ip_rules(&pod_ns).len(), 1);

    let checked = network.check(&pod, &added.bridge_result).unwrap();
    assert!(checked.success, "CHECK: {}", checked.stdout);

    let deleted = network.del(&pod).unwrap();
    assert!(deleted.success, "DEL: {}", deleted.stdout);
    assert_eq!(our_rules(&pod_ns), Vec::<String>::new());
    assert_eq!(our_ip_rules(&pod_ns), Vec::<String>::new());
    assert_eq!(table_100(&pod_ns).trim(), "");

    let checked = network.check(&pod, &added.bridge_result).unwrap();
    assert!(!checked.success, "CHECK after DEL must fail");
    assert_eq!(checked.json().unwrap()["code"], 101);
    let repeated = network
        .run_plugin("DEL", &pod, &network.plugin_config(None))
        .unwrap();
    assert!(
        repeated.success,
        "a repeated DEL succeeds: {}",
        repeated.stdout
    );
}

#[test]
fn pods_outside_ambient_namespaces_pass_through_untouched() {
    skip_unless_available!();
    // No agent listens: contacting it would fail the ADD.
    let node = Node::new(PODS);
    for (namespace, name, ambient) in [
        ("other", "db-0", &["shop"][..]),
        ("kube-system", "dns-0", &["*"][..]),
    ] {
        let network = node.network("198.18.11.0/24").ambient_namespaces(ambient);
        let pod_ns = NetNs::create("pod").unwrap();
        let pod = PodSandbox::new(&pod_ns, namespace, name, "uid");
        let added = network.add(&pod).unwrap();
        assert!(added.plugin.success, "{namespace}: {}", added.plugin.stdout);
        assert_eq!(added.plugin.json().unwrap(), added.bridge_result);
        assert_eq!(our_rules(&pod_ns), Vec::<String>::new());
        assert!(network.check(&pod, &added.bridge_result).unwrap().success);
        assert!(network.del(&pod).unwrap().success);
    }
}

#[test]
fn unreachable_agent_fails_add_and_not_del() {
    skip_unless_available!();
    let node = Node::new(PODS);
    let network = node.network("198.18.12.0/24");
    let pod_ns = NetNs::create("pod").unwrap();
    let pod = PodSandbox::new(&pod_ns, "shop", "web-0", "uid-web-0");
    let added = network.add(&pod).unwrap();
    assert!(!added.plugin.success, "ADD must fail without an agent");
    let error = added.plugin.json().unwrap();
    assert_eq!(error["code"], 11, "{error}");
    assert_eq!(error["cniVersion"], "1.0.0");
    assert!(error["msg"].as_str().is_some_and(|msg| !msg.is_empty()));
    assert!(
        error["details"]
            .as_str()
            .unwrap()
            .contains("pluginevent.sock"),
        "{error}"
    );
    let deleted = network.del(&pod).unwrap();
    assert!(
        deleted.success,
        "DEL succeeds without an agent: {}",
        deleted.stdout
    );
    assert!(
        deleted.stderr.contains("DEL of pod shop/web-0"),
        "{}",
        deleted.stderr
    );
}

#[test]
fn pod_missing_from_registry_fails_add() {
    skip_unless_available!();
    let node = Node::new(
        "- {name: web-1, namespace: shop, uid: uid-web-1, serviceAccount: web, nodeName: node-b}\n",
    );
    let _agent = Agent::start(node.config());
    let network = node.network("198.18.13.0/24");
    for (name, uid, reason) in [
        ("web-0", "uid-web-0", "not in the pod registry"),
        ("web-1", "uid-web-1", "is on node node-b"),
    ] {
        let pod_ns = NetNs::create("pod").unwrap();
        let pod = PodSandbox::new(&pod_ns, "shop", name, uid);
        let added = network.add(&pod).unwrap();
        assert!(!added.plugin.success, "ADD of {name} must fail");
        let error = added.plugin.json().unwrap();
        assert_eq!(error["code"], 100, "{error}");
        assert!(
            error["details"].as_str().unwrap().contains(reason),
            "{error}"
        );
        assert_eq!(our_rules(&pod_ns), Vec::<String>::new());
        assert!(network.del(&pod).unwrap().success);
    }
}

#[test]
fn bad_plugin_event_bodies_are_refused() {
    skip_unless_available!();
    let node = Node::new(PODS);
    let _agent = Agent::start(node.config());
    let socket = node.plugin_socket();
    let cases: [(&str, &str, &[u8], u16); 7] = [
        ("POST", "/cmdadd", b"", 400),
        ("POST", "/cmdadd", b"{not json", 400),
        ("POST", "/cmdadd", br#"{"PodName": 1}"#, 400),
        ("POST", "/cmddel", b"", 400),
        (
            "POST",
            "/cmdadd",
            br#"{"Netns":"/nonexistent","PodName":"nope","PodNamespace":"shop","IPs":[]}"#,
            500,
        ),
        ("GET", "/pods/shop/web-0", b"", 404),
        ("GET", "/cmdadd", b"", 405),
    ];
    for (method, path, body, want) in cases {
        let (status, text) = http(&socket, method, path, body);
        assert_eq!(
            status,
            want,
            "{method} {path} {}: {text}",
            String::from_utf8_lossy(body)
        );
    }
    let oversized = vec![b' '; 128 * 1024];
    let (status, _) = http(&socket, "POST", "/cmdadd", &oversized);
    assert_ne!(status, 200);
    let (status, _) = http(
        &socket,
        "POST",
        "/cmddel",
        br#"{"PodName":"ghost","PodNamespace":"shop"}"#,
    );
    assert_eq!(status, 200, "deleting an unknown pod is fine");
}

#[test]
fn zds_snapshot_then_live_add_and_del() {
    skip_unless_available!();
    let node = Node::new(PODS);
    let _agent = Agent::start(node.config());
    let network = node.network("198.18.14.0/24");
    let first_ns = NetNs::create("pod").unwrap();
    let first = PodSandbox::new(&first_ns, "shop", "web-0", "uid-web-0");
    let added = network.add(&first).unwrap();
    assert!(added.plugin.success, "{}", added.plugin.stdout);

    let ztunnel = FakeZtunnel::connect(&node.zds_socket());
    let snapshot = ztunnel.read_snapshot();
    assert_eq!(snapshot.len(), 1);
    let Payload::Add(add) = &snapshot[0].payload else {
        panic!("expected add")
    };
    assert_eq!(add.uid, "uid-web-0");
    let info = add.workload_info.as_ref().unwrap();
    assert_eq!(
        (
            info.name.as_str(),
            info.namespace.as_str(),
            info.service_account.as_str()
        ),
        ("web-0", "shop", "web")
    );
    assert_eq!(snapshot[0].fds.len(), 1);
    assert_eq!(fd_identity(&snapshot[0].fds[0]), netns_identity(&first));

    // A live add goes to the connected ztunnel; the plugin waits for the ack.
    let second_ns = NetNs::create("pod").unwrap();
    let second = PodSandbox::new(&second_ns, "shop", "web-1", "uid-web-1");
    let (live, second_identity) = std::thread::scope(|scope| {
        let plugin = scope.spawn(|| network.add(&second).unwrap());
        let received = ztunnel.receive_and_ack();
        let outcome = plugin.join().unwrap();
        assert!(outcome.plugin.success, "{}", outcome.plugin.stdout);
        (received, netns_identity(&second))
    });
    let Payload::Add(add) = &live.payload else {
        panic!("expected a live add")
    };
    assert_eq!(add.uid, "uid-web-1");
    assert_eq!(live.fds.len(), 1);
    assert_eq!(fd_identity(&live.fds[0]), second_identity);

    // A DEL reaches ztunnel as del with the uid and no fd.
    assert!(network.del(&first).unwrap().success);
    let deleted = ztunnel.receive_and_ack();
    let Payload::Del(del) = &deleted.payload else {
        panic!("expected del")
    };
    assert_eq!(del.uid, "uid-web-0");
    assert!(deleted.fds.is_empty());

    // A NACK fails the ADD, so the pod does not start outside the mesh.
    let third_ns = NetNs::create("pod").unwrap();
    let third = PodSandbox::new(&third_ns, "shop", "web-0", "uid-web-0");
    let refused = std::thread::scope(|scope| {
        let plugin = scope.spawn(|| network.add(&third).unwrap());
        let received = ztunnel.receive();
        assert!(matches!(received.payload, Payload::Add(_)));
        ztunnel.answer("failure to start proxy : test");
        plugin.join().unwrap()
    });
    assert!(!refused.plugin.success);
    assert!(
        refused
            .plugin
            .stdout
            .contains("failure to start proxy : test"),
        "{}",
        refused.plugin.stdout
    );
}

#[test]
fn restarted_agent_resnapshots_persisted_pods_and_prunes_gone_ones() {
    skip_unless_available!();
    let node = Node::new(PODS);
    let network = node.network("198.18.15.0/24");
    let kept_ns = NetNs::create("pod").unwrap();
    let kept = PodSandbox::new(&kept_ns, "shop", "web-0", "uid-web-0");
    let gone_ns = NetNs::create("pod").unwrap();
    let gone = PodSandbox::new(&gone_ns, "shop", "web-1", "uid-web-1");
    let agent = Agent::start(node.config());
    assert!(network.add(&kept).unwrap().plugin.success);
    assert!(network.add(&gone).unwrap().plugin.success);
    agent.stop();
    assert!(
        !node.plugin_socket().exists() && !node.zds_socket().exists(),
        "sockets are removed on shutdown"
    );
    // The sandbox vanishes while the agent is down; its DEL never arrives.
    drop(gone_ns);

    let _agent = Agent::start(node.config());
    let ztunnel = FakeZtunnel::connect(&node.zds_socket());
    let snapshot = ztunnel.read_snapshot();
    let uids: Vec<&str> = snapshot
        .iter()
        .map(|received| match &received.payload {
            Payload::Add(add) => add.uid.as_str(),
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    assert_eq!(uids, ["uid-web-0"]);
    assert_eq!(fd_identity(&snapshot[0].fds[0]), netns_identity(&kept));
    let stored: Value =
        serde_json::from_slice(&std::fs::read(node.dir.path().join("state/pods.json")).unwrap())
            .unwrap();
    assert_eq!(stored.as_array().map(Vec::len), Some(1), "{stored}");
}

#[test]
fn ipv6_pods_get_ip6tables_rules_and_policy_routing_too() {
    skip_unless_available!();
    let pod_ns = NetNs::create("pod6").unwrap();
    if let Err(error) = pod_ns.exec(&["ip6tables-save"]) {
        skip(format_args!("ip6tables does not work here: {error:#}"));
        return;
    }
    let path = pod_ns.path();
    let settings = AgentConfig::with_registry(PathBuf::new()).rules;
    let ips = [
        "198.18.16.2".parse().unwrap(),
        "fd00:198:18::2".parse().unwrap(),
    ];
    let v6_rules = || {
        let saved = pod_ns.exec(&["ip6tables-save"]).unwrap();
        String::from_utf8_lossy(&saved.stdout)
            .lines()
            .filter(|line| line.contains("ISTIO"))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let v6_ip_rules = || {
        let rules = pod_ns.exec(&["ip", "-6", "rule", "show"]).unwrap();
        String::from_utf8_lossy(&rules.stdout)
            .lines()
            .filter(|line| line.starts_with("32764:"))
            .count()
    };

    agent::rules::install(&path, &ips, &settings).unwrap();
    agent::rules::install(&path, &ips, &settings).unwrap();
    let rules = v6_rules();
    assert!(
        rules
            .iter()
            .any(|r| r.contains("! -d ::1/128") && r.contains("--to-ports 15001")),
        "{rules:#?}"
    );
    assert!(
        rules
            .iter()
            .any(|r| r.contains("-s fd16:9254:7127:1337:ffff:ffff:ffff:ffff/128")),
        "{rules:#?}"
    );
    assert_eq!(
        our_rules(&pod_ns).len(),
        rules.len(),
        "the same rules for both families"
    );
    assert_eq!(v6_ip_rules(), 1);
    let routes = pod_ns
        .exec(&["ip", "-6", "route", "show", "table", "100"])
        .unwrap();
    assert!(String::from_utf8_lossy(&routes.stdout).contains("local default dev lo"));

    agent::rules::remove(&path).unwrap();
    assert_eq!(v6_rules(), Vec::<String>::new());
    assert_eq!(our_rules(&pod_ns), Vec::<String>::new());
    assert_eq!(v6_ip_rules(), 0);

    // A pod without IPv6 gets no ip6tables rules.
    agent::rules::install(&path, &ips[..1], &settings).unwrap();
    assert_eq!(v6_rules(), Vec::<String>::new());
    assert!(!our_rules(&pod_ns).is_empty());
}

#[test]
fn a_pod_whose_netns_vanished_is_dropped_from_the_snapshot_and_the_record() {
    skip_unless_available!();
    let node = Node::new(PODS);
    let _agent = Agent::start(node.config());
    let network = node.network("198.18.17.0/24");
    let kept_ns = NetNs::create("pod").unwrap();
    let kept = PodSandbox::new(&kept_ns, "shop", "web-0", "uid-web-0");
    let gone_ns = NetNs::create("pod").unwrap();
    let gone = PodSandbox::new(&gone_ns, "shop", "web-1", "uid-web-1");
    assert!(network.add(&kept).unwrap().plugin.success);
    assert!(network.add(&gone).unwrap().plugin.success);
    // The sandbox vanishes while the agent runs, and its DEL never arrives.
    drop(gone_ns);

    let ztunnel = FakeZtunnel::connect(&node.zds_socket());
    let snapshot = ztunnel.read_snapshot();
    let uids: Vec<&str> = snapshot
        .iter()
        .map(|received| match &received.payload {
            Payload::Add(add) => add.uid.as_str(),
            other => panic!("unexpected {other:?} (no keep for a vanished netns)"),
        })
        .collect();
    assert_eq!(uids, ["uid-web-0"]);
    let stored: Value =
        serde_json::from_slice(&std::fs::read(node.dir.path().join("state/pods.json")).unwrap())
            .unwrap();
    assert_eq!(stored.as_array().map(Vec::len), Some(1), "{stored}");
    let (status, _) = http(&node.plugin_socket(), "GET", "/pods/shop/web-1", b"");
    assert_eq!(status, 404, "the vanished pod is no longer in the mesh");
}

#[test]
fn an_add_ztunnel_never_acks_fails_with_the_agents_reason_within_the_plugins_budget() {
    skip_unless_available!();
    let node = Node::new(PODS);
    let _agent = Agent::start(node.config());
    let network = node.network("198.18.18.0/24");
    let ztunnel = FakeZtunnel::connect(&node.zds_socket());
    assert!(ztunnel.read_snapshot().is_empty());

    let pod_ns = NetNs::create("pod").unwrap();
    let pod = PodSandbox::new(&pod_ns, "shop", "web-0", "uid-web-0");
    let started = Instant::now();
    let added = std::thread::scope(|scope| {
        let plugin = scope.spawn(|| network.add(&pod).unwrap());
        // Received, never answered.
        let received = ztunnel.receive();
        assert!(matches!(received.payload, Payload::Add(_)));
        plugin.join().unwrap()
    });
    assert!(!added.plugin.success, "an unacked add fails");
    let error = added.plugin.json().unwrap();
    assert_eq!(
        error["code"], 100,
        "the agent's answer, not the plugin's timeout: {error}"
    );
    assert!(
        error["details"].as_str().unwrap().contains("did not ack"),
        "{error}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    // The pod is recorded and its rules stay: the next snapshot carries it.
    assert!(!our_rules(&pod_ns).is_empty());
    let (status, _) = http(&node.plugin_socket(), "GET", "/pods/shop/web-0", b"");
    assert_eq!(status, 200);
}
