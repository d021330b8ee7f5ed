//! Several rails in one run: each rail is a session of its own (its own control
//! connection, device, QPs and pinned thread), so every kernel runs per rail unchanged.
//! The [`Conductor`] decides when each rail may take its next step (all at once, or one
//! rail after another), collects what they measured, and lets a failed rail drop out
//! while the others go on. [`aggregate`] turns the rails' results into the run's total.

use std::collections::BTreeMap;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::report::{Environment, LatencyResult, RailResult, RunResult, SizeResult, rail_label};
use crate::session::Channel;
use crate::signals;
use crate::spec::rails::RailMode;
use crate::stats::{LatencyRecorder, ThroughputSummary};

/// How often a waiting rail looks at signals and keeps its session alive.
const TICK: Duration = Duration::from_millis(20);
/// How often the printing thread wakes while it waits for the rails: every rail completes
/// or fails each step within its own deadlines and says so, so this is only a backstop;
/// rarely, because a wake-up on a measuring rail's CPU is noise in its samples.
const PRINTER_TICK: Duration = Duration::from_secs(1);

/// A rail's steps, in order: `PREPARE` (open the device, create QPs), `CONNECT` (session and
/// QPs connected), then one step per size (`first_size() + k`), then the report.
pub const PREPARE: usize = 0;
pub const CONNECT: usize = 1;

pub fn size_step(k: usize) -> usize {
    2 + k
}

/// What one rail has done so far.
#[derive(Default)]
pub struct RailState {
    /// Steps completed.
    pub done: usize,
    pub error: Option<Error>,
    pub environment: Option<Environment>,
    pub device: String,
    pub peer_device: String,
    pub cpus: Vec<usize>,
    pub results: Vec<SizeResult>,
    /// Latency samples per size, kept to merge into the aggregate.
    pub samples: Vec<Option<LatencyRecorder>>,
}

pub struct State {
    pub rails: Vec<RailState>,
    /// A failure that ends every rail (bad flags before any traffic: they are the same for
    /// all; or the client's own failure to report).
    pub stop: Option<Error>,
    /// The whole run, once every rail is done: each rail sends it to its server.
    pub report: Option<RunResult>,
}

pub struct Conductor {
    mode: RailMode,
    state: Mutex<State>,
    changed: Condvar,
}

impl Conductor {
    pub fn new(devices: &[String], cpus: &[Vec<usize>], mode: RailMode) -> Conductor {
        let rails = devices
            .iter()
            .zip(cpus)
            .map(|(d, c)| RailState { device: d.clone(), cpus: c.clone(), ..Default::default() })
            .collect();
        Conductor { mode, state: Mutex::new(State { rails, stop: None, report: None }), changed: Condvar::new() }
    }

    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records a finished step of rail `i` (with what it produced, through `update`).
    pub fn complete(&self, i: usize, update: impl FnOnce(&mut RailState)) {
        let mut s = self.lock();
        update(&mut s.rails[i]);
        s.rails[i].done += 1;
        self.changed.notify_all();
    }

    /// Rail `i` failed: it drops out, the others go on without waiting for it.
    pub fn fail(&self, i: usize, e: Error) {
        let mut s = self.lock();
        if matches!(e, Error::Usage(_)) && s.rails[i].done == PREPARE {
            s.stop.get_or_insert(e.clone());
        }
        s.rails[i].error.get_or_insert(e);
        self.changed.notify_all();
    }

    fn may_start(&self, s: &State, i: usize, step: usize) -> bool {
        let live = |j: usize| s.rails[j].error.is_none();
        let all_done = (0..s.rails.len()).all(|j| !live(j) || s.rails[j].done >= step);
        let earlier_done =
            self.mode == RailMode::Concurrent || step <= CONNECT || (0..i).all(|j| !live(j) || s.rails[j].done > step);
        all_done && earlier_done
    }

    /// Waits until rail `i` may start `step`: every live rail has finished the step before
    /// it and, one rail at a time, the rails before `i` have finished this one. While it
    /// waits, the rail's peer is watched (its silence ends the wait).
    pub fn wait_turn(&self, i: usize, step: usize, chan: Option<&mut Channel>) -> Result<()> {
        self.wait_for(chan, |s| self.may_start(s, i, step).then_some(()))
    }

