//! Where the mesh comes from: a mesh file, or the Kubernetes API with a
//! kubeconfig or the pod's own credentials. Reading the file is
//! `ztunnel-mesh`'s business; what is watched on the API is
//! `kubernetes.rs`'s.

use std::path::{Path, PathBuf};

use ztunnel_control_plane::kubernetes;

/// The flags, flattened into `serve`'s command line.
#[derive(Debug, clap::Args)]
pub(crate) struct SourceArgs {
    /// Mesh file (YAML), the source of truth for impersonation and xDS:
    /// `{pods: [...], services: [...], policies: [...], networkGateways:
    /// [...], peerAuthentications: [...], rootNamespace, serviceEntries:
    /// [...], workloadEntries: [...]}`, or a bare list of pods. Pods: name, namespace, uid,
    /// serviceAccount, nodeName, phase, ips, labels, protocol (HBONE or
    /// TCP), network, clusterId, workloadName, locality {region, zone,
    /// subzone}, waypoint, applicationTunnel {protocol, port}. Services:
    /// name, namespace, hostname, vips, ports {servicePort: targetPort}, and
    /// selector (labels) or endpoints (pod uids); waypoint,
    /// weightedWaypoints [{waypoint, weight}], ingressUseWaypoint,
    /// subjectAltNames (SPIFFE identities, as a ServiceEntry's). A
    /// waypoint is {service: name or ns/name}, {hostname, namespace} or
    /// {address: net/ip}, each with an optional port (15008). Network
    /// gateways: network, namespace, serviceAccount, address or hostname,
    /// port. Policies: as ztunnel's local file, plus selector for scope
    /// WorkloadSelector. PeerAuthentications, oldest first: name,
    /// namespace, selector (labels), mode and portLevelMtls {port: mode}
    /// (Unset, Disable, Permissive or Strict); one without a selector in
    /// rootNamespace (istio-system) applies to the mesh, elsewhere to its
    /// namespace; they are sent as the Authorizations istiod makes of them.
    /// ServiceEntries and WorkloadEntries: Istio's objects as Kubernetes
    /// holds them ({metadata, spec}), made into services and workloads as
    /// istiod does; a ServiceEntry without addresses is given istiod's
    /// VIPs on each load (pinned by its status.addresses when written).
    /// Reloaded when it changes; a bad edit keeps the last
    /// good file. Without it no impersonation is authorized and xDS serves
    /// nothing.
    #[arg(long, visible_alias = "pods", conflicts_with_all = ["kubeconfig", "in_cluster"])]
    mesh: Option<PathBuf>,
    /// Take the mesh from the Kubernetes API with this kubeconfig, instead
    /// of a mesh file: Pods, Namespaces, Services, EndpointSlices, Nodes,
    /// security.istio.io AuthorizationPolicies and (when installed)
    /// PeerAuthentications, networking.istio.io ServiceEntries (whose
    /// allocated VIPs it writes into their status) and WorkloadEntries,
    /// Gateway API Gateways and GatewayClasses are watched, and callers'
    /// tokens are checked by TokenReview (the role it needs:
    /// deploy/rbac/control-plane.yaml).
    #[arg(long, conflicts_with = "in_cluster")]
    kubeconfig: Option<PathBuf>,
    /// As --kubeconfig, with the credentials of the pod this runs in.
    #[arg(long)]
    in_cluster: bool,
}

impl SourceArgs {
    /// A client of the Kubernetes API when the mesh comes from there;
    /// `None` when it comes from a mesh file (or there is none).
    pub(crate) async fn kubernetes_client(&self) -> anyhow::Result<Option<kube::Client>> {
        if self.kubeconfig.is_none() && !self.in_cluster {
            return Ok(None);
        }
        Ok(Some(kubernetes::client(self.kubeconfig.as_deref()).await?))
    }

    /// The mesh file, when the mesh comes from one.
    pub(crate) fn mesh_file(&self) -> Option<&Path> {
        self.mesh.as_deref()
    }
}
