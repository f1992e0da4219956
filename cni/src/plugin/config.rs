//! The network configuration the runtime passes on stdin: the standard CNI
//! keys we use (`cniVersion`, `prevResult`) and our own:
//!
//! | Key | Default | Meaning |
//! |---|---|---|
//! | `agent_socket` | `/var/run/istio-cni/pluginevent.sock` | the node agent's plugin-event socket |
//! | `ambient_namespaces` | `[]` | namespaces whose pods join the mesh; `"*"` means all |
//! | `exclude_namespaces` | `["kube-system", "istio-system"]` | never captured, even with `"*"` |
//! | `pod_namespace` | none | the agent's namespace: its own pods there pass without it |
//!
//! Other keys are ignored, as the spec asks of plugins.

use std::path::PathBuf;

use serde::Deserialize;

use crate::event::DEFAULT_SOCKET;

/// Spec versions this plugin speaks; results are passed through, so every
/// version whose `ips[]` entries carry `address` works.
pub const SUPPORTED_VERSIONS: [&str; 4] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0"];
/// Namespaces never captured: the control plane and the mesh itself.
const DEFAULT_EXCLUDED: [&str; 2] = ["kube-system", "istio-system"];
/// The agent's DaemonSet in istio-cni's chart and ours; its pods are named
/// `<it>-<suffix>`. The plugin lets them pass without asking the agent
/// (KUBERNETES.md A2), so that a new agent can start while the entry of
/// the one it replaces is still in place; the agent looks the DaemonSet up
/// when it stops (`agent/upgrade.rs`).
pub const AGENT_DAEMON_SET: &str = "istio-cni-node";
/// Largest configuration read from stdin. Real ones are a few kilobytes;
/// the bound keeps a broken runtime from making the plugin hold gigabytes.
pub const MAX_CONFIG_BYTES: u64 = 1024 * 1024;

/// The parsed configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginConfig {
    /// `cniVersion`; results and errors are written in it.
    pub cni_version: String,
    /// The previous plugin's result, passed through on ADD.
    pub prev_result: Option<serde_json::Value>,
    /// Where the node agent listens.
    pub agent_socket: PathBuf,
    /// Namespaces enabled for ambient capture.
    pub ambient_namespaces: Vec<String>,
    /// Namespaces excluded from capture; wins over `ambient_namespaces`.
    pub exclude_namespaces: Vec<String>,
    /// The agent's namespace, where its own pods are recognised by name;
    /// `None` recognises none.
    pub pod_namespace: Option<String>,
}

/// The JSON shape, before defaults and checks.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawConfig {
    cni_version: String,
    #[serde(default)]
    prev_result: Option<serde_json::Value>,
    #[serde(rename = "agent_socket", default)]
    agent_socket: Option<PathBuf>,
    #[serde(rename = "ambient_namespaces", default)]
    ambient_namespaces: Vec<String>,
    #[serde(rename = "exclude_namespaces", default)]
    exclude_namespaces: Option<Vec<String>>,
    #[serde(rename = "pod_namespace", default)]
    pod_namespace: Option<String>,
}

impl PluginConfig {
    /// Parses stdin.
    pub fn parse(stdin: &[u8]) -> Result<PluginConfig, ConfigError> {
        let raw: RawConfig = serde_json::from_slice(stdin).map_err(ConfigError::Decode)?;
        if !SUPPORTED_VERSIONS.contains(&raw.cni_version.as_str()) {
            return Err(ConfigError::UnsupportedVersion(raw.cni_version));
        }
        if raw
            .prev_result
            .as_ref()
            .is_some_and(|prev| !prev.is_object())
        {
            return Err(ConfigError::Invalid("prevResult is not an object".into()));
        }
        if raw
            .agent_socket
            .as_ref()
            .is_some_and(|path| path.as_os_str().is_empty())
        {
            return Err(ConfigError::Invalid("agent_socket is empty".into()));
        }
        Ok(PluginConfig {
            cni_version: raw.cni_version,
            prev_result: raw.prev_result,
            agent_socket: raw
                .agent_socket
                .unwrap_or_else(|| PathBuf::from(DEFAULT_SOCKET)),
            ambient_namespaces: raw.ambient_namespaces,
            exclude_namespaces: raw
                .exclude_namespaces
                .unwrap_or_else(|| DEFAULT_EXCLUDED.iter().map(|ns| (*ns).to_owned()).collect()),
            pod_namespace: raw.pod_namespace.filter(|namespace| !namespace.is_empty()),
        })
    }

    /// Whether the pod `namespace/name` joins the mesh: its namespace is
    /// listed and not excluded, and it is not one of the agent's own pods.
    pub fn captures(&self, namespace: &str, name: &str) -> bool {
        let listed = |list: &[String]| list.iter().any(|entry| entry == namespace);
        !listed(&self.exclude_namespaces)
            && !self.is_agent_pod(namespace, name)
            && (listed(&self.ambient_namespaces)
                || self.ambient_namespaces.iter().any(|entry| entry == "*"))
    }

    /// Whether `namespace/name` is a pod of the agent's DaemonSet, as
    /// istio-cni's plugin tells (`isCNIPod`): the name, from the runtime's
    /// `CNI_ARGS`, is `<AGENT_DAEMON_SET>-<suffix>` in the agent's
    /// namespace. Were it captured, a new agent could not start while the
    /// entry its predecessor left waits for it.
    fn is_agent_pod(&self, namespace: &str, name: &str) -> bool {
        self.pod_namespace.as_deref() == Some(namespace)
            && name
                .strip_prefix(AGENT_DAEMON_SET)
                .and_then(|rest| rest.strip_prefix('-'))
                .is_some_and(|suffix| !suffix.is_empty())
    }
}

