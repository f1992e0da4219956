//! One real node: a network namespace on the fabric, and a PID and mount
//! namespace of its own whose first process (the node's "init") holds the
//! node's private mounts. containerd, kubelet and kube-proxy run inside
//! all three namespaces, as on a machine of their own. What each of them
//! is configured with is `containerd.rs`, `kubelet.rs` and `proxy.rs`;
//! this file owns the namespaces, the directories and the teardown.
//!
//! Why each namespace:
//! - network: the node's address on the fabric, its pod bridge, its
//!   iptables (kube-proxy's and the node agent's) apart from the other
//!   node's. Entered with `nsenter --net`, not `ip netns exec`, which
//!   remounts /sys and hides the cgroup hierarchies.
//! - mount: tmpfs over /run, /opt and /etc/cni, and directories of the
//!   test's over /var/lib and /var/log, because some kubelet and containerd
//!   paths ignore their root flags, and the node agent's host paths
//!   (`/opt/cni/bin`, `/etc/cni/net.d`, `/var/run/ztunnel`, `/var/run/netns`)
//!   must be this node's alone.
//! - PID: the node agent scans `/host/proc` for pods and enters
//!   `/host/proc/1/ns/net` as the host's network; here PID 1 is the
//!   node's init, in the node's netns. Killing the init (by the PID we
//!   started it with) ends every process of the node, containers too.
//!
//! The kubelet's cgroups live under a root of the node's own
//! (`cgroupRoot`), made beforehand in every hierarchy: one kubelet's orphan
//! cleanup would otherwise kill the other node's pods. They are removed
//! depth-first once the node's processes are gone.

use std::fs::File;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::netns::NetNs;
use crate::wait;

/// The cgroup hierarchies of this machine kind: cgroup v1 controllers and
/// the named systemd one, and the v2 tree runc joins too.
const CGROUP_HIERARCHIES: [&str; 10] = [
    "blkio", "cpu", "cpuacct", "cpuset", "devices", "freezer", "memory", "pids", "systemd",
    "unified",
];

/// The CNI plugins a node's pod network is made with (Debian's
/// containernetworking-plugins), copied into the node's `/opt/cni/bin`
/// where the node agent installs `ztunnel-cni` beside them.
const CNI_PLUGINS: [&str; 4] = ["bridge", "host-local", "loopback", "portmap"];

/// A running node.
pub struct Node {
    /// The node's name in the API (also its hostname override).
    pub name: String,
    /// Its address on the fabric.
    pub ip: Ipv4Addr,
    /// The subnet its pods get addresses from.
    pub pod_cidr: String,
    /// Its directory on this machine: the node's `/var/lib` and the
    /// components' configuration and logs.
    pub dir: PathBuf,
    netns: NetNs,
    cgroup_root: String,
    init: Option<Child>,
    /// The node's PID 1, as this machine's PID namespace sees it.
    init_pid: u32,
    /// Components started in the node, by name: the `nsenter` each runs
    /// under (whose PID we have), and its log.
    components: Vec<(String, Child)>,
}

impl Node {
    /// Makes the node's namespaces and directories. `netns` is already on
    /// the fabric with `ip`.
    pub fn create(
        name: &str,
        ip: Ipv4Addr,
        pod_cidr: &str,
        netns: NetNs,
        cluster_dir: &Path,
    ) -> anyhow::Result<Node> {
        let dir = cluster_dir.join(name);
        for sub in [
            "var-lib/kubelet",
            "var-lib/containerd",
            "var-lib/cni",
            "var-log",
            "logs",
        ] {
            std::fs::create_dir_all(dir.join(sub))?;
        }
        // The mount point for the node's /etc/cni tmpfs; a real node has
        // this directory. It stays empty here.
        std::fs::create_dir_all("/etc/cni")?;
        let cgroup_root = format!("zt-{}-{name}", std::process::id());
        for hierarchy in CGROUP_HIERARCHIES {
            let path = Path::new("/sys/fs/cgroup")
                .join(hierarchy)
                .join(&cgroup_root);
            std::fs::create_dir_all(&path)
                .with_context(|| format!("creating the cgroup {}", path.display()))?;
        }
        let mut node = Node {
            name: name.to_owned(),
            ip,
            pod_cidr: pod_cidr.to_owned(),
            dir,
            netns,
            cgroup_root,
            init: None,
            init_pid: 0,
            components: vec![],
        };
        node.start_init()?;
        Ok(node)
    }

