//! A real API server (`ztunnel_test_support::kube::KubeApi`) set up for the
//! control plane: the AuthorizationPolicy, PeerAuthentication, ServiceEntry
//! and WorkloadEntry CRDs, the namespace
//! `istio-system`, and the control plane's service account there bound to
//! exactly the roles in `deploy/rbac/` (the main one or a test's variant
//! of it, plus the CA's); and the pods, waits and reads the tests share.

// Each test crate that includes this uses part of it.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use ztunnel_test_support::kube::KubeApi;
use ztunnel_test_support::kube::objects::{
    PodSpecForTest, create_pod, ensure_namespace, service_account_with_role, set_pod_running,
};

use crate::ca_client;

/// The role the control plane ships with.
pub const ROLE: &str = include_str!("../../../deploy/rbac/control-plane.yaml");

/// What its CA adds: the signing Secrets and the root ConfigMap.
pub const CA_ROLE: &str = include_str!("../../../deploy/rbac/control-plane-ca.yaml");

/// The AuthorizationPolicy CRD it watches.
const CRD: &str = include_str!("../../../deploy/crds/authorizationpolicies.security.istio.io.yaml");

/// The PeerAuthentication CRD it watches too.
const PEER_AUTHENTICATION_CRD: &str =
    include_str!("../../../deploy/crds/peerauthentications.security.istio.io.yaml");

/// The ServiceEntry and WorkloadEntry CRDs it watches too.
const SERVICE_ENTRY_CRD: &str =
    include_str!("../../../deploy/crds/serviceentries.networking.istio.io.yaml");
const WORKLOAD_ENTRY_CRD: &str =
    include_str!("../../../deploy/crds/workloadentries.networking.istio.io.yaml");

/// The namespace the control plane runs in, and its service account
/// there (the subject of `CA_ROLE`'s bindings).
pub const NAMESPACE: &str = "istio-system";
const SERVICE_ACCOUNT: &str = "ztunnel-control-plane";

/// The ClusterRole of `ROLE`.
const CLUSTER_ROLE: &str = "ztunnel-control-plane";

/// The API server, and a kubeconfig for the control plane's account bound
/// to `role` (the shipped role, or a test's variant) and to `CA_ROLE`;
/// the TLS provider installed for the tests' clients of the CA.
pub async fn api_with_control_plane_account(role: &str) -> Option<(KubeApi, String)> {
    ztunnel_certs::tls::install_provider();
    let api = KubeApi::start().unwrap()?;
    eprintln!("API server ready in {:?}", api.started_in());
    let client = api.admin_client().await.unwrap();
    ensure_namespace(&client, NAMESPACE, &[]).await.unwrap();
    for manifest in [
        CRD,
        PEER_AUTHENTICATION_CRD,
        SERVICE_ENTRY_CRD,
        WORKLOAD_ENTRY_CRD,
        role,
        CA_ROLE,
    ] {
        api.kubectl(&["apply", "-f", "-"], Some(manifest)).unwrap();
    }
    let token = service_account_with_role(&client, NAMESPACE, SERVICE_ACCOUNT, CLUSTER_ROLE)
        .await
        .unwrap();
    let kubeconfig = api
        .kubeconfig_for_token("control-plane", &token)
        .unwrap()
        .display()
        .to_string();
    Some((api, kubeconfig))
}

/// Waits until `/ready` answers 200, or panics with its last answer.
pub async fn wait_ready(http: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let response = ca_client::get(http, "/ready").await;
        if response.starts_with("HTTP/1.1 200") {
            return;
        }
        assert!(Instant::now() < deadline, "never ready: {response}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The certificates of a PEM text.
pub fn certificates(pem: &[u8]) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .unwrap()
}

/// The Secret `name` in the control plane's namespace, if it exists.
pub async fn secret(client: &kube::Client, name: &str) -> Option<Secret> {
    Api::<Secret>::namespaced(client.clone(), NAMESPACE)
        .get_opt(name)
        .await
        .unwrap()
}

/// The root the control plane generated and stored in `istio-ca-secret`.
pub async fn stored_roots(client: &kube::Client) -> Vec<CertificateDer<'static>> {
    let secret = secret(client, "istio-ca-secret").await.unwrap();
    certificates(&secret.data.unwrap()["ca-cert.pem"].0)
}

/// A pod created through the API and set running as a kubelet would:
/// its uid.
pub async fn running_pod(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    service_account: &str,
    node: &str,
    ip: &str,
) -> String {
    labelled_pod(client, (namespace, name), service_account, node, ip, &[]).await
}

/// As [`running_pod`], with `labels`.
pub async fn labelled_pod(
    client: &kube::Client,
    (namespace, name): (&str, &str),
    service_account: &str,
    node: &str,
    ip: &str,
    labels: &[(&str, &str)],
) -> String {
    let uid = create_pod(
        client,
        &PodSpecForTest {
            namespace: namespace.into(),
            name: name.into(),
            service_account: service_account.into(),
            node: node.into(),
            labels: labels
                .iter()
                .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
                .collect(),
            ..PodSpecForTest::default()
        },
    )
    .await
    .unwrap();
    set_pod_running(client, namespace, name, &[ip.parse().unwrap()], true)
        .await
        .unwrap();
    uid
}

/// The roots published in `namespace`'s `istio-ca-root-cert`, if it
/// exists.
pub async fn published_roots(
    client: &kube::Client,
    namespace: &str,
) -> Option<Vec<CertificateDer<'static>>> {
    let configmap = Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .get_opt("istio-ca-root-cert")
        .await
        .unwrap()?;
    let data = configmap.data.unwrap_or_default();
    Some(certificates(data.get("root-cert.pem")?.as_bytes()))
}
