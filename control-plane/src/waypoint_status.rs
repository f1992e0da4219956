//! The status writer of our waypoints: a Gateway counts as a waypoint once
//! its status lists an address (AMBIENT.md §1.2). istiod writes them for
//! the Gateways it deploys; we deploy no waypoint proxies, so for every
//! Gateway of class `istio-waypoint` this controller writes them once the
//! Service named after the Gateway, in its namespace, has a cluster IP:
//! the Service's hostname, then each cluster IP. What to write is the pure
//! `ztunnel_mesh::kube::convert::status_addresses`; addresses are only
//! ever added, as istiod does.
//!
//! Unlike istiod, it does not wait for the Service to have endpoints on
//! the listener ports: the waypoint's pods are not ours to watch come up,
//! and a Service without endpoints is the operator's to fix (ztunnel then
//! refuses the bound traffic rather than sending it around the waypoint,
//! AMBIENT.md §1.5).
//!
//! Without the Gateway API CRDs the watch keeps retrying quietly (one info
//! line), and the controller starts writing once they are installed. It
//! needs `patch` on `gateways/status` (`deploy/rbac/control-plane.yaml`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube::runtime::watcher;
use tokio::sync::Notify;
use ztunnel_certs::error_chain::ErrorChain;
use ztunnel_mesh::kube::convert::status_addresses;
use ztunnel_mesh::kube::gateway_crd::Gateway;

use crate::kubernetes::{watch_optional_waking, watch_waking};

/// The controller's name in logs.
const CONTROLLER: &str = "waypoint status";

/// How often the Gateways are looked at again without an event: a patch
/// that failed (API outage) is retried at this pace.
const RESYNC: Duration = Duration::from_secs(30);

/// Runs the controller until `shutdown` resolves. `cluster_domain` makes
/// the Services' hostnames.
pub async fn run(
    client: kube::Client,
    cluster_domain: String,
    shutdown: impl Future<Output = ()> + Send,
) {
    let changed = Arc::new(Notify::new());
    let gateways: Api<Gateway> = Api::all(client.clone());
    let gateway_store = watch_optional_waking(
        gateways,
        (CONTROLLER, "Gateway", "Gateway API CRDs not installed"),
        &changed,
    );
    let services = watch_waking(
        Api::<Service>::all(client.clone()),
        watcher::Config::default(),
        (CONTROLLER, "Service"),
        &changed,
    );
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => return,
            () = changed.notified() => {}
            () = tokio::time::sleep(RESYNC) => {}
        }
        let services: HashMap<(String, String), Arc<Service>> = services
            .state()
            .into_iter()
            .filter_map(|service| {
                let key = (
                    service.metadata.namespace.clone()?,
                    service.metadata.name.clone()?,
                );
                Some((key, service))
            })
            .collect();
        for gateway in gateway_store.state() {
            let (Some(namespace), Some(name)) = (
                gateway.metadata.namespace.as_deref(),
                gateway.metadata.name.as_deref(),
            ) else {
                continue;
            };
            let service = services
                .get(&(namespace.to_owned(), name.to_owned()))
                .map(Arc::as_ref);
            if let Some(addresses) = status_addresses(&gateway, service, &cluster_domain) {
                write(&client, &gateway, namespace, name, addresses).await;
            }
        }
    }
}

/// Writes the status addresses on the version of the Gateway read, so
/// that a concurrent writer's addresses are never overwritten: a conflict
/// waits for the watch to bring the newer version.
async fn write(
    client: &kube::Client,
    gateway: &Gateway,
    namespace: &str,
    name: &str,
    addresses: Vec<ztunnel_mesh::kube::gateway_crd::GatewayStatusAddress>,
) {
    let api: Api<Gateway> = Api::namespaced(client.clone(), namespace);
    let patch = serde_json::json!({
        "metadata": {"resourceVersion": gateway.metadata.resource_version},
        "status": {"addresses": addresses},
    });
    match api
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => tracing::info!(
            gateway = %format_args!("{namespace}/{name}"),
            addresses = addresses_text(&addresses),
            "waypoint addressed"
        ),
        Err(error) => tracing::warn!(
            gateway = %format_args!("{namespace}/{name}"),
            error = %ErrorChain(&error),
            "writing the waypoint's status addresses failed; retrying on the next change"
        ),
    }
}

fn addresses_text(addresses: &[ztunnel_mesh::kube::gateway_crd::GatewayStatusAddress]) -> String {
    addresses
        .iter()
        .map(|address| address.value.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}
