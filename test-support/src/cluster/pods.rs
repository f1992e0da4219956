//! Pods of the cluster: a network namespace each, attached through the
//! real CNI chain of its node, with an application (an echo server) and a
//! way to open connections from inside it. On Kubernetes a pod also has a
//! pause process (`crate::pause`), as the node agent finds running pods
//! through their processes.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use anyhow::{Context, bail};

use crate::cluster::Cluster;
use crate::cni::PodSandbox;
use crate::netns::NetNs;
use crate::pause::{PauseError, PauseProcess};

/// How long a connection attempt from a pod may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a read in a pod may block.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// A pod before it exists: what the registry and the mesh know of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodSpec {
    /// Pod name.
    pub name: String,
    /// Kubernetes namespace.
    pub namespace: String,
    /// Service account.
    pub service_account: String,
    /// The node it runs on.
    pub node: String,
}

impl PodSpec {
    /// A pod spec.
    pub fn new(name: &str, namespace: &str, service_account: &str, node: &str) -> PodSpec {
        PodSpec {
            name: name.to_owned(),
            namespace: namespace.to_owned(),
            service_account: service_account.to_owned(),
            node: node.to_owned(),
        }
    }

    /// Its uid in the pod registry file, derived from its name. On
    /// Kubernetes the API server gives the uid: [`Pod::uid`].
    pub fn uid(&self) -> String {
        format!("uid-{}-{}", self.namespace, self.name)
    }

    /// Its SPIFFE identity.
    pub fn identity(&self) -> String {
        format!(
            "spiffe://{}/ns/{}/sa/{}",
            crate::cluster::TRUST_DOMAIN,
            self.namespace,
            self.service_account
        )
    }
}

/// A running pod.
#[derive(Debug)]
pub struct Pod {
    /// What it is.
    pub spec: PodSpec,
    /// The uid the runtime gave the CNI chain: the API server's on
    /// Kubernetes, [`PodSpec::uid`] with the registry file.
    pub uid: String,
    /// Its pause process, or why it has none. Declared before the
    /// namespace so it is dropped first, as a runtime stops a pod.
    process: Result<PauseProcess, String>,
    /// Its network namespace.
    pub ns: NetNs,
    /// The address the CNI chain gave it.
    pub ip: Ipv4Addr,
}

impl Pod {
    /// Its pause process, running in its namespace and in a cgroup named
    /// after its uid; `None` where it has none
    /// ([`Pod::process_unavailable`] says why).
    pub fn process(&self) -> Option<&PauseProcess> {
        self.process.as_ref().ok()
    }

    /// Why the pod has no pause process, if it has none: the cluster is
    /// not on Kubernetes, or cgroup v2 cannot be used here. Tests that
    /// need the process skip with this reason.
    pub fn process_unavailable(&self) -> Option<&str> {
        self.process.as_ref().err().map(String::as_str)
    }

    /// Serves an echo application on `port` (all addresses) inside the pod,
    /// on background threads: each connection gets back what it sends,
    /// until it half-closes.
    pub fn serve_echo(&self, port: u16) -> anyhow::Result<()> {
        let listener = self
            .ns
            .run(move || TcpListener::bind(SocketAddr::from(([0, 0, 0, 0], port))))??;
        std::thread::Builder::new()
            .name(format!("echo-{}", self.spec.name))
            .spawn(move || {
                // Ends when the listener fails, i.e. with the pod.
                for stream in listener.incoming() {
                    let Ok(stream) = stream else { return };
                    std::thread::spawn(move || echo(stream));
                }
            })?;
        Ok(())
    }

    /// Opens a TCP connection from inside the pod, as its application
    /// would: capture rules apply.
    pub fn connect(&self, target: SocketAddr) -> anyhow::Result<TcpStream> {
        let stream = self
            .ns
            .run(move || TcpStream::connect_timeout(&target, CONNECT_TIMEOUT))?
            .with_context(|| format!("{} connecting to {target}", self.spec.name))?;
        stream.set_read_timeout(Some(READ_TIMEOUT))?;
        Ok(stream)
    }

