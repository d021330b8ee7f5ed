//! The measurement clock: the TSC through `quanta` where the CPU has an invariant TSC,
//! the monotonic clock otherwise. Reading it costs a few nanoseconds and never allocates.

/// A calibrated clock; `now()` returns raw ticks, `nanos()` converts a tick delta.
#[derive(Clone)]
pub struct Clock {
    inner: quanta::Clock,
}

impl Clock {
    pub fn new() -> Self {
        Clock { inner: quanta::Clock::new() }
    }

    /// Raw ticks; only differences are meaningful.
    #[inline(always)]
    pub fn now(&self) -> u64 {
        self.inner.raw()
    }

    /// Nanoseconds between two raw readings (0 if `end` is not after `start`).
    #[inline(always)]
    pub fn nanos(&self, start: u64, end: u64) -> u64 {
        if end <= start {
            return 0;
        }
        self.inner.delta_as_nanos(start, end)
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}
