//! How the Kubernetes API's objects become the mesh: the cluster's id and
//! DNS domain, the root namespace, and whether dry-run policies are sent,
//! with istiod's defaults. The conversion itself is
//! `ztunnel_mesh::kube::convert`'s.

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Deserialize;
use ztunnel_mesh::kube::convert::ConvertSettings;
use ztunnel_mesh::kube::convert::export_to::ServiceEntryVisibility;

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
    /// Istio's mesh config (YAML, as in the `istio` ConfigMap's `mesh`
    /// key); its `serviceEntryVisibility` decides who sees each
    /// ServiceEntry, as istiod's. Its other fields are not read here.
    #[arg(long, value_name = "FILE")]
    mesh_config: Option<PathBuf>,
}

/// The part of Istio's mesh config the conversion reads.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct MeshConfig {
    #[serde(default)]
    service_entry_visibility: Option<ServiceEntryVisibility>,
}

/// Reads the mesh config at `path`; an unreadable or malformed file stops
/// start-up, naming it.
fn read_mesh_config(path: &Path) -> anyhow::Result<MeshConfig> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the mesh config {}", path.display()))?;
    let config: Option<MeshConfig> = serde_yaml_ng::from_str(&text)
        .with_context(|| format!("parsing the mesh config {}", path.display()))?;
    Ok(config.unwrap_or_default())
}

impl ConvertArgs {
    /// The conversion's settings, for identities in `trust_domain` and a
    /// control plane running in `system_namespace`.
    pub(crate) fn settings(
        &self,
        trust_domain: &str,
        system_namespace: &str,
    ) -> anyhow::Result<ConvertSettings> {
        let mesh_config = match &self.mesh_config {
            Some(path) => read_mesh_config(path)?,
            None => MeshConfig::default(),
        };
        Ok(ConvertSettings {
            cluster_id: self.cluster_id.clone(),
            trust_domain: trust_domain.to_owned(),
            cluster_domain: self.cluster_domain.clone(),
            root_namespace: self.root_namespace.clone(),
            enable_dry_run_policies: self.enable_dry_run_policies,
            system_namespace: system_namespace.to_owned(),
            service_entry_visibility: mesh_config.service_entry_visibility,
            ..ConvertSettings::default()
        })
    }
}
