//! The chained CNI plugin (`ztunnel-cni`, CNI spec 1.0 and earlier 0.3+).
//!
//! It runs after the node's main plugin. For a pod in an ambient namespace,
//! ADD tells the node agent (`POST /cmdadd`, WIRE.md §6), with the moment
//! it stops waiting, and fails unless the agent answers 200 by then: a pod
//! must never start silently outside the mesh.
//! It then prints `prevResult` unchanged. DEL tells the agent (`POST
//! /cmddel`) and succeeds even when the agent is away, because the agent
//! prunes pods whose netns vanished when it starts. CHECK asks the agent
//! whether it holds the pod (`GET /pods/<ns>/<name>`). Pods outside ambient
//! namespaces, and the agent's own pods (so that a new agent can start
//! while its predecessor's entry waits for it), pass through without the
//! agent being contacted.
//!
//! Configuration keys are in [`config`]; the environment in [`mod@env`]; the
//! mapping of failures to CNI error codes in [`error`].

use std::io::Read;
use std::time::SystemTime;

use http::StatusCode;
use ztunnel_certs::error_chain::ErrorChain;

use crate::event::{CMD_ADD_PATH, CMD_DEL_PATH, CmdAdd, CmdDel, PODS_PATH};

use client::{AGENT_TIMEOUT, AgentClient};
use config::{ConfigError, MAX_CONFIG_BYTES, PluginConfig, SUPPORTED_VERSIONS};
use env::{CniEnv, Command, K8sPod};
use error::PluginError;

pub mod client;
pub mod config;
pub mod env;
pub mod error;
pub mod result;

/// Version used for errors raised before the configuration is parsed.
const FALLBACK_VERSION: &str = "1.0.0";

/// What the binary writes and how it exits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginOutput {
    /// Written to stdout: the result, the version list, or the error JSON.
    pub stdout: String,
    /// Lines for stderr: things the runtime should log but not fail on.
    pub warnings: Vec<String>,
    /// Exit status zero or not.
    pub success: bool,
}

/// Runs one invocation with the runtime's environment variables and stdin.
pub fn run(vars: impl IntoIterator<Item = (String, String)>, stdin: impl Read) -> PluginOutput {
    let mut warnings = Vec::new();
    let mut version = FALLBACK_VERSION.to_owned();
    // Stdin is read first and whole, whatever comes next: a runtime that
    // writes the configuration must not see a broken pipe.
    let outcome = read_stdin(stdin).and_then(|stdin| {
        let env = CniEnv::from_vars(vars)?;
        dispatch(&env, &stdin, &mut version, &mut warnings)
    });
    match outcome {
        Ok(stdout) => PluginOutput {
            stdout: stdout.map(|json| json.to_string()).unwrap_or_default(),
            warnings,
            success: true,
        },
        Err(error) => PluginOutput {
            stdout: error.to_json(&version).to_string(),
            warnings,
            success: false,
        },
    }
}

/// Reads the network configuration, refusing one over
/// [`MAX_CONFIG_BYTES`] rather than parsing a truncated document.
fn read_stdin(stdin: impl Read) -> Result<Vec<u8>, PluginError> {
    let mut bytes = Vec::new();
    // One byte past the bound tells a configuration at the bound from a
    // larger one.
    stdin
        .take(MAX_CONFIG_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(PluginError::Stdin)?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(ConfigError::TooLarge.into());
    }
    Ok(bytes)
}

/// Runs the command; `version` is set as soon as the configuration is read,
/// so that errors are written in the runtime's version.
fn dispatch(
    env: &CniEnv,
    stdin: &[u8],
    version: &mut String,
    warnings: &mut Vec<String>,
) -> Result<Option<serde_json::Value>, PluginError> {
    if env.command == Command::Version {
        let requested =
            config::requested_version(stdin).unwrap_or_else(|| FALLBACK_VERSION.to_owned());
        return Ok(Some(serde_json::json!({
            "cniVersion": requested,
            "supportedVersions": SUPPORTED_VERSIONS,
        })));
    }
    let config = PluginConfig::parse(stdin)?;
    version.clone_from(&config.cni_version);
    let pod = env
        .pod
        .as_ref()
        .filter(|pod| config.captures(&pod.namespace, &pod.name));
    match env.command {
        Command::Add => add(env, &config, pod).map(Some),
        Command::Del => del(env, &config, pod, warnings).map(|()| None),
        Command::Check => check(&config, pod).map(|()| None),
        Command::Version => Ok(None),
    }
}

