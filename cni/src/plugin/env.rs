//! The CNI environment (`CNI_COMMAND`, `CNI_CONTAINERID`, `CNI_NETNS`,
//! `CNI_IFNAME`, `CNI_ARGS`, `CNI_PATH`), parsed once from the variables the
//! runtime set. This is the only place the plugin reads its environment; the
//! binary hands the variables in, so tests never touch the process's own.

use std::collections::HashMap;

/// The operation the runtime asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// Set up the container's networking.
    Add,
    /// Tear it down; may be repeated.
    Del,
    /// Confirm it is as set up.
    Check,
    /// Report the supported spec versions.
    Version,
}

/// The variables of one plugin invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniEnv {
    /// `CNI_COMMAND`.
    pub command: Command,
    /// `CNI_CONTAINERID`; required for ADD, DEL and CHECK.
    pub container_id: Option<String>,
    /// `CNI_NETNS`; required for ADD and CHECK, optional for DEL (the
    /// sandbox may already be gone).
    pub netns: Option<String>,
    /// `CNI_IFNAME`; required for ADD, DEL and CHECK.
    pub ifname: Option<String>,
    /// The Kubernetes pod named in `CNI_ARGS`, if the runtime named one.
    pub pod: Option<K8sPod>,
}

/// The pod a Kubernetes runtime names in `CNI_ARGS`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct K8sPod {
    /// `K8S_POD_NAMESPACE`.
    pub namespace: String,
    /// `K8S_POD_NAME`.
    pub name: String,
    /// `K8S_POD_UID`; empty when absent (older runtimes omit it).
    pub uid: String,
}

impl CniEnv {
    /// Parses the variables; unrelated ones are ignored.
    pub fn from_vars(vars: impl IntoIterator<Item = (String, String)>) -> Result<CniEnv, EnvError> {
        let mut vars: HashMap<String, String> = vars
            .into_iter()
            .filter(|(key, _)| key.starts_with("CNI_"))
            .collect();
        let mut take = |key: &str| vars.remove(key).filter(|value| !value.is_empty());
        let command = match take("CNI_COMMAND").as_deref() {
            Some("ADD") => Command::Add,
            Some("DEL") => Command::Del,
            Some("CHECK") => Command::Check,
            Some("VERSION") => Command::Version,
            Some(other) => return Err(EnvError::UnknownCommand(other.to_owned())),
            None => return Err(EnvError::Missing("CNI_COMMAND")),
        };
        let env = CniEnv {
            command,
            container_id: take("CNI_CONTAINERID"),
            netns: take("CNI_NETNS"),
            ifname: take("CNI_IFNAME"),
            pod: take("CNI_ARGS")
                .map(|args| parse_k8s_args(&args))
                .transpose()?
                .flatten(),
        };
        env.require()?;
        Ok(env)
    }

    /// Checks the variables the command needs (CNI spec, "Parameters").
    fn require(&self) -> Result<(), EnvError> {
        let needs_netns = matches!(self.command, Command::Add | Command::Check);
        if self.command == Command::Version {
            return Ok(());
        }
        if self.container_id.is_none() {
            return Err(EnvError::Missing("CNI_CONTAINERID"));
        }
        if self.ifname.is_none() {
            return Err(EnvError::Missing("CNI_IFNAME"));
        }
        if needs_netns && self.netns.is_none() {
            return Err(EnvError::Missing("CNI_NETNS"));
        }
        Ok(())
    }
}

