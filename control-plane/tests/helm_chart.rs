#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test
//! The Helm chart (`deploy/charts/ztunnel-mesh`) against a real API server
//! (`KubeApi`), with the pinned helm that `scripts/k8s-test-env.sh` builds:
//!
//! - `helm lint --strict` is clean with the default values and with the
//!   non-default set in the chart's `ci/` directory, and the API server
//!   accepts every object `helm template` renders from each (server-side
//!   apply), in two namespaces side by side;
//! - the control plane runs as a process with exactly the chart's args,
//!   environment and RBAC: a token of the chart's `ztunnel-ca` account from
//!   the TokenRequest API, in place of the pod's. It must become ready,
//!   store its root, publish it to ztunnel's namespace, sign for a pod on
//!   the calling ztunnel's node, untaint a node whose agent is ready, and
//!   log nothing forbidden; the same check with one verb taken out of the
//!   chart's role must fail.
//!
//! Skips, with the reason, when the API server or helm was not built.

use std::fs::File;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use api::{certificates, published_roots, secret};
use ztunnel_certs::cert::WorkloadCertificate;
use ztunnel_certs::csr::CertRequest;
use ztunnel_certs::identity::Identity;
use ztunnel_proto::istio::v1::auth::istio_certificate_service_client::IstioCertificateServiceClient;
use ztunnel_test_support::helm::{Helm, Rendered, chart_dir, permission_problems};
use ztunnel_test_support::kube::KubeApi;
use ztunnel_test_support::kube::objects::{
    PodSpecForTest, create_pod, ensure_namespace, request_token, set_pod_running,
};

#[path = "support/api.rs"]
mod api;
#[path = "support/ca_client.rs"]
#[allow(dead_code)] // its metrics helper is not used here
mod ca_client;
#[path = "support/serve.rs"]
#[allow(dead_code)] // only its address reader is used here
mod serve;

/// The namespace of the default install, Istio's.
const NAMESPACE: &str = "istio-system";
/// The node the test's pods are on.
const NODE: &str = "node-a";
/// How long the control plane gets for each step of its job; passing runs
/// take well under a second per step.
const PATIENCE: Duration = Duration::from_secs(30);

fn nondefault_values() -> PathBuf {
    chart_dir().join("ci/nondefault-values.yaml")
}

/// helm and the API server, or `None` (skipped, with the reason).
fn tools() -> Option<(Helm, KubeApi)> {
    let helm = Helm::find_or_skip()?;
    let api = KubeApi::start().unwrap()?;
    Some((helm, api))
}