    /// Sends `data` to `target` over a new connection, half-closes, and
    /// returns everything read back.
    pub fn exchange(&self, target: SocketAddr, data: &[u8]) -> anyhow::Result<Vec<u8>> {
        let mut stream = self.connect(target)?;
        stream.write_all(data)?;
        stream.shutdown(Shutdown::Write)?;
        let mut reply = Vec::new();
        stream.read_to_end(&mut reply)?;
        Ok(reply)
    }

    /// Whether the application at `target` echoes what this pod sends over
    /// a new connection.
    pub fn echoes(&self, target: SocketAddr) -> bool {
        matches!(self.exchange(target, b"ping"), Ok(reply) if reply == b"ping")
    }

    /// The pod's iptables rules (`iptables-save`).
    pub fn iptables(&self) -> anyhow::Result<String> {
        let output = self.ns.exec(&["iptables-save"])?;
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// Whether something listens on `port` inside the pod (on its own
    /// address, as a peer ztunnel would dial it).
    pub fn listens_on(&self, port: u16) -> bool {
        let target = SocketAddr::from((self.ip, port));
        self.ns
            .run(move || TcpStream::connect_timeout(&target, CONNECT_TIMEOUT).is_ok())
            .unwrap_or(false)
    }

    /// How many established TCP connections in the pod have `port` as
    /// their local port: the tunnels a peer ztunnel holds to its 15008.
    pub fn established_on(&self, port: u16) -> anyhow::Result<usize> {
        let filter = format!("( sport = :{port} )");
        let output = self
            .ns
            .exec(&["ss", "-H", "-t", "-n", "state", "established", &filter])?;
        Ok(String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter(|line| !line.trim().is_empty())
            .count())
    }
}

/// Whether an open connection to an echo application still echoes.
pub fn still_echoes(stream: &mut TcpStream) -> bool {
    let _ = stream.set_read_timeout(Some(READ_TIMEOUT));
    let mut reply = [0u8; 4];
    stream.write_all(b"more").is_ok() && stream.read_exact(&mut reply).is_ok() && &reply == b"more"
}

/// Whether the other side closes an open connection (EOF or reset)
/// within `within`, without data arriving.
pub fn closed_by_peer(stream: &mut TcpStream, within: Duration) -> bool {
    let _ = stream.set_read_timeout(Some(within));
    let mut byte = [0u8; 1];
    matches!(stream.read(&mut byte), Ok(0) | Err(_))
        && stream.read(&mut byte).map_or(true, |read| read == 0)
}

/// Echoes one connection until its write side closes.
fn echo(mut stream: TcpStream) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(60)));
    let mut buffer = [0; 16 * 1024];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(read) => {
                if stream
                    .write_all(buffer.get(..read).unwrap_or_default())
                    .is_err()
                {
                    return;
                }
            }
        }
    }
    let _ = stream.shutdown(Shutdown::Write);
}

impl Cluster {
    /// Adds a pod through its node's CNI chain (bridge, then our plugin)
    /// and publishes it ([`Cluster::publish_pod`]). The pod must be in the
    /// registry.
    pub fn add_pod(&mut self, spec: &PodSpec) -> anyhow::Result<&Pod> {
        self.add_pod_unpublished(spec)?;
        self.publish_pod(&spec.name)
    }

    /// Adds a pod through its node's CNI chain (bridge, then our plugin),
    /// leaving the mesh file as it was: the pod runs, captured in an
    /// ambient namespace, but is nobody's workload yet, as between the
    /// runtime's sandbox and the kubelet's status update. The pod must be
    /// in the registry; on Kubernetes it is created in the API if it is
    /// not there, and gets a pause process before the chain runs.
    pub fn add_pod_unpublished(&mut self, spec: &PodSpec) -> anyhow::Result<&Pod> {
        let uid = match self.kube() {
            Some(api) => api.create_pod(spec)?,
            None => spec.uid(),
        };
        let node = self.node(&spec.node)?;
        let ns = NetNs::create("pod")?;
        let process = match self.kube() {
            Some(_) => pause_process(&ns, &uid)?,
            None => Err("a cluster on the pod registry file runs no pod processes".to_owned()),
        };
        let sandbox = PodSandbox::new(&ns, &spec.namespace, &spec.name, &uid);
        let outcome = node.network.add(&sandbox)?;
        if !outcome.plugin.success {
            bail!(
                "CNI ADD of {} failed: {} {}",
                spec.name,
                outcome.plugin.stdout,
                outcome.plugin.stderr
            );
        }
        let (ip, gateway) = first_ipv4(&outcome.bridge_result)
            .with_context(|| format!("no IPv4 address in {}", outcome.bridge_result))?;
        // Other nodes' pods are reached through the node: the pod's default
        // route is its bridge, as a cluster's CNI configuration sets it.
        ns.exec(&[
            "ip",
            "route",
            "replace",
            "default",
            "via",
            &gateway.to_string(),
        ])?;
        self.pods.push(Pod {
            spec: spec.clone(),
            uid,
            process,
            ns,
            ip,
        });
        self.pods.last().context("pod just added")
    }

