//! The node untaint controller's settings (Kubernetes only), under istiod's
//! variable names where it has them. What the controller does is the
//! library's `untaint.rs`.

use ztunnel_control_plane::untaint::{DEFAULT_TAINT_KEY, UntaintConfig};

/// The flags, flattened into `serve`'s command line.
#[derive(Debug, clap::Args)]
pub(crate) struct UntaintArgs {
    /// Run the node untaint controller (Kubernetes only): remove the
    /// --taint-name taint from a node once the node agent pod there
    /// (label k8s-app=istio-cni-node in --taint-namespace) is Ready. Needs
    /// patch on nodes (deploy/rbac/control-plane-untaint.yaml).
    #[arg(long, env = "PILOT_ENABLE_NODE_UNTAINT_CONTROLLERS")]
    taint_enabled: bool,
    /// Namespace of the node agent pods; empty means the control plane's
    /// own (POD_NAMESPACE), else istio-system.
    #[arg(long, default_value = "")]
    taint_namespace: String,
    /// The taint the untaint controller removes.
    #[arg(long, env = "PILOT_NODE_UNTAINT_CONTROLLERS_TAINT_NAME", default_value = DEFAULT_TAINT_KEY)]
    taint_name: String,
}

impl UntaintArgs {
    /// The controller's configuration when it is to run, `None` when not;
    /// the node agents are in `pod_namespace`, the control plane's own,
    /// unless `--taint-namespace` names another.
    pub(crate) fn config(&self, pod_namespace: &str) -> Option<UntaintConfig> {
        if !self.taint_enabled {
            return None;
        }
        let agent_namespace = if self.taint_namespace.is_empty() {
            pod_namespace
        } else {
            &self.taint_namespace
        };
        Some(UntaintConfig {
            agent_namespace: agent_namespace.to_owned(),
            taint_key: self.taint_name.clone(),
        })
    }
}
