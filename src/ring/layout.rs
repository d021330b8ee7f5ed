//! What a ring session agrees on (`RingConfig`, carried in the test spec) and where
//! everything lives in each side's registered buffer (`RingLayout`). Both sides compute
//! the layout from the config alone.

use serde::{Deserialize, Serialize};

use super::core;
use crate::bench::spec::{Measure, Operation, TestSpec};

/// How the consumer learns that records arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Notify {
    /// RDMA WRITE with immediate: one receive completion per write.
    #[default]
    Imm,
    /// The consumer polls each record's frame word (see the module docs for the ordering
    /// this relies on).
    Poll,
}

impl Notify {
    pub fn label(self) -> &'static str {
        match self {
            Notify::Imm => "imm",
            Notify::Poll => "poll",
        }
    }
}

/// The ring parameters both sides must agree on; part of the test spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RingParams {
    /// Bytes of the consumer's ring (and of the producer's staging ring): a power of two.
    pub capacity: u64,
    pub notify: Notify,
    /// Committed records coalesced into one RDMA WRITE at most (1: every commit is sent).
    pub batch: u32,
}

/// The largest ring a test picks by itself (records that need more get the smallest that
/// holds two of them).
const DEFAULT_CAPACITY_MAX: u64 = 64 << 20;

impl RingParams {
    /// A ring with room for `records` records of `max_size`, at least `floor` bytes, at
    /// most 64 MiB but always holding two records (up to the largest ring).
    pub fn default_capacity(records: u64, floor: u64, max_size: u64) -> u64 {
        let span = core::span(max_size);
        let wanted = span.saturating_mul(records).next_power_of_two().clamp(floor, DEFAULT_CAPACITY_MAX);
        wanted.max(span.saturating_mul(2).next_power_of_two()).min(core::MAX_CAPACITY)
    }
}

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
        core::check_capacity(self.capacity)?;
        if self.batch == 0 {
            return Err("--batch 0: a write carries at least one record; use 1 or more".into());
        }
        if self.tx_depth < 2 {
            return Err(format!("-t {}: a ring needs a send queue of at least 2", self.tx_depth));
        }
        if self.notify == Notify::Imm && self.rx_depth < 2 {
            return Err(format!("-r {}: --notify imm needs at least 2 posted receives", self.rx_depth));
        }
        Ok(())
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
