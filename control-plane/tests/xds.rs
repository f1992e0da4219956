#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test
//! The control plane's delta ADS over real TLS and gRPC on the CA's port,
//! with real tokens and a real mesh file: what subscribers get, what a file
//! edit pushes, reconnects, refusals, bad edits, NACKs, and shutdown.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Request, Status, Streaming};
use ztunnel_certs::csr::CertRequest;
use ztunnel_control_plane::ca::authn::{DEFAULT_AUDIENCE, DEFAULT_ISSUER};
use ztunnel_control_plane::ca::token::{PodToken, TokenSigner};
use ztunnel_proto::envoy::config::core::v3::Node;
use ztunnel_proto::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use ztunnel_proto::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DeltaDiscoveryResponse};
use ztunnel_proto::istio::security::Authorization;
use ztunnel_proto::istio::workload::{Address, address};
use ztunnel_proto::xds_types::{ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL};

#[path = "support/ca_client.rs"]
mod ca_client;
#[path = "support/server.rs"]
mod test_server;

const HOUR: Duration = Duration::from_secs(3600);

/// How long a test waits for something that should happen: generous, for
/// a loaded machine; passing tests never wait this long.
const PATIENCE: Duration = Duration::from_secs(10);

/// How long a test waits to see that nothing arrives: several mesh file
/// polls (20 ms each).
const QUIET: Duration = Duration::from_millis(400);

const MESH: &str = "\
pods:
- {name: ztunnel-a, namespace: istio-system, uid: uid-za, serviceAccount: ztunnel, nodeName: node-a}
- {name: ztunnel-b, namespace: istio-system, uid: uid-zb, serviceAccount: ztunnel, nodeName: node-b}
- {name: app-a, namespace: default, uid: uid-app, serviceAccount: app, nodeName: node-a, ips: [10.0.0.10], labels: {app: app}}
- {name: echo-b, namespace: default, uid: uid-echo, serviceAccount: echo, nodeName: node-b, ips: [10.0.0.20], labels: {app: echo}}
- {name: legacy-b, namespace: default, uid: uid-legacy, serviceAccount: legacy, nodeName: node-b, ips: [10.0.0.30], protocol: TCP}
services:
- {name: echo, namespace: default, hostname: echo.default.svc.cluster.local, vips: [10.96.0.10], ports: {80: 8080}, selector: {app: echo}}
policies:
- name: echo-allow-app
  namespace: default
  scope: WorkloadSelector
  selector: {app: echo}
  action: Allow
  rules: [[[{principals: [!Exact cluster.local/ns/default/sa/app]}]]]
";

/// The CA and xDS running in-process on loopback.
type Plane = test_server::TestServer;

async fn start(mesh: &str) -> Plane {
    test_server::start(mesh).await
}

impl Plane {
    fn token(&self, namespace: &str, service_account: &str, pod: &str, uid: &str) -> String {
        self.token_issued(
            namespace,
            service_account,
            pod,
            uid,
            SystemTime::now(),
            HOUR,
        )
    }

    /// A token of `pod` issued at `issued`, valid for `ttl` from then.
    fn token_issued(
        &self,
        namespace: &str,
        service_account: &str,
        pod: &str,
        uid: &str,
        issued: SystemTime,
        ttl: Duration,
    ) -> String {
        let token = PodToken {
            issuer: DEFAULT_ISSUER.into(),
            audiences: vec![DEFAULT_AUDIENCE.into()],
            namespace: namespace.into(),
            service_account: service_account.into(),
            pod_name: pod.into(),
            pod_uid: uid.into(),
            node_name: None,
            ttl,
        };
        self.signer.mint(&token, issued).unwrap()
    }

    fn ztunnel(&self, node: &str) -> String {
        let pod = format!("ztunnel-{node}");
        self.token("istio-system", "ztunnel", &pod, &format!("uid-z{node}"))
    }

    /// Replaces the mesh file in one step, so a poll never reads half of it.
    fn write_mesh(&self, text: &str) {
        let next = self.mesh.with_extension("next");
        std::fs::write(&next, text).unwrap();
        std::fs::rename(&next, &self.mesh).unwrap();
    }

