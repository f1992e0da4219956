//! ServiceEntries and WorkloadEntries on the real API server of
//! `kubernetes.rs`'s [`DbMesh`]: the VIP the control plane writes into a
//! ServiceEntry's status, and what a node agent's stream receives.

use ztunnel_mesh::kube::service_entry_crd::ServiceEntry;

use super::*;

/// A DNS ServiceEntry without addresses, endpoints or selector: the
/// control plane allocates its host a VIP, and the host is its own
/// endpoint, by hostname.
const EXTERNAL_API: &str = r#"
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: external-api, namespace: apps}
spec:
  hosts: [api.example.com]
  ports: [{number: 443, name: https, protocol: TLS}]
  location: MESH_EXTERNAL
  resolution: DNS
"#;

/// A VM as a WorkloadEntry (written against `v1beta1`), and a STATIC
/// ServiceEntry that selects it by label.
const VM_AND_ITS_SERVICE: &str = r#"
apiVersion: networking.istio.io/v1beta1
kind: WorkloadEntry
metadata: {name: vm-1, namespace: apps, labels: {app: vm}}
spec:
  address: 198.18.20.1
  serviceAccount: vm
  ports: {http: 8080}
---
apiVersion: networking.istio.io/v1alpha3
kind: ServiceEntry
metadata: {name: vm-service, namespace: apps}
spec:
  hosts: [vm.apps.internal]
  ports: [{number: 80, name: http}]
  location: MESH_INTERNAL
  resolution: STATIC
  workloadSelector: {labels: {app: vm}}
"#;

/// The addresses the control plane wrote into the ServiceEntry's status,
/// once it has.
async fn allocated_status(api: &KubeApi, namespace: &str, name: &str) -> Vec<String> {
    let client = api.admin_client().await.unwrap();
    let entries: kube::Api<ServiceEntry> = kube::Api::namespaced(client, namespace);
    let deadline = Instant::now() + CONVERGE;
    loop {
        let entry = entries.get(name).await.unwrap();
        let addresses: Vec<String> = entry
            .status
            .map(|status| status.addresses.into_iter().map(|a| a.value).collect())
            .unwrap_or_default();
        if !addresses.is_empty() {
            return addresses;
        }
        assert!(
            Instant::now() < deadline,
            "no addresses in {namespace}/{name}'s status"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Reads the stream's Address responses until `done` says every resource
/// it wanted has been seen.
async fn read_addresses(agent: &mut AdsStream, mut done: impl FnMut(&str, &Address) -> bool) {
    loop {
        let response = agent.next_acked().await;
        if response.type_url != ADDRESS_TYPE_URL {
            continue;
        }
        for resource in &response.resources {
            let Some(any) = resource.resource.as_ref() else {
                continue;
            };
            let decoded = Address::decode(any.value.as_slice()).unwrap();
            if done(&resource.name, &decoded) {
                return;
            }
        }
    }
}

/// A Service's VIPs as text.
fn vips(service: &ztunnel_proto::istio::workload::Service) -> Vec<String> {
    service
        .addresses
        .iter()
        .map(|vip| ip_text(&vip.address))
        .collect()
}

fn ip_text(bytes: &[u8]) -> String {
    match bytes.len() {
        4 => std::net::Ipv4Addr::from(<[u8; 4]>::try_from(bytes).unwrap()).to_string(),
        16 => std::net::Ipv6Addr::from(<[u8; 16]>::try_from(bytes).unwrap()).to_string(),
        _ => panic!("{bytes:?} is no address"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_entry_without_addresses_gets_a_vip_in_its_status_and_reaches_a_node_agent() {
    let Some(DbMesh {
        api,
        _server,
        mut agent,
        ..
    }) = db_mesh_with(EXTERNAL_API).await
    else {
        return;
    };
    let status = allocated_status(&api, "apps", "external-api").await;
    assert_eq!(
        status,
        ["240.240.0.1", "2001:2::1"],
        "one address of each of istiod's ranges for the one host"
    );
    let (mut service_seen, mut host_seen) = (false, false);
    read_addresses(&mut agent, |name, resource| {
        match &resource.r#type {
            Some(address::Type::Service(service)) if name == "apps/api.example.com" => {
                service_seen = vips(service) == status;
            }
            Some(address::Type::Workload(workload))
                if workload.uid.ends_with(
                    "/networking.istio.io/ServiceEntry/apps/external-api/api.example.com",
                ) =>
            {
                assert_eq!(
                    workload.hostname, "api.example.com",
                    "resolved by DNS at ztunnel"
                );
                assert!(workload.addresses.is_empty());
                assert!(workload.services.contains_key("apps/api.example.com"));
                host_seen = true;
            }
            _ => {}
        }
        service_seen && host_seen
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workload_entry_selected_by_a_service_entry_reaches_a_node_agent_as_its_endpoint() {
    let Some(DbMesh {
        api,
        _server,
        mut agent,
        ..
    }) = db_mesh_with(VM_AND_ITS_SERVICE).await
    else {
        return;
    };
    let status = allocated_status(&api, "apps", "vm-service").await;
    let (mut service_seen, mut vm_seen) = (false, false);
    read_addresses(&mut agent, |name, resource| {
        match &resource.r#type {
            Some(address::Type::Service(service)) if name == "apps/vm.apps.internal" => {
                service_seen = vips(service) == status;
            }
            Some(address::Type::Workload(workload))
                if workload
                    .uid
                    .ends_with("/networking.istio.io/WorkloadEntry/apps/vm-1") =>
            {
                assert_eq!(workload.addresses, [vec![198, 18, 20, 1]]);
                assert_eq!(workload.service_account, "vm");
                vm_seen = workload
                    .services
                    .get("apps/vm.apps.internal")
                    .is_some_and(|ports| {
                        ports.ports.len() == 1
                            && (ports.ports[0].service_port, ports.ports[0].target_port)
                                == (80, 8080)
                    });
            }
            _ => {}
        }
        service_seen && vm_seen
    })
    .await;
}
