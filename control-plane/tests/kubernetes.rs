#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test
//! `ztunnel-ca serve --kubeconfig` against a real API server (etcd and
//! kube-apiserver from `scripts/k8s-test-env.sh`), running as a service
//! account bound to exactly the roles in `deploy/rbac/`. Callers hold
//! real tokens from the TokenRequest API; pods are created and deleted
//! through the API, with their status written as a kubelet would. Where
//! the CA's root comes from is `kubernetes_ca.rs`'s. The order of the
//! xDS responses a selector AuthorizationPolicy causes, the policy a
//! PeerAuthentication makes, and the Services and Workloads of
//! ServiceEntries (with the VIP written into their status) and
//! WorkloadEntries are tested here too.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use api::{
    ROLE, api_with_control_plane_account, labelled_pod, running_pod, stored_roots, wait_ready,
};
use prost::Message;
use rustls::pki_types::CertificateDer;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Request, Streaming};
use ztunnel_certs::cert::WorkloadCertificate;
use ztunnel_certs::csr::CertRequest;
use ztunnel_certs::identity::Identity;
use ztunnel_proto::envoy::config::core::v3::Node;
use ztunnel_proto::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use ztunnel_proto::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DeltaDiscoveryResponse};
use ztunnel_proto::istio::workload::{Address, address};
use ztunnel_proto::xds_types::{ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL};
use ztunnel_test_support::kube::KubeApi;
use ztunnel_test_support::kube::objects::{
    PodSpecForTest, create_pod, delete_pod, ensure_namespace, request_token, set_pod_running,
};

#[path = "support/api.rs"]
mod api;
#[path = "support/ca_client.rs"]
mod ca_client;
#[path = "support/serve.rs"]
mod serve;

/// What the untaint controller adds to the control plane's role.
const UNTAINT_ROLE: &str = include_str!("../../deploy/rbac/control-plane-untaint.yaml");

/// A policy whose action ztunnel does not support: not sent, and counted.
const AUDIT_POLICY: &str = r#"
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: audit-all, namespace: apps}
spec:
  action: AUDIT
  rules: [{}]
"#;

/// A selector policy: the db pods' workloads list it by its resource name,
/// [`DENY_POLICY`].
const DENY_CLIENT_TO_DB: &str = r#"
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: db-deny-client, namespace: apps}
spec:
  selector: {matchLabels: {app: db}}
  action: DENY
  rules:
  - from:
    - source: {principals: ["cluster.local/ns/apps/sa/client"]}
"#;

/// The policy's xDS resource name.
const DENY_POLICY: &str = "apps/db-deny-client";

/// A namespace-wide STRICT PeerAuthentication, written against the older
/// version (`v1beta1`) the CRD still serves.
const STRICT_APPS: &str = r#"
apiVersion: security.istio.io/v1beta1
kind: PeerAuthentication
metadata: {name: default, namespace: apps}
spec:
  mtls: {mode: STRICT}
"#;

/// istiod's name of the policy every workload under STRICT lists.
const STATIC_STRICT: &str = "istio-system/istio_converted_static_strict";

/// Requests a client sends without reading, so that the server's writes
/// to it back up and its stream's task waits to send: far more empty
/// answers than the stream window, the server's queue and HTTP/2's
/// buffer of one write hold.
const HELD_BACK_REQUESTS: usize = 24;

/// The HTTP/2 stream window of the client that holds its stream back:
/// less than one empty answer (about 80 bytes), so the server's writes
/// stop at once.
const HELD_BACK_WINDOW: u32 = 64;

/// How long a change in the API may take to reach the CA's decisions in
/// these tests: the target is under a second; the bound is generous so a
/// busy machine does not fail the test, and the time taken is printed.
const CONVERGE: Duration = Duration::from_secs(10);

