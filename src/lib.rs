//! rdmabench: an RDMA verbs benchmark and validation harness.
//!
//! The data path of a test: spec (`spec`) -> session (`session`, the TCP control channel)
//! -> the connected pair (`link`: buffers, QPs, endpoints, waits) -> kernel (`bench`) ->
//! samples and summary (`stats`) -> report (`report`: table, JSON, JUnit, SVG). `verbs` is
//! the only module that talks to libibverbs (through sideway). `validate` checks what a
//! device plugin gave a pod and computes the NCCL environment, from sysfs. `workload` runs
//! suites of steps with thresholds; `regress` compares a run with a baseline; `k8s` renders
//! the Jobs. `ring` is the zero-copy registered-memory ring buffer, a library of its own
//! on `link` (`ring-bw`/`ring-lat` in `bench` measure it).
//!
//! ## Layers
//! Every import points down: a module uses only the layers below its own, and modules of its
//! own layer without a circle. `tests/layers.rs` reads this table and fails otherwise.
//!
//! | layer | modules | what it owns |
//! |---|---|---|
//! | app | main, cli | parse flags, map errors to exit codes |
//! | suites | workload, regress, history, k8s, fleet | suites and verdicts, baselines, perf history, manifests, fleets and their verdicts |
//! | bench | bench | the kernels (latency, bandwidth, ring) and the roles that drive them |
//! | ring | ring | the zero-copy ring library: pure core + transport on `link` |
//! | validate | validate | what a pod was given, checked against a platform mode |
//! | link | link | the connected pair: buffers, QPs, endpoints exchanged, waits and windows |
//! | session | session | control channel: frames, handshake, deadlines, peer loss |
//! | report | report | tables, JSON, JUnit, SVG from plain result types |
//! | verbs | verbs | the only binding to libibverbs and rdma_cm |
//! | base | spec, stats, units, names, error, signals, faults | what a test is; clock, histograms; units; names shown and sent; errors; signals; fault points for the lab |

pub mod bench;
pub mod cli;
pub mod error;
pub mod faults;
pub mod fleet;
pub mod history;
pub mod k8s;
pub mod link;
pub mod names;
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
