#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test
//! The CA over real gRPC and TLS on loopback, with real tokens: what is
//! issued, what is denied and why (as counted on /metrics), input bounds,
//! and registry reload.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tonic::{Code, Status};
use x509_parser::prelude::{FromDer, X509Certificate};
use ztunnel_certs::cert::WorkloadCertificate;
use ztunnel_certs::csr::CertRequest;
use ztunnel_certs::identity::Identity;
use ztunnel_control_plane::ca::authn::{DEFAULT_AUDIENCE, DEFAULT_ISSUER};
use ztunnel_control_plane::ca::token::{PodToken, TokenSigner};
use ztunnel_proto::istio::v1::auth::IstioCertificateResponse;

#[path = "support/ca_client.rs"]
mod ca_client;
#[path = "support/server.rs"]
mod test_server;

const APP: &str = "spiffe://cluster.local/ns/default/sa/app";
const DB: &str = "spiffe://cluster.local/ns/default/sa/db";
const HOUR: Duration = Duration::from_secs(3600);

const PODS: &str = "\
- {name: ztunnel-a, namespace: istio-system, uid: uid-za, serviceAccount: ztunnel, nodeName: node-a, phase: Running, ips: [10.0.0.1]}
- {name: ztunnel-b, namespace: istio-system, uid: uid-zb, serviceAccount: ztunnel, nodeName: node-b, phase: Running}
- {name: app-a, namespace: default, uid: uid-app, serviceAccount: app, nodeName: node-a, phase: Running}
- {name: db-b, namespace: default, uid: uid-db, serviceAccount: db, nodeName: node-b, phase: Running}
- {name: rogue-a, namespace: default, uid: uid-rogue, serviceAccount: rogue, nodeName: node-a, phase: Running}
";

/// The CA running in-process on loopback, reading `PODS`.
type Ca = test_server::TestServer;

async fn start_ca() -> Ca {
    test_server::start(PODS).await
}

fn pod_token(
    namespace: &str,
    service_account: &str,
    pod: &str,
    uid: &str,
    node: Option<&str>,
) -> PodToken {
    PodToken {
        issuer: DEFAULT_ISSUER.into(),
        audiences: vec![DEFAULT_AUDIENCE.into()],
        namespace: namespace.into(),
        service_account: service_account.into(),
        pod_name: pod.into(),
        pod_uid: uid.into(),
        node_name: node.map(Into::into),
        ttl: HOUR,
    }
}

fn ztunnel_a() -> PodToken {
    pod_token(
        "istio-system",
        "ztunnel",
        "ztunnel-a",
        "uid-za",
        Some("node-a"),
    )
}

fn app() -> PodToken {
    pod_token("default", "app", "app-a", "uid-app", None)
}

fn csr_for(identity: &str) -> CertRequest {
    CertRequest::generate(&identity.parse().unwrap()).unwrap()
}

impl Ca {
    fn token(&self, token: &PodToken) -> String {
        self.signer.mint(token, SystemTime::now()).unwrap()
    }

    async fn request(
        &self,
        token: Option<&str>,
        csr: &str,
        impersonate: Option<&str>,
        validity_secs: i64,
    ) -> Result<IstioCertificateResponse, Status> {
        let request = ca_client::request(token, csr, impersonate, validity_secs);
        let mut client = ca_client::connect(self.addr, self.issuer.roots()).await;
        client
            .create_certificate(request)
            .await
            .map(|r| r.into_inner())
    }

    /// Requests `identity` (impersonated when the token is not its own) with a fresh CSR.
    async fn issue(
        &self,
        token: &PodToken,
        impersonate: Option<&str>,
    ) -> Result<IstioCertificateResponse, Status> {
        let identity = impersonate.unwrap_or(APP);
        let csr = csr_for(identity);
        self.request(Some(&self.token(token)), csr.csr_pem(), impersonate, 0)
            .await
    }

    async fn metrics(&self) -> String {
        ca_client::metrics(self.metrics_addr).await
    }
}

fn leaf(response: &IstioCertificateResponse) -> Vec<u8> {
    ztunnel_certs::cert::parse_pem_bundle(&response.cert_chain[0]).unwrap()[0].to_vec()
}

