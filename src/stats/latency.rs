//! Latency samples: an HDR histogram for percentiles (3 significant digits) plus exact
//! running min, max, sum and sum of squares, so the reported max is the true max and the
//! mean and stdev are not bucketed. perftest drops the top samples and reports a trimmed
//! max; we keep every sample.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Highest value the histogram tracks: one hour in nanoseconds. Larger samples are
/// clamped for the percentiles but still counted exactly in max/mean.
const HIGHEST_TRACKABLE_NS: u64 = 3_600_000_000_000;
const SIGNIFICANT_DIGITS: u8 = 3;

pub struct LatencyRecorder {
    hist: Histogram<u64>,
    count: u64,
    min: u64,
    max: u64,
    sum: u128,
    sum_sq: f64,
}

impl LatencyRecorder {
    pub fn new() -> Self {
        let hist = Histogram::new_with_bounds(1, HIGHEST_TRACKABLE_NS, SIGNIFICANT_DIGITS)
            .expect("static histogram bounds are valid");
        LatencyRecorder { hist, count: 0, min: u64::MAX, max: 0, sum: 0, sum_sq: 0.0 }
    }

    /// Records one sample in nanoseconds. Allocation-free: the histogram's range is fixed.
    #[inline]
    pub fn record(&mut self, ns: u64) {
        self.hist.saturating_record(ns.max(1));
        self.count += 1;
        self.min = self.min.min(ns);
        self.max = self.max.max(ns);
        self.sum += ns as u128;
        let v = ns as f64;
        self.sum_sq += v * v;
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    /// Forgets every sample, keeping the histogram's memory (a soak's next interval).
    pub fn reset(&mut self) {
        self.hist.reset();
        (self.count, self.min, self.max, self.sum, self.sum_sq) = (0, u64::MAX, 0, 0, 0.0);
    }

    /// Adds another recorder's samples (rails measured side by side, as one distribution).
    pub fn merge(&mut self, other: &LatencyRecorder) {
        if other.count == 0 {
            return;
        }
        self.hist.add(&other.hist).expect("recorders share the histogram's fixed bounds");
        self.count += other.count;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
        self.sum += other.sum;
        self.sum_sq += other.sum_sq;
    }

    pub fn histogram(&self) -> &Histogram<u64> {
        &self.hist
    }

    /// Summarises the samples, each multiplied by `scale` (0.5 turns a round trip into
    /// the one-way figure that write and send latency report).
    pub fn summary(&self, scale: f64) -> LatencySummary {
        if self.count == 0 {
            return LatencySummary::default();
        }
        let n = self.count as f64;
        let mean = self.sum as f64 / n;
        let var = (self.sum_sq / n - mean * mean).max(0.0);
        // A bucket's highest equivalent value can exceed the exact extremes: clamp to them.
        let q = |p: f64| self.hist.value_at_quantile(p).clamp(self.min, self.max) as f64 * scale;
        LatencySummary {
            samples: self.count,
            min_ns: self.min as f64 * scale,
            p50_ns: q(0.50),
            p90_ns: q(0.90),
            p99_ns: q(0.99),
            p999_ns: q(0.999),
            p9999_ns: q(0.9999),
            max_ns: self.max as f64 * scale,
            avg_ns: mean * scale,
            stdev_ns: var.sqrt() * scale,
        }
    }
}

impl Default for LatencyRecorder {
    fn default() -> Self {
        Self::new()
    }
}

/// A latency distribution in nanoseconds. Percentiles come from the histogram (within
/// 0.1 %); min, max, avg and stdev are exact.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencySummary {
    pub samples: u64,
    pub min_ns: f64,
    pub p50_ns: f64,
    pub p90_ns: f64,
    pub p99_ns: f64,
    pub p999_ns: f64,
    pub p9999_ns: f64,
    pub max_ns: f64,
    pub avg_ns: f64,
    pub stdev_ns: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_recorders_are_one_distribution() {
        let (mut a, mut b, mut both) = (LatencyRecorder::new(), LatencyRecorder::new(), LatencyRecorder::new());
        for v in 1..=100u64 {
            a.record(v * 1000);
            both.record(v * 1000);
        }
        for v in 101..=300u64 {
            b.record(v * 1000);
            both.record(v * 1000);
        }
        a.merge(&b);
        a.merge(&LatencyRecorder::new());
        assert_eq!(a.summary(1.0), both.summary(1.0));
        assert_eq!(a.count(), 300);
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= b.abs() * 0.001 + 1e-9
    }

    #[test]
    fn known_samples_give_exact_moments_and_percentiles() {
        let mut r = LatencyRecorder::new();
        for v in 1..=1000u64 {
            r.record(v * 1000); // 1 us .. 1 ms
        }
        let s = r.summary(1.0);
        assert_eq!(s.samples, 1000);
        assert_eq!(s.min_ns, 1000.0);
        assert_eq!(s.max_ns, 1_000_000.0);
        assert!(close(s.avg_ns, 500_500.0), "avg {}", s.avg_ns);
        // population stdev of 1..=1000 scaled by 1000
        assert!(close(s.stdev_ns, 288_674.99), "stdev {}", s.stdev_ns);
        assert!(close(s.p50_ns, 500_000.0), "p50 {}", s.p50_ns);
        assert!(close(s.p90_ns, 900_000.0), "p90 {}", s.p90_ns);
        assert!(close(s.p99_ns, 990_000.0), "p99 {}", s.p99_ns);
        assert!(close(s.p999_ns, 999_000.0), "p999 {}", s.p999_ns);
    }

    #[test]
    fn true_max_survives_an_outlier() {
        let mut r = LatencyRecorder::new();
        for _ in 0..10_000 {
            r.record(2_000);
        }
        r.record(123_456_789);
        let s = r.summary(1.0);
        assert_eq!(s.max_ns, 123_456_789.0, "max is exact, not bucketed nor trimmed");
        assert_eq!(s.p50_ns, 2_000.0);
        assert_eq!(s.p9999_ns, 2_000.0);
    }

    #[test]
    fn scale_halves_round_trips() {
        let mut r = LatencyRecorder::new();
        r.record(10_000);
        r.record(30_000);
        let s = r.summary(0.5);
        assert_eq!(s.min_ns, 5_000.0);
        assert_eq!(s.max_ns, 15_000.0);
        assert_eq!(s.avg_ns, 10_000.0);
        assert_eq!(s.stdev_ns, 5_000.0);
    }

    #[test]
    fn empty_recorder_summarises_to_zeroes() {
        assert_eq!(LatencyRecorder::new().summary(1.0), LatencySummary::default());
    }
}
