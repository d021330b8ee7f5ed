//! rdmabench: an RDMA verbs benchmark and validation harness.
//!
//! The data path of a test: spec (`bench::spec`) -> session (`session`, TCP control
//! channel) -> kernel (`bench::latency`, `bench::bandwidth`, on `verbs`) -> samples and
//! summary (`stats`) -> report (`report`: table and JSON). `verbs` is the only module
//! that talks to libibverbs (through sideway). `validate` checks what a device plugin
//! gave a pod and computes the NCCL environment, from sysfs. `workload` runs suites of
//! steps with thresholds; `regress` compares a run with a baseline. `ring` is the
//! zero-copy registered-memory ring buffer, a library of its own (`ring-bw`/`ring-lat`
//! measure it).

pub mod bench;
pub mod cli;
pub mod devices;
pub mod error;
pub mod k8s;
pub mod link;
pub mod regress;
pub mod report;
pub mod ring;
pub mod session;
pub mod signals;
pub mod spec;
pub mod stats;
pub mod units;
pub mod validate;
pub mod verbs;
pub mod workload;

pub use error::{Error, Result};