/// Parses `CNI_ARGS` (`KEY=VALUE;KEY=VALUE`). Returns the pod when both
/// `K8S_POD_NAMESPACE` and `K8S_POD_NAME` are there, `None` when neither
/// is (a container that is not a Kubernetes pod).
pub fn parse_k8s_args(args: &str) -> Result<Option<K8sPod>, EnvError> {
    let (mut namespace, mut name, mut uid) = (None, None, None);
    for pair in args.split(';').filter(|pair| !pair.is_empty()) {
        let (key, value) = pair
            .split_once('=')
            .ok_or_else(|| EnvError::BadArgs(format!("{pair:?} is not KEY=VALUE")))?;
        match key {
            "K8S_POD_NAMESPACE" => namespace = Some(value.to_owned()),
            "K8S_POD_NAME" => name = Some(value.to_owned()),
            "K8S_POD_UID" => uid = Some(value.to_owned()),
            // IgnoreUnknown, K8S_POD_INFRA_CONTAINER_ID and others.
            _ => {}
        }
    }
    match (namespace, name) {
        (Some(namespace), Some(name)) if !namespace.is_empty() && !name.is_empty() => {
            Ok(Some(K8sPod {
                namespace,
                name,
                uid: uid.unwrap_or_default(),
            }))
        }
        (None, None) => Ok(None),
        _ => Err(EnvError::BadArgs(
            "K8S_POD_NAMESPACE and K8S_POD_NAME must both be set and non-empty".into(),
        )),
    }
}

/// Why the environment was refused (CNI error code 4).
#[derive(Debug, thiserror::Error)]
pub enum EnvError {
    /// A variable the command needs is unset or empty.
    #[error("{0} is not set")]
    Missing(&'static str),
    /// `CNI_COMMAND` names no command of the spec.
    #[error("unknown CNI_COMMAND {0:?}")]
    UnknownCommand(String),
    /// `CNI_ARGS` is malformed.
    #[error("CNI_ARGS: {0}")]
    BadArgs(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn k8s_args_parse() {
        let pod = |namespace: &str, name: &str, uid: &str| {
            Some(K8sPod {
                namespace: namespace.into(),
                name: name.into(),
                uid: uid.into(),
            })
        };
        let cases = [
            (
                "K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web-0;K8S_POD_UID=u1",
                Ok(pod("shop", "web-0", "u1")),
            ),
            (
                "IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=abc",
                Ok(pod("shop", "web-0", "")),
            ),
            ("K8S_POD_NAME=a;K8S_POD_NAMESPACE=b;", Ok(pod("b", "a", ""))),
            ("", Ok(None)),
            ("IgnoreUnknown=1", Ok(None)),
            ("K8S_POD_NAME=a", Err(())),
            ("K8S_POD_NAME=;K8S_POD_NAMESPACE=b", Err(())),
            ("K8S_POD_NAME", Err(())),
        ];
        for (args, want) in cases {
            assert_eq!(parse_k8s_args(args).map_err(|_| ()), want, "{args}");
        }
    }

    #[test]
    fn required_variables_depend_on_the_command() {
        let base = [
            ("CNI_CONTAINERID", "c1"),
            ("CNI_NETNS", "/run/netns/x"),
            ("CNI_IFNAME", "eth0"),
            ("PATH", "/bin"),
        ];
        let with = |command: &str, drop: &str| {
            let mut pairs: Vec<(&str, &str)> =
                base.iter().copied().filter(|(k, _)| *k != drop).collect();
            pairs.push(("CNI_COMMAND", command));
            CniEnv::from_vars(vars(&pairs))
        };
        assert!(with("ADD", "").is_ok());
        assert!(matches!(
            with("ADD", "CNI_NETNS"),
            Err(EnvError::Missing("CNI_NETNS"))
        ));
        assert!(matches!(
            with("CHECK", "CNI_IFNAME"),
            Err(EnvError::Missing("CNI_IFNAME"))
        ));
        assert!(with("DEL", "CNI_NETNS").is_ok());
        assert!(matches!(
            with("DEL", "CNI_CONTAINERID"),
            Err(EnvError::Missing(_))
        ));
        assert!(matches!(
            with("BOGUS", ""),
            Err(EnvError::UnknownCommand(_))
        ));
        assert_eq!(
            CniEnv::from_vars(vars(&[("CNI_COMMAND", "VERSION")]))
                .unwrap()
                .command,
            Command::Version
        );
        assert!(matches!(
            CniEnv::from_vars(vars(&[])),
            Err(EnvError::Missing("CNI_COMMAND"))
        ));
    }
}