    async fn metrics(&self) -> String {
        ca_client::metrics(self.metrics_addr).await
    }

    /// Waits until `/metrics` has `line`.
    async fn wait_for_metric(&self, line: &str) {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let text = self.metrics().await;
            if text.lines().any(|l| l == line) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no {line:?} in\n{text}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Opens a stream with `token` (if any) and sends the initial requests
    /// ztunnel sends (Address, then Authorization), each with the versions
    /// in `known`.
    async fn subscribe(
        &self,
        token: Option<&str>,
        known: &HashMap<&str, HashMap<String, String>>,
    ) -> Result<Subscriber, Status> {
        let channel = ca_client::channel(self.addr, self.issuer.roots()).await;
        let mut client = AggregatedDiscoveryServiceClient::new(channel);
        let (requests, outbound) = mpsc::channel(16);
        for type_url in [ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL] {
            requests
                .send(DeltaDiscoveryRequest {
                    node: Some(Node {
                        id:
                            "ztunnel~10.0.0.1~ztunnel-a.istio-system~istio-system.svc.cluster.local"
                                .into(),
                        ..Node::default()
                    }),
                    type_url: type_url.into(),
                    initial_resource_versions: known.get(type_url).cloned().unwrap_or_default(),
                    ..DeltaDiscoveryRequest::default()
                })
                .await
                .unwrap();
        }
        let mut request = Request::new(ReceiverStream::new(outbound));
        if let Some(token) = token {
            let value = format!("Bearer {token}").parse().unwrap();
            request.metadata_mut().insert("authorization", value);
        }
        let inbound = client
            .delta_aggregated_resources(request)
            .await?
            .into_inner();
        Ok(Subscriber { requests, inbound })
    }
}

/// One ADS stream, as a ztunnel holds it.
struct Subscriber {
    requests: mpsc::Sender<DeltaDiscoveryRequest>,
    inbound: Streaming<DeltaDiscoveryResponse>,
}

impl Subscriber {
    async fn next(&mut self) -> DeltaDiscoveryResponse {
        tokio::time::timeout(PATIENCE, self.inbound.message())
            .await
            .expect("a response in time")
            .unwrap()
            .expect("an open stream")
    }

    /// Receives a response and ACKs it, as ztunnel does.
    async fn next_acked(&mut self) -> DeltaDiscoveryResponse {
        let response = self.next().await;
        self.reply(&response, None).await;
        response
    }

    /// The initial responses of both types, ACKed, by type URL.
    async fn initial(&mut self) -> HashMap<String, DeltaDiscoveryResponse> {
        let mut responses = HashMap::new();
        for _ in 0..2 {
            let response = self.next_acked().await;
            responses.insert(response.type_url.clone(), response);
        }
        responses
    }

    /// An ACK, or a NACK with `error`.
    async fn reply(&self, response: &DeltaDiscoveryResponse, error: Option<&str>) {
        let request = DeltaDiscoveryRequest {
            type_url: response.type_url.clone(),
            response_nonce: response.nonce.clone(),
            error_detail: error.map(|message| ztunnel_proto::google::rpc::Status {
                message: message.into(),
                ..Default::default()
            }),
            ..DeltaDiscoveryRequest::default()
        };
        self.requests.send(request).await.unwrap();
    }

