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

/// Parses a duration in Go's notation: one or more `<number><unit>` terms
/// with units `ms`, `s`, `m`, `h` (and `d` for days), e.g. `5m0s` or `90s`.
/// A bare number is seconds, as in `TERMINATION_GRACE_PERIOD_SECONDS`.
pub fn parse_duration(text: &str) -> Result<Duration, ValueError> {
    let invalid = || ValueError::Duration(text.to_owned());
    if let Ok(seconds) = text.parse::<u64>() {
        return Ok(Duration::from_secs(seconds));
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    if rest.is_empty() {
        return Err(invalid());
    }
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let (number, tail) = rest.split_at(digits);
        let number: u64 = number.parse().map_err(|_| invalid())?;
        let unit_len = tail.bytes().take_while(u8::is_ascii_alphabetic).count();
        let (unit, tail) = tail.split_at(unit_len);
        let term = match unit {
            "ms" => Duration::from_millis(number),
            "s" => Duration::from_secs(number),
            "m" => Duration::from_secs(number.checked_mul(60).ok_or_else(invalid)?),
            "h" => Duration::from_secs(number.checked_mul(3600).ok_or_else(invalid)?),
            "d" => Duration::from_secs(number.checked_mul(86_400).ok_or_else(invalid)?),
            _ => return Err(invalid()),
        };
        total = total.checked_add(term).ok_or_else(invalid)?;
        rest = tail;
    }
    Ok(total)
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
        ];
        for (text, millis) in good {
            assert_eq!(
                parse_duration(text),
                Ok(Duration::from_millis(millis)),
                "{text}"
            );
        }
        for bad in ["", "s", "-1s", "5 m", "1.5h", "5w", "99999999999999999999h"] {
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
