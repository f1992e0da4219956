//! What `soak` counts and prints: the cumulative counts of one run, as the
//! JSON every line carries, and the rules that change them (plain
//! functions of plain data, so tested without a socket). Which kind a
//! failure is lives in `failure.rs`; when the counts are printed, in
//! `soak.rs`.

use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

/// The breaks listed with their times: a run where connections break over
/// and over (a server that accepts and resets at once) still prints short
/// lines, while a rollout's breaks, a handful at most, are all listed. The
/// count in [`LongLived::broken`] stays exact beyond it.
pub const MAX_BREAKS_LISTED: usize = 100;

/// The failures listed with their details, for the same reason: a
/// rollout's few are all there, a dead server's thousands are counted only.
pub const MAX_FAILURES_LISTED: usize = 100;

/// A name lookup that took at least this long is counted late: glibc's
/// resolver answers from the first reply, a millisecond or so away, and
/// only asks again after its timeout (5 s by default) when a query or its
/// answer was lost.
pub const LATE_RESOLVE: Duration = Duration::from_secs(1);

/// Why a connection failed, as the counts tell failures apart: each kind
/// points at a different fault of whatever stands between client and server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FailureKind {
    /// The connection was refused: nothing listened, or a proxy refused it.
    Refused,
    /// The connection was reset or aborted, or a write found it gone.
    Reset,
    /// Opening the connection or an answer took longer than `--timeout`.
    Timeout,
    /// The peer closed before the whole answer came.
    Closed,
    /// The answer came but differs from the request it echoes, or bytes
    /// came where the server closes.
    Wrong,
    /// The network or host was unreachable.
    Unreachable,
    /// The name did not resolve, or resolved to no address.
    Resolve,
    /// Anything else, such as running out of file descriptors; stderr's
    /// line before the last names the first failure.
    Other,
}

/// Failures counted by kind; the JSON has one field per kind.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailureCounts {
    /// See [`FailureKind::Refused`].
    pub refused: u64,
    /// See [`FailureKind::Reset`].
    pub reset: u64,
    /// See [`FailureKind::Timeout`].
    pub timeout: u64,
    /// See [`FailureKind::Closed`].
    pub closed: u64,
    /// See [`FailureKind::Wrong`].
    pub wrong: u64,
    /// See [`FailureKind::Unreachable`].
    pub unreachable: u64,
    /// See [`FailureKind::Resolve`].
    pub resolve: u64,
    /// See [`FailureKind::Other`].
    pub other: u64,
}

/// One long-lived connection's break.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Break {
    /// Seconds from the start of the run to when the break was seen: at
    /// most one exchange interval after it happened.
    pub at_s: f64,
    /// Why it broke.
    pub kind: FailureKind,
}

/// Where in a connection's life a failure came: what a reader needs to
/// tell a lost DNS query from a refused connect from a dropped stream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Step {
    /// Looking the name up (the system resolver): a timeout here is a DNS
    /// query unanswered within `--timeout`.
    #[default]
    Resolve,
    /// connect(): refused, reset or unanswered SYN.
    Connect,
    /// The header, a message or its echo.
    Exchange,
}

/// Which connection a listed failure was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Attempt {
    /// A short connection.
    New,
    /// Opening a long-lived connection, the first or a replacement.
    Open,
    /// An open long-lived connection that broke.
    Break,
}

/// One failure with what is known of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ListedFailure {
    /// Seconds from the start of the run to when it failed.
    pub at_s: f64,
    /// Which connection it was.
    pub attempt: Attempt,
    /// Its kind, as counted.
    pub kind: FailureKind,
    /// The step it failed in.
    pub step: Step,
    /// How long the name lookup took, when the destination is a name and
    /// the lookup ended (a lookup cut by the timeout has none).
    pub resolve_s: Option<f64>,
    /// The error with its causes.
    pub error: String,
}

/// The name lookups of a destination given by name.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Resolves {
    /// Lookups that gave an address.
    pub ok: u64,
    /// Of those, the ones that took at least [`LATE_RESOLVE`]: a query
    /// answered only after the resolver asked again.
    pub late: u64,
    /// The longest one, in seconds.
    pub slowest_s: f64,
}

/// The short connections: connect, one message and its echo, close.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NewConnections {
    /// Connections whose answer was right and that the server then closed.
    pub ok: u64,
    /// Connections that failed at any step, by kind.
    pub failed: FailureCounts,
}

/// The long-lived connections.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LongLived {
    /// How many the run keeps open (`--connections`).
    pub wanted: u64,
    /// How many are open now; at the end, how many were open when it came.
    pub open: u64,
    /// Messages answered right on them, each connection's first included.
    pub exchanges: u64,
    /// Open connections that broke before the end of the run, by kind.
    pub broken: FailureCounts,
    /// The first [`MAX_BREAKS_LISTED`] breaks, in the order seen.
    pub breaks: Vec<Break>,
    /// Connections opened to replace broken ones.
    pub replaced: u64,
    /// Attempts to open one (the first or a replacement) that failed, by
    /// kind: a connection counts as open once its first message came back.
    pub open_failed: FailureCounts,
}

