//! Command-line definitions. Test flags keep perftest's short letters and meanings, so
//! `rdmabench write-bw -d mlx5_0 -x 3 -s 65536 HOST` reads like `ib_write_bw`.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub mod docs;

use clap::{Args, Parser, Subcommand};

use crate::bench::runner::{RailOptions, RunOptions};
use crate::error::{Error, Result};
use crate::fleet::schedule::Directions;
use crate::k8s::RenderRequest;
use crate::k8s::fleet::Topology;
use crate::k8s::manifest::Placement;
use crate::k8s::platform::Platform;
use crate::regress::command::Request as CompareRequest;
use crate::report::plot::Request as PlotRequest;
use crate::report::table::Units;
use crate::session::auth::Token;
use crate::spec::rails::{Devices, RailMode};
use crate::spec::{AtomicOp, Fabric, FabricOptions, Field, Measure, Notify, Operation, Options, TestSpec, Transport};
use crate::units::{parse_bytes, parse_bytes_u32};
use crate::validate::profiles::ProfileName;
use crate::validate::sysfs::{TOPOLOGY_DIR, Tree};
use crate::validate::{NcclFormat, Request};

#[derive(Parser, Debug)]
#[command(name = "rdmabench", version, about = "RDMA verbs benchmark and validation harness")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// List RDMA devices, their ports and non-zero GID table entries.
    Devices {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Check the RDMA this process (pod) was given against a platform mode; one line per
    /// check, then a verdict. Exit 0: nothing failed; 1: a check failed; 3: no RDMA at all.
    Validate(ValidateArgs),
    /// Print NCCL_IB_HCA and NCCL_IB_GID_INDEX as the VKE document's nccl_env.sh computes
    /// them: `eval "$(rdmabench nccl-env)"`.
    NcclEnv(NcclArgs),
    /// Run a workload (workloads/*.toml): with --peer HOST this side drives every step;
    /// the other side runs `rdmabench run --serve` and needs no copy of the workload.
    Run(RunArgs),
    /// Compare two run documents (or two test results) step by step and metric by
    /// metric; exit 1 on a regression.
    Compare(CompareArgs),
    /// Draw a result as SVG: bandwidth and latency percentiles against message size, or a
    /// latency CDF from a --histogram file.
    Plot(PlotArgs),
    /// Perf history for CI: keep every run in a store (SQLite file or PostgreSQL), find the
    /// change points of every figure's series, name a regression with what changed at its run.
    History {
        #[command(subcommand)]
        command: HistoryCommand,
    },
    /// Kubernetes: render acceptance Jobs for a platform mode (and a pod's fleet role).
    K8s {
        #[command(subcommand)]
        command: K8sCommand,
    },
    /// Summarise a fleet's results from its pods' logs (RDMABENCH_RESULT lines): failing
    /// and missing links first, then the slowest. With --fleet all-pairs: the pairs'
    /// RDMABENCH_PAIR lines, the bad nodes and links named, the matrices written.
    Summarize(SummarizeArgs),
    /// One node of an all-pairs fleet: serves its partners, measures its own pair in each
    /// round, keeps step through node 0 (which keeps the barrier and prints the verdict).
    Fleet(FleetArgs),
    /// RDMA WRITE latency (ping-pong, one-way = round trip / 2), like ib_write_lat.
    WriteLat(TestArgs),
    /// RDMA WRITE bandwidth and message rate, like ib_write_bw.
    WriteBw(TestArgs),
    /// RDMA READ latency (the whole round trip), like ib_read_lat.
    ReadLat(TestArgs),
    /// RDMA READ bandwidth and message rate, like ib_read_bw.
    ReadBw(TestArgs),
    /// SEND/RECV latency (ping-pong, one-way = round trip / 2), like ib_send_lat.
    SendLat(TestArgs),
    /// SEND/RECV bandwidth and message rate, like ib_send_bw.
    SendBw(TestArgs),
    /// Atomic (fetch-and-add or compare-and-swap) latency, the whole round trip, like ib_atomic_lat.
    AtomicLat(TestArgs),
    /// Atomic operation rate, like ib_atomic_bw.
    AtomicBw(TestArgs),
    /// Records through the zero-copy registered-memory ring (rdmabench::ring): record
    /// rate and bandwidth, timed until the consumer has released the last record.
    RingBw(TestArgs),
    /// Ring record latency: ping-pong over two rings (one-way = round trip / 2).
    RingLat(TestArgs),
    /// Print shell completions: `rdmabench completions bash > /etc/bash_completion.d/rdmabench`.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Generated documentation: the man page, and the guide's flag table.
    #[command(hide = true)]
    Docs {
        #[command(subcommand)]
        what: DocsCommand,
    },
}

#[derive(Subcommand, Debug)]
pub enum DocsCommand {
    /// Print the man page (roff): `rdmabench docs man > rdmabench.1`.
    Man,
    /// Rewrite the flag table between the markers of FILE (docs/guide.md).
    Readme { file: PathBuf },
}

impl Command {
    /// The test a subcommand runs, with its flags.
    pub fn test(&self) -> Option<(Operation, Measure, &TestArgs)> {
        let (op, measure, args) = match self {
            Command::Devices { .. }
            | Command::Validate(_)
            | Command::NcclEnv(_)
            | Command::Run(_)
            | Command::Compare(_)
            | Command::Plot(_)
            | Command::History { .. }
            | Command::K8s { .. }
            | Command::Summarize(_)
            | Command::Fleet(_)
            | Command::Completions { .. }
            | Command::Docs { .. } => return None,
            Command::WriteLat(a) => (Operation::Write, Measure::Latency, a),
            Command::WriteBw(a) => (Operation::Write, Measure::Bandwidth, a),
            Command::ReadLat(a) => (Operation::Read, Measure::Latency, a),
            Command::ReadBw(a) => (Operation::Read, Measure::Bandwidth, a),
            Command::SendLat(a) => (Operation::Send, Measure::Latency, a),
            Command::SendBw(a) => (Operation::Send, Measure::Bandwidth, a),
            Command::AtomicLat(a) => (Operation::Atomic, Measure::Latency, a),
            Command::AtomicBw(a) => (Operation::Atomic, Measure::Bandwidth, a),
            Command::RingBw(a) => (Operation::Ring, Measure::Bandwidth, a),
            Command::RingLat(a) => (Operation::Ring, Measure::Latency, a),
        };
        Some((op, measure, args))
    }
}

fn transport(s: &str) -> std::result::Result<Transport, String> {
    match s.to_ascii_uppercase().as_str() {
        "RC" => Ok(Transport::Rc),
        "UC" => Ok(Transport::Uc),
        "UD" => Ok(Transport::Ud),
        _ => Err(format!("{s:?} is not a transport; use RC, UC or UD")),
    }
}

