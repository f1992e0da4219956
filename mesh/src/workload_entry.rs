//! A workload of the mesh that is not a pod: a WorkloadEntry (a VM, or any
//! address outside Kubernetes), or one endpoint of a ServiceEntry (written
//! inline, or the host itself for a DNS ServiceEntry without endpoints).
//! `kube/convert/workload_entry.rs` and `kube/convert/service_entry.rs`
//! build them from Istio's objects, as istiod does, and so does the mesh
//! file's loading for its `workloadEntries:` and `serviceEntries:`.
//!
//! Which services list one is `snapshot.rs`'s and xDS's business: a
//! service's selector picks the WorkloadEntries of its namespace as it
//! picks pods, and a ServiceEntry's own endpoints are named by its
//! services' `endpoints`.

use std::collections::BTreeMap;
use std::net::IpAddr;

use super::pod::{Labels, Locality, WorkloadProtocol, selects};

/// One non-pod workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadEntry {
    /// The WorkloadEntry's name, or the ServiceEntry's for its endpoints.
    pub name: String,
    /// The namespace.
    pub namespace: String,
    /// The xDS resource name and `Workload.uid`:
    /// `<cluster>/networking.istio.io/WorkloadEntry/<ns>/<name>`, or
    /// `<cluster>/networking.istio.io/ServiceEntry/<ns>/<name>/<address>`.
    pub uid: String,
    /// Where it is reached.
    pub address: EntryAddress,
    /// What selectors match (a WorkloadEntry's own labels), and where the
    /// canonical service name comes from (a ServiceEntry's labels for its
    /// endpoints).
    pub labels: Labels,
    /// The service account of its identity; may be empty.
    pub service_account: String,
    /// The network of its address; empty is the default one.
    pub network: String,
    /// Where it runs, for locality-aware load balancing.
    pub locality: Option<Locality>,
    /// `Workload.capacity`: its share against the service's other
    /// endpoints; absent is 1.
    pub weight: Option<u32>,
    /// Port name → its port: a service port of that name is received
    /// there.
    pub ports: BTreeMap<String, u16>,
    /// HBONE when it runs a tunnel of its own (`networking.istio.io/tunnel:
    /// http`) or is redirected into the mesh; plain TCP otherwise.
    pub protocol: WorkloadProtocol,
    /// It terminates HBONE itself.
    pub native_tunnel: bool,
    /// `Workload.workload_name`: the auto-registration group, the
    /// `service.istio.io/workload-name` label, else `name`.
    pub workload_name: String,
    /// The cluster it was read in; absent is the default cluster.
    pub cluster_id: Option<String>,
    /// The trust domain of its identity; absent is the CA's.
    pub trust_domain: Option<String>,
    /// For a ServiceEntry's endpoint, that ServiceEntry's name: such an
    /// endpoint serves only the services its ServiceEntry names it in, and
    /// no selector picks it.
    pub service_entry: Option<String>,
}

impl WorkloadEntry {
    /// Whether a service's selector of its namespace picks it: it is a
    /// WorkloadEntry (not a ServiceEntry's endpoint) carrying every
    /// selector label. The namespace is the caller's to compare.
    pub fn is_selected_by(&self, selector: &Labels) -> bool {
        self.service_entry.is_none() && selects(selector, &self.labels)
    }
}

/// Where a non-pod workload is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryAddress {
    /// At this IP.
    Ip(IpAddr),
    /// At what this name resolves to, looked up by ztunnel per connection.
    Hostname(String),
    /// Nowhere directly: only through its network's gateway.
    None,
}