    /// The node's network namespace.
    pub fn netns(&self) -> &NetNs {
        &self.netns
    }

    /// The cgroup root the node's kubelet puts its pods under.
    pub fn cgroup_root(&self) -> &str {
        &self.cgroup_root
    }

    /// A path inside the node's mount namespace, as this process reaches
    /// it (through the init's `/proc/<pid>/root`).
    pub fn path(&self, inside: &str) -> PathBuf {
        Path::new(&format!("/proc/{}/root", self.init_pid)).join(inside.trim_start_matches('/'))
    }

    fn start_init(&mut self) -> anyhow::Result<()> {
        let var_lib = self.dir.join("var-lib");
        let mut script = String::from("set -e\n");
        script += &format!("mount --bind '{}' /var/lib\n", var_lib.display());
        // Pods' logs stay readable after the node is gone (a failed test
        // keeps them with ZTUNNEL_KEEP_CLUSTER_FILES).
        script += &format!(
            "mount --bind '{}' /var/log\n",
            self.dir.join("var-log").display()
        );
        for tmpfs in ["/run", "/opt", "/etc/cni"] {
            script += &format!("mount -t tmpfs -o mode=0755 tmpfs {tmpfs}\n");
        }
        script += "mkdir -p /opt/cni/bin /etc/cni/net.d /run/netns\n";
        for plugin in CNI_PLUGINS {
            script += &format!("cp /usr/lib/cni/{plugin} /opt/cni/bin/\n");
        }
        script += &format!(
            "cat > /etc/cni/net.d/10-bridge.conflist <<'EOF'\n{}\nEOF\n",
            bridge_conflist(&self.pod_cidr)
        );
        // Mounts made from here on (containerd's pod netns files, kubelet's
        // volumes) propagate to the containers that ask for it
        // (`mountPropagation: HostToContainer`), as on a systemd host. The
        // peer groups are new ones of this namespace: nothing reaches the
        // machine's own mounts.
        script += "mount --make-rshared /\n";
        script += "touch /run/node-ready\n";
        // PID 1 of the namespace: reaps the orphans the shims leave, and
        // ends the node on SIGTERM.
        script += "trap 'exit 0' TERM\nwhile :; do sleep 3600 & wait $! || true; done\n";
        let log = File::create(self.dir.join("logs/init.log"))?;
        let child = Command::new("nsenter")
            .arg(format!("--net={}", self.netns.path().display()))
            .args([
                "--",
                "unshare",
                "--pid",
                "--fork",
                "--kill-child",
                "--mount",
                "--propagation",
                "private",
                "--mount-proc",
                "--",
                "sh",
                "-c",
                &script,
            ])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting the node's init (nsenter, unshare)")?;
        let unshare = child.id();
        self.init = Some(child);
        let ready = wait::until(Duration::from_secs(20), || {
            self.init_pid = first_child(unshare).unwrap_or(0);
            self.init_pid != 0 && self.path("/run/node-ready").exists()
        });
        if !ready {
            bail!(
                "node {}: its namespaces were not ready in 20 s: {}",
                self.name,
                self.log("init")
            );
        }
        Ok(())
    }