/// Where the device and the peer are, and how long to wait for the peer: the flags every
/// two-sided command shares (the tests and `run`).
#[derive(Args, Debug, Clone)]
pub struct ConnectionArgs {
    /// RDMA device(s): a name, a comma-separated list (one rail each: rail i pairs with the
    /// peer's rail i) or `all` (every device this process can open). Default: the first one.
    #[arg(short = 'd', long = "ib-dev", value_name = "DEV[,DEV...]|all")]
    pub device: Option<Devices>,
    #[arg(long = "rails", default_value = "concurrent", value_name = "MODE", help = crate::spec::rails::RAIL_MODE_HELP)]
    pub rails: RailMode,
    /// Device port.
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    pub ib_port: u8,
    /// GID index (default: a RoCE v2 GID whose netdev is up, IPv4-mapped preferred).
    #[arg(short = 'x', long = "gid-index")]
    pub gid_index: Option<u32>,
    /// TCP port of the control channel.
    #[arg(short = 'p', long = "port", default_value_t = 18515)]
    pub port: u16,
    /// Seconds a client keeps retrying to reach its server, and a server waits for a client
    /// (with `run --serve`, also between steps).
    #[arg(long = "connect-timeout", default_value_t = 60.0, value_name = "SECS")]
    pub connect_timeout: f64,
    /// Seconds the peer may stay silent (no message, no heartbeat) before it is declared lost (exit 4); a run may last longer.
    #[arg(long = "timeout", default_value_t = 10.0, value_name = "SECS")]
    pub timeout: f64,
    /// Server: the address to listen on (default: every address, IPv6 and IPv4).
    #[arg(long = "bind", value_name = "ADDR")]
    pub bind: Option<IpAddr>,
    /// File holding the shared secret (at least 16 bytes; else `$RDMABENCH_TOKEN`). A server
    /// with one refuses clients that cannot prove it; a client proves it. Set one wherever
    /// the port is reachable by others (a node's network, hostNetwork pods).
    #[arg(long = "token-file", value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    #[arg(long = "max-memory", value_parser = parse_bytes, value_name = "BYTES", help = format!(
        "Registered memory one test may take on this side, all rails together: a spec needing more is \
         refused before anything is allocated (default: {})", crate::bench::memory::DEFAULT_DOC))]
    pub max_memory: Option<u64>,
}

impl ConnectionArgs {
    /// The run options these flags set; the rest take their plain defaults.
    pub fn run_options(&self, report_gbits: bool) -> Result<RunOptions> {
        Ok(RunOptions {
            rails: RailOptions {
                devices: self.device.clone().unwrap_or_default(),
                ib_port: self.ib_port,
                gid_index: self.gid_index,
                mode: self.rails,
            },
            tcp_port: self.port,
            bind: self.bind,
            token: Token::configured(self.token_file.as_deref())?,
            max_memory: match self.max_memory {
                Some(0) => {
                    return Err(Error::Usage("--max-memory 0 leaves no room for any test; give bytes, e.g. 4G".into()));
                }
                Some(m) => m,
                None => crate::bench::memory::default_budget(Path::new("/proc"), Path::new("/sys")),
            },
            connect_timeout: seconds("--connect-timeout", self.connect_timeout)?,
            timeout: seconds("--timeout", self.timeout)?,
            json: None,
            cpu_util: false,
            counters: false,
            interval_log: None,
            intervals: None,
            histogram: None,
            units: if report_gbits { Units::GigaBits } else { Units::MegaBytes },
            tables_on_stderr: false,
        })
    }
}

