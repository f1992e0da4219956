//! How long the xDS client waits before reconnecting (WIRE.md §7), decided
//! from how the last stream ended, with the randomness passed in. The
//! arithmetic is `backoff.rs`'s; this file says when a wait grows and when
//! it starts over.
//!
//! - connection errors (no connect, failed TLS, `http://`) and non-transient
//!   gRPC statuses double the wait before each retry: 20 ms, 40 ms, … 15 s;
//! - a clean end (status OK, or the stream closing without one) reconnects
//!   at once and resets the wait to 10 ms;
//! - transient statuses (Unknown, Cancelled, DeadlineExceeded, Unavailable
//!   with "transport is closing" / "received prior goaway") wait 10 ms and
//!   reset it.
//!
//! Jitter: every non-zero wait is shortened by up to `JITTER` (20 %) of
//! itself. Thousands of ztunnels lose istiod at the same moment when it
//! restarts; without jitter they would retry in lockstep at 20 ms, 40 ms, …
//! and at the 15 s cap hit the new istiod all together. Taking the jitter
//! off rather than adding it keeps WIRE.md's figures as upper bounds: no
//! wait is ever longer than the contract says. The immediate reconnect after
//! a clean end stays immediate, as WIRE.md requires; istiod ends streams at
//! staggered times itself (per-connection maximum age).

use std::time::Duration;

use tonic::Code;

use crate::backoff::{Backoff, Jitter};

/// The base wait, and the wait after a transient status (WIRE.md §7).
pub const INITIAL: Duration = Duration::from_millis(10);

/// The longest wait (WIRE.md §7).
pub const MAX: Duration = Duration::from_secs(15);

/// The largest share of a wait that jitter takes off; 20 % as the CA
/// client's backoff (WIRE.md §3) spreads its retries.
pub const JITTER: f64 = 0.2;

/// The waits from the base: step 1 is [`INITIAL`], each failure in a row
/// one step further (WIRE.md §7 doubles the wait before each retry).
const BACKOFF: Backoff = Backoff {
    initial: INITIAL,
    max: MAX,
    multiplier: 2,
    jitter: Jitter::Shorten(JITTER),
};

/// The status messages of Unavailable that mean the connection went away
/// under a healthy server (WIRE.md §7).
const TRANSIENT_UNAVAILABLE: [&str; 2] = ["transport is closing", "received prior goaway"];

/// How a stream attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamEnd {
    /// No stream: TCP, TLS, the HTTP/2 handshake, the token or an `http://`
    /// address failed.
    ConnectionFailed,
    /// The server ended the stream with OK, or closed it without a status.
    Clean,
    /// The stream ended with a gRPC status other than OK.
    Status {
        /// The status code.
        code: Code,
        /// The status message.
        message: String,
    },
}

impl StreamEnd {
    /// Whether a status is one of the transient ones of WIRE.md §7.
    pub fn is_transient(&self) -> bool {
        match self {
            StreamEnd::Status { code, message } => match code {
                Code::Unknown | Code::Cancelled | Code::DeadlineExceeded => true,
                Code::Unavailable => TRANSIENT_UNAVAILABLE
                    .iter()
                    .any(|transient| message.contains(transient)),
                _ => false,
            },
            StreamEnd::ConnectionFailed | StreamEnd::Clean => false,
        }
    }

    /// The label of `istio_xds_connection_terminations_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            StreamEnd::ConnectionFailed => "ConnectionError",
            StreamEnd::Clean => "Complete",
            StreamEnd::Status { .. } if self.is_transient() => "Reconnect",
            StreamEnd::Status { .. } => "Error",
        }
    }
}

/// The failures carried from one attempt to the next.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reconnect {
    /// Connection errors and non-transient statuses in a row since the last
    /// clean or transient end.
    failures: u32,
}

impl Reconnect {
    /// No failure yet: the next failure waits 20 ms.
    pub fn new() -> Self {
        Self::default()
    }

