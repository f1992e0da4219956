//! What the DNS scenarios add to the topology and to a run: a nameserver
//! (the load generator's `dns-server`) in a namespace of its own behind
//! node-a, standing in for the cluster's DNS: the upstream of node-a's DNS
//! proxy (`DNS_UPSTREAMS`) and, through the pods' resolv.conf, the
//! nameserver the client pods ask, as kubelet would write it. In a meshed
//! pod the agent's capture rules take those queries to ztunnel's 15053;
//! in the pod outside the mesh they reach the nameserver itself. The mesh
//! has one Service, whose names the proxy answers itself.
//!
//! Which runs exist and how they are measured is `scenario.rs`'s.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{Context, bail};
use ztunnel_test_support::cluster::Pod;
use ztunnel_test_support::netns::{self, NetNs, ResolvConf};

use crate::harness::process::Process;
use crate::harness::scenario::Scenario;

/// Node-a's end of the link to the nameserver's namespace.
const NODE_SIDE: &str = "198.18.53.1/30";
/// The nameserver's end, and its address.
const NAMESERVER_SIDE: &str = "198.18.53.2/30";
const NAMESERVER_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 53, 2);
/// The nameserver's gateway back to the pods: node-a.
const NODE_IP: &str = "198.18.53.1";
/// Where the nameserver listens: what the pods' resolv.conf names and the
/// proxy forwards to.
pub const NAMESERVER: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(NAMESERVER_IP), 53);
/// What the nameserver answers for every name.
const OUTSIDE_ADDRESS: &str = "198.18.250.1";

/// The Service the DNS proxy answers for, in the meshed namespace: a
/// name and VIP no traffic uses, known only to the proxies.
const SERVICE: &str = "echo";
const SERVICE_VIP: &str = "198.18.254.10";

/// Names of the answered scenario: the Service's full name, and its short
/// name, which the proxy expands with the client's namespace as a
/// resolver's search list would.
const ANSWERED_NAMES: [&str; 2] = ["echo.bench.svc.cluster.local.", "echo."];
/// Names of the forwarded scenario: outside the mesh, so the proxy tries
/// every alias and wildcard before relaying them.
const FORWARDED_NAMES: [&str; 2] = ["outside.example.", "api.outside.example."];

/// How long a query may wait for its answer before it is a timeout: a
/// hundred times a slow answer here, and short enough that a lost query
/// does not hold its in-flight slot through much of a run.
const QUERY_TIMEOUT: &str = "1";

/// How long the nameserver gets to bind.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// The running nameserver and the pods' resolv.conf naming it; stopped
/// and removed on drop, the namespace (and the link) last.
pub struct Nameserver {
    child: Child,
    /// The pods' resolv.conf files, which `ip netns exec` mounts over
    /// `/etc/resolv.conf` for what runs in the pod.
    resolv_confs: Vec<ResolvConf>,
    _ns: NetNs,
}

impl Nameserver {
    /// Makes the nameserver's namespace, links it to `node` (node-a's
    /// namespace, which routes between it and the node's pods) and starts
    /// `loadgen dns-server` in it.
    pub fn start(node: &NetNs, loadgen: &Path) -> anyhow::Result<Nameserver> {
        let ns = NetNs::create("dns")?;
        netns::veth_pair(node, NODE_SIDE, &ns, NAMESERVER_SIDE)?;
        ns.exec(&["ip", "route", "add", "default", "via", NODE_IP])?;
        let mut child = ns
            .command(&loadgen.to_string_lossy())
            .args(["dns-server", "--listen", &NAMESERVER.to_string()])
            .args(["--address", OUTSIDE_ADDRESS])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {} dns-server", loadgen.display()))?;
        let listening = child.stdout.take().map(first_line);
        let nameserver = Nameserver {
            child,
            resolv_confs: Vec::new(),
            _ns: ns,
        };
        let line = listening.and_then(|lines| lines.recv_timeout(START_TIMEOUT).ok());
        if !line.is_some_and(|line| line.contains("\"listening\"")) {
            bail!("the nameserver did not listen on {NAMESERVER} within {START_TIMEOUT:?}");
        }
        Ok(nameserver)
    }

    /// The nameserver's process (`ip netns exec` runs it in place).
    pub fn process(&self) -> Process {
        Process {
            pid: self.child.id(),
        }
    }

    /// Gives `pod` a resolv.conf naming the nameserver, with the search
    /// list kubelet writes, and checks that what runs in the pod sees it.
    pub fn configure_pod(&mut self, pod: &Pod) -> anyhow::Result<()> {
        let namespace = &pod.spec.namespace;
        let text = format!(
            "search {namespace}.svc.cluster.local svc.cluster.local cluster.local\nnameserver {NAMESERVER_IP}\noptions ndots:5\n"
        );
        self.resolv_confs
            .push(ResolvConf::write(pod.ns.name(), &text)?);
        let seen = pod.ns.exec(&["cat", "/etc/resolv.conf"])?;
        if String::from_utf8_lossy(&seen.stdout) != text {
            bail!(
                "{}: `ip netns exec` does not show the pod its own resolv.conf",
                pod.spec.name
            );
        }
        Ok(())
    }
}

impl Drop for Nameserver {
    fn drop(&mut self) {
        // Our own child, by PID.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The first line `stdout` prints, read on a thread so that waiting for
/// it can time out.
fn first_line(stdout: std::process::ChildStdout) -> mpsc::Receiver<String> {
    let (line_tx, line_rx) = mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead as _;
        let mut line = String::new();
        if std::io::BufReader::new(stdout).read_line(&mut line).is_ok() {
            let _ = line_tx.send(line);
        }
    });
    line_rx
}

/// The `services:` entry of the Service the proxy answers for, in
/// `namespace`. The VIP is written `network/IP` with the default (empty)
/// network, the form istio/ztunnel's local file requires.
pub fn service(namespace: &str) -> String {
    format!(
        "- name: {SERVICE}\n  namespace: {namespace}\n  hostname: {SERVICE}.{namespace}.svc.cluster.local\n  vips: [\"/{SERVICE_VIP}\"]\n  ports: {{80: 9000}}\n"
    )
}

/// The load generator's `dns` arguments for `scenario` but its bounds:
/// the pod's own nameserver (no `--server`), the scenario's names,
/// `in_flight` outstanding.
pub fn loadgen_args(scenario: Scenario, in_flight: u32) -> Vec<String> {
    let names: &[&str] = match scenario {
        Scenario::DnsAnswered => &ANSWERED_NAMES,
        _ => &FORWARDED_NAMES,
    };
    let mut args: Vec<String> = names
        .iter()
        .flat_map(|name| ["--name".to_owned(), (*name).to_owned()])
        .collect();
    args.extend(
        [
            "--in-flight",
            &in_flight.to_string(),
            "--timeout",
            QUERY_TIMEOUT,
        ]
        .map(str::to_owned),
    );
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answered_names_are_the_service_of_the_meshed_namespace() {
        let entry = service("bench");
        assert!(entry.contains("hostname: echo.bench.svc.cluster.local\n"));
        assert_eq!(ANSWERED_NAMES[0], "echo.bench.svc.cluster.local.");
        let args = loadgen_args(Scenario::DnsForwarded, 8).join(" ");
        assert_eq!(
            args,
            "--name outside.example. --name api.outside.example. --in-flight 8 --timeout 1"
        );
        assert!(NAMESERVER_SIDE.starts_with(&NAMESERVER.ip().to_string()));
    }
}
