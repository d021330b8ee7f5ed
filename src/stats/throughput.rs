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

    /// Peak messages per second; None when the run was shorter than one window.
    pub fn peak_msgs_per_sec(&self) -> Option<f64> {
        (self.peak_msgs_per_ns > 0.0).then_some(self.peak_msgs_per_ns * 1e9)
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
}

impl ThroughputSummary {
    /// `peak_msgs_per_sec` falls back to the average when the run was too short for a window.
    pub fn new(size: u64, messages: u64, elapsed_ns: u64, peak_msgs_per_sec: Option<f64>) -> Self {
        let secs = elapsed_ns as f64 / 1e9;
        let msg_rate = if secs > 0.0 { messages as f64 / secs } else { 0.0 };
        let avg = msg_rate * size as f64;
        let peak = peak_msgs_per_sec.map_or(avg, |p| (p * size as f64).max(avg));
        ThroughputSummary {
            messages,
            bytes: messages * size,
            elapsed_ns,
            peak_bytes_per_sec: peak,
            avg_bytes_per_sec: avg,
            msg_rate_mpps: msg_rate / 1e6,
        }
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
        let p = m.peak_msgs_per_sec().unwrap();
        assert!((p - 1e7).abs() < 1.0, "peak {p}");
        let s = ThroughputSummary::new(64, 1000, 100_000, Some(p));
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
        let steady = m.peak_msgs_per_sec().unwrap();
        assert!((steady - 4e6).abs() < 1e3, "peak {steady}");
        // 40 completions reported at once (a moderated batch): at most 40/400 above the true rate
        t += 1;
        c += 40;
        m.observe(t, c);
        let p = m.peak_msgs_per_sec().unwrap();
        assert!(p <= 4e6 * 400.0 / 360.0 + 1.0, "peak {p}");
    }

    #[test]
    fn short_run_has_no_peak_and_falls_back_to_average() {
        let mut m = PeakMeter::new(1000);
        m.observe(10, 5);
        assert!(m.peak_msgs_per_sec().is_none());
        let s = ThroughputSummary::new(8, 5, 1000, m.peak_msgs_per_sec());
        assert_eq!(s.peak_bytes_per_sec, s.avg_bytes_per_sec);
    }
}
