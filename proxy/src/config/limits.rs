//! How long and how much: the drain deadline on SIGTERM (Istio's rule from
//! the pod's grace period), how long a connection waits for its pod's
//! workload to be described, and the caps on pending handshakes and on
//! connections. Draining is `drain.rs`'s business, counting connections
//! `capacity.rs`'s.

use std::time::Duration;

use super::{ConfigError, ValueError, parse_duration};

/// MAX_CONNECTIONS unset. A carried connection holds about 4 KiB when idle
/// and about 40 KiB while it moves data (its two copy buffers of at most
/// 16 KiB, benches/README.md), so 65,536 busy connections take about
/// 2.5 GiB over the proxy's own state: the chart's memory limit of 3 GiB.
const DEFAULT_MAX_CONNECTIONS: usize = 65_536;
/// MIN_CONNECTIONS_PER_POD unset: MAX_CONNECTIONS divided by this, so that
/// the floors of a node's pods fit in the bound up to this many pods:
/// more than kubelet's default of 110 pods a node and its usual maximum
/// of 250 (256 each with the default bound).
const FLOOR_PODS: usize = 256;
/// The drain deadline when neither it nor the grace period is set: Istio's.
const DEFAULT_DRAIN_DEADLINE: Duration = Duration::from_secs(5);
/// A grace period longer than this leaves [`LONG_GRACE_MARGIN`] between
/// the forced close and kubelet's SIGKILL; a shorter one, [`GRACE_MARGIN`].
/// Istio's rule, so the same chart drains the same way.
const LONG_GRACE: Duration = Duration::from_secs(10);
/// The margin under a long grace period.
const LONG_GRACE_MARGIN: Duration = Duration::from_secs(5);
/// The margin under a short grace period.
const GRACE_MARGIN: Duration = Duration::from_secs(1);
/// The shortest deadline a short grace period gives, if the grace period
/// itself is not shorter.
const MIN_DEADLINE: Duration = Duration::from_secs(1);

/// This group's part of the [`Config`](super::Config): its fields of the
/// same names.
pub(super) struct Limits {
    pub drain_deadline: Duration,
    pub local_workload_wait: Duration,
    pub max_pending_handshakes: usize,
    pub max_connections: usize,
    pub min_connections_per_pod: usize,
}

/// The flags and variables, flattened into the command line.
#[derive(Debug, clap::Args)]
pub(super) struct LimitArgs {
    /// Drain deadline on SIGTERM, e.g. `10s` (a bare number is seconds):
    /// connections still open then are closed. Wins over
    /// TERMINATION_GRACE_PERIOD_SECONDS [default: from the grace period, else 5s].
    #[arg(long, env = "CONNECTION_TERMINATION_DEADLINE")]
    connection_termination_deadline: Option<String>,
    /// The pod's grace period in seconds, as Istio's chart passes it: without
    /// CONNECTION_TERMINATION_DEADLINE the drain deadline is 5 s less when it
    /// is over 10 s, else 1 s less but at least 1 s (never more than the
    /// grace period: 0 closes at once), so connections are closed before
    /// kubelet's SIGKILL.
    #[arg(long, env = "TERMINATION_GRACE_PERIOD_SECONDS")]
    termination_grace_period_seconds: Option<String>,
    /// How long a connection from or to a pod this proxy serves waits for
    /// the control plane to describe the pod's workload, when it arrives
    /// first (a pod sends as soon as its network is up).
    #[arg(long, env = "LOCAL_WORKLOAD_WAIT", default_value = "5s")]
    local_workload_wait: String,
    /// The most connections each inbound HBONE listener (15008) holds
    /// before their TLS handshake ends. Beyond it new connections are
    /// closed at once and counted in `ztunnel_handshakes_refused_total`.
    #[arg(long, env = "MAX_PENDING_HANDSHAKES", default_value_t = 4096)]
    max_pending_handshakes: usize,
    /// The most connections the process carries at once, over every pod
    /// and listener, each HBONE stream counted as one. Beyond it new
    /// connections are closed at once and HBONE streams answered 503, each
    /// counted in `ztunnel_connections_refused_total`. The default keeps a
    /// node's busiest hour well inside the chart's memory limit
    /// (deploy/charts/ztunnel-mesh/values.yaml says how it was chosen).
    #[arg(long, env = "MAX_CONNECTIONS", default_value_t = DEFAULT_MAX_CONNECTIONS)]
    max_connections: usize,
    /// The connections (and HBONE streams) each pod keeps of
    /// MAX_CONNECTIONS, whatever its neighbours do: a pod's outbound
    /// connections and what is sent to it are charged to it, and beyond
    /// this floor it gets at most the bound divided among the busy pods.
    /// At most MAX_CONNECTIONS [default: MAX_CONNECTIONS / 256, at least 1].
    #[arg(long, env = "MIN_CONNECTIONS_PER_POD")]
    min_connections_per_pod: Option<usize>,
}

