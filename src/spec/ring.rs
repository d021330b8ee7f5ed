//! What a ring test agrees on, as plain data, and the record format's sizes: what the
//! spec checks without the ring library (which builds on these, `crate::ring::core`).

use serde::{Deserialize, Serialize};

use super::options::{Field, Names, Refusal};

/// The frame word `[len: u32][tag: u32]`, the highest 8 bytes of a record's span.
pub const FRAME: u64 = 8;
/// Records start at multiples of this (so payloads are 8-byte aligned); the space left in
/// a lap is always one, and holds at least an empty pad record (a frame word).
pub const ALIGN: u64 = 8;
/// Smallest ring: room for one aligned record and a pad.
pub const MIN_CAPACITY: u64 = 4096;
/// Largest ring: positions travel as 32-bit numbers, whose differences must stay unambiguous.
pub const MAX_CAPACITY: u64 = 1 << 30;

/// Bytes a record of `len` payload bytes occupies in the ring.
pub fn span(len: u64) -> u64 {
    (len + FRAME).next_multiple_of(ALIGN)
}

/// The largest payload a ring of `capacity` bytes carries (one record filling it).
pub fn max_record(capacity: u64) -> u64 {
    capacity.saturating_sub(FRAME)
}

/// Checks a capacity: a power of two within the limits.
pub fn check_capacity(capacity: u64) -> Result<(), String> {
    check_capacity_named(capacity, "--capacity")
}

/// [`check_capacity`], the option named `name` in the message.
fn check_capacity_named(capacity: u64, name: &str) -> Result<(), String> {
    if !capacity.is_power_of_two() || !(MIN_CAPACITY..=MAX_CAPACITY).contains(&capacity) {
        let nearest = capacity.checked_next_power_of_two().unwrap_or(MAX_CAPACITY).clamp(MIN_CAPACITY, MAX_CAPACITY);
        return Err(format!(
            "ring capacity {capacity} B is not a power of two from {MIN_CAPACITY} B to {} MiB; use {name} \
             {nearest}",
            MAX_CAPACITY >> 20
        ));
    }
    Ok(())
}

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

/// How a ring's ends wait: for the next record (the consumer) or for credit (a blocked
/// producer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Wait {
    /// Spin on memory or the completion queue for as long as the wait lasts (a core each).
    #[default]
    Spin,
    /// Sleep on a completion channel at once: the least CPU, a wake-up per wait.
    Sleep,
    /// Spin for a short while (`ADAPTIVE_SPIN_NS`), then sleep: short waits cost no
    /// wake-up, long ones no core.
    Adaptive,
}

impl Wait {
    pub fn label(self) -> &'static str {
        match self {
            Wait::Spin => "spin",
            Wait::Sleep => "sleep",
            Wait::Adaptive => "adaptive",
        }
    }

    /// How long a wait spins before it sleeps; None: it never sleeps.
    pub fn spin_ns(self) -> Option<u64> {
        match self {
            Wait::Spin => None,
            Wait::Sleep => Some(0),
            Wait::Adaptive => Some(ADAPTIVE_SPIN_NS),
        }
    }
}

/// Receives a polling ring's producer keeps for wake-ups when it may sleep: each of its
/// requests is answered by one write with immediate, and it asks again only after the
/// answer's credit came.
pub const WAKE_RECEIVES: u32 = 16;

/// An adaptive wait's spin before it sleeps: a round trip's worth on hardware (a few us)
/// times a margin; under the lab's emulation a wake-up costs tens of us.
pub const ADAPTIVE_SPIN_NS: u64 = 20_000;

/// The ring parameters both sides must agree on; part of the test spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RingParams {
    /// Bytes of the consumer's ring (and of the producer's staging ring): a power of two.
    pub capacity: u64,
    pub notify: Notify,
    /// Committed records coalesced into one RDMA WRITE at most (1: every commit is sent).
    pub batch: u32,
    /// How both ends wait (a spec without it spun, as before waits could sleep).
    #[serde(default)]
    pub wait: Wait,
}

/// The largest ring a test picks by itself (records that need more get the smallest that
/// holds two of them).
const DEFAULT_CAPACITY_MAX: u64 = 64 << 20;

impl RingParams {
    /// A ring with room for `records` records of `max_size`, at least `floor` bytes, at
    /// most 64 MiB but always holding two records (up to the largest ring).
    pub fn default_capacity(records: u64, floor: u64, max_size: u64) -> u64 {
        let span = span(max_size);
        let wanted = span.saturating_mul(records).next_power_of_two().clamp(floor, DEFAULT_CAPACITY_MAX);
        wanted.max(span.saturating_mul(2).next_power_of_two()).min(MAX_CAPACITY)
    }
}

/// The rules a ring's parameters and queue depths must meet, with no device: the library
/// (`RingConfig::check`) and a test spec check the same; `n` names the options.
pub fn check(params: &RingParams, tx_depth: u32, rx_depth: u32, n: Names) -> Result<(), Refusal> {
    let no = |field: Field, message: String| Err(Refusal { field, message });
    if let Err(message) = check_capacity_named(params.capacity, n(Field::Capacity)) {
        return no(Field::Capacity, message);
    }
    if params.batch == 0 {
        return no(Field::Batch, format!("{} 0: a write carries at least one record; use 1 or more", n(Field::Batch)));
    }
    if tx_depth < 2 {
        return no(
            Field::TxDepth,
            format!("{} {tx_depth}: a ring needs a send queue of at least 2", n(Field::TxDepth)),
        );
    }
    if params.notify == Notify::Imm && rx_depth < 2 {
        return no(
            Field::RxDepth,
            format!("{} {rx_depth}: {} imm needs at least 2 posted receives", n(Field::RxDepth), n(Field::Notify)),
        );
    }
    Ok(())
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

    /// The `n`-th small-write source slot (cycling).
    pub fn slot(&self, n: u64) -> u64 {
        self.slots + (n % self.slot_count) * SLOT
    }
}

/// Where a write with immediate's receive points: nothing is placed through it.
pub fn receive_scratch(layout: &RingLayout) -> (usize, u32) {
    (layout.slot(0) as usize, SLOT as u32)
}
