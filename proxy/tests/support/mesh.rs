//! A two-node mesh for end-to-end tests: namespaces `a` (client node,
//! 198.18.0.1) and `b` (server node, 198.18.0.2) joined by a veth pair, a real
//! CA in `a`, one dedicated `ztunnel` process per node, an iptables REDIRECT
//! of the client's outbound TCP to 15001 that skips the proxy's mark, and a
//! local config file both proxies read.

// Each test file uses its own part of this.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use ztunnel_test_support::ca::{PodRef, TestCa};
use ztunnel_test_support::netns::{self, NetNs};
use ztunnel_test_support::skip::skip;
use ztunnel_test_support::wait;

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
  locality: {{region: eu, zone: eu-1}}
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

impl Process {
    /// Sends SIGTERM, as kubelet does to stop a pod.
    pub fn terminate(&self) {
        let pid = Pid::from_raw(i32::try_from(self.0.id()).unwrap());
        kill(pid, Signal::SIGTERM).unwrap();
    }

    /// How it exited, if it does within `within`.
    pub fn exit_within(&mut self, within: Duration) -> Option<ExitStatus> {
        let mut status = None;
        wait::until(within, || {
            status = self.0.try_wait().unwrap();
            status.is_some()
        });
        status
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub struct Mesh {
    // Field order is drop order: processes first, then the CA, then the
    // namespaces they live in.
    pub ztunnel_a: Process,
    pub ztunnel_b: Process,
    pub ca: TestCa,
    pub dir: tempfile::TempDir,
    pub a: NetNs,
    pub b: NetNs,
}

impl Mesh {
    /// Builds the topology and waits until both proxies are ready. `None`
    /// (skipped, with the reason) where this machine cannot build
    /// namespaces.
    pub fn start(test: &str, policies: &str) -> Option<Mesh> {
        Mesh::start_with_env(test, policies, &[])
    }

    /// [`Mesh::start`], with `env` set on both proxies over the mesh's own.
    pub fn start_with_env(test: &str, policies: &str, env: &[(&str, &str)]) -> Option<Mesh> {
        if let Some(reason) = netns::unavailable() {
            skip(format_args!("{test}: {reason}"));
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
        let ztunnel_a = spawn(&a, &ca, dir.path(), "client", env);
        let ztunnel_b = spawn(&b, &ca, dir.path(), "server", env);
        let mesh = Mesh {
            ztunnel_a,
            ztunnel_b,
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
        // Renamed into place: a truncating write lets a reload read the
        // file half written, and the proxy keeps what it read.
        let staged = self.dir.path().join(format!("{node}.yaml.new"));
        std::fs::write(&staged, text).unwrap();
        std::fs::rename(staged, path).unwrap();
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

    /// The proxy of `workload` (`client` or `server`).
    pub fn ztunnel(&mut self, workload: &str) -> &mut Process {
        match workload {
            "client" => &mut self.ztunnel_a,
            "server" => &mut self.ztunnel_b,
            other => panic!("no workload {other}"),
        }
    }

    /// The log of the proxy of `workload` (`client` or `server`).
    pub fn log(&self, workload: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("{workload}.log"))).unwrap_or_default()
    }

    /// Serves echo on `addr` inside node b: each connection gets its bytes
    /// back, and a write shutdown once the client's write side ends.
    /// Returns a channel of the peer addresses seen.
    pub fn echo_server(&self, addr: &str) -> std::sync::mpsc::Receiver<SocketAddr> {
        let addr: SocketAddr = addr.parse().unwrap();
        let listener = self
            .b
            .run(move || TcpListener::bind(addr))
            .unwrap()
            .unwrap();
        let (peers, seen) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // Bounded: the listener closes with the test process.
            for stream in listener.incoming().take(64) {
                let Ok(stream) = stream else { return };
                let _ = peers.send(stream.peer_addr().unwrap());
                std::thread::spawn(move || {
                    let mut reader = stream.try_clone().unwrap();
                    let mut writer = stream;
                    let _ = std::io::copy(&mut reader, &mut writer);
                    let _ = writer.shutdown(Shutdown::Write);
                });
            }
        });
        seen
    }

    /// The metrics text of the proxy in `ns`.
    pub fn metrics(&self, ns: &NetNs, ip: &str) -> String {
        http_get(ns, &format!("{ip}:15020"), "/metrics").unwrap_or_default()
    }
}

fn spawn(ns: &NetNs, ca: &TestCa, dir: &Path, workload: &str, env: &[(&str, &str)]) -> Process {
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
        .envs(env.iter().copied())
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

/// A policy allowing only the client's identity.
pub const ALLOW_CLIENT: &str = "\
policies:
- name: allow-client
  namespace: default
  scope: Namespace
  action: Allow
  rules:
  - - - principals: [!Exact \"cluster.local/ns/default/sa/client\"]
";

/// A policy allowing an identity nobody has.
pub const ALLOW_NOBODY: &str = "\
policies:
- name: allow-nobody
  namespace: default
  scope: Namespace
  action: Allow
  rules:
  - - - principals: [!Exact \"cluster.local/ns/default/sa/nobody\"]
";

/// Sends `data`, half-closes, and reads the whole echo.
pub fn round_trip(stream: TcpStream, data: Vec<u8>) -> Vec<u8> {
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut writer = stream.try_clone().unwrap();
    // A refused connection fails the write or the read; the caller sees
    // fewer bytes than it sent.
    let sender = std::thread::spawn(move || {
        let _ = writer.write_all(&data);
        let _ = writer.shutdown(Shutdown::Write);
    });
    let mut reader = stream;
    let mut echoed = Vec::new();
    let _ = reader.read_to_end(&mut echoed);
    let _ = sender.join();
    echoed
}

/// Whether a connection from the client to `addr` echoes `ping`.
pub fn ping(mesh: &Mesh, addr: &str) -> bool {
    match mesh.client_connect(addr) {
        Ok(stream) => round_trip(stream, b"ping".to_vec()) == b"ping",
        Err(_) => false,
    }
}

/// Waits up to 10 s for `check`, polling.
pub fn eventually(check: impl FnMut() -> bool) -> bool {
    wait::until(Duration::from_secs(10), check)
}
