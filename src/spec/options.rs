//! The options a user gives a test, by flag or by workload key, all optional: the CLI and
//! workload files fill the same struct, and [`Options::spec`] applies the defaults in one
//! place. [`Field`] names each option both ways, so a refusal says `-t` on the command line
//! and `tx_depth` in a workload without either side parsing messages.

use super::fabric::FabricOptions;
use super::ring::Wait;
use super::{AtomicOp, Measure, Notify, Operation, RingParams, TestSpec, Transport};

/// One option of a test, with its flag and its workload key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    Transport,
    WithImm,
    AtomicOp,
    RxDepth,
    OutstandingReads,
    Size,
    Iterations,
    Duration,
    TxDepth,
    CqMod,
    PostList,
    Qps,
    Threads,
    Bidirectional,
    Events,
    Inline,
    Mtu,
    ValidateData,
    RdmaCm,
    Profile,
    InjectCorruption,
    Capacity,
    Batch,
    Notify,
    TrafficClass,
    ServiceLevel,
    FlowLabel,
    HopLimit,
    QpTimeout,
    RetryCount,
    RnrRetry,
    Warmup,
    Interval,
    NoRelaxedOrdering,
    Hugepages,
    Odp,
    Wait,
}

impl Field {
    /// (field, flag, workload key)
    const NAMES: [(Field, &'static str, &'static str); 37] = [
        (Field::Transport, "-c", "transport"),
        (Field::WithImm, "--with-imm", "with_imm"),
        (Field::AtomicOp, "-A", "atomic_op"),
        (Field::RxDepth, "-r", "rx_depth"),
        (Field::OutstandingReads, "--outstanding-reads", "outstanding_reads"),
        (Field::Size, "-s", "size"),
        (Field::Iterations, "-n", "iterations"),
        (Field::Duration, "-D", "duration"),
        (Field::TxDepth, "-t", "tx_depth"),
        (Field::CqMod, "-Q", "cq_mod"),
        (Field::PostList, "-l", "post_list"),
        (Field::Qps, "-q", "qps"),
        (Field::Threads, "--threads", "threads"),
        (Field::Bidirectional, "-b", "bidirectional"),
        (Field::Events, "-e", "events"),
        (Field::Inline, "-I", "inline"),
        (Field::Mtu, "-m", "mtu"),
        (Field::ValidateData, "--validate-data", "validate_data"),
        (Field::RdmaCm, "-R", "rdma_cm"),
        (Field::Profile, "--profile", "profile"),
        (Field::InjectCorruption, "--inject-corruption", "inject_corruption"),
        (Field::Capacity, "--capacity", "capacity"),
        (Field::Batch, "--batch", "batch"),
        (Field::Notify, "--notify", "notify"),
        (Field::TrafficClass, "--tclass", "tclass"),
        (Field::ServiceLevel, "--sl", "sl"),
        (Field::FlowLabel, "--flow-label", "flow_label"),
        (Field::HopLimit, "--hop-limit", "hop_limit"),
        (Field::QpTimeout, "-u", "qp_timeout"),
        (Field::RetryCount, "--retry-count", "retry_count"),
        (Field::RnrRetry, "--rnr-retry", "rnr_retry"),
        (Field::Warmup, "--warmup", "warmup"),
        (Field::Interval, "--interval", "interval"),
        (Field::NoRelaxedOrdering, "--no-relaxed-ordering", "relaxed_ordering"),
        (Field::Hugepages, "--hugepages", "hugepages"),
        (Field::Odp, "--odp", "odp"),
        (Field::Wait, "--wait", "wait"),
    ];

    fn names(self) -> (&'static str, &'static str) {
        let (_, flag, key) = Self::NAMES.iter().find(|(f, _, _)| *f == self).expect("every field is named");
        (flag, key)
    }

