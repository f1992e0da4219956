//! Text forms of configuration values that clap does not parse itself:
//! durations in Go's notation (as Istio's variables use), and the dedicated
//! workload's `namespace/name/service-account`.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

/// Why a configuration value is unacceptable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValueError {
    /// A required value is absent.
    #[error("required but not set")]
    Missing,
    /// The value is not one of the allowed words.
    #[error("{0:?} is not one of: {1}")]
    Choice(String, &'static str),
    /// A count that must be positive is zero.
    #[error("must be at least 1")]
    Zero,
    /// A duration did not parse.
    #[error("{0:?} is not a duration such as 300ms, 30s, 5m, 1h30m or 24h")]
    Duration(String),
    /// The value is outside what the setting can take.
    #[error("{0:?} is out of range: {1}")]
    Range(String, &'static str),
    /// The value is not an IP address.
    #[error("{0:?} is not an IP address")]
    Address(String),
    /// The workload is not `namespace/name/service-account`.
    #[error("{0:?} is not namespace/name/service-account")]
    WorkloadInfo(String),
    /// A document (a file, or a variable's text) cannot be read or does
    /// not parse as what it must be.
    #[error("{0}: {1}")]
    Document(String, String),
}

/// The workload a dedicated proxy serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadInfo {
    /// Kubernetes namespace.
    pub namespace: Arc<str>,
    /// Pod (workload) name.
    pub name: Arc<str>,
    /// Service account the workload runs as.
    pub service_account: Arc<str>,
}

impl FromStr for WorkloadInfo {
    type Err = ValueError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let invalid = || ValueError::WorkloadInfo(text.to_owned());
        let mut parts = text.split('/');
        let (Some(namespace), Some(name), Some(service_account), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(invalid());
        };
        if [namespace, name, service_account]
            .iter()
            .any(|part| part.is_empty())
        {
            return Err(invalid());
        }
        Ok(WorkloadInfo {
            namespace: namespace.into(),
            name: name.into(),
            service_account: service_account.into(),
        })
    }
}

/// Parses a duration in Go's notation as istio/ztunnel reads it: one or
/// more `<number><unit>` terms, each number with an optional fraction,
/// units `ns`, `us` (`µs`), `ms`, `s`, `m`, `h`, and `d` and `w` for days
/// and weeks, terms optionally apart by spaces: `5m0s`, `90s`, `1.5s`,
/// `1h 30m`. A bare number is seconds, as in
/// `TERMINATION_GRACE_PERIOD_SECONDS`.
pub fn parse_duration(text: &str) -> Result<Duration, ValueError> {
    let invalid = || ValueError::Duration(text.to_owned());
    if let Ok(seconds) = text.parse::<u64>() {
        return Ok(Duration::from_secs(seconds));
    }
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(invalid());
    }
    let mut nanos: u128 = 0;
    while !rest.is_empty() {
        let (term, tail) = duration_term(rest).ok_or_else(invalid)?;
        nanos = nanos.checked_add(term).ok_or_else(invalid)?;
        rest = tail.trim_start();
    }
    let seconds = u64::try_from(nanos / 1_000_000_000).map_err(|_| invalid())?;
    // The remainder of a division by 10^9 fits.
    let subsec = u32::try_from(nanos % 1_000_000_000).unwrap_or_default();
    Ok(Duration::new(seconds, subsec))
}

/// The nanoseconds of the `<number>[.<fraction>]<unit>` term `text` starts
/// with, and what follows it; `None` when it starts with no such term.
fn duration_term(text: &str) -> Option<(u128, &str)> {
    let whole_len = text.bytes().take_while(u8::is_ascii_digit).count();
    let (whole, tail) = text.split_at(whole_len);
    let (fraction, tail) = match tail.strip_prefix('.') {
        Some(after) => {
            let len = after.bytes().take_while(u8::is_ascii_digit).count();
            after.split_at(len)
        }
        None => ("", tail),
    };
    if whole.is_empty() && fraction.is_empty() {
        return None;
    }
    let unit_len = tail
        .char_indices()
        .find(|(_, c)| !(c.is_ascii_alphabetic() || *c == 'µ'))
        .map_or(tail.len(), |(index, _)| index);
    let (unit, tail) = tail.split_at(unit_len);
    let unit_nanos: u128 = match unit {
        "ns" => 1,
        "us" | "µs" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60 * 1_000_000_000,
        "h" => 3_600 * 1_000_000_000,
        "d" => 86_400 * 1_000_000_000,
        "w" => 7 * 86_400 * 1_000_000_000,
        _ => return None,
    };
    let whole: u128 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    // Digits past the nanosecond change nothing a timer can tell apart.
    let fraction = &fraction[..fraction.len().min(18)];
    let scale = 10u128.pow(u32::try_from(fraction.len()).ok()?);
    let fraction: u128 = if fraction.is_empty() {
        0
    } else {
        fraction.parse().ok()?
    };
    let nanos = whole
        .checked_mul(unit_nanos)?
        .checked_add(fraction.checked_mul(unit_nanos)? / scale)?;
    Some((nanos, tail))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        let good = [
            ("0", 0),
            ("30", 30_000),
            ("300ms", 300),
            ("45s", 45_000),
            ("5m", 300_000),
            ("5m0s", 300_000),
            ("1h30m", 5_400_000),
            ("24h", 86_400_000),
            ("2d", 172_800_000),
            ("1.5s", 1_500),
            ("1.5h", 5_400_000),
            (".5s", 500),
            ("0.25m", 15_000),
            ("1h 30m", 5_400_000),
            ("1000us", 1),
            ("2000000ns", 2),
            ("1w", 604_800_000),
        ];
        for (text, millis) in good {
            assert_eq!(
                parse_duration(text),
                Ok(Duration::from_millis(millis)),
                "{text}"
            );
        }
        assert_eq!(parse_duration("1µs"), Ok(Duration::from_micros(1)));
        for bad in [
            "",
            "s",
            "-1s",
            "5 m",
            "1.s.",
            ".s",
            "1.5",
            "5y",
            "99999999999999999999h",
            "1e3s",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn workload_info() {
        let info: WorkloadInfo = "ns/pod/sa".parse().unwrap();
        assert_eq!(
            (&*info.namespace, &*info.name, &*info.service_account),
            ("ns", "pod", "sa")
        );
        for bad in ["", "ns/pod", "ns/pod/sa/x", "ns//sa", "/pod/sa"] {
            assert_eq!(
                bad.parse::<WorkloadInfo>(),
                Err(ValueError::WorkloadInfo(bad.to_owned())),
                "{bad:?}"
            );
        }
    }
}
