//! The open-file limit, read from `/proc/self/limits`: the idle mode checks
//! that its connections fit before opening any. Raising the soft limit from
//! inside would need setrlimit(2), which std does not expose; the caller
//! raises it (`ulimit -n`) instead.

use std::io;

/// File descriptors the process needs besides its connections: stdio, the
/// runtime's epoll and wake-up descriptors, signal handling, with room to spare.
pub const RESERVED_FDS: u64 = 64;

/// The path the limits are read from.
const LIMITS_PATH: &str = "/proc/self/limits";

/// Why the connections asked for cannot be opened.
#[derive(Debug, thiserror::Error)]
pub enum LimitError {
    /// The soft limit is too low, but the hard limit would do: the caller
    /// can raise it without privileges.
    #[error(
        "{needed} open files are needed ({wanted} connections + {RESERVED_FDS}) but the soft \
         limit is {soft}; raise it first, e.g. `ulimit -n {needed}`"
    )]
    Soft {
        /// Connections asked for.
        wanted: u64,
        /// Descriptors needed in all.
        needed: u64,
        /// The current soft limit.
        soft: u64,
    },
    /// Even the hard limit is too low: raising it needs privileges.
    #[error(
        "{needed} open files are needed ({wanted} connections + {RESERVED_FDS}) but the hard \
         limit is {hard}; raise it as root (e.g. `prlimit --nofile`) or ask for fewer connections"
    )]
    Hard {
        /// Connections asked for.
        wanted: u64,
        /// Descriptors needed in all.
        needed: u64,
        /// The hard limit.
        hard: u64,
    },
}

/// The open-file limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFiles {
    /// The soft limit; `None` means unlimited.
    pub soft: Option<u64>,
    /// The hard limit; `None` means unlimited.
    pub hard: Option<u64>,
}

impl OpenFiles {
    /// Reads this process's limit. `Ok(None)` where `/proc` does not say.
    pub fn current() -> io::Result<Option<OpenFiles>> {
        Ok(OpenFiles::parse(&std::fs::read_to_string(LIMITS_PATH)?))
    }

    /// Parses the text of `/proc/<pid>/limits`.
    pub fn parse(limits: &str) -> Option<OpenFiles> {
        let line = limits
            .lines()
            .find_map(|line| line.strip_prefix("Max open files"))?;
        let mut fields = line.split_whitespace();
        let value = |field: &str| match field {
            "unlimited" => Some(None),
            number => number.parse().ok().map(Some),
        };
        let soft = value(fields.next()?)?;
        let hard = value(fields.next()?)?;
        Some(OpenFiles { soft, hard })
    }

    /// Checks that `connections` sockets fit under the soft limit.
    pub fn check(&self, connections: u64) -> Result<(), LimitError> {
        let needed = connections.saturating_add(RESERVED_FDS);
        match (self.soft, self.hard) {
            (Some(soft), _) if soft >= needed => Ok(()),
            (None, _) => Ok(()),
            (Some(_), Some(hard)) if hard < needed => Err(LimitError::Hard {
                wanted: connections,
                needed,
                hard,
            }),
            (Some(soft), _) => Err(LimitError::Soft {
                wanted: connections,
                needed,
                soft,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
Limit                     Soft Limit           Hard Limit           Units
Max cpu time              unlimited            unlimited            seconds
Max open files            1024                 524288               files
Max locked memory         8388608              8388608              bytes
";

    #[test]
    fn the_open_files_line_is_found() {
        assert_eq!(
            OpenFiles::parse(SAMPLE),
            Some(OpenFiles {
                soft: Some(1024),
                hard: Some(524288)
            })
        );
        assert_eq!(
            OpenFiles::parse("Max open files unlimited unlimited files\n"),
            Some(OpenFiles {
                soft: None,
                hard: None
            })
        );
        assert_eq!(OpenFiles::parse("Max cpu time 1 2 seconds\n"), None);
        assert_eq!(OpenFiles::parse("Max open files lots 2 files\n"), None);
    }

    #[test]
    fn connections_beyond_the_soft_limit_are_refused() {
        let limits = OpenFiles::parse(SAMPLE).unwrap();
        assert!(limits.check(1024 - RESERVED_FDS).is_ok());
        let err = limits.check(10_000).unwrap_err().to_string();
        assert!(err.contains("ulimit -n 10064"), "{err}");
        let err = limits.check(1_000_000).unwrap_err().to_string();
        assert!(err.contains("hard limit is 524288"), "{err}");
        let unlimited = OpenFiles {
            soft: None,
            hard: None,
        };
        assert!(unlimited.check(u64::MAX).is_ok());
    }

    #[test]
    fn this_process_has_a_readable_limit() {
        // Only Linux has /proc/self/limits; elsewhere there is nothing to check.
        if let Ok(Some(limits)) = OpenFiles::current() {
            assert!(limits.soft.unwrap_or(u64::MAX) >= 3);
        }
    }
}
