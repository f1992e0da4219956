#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test
//! Where `ztunnel-ca serve --kubeconfig` takes its root from, and how it
//! hands it to ztunnel, against a real API server (`KubeApi`), running as
//! the service account bound to exactly the roles in `deploy/rbac/`:
//! replicas agree on one root kept in the Secret `istio-ca-secret`, the
//! operator's `cacerts` wins and a malformed one stops start-up, and the
//! ConfigMap `istio-ca-root-cert` is published and put back.
//!
//! That a control plane signs with a root is checked the way ztunnel
//! meets it: a TLS connection to its port that trusts that root alone.

use std::collections::BTreeMap;
use std::io::Read;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant, SystemTime};

use api::{
    NAMESPACE, ROLE, api_with_control_plane_account, certificates, published_roots, secret,
    stored_roots, wait_ready,
};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{Patch, PatchParams};
use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
use rustls::pki_types::CertificateDer;
use ztunnel_certs::issuer::{GeneratedRoot, generate_root};
use ztunnel_test_support::kube::objects::ensure_namespace;

#[path = "support/api.rs"]
mod api;
// Only its TLS channel and its GET are used here.
#[allow(dead_code)]
#[path = "support/ca_client.rs"]
mod ca_client;
#[path = "support/serve.rs"]
mod serve;

/// How long a change may take to be undone: the watch sees it at once;
/// the bound is generous for a busy machine, and the time taken is printed.
const CONVERGE: Duration = Duration::from_secs(10);

