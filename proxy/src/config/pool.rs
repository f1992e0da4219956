//! The HBONE connection pool's limits: streams on one connection,
//! connections one destination spreads over, and how long an unused one is
//! kept. Pooling itself is `proxy/src/pool.rs`'s business; the HTTP/2
//! windows of those connections are `http2.rs`'s.

use std::time::Duration;

use super::{ConfigError, parse_duration};

/// Connection pool limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolSettings {
    /// Streams per h2 connection; the peer's own limit caps it further.
    pub max_streams_per_connection: u32,
    /// How long an unused connection is kept.
    pub unused_release_timeout: Duration,
    /// Connections one pool key may spread its streams over.
    pub max_connections_per_key: usize,
}

/// The flags and variables, flattened into the command line.
#[derive(Debug, clap::Args)]
pub(super) struct PoolArgs {
    /// Most streams on one pooled HBONE connection.
    #[arg(long, env = "POOL_MAX_STREAMS_PER_CONNECTION", default_value_t = 100)]
    pool_max_streams_per_connection: u32,
    /// How long an unused pooled connection is kept.
    #[arg(long, env = "POOL_UNUSED_RELEASE_TIMEOUT", default_value = "5m")]
    pool_unused_release_timeout: String,
    /// Connections one destination key may spread streams over.
    #[arg(long, env = "POOL_MAX_CONNECTIONS_PER_KEY", default_value_t = 4)]
    pool_max_connections_per_key: usize,
}

impl PoolArgs {
    /// The limits; a count of 0 is taken as 1.
    pub(super) fn parse(&self) -> Result<PoolSettings, ConfigError> {
        Ok(PoolSettings {
            max_streams_per_connection: self.pool_max_streams_per_connection.max(1),
            unused_release_timeout: parse_duration(&self.pool_unused_release_timeout)
                .map_err(ConfigError::value("POOL_UNUSED_RELEASE_TIMEOUT"))?,
            max_connections_per_key: self.pool_max_connections_per_key.max(1),
        })
    }
}