/// Flags of a two-sided test. Without HOST this process is the server and needs only
/// the device flags (-d -i -x -p); the client sends it everything else. A flag whose
/// default differs by test has its whole help in `help = ...` (with the default computed
/// from the spec), not in a doc comment, so there is one text.
#[derive(Args, Debug, Clone)]
pub struct TestArgs {
    /// Server to connect to; omit it to be the server.
    pub host: Option<String>,
    #[command(flatten)]
    pub conn: ConnectionArgs,
    #[arg(short = 'c', long = "connection", value_parser = transport, help = per_test_help(
        "Transport: RC, UC (write, send) or UD (send)", |s| s.transport.label()))]
    pub transport: Option<Transport>,
    #[arg(short = 'r', long = "rx-depth", help = per_test_help(
        "Receive queue depth, where the test posts receives (send, write with immediate)", |s| s.rx_depth))]
    pub rx_depth: Option<u32>,
    /// WRITE or SEND with immediate data (the receiver consumes a receive per message).
    #[arg(long = "with-imm")]
    pub with_imm: bool,
    #[arg(short = 'A', long = "atomic_type", visible_alias = "atomic-type", value_enum,
          help = per_test_help("Atomic verb of the atomic tests", |s| s.atomic_op.label()))]
    pub atomic_op: Option<AtomicOp>,
    /// Outstanding RDMA READs and atomics per QP (default min(16, the device's max_qp_rd_atom)).
    #[arg(short = 'o', long = "outstanding-reads", visible_alias = "outs")]
    pub outstanding_reads: Option<u32>,
    #[arg(short = 's', long = "size", conflicts_with = "all", value_parser = parse_bytes, value_name = "BYTES",
          help = per_test_help("Message size: bytes, or with K/M/G (KiB, MiB, GiB)", |s| s.sizes[0]))]
    pub size: Option<u64>,
    /// Every size from 2 B to 8 MiB (powers of two).
    #[arg(short = 'a', long = "all")]
    pub all: bool,
    #[arg(short = 'n', long = "iters", conflicts_with = "duration",
          help = per_test_help("Iterations per size", |s| s.iterations))]
    pub iterations: Option<u64>,
    /// Run each size for this many seconds instead of a fixed count.
    #[arg(short = 'D', long = "duration")]
    pub duration: Option<f64>,
    /// Run this many iterations before each size's measurement and leave them out of its
    /// figures (caches, TLB and the peer's receive queue warm; perftest's --perform_warm_up).
    #[arg(long, value_name = "N")]
    pub warmup: Option<u64>,
    #[arg(long, value_name = "SECS", help = format!(
        "A soak: with -D, print every SECS seconds that interval's bandwidth or latency percentiles as the run goes \
         and keep them in the JSON (`intervals`); Ctrl-C ends the size early and writes what was measured \
         ({}..={} s)", crate::spec::INTERVAL_RANGE.0, crate::spec::INTERVAL_RANGE.1))]
    pub interval: Option<f64>,
    /// Register without PCIe relaxed ordering (requested by default, as perftest does,
    /// where libibverbs and the device support it).
    #[arg(long)]
    pub no_relaxed_ordering: bool,
    /// Put the buffers on huge pages (MAP_HUGETLB; some must be reserved).
    #[arg(long)]
    pub hugepages: bool,
    /// Register the buffers for on-demand paging (where the device supports it).
    #[arg(long)]
    pub odp: bool,
    /// With --interval: also append each interval to FILE as a JSON line when it ends, or
    /// to stdout with `-`.
    #[arg(long, value_name = "FILE|-", requires = "interval")]
    pub interval_log: Option<String>,
    #[arg(short = 't', long = "tx-depth", help = per_test_help("Send queue depth", |s| s.tx_depth))]
    pub tx_depth: Option<u32>,
    #[arg(short = 'Q', long = "cq-mod", help = format!(
        "Request a completion every N work requests, capped at the tx depth; with -l, the post list length, as \
         perftest; ring tests signal by --batch and refuse it (default {})", crate::spec::DEFAULT_CQ_MOD))]
    pub cq_mod: Option<u32>,
    /// Post work requests in chains of N (one doorbell each), as perftest's -l.
    /// Default: whatever room the send window has, as one chain.
    #[arg(short = 'l', long = "post-list", visible_alias = "post_list")]
    pub post_list: Option<u32>,
    #[arg(short = 'q', long = "qp", help = per_test_help(
        "Queue pairs per side (bandwidth tests); each sends the -n iterations", |s| s.num_qps))]
    pub num_qps: Option<u32>,
    #[arg(long = "threads", help = per_test_help(
        "Spread the QPs over this many pinned threads (bandwidth tests; at most -q)", |s| s.threads))]
    pub threads: Option<u32>,
    /// Bidirectional: both sides send at once (bandwidth tests); both directions are reported.
    #[arg(short = 'b', long = "bidirectional")]
    pub bidirectional: bool,
    /// Sleep on a completion channel instead of busy-polling (less CPU, more latency).
    #[arg(short = 'e', long = "events")]
    pub events: bool,
    /// Report the CPU time this process used during each measurement, as % of one core.
    #[arg(long = "cpu-util", visible_alias = "cpu_util")]
    pub cpu_util: bool,
    /// Print the port counters that moved during each size under its row, both sides'
    /// (they are in the JSON either way).
    #[arg(long)]
    pub counters: bool,
    /// Latency tests: write every size's HDR histogram (round-trip ns) to FILE, in the
    /// HdrHistogram interval-log format, for plotting.
    #[arg(long, value_name = "FILE")]
    pub histogram: Option<String>,
    #[arg(short = 'I', long = "inline-size", value_parser = parse_bytes_u32, value_name = "BYTES",
          help = per_test_help("Post messages up to this size inline, clamped to the device's limit",
                               |s| s.requested_inline()))]
    pub inline: Option<u32>,
    /// Path MTU in bytes, e.g. 4096 or 4K (default: the smaller active MTU of the two ports).
    #[arg(short = 'm', long = "mtu", value_parser = parse_bytes_u32, value_name = "BYTES")]
    pub mtu: Option<u32>,
    /// Report bandwidth in Gb/s instead of MB/s.
    #[arg(long = "report_gbits", visible_alias = "report-gbits")]
    pub report_gbits: bool,
    /// Write the JSON result document to FILE, or to stdout with `-` (tables then go to stderr).
    #[arg(long, value_name = "FILE|-")]
    pub json: Option<String>,
    /// Fill every message with a per-iteration pattern and check it where it lands.
    #[arg(long = "validate-data")]
    pub validate_data: bool,
    /// Connect the QPs with rdma_cm (RC) instead of exchanging QP numbers over the control
    /// channel, which still carries the test spec and the results.
    #[arg(short = 'R', long = "rdma-cm", visible_alias = "rdma_cm")]
    pub rdma_cm: bool,
    /// Check the pair against a platform mode: exclusive modes fail when both sides hold
    /// the same physical NIC; every mode reports whether they share one.
    #[arg(long, value_enum)]
    pub profile: Option<ProfileName>,
    /// Fault injection for tests: corrupt one byte of message N (needs --validate-data).
    #[arg(long = "inject-corruption", hide = true, value_name = "N")]
    pub corrupt_at: Option<u64>,
    /// Ring tests: bytes of the ring, a power of two from 4K to 1G (default: room for 32
    /// records of the largest size for ring-bw, at least 1M; 8 records for ring-lat, at
    /// least 64K; at most 64M unless two records need more).
    #[arg(long, value_parser = parse_bytes, value_name = "BYTES")]
    pub capacity: Option<u64>,
    #[arg(long, value_name = "N", help = format!(
        "Ring tests: committed records coalesced into one RDMA WRITE at most (default: {})",
        crate::spec::per_test_where(|s| s.ring.map(|r| r.batch))))]
    pub batch: Option<u32>,
    #[arg(long, value_enum, help = format!(
        "Ring tests: how the consumer learns of arrivals: imm (WRITE with immediate) or poll (the consumer polls \
         each record's frame word, as write-lat polls the last byte) (default: {})",
        crate::spec::per_test_where(|s| s.ring.map(|r| r.notify.label()))))]
    pub notify: Option<Notify>,
    #[arg(long, value_enum, help = format!(
        "Ring tests: how the consumer waits for records and a blocked producer for credit: spin, sleep on a \
         completion channel, or adaptive (spin {} us, then sleep); a polling consumer (--notify poll) always \
         spins (default: {})",
        crate::spec::ring::ADAPTIVE_SPIN_NS / 1000,
        crate::spec::per_test_where(|s| s.ring.map(|r| r.wait.label()))))]
    pub wait: Option<crate::spec::ring::Wait>,
    #[command(flatten)]
    pub fabric: FabricArgs,
}

/// The fabric flags of a test: which switch queue its packets take and how RC retransmits
/// (`spec::fabric`; perftest's names where they exist).
#[derive(Args, Debug, Clone, Default)]
pub struct FabricArgs {
    #[arg(long = "tclass", value_name = "TC", help = format!(
        "Traffic class of the GRH, on RoCE v2 the IP DS field: DSCP << 2 | ECN, 0..=255; NCCL's counterpart is \
         NCCL_IB_TC (default {})", Fabric::default().traffic_class))]
    pub traffic_class: Option<u32>,
    #[arg(short = 'S', long = "sl", value_name = "SL", help = format!(
        "Service level, 0..=15; NCCL's counterpart is NCCL_IB_SL (default {})", Fabric::default().service_level))]
    pub service_level: Option<u32>,
    #[arg(long = "flow-label", visible_alias = "flow_label", value_name = "LABEL", help = format!(
        "Flow label of the GRH, 0..=1048575; RoCE v2 devices derive the UDP source port from it, and so the ECMP \
         path (default {})", Fabric::default().flow_label))]
    pub flow_label: Option<u32>,
    #[arg(long = "hop-limit", value_name = "N", help = format!(
        "Hop limit of the GRH (the IPv6 hop limit; rxe's IPv4 packets keep the route's TTL), 1..=255 (default {})",
        Fabric::default().hop_limit))]
    pub hop_limit: Option<u32>,
    #[arg(short = 'u', long = "qp-timeout", value_name = "N", help = format!(
        "RC's local ACK timeout exponent: 4.096 us x 2^N before a retransmission, 0..=31; 0 waits forever \
         (default {})", Fabric::default().qp_timeout))]
    pub qp_timeout: Option<u32>,
    #[arg(long = "retry-count", visible_alias = "retry_count", value_name = "N", help = format!(
        "RC retransmissions before the QP fails, 0..=7; a lost peer or path ends the run after 4.096 us x 2^u x \
         (retry + 1) (default {})", Fabric::default().retry_count))]
    pub retry_count: Option<u32>,
    #[arg(long = "rnr-retry", value_name = "N", help = format!(
        "Retries when the receiver had no receive posted, 0..=7; 7 retries forever (default {})",
        Fabric::default().rnr_retry))]
    pub rnr_retry: Option<u32>,
}

impl FabricArgs {
    pub fn options(&self) -> FabricOptions {
        FabricOptions {
            traffic_class: self.traffic_class,
            service_level: self.service_level,
            flow_label: self.flow_label,
            hop_limit: self.hop_limit,
            qp_timeout: self.qp_timeout,
            retry_count: self.retry_count,
            rnr_retry: self.rnr_retry,
        }
    }
}

