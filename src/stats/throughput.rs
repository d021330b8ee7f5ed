//! Throughput: the average over the whole run and the peak over a sliding window.
//!
//! The peak is the best rate over any span of at least `window_msgs` completed messages,
//! measured between two completion polls. perftest instead searches all pairs of
//! post/completion timestamps (quadratic, and noisy for short spans); a window of many
//! completion batches keeps the peak a sustainable rate: a batch of B completions seen in
//! one poll can lift the peak of a W-message window by at most a factor W / (W - B).

use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// Bytes per "MB" in perftest's MB/sec column (it divides by 0x100000).
pub const BYTES_PER_MB: f64 = 1_048_576.0;
/// Bytes per second in one Gb/s (perftest's --report_gbits divides by 125000000).
pub const BYTES_PER_GBIT: f64 = 125_000_000.0;

/// Tracks the best rate over windows of at least `window_msgs` messages.
pub struct PeakMeter {
    window_msgs: u64,
    points: VecDeque<(u64, u64)>, // (time ns since start, completed messages)
    peak_msgs_per_ns: f64,
}

impl PeakMeter {
    pub fn new(window_msgs: u64) -> Self {
        let window_msgs = window_msgs.max(1);
        PeakMeter {
            window_msgs,
            // Bounded: each point adds at least one message, and points older than one
            // window are dropped, so this never grows past the window (no allocation later).
            points: VecDeque::with_capacity(window_msgs as usize + 2),
            peak_msgs_per_ns: 0.0,
        }
    }

    /// Records that `completed` messages had completed at `t_ns`.
    #[inline]
    pub fn observe(&mut self, t_ns: u64, completed: u64) {
        if self.points.back().is_some_and(|&(_, c)| c == completed) {
            return;
        }
        while self.points.len() >= 2 && completed - self.points[1].1 >= self.window_msgs {
            self.points.pop_front();
        }
        if self.points.len() == self.points.capacity() {
            self.points.pop_front();
        }
        if let Some(&(t0, c0)) = self.points.front() {
            let msgs = completed - c0;
            if msgs >= self.window_msgs && t_ns > t0 {
                let rate = msgs as f64 / (t_ns - t0) as f64;
                if rate > self.peak_msgs_per_ns {
                    self.peak_msgs_per_ns = rate;
                }
            }
        }
        self.points.push_back((t_ns, completed));
    }

    /// What the meter found.
    pub fn peak(&self) -> Peak {
        Peak {
            msgs_per_sec: (self.peak_msgs_per_ns > 0.0).then_some(self.peak_msgs_per_ns * 1e9),
            window_msgs: self.window_msgs,
        }
    }
}

/// A peak rate and the window it was measured over.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Peak {
    /// The best rate over any window; None when the run held no complete window beyond
    /// its first completion (it was no longer than one window), so there is no peak to tell
    /// from the average.
    pub msgs_per_sec: Option<f64>,
    pub window_msgs: u64,
}

impl Peak {
    /// Peaks of lanes that ran side by side add up; the sum is a measured peak only if
    /// every lane's was (otherwise it is the sum of averages and says so).
    pub fn sum(peaks: impl IntoIterator<Item = (Peak, f64)>) -> Peak {
        let mut total = Peak { msgs_per_sec: Some(0.0), window_msgs: 0 };
        for (p, avg_msgs_per_sec) in peaks {
            total.window_msgs += p.window_msgs;
            total.msgs_per_sec = match (total.msgs_per_sec, p.msgs_per_sec) {
                (Some(t), Some(r)) => Some(t + r.max(avg_msgs_per_sec)),
                _ => None,
            };
        }
        total
    }
}

/// What a bandwidth run moved and how fast.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ThroughputSummary {
    pub messages: u64,
    pub bytes: u64,
    pub elapsed_ns: u64,
    pub peak_bytes_per_sec: f64,
    pub avg_bytes_per_sec: f64,
    pub msg_rate_mpps: f64,
    /// Completed messages in the window the peak is the best rate over (0: not recorded,
    /// as in documents from before this field).
    #[serde(default)]
    pub peak_window_messages: u64,
    /// The run was no longer than one peak window, so the peak is the average.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub peak_is_average: bool,
}

impl ThroughputSummary {
    /// Without a measured peak (a run no longer than one window), the peak is the average
    /// and `peak_is_average` says so.
    pub fn new(size: u64, messages: u64, elapsed_ns: u64, peak: Peak) -> Self {
        let secs = elapsed_ns as f64 / 1e9;
        let msg_rate = if secs > 0.0 { messages as f64 / secs } else { 0.0 };
        let avg = msg_rate * size as f64;
        let peak_bytes = peak.msgs_per_sec.map_or(avg, |p| (p * size as f64).max(avg));
        ThroughputSummary {
            messages,
            bytes: messages * size,
            elapsed_ns,
            peak_bytes_per_sec: peak_bytes,
            avg_bytes_per_sec: avg,
            msg_rate_mpps: msg_rate / 1e6,
            peak_window_messages: peak.window_msgs,
            peak_is_average: peak.msgs_per_sec.is_none(),
        }
    }