    /// The wait before the next attempt after `end`. `random` is a sample
    /// in `[0, 1)`: 0 takes nothing off, 1 takes off the whole 20 %.
    pub fn after(&mut self, end: &StreamEnd, random: f64) -> Duration {
        match end {
            StreamEnd::Clean => {
                self.failures = 0;
                Duration::ZERO
            }
            end if end.is_transient() => {
                self.failures = 0;
                BACKOFF.wait(1, random)
            }
            StreamEnd::ConnectionFailed | StreamEnd::Status { .. } => {
                self.failures = self.failures.saturating_add(1);
                BACKOFF.wait(self.failures.saturating_add(1), random)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: Code, message: &str) -> StreamEnd {
        StreamEnd::Status {
            code,
            message: message.to_owned(),
        }
    }

    #[test]
    fn connection_errors_double_up_to_the_cap() {
        let ms = Duration::from_millis;
        let mut reconnect = Reconnect::new();
        let waits: Vec<_> = (0..12)
            .map(|_| reconnect.after(&StreamEnd::ConnectionFailed, 0.0))
            .collect();
        assert_eq!(
            waits,
            [
                ms(20),
                ms(40),
                ms(80),
                ms(160),
                ms(320),
                ms(640),
                ms(1280),
                ms(2560),
                ms(5120),
                ms(10240),
                ms(15000),
                ms(15000)
            ]
        );
    }

    #[test]
    fn each_ending_has_its_wait() {
        let ms = Duration::from_millis;
        // (end, its wait, the wait of a failure after it, metric reason),
        // each after seven failures in a row (the last one waited 1280 ms).
        let reset = ms(20);
        let cases = [
            (StreamEnd::Clean, ms(0), reset, "Complete"),
            (
                status(Code::Unknown, "h2 protocol error"),
                ms(10),
                reset,
                "Reconnect",
            ),
            (status(Code::Cancelled, ""), ms(10), reset, "Reconnect"),
            (
                status(Code::DeadlineExceeded, ""),
                ms(10),
                reset,
                "Reconnect",
            ),
            (
                status(Code::Unavailable, "transport is closing"),
                ms(10),
                reset,
                "Reconnect",
            ),
            (
                status(Code::Unavailable, "received prior goaway: code: NO_ERROR"),
                ms(10),
                reset,
                "Reconnect",
            ),
            (
                status(Code::Unavailable, "connection refused"),
                ms(2560),
                ms(5120),
                "Error",
            ),
            (
                status(Code::PermissionDenied, "authorization failed"),
                ms(2560),
                ms(5120),
                "Error",
            ),
            (
                StreamEnd::ConnectionFailed,
                ms(2560),
                ms(5120),
                "ConnectionError",
            ),
        ];
        for (end, wait, next, reason) in cases {
            let mut reconnect = Reconnect { failures: 7 };
            assert_eq!(reconnect.after(&end, 0.0), wait, "{end:?}");
            let failure = StreamEnd::ConnectionFailed;
            assert_eq!(reconnect.after(&failure, 0.0), next, "{end:?}");
            assert_eq!(end.reason(), reason, "{end:?}");
        }
    }

    #[test]
    fn jitter_only_shortens() {
        let ms = Duration::from_millis;
        // Eleven failures in a row: the wait is at the cap.
        let mut reconnect = Reconnect { failures: 11 };
        assert_eq!(reconnect.after(&StreamEnd::ConnectionFailed, 0.0), MAX);
        assert_eq!(
            reconnect.after(&StreamEnd::ConnectionFailed, 1.0),
            ms(12_000)
        );
        assert_eq!(reconnect.after(&StreamEnd::ConnectionFailed, f64::NAN), MAX);
        assert_eq!(reconnect.after(&StreamEnd::Clean, 0.7), Duration::ZERO);
        assert_eq!(reconnect.after(&status(Code::Cancelled, ""), 0.5), ms(9));
    }
}