/// Where the RDMA view is read from; fixtures in tests, another root for a host's tree.
#[derive(Args, Debug, Clone)]
pub struct TreeArgs {
    /// Directory standing for /sys.
    #[arg(long, default_value = "/sys", value_name = "DIR")]
    pub sysfs_root: PathBuf,
    /// Directory standing for /proc (self/status, self/limits, self/mounts).
    #[arg(long, default_value = "/proc", value_name = "DIR")]
    pub proc_root: PathBuf,
    /// Directory standing for /dev (infiniband/uverbsN, nvidiaN).
    #[arg(long, default_value = "/dev", value_name = "DIR")]
    pub dev_root: PathBuf,
    /// Where the NCCL topology file (virtualTopology.xml) is mounted on VKE.
    #[arg(long, default_value = TOPOLOGY_DIR, value_name = "DIR")]
    pub topology_dir: PathBuf,
}

impl TreeArgs {
    pub fn tree(&self) -> Tree {
        Tree {
            sys: self.sysfs_root.clone(),
            proc: self.proc_root.clone(),
            dev: self.dev_root.clone(),
            topology: self.topology_dir.clone(),
        }
    }
}

#[derive(Args, Debug)]
pub struct ValidateArgs {
    /// The platform mode to check against.
    #[arg(long, value_enum)]
    pub profile: ProfileName,
    /// RDMA NICs the pod requested.
    #[arg(long, value_name = "N")]
    pub expect_nics: Option<u32>,
    /// GPUs the pod requested (counted as /dev/nvidiaN).
    #[arg(long, value_name = "G")]
    pub expect_gpus: Option<u32>,
    /// Memory to register as the proof that registration works: bytes, or with K/M/G (KiB...).
    #[arg(long, default_value = "64M", value_parser = parse_bytes, value_name = "BYTES")]
    pub mr_size: u64,
    /// Write the checks as JSON to FILE, or to stdout with `-` (the lines then go to stderr).
    #[arg(long, value_name = "FILE|-")]
    pub json: Option<String>,
    /// Write a JUnit XML report, one test case per check.
    #[arg(long, value_name = "FILE")]
    pub junit: Option<String>,
    #[command(flatten)]
    pub tree: TreeArgs,
}

impl ValidateArgs {
    pub fn request(&self) -> Request {
        Request {
            tree: self.tree.tree(),
            profile: self.profile.profile(),
            expect_nics: self.expect_nics,
            expect_gpus: self.expect_gpus,
            mr_size: self.mr_size,
            json: self.json.clone(),
            junit: self.junit.clone(),
        }
    }
}

#[derive(Args, Debug)]
pub struct NcclArgs {
    /// export lines (for eval), NAME=value lines, or JSON.
    #[arg(long, value_enum, default_value = "export")]
    pub format: NcclFormat,
    #[command(flatten)]
    pub tree: TreeArgs,
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// The workload file; not needed with --serve.
    #[arg(required_unless_present = "serve")]
    pub workload: Option<String>,
    /// The `run --serve` side to drive.
    #[arg(long, conflicts_with = "serve", required_unless_present = "serve")]
    pub peer: Option<String>,
    /// Serve every step a client drives, until it finishes.
    #[arg(long)]
    pub serve: bool,
    #[command(flatten)]
    pub conn: ConnectionArgs,
    /// Write the run's document (every step, repeat and verdict) to FILE, or stdout with `-`.
    #[arg(long, value_name = "FILE|-")]
    pub json: Option<String>,
    /// Write JUnit XML: one test case per step and per threshold (and per compared metric).
    #[arg(long, value_name = "FILE")]
    pub junit: Option<String>,
    /// Compare the run with this baseline document; exit 1 on a regression.
    #[arg(long, value_name = "FILE")]
    pub baseline: Option<String>,
    /// Default tolerance of the comparison (per-metric ones in the workload win).
    #[arg(long, default_value = "5%", value_parser = parse_percent)]
    pub tolerance: f64,
    /// Compare even when the environments differ (the differences are reported).
    #[arg(long)]
    pub allow_env_mismatch: bool,
    /// Set a workload parameter: NAME=VALUE (repeatable).
    #[arg(long = "param", value_name = "NAME=VALUE", value_parser = parse_param)]
    pub params: Vec<(String, f64)>,
    /// Report bandwidth in Gb/s instead of MB/s.
    #[arg(long = "report_gbits", visible_alias = "report-gbits")]
    pub report_gbits: bool,
}

impl RunArgs {
    pub fn options(&self) -> Result<RunOptions> {
        self.conn.run_options(self.report_gbits)
    }
}

#[derive(Args, Debug)]
pub struct CompareArgs {
    pub baseline: String,
    pub current: String,
    /// Default tolerance (per-metric ones recorded from the workload win).
    #[arg(long, default_value = "5%", value_parser = parse_percent)]
    pub tolerance: f64,
    /// Compare even when the environments differ (the differences are reported).
    #[arg(long)]
    pub allow_env_mismatch: bool,
    /// Compare the port counter deltas too: a counter regresses when this run's median
    /// is above every baseline repeat (more retransmissions than the baseline ever had).
    #[arg(long)]
    pub counters: bool,
    /// Write the comparison as JSON to FILE, or stdout with `-` (the table then goes to stderr).
    #[arg(long, value_name = "FILE|-")]
    pub json: Option<String>,
    /// Write JUnit XML, one test case per compared metric.
    #[arg(long, value_name = "FILE")]
    pub junit: Option<String>,
}

impl CompareArgs {
    pub fn request(&self) -> CompareRequest {
        CompareRequest {
            baseline: self.baseline.clone(),
            current: self.current.clone(),
            tolerance: self.tolerance,
            allow_env_mismatch: self.allow_env_mismatch,
            counters: self.counters,
            json: self.json.clone(),
            junit: self.junit.clone(),
        }
    }
}

#[derive(Args, Debug)]
pub struct PlotArgs {
    /// A run document or a test's result document.
    pub result: String,
    /// The SVG file to write (default: the result's name with .svg).
    #[arg(short = 'o', long, value_name = "FILE")]
    pub output: Option<String>,
    /// Also draw the latency CDF from this --histogram file.
    #[arg(long, value_name = "FILE")]
    pub histogram: Option<String>,
}

impl PlotArgs {
    pub fn request(&self) -> PlotRequest {
        PlotRequest { result: self.result.clone(), output: self.output.clone(), histogram: self.histogram.clone() }
    }
}

/// Where the history is: one SQLite file (created when absent) or a PostgreSQL URL.
pub const DEFAULT_STORE: &str = "rdmabench-history.sqlite";

#[derive(Args, Debug, Clone)]
pub struct StoreArg {
    /// The history: an SQLite file (created when absent; a CI keeps it as an artifact or
    /// cache) or postgres://user:password@host/db (the same tables, shared by many hosts).
    #[arg(long, default_value = DEFAULT_STORE, value_name = "PATH|URL", env = "RDMABENCH_HISTORY")]
    pub store: String,
}