#[test]
fn the_chart_lints_clean_and_the_api_server_accepts_every_object() {
    let Some((helm, api)) = tools() else {
        return;
    };
    let nondefault = nondefault_values();
    for values in [vec![], vec![nondefault.as_path()]] {
        let report = helm.lint(&values).unwrap();
        assert!(
            !report.contains("[WARNING]") && !report.contains("[ERROR]"),
            "helm lint {values:?}:\n{report}"
        );
    }

    for (release, namespace, values) in [
        ("ztunnel-mesh", NAMESPACE, vec![]),
        ("mesh-alt", "mesh-alt", vec![nondefault.as_path()]),
    ] {
        api.kubectl(&["create", "namespace", namespace], None)
            .unwrap();
        let rendered = helm.template(release, namespace, &values).unwrap();
        let report = api
            .apply_server_side(&rendered.to_yaml().unwrap())
            .unwrap_or_else(|error| panic!("{release}: the API server refused: {error}"));
        let applied: Vec<&str> = report
            .lines()
            .filter(|line| line.ends_with(" serverside-applied"))
            .collect();
        for name in rendered.names() {
            let (kind, name) = name.split_once('/').unwrap();
            let kind = kind.to_ascii_lowercase();
            assert!(
                applied.iter().any(|line| {
                    let object = line.trim_end_matches(" serverside-applied");
                    let (applied_kind, applied_name) = object.split_once('/').unwrap_or(("", ""));
                    applied_name == name && applied_kind.split('.').next() == Some(&kind)
                }),
                "{release}: {kind}/{name} not applied:\n{report}"
            );
        }
        assert_eq!(
            applied.len(),
            rendered.objects.len(),
            "{release}: one line per object:\n{report}"
        );
        eprintln!("{release}: {} objects accepted", applied.len());
    }

    // The non-default values reached the objects the API server stored.
    let stored = |kind: &str, name: &str, namespace: &str, path: &str| {
        let jsonpath = format!("jsonpath={path}");
        api.kubectl(&["get", kind, name, "-n", namespace, "-o", &jsonpath], None)
            .unwrap()
    };
    assert_eq!(
        stored(
            "hpa",
            "ztunnel-ca",
            "mesh-alt",
            "{.spec.minReplicas} {.spec.maxReplicas} {.spec.metrics[*].resource.target.averageUtilization}"
        ),
        "2 4 60 70"
    );
    assert_eq!(
        stored(
            "daemonset",
            "ztunnel",
            "mesh-alt",
            "{.spec.template.spec.containers[0].image} {.spec.template.spec.terminationGracePeriodSeconds} {.spec.updateStrategy.rollingUpdate.maxUnavailable}"
        ),
        "registry.example.com/mesh/mesh-ztunnel:1.2.3 45 2"
    );
    assert_eq!(
        stored(
            "daemonset",
            "istio-cni-node",
            "mesh-alt",
            "{.spec.updateStrategy.type} {.spec.template.spec.tolerations[*].key}"
        ),
        "OnDelete dedicated"
    );
    assert_eq!(
        stored(
            "daemonset",
            "istio-cni-node",
            NAMESPACE,
            "{.spec.template.spec.tolerations[*].operator}"
        ),
        "Exists Exists Exists",
        "Istio's three tolerations by default"
    );
}