fn add(
    env: &CniEnv,
    config: &PluginConfig,
    pod: Option<&K8sPod>,
) -> Result<serde_json::Value, PluginError> {
    let prev_result = config.prev_result.as_ref().ok_or(PluginError::NotChained)?;
    if let Some(pod) = pod {
        let event = CmdAdd {
            netns: env.netns.clone().unwrap_or_default(),
            pod_name: pod.name.clone(),
            pod_namespace: pod.namespace.clone(),
            ips: result::pod_ips(prev_result)?,
            pod_uid: pod.uid.clone(),
            // The exchange's own timeout starts just after this: by this
            // deadline the plugin has stopped waiting and fails the ADD.
            deadline: Some(SystemTime::now() + AGENT_TIMEOUT),
        };
        let client = AgentClient::new(config.agent_socket.clone());
        let reply = block_on(client.post_json(CMD_ADD_PATH, &event))?
            .map_err(PluginError::AgentUnreachable)?;
        if reply.status != StatusCode::OK {
            return Err(refused("ADD", pod, reply.status, reply.body));
        }
    }
    Ok(result::passthrough(prev_result, &config.cni_version))
}

fn del(
    env: &CniEnv,
    config: &PluginConfig,
    pod: Option<&K8sPod>,
    warnings: &mut Vec<String>,
) -> Result<(), PluginError> {
    let Some(pod) = pod else { return Ok(()) };
    let event = CmdDel {
        netns: env.netns.clone().unwrap_or_default(),
        pod_name: pod.name.clone(),
        pod_namespace: pod.namespace.clone(),
        pod_uid: pod.uid.clone(),
    };
    let client = AgentClient::new(config.agent_socket.clone());
    match block_on(client.post_json(CMD_DEL_PATH, &event))? {
        Ok(reply) if reply.status == StatusCode::OK => Ok(()),
        Ok(reply) => Err(refused("DEL", pod, reply.status, reply.body)),
        Err(error) => {
            warnings.push(format!(
                "ztunnel-cni: DEL of pod {}/{}: {}; the agent prunes it when it starts",
                pod.namespace,
                pod.name,
                ErrorChain(&error)
            ));
            Ok(())
        }
    }
}

fn check(config: &PluginConfig, pod: Option<&K8sPod>) -> Result<(), PluginError> {
    let Some(pod) = pod else { return Ok(()) };
    let client = AgentClient::new(config.agent_socket.clone());
    let path = format!("{PODS_PATH}{}/{}", pod.namespace, pod.name);
    let reply = block_on(client.get(&path))?.map_err(PluginError::AgentUnreachable)?;
    if reply.status != StatusCode::OK {
        return Err(PluginError::NotInMesh {
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            status: reply.status.as_u16(),
            body: reply.body,
        });
    }
    Ok(())
}

fn refused(what: &'static str, pod: &K8sPod, status: StatusCode, body: String) -> PluginError {
    PluginError::AgentRefused {
        what,
        namespace: pod.namespace.clone(),
        name: pod.name.clone(),
        status: status.as_u16(),
        body,
    }
}

/// Runs one agent exchange on a single-threaded runtime: the plugin is a
/// short-lived process that makes at most one request.
fn block_on<T>(future: impl Future<Output = T>) -> Result<T, PluginError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(PluginError::Runtime)?;
    Ok(runtime.block_on(future))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stdin that fails, as a closed or broken descriptor does.
    struct BrokenStdin;

    impl Read for BrokenStdin {
        fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
            Err(std::io::Error::other("broken pipe"))
        }
    }

    fn version_vars() -> Vec<(String, String)> {
        vec![("CNI_COMMAND".into(), "VERSION".into())]
    }

    #[test]
    fn unreadable_or_oversized_stdin_is_its_own_error() {
        let output = run(version_vars(), BrokenStdin);
        assert!(!output.success);
        let json: serde_json::Value = serde_json::from_str(&output.stdout).unwrap();
        assert_eq!(json["code"], 5, "{json}");
        assert!(json["details"].as_str().unwrap().contains("broken pipe"));

        let huge = vec![b' '; usize::try_from(MAX_CONFIG_BYTES).unwrap() + 1];
        let output = run(version_vars(), huge.as_slice());
        assert!(!output.success);
        let json: serde_json::Value = serde_json::from_str(&output.stdout).unwrap();
        assert_eq!(json["code"], 7, "{json}");
        assert!(json["details"].as_str().unwrap().contains("larger than"));

        let at_bound = vec![b' '; usize::try_from(MAX_CONFIG_BYTES).unwrap()];
        assert!(run(version_vars(), at_bound.as_slice()).success);
    }
}
