//! Whether a stopping agent leaves the node's CNI installation in place:
//! Istio's safe upgrade (KUBERNETES.md B6). An agent whose DaemonSet still
//! exists, is not being deleted and still places a pod on this node is
//! being replaced (an upgrade, a node reboot): the plugin binary, its entry
//! and the host probe rules stay, so pods created before the next agent
//! answers fail their CNI ADD and are retried by the kubelet rather than
//! start outside the mesh. Anything else (`helm uninstall`, the node no
//! longer selected, a question the API does not answer) takes them out, so
//! that no node is left with a plugin nobody answers.
//!
//! [`decide`] is the decision, pure over what [`observe`] reads from the
//! API at SIGTERM; which nodes a DaemonSet places pods on is
//! `placement.rs`'s. Taking things out is `install.rs`'s and
//! `host_rules.rs`'s.

use std::fmt;
use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use ztunnel_certs::error_chain::ErrorChain;

use crate::plugin::config::AGENT_DAEMON_SET;

pub use placement::{NodeFacts, Placement, PlacementError};

mod placement;

/// How long the reads at SIGTERM may take together: well inside the
/// chart's 30 s grace period, which the uninstall still needs after them.
const OBSERVE_TIMEOUT: Duration = Duration::from_secs(10);

/// What the agent does with the installation when it stops.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ExitPolicy {
    /// Ask the API whether a new agent follows, and leave the installation
    /// only then (Istio's default).
    #[default]
    SafeUpgrade,
    /// Always leave it (`--keep-cni-on-exit`): for agents without the API,
    /// whose operator knows another agent follows. After an uninstall,
    /// new pods on the node fail until the entry is removed by hand.
    Keep,
    /// Always take it out (istio-cni's `AMBIENT_DISABLE_SAFE_UPGRADE`):
    /// pods created while the agent is replaced start outside the mesh.
    Remove,
}

/// The agent's own pod, from the downward API: its DaemonSet is the one
/// that would start the next agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentPod {
    /// `POD_NAMESPACE`, where the DaemonSet is.
    pub namespace: String,
    /// `POD_NAME`; without it (an agent run outside a pod) the DaemonSet
    /// is looked up by the charts' name, [`AGENT_DAEMON_SET`].
    pub name: Option<String>,
}

/// What the API said at SIGTERM about the agent's DaemonSet and node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observation {
    /// The agent takes its pods from a registry file: there is no API to ask.
    NoApi,
    /// A read failed or took longer than the agent may wait.
    Unanswered(String),
    /// The agent's pod has no DaemonSet for a controller.
    NotFromDaemonSet,
    /// The DaemonSet (this name) does not exist.
    DaemonSetGone(String),
    /// The DaemonSet, as read.
    DaemonSet(DaemonSetFacts),
}

/// The facts about a DaemonSet that tell whether it will start a new agent
/// on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonSetFacts {
    /// Its name, for the log.
    pub name: String,
    /// It has a `deletionTimestamp`: it is being deleted.
    pub deleting: bool,
    /// Where its pod template runs, or why that cannot be read.
    pub placement: Result<Placement, PlacementError>,
    /// This node, or `None` when the API no longer has it.
    pub node: Option<NodeFacts>,
}

/// What to do with the installation, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exit {
    /// Leave the plugin, its entry and the host probe rules.
    Keep(Reason),
    /// Take them out.
    Remove(Reason),
}

impl Exit {
    /// Whether the installation stays.
    pub fn keeps(&self) -> bool {
        matches!(self, Exit::Keep(_))
    }
}

/// Why an [`Exit`] was chosen, as the log says it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// `--keep-cni-on-exit`.
    KeepFlag,
    /// `AMBIENT_DISABLE_SAFE_UPGRADE`.
    SafeUpgradeDisabled,
    /// No API to ask.
    NoApi,
    /// The API did not answer.
    Unanswered(String),
    /// Nothing would start another agent.
    NotFromDaemonSet,
    /// The DaemonSet is gone: an uninstall.
    DaemonSetGone(String),
    /// The DaemonSet is being deleted: an uninstall.
    DaemonSetDeleting(String),
    /// The DaemonSet's placement cannot be read.
    PlacementUnreadable(String, PlacementError),
    /// The node is gone from the API.
    NodeGone,
    /// The DaemonSet no longer places a pod on this node.
    NodeNotSelected(String),
    /// The DaemonSet will start the next agent here: an upgrade or a reboot.
    Replaced(String),
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::KeepFlag => f.write_str("--keep-cni-on-exit"),
            Reason::SafeUpgradeDisabled => {
                f.write_str("safe upgrade disabled (AMBIENT_DISABLE_SAFE_UPGRADE)")
            }
            Reason::NoApi => f.write_str("no Kubernetes API to ask whether another agent follows"),
            Reason::Unanswered(why) => write!(
                f,
                "the API did not say whether another agent follows: {why}"
            ),
            Reason::NotFromDaemonSet => f.write_str("the agent's pod is not run by a DaemonSet"),
            Reason::DaemonSetGone(name) => write!(f, "DaemonSet {name} is gone"),
            Reason::DaemonSetDeleting(name) => write!(f, "DaemonSet {name} is being deleted"),
            Reason::PlacementUnreadable(name, error) => {
                write!(f, "DaemonSet {name}'s placement cannot be read: {error}")
            }
            Reason::NodeGone => f.write_str("this node is gone from the API"),
            Reason::NodeNotSelected(name) => {
                write!(f, "DaemonSet {name} no longer places a pod on this node")
            }
            Reason::Replaced(name) => write!(
                f,
                "DaemonSet {name} still places an agent on this node: an upgrade or a reboot"
            ),
        }
    }
}