/// Which series: every filter given must match.
#[derive(Args, Debug, Clone)]
pub struct SeriesFilter {
    /// Only this workload's series (the run document's workload, or the test's name).
    #[arg(long)]
    pub workload: Option<String>,
    /// Only this step's.
    #[arg(long)]
    pub step: Option<String>,
    /// Only this metric's (gbps, mpps, p50_us, p99_us, p999_us).
    #[arg(long)]
    pub metric: Option<String>,
    /// Only this message size's, bytes.
    #[arg(long)]
    pub size: Option<u64>,
    /// Only the setups whose description contains this ("hostA/mlx5_0", "MTU 4096").
    #[arg(long)]
    pub setup: Option<String>,
}

impl SeriesFilter {
    pub fn filter(&self) -> crate::history::command::Filter {
        crate::history::command::Filter {
            workload: self.workload.clone(),
            step: self.step.clone(),
            metric: self.metric.clone(),
            size: self.size,
            setup: self.setup.clone(),
        }
    }
}

/// How change points are judged (`check` and `plot`).
#[derive(Args, Debug, Clone)]
pub struct JudgeArgs {
    /// What stands for a run: auto (for latency the mean of the repeats in the best one's
    /// mode, which a two-speed machine's slow repeats cannot move; the median for
    /// bandwidth), median, best (repeat), or repeats (change points over every repeat).
    #[arg(long, value_enum, default_value = "auto")]
    pub figure: crate::history::check::Figure,
    /// Tolerance where the workload states none: a change smaller than this is not a
    /// regression however significant.
    #[arg(long, default_value = "5%", value_parser = parse_percent)]
    pub tolerance: f64,
    /// The newest runs looked at per series.
    #[arg(long, default_value_t = crate::history::check::DEFAULT_WINDOW)]
    pub window: usize,
    /// A regression fails the check while its new level began within this many runs;
    /// after that it is the accepted level (and still listed as a change point).
    #[arg(long, default_value_t = crate::history::check::DEFAULT_RECENT)]
    pub recent: usize,
    /// A change point is kept when its permutation test's p-value is at most this.
    #[arg(long, default_value_t = crate::history::changepoint::DEFAULT_MAX_P)]
    pub max_p_value: f64,
    /// Permutations per significance test.
    #[arg(long, default_value_t = crate::history::changepoint::DEFAULT_PERMUTATIONS)]
    pub permutations: u32,
}

impl JudgeArgs {
    pub fn judge(&self) -> crate::history::check::Judge {
        crate::history::command::judge(
            self.figure,
            self.tolerance,
            self.window,
            self.recent,
            self.max_p_value,
            self.permutations,
        )
    }
}

/// The series `check` and `plot` judge: where, which, and how.
#[derive(Args, Debug, Clone)]
pub struct JudgedSeries {
    #[command(flatten)]
    pub store: StoreArg,
    #[command(flatten)]
    pub filter: SeriesFilter,
    #[command(flatten)]
    pub judge: JudgeArgs,
}

#[derive(Subcommand, Debug)]
pub enum HistoryCommand {
    /// Append a run document (`rdmabench run --json`, or a test's --json) to the store.
    Add {
        /// The run document.
        run: String,
        #[command(flatten)]
        store: StoreArg,
        /// What this run is to the CI: a commit, a pipeline number, a tag.
        #[arg(long, default_value = "")]
        label: String,
        /// Name the setup instead of describing it from the document (hosts, devices, link):
        /// for ephemeral CI runners whose host names change from job to job.
        #[arg(long)]
        setup: Option<String>,
    },
    /// One line per series: its setup, step, size, metric, runs and newest value.
    List {
        #[command(flatten)]
        store: StoreArg,
        #[command(flatten)]
        filter: SeriesFilter,
    },
    /// Every run of the matching series, with what changed in the environment.
    Show {
        #[command(flatten)]
        store: StoreArg,
        #[command(flatten)]
        filter: SeriesFilter,
    },
    /// Write the series as CSV (one row per run, one column per series), as Apache Otava reads it.
    Export {
        #[command(flatten)]
        store: StoreArg,
        #[command(flatten)]
        filter: SeriesFilter,
        /// CSV, the only format.
        #[arg(long, required = true)]
        csv: bool,
        /// Write to FILE instead of stdout.
        #[arg(short = 'o', long, value_name = "FILE")]
        output: Option<String>,
    },
    /// Find change points in every series; exit 1 when the newest runs hold a regression.
    Check {
        #[command(flatten)]
        series: JudgedSeries,
        /// Write every series' change points as JSON to FILE.
        #[arg(long, value_name = "FILE")]
        json: Option<String>,
    },
    /// Draw every series as SVG with its change points marked: one page (FILE.svg), or one
    /// file per series in a directory (DIR/).
    Plot {
        #[command(flatten)]
        series: JudgedSeries,
        #[arg(short = 'o', long, value_name = "FILE.svg|DIR/", default_value = "history.svg")]
        output: String,
    },
}

#[derive(Subcommand, Debug)]
pub enum K8sCommand {
    /// Print a ready-to-apply Service + Indexed Job (YAML) for a platform mode.
    Render(Box<RenderArgs>),
    /// A fleet pod's role: prints `SERVE PEER` (e.g. `yes 3`); used by the Job's script.
    #[command(hide = true)]
    Role {
        #[arg(long)]
        index: u32,
        #[arg(long)]
        pods: u32,
        #[arg(long, value_enum)]
        topology: Topology,
    },
    /// A fleet client pod's `RDMABENCH_RESULT {...}` line for `summarize`, with this host's
    /// node name defused; used by the Job's script.
    #[command(hide = true)]
    Result {
        #[arg(long)]
        pod: u32,
        #[arg(long)]
        peer: u32,
        /// The workload's exit code.
        #[arg(long)]
        exit: i32,
        /// The workload's run document (`--json`); missing or empty: no result.
        #[arg(long, value_name = "FILE")]
        run: Option<PathBuf>,
    },
    /// Write every manifest of k8s-jobs/ into DIR (how the committed ones are made).
    #[command(hide = true)]
    RenderAll { dir: PathBuf },
    /// Write every platform mode as an all-pairs fleet under every gang into DIR (what
    /// lab/test schema-checks).
    #[command(hide = true)]
    RenderVariants { dir: PathBuf },
}

