//! The network configuration the runtime passes on stdin: the standard CNI
//! keys we use (`cniVersion`, `prevResult`) and our own:
//!
//! | Key | Default | Meaning |
//! |---|---|---|
//! | `agent_socket` | `/var/run/istio-cni/pluginevent.sock` | the node agent's plugin-event socket |
//! | `ambient_namespaces` | `[]` | namespaces whose pods join the mesh; `"*"` means all |
//! | `exclude_namespaces` | `["kube-system", "istio-system"]` | never captured, even with `"*"` |
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
        })
    }

    /// Whether pods of `namespace` join the mesh.
    pub fn captures(&self, namespace: &str) -> bool {
        let listed = |list: &[String]| list.iter().any(|entry| entry == namespace);
        !listed(&self.exclude_namespaces)
            && (listed(&self.ambient_namespaces)
                || self.ambient_namespaces.iter().any(|entry| entry == "*"))
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
    fn capture_follows_the_namespace_lists() {
        let config = |ambient: &[&str], exclude: Option<&[&str]>| {
            let mut json =
                serde_json::json!({"cniVersion": "1.0.0", "ambient_namespaces": ambient});
            if let Some(exclude) = exclude {
                json["exclude_namespaces"] = serde_json::json!(exclude);
            }
            PluginConfig::parse(json.to_string().as_bytes()).unwrap()
        };
        let cases = [
            (config(&["shop"], None), "shop", true),
            (config(&["shop"], None), "other", false),
            (config(&[], None), "shop", false),
            (config(&["*"], None), "anything", true),
            (config(&["*"], None), "kube-system", false),
            (config(&["kube-system"], None), "kube-system", false),
            (config(&["kube-system"], Some(&[])), "kube-system", true),
            (config(&["*"], Some(&["shop"])), "shop", false),
        ];
        for (config, namespace, want) in cases {
            assert_eq!(
                config.captures(namespace),
                want,
                "{namespace} with {config:?}"
            );
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
