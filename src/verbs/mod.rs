//! The verbs layer: the only code that names sideway or libibverbs.
//!
//! `inventory` lists what the process can see; `gid` chooses addressing (pure);
//! `context` opens a device/port and checks it; `buffer` owns registered memory;
//! `qp` creates and connects queue pairs and exposes the raw post/poll calls that the
//! measurement kernels use (pre-built work requests, no allocation per post);
//! `memlock` explains registration failures; `cm` connects QPs with rdma_cm (`-R`);
//! `endpoint` is what a side tells its peer about its QP, memory and NIC.

pub mod buffer;
pub mod cm;
pub mod context;
pub mod endpoint;
pub mod gid;
pub mod inventory;
pub mod memlock;
pub mod qp;

pub use buffer::RegisteredBuf;
pub use context::{DeviceSelection, Rdma};
pub use endpoint::{Endpoint, NicIdentity};
pub use qp::{Completion, Qp, QpCaps, RecvRequest, SendRequest, Transport};