/// The decision: an explicit policy wins; otherwise only a DaemonSet that
/// is not being deleted and still places a pod on this node keeps the
/// installation. Every doubt removes it, as istio-cni does with a chained
/// configuration: a node left with a plugin nobody answers fails every
/// new pod for good, while an agent replaced without it only lets the pods
/// of a few seconds start unmeshed.
pub fn decide(policy: ExitPolicy, observation: &Observation) -> Exit {
    let facts = match (policy, observation) {
        (ExitPolicy::Keep, _) => return Exit::Keep(Reason::KeepFlag),
        (ExitPolicy::Remove, _) => return Exit::Remove(Reason::SafeUpgradeDisabled),
        (ExitPolicy::SafeUpgrade, Observation::DaemonSet(facts)) => facts,
        (ExitPolicy::SafeUpgrade, Observation::NoApi) => return Exit::Remove(Reason::NoApi),
        (ExitPolicy::SafeUpgrade, Observation::Unanswered(why)) => {
            return Exit::Remove(Reason::Unanswered(why.clone()));
        }
        (ExitPolicy::SafeUpgrade, Observation::NotFromDaemonSet) => {
            return Exit::Remove(Reason::NotFromDaemonSet);
        }
        (ExitPolicy::SafeUpgrade, Observation::DaemonSetGone(name)) => {
            return Exit::Remove(Reason::DaemonSetGone(name.clone()));
        }
    };
    let name = facts.name.clone();
    if facts.deleting {
        return Exit::Remove(Reason::DaemonSetDeleting(name));
    }
    let placement = match &facts.placement {
        Ok(placement) => placement,
        Err(error) => return Exit::Remove(Reason::PlacementUnreadable(name, error.clone())),
    };
    match &facts.node {
        None => Exit::Remove(Reason::NodeGone),
        Some(node) if !placement.selects(node) => Exit::Remove(Reason::NodeNotSelected(name)),
        Some(_) => Exit::Keep(Reason::Replaced(name)),
    }
}

/// Reads what [`decide`] needs: the agent's pod and its DaemonSet owner
/// (or the DaemonSet named [`AGENT_DAEMON_SET`] when the pod's name is
/// unknown or the pod is already gone), and this node. Bounded by
/// `OBSERVE_TIMEOUT` (10 s). Needs `get` on pods, on the DaemonSet and on
/// nodes.
pub async fn observe(client: kube::Client, agent: &AgentPod, node_name: &str) -> Observation {
    tokio::time::timeout(OBSERVE_TIMEOUT, read(client, agent, node_name))
        .await
        .unwrap_or_else(|_| {
            Observation::Unanswered(format!("no answer within {OBSERVE_TIMEOUT:?}"))
        })
}

async fn read(client: kube::Client, agent: &AgentPod, node_name: &str) -> Observation {
    let failed = |what: &str, error: kube::Error| {
        Observation::Unanswered(format!("reading {what}: {}", ErrorChain(&error)))
    };
    let name = match &agent.name {
        Some(pod_name) => {
            let pods: Api<Pod> = Api::namespaced(client.clone(), &agent.namespace);
            match pods.get_opt(pod_name).await {
                Ok(Some(pod)) => match daemon_set_owner(&pod) {
                    Some(name) => name,
                    None => return Observation::NotFromDaemonSet,
                },
                Ok(None) => AGENT_DAEMON_SET.to_owned(),
                Err(error) => return failed(&format!("pod {pod_name}"), error),
            }
        }
        None => AGENT_DAEMON_SET.to_owned(),
    };
    let daemon_sets: Api<DaemonSet> = Api::namespaced(client.clone(), &agent.namespace);
    let daemon_set = match daemon_sets.get_opt(&name).await {
        Ok(Some(daemon_set)) => daemon_set,
        Ok(None) => return Observation::DaemonSetGone(name),
        Err(error) => return failed(&format!("DaemonSet {name}"), error),
    };
    let nodes: Api<Node> = Api::all(client);
    let node = match nodes.get_opt(node_name).await {
        Ok(node) => node.map(|node| NodeFacts {
            name: node_name.to_owned(),
            labels: node.metadata.labels.unwrap_or_default(),
        }),
        Err(error) => return failed(&format!("node {node_name}"), error),
    };
    Observation::DaemonSet(DaemonSetFacts {
        name,
        deleting: daemon_set.metadata.deletion_timestamp.is_some(),
        placement: Placement::of(daemon_set.spec.template.spec.as_ref()),
        node,
    })
}

/// The name of the DaemonSet that controls `pod`, if one does.
fn daemon_set_owner(pod: &Pod) -> Option<String> {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .find(|owner| owner.controller == Some(true) && owner.kind == "DaemonSet")
        .map(|owner| owner.name.clone())
}

#[cfg(test)]
mod tests;
