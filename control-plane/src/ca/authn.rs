//! Authentication of CA callers: the `authorization: Bearer <JWT>` header,
//! the token's signature, `iss`, `aud`, `exp` and `nbf`, and the pod the
//! token is bound to (the `kubernetes.io` claim of a projected
//! service-account token). The result is a typed [`Caller`].
//!
//! A TokenReview's answer is read the same way (`review.rs`): the pod comes
//! from what the API server says, never from the request.
//!
//! On Kubernetes the same checks run before any TokenReview, against the
//! keys and issuer the API server publishes ([`Caller::from_published_token`]),
//! with one more: the token's `kid` must name one of those keys. Junk is
//! refused here at the cost of a parse and at most one signature check;
//! the review is left to confirm what only the API server knows (that the
//! pod or secret the token is bound to still exists).
//!
//! Pure: time comes in as `now`, keys as [`TokenKeys`]. What the caller may
//! be issued is `authz.rs`'s business. The token itself is never logged and
//! never appears in an error.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, Header, Validation};
use serde::Deserialize;

use super::token_keys::TokenKeys;

/// Largest token accepted, in bytes. Kubernetes tokens are about 1 KiB;
/// 16 KiB bounds the JSON we parse for an unauthenticated caller.
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// Kubernetes' default service-account token issuer.
pub const DEFAULT_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

/// The audience istiod and ztunnel use for CA tokens (WIRE.md §3).
pub const DEFAULT_AUDIENCE: &str = "istio-ca";

/// Clock skew tolerated on `exp` and `nbf`.
pub const DEFAULT_LEEWAY: Duration = Duration::from_secs(60);

/// What a token must say to be accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenPolicy {
    /// Required `iss`.
    pub issuer: String,
    /// Required member of `aud`.
    pub audience: String,
    /// Clock skew tolerated on `exp` and `nbf`.
    pub leeway: Duration,
}

impl Default for TokenPolicy {
    fn default() -> Self {
        TokenPolicy {
            issuer: DEFAULT_ISSUER.to_owned(),
            audience: DEFAULT_AUDIENCE.to_owned(),
            leeway: DEFAULT_LEEWAY,
        }
    }
}

/// An authenticated caller: the pod a verified token is bound to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// Pod namespace.
    pub namespace: String,
    /// Pod service account.
    pub service_account: String,
    /// Pod name.
    pub pod_name: String,
    /// Pod UID, which must match the registry for impersonation.
    pub pod_uid: String,
    /// The node claim, present in tokens from Kubernetes 1.30 on.
    pub node_name: Option<String>,
    /// When the token stops being accepted (`exp` plus the leeway); `None`
    /// when it carries no `exp` the control plane could read. A stream
    /// admitted on the token ends then.
    pub expires: Option<SystemTime>,
}

impl Caller {
    /// Verifies a token and extracts the pod it is bound to.
    pub fn from_token(
        token: &[u8],
        keys: &TokenKeys,
        policy: &TokenPolicy,
        now: SystemTime,
    ) -> Result<Caller, AuthnError> {
        let header = header(token)?;
        verify(token, &header, keys, policy, now)
    }

    /// Verifies a token against the keys an issuer publishes (a JWKS whose
    /// keys are named): as [`Caller::from_token`], and first its `kid` must
    /// name one of them. A token naming no published key is refused
    /// without trying any, so that the caller can tell a key it should
    /// fetch again from a forged signature.
    pub fn from_published_token(
        token: &[u8],
        keys: &TokenKeys,
        policy: &TokenPolicy,
        now: SystemTime,
    ) -> Result<Caller, AuthnError> {
        let header = header(token)?;
        if !header.kid.as_deref().is_some_and(|kid| keys.names(kid)) {
            return Err(AuthnError::UnknownKeyId);
        }
        verify(token, &header, keys, policy, now)
    }
}

/// The header of a token no longer than [`MAX_TOKEN_BYTES`], read before
/// anything is verified.
fn header(token: &[u8]) -> Result<Header, AuthnError> {
    if token.len() > MAX_TOKEN_BYTES {
        return Err(AuthnError::TokenTooLarge);
    }
    jsonwebtoken::decode_header(token).map_err(|_| AuthnError::Malformed)
}

