//! `/config_dump`: workloads, services, policies, certificates (identity
//! and validity only, never keys) and, in shared mode, the pods served.

use std::sync::Arc;
use std::time::SystemTime;

use serde_json::json;

use crate::admin::ConfigDump;
use crate::identity::manager::IdentityManager;
use crate::inpod::PodProxies;
use crate::inpod::workloads::Workloads;
use crate::state::SharedState;

/// `/config_dump`: workloads, services, policies and certificates (identity
/// and validity only, never keys).
pub struct Dump {
    /// Workloads, services and policies.
    pub state: SharedState,
    /// Certificates.
    pub identities: IdentityManager,
    /// The shared mode's pods; `None` in dedicated mode.
    pub pods: Option<Arc<Workloads>>,
}

impl ConfigDump for Dump {
    fn config_dump(&self) -> serde_json::Value {
        let state = self.state.read();
        let workloads: Vec<_> = state
            .workloads()
            .map(|workload| {
                json!({
                    "uid": &*workload.uid,
                    "name": &*workload.name,
                    "namespace": &*workload.namespace,
                    "addresses": workload.addresses.iter().map(ToString::to_string).collect::<Vec<_>>(),
                    "protocol": format!("{:?}", workload.protocol),
                    "serviceAccount": workload.service_account(),
                    "node": &*workload.node,
                    "status": format!("{:?}", workload.status),
                })
            })
            .collect();
        let services: Vec<_> = state
            .services()
            .map(|service| {
                json!({
                    "name": &*service.name,
                    "namespace": &*service.namespace,
                    "hostname": &*service.hostname,
                })
            })
            .collect();
        let policies: Vec<_> = state
            .policies()
            .map(|(key, policy)| {
                json!({
                    "key": &**key,
                    "name": &*policy.name,
                    "namespace": &*policy.namespace,
                    "action": format!("{:?}", policy.action),
                    "scope": format!("{:?}", policy.scope),
                    "dryRun": policy.dry_run,
                })
            })
            .collect();
        let certificates: Vec<_> = self
            .identities
            .snapshot()
            .into_iter()
            .map(|summary| {
                json!({
                    "identity": summary.identity.as_str(),
                    "state": format!("{:?}", summary.state),
                    "notBefore": summary.not_before.map(seconds),
                    "notAfter": summary.not_after.map(seconds),
                    "refreshAt": summary.refresh_at.map(seconds),
                })
            })
            .collect();
        json!({
            "workloads": workloads,
            "services": services,
            "policies": policies,
            "certificates": certificates,
            "pods": self.pods.as_ref().map(|pods| pods.served().iter().map(|uid| uid.to_string()).collect::<Vec<_>>()),
        })
    }
}

/// Seconds since the epoch, for the dump.
fn seconds(time: SystemTime) -> u64 {
    time.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs())
}
