//! The VIP allocator's shell: istiod gives every ServiceEntry without
//! addresses (and not of `resolution: NONE`) one IPv4 and one IPv6
//! address per host and writes them into its `status.addresses`, where
//! the conversion reads them back, so that our DNS proxy answers the hosts
//! and ztunnel routes them. What to write is the pure
//! `ztunnel_mesh::kube::convert::allocation::allocate` over every
//! ServiceEntry; this controller watches them and writes each change.
//!
//! A write carries the resourceVersion it was decided on: if another
//! writer (a second replica, istiod) changed the object meanwhile, the API
//! server refuses it and the next pass decides again on the newer version.
//! Without the ServiceEntry CRD the watch keeps retrying quietly (one info
//! line). It needs `patch` on `serviceentries/status`
//! (`deploy/rbac/control-plane.yaml`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use kube::Api;
use kube::api::{Patch, PatchParams};
use tokio::sync::Notify;
use ztunnel_certs::error_chain::ErrorChain;
use ztunnel_mesh::kube::convert::allocation::{StatusChange, allocate};
use ztunnel_mesh::kube::service_entry_crd::ServiceEntry;

use crate::kubernetes::watch_optional_waking;

/// The controller's name in logs.
const CONTROLLER: &str = "service entry addresses";

/// How often the ServiceEntries are looked at again without an event: a
/// write that failed (conflict, API outage) is retried at this pace at the
/// latest.
const RESYNC: Duration = Duration::from_secs(30);

/// Runs the controller until `shutdown` resolves.
pub async fn run(client: kube::Client, shutdown: impl Future<Output = ()> + Send) {
    let changed = Arc::new(Notify::new());
    let store = watch_optional_waking(
        Api::<ServiceEntry>::all(client.clone()),
        (CONTROLLER, "ServiceEntry", "ServiceEntry CRD not installed"),
        &changed,
    );
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => return,
            () = changed.notified() => {}
            () = tokio::time::sleep(RESYNC) => {}
        }
        // Decide only on a complete list: an allocation made without every
        // ServiceEntry in view could hand out an address already held.
        if store.wait_until_ready().await.is_err() {
            continue;
        }
        let entries = store.state();
        let versions: HashMap<(String, String), Option<String>> = entries
            .iter()
            .filter_map(|entry| {
                let metadata = &entry.metadata;
                let key = (metadata.namespace.clone()?, metadata.name.clone()?);
                Some((key, metadata.resource_version.clone()))
            })
            .collect();
        for change in allocate(&entries) {
            let version = versions
                .get(&(change.namespace.clone(), change.name.clone()))
                .cloned()
                .flatten();
            write(&client, &change, version).await;
        }
    }
}

/// Writes one status on the version it was decided on.
async fn write(client: &kube::Client, change: &StatusChange, resource_version: Option<String>) {
    let api: Api<ServiceEntry> = Api::namespaced(client.clone(), &change.namespace);
    let patch = serde_json::json!({
        "metadata": {"resourceVersion": resource_version},
        "status": {"addresses": change.addresses},
    });
    let entry = format!("{}/{}", change.namespace, change.name);
    let addresses = change
        .addresses
        .iter()
        .map(|address| format!("{} ({})", address.value, address.host))
        .collect::<Vec<_>>()
        .join(", ");
    match api
        .patch_status(&change.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => {
            tracing::info!(service_entry = %entry, addresses, "ServiceEntry addresses written")
        }
        Err(error) => tracing::warn!(
            service_entry = %entry,
            error = %ErrorChain(&error),
            "writing the ServiceEntry's status addresses failed; retrying on the next change"
        ),
    }
}