/// Verifies `token`'s signature with a key of `keys` for its `header`, then
/// its claims against `policy` at `now`.
fn verify(
    token: &[u8],
    header: &Header,
    keys: &TokenKeys,
    policy: &TokenPolicy,
    now: SystemTime,
) -> Result<Caller, AuthnError> {
    if !matches!(header.alg, Algorithm::RS256 | Algorithm::ES256) {
        return Err(AuthnError::UnsupportedAlgorithm);
    }
    // Only the signature and the algorithm are left to jsonwebtoken; the
    // claims are checked below against the `now` we are given.
    let mut validation = Validation::new(header.alg);
    validation.validate_exp = false;
    validation.validate_nbf = false;
    validation.validate_aud = false;
    validation.required_spec_claims.clear();

    let candidates = keys.candidates(header.kid.as_deref());
    for key in candidates.filter(|key| key.algorithm == header.alg) {
        match jsonwebtoken::decode::<TokenClaims>(token, &key.key, &validation) {
            Ok(data) => return check_claims(data.claims, policy, now),
            Err(error) => match error.kind() {
                // This key is not the one; try the next.
                ErrorKind::InvalidSignature
                | ErrorKind::InvalidAlgorithm
                | ErrorKind::InvalidEcdsaKey
                | ErrorKind::InvalidRsaKey(_)
                | ErrorKind::InvalidKeyFormat => continue,
                // The header was parsed already, so JSON errors are the
                // signed claims'.
                ErrorKind::Json(_) => return Err(AuthnError::MalformedClaims),
                _ => return Err(AuthnError::Malformed),
            },
        }
    }
    Err(AuthnError::BadSignature)
}

/// Why a caller was not authenticated. Each variant is a denial reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthnError {
    /// No `authorization` header.
    #[error("no authorization header")]
    MissingToken,
    /// The header is not `Bearer <token>`.
    #[error("authorization header is not a Bearer token")]
    NotBearer,
    /// The token is longer than [`MAX_TOKEN_BYTES`].
    #[error("token is longer than {MAX_TOKEN_BYTES} bytes")]
    TokenTooLarge,
    /// The token is not a well-formed JWS.
    #[error("token is not a well-formed JWT")]
    Malformed,
    /// The header names an algorithm other than RS256 or ES256.
    #[error("token algorithm is not RS256 or ES256")]
    UnsupportedAlgorithm,
    /// No configured key verifies the signature.
    #[error("token signature does not verify with any configured key")]
    BadSignature,
    /// The header's `kid` is missing or names no key the issuer publishes.
    #[error("token names no key the issuer publishes")]
    UnknownKeyId,
    /// The signed claims are not the JSON of a service-account token.
    #[error("token claims are malformed")]
    MalformedClaims,
    /// `iss` is missing or not the configured issuer.
    #[error("token issuer is not the configured one")]
    WrongIssuer,
    /// `aud` does not contain the configured audience.
    #[error("token audience does not include the configured one")]
    WrongAudience,
    /// `exp` is in the past, beyond the leeway.
    #[error("token has expired")]
    Expired,
    /// `nbf` is in the future, beyond the leeway.
    #[error("token is not valid yet")]
    NotYetValid,
    /// The token carries no pod (it is not a pod-bound projected token).
    #[error("token is not bound to a pod")]
    NotPodBound,
    /// `sub` disagrees with the namespace and service account claims.
    #[error("token subject disagrees with its kubernetes.io claim")]
    SubjectMismatch,
    /// The API server's TokenReview did not authenticate the token (bad
    /// signature, wrong audience, expired, or bound to a deleted pod).
    #[error("the API server did not authenticate the token")]
    ReviewRejected,
    /// The reviewed token belongs to a user, not a service account.
    #[error("token does not belong to a service account")]
    NotServiceAccount,
    /// The TokenReview could not be made (API server unreachable, or the
    /// control plane may not create token reviews).
    #[error("token review failed: {0}")]
    ReviewUnavailable(String),
    /// Every TokenReview slot stayed taken for as long as a caller waits
    /// for one.
    #[error("too many token reviews in flight")]
    ReviewBusy,
    /// The API server's published keys have not been fetched, so no token
    /// can be checked (the control plane is unready meanwhile).
    #[error("the service-account issuer's keys are not loaded")]
    KeysUnavailable,
}

impl AuthnError {
    /// A short stable name for metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            AuthnError::MissingToken => "missing_token",
            AuthnError::NotBearer => "not_bearer",
            AuthnError::TokenTooLarge => "token_too_large",
            AuthnError::Malformed => "malformed_token",
            AuthnError::UnsupportedAlgorithm => "unsupported_algorithm",
            AuthnError::BadSignature => "bad_signature",
            AuthnError::UnknownKeyId => "unknown_key_id",
            AuthnError::MalformedClaims => "malformed_claims",
            AuthnError::WrongIssuer => "wrong_issuer",
            AuthnError::WrongAudience => "wrong_audience",
            AuthnError::Expired => "expired_token",
            AuthnError::NotYetValid => "token_not_yet_valid",
            AuthnError::NotPodBound => "token_not_pod_bound",
            AuthnError::SubjectMismatch => "subject_mismatch",
            AuthnError::ReviewRejected => "token_review_rejected",
            AuthnError::NotServiceAccount => "not_service_account",
            AuthnError::ReviewUnavailable(_) => "token_review_unavailable",
            AuthnError::ReviewBusy => "token_review_busy",
            AuthnError::KeysUnavailable => "token_keys_unavailable",
        }
    }
}

