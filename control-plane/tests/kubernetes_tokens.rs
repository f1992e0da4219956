#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test
//! Junk tokens against `ztunnel-ca serve --kubeconfig` on a real API server
//! (etcd and kube-apiserver from `scripts/k8s-test-env.sh`): a flood of
//! them on several connections does not delay an honest node agent's
//! certificate, and the API server sees a bounded number of TokenReviews,
//! counted by the API server itself (`apiserver_request_total`). Without
//! the API server's published keys the control plane stays unready and
//! sends no review at all.
//!
//! The junk is made the ways a peer can: strings that are not JWTs, real
//! tokens for another audience, tokens signed with the API server's own
//! service-account key (which the test harness holds) but naming another
//! issuer or expired, tokens naming keys the API server never published,
//! tokens naming its key but signed with another, and one real token
//! whose pod was deleted, sent again and again.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use api::{ROLE, api_with_control_plane_account, running_pod, stored_roots, wait_ready};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use rustls::pki_types::CertificateDer;
use serde_json::{Value, json};
use tonic::Code;
use ztunnel_certs::csr::CertRequest;
use ztunnel_test_support::kube::KubeApi;
use ztunnel_test_support::kube::objects::{delete_pod, ensure_namespace, request_token};

#[path = "support/api.rs"]
mod api;
#[path = "support/ca_client.rs"]
mod ca_client;
#[path = "support/serve.rs"]
mod serve;

/// Connections the junk comes on.
const CONNECTIONS: usize = 8;

/// Requests in flight on each of them at once.
const STREAMS_PER_CONNECTION: usize = 4;

/// The most junk requests one stream sends: 8 × 4 × 250 = 8,000 in all.
const JUNK_PER_STREAM: usize = 250;

/// Junk answered before the honest request is sent, and after it is
/// answered, so that the flood surrounds it.
const JUNK_AROUND: usize = 1_000;

/// How long the flood may last, whatever the counts: a bound on the test.
const FLOOD_DEADLINE: Duration = Duration::from_secs(60);

/// The bound on the honest certificate under the flood. Unloaded it takes
/// one TokenReview and one signature, tens of milliseconds; the flood must
/// not add queueing behind junk. Generous, so that a busy CI machine does
/// not fail the test; the time taken is printed.
const HONEST_WITHIN: Duration = Duration::from_secs(3);

/// The most TokenReviews the API server may see during the flood: the
/// honest caller's one, and the repeated real token once per 5 s of
/// refusal cache (`authenticator/cache.rs`) over at most the 60 s of the
/// flood (13), with room to spare. Without the local checks every junk
/// token is a review: thousands.
const REVIEWS_AT_MOST: u64 = 20;

/// The node agent's pod, the pod it asks for, their node.
const NODE: &str = "node-a";
const WEB: &str = "spiffe://cluster.local/ns/apps/sa/web";

/// The honest node agent's token, the junk, and where to send them.
struct Setup {
    /// Dropped first: the control plane stops before its API server.
    _server: serve::Server,
    api: KubeApi,
    grpc: SocketAddr,
    http: SocketAddr,
    roots: Vec<CertificateDer<'static>>,
    node_token: String,
    /// Every kind of junk, each with its name.
    junk: Vec<(&'static str, Vec<String>)>,
}

/// Sum of the API server's own count of TokenReview POSTs, all codes.
fn reviews_seen(api: &KubeApi) -> u64 {
    let metrics = api.kubectl(&["get", "--raw", "/metrics"], None).unwrap();
    metrics
        .lines()
        .filter(|line| {
            line.starts_with("apiserver_request_total{")
                && line.contains("resource=\"tokenreviews\"")
                && line.contains("verb=\"POST\"")
        })
        .map(|line| {
            let count = line.rsplit(' ').next().unwrap();
            count.parse::<f64>().unwrap() as u64
        })
        .sum()
}

/// Signs `claims` as ES256 with `key`, naming `kid`.
fn sign(key: &EncodingKey, kid: &str, claims: &Value) -> String {
    let mut header = Header::new(Algorithm::ES256);
    header.kid = Some(kid.to_owned());
    jsonwebtoken::encode(&header, claims, key).unwrap()
}

/// `token`'s claims, read without checking them.
fn claims_of(token: &str) -> Value {
    let payload = token.split('.').nth(1).unwrap();
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).unwrap()).unwrap()
}