    /// Waits until `ready` gives a value, or a stop ends every rail; looks at signals and
    /// watches `chan`'s peer while it waits.
    fn wait_for<T>(&self, mut chan: Option<&mut Channel>, ready: impl Fn(&State) -> Option<T>) -> Result<T> {
        loop {
            {
                let s = self.lock();
                if let Some(e) = &s.stop {
                    return Err(e.clone());
                }
                if let Some(v) = ready(&s) {
                    return Ok(v);
                }
                let _ = self.changed.wait_timeout(s, TICK);
            }
            signals::check()?;
            if let Some(c) = chan.as_deref_mut() {
                // The rail's keepalive speaks for it; here the peer's silence is looked at
                // (a message it sent early is kept for the rail's next read).
                c.watch("the other rails")?;
            }
        }
    }

    /// Ends every rail at its next wait.
    pub fn halt(&self, e: Error) {
        self.lock().stop.get_or_insert(e);
        self.changed.notify_all();
    }

    /// The finished run, for the rails to report.
    pub fn publish(&self, run: RunResult) {
        self.lock().report = Some(run);
        self.changed.notify_all();
    }

    /// Waits (keeping the session alive) until the run is published.
    pub fn wait_report(&self, chan: &mut Channel) -> Result<RunResult> {
        self.wait_for(Some(chan), |s| s.report.clone())
    }

    /// Waits until every rail has finished `step` or failed, and returns the state.
    pub fn wait_all(&self, step: usize) -> MutexGuard<'_, State> {
        let mut s = self.lock();
        while !s.rails.iter().all(|r| r.error.is_some() || r.done > step) {
            s = self.changed.wait_timeout(s, PRINTER_TICK).map(|(g, _)| g).unwrap_or_else(|p| p.into_inner().0);
        }
        s
    }
}

impl State {
    /// Each rail as reported: what it measured and why it stopped.
    pub fn rail_results(&self) -> Vec<RailResult> {
        self.rails
            .iter()
            .enumerate()
            .map(|(i, r)| RailResult {
                rail: i as u32,
                device: r.device.clone(),
                peer_device: r.peer_device.clone(),
                numa_node: r.environment.as_ref().and_then(|e| e.nic.numa_node),
                cpus: r.cpus.clone(),
                environment: r.environment.clone(),
                results: r.results.clone(),
                error: r.error.as_ref().map(Error::message),
            })
            .collect()
    }

    /// The first failed rail's error, naming the rail when there are several.
    pub fn first_error(&self) -> Option<Error> {
        let many = self.rails.len() > 1;
        self.rails.iter().enumerate().find_map(|(i, r)| {
            r.error.as_ref().map(|e| match many {
                true => e.clone().context(&rail_label(i as u32, &r.device, &r.peer_device)),
                false => e.clone(),
            })
        })
    }
}

/// The run's total for size index `k` over the rails that measured it: messages, bytes and
/// rates add up, latency samples merge into one distribution.
pub fn aggregate(rails: &[&SizeResult], samples: &[Option<&LatencyRecorder>]) -> Option<SizeResult> {
    let first = rails.first()?;
    let sum = |f: fn(&SizeResult) -> u64| rails.iter().map(|r| f(r)).sum::<u64>();
    let throughput = |f: fn(&SizeResult) -> Option<&ThroughputSummary>| -> Option<ThroughputSummary> {
        let parts: Vec<ThroughputSummary> = rails.iter().filter_map(|r| f(r).cloned()).collect();
        (parts.len() == rails.len()).then(|| ThroughputSummary::side_by_side(first.size, &parts))
    };
    let latency = first.latency.as_ref().map(|l| {
        let mut merged = LatencyRecorder::new();
        for s in samples.iter().flatten() {
            merged.merge(s);
        }
        let scale = if l.kind == "one_way" { 0.5 } else { 1.0 };
        LatencyResult { summary: merged.summary(scale), ..l.clone() }
    });
    let delivered = rails
        .iter()
        .any(|r| r.delivered.is_some())
        .then(|| rails.iter().map(|r| r.delivered.unwrap_or(r.iterations)).sum());
    Some(SizeResult {
        size: first.size,
        iterations: sum(|r| r.iterations),
        bytes: sum(|r| r.bytes),
        duration_ns: rails.iter().map(|r| r.duration_ns).max().unwrap_or(0),
        latency,
        bandwidth: throughput(|r| r.bandwidth.as_ref()),
        per_thread: Vec::new(),
        reverse_bandwidth: throughput(|r| r.reverse_bandwidth.as_ref()),
        data_validated: rails.iter().all(|r| r.data_validated),
        cpu_util_pct: first.cpu_util_pct,
        peer_cpu_util_pct: first.peer_cpu_util_pct,
        delivered,
        counters: add_counters(rails.iter().map(|r| r.counters.as_ref())),
        peer_counters: add_counters(rails.iter().map(|r| r.peer_counters.as_ref())),
        // Each rail's intervals, named by rail: they are not aligned to add up.
        intervals: rails.iter().flat_map(|r| r.intervals.iter().cloned()).collect(),
    })
}

