//! Network namespaces that clean up after themselves, veth pairs between
//! them, running code or processes inside one (and HTTP GETs to its
//! loopback), and forwarding a port inside one to a server on this
//! process's own loopback.
//!
//! Every namespace gets a unique name (`zt-<tag>-<pid>-<n>`) and is deleted
//! on drop, also when a test fails, so runs never collide or leak.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};
use nix::sched::{CloneFlags, setns};

/// Tells why end-to-end tests cannot run here, if they cannot: they need
/// root (CAP_NET_ADMIN, CAP_SYS_ADMIN), `ip` and `iptables`. Tests skip
/// with the reason ([`crate::skip::skip`]); CI runs as root with both
/// installed, where a skip is a failure.
pub fn unavailable() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("not root: network namespaces need CAP_NET_ADMIN and CAP_SYS_ADMIN".into());
    }
    for tool in ["ip", "iptables"] {
        if !installed(tool) {
            return Some(format!(
                "`{tool}` is not installed (apt-get install iproute2 iptables)"
            ));
        }
    }
    None
}

/// Whether `tool` can be run here (it answers `-V`, as iproute2, iptables
/// and util-linux tools do).
pub fn installed(tool: &str) -> bool {
    Command::new(tool)
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

/// Runs a command and fails with its stderr if it exits non-zero.
pub fn run(program: &str, args: &[&str]) -> anyhow::Result<Output> {
    let output = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("running {program}"))?;
    if !output.status.success() {
        bail!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(output)
}

/// A network namespace, deleted on drop.
#[derive(Debug)]
pub struct NetNs {
    name: String,
}

impl NetNs {
    /// Creates a namespace with loopback up.
    pub fn create(tag: &str) -> anyhow::Result<NetNs> {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!("zt-{tag}-{}-{n}", std::process::id());
        run("ip", &["netns", "add", &name])?;
        let ns = NetNs { name };
        ns.exec(&["ip", "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// The namespace's name, as `ip netns` knows it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The namespace's bind mount, `/run/netns/<name>`: what a runtime
    /// passes as `CNI_NETNS`, and what `setns` can open.
    pub fn path(&self) -> PathBuf {
        Path::new("/run/netns").join(&self.name)
    }

    /// Runs a command inside the namespace and waits for it.
    pub fn exec(&self, command: &[&str]) -> anyhow::Result<Output> {
        let mut args = vec!["netns", "exec", &self.name];
        args.extend_from_slice(command);
        run("ip", &args)
    }

    /// A command that will run inside the namespace; the caller adds
    /// arguments, environment and stdio, then spawns it.
    pub fn command(&self, program: &str) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.name, program]);
        command
    }

    /// Runs `f` on a new thread that has entered the namespace, and returns
    /// its result. Sockets created there belong to the namespace and may be
    /// used from any thread afterwards.
    pub fn run<F, R>(&self, f: F) -> anyhow::Result<R>
    where
        F: FnOnce() -> R + Send,
        R: Send,
    {
        let path = self.path();
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    let file =
                        File::open(&path).with_context(|| format!("opening {}", path.display()))?;
                    setns(&file, CloneFlags::CLONE_NEWNET).context("setns")?;
                    Ok(f())
                })
                .join()
                .map_err(|_| anyhow::anyhow!("thread in {} panicked", self.name))?
        })
    }

    /// An HTTP/1.1 GET to a port on the namespace's loopback, as a kubelet
    /// probe or an operator's `curl` there would send it: the status code
    /// and body.
    pub fn http_get(&self, port: u16, path: &str) -> anyhow::Result<(u16, String)> {
        self.http_get_from(SocketAddr::from(([127, 0, 0, 1], port)), path)
    }

    /// An HTTP/1.1 GET from inside the namespace to `addr` (e.g. a pod's
    /// metrics port, from its node): the status code and body.
    pub fn http_get_from(&self, addr: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
        let mut stream =
            self.run(move || TcpStream::connect_timeout(&addr, Duration::from_secs(2)))??;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n"
        )?;
        let mut response = String::new();
        stream.read_to_string(&mut response)?;
        let status = response
            .split(' ')
            .nth(1)
            .and_then(|code| code.parse().ok())
            .context("no HTTP status")?;
        let body = response
            .split_once("\r\n\r\n")
            .map(|(_, body)| body.to_owned())
            .unwrap_or_default();
        Ok((status, body))
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        // Deleting a namespace also removes the veth ends inside it.
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .stderr(Stdio::null())
            .status();
    }
}

