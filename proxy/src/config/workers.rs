//! How many worker threads the data-plane runtime gets, as istio/ztunnel
//! derives it from the container's CPU limit and request (AMBIENT.md §8.2),
//! and the flags that give them. Pure: the caller passes the flags as given
//! and the machine's logical CPUs.

use super::{ConfigError, ValueError};

/// The fewest workers the default gives a proxy whose limit is not known.
const DEFAULT_MIN_WORKERS: usize = 2;

/// Without a known limit the default takes this share of the cores, so a
/// proxy on a large node does not start a thread per core it may never get.
const DEFAULT_CORE_SHARE_PERCENT: u64 = 25;

/// The raw settings, as given: the flags and variables, flattened into the
/// command line.
#[derive(Debug, Default, Clone, clap::Args)]
pub(super) struct WorkerArgs {
    /// Data-plane worker threads: a count, `0` for one per core, or `N%` of
    /// the cores [default: the resource CPU limit (raised to the request)
    /// when set, else a quarter of the cores, at least the request and 2].
    #[arg(long, env = "ZTUNNEL_WORKER_THREADS")]
    worker_threads: Option<String>,
    /// The cores the proxy has, in whole cores, as Istio's ztunnel chart
    /// sets it from the downward API (limits.cpu rounded up; the node's
    /// cores when no limit is set) [default: the logical CPUs].
    #[arg(long, env = "ZTUNNEL_CPU_LIMIT")]
    cpu_limit: Option<usize>,
    /// The container's CPU limit as a quantity (`2`, `1.5`, `500m`), which
    /// Istio's chart sets only when a limit is set: the cores the proxy
    /// has, and its default worker count.
    #[arg(long, env = "ZTUNNEL_RESOURCE_CPU_LIMIT")]
    resource_cpu_limit: Option<String>,
    /// The container's CPU request as a quantity: the default worker
    /// count is never below it.
    #[arg(long, env = "ZTUNNEL_RESOURCE_CPU_REQUEST")]
    resource_cpu_request: Option<String>,
}

impl WorkerArgs {
    /// The worker count; `logical_cpus` stands in when nothing says how
    /// many cores the proxy has, and Istio's proxy config `concurrency`
    /// replaces the default (0: one per core). `ZTUNNEL_CPU_LIMIT` may not
    /// be 0.
    pub(super) fn parse(
        &self,
        logical_cpus: usize,
        concurrency: Option<u16>,
    ) -> Result<usize, ConfigError> {
        if self.cpu_limit == Some(0) {
            return Err(ConfigError::Value {
                name: "ZTUNNEL_CPU_LIMIT",
                source: ValueError::Zero,
            });
        }
        worker_threads(self, logical_cpus, concurrency)
            .map_err(|(name, source)| ConfigError::Value { name, source })
    }
}

