//! The issuer and keys the Kubernetes API server publishes for its
//! service-account tokens (OIDC discovery: `/.well-known/openid-configuration`
//! names the issuer, `/openid/v1/jwks` holds the keys), fetched with the
//! control plane's own client and kept fresh: every 5 minutes, 5 s after a
//! failure, and sooner when a token names a key not seen yet, at most once
//! per 10 s however many tokens do. Until the first fetch succeeds the
//! control plane is unready ([`PublishedKeys::problem`]) and every token is
//! refused; a later failure keeps the keys last fetched.
//!
//! The keys are read from the API server's own path, not from the
//! document's `jwks_uri`: that may name a host outside the cluster (where
//! a cloud publishes the keys for verifiers outside it), which the control
//! plane need not reach, while the API server always serves them itself.
//!
//! An API server publishes only the first of its `--service-account-issuer`
//! flags. During an issuer migration, tokens minted under another one it
//! still accepts are refused here until the kubelet renews them.
//!
//! Checking a token against the keys is `authn.rs`'s business; when to
//! fetch is the pure [`wait_before_fetch`].

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde::Deserialize;
use tokio::sync::{Notify, watch};
use ztunnel_certs::error_chain::ErrorChain;

use super::authn::{DEFAULT_LEEWAY, TokenPolicy};
use super::token_keys::{TokenKeys, TokenKeysError};

/// The OIDC discovery document, which names the issuer.
pub const DISCOVERY_PATH: &str = "/.well-known/openid-configuration";

/// The API server's JWKS of service-account token keys.
pub const JWKS_PATH: &str = "/openid/v1/jwks";

/// How often the keys are fetched while all is well. A rotated key reaches
/// tokens only after the API server restarts with it, and a token naming
/// it asks for a fetch of its own, so this only bounds how long a retired
/// key stays trusted.
const REFRESH_INTERVAL: Duration = Duration::from_secs(300);

/// How soon a failed fetch is tried again: before the first success the
/// control plane is unready, so soon; one fetch is two small GETs.
const RETRY_INTERVAL: Duration = Duration::from_secs(5);

/// The least time between a fetch and one asked for by a token naming an
/// unknown key: junk tokens can name any key, and must not turn into a
/// stream of fetches. An honest token signed with a new key is refused
/// for at most this long (its caller retries).
const MIN_FETCH_INTERVAL: Duration = Duration::from_secs(10);

/// How long one fetch (both documents) may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// What a token must say, and the keys it must verify with, as last
/// fetched.
#[derive(Debug)]
pub struct IssuerKeys {
    /// The published issuer, the configured audience, the leeway.
    pub policy: TokenPolicy,
    /// The published keys, each named by its `kid`.
    pub keys: TokenKeys,
}

impl IssuerKeys {
    /// The issuer of the `discovery` document and the keys of `jwks`, for
    /// tokens that must carry `audience`.
    pub fn parse(discovery: &[u8], jwks: &[u8], audience: &str) -> Result<Self, DiscoveryError> {
        #[derive(Deserialize)]
        struct Discovery {
            issuer: String,
        }
        let document: Discovery = serde_json::from_slice(discovery)
            .map_err(|error| DiscoveryError::Document(error.to_string()))?;
        if document.issuer.is_empty() {
            return Err(DiscoveryError::Document("empty issuer".to_owned()));
        }
        Ok(IssuerKeys {
            policy: TokenPolicy {
                issuer: document.issuer,
                audience: audience.to_owned(),
                leeway: DEFAULT_LEEWAY,
            },
            keys: TokenKeys::from_jwks(jwks)?,
        })
    }
}

/// The keys in use, shared by the reviewer (which reads them) and the
/// task that fetches them.
pub struct PublishedKeys {
    /// The last successful fetch; `None` before the first.
    current: watch::Sender<Option<Arc<IssuerKeys>>>,
    /// Why there are no keys yet, for readiness.
    problem: Mutex<Option<String>>,
    /// Raised when a token names a key not among the current ones.
    unknown_key: Notify,
}

