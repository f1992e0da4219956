//! `/debug/pprof/profile`: a CPU profile of the whole process in pprof's
//! protobuf format (uncompressed), as istio/ztunnel serves it, so that
//! `go tool pprof` reads it. Sampling is pprof-rs's (SIGPROF at the asked
//! frequency); this module parses the request, runs one profile at a time
//! on a blocking thread, and encodes the report. Heap profiles are
//! `memory/heap_profile.rs`'s.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use pprof::protos::Message;

use super::{AdminError, query_value};

/// Seconds a profile lasts when the request does not say.
const DEFAULT_SECONDS: u64 = 10;
/// The longest profile: longer ones are refused rather than hold a thread.
const MAX_SECONDS: u64 = 300;
/// Samples per second when the request does not say.
const DEFAULT_FREQUENCY: u32 = 100;
/// The highest sampling frequency: above it the signal handler itself
/// becomes the load being measured.
const MAX_FREQUENCY: u32 = 1000;

/// Libraries whose frames are not unwound from the signal handler: the
/// unwinder can deadlock inside them (pprof-rs's advice).
const BLOCKLIST: [&str; 4] = ["libc", "libgcc", "pthread", "vdso"];

/// Set while a profile runs: the profiler is process-wide.
static RUNNING: AtomicBool = AtomicBool::new(false);

/// What `/debug/pprof/profile` was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProfileRequest {
    /// How long to sample.
    pub duration: Duration,
    /// Samples per second.
    pub frequency: u32,
}

/// Why a profile could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// Another profile is running; the profiler is one per process.
    #[error("a profile is already being taken; try again when it ends")]
    Busy,
    /// The profiler failed to start or to build its report.
    #[error("profiler")]
    Profiler(#[from] pprof::Error),
    /// The profiling thread ended without an answer.
    #[error("the profiling thread failed")]
    Thread(#[from] tokio::task::JoinError),
}

/// Parses `seconds` (1–300, default 10) and `frequency` (1–1000, default
/// 100) from the query string.
pub fn parse_request(query: &str) -> Result<ProfileRequest, AdminError> {
    let seconds = bounded(query, "seconds", DEFAULT_SECONDS, MAX_SECONDS)?;
    let frequency = bounded(
        query,
        "frequency",
        DEFAULT_FREQUENCY.into(),
        MAX_FREQUENCY.into(),
    )?;
    Ok(ProfileRequest {
        duration: Duration::from_secs(seconds),
        // `bounded` kept it at most MAX_FREQUENCY.
        frequency: u32::try_from(frequency).unwrap_or(MAX_FREQUENCY),
    })
}

/// The value of `key`, a whole number from 1 to `max`, or `default`.
fn bounded(query: &str, key: &'static str, default: u64, max: u64) -> Result<u64, AdminError> {
    match query_value(query, key)? {
        None => Ok(default),
        Some(text) => text
            .parse::<u64>()
            .ok()
            .filter(|value| (1..=max).contains(value))
            .ok_or(AdminError::OutOfRange { key, max }),
    }
}

/// Samples the process for `request.duration` and returns the encoded
/// pprof profile. Runs on a blocking thread; one at a time.
pub async fn cpu_profile(request: ProfileRequest) -> Result<Vec<u8>, ProfileError> {
    if RUNNING.swap(true, Ordering::AcqRel) {
        return Err(ProfileError::Busy);
    }
    let result = tokio::task::spawn_blocking(move || sample(request)).await;
    RUNNING.store(false, Ordering::Release);
    result?
}

fn sample(request: ProfileRequest) -> Result<Vec<u8>, ProfileError> {
    let frequency = i32::try_from(request.frequency).unwrap_or(i32::MAX);
    let guard = pprof::ProfilerGuardBuilder::default()
        .frequency(frequency)
        .blocklist(&BLOCKLIST)
        .build()?;
    std::thread::sleep(request.duration);
    let profile = guard.report().build()?.pprof()?;
    Ok(profile.encode_to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_and_frequency_are_bounded_as_istios() {
        let ok = |seconds, frequency| {
            Ok(ProfileRequest {
                duration: Duration::from_secs(seconds),
                frequency,
            })
        };
        let table = [
            ("", ok(10, 100)),
            ("seconds=1", ok(1, 100)),
            ("seconds=300&frequency=1000", ok(300, 1000)),
            ("frequency=1", ok(10, 1)),
            (
                "seconds=0",
                Err(AdminError::OutOfRange {
                    key: "seconds",
                    max: 300,
                }),
            ),
            (
                "seconds=301",
                Err(AdminError::OutOfRange {
                    key: "seconds",
                    max: 300,
                }),
            ),
            (
                "seconds=ten",
                Err(AdminError::OutOfRange {
                    key: "seconds",
                    max: 300,
                }),
            ),
            (
                "seconds=-1",
                Err(AdminError::OutOfRange {
                    key: "seconds",
                    max: 300,
                }),
            ),
            (
                "frequency=1001",
                Err(AdminError::OutOfRange {
                    key: "frequency",
                    max: 1000,
                }),
            ),
            ("seconds=%zz", Err(AdminError::MalformedQuery)),
        ];
        for (query, expected) in table {
            assert_eq!(parse_request(query), expected, "{query}");
        }
    }
}
