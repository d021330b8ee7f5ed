//! What a ring session agrees on (`RingConfig`, carried in the test spec) and where
//! everything lives in each side's registered buffer (`RingLayout`). Both sides compute
//! the layout from the config alone.

use super::core;
pub use crate::spec::ring::{Notify, RingParams};
use crate::spec::{Measure, Operation, TestSpec};

/// A ring's configuration, for the library.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingConfig {
    pub capacity: u64,
    pub notify: Notify,
    pub batch: u32,
    /// Send queue depth of each side.
    pub tx_depth: u32,
    /// Receives the consumer keeps posted (`Imm`): writes in flight at most.
    pub rx_depth: u32,
}

impl Default for RingConfig {
    fn default() -> Self {
        RingConfig { capacity: 1 << 20, notify: Notify::Imm, batch: 16, tx_depth: 128, rx_depth: 256 }
    }
}

impl RingConfig {
    pub fn params(&self) -> RingParams {
        RingParams { capacity: self.capacity, notify: self.notify, batch: self.batch }
    }

    /// The spec a ring session runs under (the session and the connection come from the
    /// tests' machinery).
    pub fn to_spec(&self, measure: Measure) -> TestSpec {
        let mut spec = TestSpec::new(Operation::Ring, measure);
        // A library session's records take any size up to the ring's largest.
        spec.sizes = vec![core::max_record(self.capacity)];
        spec.tx_depth = self.tx_depth;
        spec.rx_depth = self.rx_depth;
        spec.ring = Some(self.params());
        spec
    }

    pub fn from_spec(spec: &TestSpec) -> Option<RingConfig> {
        let p = spec.ring?;
        Some(RingConfig {
            capacity: p.capacity,
            notify: p.notify,
            batch: p.batch,
            tx_depth: spec.tx_depth,
            rx_depth: spec.rx_depth,
        })
    }

    /// Checks what needs no device.
    pub fn check(&self) -> Result<(), String> {
        crate::spec::ring::check(&self.params(), self.tx_depth, self.rx_depth)
    }
}

/// Offsets in each side's buffer. Each side has both rings, so one connection carries a
/// stream each way (the latency test echoes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingLayout {
    pub capacity: u64,
    /// The consumer's ring: the peer's producer writes here.
    pub rx: u64,
    /// The producer's staging ring, mirrored onto the peer's `rx`.
    pub tx: u64,
    /// The credit word: `[released position: u32][receives reposted: u32]`, written by the
    /// peer's consumer.
    pub credit_in: u64,
    /// The credit request counter (u32), written by the peer's producer.
    pub request_in: u64,
    /// Sources of the small writes (credit words, requests): 16 bytes each, one per send
    /// queue entry so none is reused while in flight.
    pub slots: u64,
    pub slot_count: u64,
    pub total: u64,
}

pub const SLOT: u64 = 16;

impl RingLayout {
    pub fn new(capacity: u64, tx_depth: u32) -> RingLayout {
        let rx = 0;
        let tx = capacity;
        let credit_in = 2 * capacity;
        let request_in = credit_in + 8;
        let slots = credit_in + 64;
        let slot_count = u64::from(tx_depth.max(1));
        RingLayout {
            capacity,
            rx,
            tx,
            credit_in,
            request_in,
            slots,
            slot_count,
            total: (slots + slot_count * SLOT).next_multiple_of(4096),
        }
    }

    pub fn of(spec: &TestSpec) -> Option<RingLayout> {
        spec.ring.map(|r| RingLayout::new(r.capacity, spec.tx_depth))
    }

    /// The `n`-th small-write source slot (cycling).
    pub fn slot(&self, n: u64) -> u64 {
        self.slots + (n % self.slot_count) * SLOT
    }
}
