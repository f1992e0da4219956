#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test
//! Waypoints from the Gateway API, against a real API server: the control
//! plane is ready before the Gateway API CRDs exist, picks them up once
//! installed, addresses its `istio-waypoint` Gateway (status addresses
//! from the Service named after it), and serves the binding a namespace
//! label makes over xDS, and its removal. Also the network (the system
//! namespace's label), locality (the node's labels) and traffic
//! distribution (a namespace annotation) that reach the same resources.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use api::{ROLE, api_with_control_plane_account, stored_roots, wait_ready};
use prost::Message;
use rustls::pki_types::CertificateDer;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Streaming};
use ztunnel_proto::envoy::config::core::v3::Node;
use ztunnel_proto::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use ztunnel_proto::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DeltaDiscoveryResponse};
use ztunnel_proto::istio::workload::gateway_address::Destination;
use ztunnel_proto::istio::workload::{
    Address, GatewayAddress, NamespacedHostname, Service, Workload, address,
};
use ztunnel_proto::xds_types::ADDRESS_TYPE_URL;
use ztunnel_test_support::kube::KubeApi;
use ztunnel_test_support::kube::objects::{
    PodSpecForTest, create_pod, ensure_namespace, request_token, set_pod_running,
};
use ztunnel_test_support::skip::skip;

#[path = "support/api.rs"]
mod api;
#[path = "support/ca_client.rs"]
#[allow(dead_code)] // shared with tests that use all of it
mod ca_client;
#[path = "support/serve.rs"]
mod serve;

/// How long a change in the API may take to reach xDS. A kind installed
/// after the control plane started is found on its watch's next retry,
/// which backs off up to kube-runtime's cap; the rest takes well under a
/// second. The time taken is printed.
const CONVERGE: Duration = Duration::from_secs(60);

/// The app's Service and the waypoint's, in `ns1`.
const SERVICES: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: echo, namespace: ns1}
spec:
  selector: {app: echo}
  ports: [{name: tcp, port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: waypoint, namespace: ns1}
spec:
  selector: {gateway.networking.k8s.io/gateway-name: waypoint}
  ports: [{name: mesh, port: 15008}]
"#;

/// The waypoint, as `istioctl waypoint generate` writes it.
const WAYPOINT: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: waypoint, namespace: ns1}
spec:
  gatewayClassName: istio-waypoint
  listeners: [{name: mesh, port: 15008, protocol: HBONE}]
"#;

/// Latest state of every Address resource a delta ADS stream has sent.
struct AddressView {
    requests: mpsc::Sender<DeltaDiscoveryRequest>,
    inbound: Streaming<DeltaDiscoveryResponse>,
    resources: HashMap<String, Address>,
}

impl AddressView {
    async fn open(grpc: SocketAddr, roots: &[CertificateDer<'static>], token: &str) -> Self {
        let channel = ca_client::channel(grpc, roots).await;
        let (requests, outbound) = mpsc::channel(4);
        requests
            .send(DeltaDiscoveryRequest {
                node: Some(Node {
                    id: "ztunnel~198.18.0.11~ztunnel-a.istio-system~istio-system.svc.cluster.local"
                        .into(),
                    ..Node::default()
                }),
                type_url: ADDRESS_TYPE_URL.into(),
                ..DeltaDiscoveryRequest::default()
            })
            .await
            .unwrap();
        let mut request = Request::new(ReceiverStream::new(outbound));
        let value = format!("Bearer {token}").parse().unwrap();
        request.metadata_mut().insert("authorization", value);
        let inbound = AggregatedDiscoveryServiceClient::new(channel)
            .delta_aggregated_resources(request)
            .await
            .unwrap()
            .into_inner();
        AddressView {
            requests,
            inbound,
            resources: HashMap::new(),
        }
    }

    /// Reads responses (ACKing each) until `holds` is true of the view.
    async fn until(&mut self, what: &str, holds: impl Fn(&HashMap<String, Address>) -> bool) {
        let started = Instant::now();
        while !holds(&self.resources) {
            let left = CONVERGE.saturating_sub(started.elapsed());
            let response = tokio::time::timeout(left, self.inbound.message())
                .await
                .unwrap_or_else(|_| panic!("{what}: not within {CONVERGE:?}"))
                .unwrap()
                .expect("an open stream");
            for resource in response.resources {
                let any = resource.resource.unwrap();
                let decoded = Address::decode(any.value.as_slice()).unwrap();
                self.resources.insert(resource.name, decoded);
            }
            for name in response.removed_resources {
                self.resources.remove(&name);
            }
            let ack = DeltaDiscoveryRequest {
                type_url: response.type_url,
                response_nonce: response.nonce,
                ..DeltaDiscoveryRequest::default()
            };
            self.requests.send(ack).await.unwrap();
        }
        eprintln!("{what}: {:?}", started.elapsed());
    }
}

/// Namespace `ns1`, and node-a's ztunnel pod running (the caller whose
/// xDS stream the tests read); its uid.
async fn node_a_ztunnel(client: &kube::Client) -> String {
    ensure_namespace(client, "ns1", &[]).await.unwrap();
    let ztunnel_a = create_pod(
        client,
        &PodSpecForTest {
            namespace: "istio-system".into(),
            name: "ztunnel-a".into(),
            service_account: "ztunnel".into(),
            node: "node-a".into(),
            ..PodSpecForTest::default()
        },
    )
    .await
    .unwrap();
    set_pod_running(
        client,
        "istio-system",
        "ztunnel-a",
        &["198.18.0.11".parse().unwrap()],
        true,
    )
    .await
    .unwrap();
    ztunnel_a
}

fn service<'a>(resources: &'a HashMap<String, Address>, name: &str) -> Option<&'a Service> {
    match &resources.get(name)?.r#type {
        Some(address::Type::Service(service)) => Some(service),
        _ => None,
    }
}

