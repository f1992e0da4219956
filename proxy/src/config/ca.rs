//! The CA client's settings: where the CA is, the root its certificate must
//! chain to, a second name it may carry, and the token and headers sent
//! with each call; beside them, the revocation lists peers' certificates
//! are checked against. Asking the CA is `identity/ca_client.rs`'s
//! business. The lifetime it asks for (`SECRET_TTL`) is a field of the
//! command line itself, where `--help` lists it.

use std::path::PathBuf;

use super::ConfigError;
use super::xds::{self, root_source, token_source};
use crate::control_plane::{ExtraHeaders, RootSource, TokenSource};

/// Variables named `CA_HEADER_<NAME>` add the header `<NAME>` to CA calls.
const CA_HEADER_PREFIX: &str = "CA_HEADER_";

/// This group's part of the [`Config`](super::Config): its fields of the
/// same names.
pub(super) struct Ca {
    pub ca_address: String,
    pub ca_root_ca: RootSource,
    pub ca_alt_hostname: Option<String>,
    pub crl_path: Option<PathBuf>,
    pub ca_headers: ExtraHeaders,
    pub auth_token: TokenSource,
}

/// The flags and variables, flattened into the command line.
#[derive(Debug, clap::Args)]
pub(super) struct CaArgs {
    /// CA address (TLS).
    #[arg(
        long,
        env = "CA_ADDRESS",
        default_value = xds::DEFAULT_XDS_ADDRESS
    )]
    ca_address: String,
    /// The roots the CA's certificate must chain to: a PEM file, the PEM
    /// itself, or SYSTEM for the operating system's roots.
    #[arg(
        long,
        env = "CA_ROOT_CA",
        default_value = xds::DEFAULT_ROOT_CA
    )]
    ca_root_ca: String,
    /// A second name the CA's certificate may carry besides the host of
    /// CA_ADDRESS. Headers for every CA call are set as CA_HEADER_<NAME>.
    #[arg(long, env = "ALT_CA_HOSTNAME")]
    alt_ca_hostname: Option<String>,
    /// Certificate revocation lists (PEM or DER): a peer whose certificate
    /// or intermediate they revoke is refused; read again when it changes.
    #[arg(long, env = "CRL_PATH")]
    crl_path: Option<PathBuf>,
    /// The Bearer token for the CA and xDS: a service-account token file,
    /// else the token itself [default: ./var/run/secrets/tokens/istio-token
    /// when it exists, else none].
    #[arg(long, env = "AUTH_TOKEN")]
    auth_token: Option<String>,
}

impl CaArgs {
    /// `AUTH_TOKEN` as given: the xDS client reads it too, in its own way.
    pub(super) fn auth_token(&self) -> Option<&str> {
        self.auth_token.as_deref()
    }

    /// The settings; `env` supplies the `CA_HEADER_*` variables. An empty
    /// name, path or token counts as unset. The root and the token are
    /// read as for xDS (`config/xds.rs`): a path that exists is a file.
    pub(super) fn parse(self, env: &[(String, String)]) -> Result<Ca, ConfigError> {
        let ca_headers =
            ExtraHeaders::parse(xds::prefixed(env, CA_HEADER_PREFIX), CA_HEADER_PREFIX).map_err(
                |source| ConfigError::ControlPlane {
                    name: "CA_HEADER_*",
                    source,
                },
            )?;
        Ok(Ca {
            ca_address: self.ca_address,
            ca_root_ca: root_source(&self.ca_root_ca),
            ca_alt_hostname: self.alt_ca_hostname.filter(|name| !name.is_empty()),
            crl_path: self.crl_path.filter(|path| !path.as_os_str().is_empty()),
            ca_headers,
            auth_token: token_source(self.auth_token.as_deref()),
        })
    }
}
