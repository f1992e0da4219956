//! One node of the cluster: its namespace, address and pod network, the
//! processes it runs (node agent, ztunnel), and what a test reads from
//! them (logs, readiness, ztunnel's admin and metrics endpoints). Starting
//! and stopping the processes is the cluster's (`cluster.rs`).

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Child;

use anyhow::bail;

use crate::cluster::{START_TIMEOUT, tail};
use crate::cni::CniNetwork;
use crate::netns::{NetNs, PortForward};
use crate::wait;

/// The node agent's readiness port, on the node's loopback: only the
/// cluster asks it, as a kubelet would.
const AGENT_READINESS_PORT: u16 = 8000;

/// One node: its namespace, address, pod subnet and processes.
pub struct Node {
    /// `node-a`, `node-b`, ...
    pub name: String,
    /// The node's network namespace.
    pub ns: NetNs,
    /// Its address on the fabric.
    pub ip: Ipv4Addr,
    /// The third octet of its pod subnet, `198.18.<octet>.0/24`.
    pod_octet: u8,
    /// Files of this node: sockets, agent state, logs, token.
    pub dir: PathBuf,
    /// The pod network: bridge, IPAM and our plugin.
    pub network: CniNetwork,
    pub(super) agent: Option<Child>,
    pub(super) ztunnel: Option<Child>,
    /// On Kubernetes, carries the node agent's connections to the API
    /// server, which listens on the host's loopback only, from the same
    /// address on the node's loopback.
    api_forward: Option<PortForward>,
}

impl Node {
    /// The node at position `offset`: its namespace, its directory under
    /// `cluster_dir`, and its pod network (`198.18.<10 + offset>.0/24`,
    /// chaining `plugin`, capturing `ambient_namespaces`). Not attached to
    /// the fabric yet, and running nothing.
    pub(super) fn create(
        name: &str,
        offset: u8,
        cluster_dir: &Path,
        plugin: &Path,
        ambient_namespaces: &[&str],
    ) -> anyhow::Result<Node> {
        let ns = NetNs::create("node")?;
        let dir = cluster_dir.join(name);
        std::fs::create_dir_all(&dir)?;
        let pod_octet = 10 + offset;
        let network = CniNetwork::new(
            &ns,
            &format!("198.18.{pod_octet}.0/24"),
            plugin,
            &dir.join("pluginevent.sock"),
        )?
        .ambient_namespaces(ambient_namespaces);
        Ok(Node {
            name: name.to_owned(),
            ns,
            ip: Ipv4Addr::new(198, 18, 0, 10 + offset),
            pod_octet,
            dir,
            network,
            agent: None,
            ztunnel: None,
            api_forward: None,
        })
    }

    /// Makes the API server at `address` (on the host's loopback)
    /// reachable from the node at the same address.
    pub(super) fn reach_api(&mut self, address: SocketAddr) -> anyhow::Result<()> {
        self.api_forward = Some(PortForward::to_host(&self.ns, address)?);
        Ok(())
    }

    /// Its pod subnet, which the other nodes route to it.
    pub(super) fn pod_subnet(&self) -> String {
        format!("198.18.{}.0/24", self.pod_octet)
    }

    /// The agent's plugin-event socket, for the plugin's config.
    pub fn plugin_socket(&self) -> PathBuf {
        self.dir.join("pluginevent.sock")
    }

    /// The ZDS socket.
    pub fn zds_socket(&self) -> PathBuf {
        self.dir.join("ztunnel.sock")
    }