#[derive(Args, Debug)]
pub struct RenderArgs {
    #[arg(long, value_enum)]
    pub platform: Platform,
    /// vke: exclusive, shared, shared-multi, shared-host; ack: shared-hostnet, shared-podnet, exclusive.
    #[arg(long)]
    pub mode: String,
    /// RDMA NICs per pod (the resource quantity on VKE; what validate expects).
    #[arg(long, default_value_t = 1)]
    pub nics: u32,
    /// GPUs per pod (nvidia.com/gpu).
    #[arg(long)]
    pub gpus: Option<u32>,
    /// NICs of the machine: checks the document's whole-or-half rule, and sizes the pods'
    /// memory in modes whose pods see every NIC of the node (vke shared-host, ack shared-*;
    /// default: 8).
    #[arg(long, value_name = "M")]
    pub machine_nics: Option<u32>,
    #[arg(long, default_value = crate::k8s::DEFAULT_IMAGE)]
    pub image: String,
    /// A pair workload the image ships: smoke, acceptance (the default), sweep, regression.
    #[arg(long)]
    pub workload: Option<String>,
    #[arg(long, default_value = "default")]
    pub namespace: String,
    /// The Job and Service name (default rdmabench-PLATFORM-MODE).
    #[arg(long)]
    pub name: Option<String>,
    /// Both pods on one node (required pod affinity).
    #[arg(long, conflicts_with = "cross_node")]
    pub same_node: bool,
    /// Pods on different nodes (required anti-affinity); the default.
    #[arg(long)]
    pub cross_node: bool,
    /// A fleet of N pods instead of a pair.
    #[arg(long, value_name = "N")]
    pub pods: Option<u32>,
    /// How a ring or pairs fleet's pods pair up (an all-pairs fleet: --fleet all-pairs).
    #[arg(long, value_enum, default_value = "ring", requires = "pods")]
    pub topology: Topology,
    /// An all-pairs fleet of --pods nodes (`rdmabench fleet`): every pair measured, the bad
    /// node or link named by node 0.
    #[arg(long, value_enum, requires = "pods", conflicts_with = "topology")]
    pub fleet: Option<FleetKind>,
    #[arg(long, value_enum, default_value = "none", requires = "fleet", help = crate::k8s::gang::GANG_HELP)]
    pub gang: crate::k8s::gang::Gang,
    /// The queue that admits the fleet: Kueue's LocalQueue (--gang kueue, jobset) or a Volcano queue.
    #[arg(long, value_name = "NAME", requires = "fleet")]
    pub queue: Option<String>,
    /// With --fleet: `one`, the lower index measures against the higher; `both`: each way.
    #[arg(long, value_enum, default_value = "one", requires = "fleet")]
    pub directions: Directions,
    /// With --fleet: at most this many pairs measure at once (default: every pair of a round).
    #[arg(long, value_name = "N", requires = "fleet")]
    pub max_pairs_per_round: Option<u32>,
    #[arg(long = "measure", value_name = "NAME=VALUE", value_parser = parse_param, requires = "fleet", help = FLEET_MEASURE_HELP)]
    pub measure: Vec<(String, f64)>,
    #[arg(long = "threshold", value_name = "NAME=VALUE", value_parser = parse_param, requires = "fleet", help = FLEET_THRESHOLD_HELP)]
    pub thresholds: Vec<(String, f64)>,
    /// activeDeadlineSeconds (default: 1800 for a pair or ring; an all-pairs fleet's join
    /// allowance and 60 s per step).
    #[arg(long, value_name = "SECS")]
    pub deadline: Option<i64>,
    /// TCP port of the control channel: pod i listens on PORT + i.
    #[arg(short = 'p', long = "port", default_value_t = 18515)]
    pub port: u16,
    // The pods' RDMABENCH_RAILS, with several NICs per pod; the help is run's.
    #[arg(long = "rails", default_value = "concurrent", value_name = "MODE", help = crate::spec::rails::RAIL_MODE_HELP)]
    pub rails: RailMode,
    /// Set a threshold parameter of the workload for the pods' run: NAME=VALUE (repeatable),
    /// e.g. `--param min_write_gbps=180` for a 200 Gb/s NIC; checked against the workload's [params].
    #[arg(long = "param", value_name = "NAME=VALUE", value_parser = parse_param)]
    pub params: Vec<(String, f64)>,
    /// The Secret (key `token`) the pods take the control channel's shared token from; create
    /// it once per namespace (the Jobs' header shows how).
    #[arg(long = "token-secret", default_value = crate::k8s::DEFAULT_TOKEN_SECRET, value_name = "NAME")]
    pub token_secret: String,
    /// The container's securityContext.runAsUser. Only 0 (root, stated for a policy that
    /// wants it explicit): a non-root user's added capabilities have no effect in
    /// Kubernetes, so IPC_LOCK could not lift the locked-memory limit (render says why).
    #[arg(long, value_name = "UID", allow_negative_numbers = true)]
    pub run_as_user: Option<i64>,
}

impl RenderArgs {
    pub fn request(&self) -> RenderRequest {
        RenderRequest {
            platform: self.platform,
            mode: self.mode.clone(),
            nics: self.nics,
            gpus: self.gpus,
            machine_nics: self.machine_nics,
            image: self.image.clone(),
            workload: self.workload.clone(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            placement: if self.same_node { Placement::SameNode } else { Placement::CrossNode },
            fleet: self.pods.filter(|_| self.fleet.is_none()).map(|n| (n, self.topology)),
            all_pairs: self.fleet.map(|FleetKind::AllPairs| crate::k8s::all_pairs::AllPairs {
                pods: self.pods.expect("clap requires --pods with --fleet"),
                gang: self.gang,
                queue: self.queue.clone(),
                directions: self.directions,
                max_pairs_per_round: self.max_pairs_per_round,
                over: crate::fleet::config::Overrides {
                    measure: self.measure.clone(),
                    thresholds: self.thresholds.clone(),
                },
            }),
            deadline_s: self.deadline,
            port: self.port,
            rails: self.rails,
            params: self.params.clone(),
            token_secret: self.token_secret.clone(),
            run_as_user: self.run_as_user,
        }
    }
}

#[derive(Args, Debug)]
pub struct SummarizeArgs {
    /// Files with the pods' logs; `-` reads stdin.
    #[arg(required = true)]
    pub logs: Vec<String>,
    /// The fleet's size, so missing links are named.
    #[arg(long, value_name = "N")]
    pub pods: Option<u32>,
    #[arg(long, value_enum, default_value = "ring", requires = "pods")]
    pub topology: Topology,
    /// JSON instead of the table.
    #[arg(long)]
    pub json: bool,
    /// An all-pairs fleet (`rdmabench fleet`): attribute to nodes and links.
    #[arg(long, value_enum, requires = "pods")]
    pub fleet: Option<FleetKind>,
    /// With --fleet: the directions the fleet measured (for the pairs it should have).
    #[arg(long, value_enum, default_value = "one")]
    pub directions: Directions,
    /// With --fleet: the workload whose [thresholds] judge (default: the shipped all-pairs.toml).
    #[arg(long, value_name = "FILE")]
    pub workload: Option<String>,
    /// With --fleet: write pairs.jsonl, matrix-*.csv, verdict.json, heatmap.svg and summary.md here.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    // With --fleet: a [thresholds] key over the workload's; the help is fleet's.
    #[arg(long = "threshold", value_name = "NAME=VALUE", value_parser = parse_param, requires = "fleet", help = FLEET_THRESHOLD_HELP)]
    pub thresholds: Vec<(String, f64)>,
}

/// `--measure`'s help, for `fleet` and `k8s render --fleet all-pairs`.
pub const FLEET_MEASURE_HELP: &str = "Set a [measure] key of the fleet workload: NAME=VALUE (repeatable), e.g. \
     `--measure bw_iterations=500` for a quicker fleet or `--measure bw_size=65536`; the command line wins over the file";

/// `--threshold`'s help, for `fleet`, `summarize --fleet` and `k8s render --fleet all-pairs`.
pub const FLEET_THRESHOLD_HELP: &str = "Set a [thresholds] key of the fleet workload: NAME=VALUE (repeatable), e.g. \
     `--threshold max_flaky_pairs=2` or `--threshold node_min_ratio=0.9`; the command line wins over the file";

/// The kinds of fleet `summarize --fleet` and `k8s render --fleet` know (`--topology`
/// spells the older ring and pairs fleets).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FleetKind {
    AllPairs,
}