/// Every rail's counter deltas added up, name by name (each rail has its own port).
fn add_counters<'a>(parts: impl Iterator<Item = Option<&'a BTreeMap<String, u64>>>) -> Option<BTreeMap<String, u64>> {
    let mut total: Option<BTreeMap<String, u64>> = None;
    for part in parts.flatten() {
        let t = total.get_or_insert_with(BTreeMap::new);
        for (name, v) in part {
            *t.entry(name.clone()).or_default() += v;
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::Peak;

    fn bw(size: u64, messages: u64, ns: u64) -> SizeResult {
        let t = ThroughputSummary::new(size, messages, ns, Peak { msgs_per_sec: None, window_msgs: 1000 });
        SizeResult {
            size,
            iterations: messages,
            bytes: size * messages,
            duration_ns: ns,
            bandwidth: Some(t),
            data_validated: true,
            ..Default::default()
        }
    }

    #[test]
    fn bandwidth_of_rails_adds_up() {
        let (a, b) = (bw(4096, 1000, 1_000_000), bw(4096, 500, 1_000_000));
        let t = aggregate(&[&a, &b], &[None, None]).unwrap();
        assert_eq!((t.iterations, t.bytes), (1500, 1500 * 4096));
        let total = t.bandwidth.unwrap();
        let sum = a.bandwidth.unwrap().avg_bytes_per_sec + b.bandwidth.unwrap().avg_bytes_per_sec;
        assert!((total.avg_bytes_per_sec - sum).abs() < 1.0, "{} vs {sum}", total.avg_bytes_per_sec);
        assert!(aggregate(&[], &[]).is_none());
    }

    #[test]
    fn latency_of_rails_is_one_merged_distribution() {
        let mut r0 = LatencyRecorder::new();
        let mut r1 = LatencyRecorder::new();
        (1..=10).for_each(|v| r0.record(v * 1000));
        (11..=20).for_each(|v| r1.record(v * 1000));
        let lat = |r: &LatencyRecorder| SizeResult {
            size: 2,
            iterations: 10,
            latency: Some(LatencyResult { kind: "one_way".into(), unit: "ns".into(), summary: r.summary(0.5) }),
            ..Default::default()
        };
        let t = aggregate(&[&lat(&r0), &lat(&r1)], &[Some(&r0), Some(&r1)]).unwrap();
        let s = t.latency.unwrap().summary;
        assert_eq!((s.samples, s.min_ns, s.max_ns), (20, 500.0, 10_000.0));
    }

    #[test]
    fn one_rail_at_a_time_waits_for_the_rails_before_it() {
        let devices = vec!["a".to_string(), "b".to_string()];
        let c = Conductor::new(&devices, &[vec![], vec![]], RailMode::Sequential);
        for i in 0..2 {
            c.complete(i, |_| {}); // prepared
            c.complete(i, |_| {}); // connected
        }
        let s = c.lock();
        assert!(c.may_start(&s, 0, size_step(0)));
        assert!(!c.may_start(&s, 1, size_step(0)), "rail 1 waits for rail 0's size");
        drop(s);
        c.complete(0, |_| {});
        let s = c.lock();
        assert!(c.may_start(&s, 1, size_step(0)));
        assert!(!c.may_start(&s, 0, size_step(1)), "rail 0 waits until every rail did the size before");
        drop(s);
        // A failed rail no longer holds the others.
        c.fail(1, Error::Peer("gone".into()));
        let s = c.lock();
        assert!(c.may_start(&s, 0, size_step(1)));
        assert_eq!(s.first_error().unwrap().message(), "rail 1 (b -> ?): gone", "the error names the rail");
    }

    #[test]
    fn all_rails_at_once_move_size_by_size_together() {
        let devices = vec!["a".to_string(), "b".to_string()];
        let c = Conductor::new(&devices, &[vec![], vec![]], RailMode::Concurrent);
        for i in 0..2 {
            c.complete(i, |_| {});
            c.complete(i, |_| {});
        }
        let s = c.lock();
        assert!(c.may_start(&s, 0, size_step(0)) && c.may_start(&s, 1, size_step(0)));
        drop(s);
        c.complete(0, |_| {});
        let s = c.lock();
        assert!(!c.may_start(&s, 0, size_step(1)), "rail 0 waits for rail 1 to finish size 0");
        drop(s);
        // Bad flags stop every rail before traffic.
        c.fail(1, Error::Usage("bad".into()));
        assert!(c.lock().stop.is_none(), "a usage error after connecting stops only its rail");
    }
}
