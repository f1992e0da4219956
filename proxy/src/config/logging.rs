//! How the proxy logs: the filter and the line format. Setting up the
//! subscriber and changing the filter at run time are `telemetry.rs`'s
//! business.

use clap::ValueEnum;

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Plain,
    /// One JSON object a line.
    Json,
}

/// The flags and variables, flattened into the command line. Both are
/// taken as given: clap parses the format.
#[derive(Debug, clap::Args)]
pub(super) struct LoggingArgs {
    /// Log filter, e.g. `info,access=debug`.
    #[arg(long, env = "RUST_LOG", default_value = "info")]
    pub(super) log: String,
    /// Log format.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value = "plain")]
    pub(super) log_format: LogFormat,
}
