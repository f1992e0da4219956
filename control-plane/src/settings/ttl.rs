//! How long workload certificates live: the lifetime when a request asks
//! for none, and the longest one may ask for. Applying them to a request is
//! `TtlPolicy`'s business.

use std::time::Duration;

use ztunnel_certs::issuer::TtlPolicy;

use super::parse_duration;

/// The flags, flattened into `serve`'s command line.
#[derive(Debug, clap::Args)]
pub(crate) struct TtlArgs {
    /// Lifetime of a workload certificate when the request asks for none.
    #[arg(long, default_value = "24h", value_parser = parse_duration)]
    default_ttl: Duration,
    /// Longest lifetime a request may ask for; longer is InvalidArgument.
    #[arg(long, default_value = "90d", value_parser = parse_duration)]
    max_ttl: Duration,
}

impl TtlArgs {
    /// The lifetimes, as the CA applies them.
    pub(crate) fn policy(&self) -> TtlPolicy {
        TtlPolicy::new(self.default_ttl, self.max_ttl)
    }
}
