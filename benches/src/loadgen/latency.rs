//! Latency histograms: recording in nanoseconds, merging the per-connection
//! histograms, and the percentile summary the JSON reports carry.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// The longest latency recorded exactly: 100 s is above any run length the
/// harness uses, so only a stuck run saturates (and then shows as the max).
const HIGHEST_NS: u64 = 100_000_000_000;

/// Three significant digits: 0.1% resolution, enough to tell 20.0 µs from
/// 20.1 µs on loopback, at about 220 KiB per histogram for the 1 ns–100 s range.
const SIGNIFICANT_DIGITS: u8 = 3;

/// Why a histogram could not be built or merged. Neither happens with the
/// fixed bounds used here; the variants exist because the library's API can
/// report them.
#[derive(Debug, thiserror::Error)]
pub enum LatencyError {
    /// The histogram's bounds were refused.
    #[error("creating a latency histogram")]
    Create(#[from] hdrhistogram::CreationError),
    /// Two histograms could not be added together.
    #[error("merging latency histograms")]
    Merge(#[from] hdrhistogram::AdditionError),
}

/// A latency histogram with nanosecond resolution.
#[derive(Clone)]
pub struct Recorder {
    /// The samples, in nanoseconds.
    histogram: Histogram<u64>,
}

impl Recorder {
    /// An empty histogram. Build one and clone it per worker: cloning cannot fail.
    pub fn new() -> Result<Self, LatencyError> {
        Ok(Recorder {
            histogram: Histogram::new_with_bounds(1, HIGHEST_NS, SIGNIFICANT_DIGITS)?,
        })
    }

    /// Records one sample; samples above the range count as the range's top.
    pub fn record(&mut self, latency: Duration) {
        let nanos = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        self.histogram.saturating_record(nanos.max(1));
    }

    /// Adds another worker's samples to these.
    pub fn merge(&mut self, other: &Recorder) -> Result<(), LatencyError> {
        Ok(self.histogram.add(&other.histogram)?)
    }

    /// How many samples were recorded.
    pub fn count(&self) -> u64 {
        self.histogram.len()
    }

    /// The percentiles, in microseconds; all zero when nothing was recorded.
    pub fn summary(&self) -> Latency {
        let micros = |nanos: u64| nanos as f64 / 1000.0;
        if self.histogram.is_empty() {
            return Latency::default();
        }
        Latency {
            p50: micros(self.histogram.value_at_quantile(0.50)),
            p90: micros(self.histogram.value_at_quantile(0.90)),
            p99: micros(self.histogram.value_at_quantile(0.99)),
            p999: micros(self.histogram.value_at_quantile(0.999)),
            max: micros(self.histogram.max()),
            mean: self.histogram.mean() / 1000.0,
        }
    }
}

/// A latency distribution in microseconds, as the reports print it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// The largest sample.
    pub max: f64,
    /// The arithmetic mean.
    pub mean: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_come_out_in_microseconds() {
        let mut a = Recorder::new().unwrap();
        let mut b = a.clone();
        for micros in 1..=500 {
            a.record(Duration::from_micros(micros));
        }
        for micros in 501..=1000 {
            b.record(Duration::from_micros(micros));
        }
        a.merge(&b).unwrap();
        let latency = a.summary();
        assert_eq!(a.count(), 1000);
        assert!((latency.p50 - 500.0).abs() < 1.0, "{latency:?}");
        assert!((latency.p99 - 990.0).abs() < 1.0, "{latency:?}");
        assert!((latency.max - 1000.0).abs() < 1.0, "{latency:?}");
        assert!((latency.mean - 500.5).abs() < 1.0, "{latency:?}");
    }

    #[test]
    fn an_empty_histogram_reports_zeros() {
        assert_eq!(Recorder::new().unwrap().summary(), Latency::default());
    }

    #[test]
    fn samples_beyond_the_range_saturate() {
        let mut recorder = Recorder::new().unwrap();
        recorder.record(Duration::from_secs(1_000_000));
        recorder.record(Duration::ZERO);
        assert_eq!(recorder.count(), 2);
        assert!(recorder.summary().max >= 99_000_000.0);
    }
}