    /// Asserts that nothing arrives for a while.
    async fn assert_quiet(&mut self) {
        if let Ok(message) = tokio::time::timeout(QUIET, self.inbound.message()).await {
            panic!("expected nothing, got {message:?}");
        }
    }
}

/// Name → version of a response's resources.
fn versions(response: &DeltaDiscoveryResponse) -> HashMap<String, String> {
    response
        .resources
        .iter()
        .map(|r| (r.name.clone(), r.version.clone()))
        .collect()
}

fn sorted_names(response: &DeltaDiscoveryResponse) -> Vec<&str> {
    let mut names: Vec<&str> = response.resources.iter().map(|r| r.name.as_str()).collect();
    names.sort_unstable();
    names
}

fn address(response: &DeltaDiscoveryResponse, name: &str) -> address::Type {
    let resource = response.resources.iter().find(|r| r.name == name).unwrap();
    let any = resource.resource.as_ref().unwrap();
    assert_eq!(any.type_url, ADDRESS_TYPE_URL);
    Address::decode(any.value.as_slice())
        .unwrap()
        .r#type
        .unwrap()
}

#[tokio::test]
async fn a_node_agent_gets_every_workload_service_and_policy() {
    let plane = start(MESH).await;
    let token = plane.ztunnel("a");
    let mut subscriber = plane
        .subscribe(Some(&token), &HashMap::new())
        .await
        .unwrap();
    let initial = subscriber.initial().await;

    let addresses = &initial[ADDRESS_TYPE_URL];
    assert_eq!(
        sorted_names(addresses),
        [
            "default/echo.default.svc.cluster.local",
            "uid-app",
            "uid-echo",
            "uid-legacy"
        ],
        "pods without IPs (the ztunnels) are no workloads"
    );
    assert!(addresses.removed_resources.is_empty());
    let address::Type::Workload(echo) = address(addresses, "uid-echo") else {
        panic!("uid-echo is a workload")
    };
    assert_eq!(echo.addresses, [vec![10, 0, 0, 20]]);
    assert_eq!(echo.node, "node-b");
    assert_eq!(echo.trust_domain, "cluster.local");
    assert_eq!(echo.authorization_policies, ["default/echo-allow-app"]);
    let ports = &echo.services["default/echo.default.svc.cluster.local"].ports;
    assert_eq!((ports[0].service_port, ports[0].target_port), (80, 8080));
    let address::Type::Workload(legacy) = address(addresses, "uid-legacy") else {
        panic!("uid-legacy is a workload")
    };
    assert_eq!(
        legacy.tunnel_protocol, 0,
        "TCP pods are TunnelProtocol NONE"
    );
    let address::Type::Service(service) =
        address(addresses, "default/echo.default.svc.cluster.local")
    else {
        panic!("a service")
    };
    assert_eq!(service.addresses[0].address, [10, 96, 0, 10]);

    let policies = &initial[AUTHORIZATION_TYPE_URL];
    assert_eq!(sorted_names(policies), ["default/echo-allow-app"]);
    let any = policies.resources[0].resource.as_ref().unwrap();
    let policy = Authorization::decode(any.value.as_slice()).unwrap();
    assert_eq!(
        (policy.namespace.as_str(), policy.name.as_str()),
        ("default", "echo-allow-app")
    );
    assert_eq!(policy.rules[0].clauses[0].matches[0].principals.len(), 1);
    assert_ne!(addresses.nonce, policies.nonce, "nonces are unique");

    // A type this server does not serve is answered, empty.
    let unknown = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
    subscriber
        .requests
        .send(DeltaDiscoveryRequest {
            type_url: unknown.into(),
            ..DeltaDiscoveryRequest::default()
        })
        .await
        .unwrap();
    let response = subscriber.next_acked().await;
    assert_eq!(
        (response.type_url.as_str(), response.resources.len()),
        (unknown, 0)
    );
    subscriber.assert_quiet().await;
    plane.wait_for_metric("ca_xds_clients 1").await;
}

#[tokio::test]
async fn empty_types_are_answered_too() {
    // The pods-only list form, with no pod that makes a workload.
    let plane = start(
        "- {name: ztunnel-a, namespace: istio-system, uid: uid-za, serviceAccount: ztunnel, nodeName: node-a}\n",
    )
    .await;
    let mut subscriber = plane
        .subscribe(Some(&plane.ztunnel("a")), &HashMap::new())
        .await
        .unwrap();
    let initial = subscriber.initial().await;
    for type_url in [ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL] {
        let response = &initial[type_url];
        assert!(response.resources.is_empty(), "{type_url}");
        assert!(response.removed_resources.is_empty(), "{type_url}");
    }
}

#[tokio::test]
async fn a_file_edit_pushes_only_what_changed_to_every_subscriber() {
    let plane = start(MESH).await;
    let mut subscribers = Vec::new();
    for node in ["a", "b", "a"] {
        let mut subscriber = plane
            .subscribe(Some(&plane.ztunnel(node)), &HashMap::new())
            .await
            .unwrap();
        subscriber.initial().await;
        subscribers.push(subscriber);
    }
    plane.wait_for_metric("ca_xds_clients 3").await;

    // One pod changes its IP.
    let moved = MESH.replace("10.0.0.30", "10.0.0.31");
    plane.write_mesh(&moved);
    for subscriber in &mut subscribers {
        let push = subscriber.next_acked().await;
        assert_eq!(push.type_url, ADDRESS_TYPE_URL);
        assert_eq!(
            sorted_names(&push),
            ["uid-legacy"],
            "that one resource, not the world"
        );
        assert!(push.removed_resources.is_empty());
        let address::Type::Workload(legacy) = address(&push, "uid-legacy") else {
            panic!("a workload")
        };
        assert_eq!(legacy.addresses, [vec![10, 0, 0, 31]]);
    }
    for subscriber in &mut subscribers {
        subscriber.assert_quiet().await;
    }

    // The pod goes away.
    let gone: String = moved
        .lines()
        .filter(|line| !line.contains("legacy-b"))
        .map(|line| format!("{line}\n"))
        .collect();
    plane.write_mesh(&gone);
    for subscriber in &mut subscribers {
        let push = subscriber.next_acked().await;
        assert_eq!(push.type_url, ADDRESS_TYPE_URL);
        assert!(push.resources.is_empty());
        assert_eq!(push.removed_resources, ["uid-legacy"]);
    }

    // A policy edit pushes the policy, and the workloads whose list of
    // selector policies changed.
    plane.write_mesh(&gone.replace(
        "selector: {app: echo}\n  action: Allow",
        "selector: {app: app}\n  action: Deny",
    ));
    for subscriber in &mut subscribers {
        let mut pushes = HashMap::new();
        for _ in 0..2 {
            let push = subscriber.next_acked().await;
            pushes.insert(push.type_url.clone(), push);
        }
        assert_eq!(
            sorted_names(&pushes[ADDRESS_TYPE_URL]),
            ["uid-app", "uid-echo"]
        );
        assert_eq!(
            sorted_names(&pushes[AUTHORIZATION_TYPE_URL]),
            ["default/echo-allow-app"]
        );
    }
    let text = plane.metrics().await;
    assert!(
        text.contains("ca_xds_pushes_total{type=\"address\"} 12"),
        "{text}"
    );
}

#[tokio::test]
async fn a_reconnect_is_sent_only_what_changed_while_away() {
    let plane = start(MESH).await;
    let token = plane.ztunnel("b");
    let mut subscriber = plane
        .subscribe(Some(&token), &HashMap::new())
        .await
        .unwrap();
    let initial = subscriber.initial().await;
    drop(subscriber);
    let known = HashMap::from([
        (ADDRESS_TYPE_URL, versions(&initial[ADDRESS_TYPE_URL])),
        (
            AUTHORIZATION_TYPE_URL,
            versions(&initial[AUTHORIZATION_TYPE_URL]),
        ),
    ]);

    let edited: String = MESH
        .replace("10.0.0.10", "10.0.0.11")
        .lines()
        .filter(|line| !line.contains("legacy-b"))
        .map(|line| format!("{line}\n"))
        .collect();
    plane.write_mesh(&edited);
    plane.wait_for_metric("ca_xds_clients 0").await;
    // Wait for the edit to be served: a fresh subscriber sees it.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let mut probe = plane
            .subscribe(Some(&token), &HashMap::new())
            .await
            .unwrap();
        if !sorted_names(&probe.initial().await[ADDRESS_TYPE_URL]).contains(&"uid-legacy") {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "edit never served");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let mut again = plane.subscribe(Some(&token), &known).await.unwrap();
    let responses = again.initial().await;
    let addresses = &responses[ADDRESS_TYPE_URL];
    assert_eq!(
        sorted_names(addresses),
        ["uid-app"],
        "unchanged resources are not re-sent"
    );
    assert_eq!(addresses.removed_resources, ["uid-legacy"]);
    let policies = &responses[AUTHORIZATION_TYPE_URL];
    assert!(policies.resources.is_empty() && policies.removed_resources.is_empty());
    again.assert_quiet().await;
}

#[tokio::test]
async fn callers_that_are_not_node_agents_are_refused() {
    let plane = start(MESH).await;
    let other_signer = TokenSigner::generate().unwrap();
    let foreign = other_signer
        .mint(
            &PodToken {
                issuer: DEFAULT_ISSUER.into(),
                audiences: vec![DEFAULT_AUDIENCE.into()],
                namespace: "istio-system".into(),
                service_account: "ztunnel".into(),
                pod_name: "ztunnel-a".into(),
                pod_uid: "uid-za".into(),
                node_name: None,
                ttl: HOUR,
            },
            SystemTime::now(),
        )
        .unwrap();
    let app = plane.token("default", "app", "app-a", "uid-app");
    let stale = plane.token("istio-system", "ztunnel", "ztunnel-a", "uid-old");
    // (case, token, code, reason label)
    let cases: [(&str, Option<&str>, Code, &str); 5] = [
        ("no token", None, Code::Unauthenticated, "missing_token"),
        (
            "garbage",
            Some("not-a-jwt"),
            Code::Unauthenticated,
            "malformed_token",
        ),
        (
            "another signer",
            Some(&foreign),
            Code::Unauthenticated,
            "bad_signature",
        ),
        (
            "a workload",
            Some(&app),
            Code::PermissionDenied,
            "untrusted_caller",
        ),
        (
            "a deleted node agent pod",
            Some(&stale),
            Code::PermissionDenied,
            "caller_pod_uid_mismatch",
        ),
    ];
    for (case, token, code, _) in &cases {
        let status = plane
            .subscribe(*token, &HashMap::new())
            .await
            .err()
            .unwrap();
        assert_eq!(status.code(), *code, "{case}: {status:?}");
        assert!(
            [
                "request authenticate failure",
                "xDS subscription not authorized"
            ]
            .contains(&status.message()),
            "{case}: opaque message, got {:?}",
            status.message()
        );
    }
    let text = plane.metrics().await;
    for (case, _, _, reason) in cases {
        let line = format!("ca_xds_subscriptions_denied_total{{reason=\"{reason}\"}} 1");
        assert!(text.contains(&line), "{case}: no {line} in\n{text}");
    }
    assert!(text.contains("ca_xds_clients 0"), "{text}");
}

impl Plane {
    /// A stream opened with `token` that has had its initial responses.
    async fn subscribed(&self, token: &str) -> Subscriber {
        let mut stream = self.subscribe(Some(token), &HashMap::new()).await.unwrap();
        stream.initial().await;
        stream
    }
}

impl Subscriber {
    /// Waits for the stream's end and returns the status it ended with.
    async fn ended(&mut self) -> Status {
        loop {
            match tokio::time::timeout(PATIENCE, self.inbound.message()).await {
                Err(_) => panic!("the stream is still open after {PATIENCE:?}"),
                Ok(Ok(Some(_))) => continue,
                Ok(Ok(None)) => panic!("the stream ended without a status"),
                Ok(Err(status)) => return status,
            }
        }
    }
}

#[tokio::test]
async fn an_open_stream_ends_when_the_token_it_was_admitted_on_expires() {
    let plane = start(MESH).await;
    // Accepted within the 60 s leeway, and out of it 3 s from now.
    let issued = SystemTime::now() - Duration::from_secs(60);
    let token = plane.token_issued(
        "istio-system",
        "ztunnel",
        "ztunnel-a",
        "uid-za",
        issued,
        Duration::from_secs(3),
    );
    let started = std::time::Instant::now();
    let mut stream = plane
        .subscribe(Some(&token), &HashMap::new())
        .await
        .unwrap();
    stream.initial().await;
    let status = stream.ended().await;
    let lasted = started.elapsed();
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert_eq!(status.message(), "request authenticate failure");
    assert!(lasted >= Duration::from_secs(2), "ended after {lasted:?}");
    plane
        .wait_for_metric("ca_xds_streams_revoked_total{reason=\"expired_token\"} 1")
        .await;
    plane.wait_for_metric("ca_xds_clients 0").await;
    // A fresh token is admitted again, as a restarted client's would be.
    plane.subscribed(&plane.ztunnel("a")).await;
}

#[tokio::test]
async fn an_open_stream_ends_when_its_callers_pod_is_deleted_and_others_stay() {
    let plane = start(MESH).await;
    let mut a = plane.subscribed(&plane.ztunnel("a")).await;
    let mut b = plane.subscribed(&plane.ztunnel("b")).await;
    let without_a: String = MESH
        .lines()
        .filter(|line| !line.contains("name: ztunnel-a,"))
        .map(|line| format!("{line}\n"))
        .collect();
    assert_ne!(without_a, MESH);
    plane.write_mesh(&without_a);
    let status = a.ended().await;
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert_eq!(status.message(), "xDS subscription not authorized");
    plane
        .wait_for_metric("ca_xds_streams_revoked_total{reason=\"caller_pod_not_found\"} 1")
        .await;
    plane.wait_for_metric("ca_xds_clients 1").await;
    // b's pod is still there: its stream stays open.
    b.assert_quiet().await;
}

#[tokio::test]
async fn a_bad_edit_keeps_the_last_good_state_for_xds_and_the_ca() {
    let plane = start(MESH).await;
    let mut subscriber = plane
        .subscribe(Some(&plane.ztunnel("a")), &HashMap::new())
        .await
        .unwrap();
    subscriber.initial().await;

    // Broken YAML, then a file that parses but contradicts itself. Both
    // also move app-a to node-b, which must not take effect.
    let moved = MESH.replace(
        "nodeName: node-a, ips: [10.0.0.10]",
        "nodeName: node-b, ips: [10.0.0.10]",
    );
    plane.write_mesh(&format!("{moved}  - [broken\n"));
    plane.wait_for_metric("ca_mesh_reload_errors_total 1").await;
    plane.write_mesh(&moved.replace("uid-legacy", "uid-echo"));
    plane.wait_for_metric("ca_mesh_reload_errors_total 2").await;
    subscriber.assert_quiet().await;

    // The CA still authorizes from the last good pods: app-a is on node-a.
    let csr = CertRequest::generate(&"spiffe://cluster.local/ns/default/sa/app".parse().unwrap())
        .unwrap();
    let request = ca_client::request(
        Some(&plane.ztunnel("a")),
        csr.csr_pem(),
        Some("spiffe://cluster.local/ns/default/sa/app"),
        0,
    );
    let mut ca = ca_client::connect(plane.addr, plane.issuer.roots()).await;
    ca.create_certificate(request).await.unwrap();

    // A good edit is served again.
    plane.write_mesh(&moved);
    let push = subscriber.next_acked().await;
    assert_eq!(sorted_names(&push), ["uid-app"]);
    let address::Type::Workload(app) = address(&push, "uid-app") else {
        panic!("a workload")
    };
    assert_eq!(app.node, "node-b");
}

#[tokio::test]
async fn a_nack_is_counted_and_not_answered_with_a_resend() {
    let plane = start(MESH).await;
    let mut subscriber = plane
        .subscribe(Some(&plane.ztunnel("a")), &HashMap::new())
        .await
        .unwrap();
    let first = subscriber.next().await;
    assert_eq!(first.type_url, ADDRESS_TYPE_URL);
    subscriber
        .reply(
            &first,
            Some("uid-echo: failed to parse address, had 5 bytes"),
        )
        .await;
    subscriber.next_acked().await; // Authorization
    plane
        .wait_for_metric("ca_xds_nacks_total{type=\"address\"} 1")
        .await;
    subscriber.assert_quiet().await;

    // The stream lives on: the next change arrives.
    plane.write_mesh(&MESH.replace("10.0.0.20", "10.0.0.21"));
    let push = subscriber.next_acked().await;
    assert_eq!(sorted_names(&push), ["uid-echo"]);
}

#[tokio::test]
async fn stopping_the_server_ends_the_streams() {
    let mut plane = start(MESH).await;
    let mut subscriber = plane
        .subscribe(Some(&plane.ztunnel("a")), &HashMap::new())
        .await
        .unwrap();
    subscriber.initial().await;
    plane.stop().await;
    let end = tokio::time::timeout(PATIENCE, subscriber.inbound.message())
        .await
        .expect("the stream ends in time");
    assert!(
        matches!(end, Ok(None)),
        "a clean end, so ztunnel reconnects at once: {end:?}"
    );
}
