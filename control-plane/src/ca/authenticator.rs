//! Who a bearer token belongs to, by one of two means: the local keys of
//! the file source (a JWKS the tokens are verified against in process), or
//! on Kubernetes the API server's keys and then its TokenReview API
//! (KUBERNETES.md F), which also refuses tokens bound to a pod that no
//! longer exists.
//!
//! On Kubernetes a token costs a review only once it has passed every
//! check that can be made locally (`authn.rs`
//! [`Caller::from_published_token`]: a JWT of the published issuer for our
//! audience, unexpired, signed by a key the API server publishes,
//! `published_keys.rs`), so junk is refused in microseconds and never
//! reaches the API server. Reviews are bounded in flight
//! ([`REVIEWS_IN_FLIGHT`]; a caller waits [`REVIEW_SLOT_WAIT`] at most for
//! a slot, then is refused), concurrent reviews of one token are one
//! review, and answers are remembered briefly by the token's hash
//! (`authenticator/cache.rs`). Each of these is counted
//! (`ca_token_reviews`, `ca_tokens_refused_locally`,
//! `ca_token_review_cache_hits`, `ca_token_reviews_busy`).
//!
//! The answer is the review's: the caller's pod comes from what the API
//! server says, and authorization re-checks it against the live mesh on
//! every request (`authz.rs`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::Api;
use kube::api::PostParams;
use tokio::sync::{OnceCell, Semaphore};
use ztunnel_certs::error_chain::ErrorChain;

use cache::{ReviewCache, TokenHash, token_hash};

use super::authn::{AuthnError, Caller, TokenPolicy};
use super::metrics::CaMetrics;
use super::published_keys::{IssuerKeys, PublishedKeys};
use super::token_keys::TokenKeys;

mod cache;

/// How long one TokenReview may take before the request is refused.
const REVIEW_TIMEOUT: Duration = Duration::from_secs(5);

/// Most TokenReviews in flight at once. A review takes a few milliseconds,
/// so 16 is thousands a second, more than a cluster's ztunnels starting
/// together need once repeated tokens are answered from the cache; and it
/// is a small share of the API server's default 200 mutating requests in
/// flight, which the whole cluster shares.
pub const REVIEWS_IN_FLIGHT: usize = 16;

/// How long a request waits for a review slot before it is refused: as
/// long as one review may take, past which the API server, not the queue,
/// is what is slow; the caller (ztunnel) retries with backoff.
pub const REVIEW_SLOT_WAIT: Duration = REVIEW_TIMEOUT;

/// How callers' tokens are verified.
// Built once and shared behind an `Arc`: the size difference between the
// variants costs nothing.
#[allow(clippy::large_enum_variant)]
pub enum Authenticator {
    /// Against local keys, with the issuer and audience of `policy`.
    Keys {
        /// Verification keys.
        keys: TokenKeys,
        /// Issuer, audience and leeway.
        policy: TokenPolicy,
    },
    /// Against the API server's published keys, then by its TokenReview.
    TokenReview(TokenReviewer),
}

impl Authenticator {
    /// The pod-bound caller `token` belongs to, at `now`.
    pub async fn authenticate(&self, token: &[u8], now: SystemTime) -> Result<Caller, AuthnError> {
        match self {
            Authenticator::Keys { keys, policy } => Caller::from_token(token, keys, policy, now),
            Authenticator::TokenReview(reviewer) => reviewer.review(token, now).await,
        }
    }
}

/// One review's answer, shared by every request for the same token that
/// arrives while it is in flight.
type Shared = Arc<OnceCell<Result<Caller, AuthnError>>>;

/// Checks tokens against the API server's keys, then reviews them there.
pub struct TokenReviewer {
    /// A client with the control plane's own credentials.
    client: kube::Client,
    /// The issuer, audience and keys a token is checked against first.
    keys: Arc<PublishedKeys>,
    /// Review slots: [`REVIEWS_IN_FLIGHT`].
    slots: Semaphore,
    /// Recent answers.
    cache: Mutex<ReviewCache>,
    /// Reviews in flight, by token hash, each shared by its requests.
    in_flight: Mutex<HashMap<TokenHash, InFlight>>,
    /// Where reviews, refusals and cache hits are counted.
    metrics: Arc<CaMetrics>,
}

