//! The harness's own hot-path costs: what taking one latency sample adds to a
//! measurement (design target: under 25 ns), the bandwidth peak meter's update, and the
//! ring's bookkeeping per record (reserve, commit, send, parse, release, credit) with no
//! verbs: what the ring adds to a write beyond its 8-byte frame word.
//! Run with `cargo bench --bench hot_path`.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use rdmabench::link::wait::PeerWatch;
use rdmabench::ring::core::{Arrival, ConsumerCore, ProducerCore, RingMem};
use rdmabench::session::{Channel, Listener};
use rdmabench::stats::{Clock, LatencyRecorder, PeakMeter};
use std::time::Duration;

fn sampling(c: &mut Criterion) {
    let clock = Clock::new();
    c.bench_function("clock_now", |b| b.iter(|| black_box(clock.now())));

    let (t0, t1) = (clock.now(), clock.now() + 12_345);
    c.bench_function("clock_nanos", |b| b.iter(|| black_box(clock.nanos(black_box(t0), black_box(t1)))));

    let mut rec = LatencyRecorder::new();
    let mut v = 1_000u64;
    c.bench_function("histogram_record", |b| {
        b.iter(|| {
            v = v.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            rec.record(black_box(2_000 + (v >> 50)));
        })
    });

    // One whole sample as the latency kernel takes it: two clock reads, a delta, a record.
    let mut rec = LatencyRecorder::new();
    c.bench_function("latency_sample", |b| {
        b.iter(|| {
            let a = clock.now();
            let z = clock.now();
            rec.record(clock.nanos(a, z));
        })
    });

    // The same with what a session's loop adds per sample to watch its peer (issue: a
    // long run is not a lost peer): the wait count that drains the control channel every
    // 1024 waits, and the 10 ms look at the peer, both on a live loopback session.
    let listener = Listener::bind(Some("127.0.0.1".parse().unwrap()), 0).unwrap();
    let long = Duration::from_secs(3600);
    let mut chan = Channel::connect("127.0.0.1", listener.port(), long, long).unwrap();
    let _peer = listener.accept(long, long).unwrap();
    let mut watch = PeerWatch::new(&clock);
    let mut rec = LatencyRecorder::new();
    c.bench_function("latency_sample_watched", |b| {
        b.iter(|| {
            let a = clock.now();
            chan.note_wait().unwrap();
            let z = clock.now();
            rec.record(clock.nanos(a, z));
            watch.tick(&clock, z, &mut chan, "the run").unwrap();
        })
    });
    let mut meter = PeakMeter::new(1000);
    let (mut t, mut n) = (0u64, 0u64);
    c.bench_function("peak_meter_observe", |b| {
        b.iter(|| {
            t += 1_000;
            n += 100;
            meter.observe(black_box(t), black_box(n));
        })
    });
}

/// One 64-byte record through the pure ring core: the producer's and the consumer's work,
/// with the "wire" a copy between two rings in memory.
fn ring_record(c: &mut Criterion) {
    const CAP: u64 = 64 << 10;
    let mut staging = vec![0u8; CAP as usize];
    let mut ring = vec![0u8; CAP as usize];
    // SAFETY: both Vecs outlive the views and are not otherwise touched while in use.
    let tx = unsafe { RingMem::new(staging.as_mut_ptr(), CAP) };
    let rx = unsafe { RingMem::new(ring.as_mut_ptr(), CAP) };
    let (mut p, mut q) = (ProducerCore::new(CAP), ConsumerCore::new(CAP, Arrival::Polled));
    c.bench_function("ring_record_64B", |b| {
        b.iter(|| {
            let r = p.reserve(64, &tx).expect("the consumer keeps up");
            // SAFETY: inside the staging ring.
            unsafe { std::ptr::write_bytes(tx.ptr(r.offset, 8), 7, 8) };
            p.commit(&tx);
            let (ranges, _) = p.take_unsent();
            for w in ranges.into_iter().flatten() {
                // SAFETY: the same range of two rings of the same size.
                unsafe {
                    std::ptr::copy_nonoverlapping(tx.ptr(w.offset, w.len), rx.ptr(w.offset, w.len), w.len as usize)
                };
            }
            let rec = q.next(&rx, None).unwrap().expect("it landed");
            black_box(rx.load_u64(rec.offset));
            q.release(rec.pos);
            if q.credit_due(false) {
                p.on_credit(q.publish(&rx)).unwrap();
            }
        })
    });
}

criterion_group!(benches, sampling, ring_record);
criterion_main!(benches);