/// Asks for `identity` (impersonating when it is not the caller's own)
/// with `token`: the identity in the issued certificate, or the code.
async fn ask(
    grpc: SocketAddr,
    roots: &[CertificateDer<'static>],
    token: &str,
    identity: &str,
    impersonate: bool,
) -> Result<String, Code> {
    let identity: Identity = identity.parse().unwrap();
    let csr = CertRequest::generate(&identity).unwrap();
    let mut client = ca_client::connect(grpc, roots).await;
    let request = ca_client::request(
        Some(token),
        csr.csr_pem(),
        impersonate.then_some(identity.as_str()),
        3600,
    );
    match client.create_certificate(request).await {
        Ok(response) => {
            let chain = response.into_inner().cert_chain;
            let leaf =
                WorkloadCertificate::from_ca_response(&chain, csr.private_key(), None).unwrap();
            Ok(leaf.identity().map(ToString::to_string).unwrap_or_default())
        }
        Err(status) => Err(status.code()),
    }
}

/// Asks until the answer is `expected`, and says how long it took.
async fn until(
    what: &str,
    expected: Result<String, Code>,
    mut ask: impl AsyncFnMut() -> Result<String, Code>,
) {
    let started = Instant::now();
    loop {
        let got = ask().await;
        if got == expected {
            eprintln!("{what}: {:?}", started.elapsed());
            return;
        }
        assert!(started.elapsed() < CONVERGE, "{what}: still {got:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_agents_get_certificates_only_for_pods_on_their_node() {
    let Some((api, kubeconfig)) = api_with_control_plane_account(ROLE).await else {
        return;
    };
    let client = api.admin_client().await.unwrap();
    ensure_namespace(&client, "apps", &[]).await.unwrap();
    let ztunnel_a = running_pod(
        &client,
        "istio-system",
        "ztunnel-a",
        "ztunnel",
        "node-a",
        "198.18.0.11",
    )
    .await;
    let web_uid = running_pod(&client, "apps", "web-0", "web", "node-a", "198.18.10.2").await;
    running_pod(&client, "apps", "db-0", "db", "node-b", "198.18.11.2").await;

    let state = api.dir().join("ca-state");
    let (_server, grpc, http) = serve::start(&state, &["--kubeconfig", &kubeconfig], "info");
    wait_ready(http).await;
    let roots = stored_roots(&client).await;
    let node_token = request_token(
        &client,
        "istio-system",
        "ztunnel",
        Some(("ztunnel-a", &ztunnel_a)),
        Some("istio-ca"),
    )
    .await
    .unwrap();
    let web = "spiffe://cluster.local/ns/apps/sa/web";
    let db = "spiffe://cluster.local/ns/apps/sa/db";

    assert_eq!(
        ask(grpc, &roots, &node_token, web, true).await,
        Ok(web.to_owned()),
        "a pod on the node agent's node"
    );
    assert_eq!(
        ask(grpc, &roots, &node_token, db, true).await,
        Err(Code::Unauthenticated),
        "a pod on another node"
    );

    // A workload's own token gets its own identity, and only that.
    let web_token = request_token(
        &client,
        "apps",
        "web",
        Some(("web-0", &web_uid)),
        Some("istio-ca"),
    )
    .await
    .unwrap();
    assert_eq!(
        ask(grpc, &roots, &web_token, web, false).await,
        Ok(web.to_owned())
    );
    assert_eq!(
        ask(grpc, &roots, &web_token, db, true).await,
        Err(Code::Unauthenticated),
        "a workload may not impersonate"
    );

    // A token for another audience.
    let other = request_token(
        &client,
        "istio-system",
        "ztunnel",
        Some(("ztunnel-a", &ztunnel_a)),
        Some("some-other-audience"),
    )
    .await
    .unwrap();
    assert_eq!(
        ask(grpc, &roots, &other, web, true).await,
        Err(Code::Unauthenticated)
    );

    // Objects that do not convert are left out, logged and counted; the
    // rest of the mesh stays: a pod claiming web-0's address, and a policy
    // with an action ztunnel does not support.
    running_pod(&client, "apps", "web-1", "copy", "node-a", "198.18.10.2").await;
    api.kubectl(&["apply", "-f", "-"], Some(AUDIT_POLICY))
        .unwrap();
    let started = Instant::now();
    loop {
        let metrics = ca_client::metrics(http).await;
        let counted = ["Pod", "AuthorizationPolicy"].iter().all(|kind| {
            metrics.lines().any(|line| {
                line.starts_with(&format!("ca_kube_objects_refused_total{{kind=\"{kind}\"}}"))
            })
        });
        if counted {
            break;
        }
        assert!(
            started.elapsed() < CONVERGE,
            "refusals counted by kind:\n{metrics}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        ask(grpc, &roots, &node_token, web, true).await,
        Ok(web.to_owned()),
        "the rest of the mesh is kept"
    );

    // A pod scheduled on node A later is granted once the API says so.
    running_pod(&client, "apps", "cache-0", "cache", "node-a", "198.18.10.3").await;
    let cache = "spiffe://cluster.local/ns/apps/sa/cache";
    until("new pod granted", Ok(cache.to_owned()), async || {
        ask(grpc, &roots, &node_token, cache, true).await
    })
    .await;

    // The pod deleted: its identity is no longer granted.
    delete_pod(&client, "apps", "web-0").await.unwrap();
    until(
        "deleted pod denied",
        Err(Code::Unauthenticated),
        async || ask(grpc, &roots, &node_token, web, true).await,
    )
    .await;

    // The node agent's own pod deleted: its token is denied.
    delete_pod(&client, "istio-system", "ztunnel-a")
        .await
        .unwrap();
    until(
        "deleted node agent denied",
        Err(Code::Unauthenticated),
        async || ask(grpc, &roots, &node_token, cache, true).await,
    )
    .await;

    // The token for another audience was refused before any review.
    let metrics = ca_client::metrics(http).await;
    for reason in ["no_pod_on_node", "untrusted_caller", "wrong_audience"] {
        assert!(
            metrics.contains(&format!("reason=\"{reason}\"")),
            "denials counted by reason ({reason}):\n{metrics}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_missing_a_verb_keeps_the_control_plane_unready() {
    let without_reviews = ROLE.replace(
        "  - apiGroups: [authentication.k8s.io]\n    resources: [tokenreviews]\n    verbs: [create]\n",
        "",
    );
    assert_ne!(
        without_reviews, ROLE,
        "the test removes the tokenreviews rule"
    );
    let Some((api, kubeconfig)) = api_with_control_plane_account(&without_reviews).await else {
        return;
    };
    let state = api.dir().join("ca-state");
    let (mut server, _grpc, http) = serve::start(&state, &["--kubeconfig", &kubeconfig], "info");
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut response = String::new();
    while Instant::now() < deadline {
        response = ca_client::get(http, "/ready").await;
        if response.contains("tokenreviews") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(response.starts_with("HTTP/1.1 503"), "{response}");
    assert!(
        response.contains("create authentication.k8s.io/tokenreviews"),
        "the missing verb is named: {response}"
    );
    assert!(
        server.0.try_wait().unwrap().is_none(),
        "still running, not crashed"
    );
}

/// A node object with these taints (`key=effect`), as a provisioner
/// registers it.
fn node_with_taints(api: &KubeApi, name: &str, taints: &[(&str, &str)]) {
    let taints: Vec<serde_json::Value> = taints
        .iter()
        .map(|(key, effect)| serde_json::json!({"key": key, "effect": effect}))
        .collect();
    let node = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name},
        "spec": {"taints": taints},
    });
    api.kubectl(&["apply", "-f", "-"], Some(&node.to_string()))
        .unwrap();
}

/// The keys of a node's taints, without the ones the API server itself
/// adds to a node that has no kubelet (`node.kubernetes.io/...`).
fn taint_keys(api: &KubeApi, node: &str) -> Vec<String> {
    api.kubectl(
        &["get", "node", node, "-o", "jsonpath={.spec.taints[*].key}"],
        None,
    )
    .unwrap()
    .split_whitespace()
    .filter(|key| !key.starts_with("node.kubernetes.io/"))
    .map(str::to_owned)
    .collect()
}

/// A node agent pod on `node`, running, Ready or not.
async fn agent_pod(client: &kube::Client, node: &str, ready: bool, ip: &str) {
    create_pod(
        client,
        &PodSpecForTest {
            namespace: "istio-system".into(),
            name: format!("istio-cni-node-{node}"),
            service_account: "istio-cni".into(),
            node: node.into(),
            labels: [("k8s-app".to_owned(), "istio-cni-node".to_owned())].into(),
            ..PodSpecForTest::default()
        },
    )
    .await
    .unwrap();
    set_pod_running(
        client,
        "istio-system",
        &format!("istio-cni-node-{node}"),
        &[ip.parse().unwrap()],
        ready,
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_loses_the_not_ready_taint_once_its_node_agent_is_ready() {
    let role = format!("{ROLE}---\n{UNTAINT_ROLE}");
    let Some((api, kubeconfig)) = api_with_control_plane_account(&role).await else {
        return;
    };
    api.kubectl(
        &[
            "create",
            "clusterrolebinding",
            "ztunnel-control-plane-untaint",
            "--clusterrole=ztunnel-control-plane-untaint",
            "--serviceaccount=istio-system:ztunnel-control-plane",
        ],
        None,
    )
    .unwrap();
    let client = api.admin_client().await.unwrap();
    let not_ready = "cni.istio.io/not-ready";
    node_with_taints(
        &api,
        "node-a",
        &[(not_ready, "NoSchedule"), ("dedicated", "NoSchedule")],
    );
    node_with_taints(&api, "node-b", &[(not_ready, "NoSchedule")]);
    agent_pod(&client, "node-a", true, "198.18.0.21").await;
    agent_pod(&client, "node-b", false, "198.18.0.22").await;

    let state = api.dir().join("ca-state");
    let (_server, _grpc, http) = serve::start(
        &state,
        &[
            "--kubeconfig",
            &kubeconfig,
            "--taint-enabled",
            "--taint-namespace",
            "istio-system",
        ],
        "info",
    );
    wait_ready(http).await;
    let started = Instant::now();
    while taint_keys(&api, "node-a") != ["dedicated"] {
        assert!(
            started.elapsed() < CONVERGE,
            "node-a keeps {:?}",
            taint_keys(&api, "node-a")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("node-a untainted {:?} after ready", started.elapsed());
    assert_eq!(
        taint_keys(&api, "node-b"),
        [not_ready],
        "a node whose agent is not Ready keeps the taint"
    );

    // A node that joins later, and whose agent turns Ready later.
    node_with_taints(&api, "node-c", &[(not_ready, "NoExecute")]);
    agent_pod(&client, "node-c", true, "198.18.0.23").await;
    set_pod_running(
        &client,
        "istio-system",
        "istio-cni-node-node-b",
        &["198.18.0.22".parse().unwrap()],
        true,
    )
    .await
    .unwrap();
    let started = Instant::now();
    while !(taint_keys(&api, "node-c").is_empty() && taint_keys(&api, "node-b").is_empty()) {
        assert!(
            started.elapsed() < CONVERGE,
            "node-b and node-c keep their taints"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One delta ADS stream to the control plane.
struct AdsStream {
    requests: mpsc::Sender<DeltaDiscoveryRequest>,
    inbound: Streaming<DeltaDiscoveryResponse>,
}

impl AdsStream {
    /// Opens a stream as node agent `token`, sending a subscription to each
    /// of `types` in order; with `window`, the stream's HTTP/2 window.
    async fn open(
        grpc: SocketAddr,
        roots: &[CertificateDer<'static>],
        token: &str,
        types: &[&str],
        window: Option<u32>,
    ) -> AdsStream {
        let channel = match window {
            Some(window) => ca_client::channel_with_stream_window(grpc, roots, window).await,
            None => ca_client::channel(grpc, roots).await,
        };
        let (requests, outbound) = mpsc::channel(2 * HELD_BACK_REQUESTS);
        for type_url in types {
            requests.send(first_request(type_url)).await.unwrap();
        }
        let mut request = Request::new(ReceiverStream::new(outbound));
        let value = format!("Bearer {token}").parse().unwrap();
        request.metadata_mut().insert("authorization", value);
        let inbound = AggregatedDiscoveryServiceClient::new(channel)
            .delta_aggregated_resources(request)
            .await
            .unwrap()
            .into_inner();
        AdsStream { requests, inbound }
    }

    /// Sends a first request of `type_url`.
    async fn subscribe(&self, type_url: &str) {
        self.requests.send(first_request(type_url)).await.unwrap();
    }

    /// The next response, ACKed as ztunnel does.
    async fn next_acked(&mut self) -> DeltaDiscoveryResponse {
        let response = tokio::time::timeout(CONVERGE, self.inbound.message())
            .await
            .expect("a response in time")
            .unwrap()
            .expect("an open stream");
        let ack = DeltaDiscoveryRequest {
            type_url: response.type_url.clone(),
            response_nonce: response.nonce.clone(),
            ..DeltaDiscoveryRequest::default()
        };
        self.requests.send(ack).await.unwrap();
        response
    }

    /// Reads until an Authorization response carries the policy (`deny`)
    /// or removes it (not `deny`), and asserts that an Address response
    /// whose db workload lists the policy (`deny`) or no longer lists it
    /// came first. Unrelated responses are read past.
    async fn assert_address_first(&mut self, deny: bool, what: &str) {
        let mut read = Vec::new();
        let mut address_first = false;
        loop {
            let response = self.next_acked().await;
            let said = policy_in(&response);
            read.push((short(&response.type_url).to_owned(), said));
            match (response.type_url.as_str(), said) {
                (ADDRESS_TYPE_URL, Some(listed)) if listed == deny => address_first = true,
                (AUTHORIZATION_TYPE_URL, Some(carried)) if carried == deny => break,
                _ => {}
            }
        }
        assert!(
            address_first,
            "{what}: the Address response reflecting the policy comes before the \
             Authorization response; read (type, policy) {read:?}"
        );
    }
}

/// A first request of `type_url`, as ztunnel sends it on connect.
fn first_request(type_url: &str) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        node: Some(Node {
            id: "ztunnel~198.18.0.11~ztunnel-a.istio-system~istio-system.svc.cluster.local".into(),
            ..Node::default()
        }),
        type_url: type_url.into(),
        ..DeltaDiscoveryRequest::default()
    }
}

/// The last part of a type URL, for messages.
fn short(type_url: &str) -> &str {
    type_url.rsplit('.').next().unwrap_or(type_url)
}

/// What a response says of [`DENY_POLICY`]: for an Address response,
/// whether the db workload in it lists the policy (`None` without db); for
/// an Authorization response, `true` when it carries the policy, `false`
/// when it removes it; `None` otherwise.
fn policy_in(response: &DeltaDiscoveryResponse) -> Option<bool> {
    match response.type_url.as_str() {
        ADDRESS_TYPE_URL => response.resources.iter().find_map(|resource| {
            let any = resource.resource.as_ref()?;
            match Address::decode(any.value.as_slice()).unwrap().r#type {
                Some(address::Type::Workload(workload)) if workload.name == "db-0" => Some(
                    workload
                        .authorization_policies
                        .iter()
                        .any(|name| name == DENY_POLICY),
                ),
                _ => None,
            }
        }),
        AUTHORIZATION_TYPE_URL => {
            if response.resources.iter().any(|r| r.name == DENY_POLICY) {
                Some(true)
            } else if response.removed_resources.iter().any(|r| r == DENY_POLICY) {
                Some(false)
            } else {
                None
            }
        }
        _ => None,
    }
}

/// A control plane on a real API server, with `apps/db-0` (labelled
/// `app=db`) and node a's ztunnel pod, and a node agent's stream open.
struct DbMesh {
    api: KubeApi,
    /// Kept for the test's length: dropping it stops the control plane.
    _server: serve::Server,
    grpc: SocketAddr,
    roots: Vec<CertificateDer<'static>>,
    /// Node a's ztunnel's token.
    token: String,
    /// Subscribed as istio/ztunnel does (Address, then Authorization),
    /// both first answers read.
    agent: AdsStream,
}

/// [`DbMesh`], or `None` where the API server cannot run (skipped).
/// [`db_mesh`] with `objects` (YAML) applied.
async fn db_mesh_with(objects: &str) -> Option<DbMesh> {
    let mesh = db_mesh().await?;
    mesh.api
        .kubectl(&["apply", "-f", "-"], Some(objects))
        .unwrap();
    Some(mesh)
}

async fn db_mesh() -> Option<DbMesh> {
    let (api, kubeconfig) = api_with_control_plane_account(ROLE).await?;
    let client = api.admin_client().await.unwrap();
    ensure_namespace(&client, "apps", &[]).await.unwrap();
    let ztunnel_a = running_pod(
        &client,
        "istio-system",
        "ztunnel-a",
        "ztunnel",
        "node-a",
        "198.18.0.11",
    )
    .await;
    labelled_pod(
        &client,
        ("apps", "db-0"),
        "db",
        "node-a",
        "198.18.10.5",
        &[("app", "db")],
    )
    .await;

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

    let both = [ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL];
    let mut agent = AdsStream::open(grpc, &roots, &token, &both, None).await;
    for expected in both {
        assert_eq!(agent.next_acked().await.type_url, expected);
    }
    Some(DbMesh {
        api,
        _server,
        grpc,
        roots,
        token,
        agent,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_selector_policy_reaches_every_stream_after_the_workload_that_lists_it() {
    let Some(DbMesh {
        api,
        _server,
        grpc,
        roots,
        token,
        mut agent,
    }) = db_mesh().await
    else {
        return;
    };

    // Released, the held-back stream's task finds its queued requests and
    // the new build both waiting, and `select!` picks either first. A
    // server that answered a request from the new build without bringing
    // the stream's Address to it first fails a round about three times in
    // four (measured: every run of four rounds failed); so four rounds.
    let unknown = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
    for round in 1..=4 {
        // A node agent whose Authorization subscription is read after the
        // policy's build is out: it subscribed to Address, then held its
        // stream back (requests the server answers but it does not read),
        // its Authorization subscription queued behind them.
        let mut late = AdsStream::open(
            grpc,
            &roots,
            &token,
            &[ADDRESS_TYPE_URL],
            Some(HELD_BACK_WINDOW),
        )
        .await;
        assert_eq!(late.next_acked().await.type_url, ADDRESS_TYPE_URL);
        for _ in 0..HELD_BACK_REQUESTS {
            late.subscribe(unknown).await;
        }
        late.subscribe(AUTHORIZATION_TYPE_URL).await;

        api.kubectl(&["apply", "-f", "-"], Some(DENY_CLIENT_TO_DB))
            .unwrap();
        agent
            .assert_address_first(true, &format!("round {round}, applied"))
            .await;
        late.assert_address_first(
            true,
            &format!("round {round}, applied, read after the build"),
        )
        .await;

        api.kubectl(
            &[
                "delete",
                "authorizationpolicy",
                "db-deny-client",
                "-n",
                "apps",
            ],
            None,
        )
        .unwrap();
        agent
            .assert_address_first(false, &format!("round {round}, deleted"))
            .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_auth_a_strict_namespace_sends_the_static_strict_policy_listed_by_its_workloads() {
    // `_server` and the API server are bound: a field left to `..` would
    // be dropped here, and with it the control plane.
    let Some(DbMesh {
        api: _api,
        _server,
        mut agent,
        ..
    }) = db_mesh_with(STRICT_APPS).await
    else {
        return;
    };
    let (mut listed, mut sent) = (false, false);
    while !(listed && sent) {
        let response = agent.next_acked().await;
        for resource in &response.resources {
            let Some(any) = resource.resource.as_ref() else {
                continue;
            };
            match response.type_url.as_str() {
                ADDRESS_TYPE_URL => {
                    if let Some(address::Type::Workload(workload)) =
                        Address::decode(any.value.as_slice()).unwrap().r#type
                    {
                        listed |= workload.name == "db-0"
                            && workload.authorization_policies == [STATIC_STRICT];
                    }
                }
                AUTHORIZATION_TYPE_URL => sent |= resource.name == STATIC_STRICT,
                _ => {}
            }
        }
    }
}

#[path = "kubernetes/entries.rs"]
mod entries;
