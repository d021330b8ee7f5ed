//! A soak's intervals (`--interval` with `-D`): the kernel hands this the clock at each
//! completion (bandwidth) or sample (latency); at every interval's end it closes the
//! interval's figures, keeps them for the final document and passes them to the printer
//! (a bounded channel: the kernel never blocks on the terminal or a file).
//!
//! Cost on the hot path: a comparison per step, and with latency a second `record` into
//! the interval's own histogram; closing an interval (once per `--interval`) summarises
//! that histogram and resets it, allocating nothing.

use std::io::Write;
use std::sync::mpsc::SyncSender;
use std::thread::JoinHandle;

use crate::error::{Error, Result};
use crate::report::IntervalResult;
use crate::report::table::{self, Units};
use crate::signals;
use crate::stats::LatencyRecorder;

/// A soak's printer: each interval as a line where the table goes, and with
/// `--interval-log` as a JSON line (stdout with `-`), flushed as it ends. While it runs
/// the first Ctrl-C winds the run down (`signals`).
pub struct Printer {
    tx: SyncSender<IntervalResult>,
    thread: JoinHandle<()>,
}

impl Printer {
    pub fn start(log: Option<&str>, to_stderr: bool, units: Units) -> Result<Printer> {
        let mut log: Option<Box<dyn Write + Send>> = match log {
            None => None,
            Some("-") => Some(Box::new(std::io::stdout())),
            Some(path) => Some(Box::new(std::fs::File::create(path).map_err(|e| {
                Error::Usage(format!("--interval-log {path}: cannot create it: {e}; give a writable path"))
            })?)),
        };
        let (tx, rx) = std::sync::mpsc::sync_channel::<IntervalResult>(PRINT_BACKLOG);
        signals::soften();
        let thread = std::thread::spawn(move || {
            let mut out: Box<dyn Write> =
                if to_stderr { Box::new(std::io::stderr()) } else { Box::new(std::io::stdout()) };
            for record in rx {
                // Best effort: a closed terminal must not end the soak.
                let _ = table::interval_line(&mut out, &record, units).and_then(|()| out.flush());
                if let Some(log) = log.as_mut() {
                    let line = serde_json::to_string(&record).expect("serialisable") + "\n";
                    let _ = log.write_all(line.as_bytes()).and_then(|()| log.flush());
                }
            }
        });
        Ok(Printer { tx, thread })
    }

    /// For the kernels (through the run's options).
    pub fn sender(&self) -> SyncSender<IntervalResult> {
        self.tx.clone()
    }

    /// Waits until every interval sent is written; every other sender must be gone.
    pub fn finish(self) {
        drop(self.tx);
        let _ = self.thread.join();
    }
}

/// Intervals the printer may lag behind before the kernel drops lines for the terminal
/// (never from the final document).
pub const PRINT_BACKLOG: usize = 64;

pub struct Soak {
    every_ns: u64,
    /// The run's length: the interval that reaches it is closed by `finish`, with the
    /// run's last completions, so a run of -D 60 --interval 5 has 12 intervals.
    limit_ns: u64,
    /// Where the open interval started and must end, ns from the size's start.
    open_ns: u64,
    close_ns: u64,
    /// Messages completed when the open interval started (bandwidth).
    open_count: u64,
    size: u64,
    rail: Option<u32>,
    /// One-way (0.5) or round-trip (1.0) latency figures.
    scale: f64,
    samples: LatencyRecorder,
    records: Vec<IntervalResult>,
    printer: Option<SyncSender<IntervalResult>>,
}

impl Soak {
    /// For a run of `duration_ns` (the vector of records is sized for it up front).
    pub fn new(
        every_secs: f64,
        duration_secs: f64,
        size: u64,
        rail: Option<u32>,
        scale: f64,
        printer: Option<SyncSender<IntervalResult>>,
    ) -> Soak {
        let every_ns = (every_secs * 1e9) as u64;
        let limit_ns = (duration_secs * 1e9) as u64;
        Soak {
            every_ns,
            limit_ns,
            open_ns: 0,
            close_ns: Self::boundary(every_ns, limit_ns),
            open_count: 0,
            size,
            rail,
            scale,
            samples: LatencyRecorder::new(),
            records: Vec::with_capacity((duration_secs / every_secs).ceil() as usize + 2),
            printer,
        }
    }