impl TokenReviewer {
    /// A reviewer asking through `client`, for tokens that pass the checks
    /// against `keys` first.
    pub fn new(client: kube::Client, keys: Arc<PublishedKeys>, metrics: Arc<CaMetrics>) -> Self {
        TokenReviewer {
            client,
            keys,
            slots: Semaphore::new(REVIEWS_IN_FLIGHT),
            cache: Mutex::new(ReviewCache::default()),
            in_flight: Mutex::new(HashMap::new()),
            metrics,
        }
    }

    async fn review(&self, token: &[u8], now: SystemTime) -> Result<Caller, AuthnError> {
        let issuer = self.check_locally(token, now)?;
        let key = token_hash(token);
        if let Some(answer) = self.cache().lookup(&key, Instant::now()) {
            self.metrics.record_token_review_cache_hit(answer.is_ok());
            return answer;
        }
        let joined = self.join(key);
        let answer = joined
            .answer
            .get_or_init(|| self.send(token, &issuer.policy.audience, key))
            .await;
        answer.clone()
    }

    /// The issuer's keys, once `token` has passed every check they allow
    /// at `now`. A refusal is counted; one for a key not published (yet)
    /// asks for the keys to be fetched again.
    fn check_locally(&self, token: &[u8], now: SystemTime) -> Result<Arc<IssuerKeys>, AuthnError> {
        let checked = match self.keys.current() {
            None => Err(AuthnError::KeysUnavailable),
            Some(issuer) => Caller::from_published_token(token, &issuer.keys, &issuer.policy, now)
                .map(|_| issuer),
        };
        if let Err(error) = &checked {
            if *error == AuthnError::UnknownKeyId {
                self.keys.unknown_key_seen();
            }
            self.metrics.record_token_refused_locally(error.label());
        }
        checked
    }

    /// Sends the review once a slot is free, counts and remembers its
    /// answer.
    async fn send(
        &self,
        token: &[u8],
        audience: &str,
        key: TokenHash,
    ) -> Result<Caller, AuthnError> {
        let Ok(Ok(_slot)) = tokio::time::timeout(REVIEW_SLOT_WAIT, self.slots.acquire()).await
        else {
            self.metrics.record_token_review_busy();
            return Err(AuthnError::ReviewBusy);
        };
        let answer = self.ask(token, audience).await;
        let outcome = match &answer {
            Ok(_) => "authenticated",
            Err(AuthnError::ReviewUnavailable(_)) => "failed",
            Err(_) => "refused",
        };
        self.metrics.record_token_review(outcome);
        self.cache().remember(key, &answer, Instant::now());
        answer
    }

    /// One TokenReview of `token` for `audience`.
    async fn ask(&self, token: &[u8], audience: &str) -> Result<Caller, AuthnError> {
        let text = std::str::from_utf8(token).map_err(|_| AuthnError::Malformed)?;
        let request = TokenReview {
            spec: TokenReviewSpec {
                token: text.to_owned(),
                audiences: Some(vec![audience.to_owned()]),
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
        Caller::from_review(&status, token)
    }

    /// The review of `key` in flight, joined, or a new one.
    fn join(&self, key: TokenHash) -> Joined<'_> {
        let mut in_flight = self.in_flight();
        let entry = in_flight.entry(key).or_insert_with(|| InFlight {
            answer: Shared::default(),
            waiting: 0,
        });
        entry.waiting += 1;
        Joined {
            reviewer: self,
            key,
            answer: Arc::clone(&entry.answer),
        }
    }

    fn cache(&self) -> MutexGuard<'_, ReviewCache> {
        self.cache.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn in_flight(&self) -> MutexGuard<'_, HashMap<TokenHash, InFlight>> {
        self.in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// A review in flight and how many requests wait for it.
struct InFlight {
    /// The answer, once there is one.
    answer: Shared,
    /// Requests holding a [`Joined`] for it.
    waiting: usize,
}

/// A request's share of a review in flight. The last request to leave an
/// unanswered review (all of them were cancelled), or any request once it
/// is answered (the answer is in the cache then), takes it off the map, so
/// that the map holds only what is in flight.
struct Joined<'a> {
    reviewer: &'a TokenReviewer,
    key: TokenHash,
    answer: Shared,
}

impl Drop for Joined<'_> {
    fn drop(&mut self) {
        let mut in_flight = self.reviewer.in_flight();
        let Some(entry) = in_flight.get_mut(&self.key) else {
            return;
        };
        // A later review of the same token is another entry.
        if !Arc::ptr_eq(&entry.answer, &self.answer) {
            return;
        }
        entry.waiting = entry.waiting.saturating_sub(1);
        if entry.waiting == 0 || entry.answer.initialized() {
            in_flight.remove(&self.key);
        }
    }
}
