//! A two-node mesh for end-to-end tests: namespaces `a` (client node,
//! 198.18.0.1) and `b` (server node, 198.18.0.2) joined by a veth pair, a real
//! CA in `a`, one dedicated `ztunnel` process per node, an iptables REDIRECT
//! of the client's outbound TCP to 15001 that skips the proxy's mark, and a
//! local config file both proxies read.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use ztunnel_test_support::ca::{PodRef, TestCa};
use ztunnel_test_support::netns::{self, NetNs};

pub const CLIENT_IP: &str = "198.18.0.1";
pub const SERVER_IP: &str = "198.18.0.2";
/// A second address on node b that no workload has: an unknown destination.
pub const OUTSIDE_IP: &str = "198.18.0.3";
pub const MARK: &str = "1337";

const PODS: &str = "\
- {name: client, namespace: default, uid: uid-client, serviceAccount: client, nodeName: node-a, phase: Running}
- {name: server, namespace: default, uid: uid-server, serviceAccount: server, nodeName: node-b, phase: Running}
";

/// The local config file; `policies` is appended.
pub fn config(policies: &str) -> String {
    format!(
        "\
workloads:
- uid: uid-client
  name: client
  namespace: default
  serviceAccount: client
  workloadIps: [{CLIENT_IP}]
  protocol: HBONE
  node: node-a
  services: {{}}
- uid: uid-server
  name: server
  namespace: default
  serviceAccount: server
  workloadIps: [{SERVER_IP}]
  protocol: HBONE
  node: node-b
  services:
    default/echo.default.svc.cluster.local: {{80: 8080}}
- uid: uid-legacy
  name: legacy
  namespace: default
  workloadIps: [198.18.0.4]
  protocol: TCP
  services: {{}}
services:
- name: echo
  namespace: default
  hostname: echo.default.svc.cluster.local
  vips: [\"/198.19.0.10\"]
  ports: {{80: 8080}}
{policies}"
    )
}

/// Kills a child process on drop, by its own handle.
pub struct Process(pub Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub struct Mesh {
    // Field order is drop order: processes first, then the CA, then the
    // namespaces they live in.
    pub _ztunnel_a: Process,
    pub _ztunnel_b: Process,
    pub ca: TestCa,
    pub dir: tempfile::TempDir,
    pub a: NetNs,
    pub b: NetNs,
}

impl Mesh {
    /// Builds the topology and waits until both proxies are ready. `None`
    /// (after printing why) where this machine cannot build namespaces.
    pub fn start(test: &str, policies: &str) -> Option<Mesh> {
        if let Some(reason) = netns::unavailable() {
            eprintln!("SKIPPED {test}: {reason}");
            return None;
        }
        let a = NetNs::create("a").unwrap();
        let b = NetNs::create("b").unwrap();
        netns::veth_pair(
            &a,
            &format!("{CLIENT_IP}/24"),
            &b,
            &format!("{SERVER_IP}/24"),
        )
        .unwrap();
        let b_if = String::from_utf8(
            b.exec(&["ip", "-o", "link", "show", "type", "veth"])
                .unwrap()
                .stdout,
        )
        .unwrap();
        let b_if = b_if
            .split(':')
            .nth(1)
            .unwrap()
            .trim()
            .split('@')
            .next()
            .unwrap()
            .to_owned();
        b.exec(&[
            "ip",
            "addr",
            "add",
            &format!("{OUTSIDE_IP}/24"),
            "dev",
            &b_if,
        ])
        .unwrap();
        b.exec(&["ip", "addr", "add", "198.18.0.4/24", "dev", &b_if])
            .unwrap();
        // The client's outbound TCP leaving the node goes to the proxy,
        // except the proxy's own (marked) sockets.
        a.exec(&[
            "iptables",
            "-t",
            "nat",
            "-A",
            "OUTPUT",
            "-p",
            "tcp",
            "!",
            "-o",
            "lo",
            "-m",
            "mark",
            "!",
            "--mark",
            MARK,
            "-j",
            "REDIRECT",
            "--to-ports",
            "15001",
        ])
        .unwrap();

        let ca = TestCa::start(
            &a,
            format!("{CLIENT_IP}:15012").parse().unwrap(),
            "cluster.local",
            PODS,
        )
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        for node in ["client", "server"] {
            std::fs::write(dir.path().join(format!("{node}.yaml")), config(policies)).unwrap();
        }
        let pod = |name, uid, node| PodRef {
            namespace: "default",
            service_account: name,
            name,
            uid,
            node: Some(node),
        };
        ca.write_token(
            &pod("client", "uid-client", "node-a"),
            &dir.path().join("client.token"),
        )
        .unwrap();
        ca.write_token(
            &pod("server", "uid-server", "node-b"),
            &dir.path().join("server.token"),
        )
        .unwrap();
        let ztunnel_a = spawn(&a, &ca, dir.path(), "client");
        let ztunnel_b = spawn(&b, &ca, dir.path(), "server");
        let mesh = Mesh {
            _ztunnel_a: ztunnel_a,
            _ztunnel_b: ztunnel_b,
            ca,
            dir,
            a,
            b,
        };
        mesh.wait_ready(&mesh.a, CLIENT_IP);
        mesh.wait_ready(&mesh.b, SERVER_IP);
        Some(mesh)
    }

    /// Rewrites both proxies' local config files.
    pub fn set_config(&self, text: &str) {
        self.set_node_config("client", text);
        self.set_node_config("server", text);
    }

    /// Rewrites one proxy's local config file (`client` or `server`).
    pub fn set_node_config(&self, node: &str, text: &str) {
        let path: PathBuf = self.dir.path().join(format!("{node}.yaml"));
        std::fs::write(path, text).unwrap();
    }

    fn wait_ready(&self, ns: &NetNs, ip: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let answer = http_get(ns, &format!("{ip}:15021"), "/healthz/ready");
            if answer
                .as_deref()
                .is_some_and(|text| text.starts_with("HTTP/1.1 200"))
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{ip} never became ready: {answer:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A TCP connection made by the client workload (inside node a).
    pub fn client_connect(&self, addr: &str) -> std::io::Result<TcpStream> {
        let addr: SocketAddr = addr.parse().unwrap();
        self.a
            .run(move || TcpStream::connect_timeout(&addr, Duration::from_secs(5)))
            .unwrap()
    }

    /// The metrics text of the proxy in `ns`.
    pub fn metrics(&self, ns: &NetNs, ip: &str) -> String {
        http_get(ns, &format!("{ip}:15020"), "/metrics").unwrap_or_default()
    }
}

fn spawn(ns: &NetNs, ca: &TestCa, dir: &Path, workload: &str) -> Process {
    let log = std::fs::File::create(dir.join(format!("{workload}.log"))).unwrap();
    let child = ns
        .command(env!("CARGO_BIN_EXE_ztunnel"))
        .env_clear()
        .env("PROXY_MODE", "dedicated")
        .env(
            "PROXY_WORKLOAD_INFO",
            format!("default/{workload}/{workload}"),
        )
        .env("LOCAL_XDS_PATH", dir.join(format!("{workload}.yaml")))
        .env("CA_ADDRESS", ca.address())
        .env("CA_ROOT_CA", ca.root_cert_path())
        .env("AUTH_TOKEN", dir.join(format!("{workload}.token")))
        .env("PACKET_MARK", MARK)
        .env("ZTUNNEL_WORKER_THREADS", "1")
        .env("RUST_LOG", "info,access=debug")
        .env("LOG_FORMAT", "json")
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    Process(child)
}

/// A bare HTTP/1.1 GET from inside `ns`; `None` when nothing answers.
pub fn http_get(ns: &NetNs, addr: &str, path: &str) -> Option<String> {
    let addr: SocketAddr = addr.parse().ok()?;
    let path = path.to_owned();
    ns.run(move || {
        let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
        )
        .ok()?;
        let mut text = String::new();
        stream.read_to_string(&mut text).ok()?;
        Some(text)
    })
    .ok()
    .flatten()
}
