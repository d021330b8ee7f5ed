//! The ring tests, driving `crate::ring` over the test session like the other kernels.
//!
//! `ring-bw`: the client produces `-n` records (or records for `-D` seconds) of the size through the ring and the server
//! consumes them in place; timed from the first reserve until the consumer has released
//! the last record (its credit is back), so every record counted was delivered and read.
//!
//! `ring-lat`: ping-pong over two rings, one each way (the links' two lanes): the client
//! commits record `i` and waits for the server's record `i` on the other ring; one sample
//! is one round trip, reported halved like `write-lat`.
//!
//! Each size gets fresh rings: `prepare` clears this side's ring memory before the peer
//! may write, and both ends `settle` (every write of theirs completed) before the size
//! ends, so nothing of one size lands in the next.

use std::borrow::Borrow;
use std::time::Duration;

use crate::bench::bandwidth::BandwidthRun;
use crate::bench::latency::{EchoOutcome, LatencyRun, Limit};
use crate::bench::pattern;
use crate::error::{Error, Result};
use crate::link::wait::Woke;
use crate::link::{Link, SizeRun};
use crate::ring::{Receiver, Record, RingConfig, Sender};
use crate::session::{Channel, Message};
use crate::spec::TestSpec;
use crate::stats::{LatencyRecorder, PeakMeter, ThroughputSummary};

/// Commits between clock reads for the peak rate.
const PEAK_EVERY: u64 = 64;

/// Clears this side's ring and credit words: before `Ready`/`Start`, when the peer writes
/// none of it.
pub fn prepare(link: &Link, spec: &TestSpec) {
    let Some(layout) = spec.ring_layout() else { return };
    // SAFETY: the peer writes here only after this side answers (see the module docs), and
    // the previous size's writes all completed before it ended.
    unsafe {
        link.buf.bytes_mut(layout.rx as usize, layout.capacity as usize).fill(0);
        link.buf.bytes_mut(layout.credit_in as usize, (layout.slots - layout.credit_in) as usize).fill(0);
    }
}

fn config(spec: &TestSpec) -> RingConfig {
    RingConfig::from_spec(spec).expect("a ring test carries its ring parameters")
}

fn timeout(run: &SizeRun) -> Duration {
    Duration::from_nanos(run.timeout_ns)
}

/// Writes record `i` into its reserved slot: with `--validate-data`, its number, checksum
/// and pattern (one byte flipped at `--inject-corruption` on the measuring side);
/// otherwise its number only (the
/// least a real producer writes).
#[inline(always)]
fn fill(spec: &TestSpec, slot: &mut [u8], i: u64, may_corrupt: bool) {
    if spec.validate_data {
        pattern::fill_record(slot, i);
        if may_corrupt && spec.corrupt_at == Some(i) {
            let last = slot.len() - 1;
            slot[last] ^= 0xff;
        }
    } else if slot.len() >= 8 {
        slot[..8].copy_from_slice(&i.to_le_bytes());
    }
}

/// Reads record `i` in place: all of it with `--validate-data`, else its number.
#[inline(always)]
fn check(spec: &TestSpec, record: &[u8], i: u64) -> Option<String> {
    if spec.validate_data {
        return pattern::check_record(record, i).err();
    }
    if record.len() >= 8 {
        let n = u64::from_le_bytes(record[..8].try_into().expect("8 bytes"));
        if n != i {
            return Some(format!("record {n} arrived where record {i} was due"));
        }
    }
    None
}

/// `ring-bw`, producing side.
pub fn bandwidth_client(run: &SizeRun, chan: &mut Channel) -> Result<BandwidthRun> {
    let SizeRun { link, spec, size, clock, .. } = *run;
    let cfg = config(spec);
    let mut tx = Sender::new(link, &cfg, timeout(run))?;
    let per_ring = (cfg.capacity / crate::ring::span(size)).max(1);
    // The peak spans two ring-fulls at least, so filling an empty ring is not a rate.
    let run_len = if spec.duration_secs.is_some() { u64::MAX } else { spec.iterations / 4 };
    let mut peak = PeakMeter::new((2 * per_ring).min(run_len).max(PEAK_EVERY));
    let limit = Limit::new(spec, clock);
    let start = limit.start;
    let mut i = 0u64;
    while !limit.done(i, clock) {
        let mut slot = tx.reserve(chan, size as usize)?;
        fill(spec, &mut slot, i, true);
        slot.commit()?;
        i += 1;
        if i.is_multiple_of(PEAK_EVERY) {
            peak.observe(clock.nanos(start, clock.now()), i);
        }
    }
    tx.drain(chan)?;
    let elapsed = clock.nanos(start, clock.now());
    tx.settle(chan)?;
    Ok(BandwidthRun { summary: ThroughputSummary::new(size, i, elapsed, peak.peak()), iterations: i })
}

