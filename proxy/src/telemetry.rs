//! Log set-up: a `RUST_LOG`-style filter, text or JSON lines (`LOG_FORMAT`),
//! and a [`LogHandle`] that changes the filter at run time (admin
//! `/logging`). The values come from the config module; this one never
//! reads the environment. What is logged per connection is access_log.rs.

use tracing::Dispatch;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry, reload};

use crate::config::LogFormat;

/// Errors of log set-up and filter changes.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The filter is not a valid `RUST_LOG` directive list.
    #[error("invalid log filter {filter:?}")]
    InvalidFilter {
        /// The filter as given.
        filter: String,
        /// What the parser found wrong.
        source: tracing_subscriber::filter::ParseError,
    },
    /// A global subscriber was already installed (a second `init`).
    #[error("a log subscriber is already installed")]
    AlreadyInstalled(#[from] tracing_subscriber::util::TryInitError),
    /// The subscriber holding the filter is gone.
    #[error("the log filter can no longer be changed")]
    Reload(#[from] reload::Error),
}

/// How to log, as parsed by the config module.
#[derive(Debug, Clone)]
pub struct LogOptions {
    /// `RUST_LOG`-style filter, e.g. `info,access=debug`.
    pub filter: String,
    /// Text or JSON.
    pub format: LogFormat,
}

/// Changes the running filter. Cheap to clone.
#[derive(Debug, Clone)]
pub struct LogHandle {
    reload: reload::Handle<EnvFilter, Registry>,
}

impl LogHandle {
    /// Replaces the filter; returns it as now in force.
    pub fn set_filter(&self, filter: &str) -> Result<String, TelemetryError> {
        let parsed = parse_filter(filter)?;
        self.reload.reload(parsed)?;
        self.current()
    }

    /// The filter in force.
    pub fn current(&self) -> Result<String, TelemetryError> {
        Ok(self.reload.with_current(ToString::to_string)?)
    }
}

fn parse_filter(filter: &str) -> Result<EnvFilter, TelemetryError> {
    EnvFilter::builder()
        .parse(filter)
        .map_err(|source| TelemetryError::InvalidFilter {
            filter: filter.to_owned(),
            source,
        })
}

/// Installs the process-wide subscriber, writing to stdout.
pub fn init(options: &LogOptions) -> Result<LogHandle, TelemetryError> {
    let (dispatch, handle) = subscriber(options, std::io::stdout)?;
    dispatch.try_init()?;
    Ok(handle)
}

/// Builds a subscriber writing to `writer` without installing it; `init`
/// uses it with stdout, tests with a buffer (and `with_default`).
pub fn subscriber<W>(
    options: &LogOptions,
    writer: W,
) -> Result<(Dispatch, LogHandle), TelemetryError>
where
    W: for<'writer> MakeWriter<'writer> + Send + Sync + 'static,
{
    let (filter, reload) = reload::Layer::new(parse_filter(&options.filter)?);
    let registry = tracing_subscriber::registry().with(filter);
    let lines = match options.format {
        // No colour codes: the lines go to container logs, not a terminal.
        LogFormat::Plain => tracing_subscriber::fmt::layer()
            .with_ansi(false)
            .with_writer(writer)
            .boxed(),
        // Fields at the top level, so `src.addr` is a key of the line.
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .with_writer(writer)
            .boxed(),
    };
    let dispatch = Dispatch::new(registry.with(lines));
    Ok((dispatch, LogHandle { reload }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(filter: &str) -> LogOptions {
        LogOptions {
            filter: filter.to_owned(),
            format: LogFormat::Plain,
        }
    }

    #[test]
    fn the_filter_can_be_changed_and_read_back() {
        let (_dispatch, handle) = subscriber(&options("info"), std::io::sink).unwrap();
        assert_eq!(handle.current().unwrap(), "info");
        assert_eq!(
            handle.set_filter("access=debug,warn").unwrap(),
            "access=debug,warn"
        );
        assert_eq!(handle.current().unwrap(), "access=debug,warn");
    }

    #[test]
    fn a_bad_filter_is_refused_and_the_old_one_stays() {
        let (_dispatch, handle) = subscriber(&options("info"), std::io::sink).unwrap();
        let error = handle.set_filter("access=loud").unwrap_err();
        assert!(
            matches!(error, TelemetryError::InvalidFilter { .. }),
            "{error}"
        );
        assert_eq!(handle.current().unwrap(), "info");
        assert!(subscriber(&options("[[["), std::io::sink).is_err());
    }
}