    /// A latency sample taken `elapsed_ns` after the size's start.
    #[inline(always)]
    pub fn sample(&mut self, ns: u64, elapsed_ns: u64) {
        self.samples.record(ns);
        if elapsed_ns >= self.close_ns {
            self.close(elapsed_ns, self.samples.count());
        }
    }

    /// `completed` messages had completed `elapsed_ns` after the size's start.
    #[inline(always)]
    pub fn progress(&mut self, completed: u64, elapsed_ns: u64) {
        if elapsed_ns >= self.close_ns {
            self.close(elapsed_ns, completed - self.open_count);
            self.open_count = completed;
        }
    }

    #[cold]
    fn close(&mut self, now_ns: u64, iterations: u64) {
        let secs = (now_ns - self.open_ns) as f64 / 1e9;
        let latency = (self.samples.count() > 0).then(|| self.samples.summary(self.scale));
        let bandwidth = latency.is_none();
        let rate = |per_msg: f64| (bandwidth && secs > 0.0).then(|| iterations as f64 * per_msg / secs);
        let record = IntervalResult {
            size: self.size,
            rail: self.rail,
            start_s: self.open_ns as f64 / 1e9,
            end_s: now_ns as f64 / 1e9,
            iterations,
            gbps: rate(self.size as f64 * 8.0 / 1e9),
            mpps: rate(1e-6),
            latency,
        };
        if let Some(p) = &self.printer {
            // Full: the terminal is behind; the record stays in the document.
            let _ = p.try_send(record.clone());
        }
        self.records.push(record);
        self.samples.reset();
        self.open_ns = now_ns;
        // The next boundary after now: a stall longer than an interval gives one long
        // interval, not a run of empty ones.
        self.close_ns = Self::boundary((now_ns / self.every_ns + 1) * self.every_ns, self.limit_ns);
    }

    /// `next`, unless the run ends there: then only `finish` closes.
    fn boundary(next: u64, limit_ns: u64) -> u64 {
        if next < limit_ns { next } else { u64::MAX }
    }

    /// The intervals, the last one closed at `end_ns` if anything happened after the
    /// previous boundary (the run ended, or a Ctrl-C wound it down, mid-interval).
    pub fn finish(mut self, end_ns: u64, completed: Option<u64>) -> Vec<IntervalResult> {
        let rest = completed.map_or(self.samples.count(), |c| c - self.open_count);
        if end_ns > self.open_ns && rest > 0 {
            self.close(end_ns, rest);
        }
        self.records
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bandwidth_intervals_close_at_each_boundary_and_the_tail_is_kept() {
        let (tx, rx) = std::sync::mpsc::sync_channel(PRINT_BACKLOG);
        let mut s = Soak::new(1.0, 3.0, 1000, None, 1.0, Some(tx));
        s.progress(100, 500_000_000);
        s.progress(250, 1_000_000_000); // closes [0, 1 s): 250 messages
        s.progress(400, 1_900_000_000);
        s.progress(450, 2_500_000_000); // a stall: closes [1, 2.5 s) with 200
        s.progress(480, 3_000_000_000); // the run's end: left to finish
        let r = s.finish(3_010_000_000, Some(500));
        let spans: Vec<(f64, f64, u64)> = r.iter().map(|i| (i.start_s, i.end_s, i.iterations)).collect();
        assert_eq!(spans, [(0.0, 1.0, 250), (1.0, 2.5, 200), (2.5, 3.01, 50)]);
        assert!((r[0].gbps.unwrap() - 250.0 * 8000.0 / 1e9).abs() < 1e-12 && r[0].latency.is_none());
        assert_eq!(rx.try_iter().count(), 3, "the printer sees every interval, the tail too");
    }

    #[test]
    fn latency_intervals_have_their_own_percentiles() {
        let mut s = Soak::new(1.0, 2.0, 2, Some(1), 0.5, None);
        s.sample(10_000, 100);
        s.sample(10_000, 999_999_999);
        s.sample(40_000, 1_000_000_000); // closes the first with all three samples
        s.sample(40_000, 1_500_000_000);
        let r = s.finish(1_600_000_000, None);
        assert_eq!(r.len(), 2);
        assert_eq!((r[0].iterations, r[1].iterations, r[1].rail), (3, 1, Some(1)));
        assert!((r[1].latency.as_ref().unwrap().p50_ns - 20_000.0).abs() < 50.0, "one-way: half of 40 us");
        assert!(r[0].gbps.is_none());
    }
}
