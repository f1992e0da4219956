//! What this build is, in the shape istio/ztunnel reports it: the text of
//! `ztunnel --version`, the `version` key of `/config_dump`, and the Istio
//! version `istio_build` is tagged with. The Istio release the proxy
//! stands in for is configuration (`ISTIO_META_ISTIO_VERSION`, read in
//! `config.rs`); the rest is fixed when the binary is built.

use std::fmt;

use serde::Serialize;

/// The git commit the binary was built from, when the build passed it in
/// (`ZTUNNEL_BUILD_GIT_REVISION`).
const GIT_REVISION: &str = match option_env!("ZTUNNEL_BUILD_GIT_REVISION") {
    Some(revision) => revision,
    None => "unknown",
};

/// `Clean` or `Modified` when the build passed it in (`ZTUNNEL_BUILD_STATUS`).
const BUILD_STATUS: &str = match option_env!("ZTUNNEL_BUILD_STATUS") {
    Some(status) => status,
    None => "unknown",
};

/// The one TLS crypto provider (ARCHITECTURE.md).
const CRYPTO_PROVIDER: &str = "aws-lc";

/// The build's facts, serialised with Istio's camelCase keys.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BuildInfo {
    /// This proxy's own version.
    pub version: &'static str,
    /// The commit, or `unknown`.
    pub git_revision: &'static str,
    /// The compiler's version.
    pub rust_version: &'static str,
    /// The cargo profile (`release`, `debug`).
    pub build_profile: &'static str,
    /// Whether the tree was clean, or `unknown`.
    pub build_status: &'static str,
    /// The Istio release this proxy serves as ztunnel of: what istioctl
    /// and dashboards compare with the control plane's.
    pub istio_version: String,
    /// The TLS crypto provider.
    pub crypto_provider: &'static str,
}

impl BuildInfo {
    /// This build, serving as ztunnel of Istio `istio_version`.
    pub fn new(istio_version: &str) -> BuildInfo {
        BuildInfo {
            version: env!("CARGO_PKG_VERSION"),
            git_revision: GIT_REVISION,
            rust_version: env!("ZTUNNEL_RUST_VERSION"),
            build_profile: env!("ZTUNNEL_BUILD_PROFILE"),
            build_status: BUILD_STATUS,
            istio_version: istio_version.to_owned(),
            crypto_provider: CRYPTO_PROVIDER,
        }
    }
}

/// Go's `%#v`-like form Istio's components print for `version`.
impl fmt::Display for BuildInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "version.BuildInfo{{Version:\"{}\", GitRevision:\"{}\", RustVersion:\"{}\", \
             BuildProfile:\"{}\", BuildStatus:\"{}\", IstioVersion:\"{}\", CryptoProvider:\"{}\"}}",
            self.version,
            self.git_revision,
            self.rust_version,
            self.build_profile,
            self.build_status,
            self.istio_version,
            self.crypto_provider,
        )
    }
}