/// The `cniVersion` of a VERSION request's stdin, which may be empty.
pub fn requested_version(stdin: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct Version {
        #[serde(rename = "cniVersion")]
        cni_version: String,
    }
    serde_json::from_slice::<Version>(stdin)
        .ok()
        .map(|version| version.cni_version)
}

/// Why the configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Not JSON, or a key has the wrong type (CNI code 6).
    #[error("cannot decode the network configuration: {0}")]
    Decode(serde_json::Error),
    /// A `cniVersion` this plugin does not speak (CNI code 1).
    #[error("unsupported cniVersion {0:?}; supported: 0.3.0, 0.3.1, 0.4.0, 1.0.0")]
    UnsupportedVersion(String),
    /// Well-formed but unusable (CNI code 7).
    #[error("invalid network configuration: {0}")]
    Invalid(String),
    /// Larger than [`MAX_CONFIG_BYTES`]; not read further (CNI code 7).
    #[error("the network configuration is larger than {MAX_CONFIG_BYTES} bytes")]
    TooLarge,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configurations_parse_with_defaults() {
        let config =
            PluginConfig::parse(br#"{"cniVersion":"1.0.0","name":"k8s","type":"ztunnel-cni"}"#)
                .unwrap();
        assert_eq!(config.agent_socket, PathBuf::from(DEFAULT_SOCKET));
        assert!(config.ambient_namespaces.is_empty());
        assert_eq!(config.exclude_namespaces, ["kube-system", "istio-system"]);
        assert_eq!(config.prev_result, None);
        assert_eq!(config.pod_namespace, None);

        let config = PluginConfig::parse(
            br#"{"cniVersion":"0.4.0","name":"k8s","agent_socket":"/tmp/a.sock","ambient_namespaces":["*"],
                 "exclude_namespaces":[],"prevResult":{"ips":[]},"unknown":true}"#,
        )
        .unwrap();
        assert_eq!(config.agent_socket, PathBuf::from("/tmp/a.sock"));
        assert_eq!(config.exclude_namespaces, Vec::<String>::new());
        assert!(config.prev_result.is_some());
    }

    #[test]
    fn bad_configurations_are_refused_with_their_kind() {
        let cases: [(&[u8], &str); 7] = [
            (b"", "decode"),
            (b"not json", "decode"),
            (br#"{"name":"k8s"}"#, "decode"),
            (
                br#"{"cniVersion":"1.0.0","ambient_namespaces":"shop"}"#,
                "decode",
            ),
            (br#"{"cniVersion":"0.2.0"}"#, "version"),
            (br#"{"cniVersion":"1.0.0","prevResult":[1]}"#, "invalid"),
            (br#"{"cniVersion":"1.0.0","agent_socket":""}"#, "invalid"),
        ];
        for (stdin, want) in cases {
            let kind = match PluginConfig::parse(stdin) {
                Err(ConfigError::Decode(_)) => "decode",
                Err(ConfigError::UnsupportedVersion(_)) => "version",
                Err(ConfigError::Invalid(_) | ConfigError::TooLarge) => "invalid",
                Ok(_) => "ok",
            };
            assert_eq!(kind, want, "{}", String::from_utf8_lossy(stdin));
        }
    }

    #[test]
    fn capture_follows_the_namespace_lists_and_spares_the_agents_own_pods() {
        let config = |ambient: &[&str], exclude: Option<&[&str]>| {
            let mut json = serde_json::json!({
                "cniVersion": "1.0.0",
                "ambient_namespaces": ambient,
                "pod_namespace": "istio-system",
            });
            if let Some(exclude) = exclude {
                json["exclude_namespaces"] = serde_json::json!(exclude);
            }
            PluginConfig::parse(json.to_string().as_bytes()).unwrap()
        };
        let all_but_kube_system = || config(&["*"], Some(&["kube-system"]));
        let no_agent_namespace = PluginConfig {
            pod_namespace: None,
            ..all_but_kube_system()
        };
        #[rustfmt::skip]
        let cases = [
            ("a listed namespace", config(&["shop"], None), "shop/web-0", true),
            ("an unlisted namespace", config(&["shop"], None), "other/web-0", false),
            ("no list", config(&[], None), "shop/web-0", false),
            ("every namespace", config(&["*"], None), "anything/web-0", true),
            ("the default exclusions win over *", config(&["*"], None), "kube-system/dns-0", false),
            ("and over a listed namespace", config(&["kube-system"], None), "kube-system/dns-0", false),
            ("an empty exclusion list", config(&["kube-system"], Some(&[])), "kube-system/dns-0", true),
            ("an exclusion wins over *", config(&["*"], Some(&["shop"])), "shop/web-0", false),
            ("the agent's own pod", all_but_kube_system(), "istio-system/istio-cni-node-x7k2p", false),
            ("ztunnel beside it", all_but_kube_system(), "istio-system/ztunnel-x7k2p", true),
            ("the agent's name elsewhere", all_but_kube_system(), "shop/istio-cni-node-x7k2p", true),
            ("the bare DaemonSet name", all_but_kube_system(), "istio-system/istio-cni-node-", true),
            ("a longer name", all_but_kube_system(), "istio-system/istio-cni-nodes-x7k2p", true),
            ("no agent namespace configured", no_agent_namespace, "istio-system/istio-cni-node-x7k2p", true),
        ];
        for (reason, config, pod, want) in cases {
            let (namespace, name) = pod.split_once('/').unwrap();
            assert_eq!(config.captures(namespace, name), want, "{reason}: {pod}");
        }
    }

    #[test]
    fn version_requests_may_lack_a_config() {
        assert_eq!(
            requested_version(br#"{"cniVersion":"0.4.0"}"#).as_deref(),
            Some("0.4.0")
        );
        assert_eq!(requested_version(b""), None);
    }
}
