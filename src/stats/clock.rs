//! The measurement clock: the CPU's time-stamp counter read directly (as perftest does),
//! converted to nanoseconds with a rate calibrated once per process against the
//! monotonic clock. Reading it costs a few nanoseconds and never allocates or enters the
//! kernel. (A general-purpose clock falls back to `clock_gettime` when the CPU does not
//! advertise an invariant TSC; under emulation that reads an emulated HPET, which costs
//! microseconds per read and inflated our latencies: hence no fallback on x86_64.)
//! Elsewhere the monotonic clock is used.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Calibration span: long enough for a rate within ~0.01 %, short enough for start-up.
const CALIBRATION: Duration = Duration::from_millis(20);

/// Nanoseconds per tick as a 32.32 fixed-point multiplier.
static MULT: OnceLock<u64> = OnceLock::new();

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn ticks() -> u64 {
    // SAFETY: RDTSC is available on every x86_64 CPU.
    unsafe { core::arch::x86_64::_rdtsc() }
}

#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
fn ticks() -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    BASE.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

fn calibrate() -> u64 {
    if cfg!(not(target_arch = "x86_64")) {
        return 1 << 32; // ticks are nanoseconds already
    }
    let (w0, t0) = (Instant::now(), ticks());
    while w0.elapsed() < CALIBRATION {
        std::hint::spin_loop();
    }
    let (w1, t1) = (Instant::now(), ticks());
    let ns = (w1 - w0).as_nanos() as f64;
    let ticks = (t1 - t0).max(1) as f64;
    ((ns / ticks) * (1u64 << 32) as f64) as u64
}

/// A calibrated clock; `now()` returns raw ticks, `nanos()` converts a tick delta.
#[derive(Clone, Copy)]
pub struct Clock {
    mult: u64,
}

impl Clock {
    pub fn new() -> Self {
        Clock { mult: *MULT.get_or_init(calibrate) }
    }

    /// Raw ticks; only differences are meaningful.
    #[inline(always)]
    pub fn now(&self) -> u64 {
        ticks()
    }

    /// Nanoseconds between two raw readings (0 if `end` is not after `start`).
    #[inline(always)]
    pub fn nanos(&self, start: u64, end: u64) -> u64 {
        if end <= start {
            return 0;
        }
        (((end - start) as u128 * self.mult as u128) >> 32) as u64
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agrees_with_the_monotonic_clock_within_a_percent() {
        let c = Clock::new();
        let (w, t) = (Instant::now(), c.now());
        std::thread::sleep(Duration::from_millis(100));
        let (wall, measured) = (w.elapsed().as_nanos() as f64, c.nanos(t, c.now()) as f64);
        assert!((measured / wall - 1.0).abs() < 0.01, "clock {measured} ns vs wall {wall} ns");
    }

    #[test]
    fn backwards_or_equal_readings_give_zero() {
        let c = Clock::new();
        assert_eq!(c.nanos(10, 10), 0);
        assert_eq!(c.nanos(10, 5), 0);
    }
}