    /// Starts `program` with `args` inside the node's namespaces, its
    /// output in the node's log `name`.
    pub fn spawn(&mut self, name: &str, program: &Path, args: &[String]) -> anyhow::Result<()> {
        let log = File::create(self.dir.join(format!("logs/{name}.log")))?;
        let child = Command::new("nsenter")
            .arg(format!("--target={}", self.init_pid))
            .args(["--pid", "--mount", "--net", "--"])
            .arg(program)
            .args(args)
            .env("PATH", path_with(program))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {name} on {}", self.name))?;
        self.components.push((name.to_owned(), child));
        Ok(())
    }

    /// Runs `program` with `args` inside the node's namespaces and waits;
    /// its stdout, or an error with its output.
    pub fn run(&self, program: &Path, args: &[&str]) -> anyhow::Result<String> {
        let output = Command::new("nsenter")
            .arg(format!("--target={}", self.init_pid))
            .args(["--pid", "--mount", "--net", "--"])
            .arg(program)
            .args(args)
            .env("PATH", path_with(program))
            .output()
            .with_context(|| format!("running {} on {}", program.display(), self.name))?;
        if !output.status.success() {
            bail!(
                "{} {} on {}: {}{}",
                program.display(),
                args.join(" "),
                self.name,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// Fails with the component's log if it has exited.
    pub fn check_running(&mut self) -> anyhow::Result<()> {
        for (name, child) in &mut self.components {
            if let Some(status) = child.try_wait()? {
                let name = name.clone();
                bail!(
                    "{name} on {} exited ({status}): {}",
                    self.name,
                    self.log(&name)
                );
            }
        }
        Ok(())
    }

    /// The last lines of a component's log.
    pub fn log(&self, name: &str) -> String {
        let text =
            std::fs::read_to_string(self.dir.join(format!("logs/{name}.log"))).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// The whole log of a component.
    pub fn full_log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(format!("logs/{name}.log"))).unwrap_or_default()
    }

    /// Ends every process of the node and removes its cgroups. Safe to call
    /// twice.
    pub fn stop(&mut self) {
        // SIGTERM to the init (by the PID of the `unshare` we started,
        // whose --kill-child takes the init with it): the kernel then ends
        // every process of the PID namespace.
        if let Some(mut init) = self.init.take() {
            let _ = init.kill();
            let _ = init.wait();
        }
        for (_, mut child) in self.components.drain(..) {
            let _ = child.kill();
            let _ = child.wait();
        }
        // Processes of the namespace die asynchronously; their cgroups can
        // be removed once empty.
        let deadline = Instant::now() + Duration::from_secs(20);
        for hierarchy in CGROUP_HIERARCHIES {
            let root = Path::new("/sys/fs/cgroup")
                .join(hierarchy)
                .join(&self.cgroup_root);
            while remove_depth_first(&root).is_err() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The node's pod network: the real `bridge` plugin with `host-local`
/// addresses from the node's pod subnet, as a kubeadm cluster's simplest
/// CNI configuration; the node agent chains `ztunnel-cni` after it.
fn bridge_conflist(pod_cidr: &str) -> String {
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "pods",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": true,
                "isDefaultGateway": true,
                "hairpinMode": true,
                "ipMasq": false,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": pod_cidr}]],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": true}},
        ],
    })
    .to_string()
}

/// PATH for a component: its own directory first (containerd finds its
/// shim there), then the system's.
fn path_with(program: &Path) -> String {
    let dir = program
        .parent()
        .map(|dir| dir.display().to_string())
        .unwrap_or_default();
    format!("{dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
}

/// The first child of `pid`, from procfs.
fn first_child(pid: u32) -> Option<u32> {
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?;
    children.split_whitespace().next()?.parse().ok()
}

/// Removes a cgroup directory and every one below it, deepest first.
fn remove_depth_first(dir: &Path) -> std::io::Result<()> {
    if !dir.exists() {
        return Ok(());
    }
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            remove_depth_first(&entry.path())?;
        }
    }
    std::fs::remove_dir(dir)
}