/// `claims` with `changes` made and a `jti` of its own, so that no two
/// tokens are the same.
fn varied(claims: &Value, index: usize, changes: &[(&str, Value)]) -> Value {
    let mut claims = claims.clone();
    for (name, value) in changes {
        claims[*name] = value.clone();
    }
    claims["jti"] = json!(format!("junk-{index}"));
    claims
}

/// The API server, the control plane (its account bound to `role`), a
/// node agent and a pod on its node, and the junk. With `issuer_discovery`
/// false the cluster has dropped Kubernetes' default grant of the
/// discovery paths to every service account.
async fn setup(role: &str, issuer_discovery: bool) -> Option<Setup> {
    let (api, kubeconfig) = api_with_control_plane_account(role).await?;
    let client = api.admin_client().await.unwrap();
    ensure_namespace(&client, "apps", &[]).await.unwrap();
    let ztunnel_uid = running_pod(
        &client,
        "istio-system",
        "ztunnel-a",
        "ztunnel",
        NODE,
        "198.18.0.11",
    )
    .await;
    running_pod(&client, "apps", "web-0", "web", NODE, "198.18.10.2").await;
    let gone_uid = running_pod(&client, "apps", "gone-0", "web", NODE, "198.18.10.3").await;
    let bound = |name, uid, audience| {
        let client = client.clone();
        async move {
            request_token(
                &client,
                "istio-system",
                "ztunnel",
                Some((name, uid)),
                Some(audience),
            )
            .await
            .unwrap()
        }
    };
    let node_token = bound("ztunnel-a", &ztunnel_uid, "istio-ca").await;
    let other_audience = bound("ztunnel-a", &ztunnel_uid, "vault").await;
    let gone_token = request_token(
        &client,
        "apps",
        "web",
        Some(("gone-0", &gone_uid)),
        Some("istio-ca"),
    )
    .await
    .unwrap();
    delete_pod(&client, "apps", "gone-0").await.unwrap();

    // The API server's own signing key and the kid it publishes for it.
    let jwks: Value = serde_json::from_str(
        &api.kubectl(&["get", "--raw", "/openid/v1/jwks"], None)
            .unwrap(),
    )
    .unwrap();
    let kid = jwks["keys"][0]["kid"].as_str().unwrap().to_owned();
    let pem = std::fs::read(api.service_account_key()).unwrap();
    let api_key = EncodingKey::from_ec_pem(&pem).unwrap();
    let stranger = rcgen::KeyPair::generate().unwrap();
    let stranger = EncodingKey::from_ec_pem(stranger.serialize_pem().as_bytes()).unwrap();
    let claims = claims_of(&node_token);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let each = |make: &dyn Fn(usize) -> String| (0..JUNK_PER_STREAM).map(make).collect();
    let junk = vec![
        ("not a JWT", each(&|i| format!("junk-{i}"))),
        ("another audience (a real token)", vec![other_audience]),
        (
            "another issuer",
            each(&|i| {
                sign(
                    &api_key,
                    &kid,
                    &varied(&claims, i, &[("iss", json!("https://attacker.example"))]),
                )
            }),
        ),
        (
            "expired",
            each(&|i| {
                sign(
                    &api_key,
                    &kid,
                    &varied(&claims, i, &[("exp", json!(now - 3600))]),
                )
            }),
        ),
        (
            "a key never published",
            each(&|i| sign(&stranger, &format!("kid-{i}"), &varied(&claims, i, &[]))),
        ),
        (
            "the published kid, another key's signature",
            each(&|i| sign(&stranger, &kid, &varied(&claims, i, &[]))),
        ),
        ("the same real token of a deleted pod", vec![gone_token]),
    ];

    if !issuer_discovery {
        let binding = "system:service-account-issuer-discovery";
        api.kubectl(&["delete", "clusterrolebinding", binding], None)
            .unwrap();
    }
    let state = api.dir().join("ca-state");
    // Each junk request is a denial logged at warn; the flood's thousands
    // of lines would bury the rest.
    let log = "info,ztunnel_control_plane::ca::service=error";
    let (server, grpc, http) = serve::start(&state, &["--kubeconfig", &kubeconfig], log);
    if issuer_discovery {
        wait_ready(http).await;
    }
    let roots = stored_roots(&client).await;
    Some(Setup {
        _server: server,
        api,
        grpc,
        http,
        roots,
        node_token,
        junk,
    })
}

