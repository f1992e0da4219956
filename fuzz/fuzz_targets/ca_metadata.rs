//! Fuzzes what the CA reads from a `CreateCertificate` call besides the
//! token's signature (WIRE.md §3): the `authorization` header
//! (`bearer_token`), the request message with its metadata
//! (`impersonated_identity`), the identity granted for it (`authorize`,
//! for a trusted node agent and for an ordinary workload, against a fixed
//! mesh), the lifetime asked for (`TtlPolicy::resolve`) and the CSR text
//! (`SigningRequest::from_pem`).
//!
//! The input is `[header length][header][IstioCertificateRequest bytes]`.
//!
//! Properties: no panic; a bearer token is the header after `Bearer `,
//! non-empty and bounded; an impersonated identity is the metadata's
//! non-empty string; without one a caller gets its own identity; with one
//! an ordinary workload is refused, and a node agent gets exactly the
//! identity asked for, in our trust domain, of a live pod on its own node;
//! a granted lifetime is positive and within the maximum.

#![no_main]

use std::sync::LazyLock;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use prost::Message;
use ztunnel_certs::issuer::{SigningRequest, TtlPolicy};
use ztunnel_control_plane::ca::authn::{Caller, MAX_TOKEN_BYTES, bearer_token};
use ztunnel_control_plane::ca::authz::{Denial, NodeAgentAccount, authorize};
use ztunnel_control_plane::ca::service::impersonated_identity;
use ztunnel_mesh::{MeshFile, MeshSnapshot};
use ztunnel_proto::istio::v1::auth::IstioCertificateRequest;

const TRUST_DOMAIN: &str = "cluster.local";
const NODE: &str = "node-a";

/// Two nodes, a ztunnel on the first, workloads on both, one failed pod.
const MESH: &str = r#"
- {name: ztunnel-a, namespace: istio-system, uid: uid-ztunnel-a, serviceAccount: ztunnel, nodeName: node-a, phase: Running, ips: ["198.18.0.1"]}
- {name: web-0, namespace: shop, uid: uid-web-0, serviceAccount: web, nodeName: node-a, phase: Running, ips: ["198.18.0.10"]}
- {name: db-0, namespace: shop, uid: uid-db-0, serviceAccount: db, nodeName: node-b, phase: Running, ips: ["198.18.1.10"]}
- {name: old-0, namespace: shop, uid: uid-old-0, serviceAccount: old, nodeName: node-a, phase: Failed}
- {name: job-0, namespace: batch, uid: uid-job-0, serviceAccount: default, nodeName: node-a, phase: Pending}
"#;

static SNAPSHOT: LazyLock<MeshSnapshot> = LazyLock::new(|| {
    let file: MeshFile = serde_yaml_ng::from_str(MESH).expect("the fixture parses");
    MeshSnapshot::new(file).expect("the fixture is a valid mesh")
});

static TRUSTED: LazyLock<Vec<NodeAgentAccount>> =
    LazyLock::new(|| vec!["istio-system/ztunnel".parse().expect("a valid account")]);

fn caller(namespace: &str, service_account: &str, pod: &str, uid: &str) -> Caller {
    Caller {
        namespace: namespace.to_owned(),
        service_account: service_account.to_owned(),
        pod_name: pod.to_owned(),
        pod_uid: uid.to_owned(),
        node_name: Some(NODE.to_owned()),
        expires: None,
    }
}

fn check_header(header: &[u8]) {
    if let Ok(token) = bearer_token(Some(header)) {
        assert!(!token.is_empty() && token.len() <= MAX_TOKEN_BYTES);
        assert_eq!(header.strip_prefix(b"Bearer "), Some(token));
    }
}

fn check_request(request: &IstioCertificateRequest) {
    let impersonate = impersonated_identity(request);
    if let Some(text) = impersonate {
        assert!(!text.is_empty());
    }

    let node_agent = caller("istio-system", "ztunnel", "ztunnel-a", "uid-ztunnel-a");
    let workload = caller("shop", "web", "web-0", "uid-web-0");
    for who in [&node_agent, &workload] {
        let granted = authorize(who, impersonate, TRUST_DOMAIN, &TRUSTED, &SNAPSHOT);
        match (impersonate, granted) {
            (None, granted) => {
                let own = granted.expect("a valid caller gets its own identity");
                assert_eq!(own.namespace(), who.namespace);
                assert_eq!(own.service_account(), who.service_account);
                assert_eq!(own.trust_domain(), TRUST_DOMAIN);
            }
            (Some(_), Err(Denial::UntrustedCaller)) => assert!(std::ptr::eq(who, &workload)),
            (Some(_), Err(_)) => assert!(std::ptr::eq(who, &node_agent)),
            (Some(text), Ok(identity)) => {
                assert!(
                    std::ptr::eq(who, &node_agent),
                    "a workload impersonated {text}"
                );
                assert_eq!(identity.as_str(), text);
                assert_eq!(identity.trust_domain(), TRUST_DOMAIN);
                assert!(SNAPSHOT.has_live_pod(
                    NODE,
                    identity.namespace(),
                    identity.service_account()
                ));
            }
        }
    }

    let ttl = TtlPolicy::new(Duration::from_secs(86_400), Duration::from_secs(7 * 86_400));
    if let Ok(granted) = ttl.resolve(request.validity_duration) {
        assert!(granted > Duration::ZERO && granted <= ttl.max_ttl());
        if request.validity_duration > 0 {
            assert_eq!(granted.as_secs(), request.validity_duration.unsigned_abs());
        }
    }
    let _ = SigningRequest::from_pem(&request.csr);
}

fuzz_target!(|data: &[u8]| {
    let Some((&len, rest)) = data.split_first() else {
        return;
    };
    let (header, message) = rest.split_at(usize::from(len).min(rest.len()));
    check_header(header);
    if let Ok(request) = IstioCertificateRequest::decode(message) {
        check_request(&request);
    }
});