    /// The command line's name: `-t`.
    pub fn flag(self) -> &'static str {
        self.names().0
    }

    /// The workload file's name: `tx_depth`.
    pub fn key(self) -> &'static str {
        self.names().1
    }

    /// The command line's flag of the workload key `key` (`tx_depth`: `-t`).
    pub fn flag_of_key(key: &str) -> Option<&'static str> {
        Self::NAMES.iter().find(|(_, _, k)| *k == key).map(|(_, flag, _)| *flag)
    }
}

/// How a message names an option: by flag (the CLI, the wire) or by key (workload files).
pub type Names = fn(Field) -> &'static str;

/// A spec refused before any device is touched: the option at fault and why, the message
/// naming options the way `Names` said.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    pub field: Field,
    pub message: String,
}

/// What a user gave; `None` (or false) where they gave nothing.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Options {
    pub transport: Option<Transport>,
    pub with_imm: bool,
    pub atomic_op: Option<AtomicOp>,
    pub rx_depth: Option<u32>,
    pub outstanding_reads: Option<u32>,
    /// One size, a list, or (with `-a`) the sweep.
    pub sizes: Option<Vec<u64>>,
    pub iterations: Option<u64>,
    pub duration: Option<f64>,
    pub tx_depth: Option<u32>,
    pub cq_mod: Option<u32>,
    pub post_list: Option<u32>,
    pub qps: Option<u32>,
    pub threads: Option<u32>,
    pub bidirectional: bool,
    pub events: bool,
    pub inline_size: Option<u32>,
    pub mtu: Option<u32>,
    pub validate_data: bool,
    pub rdma_cm: bool,
    pub profile: Option<String>,
    pub corrupt_at: Option<u64>,
    pub capacity: Option<u64>,
    pub batch: Option<u32>,
    pub notify: Option<Notify>,
    pub fabric: FabricOptions,
    pub warmup: Option<u64>,
    pub interval: Option<f64>,
    pub no_relaxed_ordering: bool,
    pub hugepages: bool,
    pub odp: bool,
    pub wait: Option<Wait>,
}

impl Options {
    /// The spec of this test with these options over its defaults (`TestSpec::new`). The
    /// ring's default size follows the records; ring options given to another test stay
    /// in the spec so that its check refuses them by name.
    pub fn spec(&self, operation: Operation, measure: Measure) -> TestSpec {
        let d = TestSpec::new(operation, measure);
        let mut spec = TestSpec {
            transport: self.transport.unwrap_or(d.transport),
            with_imm: self.with_imm,
            atomic_op: self.atomic_op.unwrap_or(d.atomic_op),
            rx_depth: self.rx_depth.unwrap_or(d.rx_depth),
            outstanding_reads: self.outstanding_reads,
            sizes: self.sizes.clone().unwrap_or_else(|| d.sizes.clone()),
            iterations: self.iterations.unwrap_or(d.iterations),
            duration_secs: self.duration,
            tx_depth: self.tx_depth.unwrap_or(d.tx_depth),
            // perftest: with -l, a completion per list unless -Q says otherwise.
            cq_mod: self.cq_mod.or(self.post_list).unwrap_or(d.cq_mod),
            post_list: self.post_list,
            events: self.events,
            bidirectional: self.bidirectional,
            num_qps: self.qps.unwrap_or(d.num_qps),
            threads: self.threads.unwrap_or(d.threads),
            inline_size: self.inline_size,
            mtu: self.mtu,
            validate_data: self.validate_data,
            rdma_cm: self.rdma_cm,
            profile: self.profile.clone(),
            corrupt_at: self.corrupt_at,
            fabric: self.fabric.fabric(),
            warmup: self.warmup.unwrap_or(d.warmup),
            interval_secs: self.interval,
            relaxed_ordering: !self.no_relaxed_ordering,
            hugepages: self.hugepages,
            odp: self.odp,
            ..d
        };
        let ring_given =
            self.capacity.is_some() || self.batch.is_some() || self.notify.is_some() || self.wait.is_some();
        let defaults = TestSpec::default_ring(operation, measure, spec.max_size()).or_else(|| {
            ring_given.then(|| TestSpec::default_ring(Operation::Ring, measure, spec.max_size())).flatten()
        });
        spec.ring = defaults.map(|d| RingParams {
            capacity: self.capacity.unwrap_or(d.capacity),
            notify: self.notify.unwrap_or(d.notify),
            batch: self.batch.unwrap_or(d.batch),
            wait: self.wait.unwrap_or(d.wait),
        });
        spec
    }