/// Which setting a bad value came from, for the error.
type Blame = (&'static str, ValueError);

/// The worker count, at least 1; `logical_cpus` stands in when nothing
/// says how many cores the proxy has; `concurrency` replaces the default.
fn worker_threads(
    settings: &WorkerArgs,
    logical_cpus: usize,
    concurrency: Option<u16>,
) -> Result<usize, Blame> {
    let limit = quantity(settings.resource_cpu_limit.as_deref())
        .map_err(|error| ("ZTUNNEL_RESOURCE_CPU_LIMIT", error))?;
    let request = quantity(settings.resource_cpu_request.as_deref())
        .map_err(|error| ("ZTUNNEL_RESOURCE_CPU_REQUEST", error))?;
    let cores = limit.or(settings.cpu_limit).unwrap_or(logical_cpus);
    let workers = match settings.worker_threads.as_deref() {
        Some(text) => explicit(text, cores).map_err(|error| ("ZTUNNEL_WORKER_THREADS", error))?,
        None => match (concurrency, limit) {
            // Istio's proxy config: 0 is one worker per core.
            (Some(0), _) => cores,
            (Some(count), _) => usize::from(count),
            (None, Some(limit)) => limit.max(request.unwrap_or(0)),
            (None, None) => share(cores, DEFAULT_CORE_SHARE_PERCENT)
                .max(request.unwrap_or(0))
                .max(DEFAULT_MIN_WORKERS),
        },
    };
    Ok(workers.max(1))
}

/// `ZTUNNEL_WORKER_THREADS`: `N%` of `cores` (0 < N ≤ 100, rounded up),
/// `0` for every core, or a count.
fn explicit(text: &str, cores: usize) -> Result<usize, ValueError> {
    let bad = || {
        ValueError::Range(
            text.to_owned(),
            "a count, or a percentage above 0 up to 100%",
        )
    };
    match text.strip_suffix('%') {
        Some(percent) => {
            let percent: f64 = percent.trim().parse().map_err(|_| bad())?;
            if !(percent > 0.0 && percent <= 100.0) {
                return Err(bad());
            }
            // Hundredths of a percent are as fine as anyone sets it.
            let hundredths = (percent * 100.0).round() as u64;
            Ok(ceil_div(cores as u64 * hundredths, 100 * 100).max(1))
        }
        None => match text.trim().parse::<usize>().map_err(|_| bad())? {
            0 => Ok(cores),
            count => Ok(count),
        },
    }
}

/// `percent`% of `cores`, rounded up.
fn share(cores: usize, percent: u64) -> usize {
    ceil_div(cores as u64 * percent, 100)
}

fn ceil_div(numerator: u64, denominator: u64) -> usize {
    usize::try_from(numerator.div_ceil(denominator)).unwrap_or(usize::MAX)
}

/// A Kubernetes CPU quantity in whole cores, rounded up: `2`, `1.5` (2),
/// `500m` (1). Zero, negative and non-numbers are refused.
fn quantity(text: Option<&str>) -> Result<Option<usize>, ValueError> {
    let Some(text) = text.map(str::trim).filter(|text| !text.is_empty()) else {
        return Ok(None);
    };
    let bad = || {
        ValueError::Range(
            text.to_owned(),
            "a CPU quantity above 0 such as 2, 1.5 or 500m",
        )
    };
    let cores = match text.strip_suffix('m') {
        Some(millis) => millis.parse::<f64>().map(|millis| millis / 1000.0),
        None => text.parse::<f64>(),
    }
    .map_err(|_| bad())?;
    if !(cores.is_finite() && cores > 0.0) {
        return Err(bad());
    }
    Ok(Some(cores.ceil() as usize))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_follow_istios_rules() {
        let none = WorkerArgs::default;
        let text = |value: Option<&str>| value.map(str::to_owned);
        let with = |worker_threads, limit, request, cpu_limit| WorkerArgs {
            worker_threads: text(worker_threads),
            resource_cpu_limit: text(limit),
            resource_cpu_request: text(request),
            cpu_limit,
        };
        // (settings, logical cpus, workers): AMBIENT.md §8.2's examples first.
        let table = [
            (with(Some("4"), None, None, None), 16, 4),
            (with(Some("50%"), None, None, Some(8)), 16, 4),
            (with(Some("30%"), None, None, Some(16)), 64, 5),
            (with(Some("10%"), None, None, Some(4)), 64, 1),
            (with(None, Some("16"), None, None), 64, 16),
            (with(None, Some("1"), None, None), 64, 1),
            (with(None, Some("500m"), None, None), 64, 1),
            (with(None, Some("2500m"), None, None), 64, 3),
            (with(None, Some("1.5"), None, None), 64, 2),
            (with(None, None, None, Some(32)), 64, 8),
            (with(None, Some("4"), Some("8"), None), 64, 8),
            (with(Some("0"), None, None, Some(6)), 64, 6),
            // No limit at all: a quarter of the logical cores, at least 2.
            (none(), 64, 16),
            (none(), 4, 2),
            // The request raises the default; the resource limit wins over
            // ZTUNNEL_CPU_LIMIT as the core count.
            (with(None, None, Some("6"), None), 8, 6),
            (with(Some("100%"), Some("3"), None, Some(32)), 64, 3),
        ];
        for (settings, logical_cpus, expected) in table {
            assert_eq!(
                worker_threads(&settings, logical_cpus, None),
                Ok(expected),
                "{settings:?} on {logical_cpus} cpus"
            );
        }
    }

    #[test]
    fn proxy_config_concurrency_sets_the_default_and_the_variable_wins() {
        let none = WorkerArgs::default();
        let limited = WorkerArgs {
            resource_cpu_limit: Some("2".to_owned()),
            ..WorkerArgs::default()
        };
        let explicit = WorkerArgs {
            worker_threads: Some("3".to_owned()),
            ..WorkerArgs::default()
        };
        let rows: &[(&WorkerArgs, Option<u16>, usize, &str)] = &[
            (&none, Some(5), 5, "a count"),
            (&none, Some(0), 64, "0: one per core"),
            (
                &limited,
                Some(6),
                6,
                "over the CPU limit's default, as Istio's",
            ),
            (&limited, Some(0), 2, "0: the cores the limit gives"),
            (&explicit, Some(6), 3, "ZTUNNEL_WORKER_THREADS wins"),
            (&none, None, 16, "unset: the default"),
        ];
        for (settings, concurrency, expected, reason) in rows {
            assert_eq!(
                worker_threads(settings, 64, *concurrency),
                Ok(*expected),
                "{reason}"
            );
        }
    }

    #[test]
    fn bad_values_name_their_setting() {
        let table = [
            (Some("0%"), None, "ZTUNNEL_WORKER_THREADS"),
            (Some("101%"), None, "ZTUNNEL_WORKER_THREADS"),
            (Some("many"), None, "ZTUNNEL_WORKER_THREADS"),
            (Some("-1"), None, "ZTUNNEL_WORKER_THREADS"),
            (None, Some("0"), "ZTUNNEL_RESOURCE_CPU_LIMIT"),
            (None, Some("-2"), "ZTUNNEL_RESOURCE_CPU_LIMIT"),
            (None, Some("lots"), "ZTUNNEL_RESOURCE_CPU_LIMIT"),
            (None, Some("NaN"), "ZTUNNEL_RESOURCE_CPU_LIMIT"),
        ];
        for (worker_threads, limit, setting) in table {
            let settings = WorkerArgs {
                worker_threads: worker_threads.map(str::to_owned),
                resource_cpu_limit: limit.map(str::to_owned),
                ..WorkerArgs::default()
            };
            let blamed = worker_threads_blame(&settings);
            assert_eq!(blamed, Some(setting), "{settings:?}");
        }
    }

    fn worker_threads_blame(settings: &WorkerArgs) -> Option<&'static str> {
        worker_threads(settings, 4, None)
            .err()
            .map(|(setting, _)| setting)
    }
}