#[derive(Args, Debug)]
pub struct FleetArgs {
    /// This node's index, 0..N-1 (node 0 keeps the barrier and prints the verdict).
    #[arg(long)]
    pub index: u32,
    /// Nodes in the fleet.
    #[arg(long, value_name = "N")]
    pub pods: u32,
    /// Every node's control address: a comma-separated list of N, or one name with `{i}`
    /// for the index (`job-{i}.svc`). Node i serves on -p + i; the barrier is on -p + N.
    #[arg(long, value_name = "LIST|TEMPLATE")]
    pub peers: String,
    /// `one`: the lower index measures against the higher; `both`: each way.
    #[arg(long, value_enum, default_value = "one")]
    pub directions: Directions,
    /// At most this many pairs measure at once (default: every pair of a round).
    #[arg(long, value_name = "N")]
    pub max_pairs_per_round: Option<u32>,
    /// The fleet workload ([measure], [thresholds]); default: the shipped all-pairs.toml.
    #[arg(long, value_name = "FILE")]
    pub workload: Option<String>,
    #[arg(long = "measure", value_name = "NAME=VALUE", value_parser = parse_param, help = FLEET_MEASURE_HELP)]
    pub measure: Vec<(String, f64)>,
    #[arg(long = "threshold", value_name = "NAME=VALUE", value_parser = parse_param, help = FLEET_THRESHOLD_HELP)]
    pub thresholds: Vec<(String, f64)>,
    /// Write one line saying how this node ended to FILE (node 0: the fleet's verdict), as
    /// Kubernetes reads a container's termination message (/dev/termination-log).
    #[arg(long, value_name = "FILE")]
    pub termination_log: Option<PathBuf>,
    #[command(flatten)]
    pub conn: ConnectionArgs,
}

impl FleetArgs {
    /// Every node's address, from the list or the template.
    pub fn peer_addresses(&self) -> Result<Vec<String>> {
        if self.peers.contains("{i}") {
            return Ok((0..self.pods).map(|i| self.peers.replace("{i}", &i.to_string())).collect());
        }
        let list: Vec<String> = self.peers.split(',').map(|s| s.trim().to_string()).collect();
        if list.len() != self.pods as usize || list.iter().any(String::is_empty) {
            return Err(Error::Usage(format!(
                "--peers has {} addresses for --pods {}: give one per node, comma-separated, or a name with {{i}}",
                list.len(),
                self.pods
            )));
        }
        Ok(list)
    }
}

/// `5%`, `5` or `2.5%`: percent.
pub fn parse_percent(s: &str) -> std::result::Result<f64, String> {
    let v: f64 =
        s.trim().trim_end_matches('%').parse().map_err(|_| format!("{s:?} is not a percentage; use e.g. 5% or 2.5"))?;
    if v.is_finite() && (0.0..=1000.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{s:?} is out of range; use 0% to 1000%"))
    }
}

fn parse_param(s: &str) -> std::result::Result<(String, f64), String> {
    let (k, v) = s.split_once('=').ok_or_else(|| format!("{s:?}: use NAME=VALUE, e.g. min_write_gbps=180"))?;
    let v: f64 = v.trim().parse().map_err(|_| format!("{s:?}: the value must be a number"))?;
    Ok((k.trim().to_string(), v))
}

/// A flag's help with its per-test default, as the spec sets it (`spec::per_test`).
fn per_test_help<T: PartialEq + std::fmt::Display>(what: &str, value: impl Fn(&TestSpec) -> T) -> String {
    format!("{what} (default: {})", crate::spec::per_test(value))
}

fn seconds(flag: &str, v: f64) -> Result<Duration> {
    if v.is_finite() && v > 0.0 && v <= 86_400.0 {
        Ok(Duration::from_secs_f64(v))
    } else {
        Err(Error::Usage(format!("{flag} {v} is out of range; use 0 < SECS <= 86400")))
    }
}

impl TestArgs {
    /// The test options these flags give (the defaults are the spec's, applied later).
    pub fn test_options(&self) -> Options {
        Options {
            transport: self.transport,
            with_imm: self.with_imm,
            atomic_op: self.atomic_op,
            rx_depth: self.rx_depth,
            outstanding_reads: self.outstanding_reads,
            sizes: if self.all { Some(TestSpec::sweep_sizes()) } else { self.size.map(|s| vec![s]) },
            iterations: self.iterations,
            duration: self.duration,
            tx_depth: self.tx_depth,
            cq_mod: self.cq_mod,
            post_list: self.post_list,
            qps: self.num_qps,
            threads: self.threads,
            bidirectional: self.bidirectional,
            events: self.events,
            inline_size: self.inline,
            mtu: self.mtu,
            validate_data: self.validate_data,
            rdma_cm: self.rdma_cm,
            profile: self.profile.map(|p| p.profile().name.to_string()),
            corrupt_at: self.corrupt_at,
            capacity: self.capacity,
            batch: self.batch,
            notify: self.notify,
            fabric: self.fabric.options(),
            warmup: self.warmup,
            interval: self.interval,
            no_relaxed_ordering: self.no_relaxed_ordering,
            hugepages: self.hugepages,
            odp: self.odp,
            wait: self.wait,
        }
    }

    pub fn spec(&self, operation: Operation, measure: Measure) -> TestSpec {
        self.test_options().spec(operation, measure)
    }