/// Signed claims, as far as we read them. Unknown fields are ignored:
/// Kubernetes adds new ones (e.g. `warnafter`) over time.
#[derive(Deserialize)]
struct TokenClaims {
    iss: Option<String>,
    sub: Option<String>,
    #[serde(default)]
    aud: Audience,
    exp: Option<i64>,
    nbf: Option<i64>,
    #[serde(rename = "kubernetes.io")]
    kubernetes: Option<KubernetesClaims>,
}

/// `aud` is a string or an array of strings (RFC 7519 §4.1.3).
#[derive(Deserialize, Default)]
#[serde(untagged)]
enum Audience {
    One(String),
    Many(Vec<String>),
    #[default]
    Absent,
}

#[derive(Deserialize)]
struct KubernetesClaims {
    namespace: String,
    serviceaccount: NameUid,
    pod: Option<NameUid>,
    node: Option<NameUid>,
}

#[derive(Deserialize)]
struct NameUid {
    name: String,
    #[serde(default)]
    uid: String,
}

/// The token of an `authorization` header value. Only `Bearer ` is accepted,
/// as istiod does on gRPC.
pub fn bearer_token(header: Option<&[u8]>) -> Result<&[u8], AuthnError> {
    let header = header.ok_or(AuthnError::MissingToken)?;
    let token = header
        .strip_prefix(b"Bearer ")
        .ok_or(AuthnError::NotBearer)?;
    if token.is_empty() {
        return Err(AuthnError::MissingToken);
    }
    if token.len() > MAX_TOKEN_BYTES {
        return Err(AuthnError::TokenTooLarge);
    }
    Ok(token)
}

/// Checks the registered claims and extracts the pod.
fn check_claims(
    claims: TokenClaims,
    policy: &TokenPolicy,
    now: SystemTime,
) -> Result<Caller, AuthnError> {
    if claims.iss.as_deref() != Some(policy.issuer.as_str()) {
        return Err(AuthnError::WrongIssuer);
    }
    let audience_ok = match &claims.aud {
        Audience::One(aud) => *aud == policy.audience,
        Audience::Many(auds) => auds.contains(&policy.audience),
        Audience::Absent => false,
    };
    if !audience_ok {
        return Err(AuthnError::WrongAudience);
    }
    let now = unix_seconds(now);
    let leeway = i64::try_from(policy.leeway.as_secs()).unwrap_or(i64::MAX);
    let exp = claims.exp.ok_or(AuthnError::MalformedClaims)?;
    let expires = unix_time(exp.saturating_add(leeway));
    if now > exp.saturating_add(leeway) {
        return Err(AuthnError::Expired);
    }
    if claims
        .nbf
        .is_some_and(|nbf| nbf > now.saturating_add(leeway))
    {
        return Err(AuthnError::NotYetValid);
    }

    let kubernetes = claims.kubernetes.ok_or(AuthnError::NotPodBound)?;
    let pod = kubernetes.pod.ok_or(AuthnError::NotPodBound)?;
    let service_account = kubernetes.serviceaccount.name;
    if let Some(sub) = &claims.sub {
        let expected = format!(
            "system:serviceaccount:{}:{service_account}",
            kubernetes.namespace
        );
        if *sub != expected {
            return Err(AuthnError::SubjectMismatch);
        }
    }
    let node_name = kubernetes.node.map(|node| node.name);
    let required = [&kubernetes.namespace, &service_account, &pod.name, &pod.uid];
    if required.iter().any(|part| part.is_empty())
        || node_name.as_ref().is_some_and(String::is_empty)
    {
        return Err(AuthnError::MalformedClaims);
    }
    Ok(Caller {
        namespace: kubernetes.namespace,
        service_account,
        pod_name: pod.name,
        pod_uid: pod.uid,
        node_name,
        expires: Some(expires),
    })
}

/// The time `seconds` after the epoch (the epoch itself for earlier ones).
fn unix_time(seconds: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(u64::try_from(seconds).unwrap_or(0))
}

/// The `exp` of a token whose signature someone else checked (the API
/// server, for a TokenReview), read without verifying it; `None` when the
/// token has no readable `exp`.
pub fn unverified_expiry(token: &[u8]) -> Option<SystemTime> {
    #[derive(Deserialize)]
    struct Expiry {
        exp: Option<i64>,
    }
    let data = jsonwebtoken::dangerous::insecure_decode::<Expiry>(token).ok()?;
    data.claims.exp.map(unix_time)
}

/// Seconds since the epoch, negative before it.
fn unix_seconds(now: SystemTime) -> i64 {
    match now.duration_since(UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_secs()).unwrap_or(i64::MAX),
        Err(before) => i64::try_from(before.duration().as_secs()).map_or(i64::MIN, |s| -s),
    }
}

mod review;

#[cfg(test)]
mod tests;
