#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test
//! The built `ztunnel-ca` binary end to end: `serve` with a fresh state
//! directory, `token` minting with the key `serve` created, and a node agent
//! getting a pod's certificate with that token.

use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use tonic::Code;
use ztunnel_certs::cert::WorkloadCertificate;
use ztunnel_certs::csr::CertRequest;
use ztunnel_certs::identity::Identity;

#[path = "support/ca_client.rs"]
mod ca_client;
#[path = "support/serve.rs"]
mod serve;

const PODS: &str = "\
- {name: ztunnel-a, namespace: istio-system, uid: uid-za, serviceAccount: ztunnel, nodeName: node-a}
- {name: app-a, namespace: default, uid: uid-app, serviceAccount: app, nodeName: node-a}
- {name: db-b, namespace: default, uid: uid-db, serviceAccount: db, nodeName: node-b}
";

fn mint(state: &Path, args: &[&str]) -> String {
    let output = Command::new(serve::BIN)
        .arg("token")
        .arg("--state-dir")
        .arg(state)
        .args(args)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap().trim().to_owned()
}

#[tokio::test]
async fn serve_and_token_work_together() {
    ztunnel_certs::tls::install_provider();
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let pods = dir.path().join("pods.yaml");
    std::fs::write(&pods, PODS).unwrap();
    let (_server, grpc, http) =
        serve::start(&state, &[OsStr::new("--pods"), pods.as_os_str()], "warn");

    let root_pem = std::fs::read(state.join("root-cert.pem")).unwrap();
    let roots: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&root_pem)
        .collect::<Result<_, _>>()
        .unwrap();
    let token = mint(
        &state,
        &[
            "--namespace",
            "istio-system",
            "--service-account",
            "ztunnel",
            "--pod",
            "ztunnel-a",
            "--pod-uid",
            "uid-za",
            "--node",
            "node-a",
            "--ttl",
            "30m",
        ],
    );
    let app: Identity = "spiffe://cluster.local/ns/default/sa/app".parse().unwrap();
    let csr = CertRequest::generate(&app).unwrap();
    let mut client = ca_client::connect(grpc, &roots).await;
    let request = ca_client::request(Some(&token), csr.csr_pem(), Some(app.as_str()), 0);
    let response = client
        .create_certificate(request)
        .await
        .unwrap()
        .into_inner();
    let cert =
        WorkloadCertificate::from_ca_response(&response.cert_chain, csr.private_key(), Some(&app))
            .unwrap();
    assert_eq!(cert.identity(), Some(&app));

    let db = "spiffe://cluster.local/ns/default/sa/db";
    let request = ca_client::request(Some(&token), csr.csr_pem(), Some(db), 0);
    let denied = client.create_certificate(request).await.unwrap_err();
    assert_eq!(denied.code(), Code::Unauthenticated);
    assert_eq!(
        denied.message(),
        "request impersonation authentication failure"
    );

    let metrics = ca_client::metrics(http).await;
    assert!(
        metrics.contains(r#"ca_requests_denied_total{reason="no_pod_on_node"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"ca_certificates_issued_total{kind="impersonated"} 1"#),
        "{metrics}"
    );
}

#[test]
fn help_documents_every_flag() {
    let output = Command::new(serve::BIN)
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8(output.stdout).unwrap();
    for flag in [
        "--listen",
        "--trust-domain",
        "--root-cert",
        "--root-key",
        "--state-dir",
        "--root-cert-namespace",
        "--mesh",
        "--token-keys",
        "--audience",
        "--trusted-node-account",
        "--max-ttl",
        "--metrics-listen",
    ] {
        let line = help
            .lines()
            .find(|line| line.trim_start().starts_with(flag))
            .unwrap_or_else(|| panic!("{flag}"));
        let documented = help
            .lines()
            .skip_while(|l| *l != line)
            .nth(1)
            .is_some_and(|next| !next.trim().is_empty());
        assert!(documented, "{flag} has no description");
    }
    assert!(
        help.contains("[alias: --pods]"),
        "the mesh file's old flag still works"
    );
    let output = Command::new(serve::BIN)
        .args(["token", "--namespace", "a"])
        .output()
        .unwrap();
    assert!(!output.status.success(), "token requires its pod flags");
}
