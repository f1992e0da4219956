//! Fuzzes how the CA reads the API server's answer to a TokenReview
//! (KUBERNETES.md F): the JSON of a `TokenReview` object, as the client
//! decodes it, then `Caller::from_review` on its status and the token it
//! reviewed (`spec.token`, whose expiry is read unverified).
//!
//! Properties: no panic; a caller is read only from an authenticated
//! review of a service account (`system:serviceaccount:<ns>:<name>` in the
//! group `system:serviceaccounts`), bound to a pod: its namespace, service
//! account, pod name and uid are non-empty and are exactly what the review
//! says, a node, when named, is the review's only node value, and its
//! expiry is the token's.

#![no_main]

use k8s_openapi::api::authentication::v1::TokenReview;
use libfuzzer_sys::fuzz_target;
use ztunnel_control_plane::ca::authn::{Caller, unverified_expiry};

const POD_NAME: &str = "authentication.kubernetes.io/pod-name";
const POD_UID: &str = "authentication.kubernetes.io/pod-uid";
const NODE_NAME: &str = "authentication.kubernetes.io/node-name";

fuzz_target!(|data: &[u8]| {
    let Ok(review) = serde_json::from_slice::<TokenReview>(data) else {
        return;
    };
    let Some(status) = &review.status else {
        return;
    };
    let token = review.spec.token.as_bytes();
    let Ok(caller) = Caller::from_review(status, token) else {
        return;
    };
    assert_eq!(caller.expires, unverified_expiry(token));
    assert_eq!(status.authenticated, Some(true));
    let user = status.user.as_ref().expect("an authenticated user");
    assert!(
        user.groups
            .iter()
            .flatten()
            .any(|group| group == "system:serviceaccounts")
    );
    let username = format!(
        "system:serviceaccount:{}:{}",
        caller.namespace, caller.service_account
    );
    assert_eq!(user.username.as_deref(), Some(username.as_str()));
    assert!(!caller.namespace.contains(':'));
    for part in [
        &caller.namespace,
        &caller.service_account,
        &caller.pod_name,
        &caller.pod_uid,
    ] {
        assert!(!part.is_empty());
    }
    let only = |key: &str| {
        user.extra
            .as_ref()
            .and_then(|extra| extra.get(key))
            .and_then(|values| match values.as_slice() {
                [value] => Some(value.as_str()),
                _ => None,
            })
    };
    assert_eq!(only(POD_NAME), Some(caller.pod_name.as_str()));
    assert_eq!(only(POD_UID), Some(caller.pod_uid.as_str()));
    match &caller.node_name {
        Some(node) => assert_eq!(only(NODE_NAME), Some(node.as_str())),
        None => assert!(only(NODE_NAME).is_none()),
    }
});
