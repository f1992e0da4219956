//! How callers' service-account tokens are checked: against local keys
//! (`--token-keys`, else the state directory's token key) for a required
//! issuer and audience, or on Kubernetes against the issuer and keys the
//! API server publishes and then by its TokenReview, for the same
//! audience. Checking a token is `ca::authenticator`'s business.

use std::path::PathBuf;
use std::sync::Arc;

use ztunnel_control_plane::ca::authenticator::{Authenticator, TokenReviewer};
use ztunnel_control_plane::ca::authn::{
    DEFAULT_AUDIENCE, DEFAULT_ISSUER, DEFAULT_LEEWAY, TokenPolicy,
};
use ztunnel_control_plane::ca::metrics::CaMetrics;
use ztunnel_control_plane::ca::published_keys::PublishedKeys;
use ztunnel_control_plane::ca::state_dir::{StateDir, StateDirError};
use ztunnel_control_plane::ca::token_keys::TokenKeys;

/// The flags, flattened into `serve`'s command line.
#[derive(Debug, clap::Args)]
pub(crate) struct AuthenticationArgs {
    /// Token verification keys: a JWKS JSON file or PEM public keys (RS256,
    /// ES256). Default: the state directory's local token key.
    #[arg(long)]
    token_keys: Option<PathBuf>,
    /// Required token issuer (`iss`) of the file source; on Kubernetes the
    /// issuer is the one the API server publishes.
    #[arg(long, default_value = DEFAULT_ISSUER)]
    token_issuer: String,
    /// Required token audience (one of `aud`).
    #[arg(long, default_value = DEFAULT_AUDIENCE)]
    audience: String,
}

impl AuthenticationArgs {
    /// Checks tokens against the keys of `--token-keys`, or without it
    /// against the local token key of the state directory `state` opens.
    pub(crate) fn local_keys(
        &self,
        state: impl FnOnce() -> Result<StateDir, StateDirError>,
    ) -> anyhow::Result<Authenticator> {
        let keys = match &self.token_keys {
            Some(path) => TokenKeys::load(path)?,
            None => state()?.token_signer()?.verifying_keys()?,
        };
        Ok(Authenticator::Keys {
            keys,
            policy: TokenPolicy {
                issuer: self.token_issuer.clone(),
                audience: self.audience.clone(),
                leeway: DEFAULT_LEEWAY,
            },
        })
    }

    /// Checks tokens for `--audience` against the keys the API server
    /// publishes (fetched until `shutdown`), then by its TokenReview; the
    /// keys too, for readiness.
    pub(crate) fn token_review(
        &self,
        client: kube::Client,
        metrics: Arc<CaMetrics>,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> (Authenticator, Arc<PublishedKeys>) {
        let keys = PublishedKeys::start(client.clone(), &self.audience, shutdown);
        let reviewer = TokenReviewer::new(client, Arc::clone(&keys), metrics);
        (Authenticator::TokenReview(reviewer), keys)
    }
}
