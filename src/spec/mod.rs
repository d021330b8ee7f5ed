//! What a test is: the operation, the measurement, sizes, counts and queue settings.
//! The client builds it from flags and sends it whole to the server, which needs only
//! device flags. Checks that need no device live here; checks against a device's
//! limits live in `check_against_device`, fed with the limits the verbs layer read.

pub mod fabric;
pub mod options;
pub mod rails;
pub mod ring;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
pub use fabric::{Fabric, FabricOptions};
pub use options::{Field, Names, Options, Refusal};
pub use ring::{Notify, RingParams, Wait};

/// What a test runs over: the QP transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Transport {
    #[serde(rename = "RC")]
    Rc,
    #[serde(rename = "UC")]
    Uc,
    #[serde(rename = "UD")]
    Ud,
}

impl Transport {
    pub fn label(self) -> &'static str {
        match self {
            Transport::Rc => "RC",
            Transport::Uc => "UC",
            Transport::Ud => "UD",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Operation {
    Write,
    Read,
    Send,
    Atomic,
    /// Records through the zero-copy ring (`crate::ring`): RDMA WRITE plus credits.
    Ring,
}

impl Operation {
    pub fn label(self) -> &'static str {
        match self {
            Operation::Write => "write",
            Operation::Read => "read",
            Operation::Send => "send",
            Operation::Atomic => "atomic",
            Operation::Ring => "ring",
        }
    }
}

/// The atomic verb of an atomic test (`-A`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
pub enum AtomicOp {
    #[default]
    #[serde(rename = "FETCH_AND_ADD")]
    #[value(name = "FETCH_AND_ADD")]
    FetchAndAdd,
    #[serde(rename = "CMP_AND_SWP")]
    #[value(name = "CMP_AND_SWP")]
    CmpAndSwp,
}

impl AtomicOp {
    pub fn label(self) -> &'static str {
        match self {
            AtomicOp::FetchAndAdd => "FETCH_AND_ADD",
            AtomicOp::CmpAndSwp => "CMP_AND_SWP",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Measure {
    Latency,
    Bandwidth,
}

/// Most QPs one side opens with `-q`.
pub const MAX_QPS: u32 = 256;
/// The largest RDMA message (2^31 bytes, the InfiniBand limit every verbs device shares);
/// the device's own max message size may be lower and is checked when it is opened.
pub const MAX_MESSAGE_SIZE: u64 = 1 << 31;
/// Most sizes in one test (a sweep has 23).
pub const MAX_SIZES: usize = 4096;

fn one() -> u32 {
    1
}

/// Completion moderation (`-Q`) unless told otherwise.
pub const DEFAULT_CQ_MOD: u32 = 100;
/// Receive queue depth (`-r`) unless told otherwise.
pub const DEFAULT_RX_DEPTH: u32 = 512;

/// Every test, as its command names it (`write-lat`), in the order the docs list them.
pub const TESTS: [(&str, Operation, Measure); 10] = [
    ("write-lat", Operation::Write, Measure::Latency),
    ("write-bw", Operation::Write, Measure::Bandwidth),
    ("read-lat", Operation::Read, Measure::Latency),
    ("read-bw", Operation::Read, Measure::Bandwidth),
    ("send-lat", Operation::Send, Measure::Latency),
    ("send-bw", Operation::Send, Measure::Bandwidth),
    ("atomic-lat", Operation::Atomic, Measure::Latency),
    ("atomic-bw", Operation::Atomic, Measure::Bandwidth),
    ("ring-lat", Operation::Ring, Measure::Latency),
    ("ring-bw", Operation::Ring, Measure::Bandwidth),
];

/// A default that differs by test, in words, from the code that sets it: "1 for write-lat,
/// read-lat; 128 for write-bw, ...". The flags' help and the README's table use it, so the
/// docs cannot disagree with the defaults.
pub fn per_test<T: PartialEq + std::fmt::Display>(value: impl Fn(&TestSpec) -> T) -> String {
    per_test_where(|s| Some(value(s)))
}

/// [`per_test`] over the tests where `value` is `Some` (ring tests for the ring's options).
pub fn per_test_where<T: PartialEq + std::fmt::Display>(value: impl Fn(&TestSpec) -> Option<T>) -> String {
    let mut groups: Vec<(T, Vec<&str>)> = Vec::new();
    for (name, op, measure) in TESTS {
        let Some(v) = value(&TestSpec::new(op, measure)) else { continue };
        match groups.iter_mut().find(|(g, _)| *g == v) {
            Some((_, names)) => names.push(name),
            None => groups.push((v, vec![name])),
        }
    }
    if let [(v, _)] = groups.as_slice() {
        return v.to_string();
    }
    groups.iter().map(|(v, names)| format!("{v} for {}", names.join(", "))).collect::<Vec<_>>().join("; ")
}

/// Largest size of an `-a` sweep, as perftest: 2 B .. 8 MiB.
pub const SWEEP_MAX: u64 = 8 << 20;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TestSpec {
    pub operation: Operation,
    pub measure: Measure,
    /// `-c`: RC, UC or UD.
    pub transport: Transport,
    /// `--with-imm`: WRITE or SEND with immediate data.
    pub with_imm: bool,
    /// `-A`: the atomic verb (atomic tests only).
    pub atomic_op: AtomicOp,
    /// One size, or every size of a sweep in order.
    pub sizes: Vec<u64>,
    /// Iterations per size (ignored when `duration_secs` is set).
    pub iterations: u64,
    /// Run each size for this long instead of a fixed count.
    pub duration_secs: Option<f64>,
    /// Send queue depth: outstanding work requests.
    pub tx_depth: u32,
    /// Request a completion every `cq_mod` work requests.
    pub cq_mod: u32,
    /// `-q`: queue pairs per side (bandwidth); each sends `iterations` messages.
    #[serde(default = "one")]
    pub num_qps: u32,
    /// `--threads`: worker threads the QPs are spread over (bandwidth), each pinned.
    #[serde(default = "one")]
    pub threads: u32,
    /// `-b`: both sides send at once (bandwidth); both directions are reported.
    #[serde(default)]
    pub bidirectional: bool,
    /// `-e`: sleep on a completion channel instead of busy-polling the CQs.
    #[serde(default)]
    pub events: bool,
    /// `-l`: post work requests in chains of exactly this many (one doorbell each).
    /// `None`: post whatever room the send window has as one chain.
    #[serde(default)]
    pub post_list: Option<u32>,
    /// Receive queue depth (`-r`) where the peer posts receives (SEND, WRITE with immediate).
    pub rx_depth: u32,
    /// Outstanding RDMA READs and atomics per QP; `None` means min(16, the device's max_qp_rd_atom).
    pub outstanding_reads: Option<u32>,
    /// Inline threshold in bytes; `None` means the default for the test, clamped to the device.
    pub inline_size: Option<u32>,
    /// Path MTU in bytes; `None` means the smaller of the two ports' active MTUs.
    pub mtu: Option<u32>,
    /// Fill every message with a per-iteration pattern and check it where it lands.
    pub validate_data: bool,
    /// `--profile`: the platform mode the pair is checked against (exclusive modes fail
    /// when both sides hold the same physical NIC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// `-R`: connect the QPs with rdma_cm instead of the endpoint exchange.
    #[serde(default)]
    pub rdma_cm: bool,
    /// Fault injection for tests: flip one payload byte at this iteration (needs validate_data).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub corrupt_at: Option<u64>,
    /// Ring tests: the ring's capacity, notification and batching.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ring: Option<RingParams>,
    /// Traffic class, SL, flow label, hop limit and RC retransmission (`spec::fabric`).
    #[serde(default)]
    pub fabric: Fabric,
    /// `--warmup`: iterations run before each size's measurement, excluded from its figures.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub warmup: u64,
    /// `--interval`: with `-D`, report the figures of every interval of this many seconds
    /// as the run goes (a soak).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval_secs: Option<f64>,
    /// Request PCIe relaxed ordering on the registrations (`--no-relaxed-ordering`: off).
    #[serde(default = "yes")]
    pub relaxed_ordering: bool,
    /// `--hugepages`: buffers on huge pages.
    #[serde(default, skip_serializing_if = "is_false")]
    pub hugepages: bool,
    /// `--odp`: register for on-demand paging.
    #[serde(default, skip_serializing_if = "is_false")]
    pub odp: bool,
}

fn yes() -> bool {
    true
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The most warm-up iterations a size may have.
pub const MAX_WARMUP: u64 = 100_000_000;

/// The shortest and longest soak interval, seconds.
pub const INTERVAL_RANGE: (f64, f64) = (0.1, 3600.0);

/// A bandwidth test requests a completion at least once per this many bytes sent.
pub const SIGNAL_BYTES: u64 = 8 << 20;

/// perftest's defaults for one test.
pub struct Defaults {
    pub size: u64,
    pub iterations: u64,
    pub tx_depth: u32,
    pub inline_size: u32,
}

impl TestSpec {
    /// A spec with perftest's defaults for this test, over RC.
    pub fn new(operation: Operation, measure: Measure) -> TestSpec {
        let d = Self::defaults(operation, measure);
        TestSpec {
            operation,
            measure,
            transport: Transport::Rc,
            with_imm: false,
            atomic_op: AtomicOp::FetchAndAdd,
            sizes: vec![d.size],
            iterations: d.iterations,
            duration_secs: None,
            tx_depth: d.tx_depth,
            cq_mod: DEFAULT_CQ_MOD,
            events: false,
            num_qps: 1,
            threads: 1,
            bidirectional: false,
            post_list: None,
            rx_depth: DEFAULT_RX_DEPTH,
            outstanding_reads: None,
            inline_size: None,
            mtu: None,
            validate_data: false,
            rdma_cm: false,
            profile: None,
            corrupt_at: None,
            ring: TestSpec::default_ring(operation, measure, d.size),
            fabric: Fabric::default(),
            warmup: 0,
            interval_secs: None,
            relaxed_ordering: true,
            hugepages: false,
            odp: false,
        }
    }

    /// The warm-up pass of a size: this spec for `warmup` iterations (the same traffic,
    /// checked the same way), without intervals; None when there is none.
    pub fn warmup_pass(&self) -> Option<TestSpec> {
        (self.warmup > 0).then(|| TestSpec {
            iterations: self.warmup,
            duration_secs: None,
            interval_secs: None,
            corrupt_at: None,
            warmup: 0,
            ..self.clone()
        })
    }

    /// A ring test's ring unless told otherwise, for records up to `max_size`.
    /// ring-lat polls like write-lat (which spins on the last byte, as perftest does): the
    /// same placement-order assumption, documented in `crate::ring`. Its ring is small:
    /// one record is in flight, and a ring that stays in cache (and in the TLB) answers
    /// faster. ring-bw's ring holds 32 records: as much in flight as write-bw keeps (a ring
    /// of 16 records left ring-bw short of write-bw; results/bench-ring-rxe.md).
    pub fn default_ring(operation: Operation, measure: Measure, max_size: u64) -> Option<RingParams> {
        (operation == Operation::Ring).then(|| match measure {
            Measure::Latency => RingParams {
                capacity: RingParams::default_capacity(8, 64 << 10, max_size),
                notify: Notify::Poll,
                batch: 1,
                // A ping-pong's waits are each one round trip: a wake-up would double it.
                wait: Wait::Spin,
            },
            Measure::Bandwidth => RingParams {
                capacity: RingParams::default_capacity(32, 1 << 20, max_size),
                notify: Notify::Imm,
                batch: 16,
                wait: Wait::Adaptive,
            },
        })
    }

    /// perftest's test name: `write_lat`, `write_bw`.
    pub fn name(&self) -> String {
        let op = self.operation.label();
        let kind = match self.measure {
            Measure::Latency => "lat",
            Measure::Bandwidth => "bw",
        };
        format!("{op}_{kind}")
    }

    pub fn defaults(operation: Operation, measure: Measure) -> Defaults {
        let size = match (operation, measure) {
            (Operation::Atomic, _) => 8,
            (_, Measure::Latency) => 2,
            (_, Measure::Bandwidth) => 65536,
        };
        let iterations = match (operation, measure) {
            (Operation::Write | Operation::Ring, Measure::Bandwidth) => 5000,
            _ => 1000,
        };
        let (tx_depth, inline_size) = match (operation, measure) {
            (Operation::Write, Measure::Latency) => (1, 220),
            // The echo of ring-lat needs a credit write beside each record now and then.
            (Operation::Ring, Measure::Latency) => (16, 220),
            (Operation::Ring, Measure::Bandwidth) => (128, 220),
            (Operation::Send, Measure::Latency) => (1, 236),
            (_, Measure::Latency) => (1, 0),
            (_, Measure::Bandwidth) => (128, 0),
        };
        Defaults { size, iterations, tx_depth, inline_size }
    }

    /// Connections (QP + buffer) per side: `-q`, except ring-lat, whose echo comes back on a
    /// ring of its own.
    pub fn lanes(&self) -> u32 {
        if self.operation == Operation::Ring && self.measure == Measure::Latency { 2 } else { self.num_qps }
    }

    /// Whether the passive side must post receives: SEND, and WRITE with immediate.
    pub fn uses_receives(&self) -> bool {
        self.operation == Operation::Send || (self.operation == Operation::Write && self.with_imm)
    }

    /// Whether the operation moves a payload that `--validate-data` can check.
    pub fn has_payload(&self) -> bool {
        self.operation != Operation::Atomic
    }

    /// Outstanding reads/atomics actually requested, given the device's max_qp_rd_atom.
    pub fn effective_outstanding_reads(&self, device_max: u32) -> u32 {
        self.outstanding_reads.unwrap_or(device_max.clamp(1, 16))
    }

    /// Every size of an `-a` sweep: powers of two from 2 B to 8 MiB.
    pub fn sweep_sizes() -> Vec<u64> {
        (1..=23).map(|p| 1u64 << p).collect()
    }

    pub fn max_size(&self) -> u64 {
        self.sizes.iter().copied().max().unwrap_or(0)
    }

    /// Completion moderation actually used: never more than the queue depth (perftest does the same).
    pub fn effective_cq_mod(&self) -> u32 {
        self.cq_mod.clamp(1, self.tx_depth.max(1))
    }

    /// How often a bandwidth test at `size` requests a completion: the CQ moderation,
    /// but at least once per `SIGNAL_BYTES`, so large messages still complete (and show
    /// progress to the peer-loss deadline and the peak meter) every few milliseconds
    /// instead of after hundreds of megabytes. (perftest turns moderation off above a
    /// size for the same reason.)
    pub fn signal_every(&self, size: u64) -> u32 {
        let by_bytes = (SIGNAL_BYTES / size.max(1)).clamp(1, u32::MAX as u64) as u32;
        self.effective_cq_mod().min(by_bytes)
    }

    /// Inline threshold actually requested from the device.
    pub fn requested_inline(&self) -> u32 {
        self.inline_size.unwrap_or_else(|| Self::defaults(self.operation, self.measure).inline_size)
    }

    /// Checks that need no device, options named by flag. Both sides run it: the server
    /// never trusts the wire.
    pub fn check(&self) -> Result<()> {
        self.check_named(Field::flag).map_err(|r| Error::Usage(r.message))
    }

    /// [`TestSpec::check`] with options named by `n` (flags, or workload keys), and the
    /// option at fault.
    pub fn check_named(&self, n: Names) -> std::result::Result<(), Refusal> {
        let no = |field: Field, message: String| Err(Refusal { field, message });
        if self.sizes.is_empty() {
            return no(Field::Size, format!("no message size given; use {} BYTES or -a", n(Field::Size)));
        }
        if self.sizes.contains(&0) {
            return no(
                Field::Size,
                format!(
                    "message size 0 is not allowed; use {} with 1 or more bytes (up to the device's max message size)",
                    n(Field::Size)
                ),
            );
        }
        self.fabric.check(n)?;
        if let Some(&big) = self.sizes.iter().find(|&&s| s > MAX_MESSAGE_SIZE) {
            return no(
                Field::Size,
                format!(
                    "message size {big} exceeds {MAX_MESSAGE_SIZE} B (2 GiB), the largest RDMA message; use {} \
                     1..={MAX_MESSAGE_SIZE}",
                    n(Field::Size)
                ),
            );
        }
        if self.sizes.len() > MAX_SIZES {
            return no(
                Field::Size,
                format!("{} sizes in one test; at most {MAX_SIZES}: split the sweep", self.sizes.len()),
            );
        }
        if self.duration_secs.is_none() && self.iterations == 0 {
            return no(
                Field::Iterations,
                format!("iterations must be at least 1; use {} 1 or more", n(Field::Iterations)),
            );
        }
        if let Some(d) = self.duration_secs
            && !(d.is_finite() && d > 0.0 && d <= 86_400.0)
        {
            return no(
                Field::Duration,
                format!("duration {d} s is out of range; use {} with 1..=86400 seconds", n(Field::Duration)),
            );
        }
        if self.warmup > MAX_WARMUP {
            return no(
                Field::Warmup,
                format!("{} warm-up iterations per size; use {} 0..={MAX_WARMUP}", self.warmup, n(Field::Warmup)),
            );
        }
        if let Some(every) = self.interval_secs {
            let (lo, hi) = INTERVAL_RANGE;
            let Some(d) = self.duration_secs else {
                return no(
                    Field::Interval,
                    format!(
                        "{} reports a soak's intervals: give the run's length with {}",
                        n(Field::Interval),
                        n(Field::Duration)
                    ),
                );
            };
            if !(every.is_finite() && (lo..=hi).contains(&every) && every <= d) {
                return no(
                    Field::Interval,
                    format!(
                        "interval {every} s is out of range; use {} {lo}..={hi} seconds, at most {} ({d} s)",
                        n(Field::Interval),
                        n(Field::Duration)
                    ),
                );
            }
            if self.operation == Operation::Ring || self.threads > 1 || self.bidirectional {
                return no(
                    Field::Interval,
                    format!(
                        "{} applies to latency tests and one-thread, one-direction bandwidth tests; drop {}",
                        n(Field::Interval),
                        if self.operation == Operation::Ring {
                            "it for ring tests"
                        } else if self.threads > 1 {
                            n(Field::Threads)
                        } else {
                            n(Field::Bidirectional)
                        }
                    ),
                );
            }
        }
        if self.tx_depth == 0 {
            return no(
                Field::TxDepth,
                format!(
                    "tx depth 0 is not allowed; use {} 1 or more (up to the device's max_qp_wr)",
                    n(Field::TxDepth)
                ),
            );
        }
        if self.cq_mod == 0 {
            return no(Field::CqMod, format!("CQ moderation 0 is not allowed; use {} 1 or more", n(Field::CqMod)));
        }
        if let Some(mtu) = self.mtu
            && ![256, 512, 1024, 2048, 4096].contains(&mtu)
        {
            return no(
                Field::Mtu,
                format!("MTU {mtu} is not an RDMA path MTU; use {} 256, 512, 1024, 2048 or 4096", n(Field::Mtu)),
            );
        }
        self.check_combination(n)?;
        self.check_ring(n)?;
        if self.rx_depth == 0 {
            return no(
                Field::RxDepth,
                format!(
                    "rx depth 0 is not allowed; use {} 1 or more (up to the device's max_qp_wr)",
                    n(Field::RxDepth)
                ),
            );
        }
        if self.events && self.measure == Measure::Latency && self.operation == Operation::Write && !self.with_imm {
            return no(
                Field::Events,
                format!(
                    "{} waits for completions, but write-lat sees each arrival in memory; use {} with {}",
                    n(Field::Events),
                    n(Field::WithImm),
                    n(Field::Events)
                ),
            );
        }
        if self.num_qps == 0 || self.num_qps > MAX_QPS {
            return no(
                Field::Qps,
                format!("{} QPs is out of range; use {} 1..={MAX_QPS}", self.num_qps, n(Field::Qps)),
            );
        }
        if self.num_qps > 1 && self.measure == Measure::Latency {
            return no(
                Field::Qps,
                format!(
                    "{} applies to bandwidth tests: a latency test measures one message in flight on one QP",
                    n(Field::Qps)
                ),
            );
        }
        if self.threads == 0 || self.threads > self.num_qps {
            return no(
                Field::Threads,
                format!(
                    "{} {} needs at least as many QPs ({} {}); use {} 1..={} or raise {}",
                    n(Field::Threads),
                    self.threads,
                    n(Field::Qps),
                    self.num_qps,
                    n(Field::Threads),
                    self.num_qps,
                    n(Field::Qps)
                ),
            );
        }
        if self.bidirectional && self.measure == Measure::Latency {
            return no(
                Field::Bidirectional,
                format!(
                    "{} applies to bandwidth tests: a ping-pong latency test already runs both ways",
                    n(Field::Bidirectional)
                ),
            );
        }
        if let Some(l) = self.post_list {
            if self.measure == Measure::Latency {
                return no(
                    Field::PostList,
                    format!(
                        "post lists ({}) apply to bandwidth tests: a latency test has one message in flight",
                        n(Field::PostList)
                    ),
                );
            }
            if l == 0 || l > self.tx_depth {
                return no(
                    Field::PostList,
                    format!(
                        "post list {l} must be 1..=tx depth {}; use {} 1..={} (or raise {})",
                        self.tx_depth,
                        n(Field::PostList),
                        self.tx_depth,
                        n(Field::TxDepth)
                    ),
                );
            }
        }
        if self.outstanding_reads == Some(0) {
            return no(
                Field::OutstandingReads,
                format!("{} 0 is not allowed; use 1 or more", n(Field::OutstandingReads)),
            );
        }
        if self.corrupt_at.is_some() && !self.validate_data && self.has_payload() {
            return no(
                Field::InjectCorruption,
                format!("{} needs {}", n(Field::InjectCorruption), n(Field::ValidateData)),
            );
        }
        Ok(())
    }
}

impl TestSpec {
    /// Where a ring test's rings and credit words lie in each side's buffer.
    pub fn ring_layout(&self) -> Option<ring::RingLayout> {
        self.ring.map(|r| ring::RingLayout::new(r.capacity, self.tx_depth))
    }

    /// A ring test's own rules: a valid ring, records that fit it, and the options that
    /// have a meaning for a ring.
    fn check_ring(&self, n: Names) -> std::result::Result<(), Refusal> {
        let no = |field: Field, message: String| Err(Refusal { field, message });
        if (self.operation == Operation::Ring) != self.ring.is_some() {
            return no(
                Field::Capacity,
                format!(
                    "{}, {} and {} apply to ring-bw and ring-lat only, not {}; drop them",
                    n(Field::Capacity),
                    n(Field::Batch),
                    n(Field::Notify),
                    self.name().replace('_', "-")
                ),
            );
        }
        let Some(ring) = self.ring else { return Ok(()) };
        ring::check(&ring, self.tx_depth, self.rx_depth, n)?;
        let max = ring::max_record(ring.capacity);
        if self.max_size() > max {
            return no(
                Field::Size,
                format!(
                    "record size {} B does not fit a ring of {} B (at most {max} B per record); raise {} to {} or more",
                    self.max_size(),
                    ring.capacity,
                    n(Field::Capacity),
                    ring::span(self.max_size()).next_power_of_two()
                ),
            );
        }
        if self.validate_data && self.sizes.iter().any(|&s| s < 16) {
            return no(
                Field::Size,
                format!(
                    "{} stamps each record with its number and a checksum (16 B): use {} 16 or more",
                    n(Field::ValidateData),
                    n(Field::Size)
                ),
            );
        }
        let refused = [
            (Field::Transport, " UC/UD (rings run over RC)", self.transport != Transport::Rc),
            (Field::Qps, "", self.num_qps != 1),
            (Field::Threads, "", self.threads != 1),
            (Field::Bidirectional, "", self.bidirectional),
            (Field::PostList, "", self.post_list.is_some()),
            (Field::Events, "", self.events),
            (Field::WithImm, " (use --notify imm)", self.with_imm),
            (Field::RdmaCm, "", self.rdma_cm),
            // A ring requests completions by its batches; -Q would change nothing.
            (Field::CqMod, " (a ring requests completions by --batch)", self.cq_mod != DEFAULT_CQ_MOD),
        ];
        if let Some((field, why, _)) = refused.iter().find(|(_, _, on)| *on) {
            return no(*field, format!("{}{why} does not apply to ring tests; drop it", n(*field)));
        }
        Ok(())
    }

    /// Refuses operation/transport/option combinations that cannot work, with the reason.
    fn check_combination(&self, n: Names) -> std::result::Result<(), Refusal> {
        let no = |field: Field, message: String| Err(Refusal { field, message });
        let op = self.operation.label();
        match (self.operation, self.transport) {
            (_, Transport::Rc)
            | (Operation::Ring, _)
            | (Operation::Write | Operation::Send, Transport::Uc)
            | (Operation::Send, Transport::Ud) => {}
            (Operation::Read | Operation::Atomic, Transport::Uc) => {
                return no(
                    Field::Transport,
                    format!(
                        "{op} over UC is not possible: UC has no responder resources for RDMA READ or atomics; use {} RC",
                        n(Field::Transport)
                    ),
                );
            }
            (_, Transport::Ud) => {
                return no(
                    Field::Transport,
                    format!(
                        "{op} over UD is not possible: UD carries only SEND (no remote memory access); use {} RC{}",
                        n(Field::Transport),
                        if self.operation == Operation::Write { " or UC" } else { "" }
                    ),
                );
            }
        }
        if self.rdma_cm && self.transport != Transport::Rc {
            return no(
                Field::RdmaCm,
                format!(
                    "{1} connects RC queue pairs: rdma_cm's connected port space has no {0} QPs, and {0} over rdma_cm \
                     is not supported here; drop {1} (the default exchange connects {0})",
                    self.transport.label(),
                    n(Field::RdmaCm)
                ),
            );
        }
        if self.with_imm && !matches!(self.operation, Operation::Write | Operation::Send) {
            return no(Field::WithImm, format!("{} applies to write and send tests, not {op}", n(Field::WithImm)));
        }
        if self.operation == Operation::Atomic && self.sizes != [8] {
            return no(
                Field::Size,
                format!("atomic operations are 8 bytes: drop {0}/-a (or use {0} 8)", n(Field::Size)),
            );
        }
        if self.validate_data && !self.has_payload() {
            // Atomics are always checked: the final counter against the number of operations.
            return no(
                Field::ValidateData,
                format!(
                    "{} applies to tests that move a payload; atomic tests always check the final counter",
                    n(Field::ValidateData)
                ),
            );
        }
        Ok(())
    }
}

/// The limits of one device and port that a spec must fit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceLimits {
    pub device: String,
    pub max_msg_size: u64,
    pub max_qp_wr: u32,
    pub max_cqe: u32,
    /// Largest inline size the device accepts for this QP type (probed at QP creation).
    pub max_inline: u32,
    pub active_mtu: u32,
    pub max_qp_rd_atom: u32,
    /// False when the device cannot do atomics at all.
    pub atomics: bool,
}

/// Checks a spec against one side's device limits. Explicit values above a limit are
/// errors naming the limit; the default inline size is clamped silently instead.
pub fn check_against_device(spec: &TestSpec, lim: &DeviceLimits) -> Result<()> {
    let max = spec.max_size();
    if max > lim.max_msg_size {
        return Err(Error::Usage(format!(
            "message size {max} B exceeds {}'s max message size {} B; use -s 1..={}",
            lim.device, lim.max_msg_size, lim.max_msg_size
        )));
    }
    if spec.tx_depth > lim.max_qp_wr {
        return Err(Error::Usage(format!(
            "tx depth {} exceeds {}'s max_qp_wr {}; use -t 1..={}",
            spec.tx_depth, lim.device, lim.max_qp_wr, lim.max_qp_wr
        )));
    }
    if spec.tx_depth > lim.max_cqe {
        return Err(Error::Usage(format!(
            "tx depth {} exceeds {}'s max CQ entries {}; use -t 1..={}",
            spec.tx_depth, lim.device, lim.max_cqe, lim.max_cqe
        )));
    }
    if let Some(inline) = spec.inline_size
        && inline > lim.max_inline
    {
        return Err(Error::Usage(format!(
            "inline size {inline} B exceeds {}'s max inline data {} B; use -I 0..={}",
            lim.device, lim.max_inline, lim.max_inline
        )));
    }
    if spec.uses_receives() && spec.rx_depth > lim.max_qp_wr {
        return Err(Error::Usage(format!(
            "rx depth {} exceeds {}'s max_qp_wr {}; use -r 1..={}",
            spec.rx_depth, lim.device, lim.max_qp_wr, lim.max_qp_wr
        )));
    }
    if matches!(spec.operation, Operation::Read | Operation::Atomic)
        && let Some(n) = spec.outstanding_reads
        && n > lim.max_qp_rd_atom
    {
        return Err(Error::Usage(format!(
            "{n} outstanding reads exceed {}'s max_qp_rd_atom {}; use --outstanding-reads 1..={}",
            lim.device, lim.max_qp_rd_atom, lim.max_qp_rd_atom
        )));
    }
    if spec.operation == Operation::Atomic && !lim.atomics {
        return Err(Error::Environment(format!("{} does not support atomic operations (atomic_cap NONE)", lim.device)));
    }
    if spec.transport == Transport::Ud {
        let mtu = spec.mtu.unwrap_or(lim.active_mtu);
        if max > mtu as u64 {
            return Err(Error::Usage(format!(
                "UD messages must fit in one MTU: {max} B exceeds {mtu} B on {}; use -s 1..={mtu}",
                lim.device
            )));
        }
    }
    if let Some(mtu) = spec.mtu
        && mtu > lim.active_mtu
    {
        return Err(Error::Usage(format!(
            "MTU {mtu} exceeds {}'s active MTU {}; use -m {} or less",
            lim.device, lim.active_mtu, lim.active_mtu
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    pub fn spec() -> TestSpec {
        TestSpec::new(Operation::Write, Measure::Bandwidth)
    }

    fn limits() -> DeviceLimits {
        DeviceLimits {
            device: "rxe0".into(),
            max_msg_size: 1 << 31,
            max_qp_wr: 1 << 20,
            max_cqe: 32767,
            max_inline: 416,
            active_mtu: 4096,
            max_qp_rd_atom: 128,
            atomics: true,
        }
    }

    fn usage(r: Result<()>) -> String {
        match r {
            Err(Error::Usage(m)) => m,
            other => panic!("expected a usage error, got {other:?}"),
        }
    }

    #[test]
    fn defaults_pass() {
        spec().check().unwrap();
        check_against_device(&spec(), &limits()).unwrap();
    }

    #[test]
    fn size_zero_is_refused_with_the_fix() {
        let mut s = spec();
        s.sizes = vec![0];
        let m = usage(s.check());
        assert!(m.contains("size 0") && m.contains("-s"), "{m}");
    }

    #[test]
    fn zero_depth_iterations_and_moderation_are_refused() {
        let mut s = spec();
        s.tx_depth = 0;
        assert!(usage(s.check()).contains("-t"));
        let mut s = spec();
        s.iterations = 0;
        assert!(usage(s.check()).contains("-n"));
        let mut s = spec();
        s.cq_mod = 0;
        assert!(usage(s.check()).contains("-Q"));
    }

    #[test]
    fn duration_replaces_iterations_and_must_be_sane() {
        let mut s = spec();
        s.iterations = 0;
        s.duration_secs = Some(2.0);
        s.check().unwrap();
        s.duration_secs = Some(-1.0);
        assert!(usage(s.check()).contains("-D"));
        s.duration_secs = Some(f64::NAN);
        assert!(usage(s.check()).contains("-D"));
    }

    #[test]
    fn a_soak_needs_a_duration_and_a_sane_interval_and_warm_up_is_its_own_pass() {
        let mut s = TestSpec::new(Operation::Write, Measure::Bandwidth);
        s.interval_secs = Some(5.0);
        assert!(usage(s.check()).contains("give the run's length with -D"));
        s.duration_secs = Some(60.0);
        s.check().unwrap();
        for bad in [0.0, 0.05, 61.0, f64::INFINITY] {
            s.interval_secs = Some(bad);
            assert!(usage(s.check()).contains("0.1..=3600"), "{bad}");
        }
        s.interval_secs = Some(5.0);
        s.threads = 2;
        s.num_qps = 2;
        assert!(usage(s.check()).contains("drop --threads"));
        let mut ring = TestSpec::new(Operation::Ring, Measure::Bandwidth);
        (ring.duration_secs, ring.interval_secs) = (Some(10.0), Some(1.0));
        assert!(usage(ring.check()).contains("ring tests"));
        s.threads = 1;
        s.warmup = MAX_WARMUP + 1;
        assert!(usage(s.check()).contains("--warmup 0..="));
        s.warmup = 500;
        s.validate_data = true;
        let w = s.warmup_pass().unwrap();
        assert_eq!((w.iterations, w.duration_secs, w.interval_secs, w.warmup), (500, None, None, 0));
        assert!(w.validate_data, "a warm-up moves the same data");
        assert_eq!(TestSpec::new(Operation::Write, Measure::Latency).warmup_pass(), None);
    }

    #[test]
    fn rdma_cm_connects_rc_only() {
        for op in [Operation::Write, Operation::Read, Operation::Send, Operation::Atomic] {
            let mut s = TestSpec::new(op, Measure::Bandwidth);
            s.rdma_cm = true;
            s.check().unwrap();
        }
        for (op, transport) in [(Operation::Send, Transport::Ud), (Operation::Write, Transport::Uc)] {
            let mut s = TestSpec::new(op, Measure::Latency);
            s.rdma_cm = true;
            s.transport = transport;
            let m = usage(s.check());
            assert!(m.contains("-R connects RC") && m.contains(transport.label()) && m.contains("drop -R"), "{m}");
        }
    }

    #[test]
    fn bad_mtu_lists_valid_values() {
        let mut s = spec();
        s.mtu = Some(1500);
        let m = usage(s.check());
        assert!(m.contains("1024") && m.contains("4096"), "{m}");
    }

    #[test]
    fn device_limits_are_named_in_errors() {
        let mut s = spec();
        s.sizes = vec![1 << 32];
        let m = usage(check_against_device(&s, &limits()));
        assert!(m.contains("max message size 2147483648") && m.contains("rxe0"), "{m}");

        let mut s = spec();
        s.tx_depth = 2_000_000;
        let m = usage(check_against_device(&s, &limits()));
        assert!(m.contains("max_qp_wr 1048576") && m.contains("-t 1..=1048576"), "{m}");

        let mut s = spec();
        s.inline_size = Some(1024);
        let m = usage(check_against_device(&s, &limits()));
        assert!(m.contains("max inline data 416") && m.contains("-I 0..=416"), "{m}");

        let mut s = spec();
        s.mtu = Some(4096);
        let mut l = limits();
        l.active_mtu = 1024;
        assert!(usage(check_against_device(&s, &l)).contains("active MTU 1024"));
    }

    #[test]
    fn default_inline_is_not_an_error_even_above_the_device() {
        let mut s = spec();
        s.measure = Measure::Latency;
        let mut l = limits();
        l.max_inline = 64;
        check_against_device(&s, &l).unwrap();
        assert_eq!(s.requested_inline(), 220);
    }

    #[test]
    fn cq_moderation_is_capped_by_depth() {
        let mut s = spec();
        s.tx_depth = 16;
        assert_eq!(s.effective_cq_mod(), 16);
        s.tx_depth = 128;
        assert_eq!(s.effective_cq_mod(), 100);
        assert_eq!(s.signal_every(65536), 100, "8 MiB / 64 KiB = 128: moderation unchanged");
        assert_eq!(s.signal_every(1 << 20), 8);
        assert_eq!(s.signal_every(8 << 20), 1);
    }

    #[test]
    fn transports_refuse_what_they_cannot_carry_with_the_reason() {
        let cases = [
            (Operation::Read, Transport::Uc, "UC has no responder resources"),
            (Operation::Atomic, Transport::Uc, "UC has no responder resources"),
            (Operation::Write, Transport::Ud, "UD carries only SEND"),
            (Operation::Read, Transport::Ud, "UD carries only SEND"),
            (Operation::Atomic, Transport::Ud, "UD carries only SEND"),
        ];
        for (op, t, why) in cases {
            let mut s = spec();
            s.operation = op;
            s.transport = t;
            if op == Operation::Atomic {
                s.sizes = vec![8];
            }
            let m = usage(s.check());
            assert!(m.contains(why) && m.contains("-c RC"), "{op:?}/{t:?}: {m}");
        }
        for (op, t) in
            [(Operation::Write, Transport::Uc), (Operation::Send, Transport::Uc), (Operation::Send, Transport::Ud)]
        {
            let mut s = spec();
            s.operation = op;
            s.transport = t;
            s.check().unwrap();
        }
    }

    #[test]
    fn immediate_atomic_size_and_validation_combinations() {
        let mut s = spec();
        s.operation = Operation::Read;
        s.with_imm = true;
        assert!(usage(s.check()).contains("--with-imm"));
        let mut s = spec();
        s.operation = Operation::Atomic;
        assert!(usage(s.check()).contains("8 bytes"), "default 64 KiB size is refused for atomics");
        s.sizes = vec![8];
        s.check().unwrap();
        s.validate_data = true;
        assert!(usage(s.check()).contains("final counter"));
        let mut s = spec();
        s.operation = Operation::Send;
        s.with_imm = true;
        s.check().unwrap();
        assert!(s.uses_receives());
    }

    #[test]
    fn read_depth_rx_depth_atomics_and_ud_size_are_checked_against_the_device() {
        let mut s = spec();
        s.operation = Operation::Read;
        s.outstanding_reads = Some(200);
        let m = usage(check_against_device(&s, &limits()));
        assert!(m.contains("max_qp_rd_atom 128") && m.contains("--outstanding-reads 1..=128"), "{m}");
        assert_eq!(s.effective_outstanding_reads(128), 200);
        s.outstanding_reads = None;
        assert_eq!(s.effective_outstanding_reads(128), 16);
        assert_eq!(s.effective_outstanding_reads(4), 4);

        let mut s = spec();
        s.operation = Operation::Send;
        s.rx_depth = 2_000_000;
        assert!(usage(check_against_device(&s, &limits())).contains("-r 1..="));

        let mut s = spec();
        s.operation = Operation::Atomic;
        s.sizes = vec![8];
        let mut l = limits();
        l.atomics = false;
        assert_eq!(check_against_device(&s, &l).unwrap_err().exit_code(), 3);

        let mut s = spec();
        s.operation = Operation::Send;
        s.transport = Transport::Ud;
        s.sizes = vec![8192];
        let m = usage(check_against_device(&s, &limits()));
        assert!(m.contains("one MTU") && m.contains("-s 1..=4096"), "{m}");
    }

    #[test]
    fn post_lists_need_a_bandwidth_test_and_fit_the_queue() {
        let mut s = spec();
        s.post_list = Some(16);
        s.check().unwrap();
        s.post_list = Some(129);
        assert!(usage(s.check()).contains("-l 1..=128"));
        s.post_list = Some(0);
        assert!(usage(s.check()).contains("-l 1..=128"));
        let mut s = TestSpec::new(Operation::Write, Measure::Latency);
        s.post_list = Some(2);
        assert!(usage(s.check()).contains("bandwidth tests"));
    }

    #[test]
    fn several_qps_are_for_bandwidth_and_bounded() {
        let mut s = spec();
        s.num_qps = 4;
        s.check().unwrap();
        s.num_qps = 0;
        assert!(usage(s.check()).contains("-q 1..=256"));
        s.num_qps = 257;
        assert!(usage(s.check()).contains("-q 1..=256"));
        let mut s = TestSpec::new(Operation::Send, Measure::Latency);
        s.num_qps = 2;
        assert!(usage(s.check()).contains("bandwidth tests"));
        s.num_qps = 1;
        let mut t = spec();
        t.num_qps = 4;
        t.threads = 2;
        t.check().unwrap();
        t.threads = 5;
        assert!(usage(t.check()).contains("--threads 1..=4"));
        s.bidirectional = true;
        assert!(usage(s.check()).contains("-b applies to bandwidth"));
    }

    #[test]
    fn sweep_is_2_bytes_to_8_mib() {
        let s = TestSpec::sweep_sizes();
        assert_eq!(s.first(), Some(&2));
        assert_eq!(s.last(), Some(&SWEEP_MAX));
        assert_eq!(s.len(), 23);
    }
}