/// A namespace's own resolv.conf, `/etc/netns/<ns>/resolv.conf`, which
/// `ip netns exec` mounts over /etc/resolv.conf for what it runs there;
/// its directory is removed when dropped.
pub struct ResolvConf(PathBuf);

impl ResolvConf {
    /// Writes `text` as namespace `ns`'s resolv.conf.
    pub fn write(ns: &str, text: &str) -> anyhow::Result<ResolvConf> {
        let dir = PathBuf::from("/etc/netns").join(ns);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let written = ResolvConf(dir);
        let path = written.0.join("resolv.conf");
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        Ok(written)
    }
}

impl Drop for ResolvConf {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Joins two namespaces with a veth pair, giving each end an address in
/// CIDR form (from 198.18.0.0/15) and bringing both up.
pub fn veth_pair(a: &NetNs, a_cidr: &str, b: &NetNs, b_cidr: &str) -> anyhow::Result<()> {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    // Interface names are at most 15 bytes; the namespace keeps them apart.
    let (a_if, b_if) = (
        format!("va{}x{n}", std::process::id() % 100_000),
        format!("vb{}x{n}", std::process::id() % 100_000),
    );
    run(
        "ip",
        &[
            "link",
            "add",
            &a_if,
            "netns",
            a.name(),
            "type",
            "veth",
            "peer",
            "name",
            &b_if,
            "netns",
            b.name(),
        ],
    )?;
    for (ns, interface, cidr) in [(a, &a_if, a_cidr), (b, &b_if, b_cidr)] {
        ns.exec(&["ip", "addr", "add", cidr, "dev", interface])?;
        ns.exec(&["ip", "link", "set", interface, "up"])?;
    }
    Ok(())
}

/// Connections to a loopback address inside a namespace, carried to the
/// same address in this process's namespace: a process in the namespace
/// reaches a server on the host's loopback (the test API server) at the
/// address the server's certificate names, and no interface of the host
/// changes. Stops on drop, closing every connection.
pub struct PortForward {
    runtime: Option<tokio::runtime::Runtime>,
}

impl PortForward {
    /// Listens on `target` (a loopback address) inside `ns`, and carries
    /// each connection to `target` outside it.
    pub fn to_host(ns: &NetNs, target: SocketAddr) -> anyhow::Result<PortForward> {
        Self::listen_in(ns, target, target)
    }

    /// Listens on `listen` (any address of the namespace's) inside `ns`,
    /// and carries each connection to `target` outside it: how a real
    /// cluster's nodes reach the test API server on this process's
    /// loopback.
    pub fn listen_in(
        ns: &NetNs,
        listen: SocketAddr,
        target: SocketAddr,
    ) -> anyhow::Result<PortForward> {
        let listener = ns
            .run(move || std::net::TcpListener::bind(listen))?
            .with_context(|| format!("binding {listen} in {}", ns.name()))?;
        listener.set_nonblocking(true)?;
        // Its threads are made here, in this process's namespace, so the
        // connections out start from there.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("port-forward")
            .enable_all()
            .build()?;
        let listener = {
            let _entered = runtime.enter();
            tokio::net::TcpListener::from_std(listener)?
        };
        runtime.spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    // Out of descriptors, or a connection reset before it
                    // was accepted: try again shortly.
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                };
                tokio::spawn(async move {
                    // A refused connection (the server is down) closes the
                    // client's, as the server's absence would.
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        Ok(PortForward {
            runtime: Some(runtime),
        })
    }
}

impl Drop for PortForward {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}