    /// The options given, in the order of [`Field`]: a server names those it ignores.
    pub fn given(&self) -> Vec<Field> {
        let given = [
            (Field::Transport, self.transport.is_some()),
            (Field::WithImm, self.with_imm),
            (Field::AtomicOp, self.atomic_op.is_some()),
            (Field::RxDepth, self.rx_depth.is_some()),
            (Field::OutstandingReads, self.outstanding_reads.is_some()),
            (Field::Size, self.sizes.is_some()),
            (Field::Iterations, self.iterations.is_some()),
            (Field::Duration, self.duration.is_some()),
            (Field::TxDepth, self.tx_depth.is_some()),
            (Field::CqMod, self.cq_mod.is_some()),
            (Field::PostList, self.post_list.is_some()),
            (Field::Qps, self.qps.is_some()),
            (Field::Threads, self.threads.is_some()),
            (Field::Bidirectional, self.bidirectional),
            (Field::Events, self.events),
            (Field::Inline, self.inline_size.is_some()),
            (Field::Mtu, self.mtu.is_some()),
            (Field::ValidateData, self.validate_data),
            (Field::RdmaCm, self.rdma_cm),
            (Field::Profile, self.profile.is_some()),
            (Field::InjectCorruption, self.corrupt_at.is_some()),
            (Field::Capacity, self.capacity.is_some()),
            (Field::Batch, self.batch.is_some()),
            (Field::Notify, self.notify.is_some()),
            (Field::Warmup, self.warmup.is_some()),
            (Field::Interval, self.interval.is_some()),
            (Field::NoRelaxedOrdering, self.no_relaxed_ordering),
            (Field::Hugepages, self.hugepages),
            (Field::Odp, self.odp),
            (Field::Wait, self.wait.is_some()),
        ];
        let mut fields: Vec<Field> = given.into_iter().filter(|(_, g)| *g).map(|(f, _)| f).collect();
        fields.extend(self.fabric.given());
        fields
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_names_the_option_as_the_caller_spells_it() {
        let spec = Options { tx_depth: Some(0), ..Options::default() }.spec(Operation::Write, Measure::Bandwidth);
        let by_flag = spec.check_named(Field::flag).unwrap_err();
        let by_key = spec.check_named(Field::key).unwrap_err();
        assert_eq!((by_flag.field, by_key.field), (Field::TxDepth, Field::TxDepth));
        assert!(by_flag.message.contains("use -t 1 or more"), "{}", by_flag.message);
        assert!(by_key.message.contains("use tx_depth 1 or more"), "{}", by_key.message);
        let ring = Options { capacity: Some(5000), ..Options::default() }.spec(Operation::Ring, Measure::Bandwidth);
        assert!(ring.check_named(Field::key).unwrap_err().message.contains("use capacity 8192"));
        assert!(ring.check().unwrap_err().message().contains("use --capacity 8192"));
    }

    #[test]
    fn defaults_apply_where_nothing_was_given_and_given_lists_what_was() {
        for (_, op, measure) in crate::spec::TESTS {
            assert_eq!(Options::default().spec(op, measure), TestSpec::new(op, measure));
        }
        assert!(Options::default().given().is_empty());
        let o = Options { tx_depth: Some(4), validate_data: true, notify: Some(Notify::Poll), ..Options::default() };
        assert_eq!(o.given(), vec![Field::TxDepth, Field::ValidateData, Field::Notify]);
        assert_eq!(o.given().iter().map(|f| f.flag()).collect::<Vec<_>>(), ["-t", "--validate-data", "--notify"]);
        // -l without -Q: a completion per list, as perftest.
        let l = Options { post_list: Some(8), ..Options::default() }.spec(Operation::Write, Measure::Bandwidth);
        assert_eq!(l.cq_mod, 8);
    }
}
