//! Log set-up: a `RUST_LOG`-style filter, text or JSON lines (`LOG_FORMAT`),
//! and a [`LogHandle`] that changes the filter at run time (admin
//! `/logging`). The values come from the config module; this one never
//! reads the environment. What is logged per connection is access_log.rs.

use std::sync::Arc;

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
    /// A `/logging` level clause that is neither a level nor
    /// `<target>=<level>`.
    #[error("invalid level {0:?}")]
    InvalidLevel(String),
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

/// The levels a `/logging` clause may name, alone or after `<target>=`.
const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

/// Changes the running filter. Cheap to clone.
#[derive(Debug, Clone)]
pub struct LogHandle {
    reload: reload::Handle<EnvFilter, Registry>,
    /// The filter the process started with (`RUST_LOG`), which a reset
    /// goes back to.
    initial: Arc<str>,
}

impl LogHandle {
    /// `/logging`'s change, as istio/ztunnel makes it: `level` (a comma
    /// list of levels and `<target>=<level>` clauses) is laid over the
    /// current filter, or over the start-up filter when `reset`. Returns
    /// the filter now in force; a bad clause changes nothing.
    pub fn change(&self, reset: bool, level: &str) -> Result<String, TelemetryError> {
        check_levels(level)?;
        let base = if reset {
            self.initial.to_string()
        } else {
            self.current()?
        };
        self.set_filter(&lay_over(&base, level))
    }

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

/// Refuses any clause of `level` that is not one of [`LEVELS`] or
/// `<target>=<level>`: a bare target (which a `RUST_LOG` filter reads as
/// `trace`) is refused, as Istio refuses it.
fn check_levels(level: &str) -> Result<(), TelemetryError> {
    let valid = |clause: &str| match clause.split_once('=') {
        None => LEVELS.contains(&clause),
        Some((target, level)) => {
            !target.is_empty() && !target.contains(char::is_whitespace) && LEVELS.contains(&level)
        }
    };
    match level
        .split(',')
        .filter(|clause| !clause.is_empty())
        .find(|clause| !valid(clause))
    {
        Some(_) => Err(TelemetryError::InvalidLevel(level.to_owned())),
        None => Ok(()),
    }
}

/// `base` with each clause of `added` replacing the clause of `base` for
/// the same target (or the default level), and appended after the rest.
fn lay_over(base: &str, added: &str) -> String {
    let target = |clause: &str| {
        clause
            .split_once('=')
            .map_or("", |(target, _)| target)
            .to_owned()
    };
    let added: Vec<&str> = added
        .split(',')
        .filter(|clause| !clause.is_empty())
        .collect();
    let replaced: Vec<String> = added.iter().map(|clause| target(clause)).collect();
    base.split(',')
        .filter(|clause| !clause.is_empty() && !replaced.contains(&target(clause)))
        .chain(added.iter().copied())
        .collect::<Vec<_>>()
        .join(",")
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
    let handle = LogHandle {
        reload,
        initial: options.filter.as_str().into(),
    };
    Ok((dispatch, handle))
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
    fn a_level_is_laid_over_the_filter_replacing_its_own_target() {
        let table = [
            // (base, added, result)
            ("info", "debug", "debug"),
            ("info,access=debug", "warn", "access=debug,warn"),
            ("info,access=debug", "access=trace", "info,access=trace"),
            (
                "info",
                "access=debug,xds=trace",
                "info,access=debug,xds=trace",
            ),
            ("info", "", "info"),
        ];
        for (base, added, result) in table {
            assert_eq!(lay_over(base, added), result, "{base} + {added}");
        }
    }

    #[test]
    fn levels_are_levels_or_target_equals_level() {
        for good in [
            "debug",
            "off",
            "access=debug,warn",
            "ztunnel_proxy::xds=trace",
        ] {
            assert!(check_levels(good).is_ok(), "{good}");
        }
        // istioctl's `a:b` form, a bare target, an unknown level.
        for bad in ["access:debug", "access", "loud", "access=loud", "=debug"] {
            assert!(check_levels(bad).is_err(), "{bad}");
        }
    }

    /// A filter's clauses, whatever order the filter prints them in.
    fn clauses(filter: &str) -> std::collections::BTreeSet<&str> {
        filter.split(',').collect()
    }

    #[test]
    fn a_change_builds_on_the_current_filter_and_a_reset_on_the_first() {
        let (_dispatch, handle) = subscriber(&options("info,xds=debug"), std::io::sink).unwrap();
        let table = [
            // (reset, level, filter in force after)
            (false, "access=trace", "info,xds=debug,access=trace"),
            (false, "warn", "xds=debug,access=trace,warn"),
            (true, "", "info,xds=debug"),
            (true, "error", "xds=debug,error"),
        ];
        for (reset, level, after) in table {
            let filter = handle.change(reset, level).unwrap();
            assert_eq!(
                clauses(&filter),
                clauses(after),
                "reset={reset} level={level}"
            );
        }
        assert!(handle.change(false, "access:debug").is_err());
        assert_eq!(
            clauses(&handle.current().unwrap()),
            clauses("xds=debug,error")
        );
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