    /// Where the node agent's readiness probe is answered.
    pub fn agent_readiness_address(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, AGENT_READINESS_PORT))
    }

    /// The node agent's log file.
    pub(super) fn agent_log_path(&self) -> PathBuf {
        self.dir.join("agent.log")
    }

    /// The node agent's log.
    pub fn agent_log(&self) -> String {
        std::fs::read_to_string(self.agent_log_path()).unwrap_or_default()
    }

    /// Whether the node agent answers ready: its sockets are bound and its
    /// pod source has been read (on Kubernetes, both watches have listed).
    pub fn agent_is_ready(&self) -> bool {
        matches!(self.http_get(AGENT_READINESS_PORT, "/readyz"), Ok((200, _)))
    }

    /// Waits until the node agent is ready.
    pub(super) fn wait_agent_ready(&self) -> anyhow::Result<()> {
        self.wait_until_ready("node agent", Node::agent_is_ready, Node::agent_log)
    }

    /// ztunnel's log (JSON lines, with access logs).
    pub fn ztunnel_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("ztunnel.log")).unwrap_or_default()
    }

    /// The "connection complete" lines of ztunnel's access log, in order.
    pub fn access_log(&self) -> Vec<AccessEntry> {
        self.ztunnel_log()
            .lines()
            .filter_map(AccessEntry::parse)
            .collect()
    }

    /// An HTTP GET to a port on the node's loopback: ztunnel's (15020
    /// metrics, 15021 readiness, 15000 admin) or the agent's readiness
    /// port. The status code and body.
    pub fn http_get(&self, port: u16, path: &str) -> anyhow::Result<(u16, String)> {
        self.ns.http_get(port, path)
    }

    /// The PID of the running ztunnel, for reading its CPU time and memory
    /// from `/proc`.
    pub fn ztunnel_pid(&self) -> Option<u32> {
        self.ztunnel.as_ref().map(Child::id)
    }

    /// Whether ztunnel answers ready.
    pub fn is_ready(&self) -> bool {
        matches!(self.http_get(15021, "/healthz/ready"), Ok((200, _)))
    }

    /// The workload uids ztunnel's `/config_dump` lists.
    pub fn known_workloads(&self) -> Vec<String> {
        self.config_dump_strings("workloads", "uid")
    }

    /// The service hostnames ztunnel's `/config_dump` lists.
    pub fn known_services(&self) -> Vec<String> {
        self.config_dump_strings("services", "hostname")
    }

    /// The string `field` of each entry of the `/config_dump` list `list`;
    /// nothing when ztunnel does not answer.
    fn config_dump_strings(&self, list: &str, field: &str) -> Vec<String> {
        let Ok((200, body)) = self.http_get(15000, "/config_dump") else {
            return Vec::new();
        };
        let Ok(dump) = serde_json::from_str::<serde_json::Value>(&body) else {
            return Vec::new();
        };
        dump.get(list)
            .and_then(serde_json::Value::as_array)
            .map(|entries| {
                entries
                    .iter()
                    .filter_map(|entry| entry.get(field)?.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Waits until ztunnel is ready.
    pub fn wait_ready(&self) -> anyhow::Result<()> {
        self.wait_until_ready("ztunnel", Node::is_ready, Node::ztunnel_log)
    }

    /// Waits until `ready` holds for the node's `component`, or fails with
    /// the end of its `log`.
    fn wait_until_ready(
        &self,
        component: &str,
        ready: fn(&Node) -> bool,
        log: fn(&Node) -> String,
    ) -> anyhow::Result<()> {
        if wait::until(START_TIMEOUT, || ready(self)) {
            return Ok(());
        }
        bail!(
            "{}: {component} not ready after {START_TIMEOUT:?}; log:\n{}",
            self.name,
            tail(&log(self), 30)
        )
    }
}

/// One "connection complete" line of ztunnel's access log (JSON, WIRE.md
/// §10), with the fields tests and the demo read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AccessEntry {
    /// `inbound` or `outbound`.
    pub direction: String,
    /// The client's address (`src.addr`).
    pub src_addr: String,
    /// The client's verified SPIFFE identity: set only when it came over
    /// mTLS.
    pub src_identity: Option<String>,
    /// The client's workload name, when ztunnel knows it (or its
    /// `baggage` told).
    pub src_workload: Option<String>,
    /// The destination workload's name, when ztunnel knows it.
    pub dst_workload: Option<String>,
    /// The address of the original destination.
    pub dst_addr: String,
    /// Where an outbound connection was tunnelled over HBONE; `None` when
    /// it went as plain TCP.
    pub dst_hbone_addr: Option<String>,
    /// `same-node` when the connection was handed inside ztunnel from one
    /// of its pods to another; `None` when it went over the network.
    pub path: Option<String>,
    /// Why it failed; `None` when it succeeded.
    pub error: Option<String>,
    /// Bytes from the client.
    pub bytes_recv: u64,
    /// Bytes towards the client.
    pub bytes_sent: u64,
}

impl AccessEntry {
    /// The entry of a log line, if it is an access-log "connection
    /// complete" line, in either of ztunnel's formats: JSON
    /// (`LOG_FORMAT=json`) or text (the default: `<time> INFO access:
    /// connection complete key=value key="quoted value" ...`).
    pub fn parse(line: &str) -> Option<AccessEntry> {
        let fields = if line.trim_start().starts_with('{') {
            json_fields(line)?
        } else {
            text_fields(line)?
        };
        let field = |name: &str| fields.get(name).cloned();
        let number = |name: &str| field(name).and_then(|value| value.parse().ok());
        Some(AccessEntry {
            direction: field("direction")?,
            src_addr: field("src.addr").unwrap_or_default(),
            src_identity: field("src.identity"),
            src_workload: field("src.workload"),
            dst_workload: field("dst.workload"),
            dst_addr: field("dst.addr").unwrap_or_default(),
            dst_hbone_addr: field("dst.hbone_addr"),
            path: field("path"),
            error: field("error"),
            bytes_recv: number("bytes_recv").unwrap_or(0),
            bytes_sent: number("bytes_sent").unwrap_or(0),
        })
    }
}

/// The fields of a JSON access-log line, numbers as text.
fn json_fields(line: &str) -> Option<HashMap<String, String>> {
    let entry: serde_json::Value = serde_json::from_str(line).ok()?;
    let fields: HashMap<String, String> = entry
        .as_object()?
        .iter()
        .filter_map(|(name, value)| {
            let value = match value {
                serde_json::Value::String(text) => text.clone(),
                serde_json::Value::Number(number) => number.to_string(),
                _ => return None,
            };
            Some((name.clone(), value))
        })
        .collect();
    let is = |name: &str, value: &str| fields.get(name).is_some_and(|v| v == value);
    (is("target", "access") && is("message", "connection complete")).then_some(fields)
}

/// The fields of a text access-log line: what follows `access:
/// connection complete`, as `key=value` or `key="value"` (with `\"` and
/// `\\` escapes).
fn text_fields(line: &str) -> Option<HashMap<String, String>> {
    let (_, mut rest) = line.split_once(" access: connection complete")?;
    let mut fields = HashMap::new();
    loop {
        rest = rest.trim_start();
        let Some((name, after)) = rest.split_once('=') else {
            return Some(fields);
        };
        let value;
        (value, rest) = match after.strip_prefix('"') {
            Some(quoted) => crate::quoted::take(quoted),
            None => {
                // Displayed values are not quoted: one ends where the next
                // `key=` begins, except the error, the last field, whose
                // chain may hold anything.
                let end = after
                    .match_indices(' ')
                    .map(|(at, _)| at)
                    .find(|&at| name != "error" && starts_with_key(&after[at + 1..]))
                    .unwrap_or(after.len());
                (after[..end].to_owned(), &after[end..])
            }
        };
        fields.insert(name.to_owned(), value);
    }
}

/// Whether `text` begins with a field name and `=`.
fn starts_with_key(text: &str) -> bool {
    text.split_once('=').is_some_and(|(name, _)| {
        !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '.')
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests: a panic is a failed test

    use super::*;

    #[test]
    fn text_and_json_lines_give_the_same_entry() {
        let text = concat!(
            "2026-12-07T05:41:34.123456Z  ERROR access: connection complete ",
            "src.addr=198.18.64.5:40312 src.workload=\"client-a\" src.namespace=\"demo\" ",
            "src.identity=\"spiffe://cluster.local/ns/demo/sa/client\" ",
            "dst.addr=198.18.65.7:15008 dst.workload=\"echo-1\" direction=\"inbound\" ",
            "bytes_sent=12 bytes_recv=34 duration=5ms ",
            "error=connection refused (os error 111): dial x=1"
        );
        let json = serde_json::json!({
            "target": "access",
            "message": "connection complete",
            "src.addr": "198.18.64.5:40312",
            "src.identity": "spiffe://cluster.local/ns/demo/sa/client",
            "src.workload": "client-a",
            "dst.addr": "198.18.65.7:15008",
            "dst.workload": "echo-1",
            "direction": "inbound",
            "bytes_sent": 12,
            "bytes_recv": 34,
            "error": "connection refused (os error 111): dial x=1",
        })
        .to_string();
        let from_text = AccessEntry::parse(text).unwrap();
        assert_eq!(from_text, AccessEntry::parse(&json).unwrap());
        assert_eq!(from_text.bytes_recv, 34);
        assert_eq!(
            from_text.error.as_deref(),
            Some("connection refused (os error 111): dial x=1")
        );
        assert_eq!(
            AccessEntry::parse("2026 INFO access: connection opened x=1"),
            None
        );
        assert_eq!(
            AccessEntry::parse(r#"{"target":"access","message":"other"}"#),
            None
        );
    }
}