/// Connects to the CA at `grpc` trusting only `roots`: returns only when
/// its serving certificate chains to them (the connection panics else).
async fn assert_signs_under(grpc: SocketAddr, roots: &[CertificateDer<'static>]) {
    ca_client::channel(grpc, roots).await;
}

/// Waits until `namespace`'s `istio-ca-root-cert` holds exactly `roots`.
async fn until_published(
    client: &kube::Client,
    namespace: &str,
    roots: &[CertificateDer<'static>],
    what: &str,
) {
    let started = Instant::now();
    loop {
        let published = published_roots(client, namespace).await;
        if published.as_deref() == Some(roots) {
            eprintln!("{what}: {:?}", started.elapsed());
            return;
        }
        assert!(
            started.elapsed() < CONVERGE,
            "{what}: {namespace} still has {published:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Starts `serve` with its own state directory `name` (under the API's
/// directory, so nothing is shared through it) and `args`.
fn start(
    api_dir: &Path,
    name: &str,
    args: Vec<String>,
) -> tokio::task::JoinHandle<(serve::Server, SocketAddr, SocketAddr)> {
    let state = api_dir.join(name);
    tokio::task::spawn_blocking(move || serve::start(&state, &args, "info"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_sign_with_one_root_and_publish_it_where_asked() {
    let Some((api, kubeconfig)) = api_with_control_plane_account(ROLE).await else {
        return;
    };
    let client = api.admin_client().await.unwrap();
    // A second namespace to publish in, with the root ConfigMap's role
    // bound there as deploy/rbac/control-plane-ca.yaml says.
    ensure_namespace(&client, "apps", &[]).await.unwrap();
    api.kubectl(
        &[
            "create",
            "rolebinding",
            "ztunnel-control-plane-root-cert",
            "--namespace=apps",
            "--clusterrole=ztunnel-control-plane-root-cert",
            "--serviceaccount=istio-system:ztunnel-control-plane",
        ],
        None,
    )
    .unwrap();
    let args = vec![
        "--kubeconfig".to_owned(),
        kubeconfig,
        "--root-cert-namespace".to_owned(),
        "apps".to_owned(),
    ];

    // Two replicas start together on an API with no Secret: one creates
    // it, the other reads it, whichever way the race goes.
    let first = start(api.dir(), "replica-a", args.clone());
    let second = start(api.dir(), "replica-b", args.clone());
    let (_first, first_grpc, first_http) = first.await.unwrap();
    let (_second, second_grpc, second_http) = second.await.unwrap();
    wait_ready(first_http).await;
    wait_ready(second_http).await;

    let stored = secret(&client, "istio-ca-secret").await.unwrap();
    assert_eq!(stored.type_.as_deref(), Some("istio.io/ca-root"));
    let roots = stored_roots(&client).await;
    assert_eq!(roots.len(), 1);
    assert_signs_under(first_grpc, &roots).await;
    assert_signs_under(second_grpc, &roots).await;
    assert!(
        !api.dir().join("replica-a").exists() && !api.dir().join("replica-b").exists(),
        "the state directory is not used on Kubernetes"
    );

    // A replica started later (a restart, a scale-up) reads the same root.
    let (_third, third_grpc, _) = start(api.dir(), "replica-c", args).await.unwrap();
    assert_signs_under(third_grpc, &roots).await;
    assert_eq!(stored_roots(&client).await, roots, "the Secret is kept");

    until_published(&client, NAMESPACE, &roots, "published in istio-system").await;
    until_published(&client, "apps", &roots, "published in apps").await;

    api.kubectl(
        &[
            "delete",
            "configmap",
            "istio-ca-root-cert",
            "--namespace=apps",
        ],
        None,
    )
    .unwrap();
    until_published(&client, "apps", &roots, "deleted, put back").await;

    api.kubectl(
        &[
            "patch",
            "configmap",
            "istio-ca-root-cert",
            "--namespace",
            NAMESPACE,
            "--type=merge",
            "-p",
            r#"{"data": {"root-cert.pem": "edited"}}"#,
        ],
        None,
    )
    .unwrap();
    until_published(&client, NAMESPACE, &roots, "edited, put back").await;
}

/// An intermediate CA signed by `root`.
fn intermediate(root: &GeneratedRoot) -> GeneratedRoot {
    let root_key = KeyPair::from_pem(&root.key_pem).unwrap();
    let root_issuer = rcgen::Issuer::from_ca_cert_pem(&root.cert_pem, root_key).unwrap();
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::default();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let cert = params.signed_by(&key, &root_issuer).unwrap();
    GeneratedRoot {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem().into(),
    }
}

/// Writes the Secret `cacerts` with exactly `entries`.
async fn put_cacerts(client: &kube::Client, entries: &[(&str, &str)]) {
    let data: BTreeMap<String, ByteString> = entries
        .iter()
        .map(|(key, value)| ((*key).to_owned(), ByteString(value.as_bytes().to_vec())))
        .collect();
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some("cacerts".to_owned()),
            namespace: Some(NAMESPACE.to_owned()),
            ..ObjectMeta::default()
        },
        data: Some(data),
        ..Secret::default()
    };
    // Server-side apply: keys left out of `entries` are removed.
    Api::<Secret>::namespaced(client.clone(), NAMESPACE)
        .patch(
            "cacerts",
            &PatchParams::apply("ztunnel-tests").force(),
            &Patch::Apply(&secret),
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operators_cacerts_is_what_the_ca_signs_with() {
    let Some((api, kubeconfig)) = api_with_control_plane_account(ROLE).await else {
        return;
    };
    let client = api.admin_client().await.unwrap();
    let root = generate_root("cluster.local", SystemTime::now()).unwrap();
    let signer = intermediate(&root);
    let chain = format!("{}{}", signer.cert_pem, root.cert_pem);
    put_cacerts(
        &client,
        &[
            ("ca-cert.pem", &signer.cert_pem),
            ("ca-key.pem", &signer.key_pem),
            ("root-cert.pem", &root.cert_pem),
            ("cert-chain.pem", &chain),
        ],
    )
    .await;

    let args = vec!["--kubeconfig".to_owned(), kubeconfig];
    let (_server, grpc, http) = start(api.dir(), "ca-state", args).await.unwrap();
    wait_ready(http).await;
    let roots = certificates(root.cert_pem.as_bytes());
    // Trusting the root alone works only if the intermediate signs and is
    // sent along.
    assert_signs_under(grpc, &roots).await;
    until_published(&client, NAMESPACE, &roots, "the operator's root published").await;
    assert!(
        secret(&client, "istio-ca-secret").await.is_none(),
        "no root generated beside the operator's"
    );
}

/// Runs `serve` on the API until it exits (a minute at most): its status
/// and what it wrote on stderr.
async fn serve_until_exit(state: &Path, kubeconfig: &str) -> (ExitStatus, String) {
    let mut child = Command::new(serve::BIN)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(["--metrics-listen", "127.0.0.1:0"])
        .args(["--kubeconfig", kubeconfig])
        .arg("--state-dir")
        .arg(state)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    // Killed if it outlives the test.
    let mut server = serve::Server(child);
    let started = Instant::now();
    let status = loop {
        if let Some(status) = server.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "serve kept running"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    (status, reader.join().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_cacerts_stops_start_up_with_the_reason() {
    let Some((api, kubeconfig)) = api_with_control_plane_account(ROLE).await else {
        return;
    };
    let client = api.admin_client().await.unwrap();
    let root = generate_root("cluster.local", SystemTime::now()).unwrap();
    let stranger = generate_root("cluster.local", SystemTime::now()).unwrap();
    let cases: [(&[(&str, &str)], &str); 3] = [
        (
            &[
                ("ca-cert.pem", &root.cert_pem),
                ("ca-key.pem", &stranger.key_pem),
                ("root-cert.pem", &root.cert_pem),
            ],
            "the signing material of Secret istio-system/cacerts: root key does not match its certificate",
        ),
        (
            &[
                ("ca-cert.pem", &root.cert_pem),
                ("root-cert.pem", &root.cert_pem),
            ],
            "Secret cacerts has no ca-key.pem",
        ),
        (
            &[
                ("ca-cert.pem", "-----BEGIN CERTIFICATE-----\nbroken\n"),
                ("ca-key.pem", &root.key_pem),
                ("root-cert.pem", &root.cert_pem),
            ],
            "ca-cert.pem in Secret cacerts is not PEM: a certificate is cut short",
        ),
    ];
    for (entries, reason) in cases {
        put_cacerts(&client, entries).await;
        let (status, stderr) = serve_until_exit(&api.dir().join("ca-state"), &kubeconfig).await;
        assert_eq!(status.code(), Some(1), "an error, not a panic: {stderr}");
        // `ztunnel-ca: ` and the error with its causes, joined by `: `.
        let message = stderr.trim();
        eprintln!("start-up refused: {message}");
        assert!(message.contains(reason), "{reason}:\n{stderr}");
        assert!(
            message.contains("signing material in namespace istio-system")
                || message.contains("Secret istio-system/cacerts"),
            "the Secret is named:\n{stderr}"
        );
    }
    assert!(
        secret(&client, "istio-ca-secret").await.is_none(),
        "a broken cacerts is not worked around with a generated root"
    );
}
