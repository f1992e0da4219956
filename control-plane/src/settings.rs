//! The `serve` command line of the `ztunnel-ca` binary (not of the
//! library): [`ServeArgs`], made of one group of flags per concern in
//! `settings/`, each with the conversion of its flags into the library's
//! types, and the duration syntax the flags share. What the settings do is
//! the library's business; `main.rs` wires them together.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use ztunnel_control_plane::ca::authz::{DEFAULT_TRUSTED_NODE_ACCOUNT, NodeAgentAccount};

mod authentication;
mod convert;
mod serving_cert;
mod signing;
mod source;
mod ttl;
mod untaint;

/// `serve`'s flags. A setting that several groups use is a field here; the
/// fields and the flattened groups are in the order `--help` lists them.
#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// Address of the gRPC/TLS listener.
    #[arg(long, default_value = "127.0.0.1:15012")]
    pub(crate) listen: SocketAddr,
    /// Trust domain of every issued identity.
    #[arg(long, default_value = "cluster.local")]
    pub(crate) trust_domain: String,
    #[command(flatten)]
    pub(crate) signing: signing::SigningArgs,
    /// Directory for the generated root and the local token key (mode 0700);
    /// not used on Kubernetes.
    #[arg(long, default_value = "ztunnel-ca-state")]
    pub(crate) state_dir: PathBuf,
    #[command(flatten)]
    pub(crate) source: source::SourceArgs,
    #[command(flatten)]
    pub(crate) convert: convert::ConvertArgs,
    #[command(flatten)]
    pub(crate) untaint: untaint::UntaintArgs,
    /// The namespace this control plane runs in (the downward API's): where
    /// the signing Secrets are, and the first namespace the root is
    /// published in.
    #[arg(long, env = "POD_NAMESPACE", default_value = "istio-system")]
    pub(crate) pod_namespace: String,
    /// Another namespace to publish the root in, as the ConfigMap
    /// istio-ca-root-cert that ztunnel mounts (Kubernetes only; always in
    /// --pod-namespace). Repeatable. istiod publishes it in every
    /// namespace; publishing only where ztunnel (or another reader) runs
    /// keeps the role to ConfigMaps in those namespaces alone, with no
    /// cluster-wide write (deploy/rbac/control-plane-ca.yaml).
    #[arg(long = "root-cert-namespace")]
    root_cert_namespaces: Vec<String>,
    /// How often the mesh file is checked for changes.
    #[arg(long, visible_alias = "pods-poll-interval", default_value = "1s", value_parser = parse_duration)]
    pub(crate) mesh_poll_interval: Duration,
    #[command(flatten)]
    pub(crate) authentication: authentication::AuthenticationArgs,
    /// A node agent (`namespace/service-account`) allowed to request the
    /// identities of pods on its node, and to subscribe to xDS. Repeatable.
    #[arg(long = "trusted-node-account", default_value = DEFAULT_TRUSTED_NODE_ACCOUNT)]
    pub(crate) trusted_node_accounts: Vec<NodeAgentAccount>,
    #[command(flatten)]
    pub(crate) ttl: ttl::TtlArgs,
    /// Address of the plain-HTTP /metrics listener.
    #[arg(long, default_value = "127.0.0.1:15014")]
    pub(crate) metrics_listen: SocketAddr,
    #[command(flatten)]
    pub(crate) serving_cert: serving_cert::ServingCertArgs,
}

impl ServeArgs {
    /// The namespaces the root is published in: the control plane's own and
    /// those of `--root-cert-namespace`.
    pub(crate) fn root_namespaces(&self) -> BTreeSet<String> {
        std::iter::once(&self.pod_namespace)
            .chain(&self.root_cert_namespaces)
            .cloned()
            .collect()
    }
}

/// Parses `45s`, `30m`, `24h`, `90d`.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let unit_at = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{text:?} needs a unit: s, m, h or d"))?;
    let (number, unit) = text.split_at(unit_at);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} does not start with a number"))?;
    let seconds_per_unit = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => {
            return Err(format!(
                "{text:?} has unknown unit {unit:?}; use s, m, h or d"
            ));
        }
    };
    number
        .checked_mul(seconds_per_unit)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("{text:?} is too long"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_a_unit() {
        let cases = [
            ("45s", Some(45)),
            ("30m", Some(1800)),
            ("24h", Some(86_400)),
            ("90d", Some(7_776_000)),
            ("0s", Some(0)),
            ("24", None),
            ("h", None),
            ("1.5h", None),
            ("1w", None),
            ("-1h", None),
            ("", None),
            ("99999999999999999999d", None),
        ];
        for (text, want) in cases {
            assert_eq!(
                parse_duration(text).ok(),
                want.map(Duration::from_secs),
                "{text}"
            );
        }
    }
}