impl PublishedKeys {
    /// Fetches the keys through `client` now and keeps them fresh until
    /// `shutdown` resolves; tokens must carry `audience`.
    pub fn start(
        client: kube::Client,
        audience: &str,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Arc<Self> {
        let published = Arc::new(PublishedKeys {
            current: watch::Sender::new(None),
            problem: Mutex::new(Some("not fetched yet".to_owned())),
            unknown_key: Notify::new(),
        });
        tokio::spawn(refresh(
            client,
            audience.to_owned(),
            Arc::clone(&published),
            shutdown,
        ));
        published
    }

    /// The keys in use, or `None` before the first fetch succeeded.
    pub fn current(&self) -> Option<Arc<IssuerKeys>> {
        self.current.borrow().clone()
    }

    /// Asks for a fetch: a token named a key not among the current ones.
    /// Such fetches come at least 10 s after the last one.
    pub fn unknown_key_seen(&self) {
        self.unknown_key.notify_one();
    }

    /// Why tokens cannot be checked yet, or `None` once keys are loaded.
    pub fn problem(&self) -> Option<String> {
        self.problem
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(|problem| format!("the API server's service-account keys: {problem}"))
    }

    /// Resolves once keys are loaded.
    pub async fn loaded(&self) {
        let mut current = self.current.subscribe();
        let _ = current.wait_for(Option::is_some).await;
    }

    /// Takes the outcome of a fetch: new keys replace the old; a failure
    /// keeps them, and is a readiness problem only while there are none.
    fn settle(&self, fetched: Result<IssuerKeys, DiscoveryError>) {
        let mut problem = self.problem.lock().unwrap_or_else(PoisonError::into_inner);
        match fetched {
            Ok(keys) => {
                let changed = self.current.borrow().as_ref().is_none_or(|old| {
                    old.policy != keys.policy || !old.keys.same_names(&keys.keys)
                });
                if changed {
                    tracing::info!(issuer = %keys.policy.issuer, keys = ?keys.keys, "service-account token keys loaded");
                }
                self.current.send_replace(Some(Arc::new(keys)));
                *problem = None;
            }
            Err(error) => {
                let reason = ErrorChain(&error).to_string();
                if self.current.borrow().is_some() {
                    tracing::warn!(error = %reason, "fetching the service-account token keys failed; keeping the last ones");
                } else {
                    if problem.as_deref() != Some(reason.as_str()) {
                        tracing::error!(error = %reason, "no service-account token keys; not ready until they are fetched");
                    }
                    *problem = Some(reason);
                }
            }
        }
    }
}

/// When and how the last fetch went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LastFetch {
    /// When it ended.
    pub at: Instant,
    /// Whether it brought keys.
    pub succeeded: bool,
}

/// How long to wait before the next fetch, at `now`: at once the first
/// time; 5 minutes after a success and 5 s after a failure; when a token
/// named an unknown key, no later than 10 s after the last fetch.
pub fn wait_before_fetch(last: Option<LastFetch>, unknown_key: bool, now: Instant) -> Duration {
    let Some(last) = last else {
        return Duration::ZERO;
    };
    let mut after = if last.succeeded {
        REFRESH_INTERVAL
    } else {
        RETRY_INTERVAL
    };
    if unknown_key {
        after = after.min(MIN_FETCH_INTERVAL);
    }
    (last.at + after).saturating_duration_since(now)
}

/// Fetches as [`wait_before_fetch`] says until `shutdown` resolves.
async fn refresh(
    client: kube::Client,
    audience: String,
    published: Arc<PublishedKeys>,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let mut last = None;
    let mut unknown_key = false;
    loop {
        let wait = wait_before_fetch(last, unknown_key, Instant::now());
        // Cancel safety: a `notified()` dropped after being woken passes
        // its wake-up on, so a request for a fetch is not lost; a sleep
        // dropped early is taken again with the new wait.
        tokio::select! {
            () = &mut shutdown => return,
            () = published.unknown_key.notified(), if !unknown_key => {
                unknown_key = true;
                continue;
            }
            () = tokio::time::sleep(wait) => {}
        }
        let fetched = tokio::time::timeout(FETCH_TIMEOUT, fetch(&client, &audience))
            .await
            .unwrap_or(Err(DiscoveryError::TimedOut));
        last = Some(LastFetch {
            at: Instant::now(),
            succeeded: fetched.is_ok(),
        });
        unknown_key = false;
        published.settle(fetched);
    }
}