fn workload<'a>(resources: &'a HashMap<String, Address>, name: &str) -> Option<&'a Workload> {
    match &resources.get(name)?.r#type {
        Some(address::Type::Workload(workload)) => Some(workload),
        _ => None,
    }
}

/// The Gateway's status addresses as `type=value`, once it has some.
fn status_addresses(api: &KubeApi) -> Option<Vec<String>> {
    let jsonpath = "jsonpath={range .status.addresses[*]}{.type}={.value}{\"\\n\"}{end}";
    let text = api
        .kubectl(
            &["get", "gateway", "waypoint", "-n", "ns1", "-o", jsonpath],
            None,
        )
        .unwrap();
    let lines: Vec<String> = text.lines().map(str::to_owned).collect();
    (!lines.is_empty()).then_some(lines)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_label_binds_its_services_not_its_pods_to_the_addressed_waypoint() {
    let crds = match KubeApi::gateway_api_crds() {
        Ok(crds) => crds,
        Err(reason) => {
            skip(reason);
            return;
        }
    };
    let Some((api, kubeconfig)) = api_with_control_plane_account(ROLE).await else {
        return;
    };
    let client = api.admin_client().await.unwrap();
    let ztunnel_a = node_a_ztunnel(&client).await;
    create_pod(
        &client,
        &PodSpecForTest {
            namespace: "ns1".into(),
            name: "echo-0".into(),
            service_account: "echo".into(),
            node: "node-a".into(),
            labels: [("app".to_owned(), "echo".to_owned())].into(),
            ..PodSpecForTest::default()
        },
    )
    .await
    .unwrap();
    set_pod_running(
        &client,
        "ns1",
        "echo-0",
        &["198.18.10.5".parse().unwrap()],
        true,
    )
    .await
    .unwrap();
    api.kubectl(&["apply", "-f", "-"], Some(SERVICES)).unwrap();

    // Ready without the Gateway API.
    let state = api.dir().join("ca-state");
    let (_server, grpc, http) = serve::start(&state, &["--kubeconfig", &kubeconfig], "info");
    wait_ready(http).await;
    let roots = stored_roots(&client).await;
    let token = request_token(
        &client,
        "istio-system",
        "ztunnel",
        Some(("ztunnel-a", &ztunnel_a)),
        Some("istio-ca"),
    )
    .await
    .unwrap();
    let mut view = AddressView::open(grpc, &roots, &token).await;
    let echo = "ns1/echo.ns1.svc.cluster.local";
    let echo_pod = "Kubernetes//Pod/ns1/echo-0";
    view.until("the app's Service and pod served", |resources| {
        service(resources, echo).is_some() && workload(resources, echo_pod).is_some()
    })
    .await;

    // The Gateway API installed later, and a waypoint: addressed from its
    // Service.
    api.install_gateway_api_crds(&crds).unwrap();
    api.kubectl(&["apply", "-f", "-"], Some(WAYPOINT)).unwrap();
    let started = Instant::now();
    let addresses = loop {
        if let Some(addresses) = status_addresses(&api) {
            break addresses;
        }
        assert!(
            started.elapsed() < CONVERGE,
            "the waypoint is never addressed"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!("waypoint addressed: {:?}", started.elapsed());
    let cluster_ip = api
        .kubectl(
            &[
                "get",
                "service",
                "waypoint",
                "-n",
                "ns1",
                "-o",
                "jsonpath={.spec.clusterIP}",
            ],
            None,
        )
        .unwrap();
    assert_eq!(
        addresses,
        [
            "Hostname=waypoint.ns1.svc.cluster.local".to_owned(),
            format!("IPAddress={cluster_ip}"),
        ]
    );

    // The namespace label binds the Service (waypoint-for defaults to
    // service), not the pod.
    let bound = Some(GatewayAddress {
        destination: Some(Destination::Hostname(NamespacedHostname {
            namespace: "ns1".into(),
            hostname: "waypoint.ns1.svc.cluster.local".into(),
        })),
        hbone_mtls_port: 15008,
    });
    api.kubectl(
        &[
            "label",
            "namespace",
            "ns1",
            "istio.io/use-waypoint=waypoint",
        ],
        None,
    )
    .unwrap();
    view.until("the Service bound", |resources| {
        service(resources, echo).is_some_and(|service| service.waypoint == bound)
    })
    .await;
    assert_eq!(workload(&view.resources, echo_pod).unwrap().waypoint, None);
    let waypoint_service = service(&view.resources, "ns1/waypoint.ns1.svc.cluster.local").unwrap();
    assert_eq!(
        waypoint_service.waypoint, None,
        "the waypoint's own Service is never bound, as istiod's managed one"
    );

    api.kubectl(
        &["label", "namespace", "ns1", "istio.io/use-waypoint-"],
        None,
    )
    .unwrap();
    view.until("the binding removed", |resources| {
        service(resources, echo).is_some_and(|service| service.waypoint.is_none())
    })
    .await;
    assert_eq!(
        status_addresses(&api).map(|addresses| addresses.len()),
        Some(2),
        "status addresses are never removed"
    );
}

/// A node in region `eu`, zone `eu-1`, subzone `rack-7`.
const NODE: &str = r#"
apiVersion: v1
kind: Node
metadata:
  name: node-a
  labels:
    topology.kubernetes.io/region: eu
    topology.kubernetes.io/zone: eu-1
    topology.istio.io/subzone: rack-7
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workloads_and_vips_take_the_system_namespaces_network_and_pods_their_nodes_locality() {
    let Some((api, kubeconfig)) = api_with_control_plane_account(ROLE).await else {
        return;
    };
    let client = api.admin_client().await.unwrap();
    api.kubectl(&["apply", "-f", "-"], Some(NODE)).unwrap();
    api.kubectl(
        &[
            "label",
            "namespace",
            "istio-system",
            "topology.istio.io/network=net-1",
        ],
        None,
    )
    .unwrap();
    let ztunnel_a = node_a_ztunnel(&client).await;
    api.kubectl(&["apply", "-f", "-"], Some(SERVICES)).unwrap();
    api.kubectl(
        &[
            "annotate",
            "namespace",
            "ns1",
            "networking.istio.io/traffic-distribution=PreferClose",
        ],
        None,
    )
    .unwrap();

    let state = api.dir().join("ca-state");
    let (_server, grpc, http) = serve::start(&state, &["--kubeconfig", &kubeconfig], "info");
    wait_ready(http).await;
    let roots = stored_roots(&client).await;
    let token = request_token(
        &client,
        "istio-system",
        "ztunnel",
        Some(("ztunnel-a", &ztunnel_a)),
        Some("istio-ca"),
    )
    .await
    .unwrap();
    let mut view = AddressView::open(grpc, &roots, &token).await;
    let ztunnel = "Kubernetes//Pod/istio-system/ztunnel-a";
    let echo = "ns1/echo.ns1.svc.cluster.local";
    view.until("the pod and the Service served", |resources| {
        workload(resources, ztunnel).is_some() && service(resources, echo).is_some()
    })
    .await;
    let pod = workload(&view.resources, ztunnel).unwrap();
    assert_eq!(pod.network, "net-1");
    let locality = pod.locality.clone().unwrap();
    assert_eq!(
        (locality.region, locality.zone, locality.subzone),
        ("eu".into(), "eu-1".into(), "rack-7".into())
    );
    let echo_service = service(&view.resources, echo).unwrap();
    assert!(
        echo_service
            .addresses
            .iter()
            .all(|vip| vip.network == "net-1"),
        "every VIP on the network"
    );
    let balancing = echo_service.load_balancing.clone().unwrap();
    assert_eq!(
        balancing.routing_preference.len(),
        3,
        "the namespace's PreferClose: network, region, zone"
    );
}