    /// Parts that ran side by side (threads, rails) as one: every message over the longest
    /// part's time; peaks add up.
    pub fn side_by_side(size: u64, parts: &[ThroughputSummary]) -> ThroughputSummary {
        let messages: u64 = parts.iter().map(|t| t.messages).sum();
        let elapsed = parts.iter().map(|t| t.elapsed_ns).max().unwrap_or(0);
        let peak = Peak::sum(parts.iter().map(ThroughputSummary::peak));
        ThroughputSummary::new(size, messages, elapsed, peak)
    }

    /// This summary's peak, to combine with others ([`Peak::sum`]).
    pub fn peak(&self) -> (Peak, f64) {
        let size = (self.bytes / self.messages.max(1)).max(1) as f64;
        let avg_msgs = self.avg_bytes_per_sec / size;
        let measured = (!self.peak_is_average).then_some(self.peak_bytes_per_sec / size);
        (Peak { msgs_per_sec: measured, window_msgs: self.peak_window_messages }, avg_msgs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steady_rate_gives_peak_equal_to_average() {
        let mut m = PeakMeter::new(100);
        for i in 0..=100u64 {
            m.observe(i * 1000, i * 10); // 10 msgs per us
        }
        let p = m.peak().msgs_per_sec.unwrap();
        assert!((p - 1e7).abs() < 1.0, "peak {p}");
        let s = ThroughputSummary::new(64, 1000, 100_000, m.peak());
        assert!(!s.peak_is_average);
        assert_eq!(s.peak_window_messages, 100);
        assert_eq!(s.bytes, 64_000);
        assert!((s.avg_bytes_per_sec - 6.4e8).abs() < 1.0);
        assert!((s.peak_bytes_per_sec - 6.4e8).abs() < 1.0);
        assert!((s.msg_rate_mpps - 10.0).abs() < 1e-9);
    }

    #[test]
    fn peak_finds_the_fast_stretch_and_a_burst_moves_it_by_at_most_burst_over_window() {
        let mut m = PeakMeter::new(400);
        let mut t = 0;
        let mut c = 0;
        // slow: 1 msg/us for 1000 msgs, in batches of 10
        for _ in 0..100 {
            t += 10_000;
            c += 10;
            m.observe(t, c);
        }
        // fast: 4 msgs/us for 800 msgs
        for _ in 0..80 {
            t += 2_500;
            c += 10;
            m.observe(t, c);
        }
        let steady = m.peak().msgs_per_sec.unwrap();
        assert!((steady - 4e6).abs() < 1e3, "peak {steady}");
        // 40 completions reported at once (a moderated batch): at most 40/400 above the true rate
        t += 1;
        c += 40;
        m.observe(t, c);
        let p = m.peak().msgs_per_sec.unwrap();
        assert!(p <= 4e6 * 400.0 / 360.0 + 1.0, "peak {p}");
    }

    #[test]
    fn short_run_has_no_peak_falls_back_to_average_and_says_so() {
        let mut m = PeakMeter::new(1000);
        for i in 1..=10 {
            m.observe(i * 100, i * 100); // 1000 messages in batches of 100: one window at most
        }
        assert!(m.peak().msgs_per_sec.is_none());
        let s = ThroughputSummary::new(8, 1000, 1000, m.peak());
        assert_eq!(s.peak_bytes_per_sec, s.avg_bytes_per_sec);
        assert!(s.peak_is_average);
        assert_eq!(s.peak_window_messages, 1000);
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["peak_is_average"], true);
        let measured = ThroughputSummary::new(8, 1000, 1000, Peak { msgs_per_sec: Some(2e9), window_msgs: 10 });
        assert!(serde_json::to_value(&measured).unwrap().get("peak_is_average").is_none(), "omitted when false");
    }

    #[test]
    fn peaks_of_lanes_add_up_and_stay_averages_if_any_lane_had_no_window() {
        let a = ThroughputSummary::new(64, 1000, 1_000_000, Peak { msgs_per_sec: Some(2e9), window_msgs: 100 });
        let b = ThroughputSummary::new(64, 1000, 1_000_000, Peak { msgs_per_sec: Some(3e9), window_msgs: 100 });
        let sum = Peak::sum([a.peak(), b.peak()]);
        assert_eq!(sum.window_msgs, 200);
        assert!((sum.msgs_per_sec.unwrap() - 5e9).abs() < 1.0, "{sum:?}");
        let short = ThroughputSummary::new(64, 1000, 1_000_000, Peak { msgs_per_sec: None, window_msgs: 2000 });
        assert_eq!(Peak::sum([a.peak(), short.peak()]).msgs_per_sec, None);
    }
}