/// The counts of one soak run so far: every line `soak` prints.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SoakReport {
    /// When the run started, in seconds since the Unix epoch: a reader
    /// places the breaks (`at_s` after it) on its own clock, e.g. against
    /// the moment a proxy was told to stop.
    pub started_unix_s: f64,
    /// Seconds from the start of the run to this line.
    pub elapsed_s: f64,
    /// The short connections.
    pub new: NewConnections,
    /// The long-lived connections.
    pub long_lived: LongLived,
    /// The name lookups (none when the target is an address).
    pub resolves: Resolves,
    /// The first [`MAX_FAILURES_LISTED`] failures of any attempt, in the
    /// order seen, each with its step and error.
    pub failures: Vec<ListedFailure>,
}

impl FailureCounts {
    /// Counts one failure of `kind`.
    pub fn add(&mut self, kind: FailureKind) {
        let count = match kind {
            FailureKind::Refused => &mut self.refused,
            FailureKind::Reset => &mut self.reset,
            FailureKind::Timeout => &mut self.timeout,
            FailureKind::Closed => &mut self.closed,
            FailureKind::Wrong => &mut self.wrong,
            FailureKind::Unreachable => &mut self.unreachable,
            FailureKind::Resolve => &mut self.resolve,
            FailureKind::Other => &mut self.other,
        };
        *count = count.saturating_add(1);
    }

    /// Failures of every kind.
    pub fn total(&self) -> u64 {
        [
            self.refused,
            self.reset,
            self.timeout,
            self.closed,
            self.wrong,
            self.unreachable,
            self.resolve,
            self.other,
        ]
        .iter()
        .fold(0, |total, count| total.saturating_add(*count))
    }
}

impl SoakReport {
    /// The counts of a run that keeps `wanted` long-lived connections,
    /// started at `started`, before anything happened.
    pub fn new(wanted: u32, started: SystemTime) -> Self {
        SoakReport {
            started_unix_s: started
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0.0, |since| since.as_secs_f64()),
            long_lived: LongLived {
                wanted: u64::from(wanted),
                ..LongLived::default()
            },
            ..SoakReport::default()
        }
    }

    /// A short connection ended: right, or failed with a kind.
    pub fn new_connection(&mut self, outcome: Result<(), FailureKind>) {
        match outcome {
            Ok(()) => self.new.ok = self.new.ok.saturating_add(1),
            Err(kind) => self.new.failed.add(kind),
        }
    }

    /// A long-lived connection opened, proven by its first message;
    /// `replacing` when it takes the place of one that broke.
    pub fn opened(&mut self, replacing: bool) {
        self.long_lived.open = self.long_lived.open.saturating_add(1);
        self.exchanged();
        if replacing {
            self.long_lived.replaced = self.long_lived.replaced.saturating_add(1);
        }
    }

    /// Opening a long-lived connection failed.
    pub fn open_failed(&mut self, kind: FailureKind) {
        self.long_lived.open_failed.add(kind);
    }

    /// A message on a long-lived connection came back right.
    pub fn exchanged(&mut self) {
        self.long_lived.exchanges = self.long_lived.exchanges.saturating_add(1);
    }

    /// An open long-lived connection broke, seen `at` after the start.
    pub fn broke(&mut self, at: Duration, kind: FailureKind) {
        self.long_lived.open = self.long_lived.open.saturating_sub(1);
        self.long_lived.broken.add(kind);
        if self.long_lived.breaks.len() < MAX_BREAKS_LISTED {
            self.long_lived.breaks.push(Break {
                at_s: seconds(at),
                kind,
            });
        }
    }

    /// A name lookup gave an address after `took`.
    pub fn resolved(&mut self, took: Duration) {
        self.resolves.ok = self.resolves.ok.saturating_add(1);
        if took >= LATE_RESOLVE {
            self.resolves.late = self.resolves.late.saturating_add(1);
        }
        self.resolves.slowest_s = self.resolves.slowest_s.max(seconds(took));
    }

    /// Lists `failure`, already counted by kind, while the list has room.
    pub fn list(&mut self, failure: ListedFailure) {
        if self.failures.len() < MAX_FAILURES_LISTED {
            self.failures.push(failure);
        }
    }

    /// The counts as a line printed `elapsed` after the start.
    pub fn at(&self, elapsed: Duration) -> SoakReport {
        SoakReport {
            elapsed_s: seconds(elapsed),
            ..self.clone()
        }
    }

    /// Whether anything succeeded: a short connection or a long-lived
    /// message.
    pub fn succeeded(&self) -> bool {
        self.new.ok > 0 || self.long_lived.exchanges > 0
    }

    /// Failures of every kind, short and long-lived.
    pub fn failures(&self) -> u64 {
        self.new
            .failed
            .total()
            .saturating_add(self.long_lived.broken.total())
            .saturating_add(self.long_lived.open_failed.total())
    }
}

/// Seconds to the millisecond: finer would only lengthen the lines.
pub fn seconds(duration: Duration) -> f64 {
    duration.as_millis() as f64 / 1000.0
}

#[cfg(test)]
mod tests;
