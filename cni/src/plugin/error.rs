//! Every way the plugin fails, and the one mapping from a failure to the
//! CNI error JSON (`cniVersion`, `code`, `msg`, `details`) and its code.

use ztunnel_certs::error_chain::ErrorChain;

use super::client::ClientError;
use super::config::ConfigError;
use super::env::EnvError;
use super::result::ResultError;

/// Spec code 1: incompatible CNI version.
const CODE_INCOMPATIBLE_VERSION: u32 = 1;
/// Spec code 4: invalid necessary environment variables.
const CODE_INVALID_ENV: u32 = 4;
/// Spec code 5: I/O failure.
const CODE_IO: u32 = 5;
/// Spec code 6: failure to decode content.
const CODE_DECODE: u32 = 6;
/// Spec code 7: invalid network config.
const CODE_INVALID_CONFIG: u32 = 7;
/// Spec code 11: try again later; the agent may be restarting.
const CODE_TRY_AGAIN: u32 = 11;
/// Plugin-specific (the spec leaves 100 and up to plugins): the agent
/// answered, but refused the pod.
const CODE_AGENT_REFUSED: u32 = 100;
/// Plugin-specific: CHECK found an ambient pod the agent does not have.
const CODE_NOT_IN_MESH: u32 = 101;

/// Why an invocation failed.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// The CNI environment variables are missing or malformed.
    #[error(transparent)]
    Env(#[from] EnvError),
    /// The network configuration on stdin was refused.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// `prevResult` has addresses that do not parse.
    #[error(transparent)]
    PrevResult(#[from] ResultError),
    /// ADD without `prevResult`: this plugin only runs chained.
    #[error("no prevResult: ztunnel-cni must be chained after the node's main plugin")]
    NotChained,
    /// The agent could not be reached or did not answer in time.
    #[error(transparent)]
    AgentUnreachable(ClientError),
    /// The agent answered with a non-200 status.
    #[error("the node agent refused {what} for pod {namespace}/{name}: HTTP {status}: {body}")]
    AgentRefused {
        /// `ADD` or `DEL`.
        what: &'static str,
        /// Pod namespace.
        namespace: String,
        /// Pod name.
        name: String,
        /// The status code.
        status: u16,
        /// The agent's error text.
        body: String,
    },
    /// CHECK: the agent does not hold this ambient pod.
    #[error("pod {namespace}/{name} is not in the node agent's mesh: HTTP {status}: {body}")]
    NotInMesh {
        /// Pod namespace.
        namespace: String,
        /// Pod name.
        name: String,
        /// The status code.
        status: u16,
        /// The agent's answer.
        body: String,
    },
    /// The plugin could not set itself up (its async runtime).
    #[error("starting the plugin's runtime: {0}")]
    Runtime(std::io::Error),
    /// Stdin, where the runtime writes the configuration, could not be read.
    #[error("reading the network configuration from stdin: {0}")]
    Stdin(std::io::Error),
}

impl PluginError {
    /// The CNI error code.
    pub fn code(&self) -> u32 {
        match self {
            PluginError::Env(_) => CODE_INVALID_ENV,
            PluginError::Config(ConfigError::Decode(_)) => CODE_DECODE,
            PluginError::Config(ConfigError::UnsupportedVersion(_)) => CODE_INCOMPATIBLE_VERSION,
            PluginError::Config(ConfigError::Invalid(_) | ConfigError::TooLarge)
            | PluginError::PrevResult(_)
            | PluginError::NotChained => CODE_INVALID_CONFIG,
            PluginError::AgentUnreachable(_) => CODE_TRY_AGAIN,
            PluginError::AgentRefused { .. } => CODE_AGENT_REFUSED,
            PluginError::NotInMesh { .. } => CODE_NOT_IN_MESH,
            PluginError::Runtime(_) | PluginError::Stdin(_) => CODE_IO,
        }
    }

    /// A short summary for `msg`; `details` carries the full text.
    fn summary(&self) -> &'static str {
        match self {
            PluginError::Env(_) => "invalid CNI environment",
            PluginError::Config(ConfigError::Decode(_)) => {
                "cannot decode the network configuration"
            }
            PluginError::Config(ConfigError::UnsupportedVersion(_)) => "incompatible CNI version",
            PluginError::Config(ConfigError::Invalid(_) | ConfigError::TooLarge)
            | PluginError::PrevResult(_)
            | PluginError::NotChained => "invalid network configuration",
            PluginError::AgentUnreachable(_) => "node agent unreachable; try again later",
            PluginError::AgentRefused { .. } => "node agent refused the pod",
            PluginError::NotInMesh { .. } => "pod is not in the mesh",
            PluginError::Runtime(_) | PluginError::Stdin(_) => "plugin I/O failure",
        }
    }

    /// The error JSON the spec asks for on stdout.
    pub fn to_json(&self, cni_version: &str) -> serde_json::Value {
        serde_json::json!({
            "cniVersion": cni_version,
            "code": self.code(),
            "msg": self.summary(),
            "details": ErrorChain(self).to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_map_to_spec_codes() {
        let decode = serde_json::from_str::<serde_json::Value>("{").unwrap_err();
        let cases = [
            (PluginError::Env(EnvError::Missing("CNI_NETNS")), 4),
            (PluginError::Config(ConfigError::Decode(decode)), 6),
            (
                PluginError::Config(ConfigError::UnsupportedVersion("0.1.0".into())),
                1,
            ),
            (PluginError::Config(ConfigError::Invalid("x".into())), 7),
            (PluginError::NotChained, 7),
            (PluginError::AgentUnreachable(ClientError::Timeout), 11),
            (
                PluginError::AgentRefused {
                    what: "ADD",
                    namespace: "shop".into(),
                    name: "web-0".into(),
                    status: 500,
                    body: "pod shop/web-0 is not in the registry".into(),
                },
                100,
            ),
        ];
        for (error, code) in cases {
            let json = error.to_json("0.4.0");
            assert_eq!(json["code"], code, "{error}");
            assert_eq!(json["cniVersion"], "0.4.0");
            assert!(json["msg"].as_str().is_some_and(|msg| !msg.is_empty()));
            assert_eq!(json["details"], ErrorChain(&error).to_string());
        }
    }
}