    /// Puts a running pod's address in the mesh file, reached over HBONE
    /// in an ambient namespace and as plain TCP otherwise: from the next
    /// push (or reload of the local file) on, it is a workload peers route
    /// to.
    pub fn publish_pod(&mut self, name: &str) -> anyhow::Result<&Pod> {
        let pod = self.pod(name)?;
        let (spec, ip) = (pod.spec.clone(), pod.ip);
        let ambient = self.is_ambient(&spec.namespace);
        self.mesh().set_workload(&spec, ip, ambient)?;
        if let Some(api) = self.kube() {
            api.publish(&spec, ip)?;
        }
        self.pod(name)
    }

    /// Takes a running pod's address out of the mesh file: the pod keeps
    /// running (captured, in an ambient namespace) and stays in the
    /// registry, but is no longer a workload peers route to.
    pub fn unpublish_pod(&mut self, name: &str) -> anyhow::Result<()> {
        let spec = self.pod(name)?.spec.clone();
        if let Some(api) = self.kube() {
            api.unpublish(&spec)?;
        }
        self.mesh().remove_workload(&spec)
    }

    /// Deletes a pod the way the runtime does: its processes are stopped,
    /// then CNI DEL runs through the chain, then the namespace goes.
    pub fn delete_pod(&mut self, name: &str) -> anyhow::Result<()> {
        let index = self
            .pods
            .iter()
            .position(|pod| pod.spec.name == name)
            .with_context(|| format!("no pod {name}"))?;
        let Pod {
            spec,
            uid,
            process,
            ns,
            ..
        } = self.pods.remove(index);
        drop(process);
        let node = self.node(&spec.node)?;
        let sandbox = PodSandbox::new(&ns, &spec.namespace, &spec.name, &uid);
        let run = node.network.del(&sandbox)?;
        if !run.success {
            bail!("CNI DEL of {name} failed: {} {}", run.stdout, run.stderr);
        }
        if let Some(api) = self.kube() {
            api.delete(&spec)?;
        }
        self.mesh().remove_workload(&spec)?;
        Ok(())
    }

    /// The pod with this name.
    pub fn pod(&self, name: &str) -> anyhow::Result<&Pod> {
        self.pods
            .iter()
            .find(|pod| pod.spec.name == name)
            .with_context(|| format!("no pod {name}"))
    }

    fn is_ambient(&self, namespace: &str) -> bool {
        self.ambient_namespaces
            .iter()
            .any(|ambient| ambient == "*" || ambient == namespace)
    }
}

/// The first IPv4 address of a CNI result (`ips[].address`, CIDR form)
/// and its gateway.
fn first_ipv4(result: &serde_json::Value) -> Option<(Ipv4Addr, Ipv4Addr)> {
    result.get("ips")?.as_array()?.iter().find_map(|ip| {
        let address = ip
            .get("address")?
            .as_str()?
            .split('/')
            .next()?
            .parse()
            .ok()?;
        let gateway = ip.get("gateway")?.as_str()?.parse().ok()?;
        Some((address, gateway))
    })
}

/// Starts the pause process of the pod with `uid` in `ns`; `Ok(Err)` with
/// the reason where cgroup v2 cannot be used here, so the pod runs without
/// one.
fn pause_process(ns: &NetNs, uid: &str) -> anyhow::Result<Result<PauseProcess, String>> {
    match PauseProcess::start(ns, uid) {
        Ok(process) => Ok(Ok(process)),
        Err(error @ PauseError::CgroupUnavailable(_)) => Ok(Err(error.to_string())),
        Err(error) => Err(error.into()),
    }
}