fn assert_denied(result: Result<IstioCertificateResponse, Status>, message: &str, case: &str) {
    let status = result.expect_err(case);
    assert_eq!(status.code(), Code::Unauthenticated, "{case}: {status:?}");
    assert_eq!(status.message(), message, "{case}");
}

/// Case name, token, requested identity, expected message, expected reason label.
type DenialCase = (
    &'static str,
    Option<String>,
    Option<&'static str>,
    &'static str,
    &'static str,
);

const AUTHN: &str = "request authenticate failure";
const IMPERSONATION: &str = "request impersonation authentication failure";

#[tokio::test]
async fn own_identity_is_issued_with_the_istiod_chain_layout() {
    let ca = start_ca().await;
    let csr = csr_for(APP);
    // The CSR asks for another identity: the certificate must carry the token's.
    let lying_csr = csr_for(DB);
    let response = ca
        .request(Some(&ca.token(&app())), lying_csr.csr_pem(), None, 0)
        .await
        .unwrap();
    assert_eq!(response.cert_chain.len(), 2, "leaf, then the root bundle");
    assert_eq!(response.cert_chain[1], ca.issuer.root_bundle_pem());
    let der = leaf(&response);
    let (_, cert) = X509Certificate::from_der(&der).unwrap();
    let san = cert.subject_alternative_name().unwrap().unwrap();
    assert!(san.critical);
    assert_eq!(
        format!("{:?}", san.value.general_names),
        format!("[URI({APP:?})]")
    );
    let eku = cert.extended_key_usage().unwrap().unwrap().value;
    assert!(eku.server_auth && eku.client_auth);
    assert!(!cert.is_ca());
    let lifetime = cert.validity().not_after.timestamp() - cert.validity().not_before.timestamp();
    assert_eq!(
        lifetime,
        24 * 3600 + 120,
        "default TTL plus the 2-minute backdate"
    );

    let response = ca
        .request(Some(&ca.token(&app())), csr.csr_pem(), None, 3600)
        .await
        .unwrap();
    let workload =
        WorkloadCertificate::from_ca_response(&response.cert_chain, csr.private_key(), None)
            .unwrap();
    assert_eq!(workload.identity().map(Identity::as_str), Some(APP));
    assert_eq!(workload.roots().certificates(), ca.issuer.roots());
}

