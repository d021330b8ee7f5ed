//! A stream of records of random sizes through `rdmabench::ring`, checked end to end: the
//! program of the `ring` module's documentation.
//!
//! ```text
//! ring consume [--port 18600] [--delay-us 0]            # one process (or pod) ...
//! ring produce HOST [--port 18600] [--records 100000]   # ... and another
//!              [--min-size 16] [--max-size 1024] [--capacity 1M] [--notify imm|poll]
//! ```
//!
//! Each record is `[number: u64][checksum of the rest: u64][random bytes]`; the consumer
//! checks, in place, that records arrive in order and intact. `--delay-us` slows the
//! consumer so the producer meets a full ring (it reports how often it had to wait).
//! Exit status: 0 all good, 1 a record was lost, reordered or corrupted, others as
//! rdmabench's.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use rdmabench::ring::{self, Notify, RingConfig};
use rdmabench::verbs::DeviceSelection;

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    role: Role,
    /// RDMA device (default: the first one).
    #[arg(short = 'd', long, global = true)]
    device: Option<String>,
    /// GID index (default: a RoCE v2 GID whose netdev is up).
    #[arg(short = 'x', long, global = true)]
    gid_index: Option<u32>,
    /// TCP port of the session.
    #[arg(short = 'p', long, default_value_t = 18600, global = true)]
    port: u16,
    /// Seconds any wait for the peer may last.
    #[arg(long, default_value_t = 10, global = true)]
    timeout: u64,
}

#[derive(Subcommand)]
enum Role {
    /// Wait for a producer and check every record it sends.
    Consume {
        /// Microseconds to hold each record before releasing it (a slow consumer).
        #[arg(long, default_value_t = 0)]
        delay_us: u64,
    },
    /// Send records of random sizes to the consumer at HOST.
    Produce {
        host: String,
        #[arg(long, default_value_t = 100_000)]
        records: u64,
        /// Smallest record, bytes (or with K/M/G).
        #[arg(long, default_value = "16", value_parser = record_size)]
        min_size: usize,
        /// Largest record, bytes (or with K/M/G).
        #[arg(long, default_value = "1K", value_parser = record_size)]
        max_size: usize,
        /// Bytes of the ring: a power of two (the consumer takes the producer's).
        #[arg(long, default_value = "1M", value_parser = rdmabench::units::parse_bytes)]
        capacity: u64,
        #[arg(long, value_enum, default_value = "imm")]
        notify: Notify,
        /// Seed of the record sizes and contents.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
}

const STAMP: usize = 16;

fn record_size(s: &str) -> Result<usize, String> {
    let n = rdmabench::units::parse_bytes(s)?;
    usize::try_from(n).map_err(|_| format!("{s:?} is too large for this machine"))
}

fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let device = DeviceSelection { device: cli.device.clone(), port: 1, gid_index: cli.gid_index };
    let timeout = Duration::from_secs(cli.timeout);
    let result = match &cli.role {
        Role::Consume { delay_us } => consume(cli.port, &device, timeout, Duration::from_micros(*delay_us)),
        Role::Produce { host, records, min_size, max_size, capacity, notify, seed } => {
            let config = RingConfig { capacity: *capacity, notify: *notify, ..RingConfig::default() };
            let sizes = (*min_size).max(STAMP)..=(*max_size).max(STAMP);
            produce(host, cli.port, &device, config, timeout, *records, sizes, *seed)
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ring: {e}");
            ExitCode::from(e.exit_code() as u8)
        }
    }
}

fn consume(port: u16, device: &DeviceSelection, timeout: Duration, delay: Duration) -> rdmabench::Result<()> {
    let consumer = ring::Consumer::accept(port, device, timeout)?;
    let (mut expected, mut bytes, start) = (0u64, 0u64, Instant::now());
    while let Some(record) = consumer.recv()? {
        // The record is a slice of the registered ring: read in place, no copy.
        let number = u64::from_le_bytes(record[..8].try_into().expect("8 bytes"));
        let sum = u64::from_le_bytes(record[8..STAMP].try_into().expect("8 bytes"));
        if number != expected {
            return Err(rdmabench::Error::Check(format!("record {number} arrived where {expected} was due")));
        }
        if checksum(&record[STAMP..]) != sum {
            return Err(rdmabench::Error::Check(format!("record {number} ({} B) fails its checksum", record.len())));
        }
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        bytes += record.len() as u64;
        expected += 1;
        // Dropping `record` releases its space; credit goes back a quarter ring at a time.
    }
    let secs = start.elapsed().as_secs_f64();
    println!("consumed {expected} records, {bytes} B, in order, checksums ok ({secs:.2} s)");
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn produce(
    host: &str,
    port: u16,
    device: &DeviceSelection,
    config: RingConfig,
    timeout: Duration,
    records: u64,
    sizes: std::ops::RangeInclusive<usize>,
    seed: u64,
) -> rdmabench::Result<()> {
    let mut producer = ring::Producer::connect(host, port, device, config, timeout)?;
    // Reproducible noise, not quality: the record sizes and bytes of one seed repeat.
    let mut noise = rdmabench::stats::rng::SplitMix::new(seed);
    let span = (sizes.end() - sizes.start() + 1) as u64;
    let (mut waits, mut bytes) = (0u64, 0u64);
    for number in 0..records {
        let len = sizes.start() + (noise.next_u64() % span) as usize;
        // Look first, to count how often the ring was full (a reservation dropped unused
        // is given back); then wait for credit.
        if producer.try_reserve(len)?.is_none() {
            waits += 1;
        }
        let mut slot = producer.reserve(len)?;
        // Written in place, in registered memory: this is what the RDMA WRITE sends.
        for chunk in slot[STAMP..].chunks_mut(8) {
            let word = noise.next_u64().to_le_bytes();
            chunk.copy_from_slice(&word[..chunk.len()]);
        }
        let sum = checksum(&slot[STAMP..]);
        slot[..8].copy_from_slice(&number.to_le_bytes());
        slot[8..STAMP].copy_from_slice(&sum.to_le_bytes());
        slot.commit()?;
        bytes += len as u64;
    }
    producer.finish()?;
    println!("produced {records} records, {bytes} B; the ring was full {waits} times");
    Ok(())
}