impl LimitArgs {
    /// The limits; `CONNECTION_TERMINATION_DEADLINE` wins over the grace
    /// period, no cap may be 0, and no pod's floor exceed the node's bound.
    pub(super) fn parse(&self) -> Result<Limits, ConfigError> {
        let drain_deadline = match (
            &self.connection_termination_deadline,
            &self.termination_grace_period_seconds,
        ) {
            (Some(deadline), _) => parse_duration(deadline)
                .map_err(ConfigError::value("CONNECTION_TERMINATION_DEADLINE"))?,
            (None, Some(grace)) => drain_deadline(
                parse_duration(grace)
                    .map_err(ConfigError::value("TERMINATION_GRACE_PERIOD_SECONDS"))?,
            ),
            (None, None) => DEFAULT_DRAIN_DEADLINE,
        };
        let max_connections = at_least_one("MAX_CONNECTIONS", self.max_connections)?;
        let min_connections_per_pod = match self.min_connections_per_pod {
            None => (max_connections / FLOOR_PODS).max(1),
            Some(floor) if floor > max_connections => {
                return Err(ConfigError::Value {
                    name: "MIN_CONNECTIONS_PER_POD",
                    source: ValueError::Range(floor.to_string(), "more than MAX_CONNECTIONS"),
                });
            }
            Some(floor) => at_least_one("MIN_CONNECTIONS_PER_POD", floor)?,
        };
        Ok(Limits {
            drain_deadline,
            local_workload_wait: parse_duration(&self.local_workload_wait)
                .map_err(ConfigError::value("LOCAL_WORKLOAD_WAIT"))?,
            max_pending_handshakes: at_least_one(
                "MAX_PENDING_HANDSHAKES",
                self.max_pending_handshakes,
            )?,
            max_connections,
            min_connections_per_pod,
        })
    }
}

/// The drain deadline for a pod's grace period (SIGTERM to SIGKILL), as
/// istio/ztunnel derives it: 5 s less above 10 s, otherwise 1 s less but at
/// least 1 s. Unlike Istio's, a grace period of 0 (where the u64
/// subtraction wraps round, so nothing is ever forced) gives 0, and no
/// deadline exceeds its grace period: SIGKILL follows at once, so there is
/// nothing to wait for.
pub fn drain_deadline(grace: Duration) -> Duration {
    if grace > LONG_GRACE {
        grace - LONG_GRACE_MARGIN
    } else {
        grace
            .saturating_sub(GRACE_MARGIN)
            .max(MIN_DEADLINE)
            .min(grace)
    }
}

/// `count`, unless it is 0: a cap of 0 would refuse everything.
fn at_least_one(name: &'static str, count: usize) -> Result<usize, ConfigError> {
    match count {
        0 => Err(ConfigError::Value {
            name,
            source: ValueError::Zero,
        }),
        count => Ok(count),
    }
}
