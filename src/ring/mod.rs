//! Zero-copy registered-memory ring buffers: a stream of records from one producer to one
//! consumer over RDMA, with no copy on either side.
//!
//! The consumer owns a registered ring of `capacity` bytes; the producer owns a registered
//! staging ring of the same size, mirrored on it. [`Producer::reserve`] hands out a
//! `&mut [u8]` inside the staging ring; the application writes the record there and
//! commits it. Committed records are sent by RDMA WRITE straight from the staging memory
//! to the same offsets of the consumer's ring, contiguous records coalesced into one write
//! (up to `batch` records), completions signalled selectively. [`Consumer::recv`] hands out
//! records as borrowed slices of its ring; dropping (releasing) them returns credit by an
//! RDMA WRITE of the consumer's position into a word of the producer's memory, which the
//! producer reads locally: a quarter of the ring at a time, or at once when a blocked
//! producer asks, never a round trip per record. Records never straddle the end of the ring.
//!
//! Arrival is announced one of two ways ([`Notify`]):
//! - `Imm`: each write carries an immediate (the producer's end position) and consumes one
//!   of the consumer's posted receives; receive credits travel in the credit word too.
//! - `Poll`: the consumer polls the next record's frame word (its length and a tag carrying
//!   its number; see `core`). The ring fills from its end towards its start, so the frame
//!   word, on top of its record, is the record's last byte to become visible, provided the
//!   NIC places the bytes of one RDMA WRITE in increasing address order and the WRITEs of
//!   one RC QP in order. That holds for rxe (which copies in order) and is what perftest's
//!   `ib_write_lat` relies on for its last byte; the InfiniBand specification does not
//!   promise it. Where in doubt, use `Imm`, whose completion guarantees placement. A
//!   polling consumer clears the space it returns (a memset of every consumed byte), so a
//!   frame word not yet written reads as zero.
//!
//! A full ring blocks `reserve` (up to the session deadline; [`Producer::try_reserve`] and
//! [`Producer::reserve_within`] do not block or block less); it never overwrites unread
//! records. A record larger than the ring is refused. A lost peer ends any wait with an
//! error within the deadline. Memory stays registered as long as the ring lives.
//!
//! The two ends run in two processes (or pods), each with its own connection; the
//! consumer listens, the producer connects and its configuration is the ring's.
//! `examples/ring.rs` is a complete program of this shape (random record sizes, checked
//! end to end): `cargo run --release --example ring -- consume` on one side,
//! `... -- produce HOST` on the other.
//!
//! ```no_run
//! use std::time::Duration;
//! use rdmabench::ring::{self, Notify, RingConfig};
//! use rdmabench::verbs::DeviceSelection;
//!
//! const PORT: u16 = 18600;
//!
//! fn consume(device: &DeviceSelection) -> rdmabench::Result<()> {
//!     let consumer = ring::Consumer::accept(PORT, device, Duration::from_secs(10))?;
//!     while let Some(record) = consumer.recv()? {
//!         // `record` derefs to `&[u8]` inside the registered ring: no copy.
//!         println!("record {}: {} bytes", record.seq(), record.len());
//!     } // each record is released (its space returned to the producer) when dropped
//!     Ok(())
//! }
//!
//! fn produce(host: &str, device: &DeviceSelection) -> rdmabench::Result<()> {
//!     let config = RingConfig { capacity: 1 << 20, notify: Notify::Imm, ..RingConfig::default() };
//!     let mut producer = ring::Producer::connect(host, PORT, device, config, Duration::from_secs(10))?;
//!     let mut slot = producer.reserve(11)?; // blocks while the ring is full
//!     slot.copy_from_slice(b"hello, ring"); // written in place, in registered memory
//!     slot.commit()?;
//!     producer.finish() // flushes, waits until everything was consumed
//! }
//!
//! # fn main() -> rdmabench::Result<()> {
//! let device = DeviceSelection { device: None, port: 1, gid_index: None };
//! match std::env::args().nth(1) {
//!     Some(host) => produce(&host, &device),
//!     None => consume(&device),
//! }
//! # }
//! ```

#[doc(hidden)]
pub mod core;
mod layout;
mod session;
mod transport;

pub use self::core::{MAX_CAPACITY, MIN_CAPACITY, max_record, span};
pub use layout::{Notify, RingConfig, RingLayout};

pub use session::{Consumer, Producer};
pub use transport::{Receiver, Record, Reservation, Sender};
