//! How often a denial of an unauthenticated request is logged: a flood of
//! junk tokens is thousands of denials a second, each counted in
//! `ca_denials_total`, but a line each would bury the log and cost more
//! than refusing them. One line an interval is written, with how many
//! were left out since the last; denials of authenticated callers (a node
//! agent asking for what it may not have) are each worth a line and are
//! not budgeted here.

use std::time::{Duration, Instant};

/// The shortest time between two lines about unauthenticated denials.
pub const INTERVAL: Duration = Duration::from_secs(1);

/// When the last line was written and what was left out since.
#[derive(Debug, Default)]
pub struct DenialLog {
    /// When the last line was written; `None` before the first.
    last: Option<Instant>,
    /// Denials not logged since.
    left_out: u64,
}

impl DenialLog {
    /// Whether a denial at `now` gets its line: `Some(left out since the
    /// last line)` when it does, `None` (counted as left out) when the
    /// last line is younger than [`INTERVAL`].
    pub fn admit(&mut self, now: Instant) -> Option<u64> {
        let due = self
            .last
            .is_none_or(|last| now.saturating_duration_since(last) >= INTERVAL);
        if !due {
            self.left_out += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.left_out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_an_interval_with_the_count_left_out_since_the_last() {
        let start = Instant::now();
        let at = |millis| start + Duration::from_millis(millis);
        let mut log = DenialLog::default();
        let rows: &[(u64, Option<u64>, &str)] = &[
            (0, Some(0), "the first denial is logged"),
            (1, None, "a flood's next ones are not"),
            (500, None, "still within the interval"),
            (999, None, "just within"),
            (1000, Some(3), "the interval is over: three were left out"),
            (1001, None, "a new interval"),
            (5000, Some(1), "long after: the one left out"),
            (9000, Some(0), "a lone denial later gets its line"),
        ];
        for (millis, expected, reason) in rows {
            assert_eq!(log.admit(at(*millis)), *expected, "{reason}");
        }
    }
}