/// Asks for the web pod's certificate as the node agent: the code, and
/// how long it took, connection included.
async fn honest_certificate(setup: &Setup) -> (Result<(), Code>, Duration) {
    let csr = CertRequest::generate(&WEB.parse().unwrap()).unwrap();
    let started = Instant::now();
    let mut client = ca_client::connect(setup.grpc, &setup.roots).await;
    let request = ca_client::request(Some(&setup.node_token), csr.csr_pem(), Some(WEB), 3600);
    let answer = client.create_certificate(request).await;
    (
        answer.map(|_| ()).map_err(|status| status.code()),
        started.elapsed(),
    )
}

/// Waits until `count` reaches `at_least`, or the flood ends.
async fn until_answered(count: &AtomicUsize, at_least: usize, flooding: &AtomicUsize) {
    while count.load(Ordering::Relaxed) < at_least && flooding.load(Ordering::Relaxed) > 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flood_of_junk_tokens_delays_no_honest_certificate_and_costs_few_reviews() {
    let Some(setup) = setup(ROLE, true).await else {
        return;
    };
    let before = reviews_seen(&setup.api);
    let answered = Arc::new(AtomicUsize::new(0));
    let accepted = Arc::new(AtomicUsize::new(0));
    let flooding = Arc::new(AtomicUsize::new(CONNECTIONS * STREAMS_PER_CONNECTION));
    let stop = Arc::new(AtomicBool::new(false));
    let junk: Arc<Vec<String>> = Arc::new(
        (0..JUNK_PER_STREAM)
            .flat_map(|i| {
                setup
                    .junk
                    .iter()
                    .map(move |(_, tokens)| tokens[i % tokens.len()].clone())
            })
            .collect(),
    );
    let csr = Arc::new(
        CertRequest::generate(&WEB.parse().unwrap())
            .unwrap()
            .csr_pem()
            .to_owned(),
    );
    let started = Instant::now();
    let mut streams = Vec::new();
    for connection in 0..CONNECTIONS {
        let client = ca_client::connect(setup.grpc, &setup.roots).await;
        for stream in 0..STREAMS_PER_CONNECTION {
            let mut client = client.clone();
            let (junk, csr) = (Arc::clone(&junk), Arc::clone(&csr));
            let (answered, accepted) = (Arc::clone(&answered), Arc::clone(&accepted));
            let (flooding, stop) = (Arc::clone(&flooding), Arc::clone(&stop));
            let offset = (connection * STREAMS_PER_CONNECTION + stream) * 7;
            streams.push(tokio::spawn(async move {
                for index in 0..JUNK_PER_STREAM {
                    if stop.load(Ordering::Relaxed) || started.elapsed() > FLOOD_DEADLINE {
                        break;
                    }
                    let token = &junk[(offset + index) % junk.len()];
                    let request = ca_client::request(Some(token), &csr, Some(WEB), 3600);
                    if client.create_certificate(request).await.is_ok() {
                        accepted.fetch_add(1, Ordering::Relaxed);
                    }
                    answered.fetch_add(1, Ordering::Relaxed);
                }
                flooding.fetch_sub(1, Ordering::Relaxed);
            }));
        }
    }

    until_answered(&answered, JUNK_AROUND, &flooding).await;
    let before_honest = answered.load(Ordering::Relaxed);
    let (honest, took) = honest_certificate(&setup).await;
    let after_honest = answered.load(Ordering::Relaxed);
    until_answered(&answered, after_honest + JUNK_AROUND, &flooding).await;
    stop.store(true, Ordering::Relaxed);
    for stream in streams {
        stream.await.unwrap();
    }
    let flood = started.elapsed();
    let total = answered.load(Ordering::Relaxed);
    let reviews = reviews_seen(&setup.api) - before;
    eprintln!(
        "{total} junk requests on {CONNECTIONS} connections in {flood:?}; the honest certificate \
         took {took:?} ({before_honest} junk answered before it, {} while it waited, {} after); \
         the API server saw {reviews} TokenReviews",
        after_honest - before_honest,
        total - after_honest,
    );

    assert_eq!(honest, Ok(()), "the honest node agent gets its certificate");
    assert!(took < HONEST_WITHIN, "the honest certificate took {took:?}");
    assert!(
        before_honest >= JUNK_AROUND && total >= after_honest + JUNK_AROUND,
        "the flood surrounded the honest request"
    );
    assert_eq!(
        accepted.load(Ordering::Relaxed),
        0,
        "no junk token is accepted"
    );
    assert!(
        reviews <= REVIEWS_AT_MOST,
        "the API server saw {reviews} TokenReviews for {total} junk requests"
    );

    // Each kind was refused where it should be, and counted.
    let metrics = ca_client::metrics(setup.http).await;
    for reason in [
        "malformed_token",
        "wrong_audience",
        "wrong_issuer",
        "expired_token",
        "unknown_key_id",
        "bad_signature",
    ] {
        let line = format!("ca_tokens_refused_locally_total{{reason=\"{reason}\"}} ");
        assert!(metrics.contains(&line), "{reason} counted:\n{metrics}");
    }
    assert!(
        metrics.contains("ca_token_review_cache_hits_total{outcome=\"refused\"} "),
        "the repeated token answered from the refusal cache:\n{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_issuers_keys_the_control_plane_is_unready_and_reviews_nothing() {
    let marker = "  - nonResourceURLs: [/.well-known/openid-configuration, /openid/v1/jwks]\n    verbs: [get]\n";
    let without_keys = ROLE.replace(marker, "");
    assert_ne!(without_keys, ROLE, "the test removes the keys rule");
    let Some(setup) = setup(&without_keys, false).await else {
        return;
    };
    let before = reviews_seen(&setup.api);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut ready = String::new();
    while Instant::now() < deadline {
        ready = ca_client::get(setup.http, "/ready").await;
        if ready.contains("openid") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(ready.starts_with("HTTP/1.1 503"), "{ready}");
    assert!(
        ready.contains("get /openid/v1/jwks"),
        "what is missing is named: {ready}"
    );
    let (honest, _) = honest_certificate(&setup).await;
    assert_eq!(
        honest,
        Err(Code::Unauthenticated),
        "no token can be checked yet"
    );
    assert_eq!(reviews_seen(&setup.api) - before, 0, "and none is reviewed");

    // Granted: ready, and the node agent gets its certificate.
    setup
        .api
        .kubectl(&["apply", "-f", "-"], Some(ROLE))
        .unwrap();
    wait_ready(setup.http).await;
    let (honest, took) = honest_certificate(&setup).await;
    eprintln!("once the keys are readable: {honest:?} in {took:?}");
    assert_eq!(honest, Ok(()));
}
