//! Who a bearer token belongs to, by one of two means: the local keys of
//! the file source (a JWKS the tokens are verified against in process), or
//! the Kubernetes TokenReview API (KUBERNETES.md F), which also refuses
//! tokens bound to a pod that no longer exists.
//!
//! Reviews are cached briefly by the token's hash, so that a ztunnel
//! asking for the certificates of every pod on its node costs one review.
//! Only authenticated answers are cached: a refusal or an API error is
//! asked again next time. The cache cannot outlive a pod's deletion by
//! much, and authorization re-checks the caller's pod against the live
//! mesh on every request anyway (`authz.rs`).

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use aws_lc_rs::digest;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::Api;
use kube::api::PostParams;
use ztunnel_certs::error_chain::ErrorChain;

use super::authn::{AuthnError, Caller, TokenPolicy};
use super::token_keys::TokenKeys;

/// How long an authenticated review is reused: short, as istiod's cache.
const REVIEW_CACHE_TTL: Duration = Duration::from_secs(10);

/// Most reviews cached: a node's ztunnel uses one token, so this is far
/// more than the nodes of any cluster; past it the cache starts over
/// rather than grow with a flood of distinct tokens.
const REVIEW_CACHE_ENTRIES: usize = 4096;

/// How long one TokenReview may take before the request is refused.
const REVIEW_TIMEOUT: Duration = Duration::from_secs(5);

/// How callers' tokens are verified.
pub enum Authenticator {
    /// Against local keys, with the issuer and audience of `policy`.
    Keys {
        /// Verification keys.
        keys: TokenKeys,
        /// Issuer, audience and leeway.
        policy: TokenPolicy,
    },
    /// By the API server's TokenReview.
    TokenReview(TokenReviewer),
}

impl Authenticator {
    /// The pod-bound caller `token` belongs to, at `now`.
    pub async fn authenticate(&self, token: &[u8], now: SystemTime) -> Result<Caller, AuthnError> {
        match self {
            Authenticator::Keys { keys, policy } => Caller::from_token(token, keys, policy, now),
            Authenticator::TokenReview(reviewer) => reviewer.review(token).await,
        }
    }
}

/// Reviews tokens with the API server, for one audience.
pub struct TokenReviewer {
    /// A client with the control plane's own credentials.
    client: kube::Client,
    /// The audiences a token must carry (`istio-ca`).
    audiences: Vec<String>,
    /// Token hash → the caller and when the entry expires.
    cache: Mutex<HashMap<[u8; 32], (Caller, Instant)>>,
}

impl TokenReviewer {
    /// A reviewer asking through `client` for tokens meant for `audience`.
    pub fn new(client: kube::Client, audience: &str) -> Self {
        TokenReviewer {
            client,
            audiences: vec![audience.to_owned()],
            cache: Mutex::new(HashMap::new()),
        }
    }

    async fn review(&self, token: &[u8]) -> Result<Caller, AuthnError> {
        let text = std::str::from_utf8(token).map_err(|_| AuthnError::Malformed)?;
        let key = token_hash(token);
        let now = Instant::now();
        if let Some(caller) = self.cached(&key, now) {
            return Ok(caller);
        }
        let request = TokenReview {
            spec: TokenReviewSpec {
                token: text.to_owned(),
                audiences: Some(self.audiences.clone()),
            },
            ..TokenReview::default()
        };
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let response =
            tokio::time::timeout(REVIEW_TIMEOUT, api.create(&PostParams::default(), &request))
                .await
                .map_err(|_| AuthnError::ReviewUnavailable("timed out".to_owned()))?
                .map_err(|error| AuthnError::ReviewUnavailable(ErrorChain(&error).to_string()))?;
        let status = response.status.unwrap_or_default();
        let caller = Caller::from_review(&status, token)?;
        self.remember(key, caller.clone(), now);
        Ok(caller)
    }

    fn cached(&self, key: &[u8; 32], now: Instant) -> Option<Caller> {
        let cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        cache
            .get(key)
            .filter(|(_, expires)| *expires > now)
            .map(|(caller, _)| caller.clone())
    }

    fn remember(&self, key: [u8; 32], caller: Caller, now: Instant) {
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        cache.retain(|_, (_, expires)| *expires > now);
        if cache.len() >= REVIEW_CACHE_ENTRIES {
            cache.clear();
        }
        cache.insert(key, (caller, now + REVIEW_CACHE_TTL));
    }
}

/// SHA-256 of a token: the cache never holds the token itself.
fn token_hash(token: &[u8]) -> [u8; 32] {
    let digest = digest::digest(&digest::SHA256, token);
    // A SHA-256 digest is 32 bytes; the fallback is never taken.
    <[u8; 32]>::try_from(digest.as_ref()).unwrap_or_default()
}