/// The control plane as the chart's Deployment runs it, as a process.
struct ControlPlane {
    child: Child,
    grpc: SocketAddr,
    http: SocketAddr,
    log: PathBuf,
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl ControlPlane {
    /// Starts `ztunnel-ca` with the rendered Deployment's command, args and
    /// environment, in a directory of its own, authenticated by `token`
    /// instead of the pod's mounted one; only the listen addresses become
    /// free loopback ports.
    fn start(api: &KubeApi, rendered: &Rendered, token: &str, run: &str) -> ControlPlane {
        let container = rendered
            .container("Deployment", "ztunnel-ca", "ztunnel-ca")
            .unwrap();
        assert_eq!(container.command, ["ztunnel-ca"]);
        let kubeconfig = api.kubeconfig_for_token(run, token).unwrap();
        let args = container
            .args_replacing(&[
                (
                    "--in-cluster",
                    &format!("--kubeconfig={}", kubeconfig.display()),
                ),
                ("--listen", "--listen=127.0.0.1:0"),
                ("--metrics-listen", "--metrics-listen=127.0.0.1:0"),
            ])
            .unwrap();
        let dir = api.dir().join(run);
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("ztunnel-ca.log");
        let mut child = Command::new(env!("CARGO_BIN_EXE_ztunnel-ca"))
            .args(&args)
            .env_clear()
            .envs(container.env.iter().map(|(name, value)| (name, value)))
            // The downward API's value.
            .env("POD_NAMESPACE", NAMESPACE)
            .current_dir(&dir)
            .stdout(Stdio::piped())
            .stderr(File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let Some((grpc, http)) = serve::addresses(&mut child) else {
            let _ = child.kill();
            panic!(
                "ztunnel-ca printed no addresses; its log:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        };
        ControlPlane {
            child,
            grpc,
            http,
            log,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// The cluster the control plane serves: ztunnel's pod and an app pod on
/// `NODE`, which is tainted not-ready and whose node agent pod is Ready.
async fn workloads(api: &KubeApi, client: &kube::Client) -> String {
    ensure_namespace(client, "apps", &[]).await.unwrap();
    let pod =
        |namespace: &str, name: &str, account: &str, labels: &[(&str, &str)]| PodSpecForTest {
            namespace: namespace.into(),
            name: name.into(),
            service_account: account.into(),
            node: NODE.into(),
            labels: labels
                .iter()
                .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
                .collect(),
            ..PodSpecForTest::default()
        };
    let ztunnel_uid = create_pod(client, &pod(NAMESPACE, "ztunnel-a", "ztunnel", &[]))
        .await
        .unwrap();
    create_pod(client, &pod("apps", "web-0", "web", &[]))
        .await
        .unwrap();
    create_pod(
        client,
        &pod(
            NAMESPACE,
            "istio-cni-node-a",
            "istio-cni",
            &[("k8s-app", "istio-cni-node")],
        ),
    )
    .await
    .unwrap();
    for (namespace, name, ip) in [
        (NAMESPACE, "ztunnel-a", "198.18.0.11"),
        ("apps", "web-0", "198.18.10.2"),
        (NAMESPACE, "istio-cni-node-a", "198.18.0.21"),
    ] {
        set_pod_running(client, namespace, name, &[ip.parse().unwrap()], true)
            .await
            .unwrap();
    }
    let node = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": NODE},
        "spec": {"taints": [{"key": "cni.istio.io/not-ready", "effect": "NoSchedule"}]},
    });
    api.kubectl(&["apply", "-f", "-"], Some(&node.to_string()))
        .unwrap();
    ztunnel_uid
}

/// Waits for `what` to hold, up to `PATIENCE`.
async fn within(what: &str, mut check: impl AsyncFnMut() -> bool) -> Result<(), String> {
    let started = Instant::now();
    while !check().await {
        if started.elapsed() > PATIENCE {
            return Err(format!("{what}: not within {PATIENCE:?}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("{what}: {:?}", started.elapsed());
    Ok(())
}

/// The control plane's whole job, each step bounded: ready, its root
/// stored and published, a certificate signed for a pod on the calling
/// ztunnel's node, the node untainted; then nothing forbidden in its log.
/// The first failure, with the log's permission lines.
async fn does_its_job(
    control_plane: &ControlPlane,
    client: &kube::Client,
    ztunnel_token: &str,
) -> Result<(), String> {
    let http = control_plane.http;
    within("ready", async || {
        ca_client::get(http, "/ready")
            .await
            .starts_with("HTTP/1.1 200")
    })
    .await?;
    within("root stored in istio-ca-secret", async || {
        secret(client, "istio-ca-secret").await.is_some()
    })
    .await?;
    let stored = secret(client, "istio-ca-secret").await.unwrap();
    let roots = certificates(&stored.data.unwrap()["ca-cert.pem"].0);
    within("root published to ztunnel's namespace", async || {
        published_roots(client, NAMESPACE).await.as_deref() == Some(&roots[..])
    })
    .await?;

    let web: Identity = "spiffe://cluster.local/ns/apps/sa/web".parse().unwrap();
    let csr = CertRequest::generate(&web).unwrap();
    // As ztunnel dials it: by the Service's name, which the chart puts in
    // the serving certificate.
    let channel =
        ca_client::channel_for(control_plane.grpc, &roots, "istiod.istio-system.svc").await;
    let mut ca = IstioCertificateServiceClient::new(channel);
    let request = ca_client::request(Some(ztunnel_token), csr.csr_pem(), Some(web.as_str()), 3600);
    let chain = ca
        .create_certificate(request)
        .await
        .map_err(|status| format!("CreateCertificate: {status}"))?
        .into_inner()
        .cert_chain;
    let leaf = WorkloadCertificate::from_ca_response(&chain, csr.private_key(), None).unwrap();
    assert_eq!(leaf.identity(), Some(&web));

    within("node untainted", async || {
        let node: k8s_openapi::api::core::v1::Node =
            kube::Api::all(client.clone()).get(NODE).await.unwrap();
        let taints = node.spec.and_then(|spec| spec.taints).unwrap_or_default();
        !taints
            .iter()
            .any(|taint| taint.key == "cni.istio.io/not-ready")
    })
    .await?;

    let problems = permission_problems(&control_plane.log());
    if !problems.is_empty() {
        return Err(format!(
            "refused by the API server:\n{}",
            problems.join("\n")
        ));
    }
    Ok(())
}

/// `controlPlane.enabled=false` (our agent and ztunnel beside Istio's
/// istiod, which `proxy/tests/real_cluster.rs` runs): none of the control
/// plane's objects, ztunnel dialling istiod's Service, and the untaint
/// controller, which lives in our control plane, refused with a reason.
#[test]
fn without_its_control_plane_the_chart_points_ztunnel_at_istiod() {
    let Some(helm) = Helm::find_or_skip() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let values = dir.path().join("values.yaml");
    std::fs::write(&values, "controlPlane:\n  enabled: false\n").unwrap();
    let rendered = helm
        .template("ztunnel-mesh", NAMESPACE, &[values.as_path()])
        .unwrap();
    let names = rendered.names();
    assert!(
        names.iter().all(|name| !name.contains("ztunnel-ca")
            && !name.contains("control-plane")
            && !name.starts_with("Service/")),
        "control plane objects rendered: {names:?}"
    );
    for daemonset in ["ztunnel", "istio-cni-node"] {
        assert!(
            names.contains(&format!("DaemonSet/{daemonset}")),
            "{daemonset} missing: {names:?}"
        );
    }
    let ztunnel = rendered
        .container("DaemonSet", "ztunnel", "istio-proxy")
        .unwrap();
    let istiod = format!("istiod.{NAMESPACE}.svc:15012");
    for variable in ["CA_ADDRESS", "XDS_ADDRESS"] {
        assert!(
            ztunnel
                .env
                .iter()
                .any(|(name, value)| name == variable && *value == istiod),
            "{variable} is not {istiod}: {:?}",
            ztunnel.env
        );
    }

    std::fs::write(
        &values,
        "controlPlane:\n  enabled: false\ntaint:\n  enabled: true\n",
    )
    .unwrap();
    let refused = helm
        .template("ztunnel-mesh", NAMESPACE, &[values.as_path()])
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("taint.enabled needs controlPlane.enabled"),
        "{refused}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_plane_does_its_job_with_exactly_the_charts_rbac() {
    let Some((helm, api)) = tools() else {
        return;
    };
    ztunnel_certs::tls::install_provider();
    let client = api.admin_client().await.unwrap();
    ensure_namespace(&client, NAMESPACE, &[]).await.unwrap();
    let values = api.dir().join("taint-values.yaml");
    std::fs::write(&values, "taint:\n  enabled: true\n").unwrap();
    let mut rendered = helm
        .template("ztunnel-mesh", NAMESPACE, &[values.as_path()])
        .unwrap();
    api.apply_server_side(&rendered.to_yaml().unwrap()).unwrap();
    let ztunnel_uid = workloads(&api, &client).await;
    let ztunnel_token = request_token(
        &client,
        NAMESPACE,
        "ztunnel",
        Some(("ztunnel-a", &ztunnel_uid)),
        Some("istio-ca"),
    )
    .await
    .unwrap();
    let token = request_token(&client, NAMESPACE, "ztunnel-ca", None, None)
        .await
        .unwrap();

    let control_plane = ControlPlane::start(&api, &rendered, &token, "chart-rbac");
    let result = does_its_job(&control_plane, &client, &ztunnel_token).await;
    assert_eq!(
        result,
        Ok(()),
        "with the chart's RBAC; the control plane's log:\n{}",
        control_plane.log()
    );
    drop(control_plane);

    // The check can fail: the same run with `watch` on EndpointSlices taken
    // out of the chart's ClusterRole.
    rendered
        .remove_verb(
            "ClusterRole",
            &format!("ztunnel-control-plane-{NAMESPACE}"),
            "endpointslices",
            "watch",
        )
        .unwrap();
    api.apply_server_side(&rendered.to_yaml().unwrap()).unwrap();
    let control_plane = ControlPlane::start(&api, &rendered, &token, "broken-rbac");
    let result = does_its_job(&control_plane, &client, &ztunnel_token).await;
    let error = result.expect_err("a role without watch on endpointslices must fail the check");
    eprintln!("with a verb removed: {error}");
    assert!(
        permission_problems(&control_plane.log())
            .iter()
            .any(|line| line.contains("endpointslices")),
        "the log names what is missing:\n{}",
        control_plane.log()
    );
}
