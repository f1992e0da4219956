//! What the reviewer remembers of past TokenReviews, by the token's SHA-256
//! (never the token): an authenticated caller for 10 s, so that a ztunnel
//! asking for the certificates of every pod on its node costs one review;
//! a refusal for 5 s, so that the same junk token sent again costs a hash
//! and a lookup. A review that could not be made says nothing about the
//! token and is not remembered.
//!
//! Pure: time comes in as `now`. Sending the reviews is
//! `authenticator.rs`'s business.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use aws_lc_rs::digest;

use crate::ca::authn::{AuthnError, Caller};

/// How long an authenticated review is reused: short, as istiod's cache.
/// It cannot outlive a pod's deletion by much, and authorization re-checks
/// the caller's pod against the live mesh on every request anyway.
const AUTHENTICATED_FOR: Duration = Duration::from_secs(10);

/// How long a refusal is reused: long enough that a token sent in a loop
/// costs one review per period, short enough that a token refused while
/// its pod was being created is asked about again at the caller's retry.
const REFUSED_FOR: Duration = Duration::from_secs(5);

/// Most entries of each kind. A node's ztunnel uses one token, so this is
/// far more than the nodes of any cluster; past it that kind starts over
/// rather than grow. Refusals are kept apart so that a flood of refused
/// tokens cannot push out the callers who were authenticated.
const ENTRIES: usize = 4096;

/// SHA-256 of a token.
pub type TokenHash = [u8; 32];

/// The SHA-256 of `token`: the cache never holds the token itself.
pub fn token_hash(token: &[u8]) -> TokenHash {
    let digest = digest::digest(&digest::SHA256, token);
    // A SHA-256 digest is 32 bytes; the fallback is never taken.
    <TokenHash>::try_from(digest.as_ref()).unwrap_or_default()
}

/// Recent review answers.
#[derive(Default)]
pub struct ReviewCache {
    /// Token hash → the caller, and when the entry expires.
    authenticated: HashMap<TokenHash, (Caller, Instant)>,
    /// Token hash → why it was refused, and when the entry expires.
    refused: HashMap<TokenHash, (AuthnError, Instant)>,
}

impl ReviewCache {
    /// The remembered answer for `key` at `now`, if any.
    pub fn lookup(&self, key: &TokenHash, now: Instant) -> Option<Result<Caller, AuthnError>> {
        if let Some((caller, expires)) = self.authenticated.get(key)
            && *expires > now
        {
            return Some(Ok(caller.clone()));
        }
        self.refused
            .get(key)
            .filter(|(_, expires)| *expires > now)
            .map(|(error, _)| Err(error.clone()))
    }

    /// Remembers the answer of a review of `key` that ended at `now`, for
    /// as long as [`remembered_for`] says.
    pub fn remember(&mut self, key: TokenHash, answer: &Result<Caller, AuthnError>, now: Instant) {
        let Some(period) = remembered_for(answer) else {
            return;
        };
        let expires = now + period;
        match answer {
            Ok(caller) => insert(&mut self.authenticated, key, (caller.clone(), expires), now),
            Err(error) => insert(&mut self.refused, key, (error.clone(), expires), now),
        }
    }
}

/// How long a review's answer is remembered; `None` when the review could
/// not be made, which says nothing about the token.
pub fn remembered_for(answer: &Result<Caller, AuthnError>) -> Option<Duration> {
    match answer {
        Ok(_) => Some(AUTHENTICATED_FOR),
        Err(
            AuthnError::ReviewUnavailable(_) | AuthnError::ReviewBusy | AuthnError::KeysUnavailable,
        ) => None,
        Err(_) => Some(REFUSED_FOR),
    }
}

/// Inserts into one of the maps, first dropping what expired, and starting
/// over when it is full.
fn insert<T>(
    map: &mut HashMap<TokenHash, (T, Instant)>,
    key: TokenHash,
    entry: (T, Instant),
    now: Instant,
) {
    map.retain(|_, (_, expires)| *expires > now);
    if map.len() >= ENTRIES {
        map.clear();
    }
    map.insert(key, entry);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller() -> Caller {
        Caller {
            namespace: "istio-system".into(),
            service_account: "ztunnel".into(),
            pod_name: "ztunnel-a".into(),
            pod_uid: "uid".into(),
            node_name: None,
            expires: None,
        }
    }

    /// An answer, how many seconds after the review it is asked for
    /// again, and whether it is remembered then.
    type Row = (&'static str, Result<Caller, AuthnError>, u64, bool);

    #[test]
    fn answers_are_remembered_for_their_period_and_failed_reviews_not_at_all() {
        use AuthnError::*;
        let unavailable = ReviewUnavailable("timed out".into());
        let cases: Vec<Row> = vec![
            ("authenticated, asked again at once", Ok(caller()), 0, true),
            ("authenticated, 9 s on", Ok(caller()), 9, true),
            ("authenticated, 10 s on", Ok(caller()), 10, false),
            ("rejected, at once", Err(ReviewRejected), 0, true),
            ("rejected, 4 s on", Err(ReviewRejected), 4, true),
            ("rejected, 5 s on", Err(ReviewRejected), 5, false),
            ("a user's token", Err(NotServiceAccount), 0, true),
            ("a token bound to no pod", Err(NotPodBound), 0, true),
            ("the review failed", Err(unavailable), 0, false),
            ("no review slot", Err(ReviewBusy), 0, false),
            ("no keys", Err(KeysUnavailable), 0, false),
        ];
        let start = Instant::now();
        for (reason, answer, later, remembered) in cases {
            let mut cache = ReviewCache::default();
            let key = token_hash(reason.as_bytes());
            cache.remember(key, &answer, start);
            let expected = remembered.then(|| answer.clone());
            let asked = start + Duration::from_secs(later);
            assert_eq!(cache.lookup(&key, asked), expected, "{reason}");
            let other = token_hash(b"other");
            assert_eq!(cache.lookup(&other, start), None, "{reason}: another token");
        }
    }

    #[test]
    fn a_flood_of_refusals_does_not_push_out_authenticated_callers() {
        let now = Instant::now();
        let mut cache = ReviewCache::default();
        let honest = token_hash(b"honest");
        cache.remember(honest, &Ok(caller()), now);
        for index in 0..2 * ENTRIES {
            let junk = token_hash(&index.to_be_bytes());
            cache.remember(junk, &Err(AuthnError::ReviewRejected), now);
        }
        assert_eq!(cache.lookup(&honest, now), Some(Ok(caller())));
        assert!(cache.refused.len() <= ENTRIES);
    }
}
