//! How the Kubernetes API's objects become the mesh: the cluster's id and
//! DNS domain, the root namespace, and whether dry-run policies are sent,
//! with istiod's defaults. The conversion itself is
//! `ztunnel_mesh::kube::convert`'s.

use ztunnel_mesh::kube::convert::ConvertSettings;

/// The flags, flattened into `serve`'s command line.
#[derive(Debug, clap::Args)]
pub(crate) struct ConvertArgs {
    /// Cluster id of the workloads (`Kubernetes` is istiod's default).
    #[arg(long, env = "CLUSTER_ID", default_value = "Kubernetes")]
    cluster_id: String,
    /// DNS domain of Service hostnames (`<name>.<ns>.svc.<domain>`).
    #[arg(long, default_value = "cluster.local")]
    cluster_domain: String,
    /// The mesh's root namespace: its policies without a selector apply to
    /// every namespace.
    #[arg(long, default_value = "istio-system")]
    root_namespace: String,
    /// Send AuthorizationPolicies annotated `istio.io/dry-run: "true"` with
    /// dry_run set (ztunnel logs, does not enforce); without it they are
    /// not sent, as istiod's default.
    #[arg(long)]
    enable_dry_run_policies: bool,
}

impl ConvertArgs {
    /// The conversion's settings, for identities in `trust_domain` and a
    /// control plane running in `system_namespace`.
    pub(crate) fn settings(&self, trust_domain: &str, system_namespace: &str) -> ConvertSettings {
        ConvertSettings {
            cluster_id: self.cluster_id.clone(),
            trust_domain: trust_domain.to_owned(),
            cluster_domain: self.cluster_domain.clone(),
            root_namespace: self.root_namespace.clone(),
            enable_dry_run_policies: self.enable_dry_run_policies,
            system_namespace: system_namespace.to_owned(),
            ..ConvertSettings::default()
        }
    }
}