/// The discovery document and the keys, from the API server.
async fn fetch(client: &kube::Client, audience: &str) -> Result<IssuerKeys, DiscoveryError> {
    let discovery = get(client, DISCOVERY_PATH).await?;
    let jwks = get(client, JWKS_PATH).await?;
    IssuerKeys::parse(discovery.as_bytes(), jwks.as_bytes(), audience)
}

async fn get(client: &kube::Client, path: &'static str) -> Result<String, DiscoveryError> {
    let failed = |detail: String| DiscoveryError::Fetch { path, detail };
    let request = hyper::Request::get(path)
        .body(Vec::new())
        .map_err(|error| failed(error.to_string()))?;
    client
        .request_text(request)
        .await
        .map_err(|error| failed(ErrorChain(&error).to_string()))
}

/// Why the keys could not be fetched.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// A GET failed: the API server is unreachable, refused the control
    /// plane (RBAC), or publishes no discovery (its issuer is not an
    /// `https` URL).
    #[error("GET {path}: {detail}")]
    Fetch {
        /// What was asked for.
        path: &'static str,
        /// The client's error.
        detail: String,
    },
    /// The two GETs took longer than 10 s.
    #[error("fetching the keys timed out")]
    TimedOut,
    /// The discovery document names no issuer.
    #[error("the discovery document is malformed: {0}")]
    Document(String),
    /// The JWKS holds no usable key.
    #[error("the published keys")]
    Keys(#[from] TokenKeysError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fetches_are_spaced_by_what_the_last_one_did_and_what_tokens_asked() {
        let now = Instant::now();
        let ended = |ago: u64, succeeded| {
            Some(LastFetch {
                at: now - Duration::from_secs(ago),
                succeeded,
            })
        };
        let secs = Duration::from_secs;
        let cases = [
            ("never fetched", None, false, Duration::ZERO),
            ("never fetched, unknown key", None, true, Duration::ZERO),
            ("fetched 1 s ago", ended(1, true), false, secs(299)),
            ("failed 1 s ago", ended(1, false), false, secs(4)),
            ("failed 9 s ago", ended(9, false), false, Duration::ZERO),
            (
                "unknown key 1 s after a fetch",
                ended(1, true),
                true,
                secs(9),
            ),
            (
                "unknown key 30 s after a fetch",
                ended(30, true),
                true,
                Duration::ZERO,
            ),
            (
                "unknown key 1 s after a failure",
                ended(1, false),
                true,
                secs(4),
            ),
            ("refresh overdue", ended(400, true), false, Duration::ZERO),
        ];
        for (reason, last, unknown_key, expected) in cases {
            assert_eq!(
                wait_before_fetch(last, unknown_key, now),
                expected,
                "{reason}"
            );
        }
    }

    #[test]
    fn the_issuer_comes_from_discovery_and_the_keys_from_the_jwks() {
        let signer = super::super::token::TokenSigner::generate().unwrap();
        let jwks = signer.jwks_json();
        let discovery =
            br#"{"issuer":"https://issuer.example","jwks_uri":"https://elsewhere.example/keys"}"#;
        let parsed = IssuerKeys::parse(discovery, jwks.as_bytes(), "istio-ca").unwrap();
        assert_eq!(parsed.policy.issuer, "https://issuer.example");
        assert_eq!(parsed.policy.audience, "istio-ca");
        assert!(parsed.keys.names(signer.kid()));

        let refused: [(&str, &[u8], &[u8]); 4] = [
            ("discovery is not JSON", b"<html>", jwks.as_bytes()),
            ("no issuer", br#"{"jwks_uri":"x"}"#, jwks.as_bytes()),
            ("empty issuer", br#"{"issuer":""}"#, jwks.as_bytes()),
            ("no keys", discovery, br#"{"keys":[]}"#),
        ];
        for (reason, discovery, jwks) in refused {
            assert!(
                IssuerKeys::parse(discovery, jwks, "istio-ca").is_err(),
                "{reason}"
            );
        }
    }
}
