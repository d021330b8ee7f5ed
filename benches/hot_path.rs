//! The harness's own hot-path costs: what taking one latency sample adds to a
//! measurement (design target: under 25 ns), and the bandwidth peak meter's update.
//! Run with `cargo bench --bench hot_path`.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use rdmabench::stats::{Clock, LatencyRecorder, PeakMeter};

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

criterion_group!(benches, sampling);
criterion_main!(benches);