    /// The test flags given (a server ignores them and says so).
    pub fn test_flags_given(&self) -> Vec<&'static str> {
        self.test_options().given().into_iter().map(Field::flag).collect()
    }

    pub fn options(&self) -> Result<RunOptions> {
        Ok(RunOptions {
            json: self.json.clone(),
            cpu_util: self.cpu_util,
            counters: self.counters,
            interval_log: self.interval_log.clone(),
            histogram: self.histogram.clone(),
            ..self.conn.run_options(self.report_gbits)?
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::RingParams;
    use crate::spec::ring::Wait;
    use clap::Parser;

    fn parse(args: &[&str]) -> std::result::Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("rdmabench").chain(args.iter().copied()))
    }

    fn test_args(args: &[&str]) -> TestArgs {
        let cli = parse(args).unwrap();
        cli.command.test().expect("a test subcommand").2.clone()
    }

    #[test]
    fn ring_tests_have_their_own_defaults_and_flags() {
        // 32 records of 64 KiB and their frame words: just over 2 MiB.
        let bw = test_args(&["ring-bw"]).spec(Operation::Ring, Measure::Bandwidth);
        assert_eq!(
            bw.ring,
            Some(RingParams { capacity: 4 << 20, notify: Notify::Imm, batch: 16, wait: Wait::Adaptive })
        );
        let lat = test_args(&["ring-lat"]).spec(Operation::Ring, Measure::Latency);
        assert_eq!(lat.ring, Some(RingParams { capacity: 64 << 10, notify: Notify::Poll, batch: 1, wait: Wait::Spin }));
        bw.check().unwrap();
        lat.check().unwrap();
        // Small records: the floor. A sweep: sized for its largest (8 MiB) record, capped
        // at 64 MiB; ring-lat's sweep holds 8 of them in the same 64 MiB.
        let small = test_args(&["ring-bw", "-s", "64"]).spec(Operation::Ring, Measure::Bandwidth);
        assert_eq!(small.ring.unwrap().capacity, 1 << 20);
        for (test, measure) in [("ring-bw", Measure::Bandwidth), ("ring-lat", Measure::Latency)] {
            let sweep = test_args(&[test, "-a"]).spec(Operation::Ring, measure);
            assert_eq!(sweep.ring.unwrap().capacity, 64 << 20, "{test} -a");
            sweep.check().unwrap();
        }
        // A record over half the largest default: the smallest ring that holds two.
        let huge = test_args(&["ring-bw", "-s", "104857600"]).spec(Operation::Ring, Measure::Bandwidth);
        assert_eq!(huge.ring.unwrap().capacity, 256 << 20);
        let set = test_args(&["ring-bw", "--capacity", "4M", "--notify", "poll", "--batch", "4"])
            .spec(Operation::Ring, Measure::Bandwidth);
        assert_eq!(
            set.ring,
            Some(RingParams { capacity: 4 << 20, notify: Notify::Poll, batch: 4, wait: Wait::Adaptive })
        );
        let server = test_args(&["ring-bw", "--capacity", "4M"]);
        assert_eq!(server.test_flags_given(), vec!["--capacity"], "a server ignores the client's ring flags");
    }

    #[test]
    fn every_byte_valued_flag_takes_the_same_suffixes() {
        let a = test_args(&["write-bw", "-s", "64K", "-I", "128", "-m", "4K", "host"]);
        assert_eq!((a.size, a.inline, a.mtu), (Some(65536), Some(128), Some(4096)));
        let a = test_args(&["write-bw", "-s", "8MiB"]);
        assert_eq!(a.size, Some(8 << 20));
        let a = test_args(&["ring-bw", "--capacity", "64KiB", "-s", "1KB"]);
        assert_eq!((a.capacity, a.size), (Some(65536), Some(1024)));
        let Command::Validate(v) = parse(&["validate", "--profile", "generic", "--mr-size", "1GiB"]).unwrap().command
        else {
            panic!()
        };
        assert_eq!(v.mr_size, 1 << 30);
        for bad in [&["write-bw", "-s", "64Q"][..], &["write-bw", "-m", "8G"], &["write-bw", "-I", "1.5K"]] {
            let e = parse(bad).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{bad:?}");
        }
    }

    #[test]
    fn every_operation_has_a_lat_and_a_bw_subcommand() {
        for (name, op, measure) in [
            ("write-lat", Operation::Write, Measure::Latency),
            ("read-bw", Operation::Read, Measure::Bandwidth),
            ("send-lat", Operation::Send, Measure::Latency),
            ("atomic-bw", Operation::Atomic, Measure::Bandwidth),
        ] {
            let cli = parse(&[name]).unwrap();
            let (o, m, a) = cli.command.test().unwrap();
            assert_eq!((o, m), (op, measure));
            let spec = a.spec(o, m);
            spec.check().unwrap();
            if o == Operation::Atomic {
                assert_eq!(spec.sizes, vec![8]);
            }
        }
    }

    #[test]
    fn transport_imm_atomic_and_read_flags() {
        let a = test_args(&["send-bw", "-c", "ud", "-r", "64", "--with-imm"]);
        let s = a.spec(Operation::Send, Measure::Bandwidth);
        assert_eq!((s.transport, s.rx_depth, s.with_imm), (Transport::Ud, 64, true));
        let a = test_args(&["atomic-lat", "-A", "CMP_AND_SWP"]);
        assert_eq!(a.spec(Operation::Atomic, Measure::Latency).atomic_op, AtomicOp::CmpAndSwp);
        let a = test_args(&["read-bw", "--outstanding-reads", "4"]);
        assert_eq!(a.outstanding_reads, Some(4));
        assert_eq!(parse(&["send-bw", "-c", "XRC"]).unwrap_err().exit_code(), 2);
        assert_eq!(parse(&["atomic-bw", "-A", "SWAP"]).unwrap_err().exit_code(), 2);
        let refused = test_args(&["read-lat", "-c", "UC"]).spec(Operation::Read, Measure::Latency).check();
        assert_eq!(refused.unwrap_err().exit_code(), 2);
    }

    #[test]
    fn perftest_defaults_apply_per_test() {
        let lat = test_args(&["write-lat", "server-host"]).spec(Operation::Write, Measure::Latency);
        assert_eq!((lat.sizes.clone(), lat.iterations, lat.tx_depth, lat.requested_inline()), (vec![2], 1000, 1, 220));
        let bw = test_args(&["write-bw"]).spec(Operation::Write, Measure::Bandwidth);
        assert_eq!((bw.sizes.clone(), bw.iterations, bw.tx_depth, bw.cq_mod), (vec![65536], 5000, 128, 100));
    }

    #[test]
    fn perftest_short_flags_parse() {
        let a = test_args(&[
            "write-bw",
            "-d",
            "rxe0",
            "-i",
            "1",
            "-x",
            "1",
            "-p",
            "19000",
            "-s",
            "4096",
            "-n",
            "77",
            "-t",
            "64",
            "-Q",
            "8",
            "-I",
            "64",
            "-m",
            "1024",
            "--report_gbits",
            "--json",
            "-",
            "10.0.0.1",
        ]);
        assert_eq!(a.host.as_deref(), Some("10.0.0.1"));
        assert_eq!(
            (a.conn.device.clone(), a.conn.ib_port, a.conn.gid_index, a.conn.port),
            (Some(Devices::Named(vec!["rxe0".into()])), 1, Some(1), 19000)
        );
        let s = a.spec(Operation::Write, Measure::Bandwidth);
        assert_eq!(
            (s.sizes[0], s.iterations, s.tx_depth, s.cq_mod, s.inline_size, s.mtu),
            (4096, 77, 64, 8, Some(64), Some(1024))
        );
        assert_eq!(a.options().unwrap().units, Units::GigaBits);
        assert!(test_args(&["write-bw", "--report-gbits"]).report_gbits);
    }

    #[test]
    fn sweep_and_duration() {
        let s = test_args(&["write-lat", "-a", "-D", "2"]).spec(Operation::Write, Measure::Latency);
        assert_eq!(s.sizes.len(), 23);
        assert_eq!(s.duration_secs, Some(2.0));
    }

    #[test]
    fn conflicting_and_malformed_flags_are_usage_errors() {
        for bad in [
            &["write-bw", "-a", "-s", "8"][..],
            &["write-bw", "-n", "5", "-D", "1"],
            &["write-bw", "-s", "-5"],
            &["write-bw", "-s", "lots"],
            &["write-bw", "-i", "300"],
            &["write-bw", "--bogus"],
        ] {
            let e = parse(bad).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{bad:?}");
        }
    }

    #[test]
    fn timeouts_must_be_positive() {
        let a = test_args(&["write-bw", "--timeout", "0"]);
        assert_eq!(a.options().map(|_| ()).unwrap_err().exit_code(), 2);
        let a = test_args(&["write-bw", "--connect-timeout=-3"]);
        assert!(a.options().is_err());
    }

    #[test]
    fn server_reports_which_test_flags_it_ignores() {
        assert!(test_args(&["write-bw"]).test_flags_given().is_empty());
        assert_eq!(test_args(&["write-bw", "-s", "8", "-Q", "4"]).test_flags_given(), vec!["-s", "-Q"]);
    }
}
