//! Fuzzes the control plane's Kubernetes conversion (KUBERNETES.md
//! E2–E10): objects decoded from JSON as the watches decode them (Pods,
//! Namespaces, Services, EndpointSlices, Nodes, AuthorizationPolicies,
//! PeerAuthentications, Gateways, GatewayClasses, ServiceEntries,
//! WorkloadEntries, each list under its key: `pods`, `namespaces`,
//! `services`, `endpointSlices`, `nodes`, `authorizationPolicies`,
//! `peerAuthentications`, `gateways`, `gatewayClasses`, `serviceEntries`,
//! `workloadEntries`), then
//! `kube::convert::convert`, then what the control plane serves of the
//! result over xDS.
//!
//! Properties: no panic; the converted mesh always passes
//! `MeshSnapshot::new` (an object that would break it is left out and
//! reported, never failing the rest); every converted pod comes from an
//! input pod; the result does not depend on the order of the objects when
//! their names are unique; every resource served from it is accepted by
//! the proxy's xDS core (no NACK).

#![no_main]

use std::collections::HashSet;
use std::sync::Arc;

use k8s_openapi::Metadata;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use libfuzzer_sys::fuzz_target;
use serde::Deserialize;
use ztunnel_fuzz::check_served_to_proxy;
use ztunnel_mesh::MeshSnapshot;
use ztunnel_mesh::kube::convert::{ConvertSettings, KubeObjects, convert};
use ztunnel_mesh::kube::gateway_crd::{Gateway, GatewayClass};
use ztunnel_mesh::kube::peer_authentication_crd::PeerAuthentication;
use ztunnel_mesh::kube::policy_crd::AuthorizationPolicy;
use ztunnel_mesh::kube::service_entry_crd::ServiceEntry;
use ztunnel_mesh::kube::workload_entry_crd::WorkloadEntry;

/// The watches' stores, as one JSON document.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Objects {
    #[serde(default)]
    pods: Vec<Pod>,
    #[serde(default)]
    namespaces: Vec<Namespace>,
    #[serde(default)]
    services: Vec<Service>,
    #[serde(default)]
    endpoint_slices: Vec<EndpointSlice>,
    #[serde(default)]
    nodes: Vec<Node>,
    #[serde(default)]
    authorization_policies: Vec<AuthorizationPolicy>,
    #[serde(default)]
    peer_authentications: Vec<PeerAuthentication>,
    #[serde(default)]
    gateways: Vec<Gateway>,
    #[serde(default)]
    gateway_classes: Vec<GatewayClass>,
    #[serde(default)]
    service_entries: Vec<ServiceEntry>,
    #[serde(default)]
    workload_entries: Vec<WorkloadEntry>,
}

fn shared<T>(objects: Vec<T>) -> Vec<Arc<T>> {
    objects.into_iter().map(Arc::new).collect()
}

/// Whether no two objects share a namespace and name.
fn unique<T: Metadata<Ty = ObjectMeta>>(objects: &[Arc<T>]) -> bool {
    unique_by(objects, |object| object.metadata())
}

/// [`unique`] for types whose metadata `metadata` reaches.
fn unique_by<T>(objects: &[Arc<T>], metadata: impl Fn(&T) -> &ObjectMeta) -> bool {
    let mut seen = HashSet::new();
    objects.iter().all(|object| {
        let metadata = metadata(object);
        seen.insert((metadata.namespace.clone(), metadata.name.clone()))
    })
}

fn reversed<T>(objects: &[Arc<T>]) -> Vec<Arc<T>> {
    objects.iter().rev().cloned().collect()
}

fuzz_target!(|data: &[u8]| {
    let Ok(objects) = serde_json::from_slice::<Objects>(data) else {
        return;
    };
    let objects = KubeObjects {
        pods: shared(objects.pods),
        namespaces: shared(objects.namespaces),
        services: shared(objects.services),
        endpoint_slices: shared(objects.endpoint_slices),
        nodes: shared(objects.nodes),
        authorization_policies: shared(objects.authorization_policies),
        peer_authentications: shared(objects.peer_authentications),
        gateways: shared(objects.gateways),
        gateway_classes: shared(objects.gateway_classes),
        service_entries: shared(objects.service_entries),
        workload_entries: shared(objects.workload_entries),
    };
    let settings = ConvertSettings::default();
    let conversion = convert(&objects, &settings);

    let input_uids: HashSet<&str> = objects
        .pods
        .iter()
        .filter_map(|pod| pod.metadata.uid.as_deref())
        .collect();
    for pod in &conversion.mesh.pods {
        assert!(
            input_uids.contains(pod.uid.as_str()),
            "pod {} from nowhere",
            pod.uid
        );
    }

    if unique(&objects.pods)
        && unique(&objects.services)
        && unique(&objects.endpoint_slices)
        && unique(&objects.nodes)
        && unique(&objects.authorization_policies)
        && unique_by(&objects.peer_authentications, |peer| &peer.metadata)
        && unique_by(&objects.gateways, |gateway| &gateway.metadata)
        && unique_by(&objects.gateway_classes, |class| &class.metadata)
        && unique_by(&objects.service_entries, |entry| &entry.metadata)
        && unique_by(&objects.workload_entries, |entry| &entry.metadata)
    {
        let backwards = KubeObjects {
            pods: reversed(&objects.pods),
            namespaces: reversed(&objects.namespaces),
            services: reversed(&objects.services),
            endpoint_slices: reversed(&objects.endpoint_slices),
            nodes: reversed(&objects.nodes),
            authorization_policies: reversed(&objects.authorization_policies),
            peer_authentications: reversed(&objects.peer_authentications),
            gateways: reversed(&objects.gateways),
            gateway_classes: reversed(&objects.gateway_classes),
            service_entries: reversed(&objects.service_entries),
            workload_entries: reversed(&objects.workload_entries),
        };
        assert_eq!(convert(&backwards, &settings), conversion);
    }

    let snapshot = match MeshSnapshot::new(conversion.mesh) {
        Ok(snapshot) => snapshot,
        Err(error) => panic!("the conversion broke the mesh: {error}"),
    };
    check_served_to_proxy(&snapshot, &settings.trust_domain);
});
