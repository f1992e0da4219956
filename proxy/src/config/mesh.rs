//! Where this proxy stands in the mesh: its cluster, trust domain and
//! network, the node whose workloads are local, and the Istio release it
//! serves as ztunnel of. The xDS node id's other parts are `xds.rs`'s.

use std::sync::Arc;

use clap::ArgMatches;
use clap::parser::ValueSource;

/// The environment variable Istio's chart sets the cluster id in; it wins
/// over `CLUSTER_ID`, as it does for istio/ztunnel.
const ISTIO_CLUSTER_ID: &str = "ISTIO_META_CLUSTER_ID";

/// This group's part of the [`Config`](super::Config): its fields of the
/// same names.
pub(super) struct Mesh {
    pub cluster_id: String,
    pub trust_domain: String,
    pub istio_version: String,
    pub network: Arc<str>,
    pub node_name: Option<String>,
}

/// The flags and variables, flattened into the command line.
#[derive(Debug, clap::Args)]
pub(super) struct MeshArgs {
    /// Cluster ID sent to the CA and used for workloads without one
    /// (`ISTIO_META_CLUSTER_ID` wins over `CLUSTER_ID`).
    #[arg(long, env = "CLUSTER_ID", default_value = "Kubernetes")]
    cluster_id: String,
    /// The Istio release this proxy serves as ztunnel of, as Istio's
    /// images set it: the `tag` of `istio_build` and `IstioVersion` of
    /// `version`, which istioctl and dashboards compare with istiod's.
    #[arg(long, env = "ISTIO_META_ISTIO_VERSION", default_value = "unknown")]
    istio_version: String,
    /// Trust domain.
    #[arg(long, env = "TRUST_DOMAIN", default_value = "cluster.local")]
    trust_domain: String,
    /// The network of this node's pods, as the control plane names it
    /// (Istio's `NETWORK`, chart value `network`); empty is the default network.
    #[arg(long, env = "NETWORK", default_value = "")]
    network: String,
    /// Node whose workloads are local; unset makes every workload local.
    #[arg(long, env = "NODE_NAME")]
    node_name: Option<String>,
}

impl MeshArgs {
    /// The Istio release, which `version` prints.
    pub(super) fn istio_version(&self) -> &str {
        &self.istio_version
    }

    /// `NODE_NAME` as given: the xDS node id carries it too.
    pub(super) fn node_name(&self) -> Option<&str> {
        self.node_name.as_deref()
    }

    /// `ISTIO_META_CLUSTER_ID` from `env`, when not empty, replaces the
    /// cluster id, unless `--cluster-id` is on the command line.
    pub(super) fn prefer_istio_cluster_id(
        &mut self,
        matches: &ArgMatches,
        env: &[(String, String)],
    ) {
        let on_command_line = matches.value_source("cluster_id") == Some(ValueSource::CommandLine);
        if !on_command_line
            && let Some((_, id)) = env
                .iter()
                .find(|(name, id)| name == ISTIO_CLUSTER_ID && !id.is_empty())
        {
            self.cluster_id.clone_from(id);
        }
    }

    /// The settings; an empty node name counts as unset.
    pub(super) fn parse(self) -> Mesh {
        Mesh {
            cluster_id: self.cluster_id,
            trust_domain: self.trust_domain,
            istio_version: self.istio_version,
            network: self.network.into(),
            node_name: self.node_name.filter(|name| !name.is_empty()),
        }
    }
}
