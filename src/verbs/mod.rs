//! The verbs layer: the only code that names sideway or libibverbs.
//!
//! `inventory` lists what the process can see; `gid` chooses addressing (pure);
//! `context` opens a device/port and checks it; `buffer` owns registered memory;
//! `qp` creates and connects queue pairs and posts; `wr` holds the pre-built work
//! requests (no allocation per post); `cq` polls completions and sleeps on their events;
//! `counters` reads the port's event counters (sysfs); `memlock` explains registration failures; `cm` connects QPs with rdma_cm (`-R`);
//! `endpoint` is what a side tells its peer about its QP, memory and NIC.

pub mod buffer;
pub mod cm;
pub mod context;
pub mod counters;
pub mod cq;
pub mod endpoint;
pub mod gid;
pub mod inventory;
pub mod memlock;
pub mod qp;
pub mod wr;

pub use buffer::RegisteredBuf;
pub use context::{DeviceSelection, Rdma};
pub use cq::Completion;
pub use endpoint::{Endpoint, NicIdentity};
pub use qp::{Qp, QpCaps, Transport};
pub use wr::{RecvRequest, SendRequest};