#[tokio::test]
async fn node_agent_gets_the_identities_of_pods_on_its_node_only() {
    let ca = start_ca().await;
    let csr = csr_for(APP);
    let token = ca.token(&ztunnel_a());
    let response = ca
        .request(Some(&token), csr.csr_pem(), Some(APP), 0)
        .await
        .unwrap();
    let requested: Identity = APP.parse().unwrap();
    let workload = WorkloadCertificate::from_ca_response(
        &response.cert_chain,
        csr.private_key(),
        Some(&requested),
    )
    .unwrap();
    assert_eq!(workload.identity(), Some(&requested));

    assert_denied(
        ca.issue(&ztunnel_a(), Some(DB)).await,
        IMPERSONATION,
        "pod on another node",
    );
    let text = ca.metrics().await;
    assert!(
        text.contains(r#"ca_certificates_issued_total{kind="impersonated"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"ca_requests_denied_total{reason="no_pod_on_node"} 1"#),
        "{text}"
    );
}

/// Every denial case: Unauthenticated with the opaque message, and the real
/// reason counted on /metrics.
#[tokio::test]
async fn denials_are_opaque_and_counted_by_reason() {
    let ca = start_ca().await;
    let other_signer = TokenSigner::generate().unwrap();
    let now = SystemTime::now();
    let rogue = pod_token("default", "rogue", "rogue-a", "uid-rogue", Some("node-a"));
    let stale_uid = pod_token(
        "istio-system",
        "ztunnel",
        "ztunnel-a",
        "uid-old",
        Some("node-a"),
    );
    let mut wrong_audience = ztunnel_a();
    wrong_audience.audiences = vec!["kubernetes".into()];
    let expired = ca.signer.mint(&ztunnel_a(), now - 2 * HOUR).unwrap();
    let bad_signature = other_signer.mint(&ztunnel_a(), now).unwrap();
    let csr = csr_for(APP);

    let cases: Vec<DenialCase> = vec![
        (
            "pod on another node",
            Some(ca.token(&ztunnel_a())),
            Some(DB),
            IMPERSONATION,
            "no_pod_on_node",
        ),
        (
            "untrusted caller",
            Some(ca.token(&rogue)),
            Some(APP),
            IMPERSONATION,
            "untrusted_caller",
        ),
        (
            "pod uid mismatch",
            Some(ca.token(&stale_uid)),
            Some(APP),
            IMPERSONATION,
            "caller_pod_uid_mismatch",
        ),
        (
            "foreign trust domain",
            Some(ca.token(&ztunnel_a())),
            Some("spiffe://evil.local/ns/default/sa/app"),
            IMPERSONATION,
            "foreign_trust_domain",
        ),
        ("expired token", Some(expired), None, AUTHN, "expired_token"),
        (
            "wrong audience",
            Some(ca.token(&wrong_audience)),
            None,
            AUTHN,
            "wrong_audience",
        ),
        (
            "bad signature",
            Some(bad_signature),
            None,
            AUTHN,
            "bad_signature",
        ),
        ("no token", None, None, AUTHN, "missing_token"),
        (
            "garbage token",
            Some("x.y.z".into()),
            Some(APP),
            AUTHN,
            "malformed_token",
        ),
    ];
    for (case, token, impersonate, message, _) in &cases {
        let result = ca
            .request(token.as_deref(), csr.csr_pem(), *impersonate, 0)
            .await;
        assert_denied(result, message, case);
    }
    let text = ca.metrics().await;
    for (case, _, _, _, reason) in &cases {
        let line = format!("ca_requests_denied_total{{reason=\"{reason}\"}} 1");
        assert!(text.contains(&line), "{case}: {line} not in\n{text}");
    }
}

#[tokio::test]
async fn invalid_requests_are_invalid_argument() {
    let ca = start_ca().await;
    let token = ca.token(&app());
    let csr = csr_for(APP);
    let too_long = ca
        .request(Some(&token), csr.csr_pem(), None, 48 * 3600 + 1)
        .await
        .unwrap_err();
    assert_eq!(too_long.code(), Code::InvalidArgument);
    assert!(
        too_long.message().starts_with("CSR signing error ("),
        "{}",
        too_long.message()
    );
    assert!(
        ca.request(Some(&token), csr.csr_pem(), None, 48 * 3600)
            .await
            .is_ok(),
        "the maximum itself is fine"
    );

    let garbage = ca
        .request(
            Some(&token),
            "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n",
            None,
            0,
        )
        .await
        .unwrap_err();
    assert_eq!(garbage.code(), Code::InvalidArgument);
    assert!(
        garbage.message().starts_with("CSR signing error ("),
        "{}",
        garbage.message()
    );
    let not_pem = ca
        .request(Some(&token), "hello", None, 0)
        .await
        .unwrap_err();
    assert_eq!(not_pem.code(), Code::InvalidArgument);

    let huge = "A".repeat(300 * 1024);
    let oversized = ca.request(Some(&token), &huge, None, 0).await.unwrap_err();
    assert_eq!(
        oversized.code(),
        Code::OutOfRange,
        "refused by the message bound, before the CSR parser"
    );
    assert!(
        oversized.message().contains("too large"),
        "{}",
        oversized.message()
    );

    let text = ca.metrics().await;
    assert!(
        text.contains(r#"ca_requests_rejected_total{reason="ttl_too_long"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"ca_requests_rejected_total{reason="invalid_csr"} 2"#),
        "{text}"
    );
}

#[tokio::test]
async fn a_pod_moving_node_revokes_the_node_agent_authorization() {
    let ca = start_ca().await;
    assert!(ca.issue(&ztunnel_a(), Some(APP)).await.is_ok());

    let moved = PODS.replace(
        "{name: app-a, namespace: default, uid: uid-app, serviceAccount: app, nodeName: node-a",
        "{name: app-a, namespace: default, uid: uid-app, serviceAccount: app, nodeName: node-b",
    );
    assert_ne!(moved, PODS);
    // Written aside and renamed into place: a plain write truncates the
    // file first, and a poll that read it empty (no pods, so ztunnel-a
    // denied too) once ended the wait below early.
    let staged = ca.mesh.with_extension("staged");
    std::fs::write(&staged, moved).unwrap();
    std::fs::rename(&staged, &ca.mesh).unwrap();
    // The registry polls every 20 ms; give it up to 10 s.
    let mut last = Ok(Default::default());
    for _ in 0..500 {
        last = ca.issue(&ztunnel_a(), Some(APP)).await;
        if last.is_err() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_denied(last, IMPERSONATION, "after the move");
    // ztunnel-b now gets it.
    let ztunnel_b = pod_token(
        "istio-system",
        "ztunnel",
        "ztunnel-b",
        "uid-zb",
        Some("node-b"),
    );
    let issued = ca.issue(&ztunnel_b, Some(APP)).await;
    assert!(issued.is_ok(), "ztunnel-b after the move: {issued:?}");

    // A broken file keeps the last good registry. Renamed into place as
    // above (a truncated file read mid-write is an empty mesh, not a broken
    // one), and checked only once the refusal was counted, so the request
    // below runs after the broken file was read.
    std::fs::write(&staged, "- {name: [broken\n").unwrap();
    std::fs::rename(&staged, &ca.mesh).unwrap();
    let refused = r#"mesh_reload_errors_total 1"#;
    let mut text = String::new();
    for _ in 0..500 {
        text = ca.metrics().await;
        if text.contains(refused) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(text.contains(refused), "{text}");
    let kept = ca.issue(&ztunnel_b, Some(APP)).await;
    assert!(kept.is_ok(), "ztunnel-b with the broken file: {kept:?}");
}

#[tokio::test]
async fn failed_handshakes_do_not_stop_the_server() {
    let ca = start_ca().await;
    for _ in 0..3 {
        let mut junk = TcpStream::connect(ca.addr).await.unwrap();
        junk.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        let mut sink = Vec::new();
        let _ = junk.read_to_end(&mut sink).await;
    }
    assert!(ca.issue(&app(), None).await.is_ok());
}

/// A chain the CA issues is accepted by the mesh verifiers for its identity
/// and refused for any other.
#[tokio::test]
async fn issued_chains_pass_the_mesh_verifiers_for_their_identity_only() {
    let ca = start_ca().await;
    let fetch = |token: PodToken, identity: &'static str| {
        let ca = &ca;
        async move {
            let csr = csr_for(identity);
            let response = ca
                .request(Some(&ca.token(&token)), csr.csr_pem(), None, 0)
                .await
                .unwrap();
            WorkloadCertificate::from_ca_response(&response.cert_chain, csr.private_key(), None)
                .unwrap()
        }
    };
    let server_cert = fetch(app(), APP).await;
    let client_cert = fetch(pod_token("default", "db", "db-b", "uid-db", None), DB).await;

    for (expected, ok) in [
        (APP, true),
        (DB, false),
        ("spiffe://cluster.local/ns/default/sa/other", false),
    ] {
        let server_config = Arc::new(ztunnel_certs::tls::server_config(&server_cert).unwrap());
        let client_config = Arc::new(
            ztunnel_certs::tls::client_config(&client_cert, vec![expected.parse().unwrap()])
                .unwrap(),
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accept = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            let tls = tokio_rustls::TlsAcceptor::from(server_config)
                .accept(tcp)
                .await;
            tls.map(|stream| ztunnel_certs::tls::peer_identity(stream.get_ref().1))
        });
        let tcp = TcpStream::connect(addr).await.unwrap();
        let dialed = tokio_rustls::TlsConnector::from(client_config)
            .connect(ztunnel_certs::tls::dummy_server_name(), tcp)
            .await;
        assert_eq!(dialed.is_ok(), ok, "expecting {expected}");
        let accepted = accept.await.unwrap();
        if ok {
            let peer = accepted.unwrap();
            assert_eq!(
                peer.as_ref().map(Identity::as_str),
                Some(DB),
                "server sees the client identity"
            );
        }
    }
}
