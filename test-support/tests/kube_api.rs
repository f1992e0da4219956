//! The test API server itself: it starts, takes pods whose status a test
//! writes as a kubelet would, and mints pod-bound tokens that its own
//! TokenReview resolves to the pod (what the control plane's CA relies on).

use std::net::IpAddr;

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::PostParams;
use ztunnel_test_support::kube::KubeApi;
use ztunnel_test_support::kube::objects::{
    PodSpecForTest, create_pod, ensure_namespace, request_token, set_pod_running,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_bound_token_reviews_as_its_pod() {
    let Some(api) = KubeApi::start().unwrap() else {
        return;
    };
    eprintln!("API server ready in {:?}", api.started_in());
    let client = api.admin_client().await.unwrap();
    ensure_namespace(&client, "apps", &[("istio.io/dataplane-mode", "ambient")])
        .await
        .unwrap();
    let uid = create_pod(
        &client,
        &PodSpecForTest {
            namespace: "apps".into(),
            name: "web-0".into(),
            service_account: "web".into(),
            node: "node-a".into(),
            ..PodSpecForTest::default()
        },
    )
    .await
    .unwrap();
    let ip: IpAddr = "198.18.10.5".parse().unwrap();
    set_pod_running(&client, "apps", "web-0", &[ip], true)
        .await
        .unwrap();
    let pod = Api::<Pod>::namespaced(client.clone(), "apps")
        .get("web-0")
        .await
        .unwrap();
    let status = pod.status.unwrap();
    assert_eq!(status.phase.as_deref(), Some("Running"));
    assert_eq!(status.pod_ip.as_deref(), Some("198.18.10.5"));

    let token = request_token(
        &client,
        "apps",
        "web",
        Some(("web-0", &uid)),
        Some("istio-ca"),
    )
    .await
    .unwrap();
    let review = Api::<TokenReview>::all(client.clone())
        .create(
            &PostParams::default(),
            &TokenReview {
                spec: TokenReviewSpec {
                    token,
                    audiences: Some(vec!["istio-ca".into()]),
                },
                ..TokenReview::default()
            },
        )
        .await
        .unwrap();
    let status = review.status.unwrap();
    assert_eq!(status.authenticated, Some(true), "{status:?}");
    let user = status.user.unwrap();
    assert_eq!(
        user.username.as_deref(),
        Some("system:serviceaccount:apps:web")
    );
    let extra = user.extra.unwrap();
    assert_eq!(
        extra.get("authentication.kubernetes.io/pod-name"),
        Some(&vec!["web-0".to_owned()])
    );
    assert_eq!(
        extra.get("authentication.kubernetes.io/pod-uid"),
        Some(&vec![uid])
    );
}
