//! Why one soak connection failed, and the one function that says which
//! [`FailureKind`] that is. The kinds are what a rollout test reads, so
//! the mapping from errors to kinds is made here and nowhere else.

use std::io;
use std::time::Duration;

use super::counts::{FailureKind, Step};
use crate::loadgen::dial::DialError;

/// Why a connection failed.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    /// The connection could not be opened: the name, connect(), or the
    /// header.
    #[error("opening the connection")]
    Open(#[from] DialError),
    /// Sending a message or reading its answer failed, or the peer closed
    /// before the whole answer.
    #[error("exchanging a message")]
    Exchange(#[source] io::Error),
    /// The answer differs from the message, or bytes came where the server
    /// should have closed.
    #[error("the answer is not the message's echo")]
    Wrong,
    /// Opening the connection, or an answer, took longer than `--timeout`.
    #[error("nothing within {0:?}")]
    Timeout(Duration),
}

impl Failure {
    /// The kind this failure is counted as.
    pub fn kind(&self) -> FailureKind {
        match self {
            Failure::Open(DialError::Resolve { .. } | DialError::NoAddress(_)) => {
                FailureKind::Resolve
            }
            Failure::Open(DialError::Timeout) | Failure::Timeout(_) => FailureKind::Timeout,
            // A socket that could not even be made is this host's trouble
            // (file descriptors, memory), not the path's.
            Failure::Open(DialError::Socket(_)) => FailureKind::Other,
            Failure::Open(
                DialError::Connect(error)
                | DialError::Header(error)
                | DialError::FirstExchange(error),
            )
            | Failure::Exchange(error) => kind_of_io(error.kind()),
            Failure::Wrong => FailureKind::Wrong,
        }
    }

    /// The step this failure came in; `in_progress` is the step the
    /// connection had reached, which only a timeout needs, since our timer
    /// does not know what it cut short.
    pub fn step(&self, in_progress: Step) -> Step {
        match self {
            Failure::Open(DialError::Resolve { .. } | DialError::NoAddress(_)) => Step::Resolve,
            Failure::Open(DialError::Socket(_) | DialError::Connect(_) | DialError::Timeout) => {
                Step::Connect
            }
            Failure::Open(DialError::Header(_) | DialError::FirstExchange(_))
            | Failure::Exchange(_)
            | Failure::Wrong => Step::Exchange,
            Failure::Timeout(_) => in_progress,
        }
    }
}

/// The kind an I/O error of a connection is counted as.
fn kind_of_io(kind: io::ErrorKind) -> FailureKind {
    use io::ErrorKind;
    match kind {
        ErrorKind::ConnectionRefused => FailureKind::Refused,
        // A write to a connection the peer reset fails with EPIPE; an
        // abort is the local stack's reset.
        ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted | ErrorKind::BrokenPipe => {
            FailureKind::Reset
        }
        // The kernel's own give-up: retransmissions or keepalives unanswered.
        ErrorKind::TimedOut => FailureKind::Timeout,
        // read_exact's EOF before the whole answer.
        ErrorKind::UnexpectedEof => FailureKind::Closed,
        ErrorKind::HostUnreachable | ErrorKind::NetworkUnreachable | ErrorKind::NetworkDown => {
            FailureKind::Unreachable
        }
        _ => FailureKind::Other,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn io(kind: io::ErrorKind) -> io::Error {
        io::Error::from(kind)
    }

    #[test]
    fn each_failure_has_the_kind_a_reader_expects() {
        use io::ErrorKind;
        let cases = [
            // Nothing listens, or the proxy refuses the connect.
            (
                Failure::Open(DialError::Connect(io(ErrorKind::ConnectionRefused))),
                FailureKind::Refused,
            ),
            // A proxy resets the connection while the header goes out.
            (
                Failure::Open(DialError::Header(io(ErrorKind::ConnectionReset))),
                FailureKind::Reset,
            ),
            // A write after the peer's reset.
            (
                Failure::Exchange(io(ErrorKind::BrokenPipe)),
                FailureKind::Reset,
            ),
            (
                Failure::Exchange(io(ErrorKind::ConnectionAborted)),
                FailureKind::Reset,
            ),
            // The answer cut short by a close.
            (
                Failure::Exchange(io(ErrorKind::UnexpectedEof)),
                FailureKind::Closed,
            ),
            (Failure::Wrong, FailureKind::Wrong),
            // Our timer, dial's connect timer, or the kernel's.
            (
                Failure::Timeout(Duration::from_secs(5)),
                FailureKind::Timeout,
            ),
            (Failure::Open(DialError::Timeout), FailureKind::Timeout),
            (
                Failure::Exchange(io(ErrorKind::TimedOut)),
                FailureKind::Timeout,
            ),
            (
                Failure::Open(DialError::Connect(io(ErrorKind::HostUnreachable))),
                FailureKind::Unreachable,
            ),
            (
                Failure::Open(DialError::Connect(io(ErrorKind::NetworkUnreachable))),
                FailureKind::Unreachable,
            ),
            // A name the resolver does not know, whatever error it gave.
            (
                Failure::Open(DialError::Resolve {
                    name: Arc::from("echo.soak"),
                    source: io::Error::other("Name or service not known"),
                }),
                FailureKind::Resolve,
            ),
            (
                Failure::Open(DialError::NoAddress(Arc::from("echo.soak"))),
                FailureKind::Resolve,
            ),
            // Out of file descriptors: this host's trouble.
            (
                Failure::Open(DialError::Socket(io::Error::from_raw_os_error(24))),
                FailureKind::Other,
            ),
            (
                Failure::Exchange(io(ErrorKind::InvalidData)),
                FailureKind::Other,
            ),
        ];
        for (failure, kind) in cases {
            assert_eq!(failure.kind(), kind, "{failure:?}");
        }
    }

    #[test]
    fn each_failure_names_the_step_it_came_in() {
        let cases = [
            // Our timer cut the lookup short: a DNS query unanswered.
            (
                Failure::Timeout(Duration::from_secs(5)),
                Step::Resolve,
                Step::Resolve,
            ),
            (
                Failure::Timeout(Duration::from_secs(5)),
                Step::Exchange,
                Step::Exchange,
            ),
            // The resolver's own answer, whatever step was recorded.
            (
                Failure::Open(DialError::NoAddress(Arc::from("echo.soak"))),
                Step::Exchange,
                Step::Resolve,
            ),
            (
                Failure::Open(DialError::Connect(io(io::ErrorKind::ConnectionRefused))),
                Step::Connect,
                Step::Connect,
            ),
            (
                Failure::Open(DialError::Timeout),
                Step::Connect,
                Step::Connect,
            ),
            (
                Failure::Open(DialError::Header(io(io::ErrorKind::ConnectionReset))),
                Step::Connect,
                Step::Exchange,
            ),
            (Failure::Wrong, Step::Exchange, Step::Exchange),
        ];
        for (failure, in_progress, step) in cases {
            assert_eq!(failure.step(in_progress), step, "{failure:?}");
        }
    }
}
