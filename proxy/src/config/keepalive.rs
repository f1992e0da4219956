//! The data plane's TCP keepalive settings, under Istio's names and with
//! its defaults (AMBIENT.md §8.1). Applying them is `socket.rs`'s business.

use std::time::Duration;

use clap::ArgAction;

use super::{ConfigError, ValueError, parse_duration};
use crate::socket::Keepalive;

/// The longest idle time and probe interval Linux takes, in seconds
/// (`MAX_TCP_KEEPIDLE`, `MAX_TCP_KEEPINTVL`): a longer one would fail every
/// socket's set-up, so it fails start-up instead.
const MAX_KEEPALIVE_SECONDS: u64 = 32_767;

/// The most probes Linux takes (`MAX_TCP_KEEPCNT`).
const MAX_KEEPALIVE_RETRIES: u32 = 127;

/// The flags and variables, flattened into the command line.
#[derive(Debug, clap::Args)]
pub(super) struct KeepaliveArgs {
    /// TCP keepalive probes on every data-plane connection.
    #[arg(long, env = "KEEPALIVE_ENABLED", default_value_t = true, action = ArgAction::Set)]
    keepalive_enabled: bool,
    /// Idle time before the first keepalive probe (1s to 32767s).
    #[arg(long, env = "KEEPALIVE_TIME", default_value = "180s")]
    keepalive_time: String,
    /// Time between unanswered keepalive probes (1s to 32767s).
    #[arg(long, env = "KEEPALIVE_INTERVAL", default_value = "180s")]
    keepalive_interval: String,
    /// Unanswered keepalive probes before the connection is dropped (1 to 127).
    #[arg(long, env = "KEEPALIVE_RETRIES", default_value_t = 9)]
    keepalive_retries: u32,
    /// TCP_USER_TIMEOUT of time + retries × interval: data unacknowledged
    /// that long drops the connection.
    #[arg(long, env = "USER_TIMEOUT_ENABLED", default_value_t = false, action = ArgAction::Set)]
    user_timeout_enabled: bool,
}

impl KeepaliveArgs {
    pub(super) fn parse(&self) -> Result<Keepalive, ConfigError> {
        let seconds = |name: &'static str, text: &str| {
            let value = |source| ConfigError::Value { name, source };
            let duration = parse_duration(text).map_err(value)?;
            // The kernel counts whole seconds, and refuses 0.
            let whole = Duration::from_secs(duration.as_secs());
            if whole != duration || !(1..=MAX_KEEPALIVE_SECONDS).contains(&duration.as_secs()) {
                return Err(value(ValueError::Range(text.to_owned(), "1s to 32767s")));
            }
            Ok(duration)
        };
        if !(1..=MAX_KEEPALIVE_RETRIES).contains(&self.keepalive_retries) {
            return Err(ConfigError::Value {
                name: "KEEPALIVE_RETRIES",
                source: ValueError::Range(self.keepalive_retries.to_string(), "1 to 127"),
            });
        }
        Ok(Keepalive {
            enabled: self.keepalive_enabled,
            time: seconds("KEEPALIVE_TIME", &self.keepalive_time)?,
            interval: seconds("KEEPALIVE_INTERVAL", &self.keepalive_interval)?,
            retries: self.keepalive_retries,
            user_timeout: self.user_timeout_enabled,
        })
    }
}