/// `ring-bw`, consuming side: reads every record in place until the producer's `Done`.
/// Returns (records read, first data error, no reverse direction).
pub fn bandwidth_server(run: &SizeRun, chan: &mut Channel) -> Result<(u64, Option<String>, Option<ThroughputSummary>)> {
    let SizeRun { link, spec, size, .. } = *run;
    let rx = Receiver::new(link, &config(spec), timeout(run), chan.peer())?;
    let mut data_error = None;
    let mut i = 0u64;
    loop {
        match next_record(&rx, chan)? {
            Ok(record) => {
                if data_error.is_none() {
                    data_error = check(spec, &record, i);
                }
                record.release()?;
                i += 1;
            }
            // The producer says so only once every record was released: all were read.
            Err(Message::Done { size: s, iterations, .. }) if s == size => {
                rx.settle(chan)?;
                if iterations != i {
                    return Err(Error::Check(format!(
                        "the producer reports {iterations} records at {size} B but {i} arrived"
                    )));
                }
                return Ok((i, data_error, None));
            }
            Err(m) => return Err(in_the_middle(chan, &m)),
        }
    }
}

/// The next record, or the control message the peer sent instead: a wait without a
/// limit ends with one or the other (or an error after the session deadline).
fn next_record<'c, L: Borrow<Link>>(
    rx: &'c Receiver<L>,
    chan: &mut Channel,
) -> Result<std::result::Result<Record<'c, L>, Message>> {
    match rx.recv(chan, None)? {
        (Some(record), _) => Ok(Ok(record)),
        (None, Woke::Peer(m)) => Ok(Err(m)),
        (None, Woke::Ready) => unreachable!("a wait without a limit ends with a record or a message"),
    }
}

fn in_the_middle(chan: &Channel, m: &Message) -> Error {
    Error::Peer(format!("{} sent {} in the middle of the run", chan.peer(), m.kind()))
}

/// `ring-lat`, measuring side: lane 0 carries the pings, lane 1 the echoes.
pub fn latency_client(runs: &[SizeRun], chan: &mut Channel) -> Result<LatencyRun> {
    let (run, back) = (&runs[0], &runs[1]);
    let SizeRun { link, spec, size, clock, .. } = *run;
    let cfg = config(spec);
    let mut tx = Sender::new(link, &cfg, timeout(run))?;
    let rx = Receiver::new(back.link, &cfg, timeout(run), chan.peer())?;
    let mut recorder = LatencyRecorder::new();
    let limit = Limit::new(spec, clock);
    let mut i = 0u64;
    while !limit.done(i, clock) {
        let t0 = clock.now();
        let mut slot = tx.reserve(chan, size as usize)?;
        fill(spec, &mut slot, i, true);
        slot.commit()?;
        let echo = next_record(&rx, chan)?;
        let t1 = clock.now();
        let echo = echo.map_err(|m| in_the_middle(chan, &m))?;
        recorder.record(clock.nanos(t0, t1));
        if let Some(e) = check(spec, &echo, i) {
            return Err(Error::Check(format!("{e} (echoed by {})", chan.peer())));
        }
        echo.release()?;
        i += 1;
    }
    let elapsed_ns = clock.nanos(limit.start, clock.now());
    tx.drain(chan)?;
    // The echoes' credit, now: the server drains its ring after `Done`, when this side no
    // longer polls (and so no longer answers its requests).
    rx.publish_now()?;
    tx.settle(chan)?;
    rx.settle(chan)?;
    Ok(LatencyRun { recorder, iterations: i, elapsed_ns })
}

/// `ring-lat`, echoing side: answers record `i` with its own record `i` until `Done`.
pub fn latency_server(runs: &[SizeRun], chan: &mut Channel) -> Result<EchoOutcome> {
    let (run, back) = (&runs[0], &runs[1]);
    let SizeRun { link, spec, size, .. } = *run;
    let cfg = config(spec);
    let rx = Receiver::new(link, &cfg, timeout(run), chan.peer())?;
    let mut tx = Sender::new(back.link, &cfg, timeout(run))?;
    let mut data_error = None;
    let mut i = 0u64;
    loop {
        let ping = match next_record(&rx, chan)? {
            Ok(ping) => ping,
            Err(Message::Done { size: s, iterations, .. }) if s == size => {
                tx.drain(chan)?;
                tx.settle(chan)?;
                rx.settle(chan)?;
                if iterations != i {
                    return Err(Error::Check(format!(
                        "the client reports {iterations} iterations at {size} B but this side answered {i}"
                    )));
                }
                return Ok(EchoOutcome { iterations: i, data_error });
            }
            Err(m) => return Err(in_the_middle(chan, &m)),
        };
        if data_error.is_none() {
            data_error = check(spec, &ping, i);
        }
        let mut slot = tx.reserve(chan, size as usize)?;
        fill(spec, &mut slot, i, false);
        slot.commit()?;
        // Released after the echo is on its way: returning credit is not the client's wait.
        ping.release()?;
        i += 1;
    }
}
