//! Lab tests: real bytes over real verbs (soft-RoCE in the lab guest, or an RDMA host).
//! Built only with `--features lab` and run by `lab/test` inside the guest; each test
//! starts real rdmabench processes on rxe. They never skip: without RDMA they fail.
//!
//! One module per topology, each run in its own guest by `lab/test`: `loopback` (one
//! device), `rails` (two cables), `fleet` (a switch of six simulated nodes); `pods` runs
//! rendered Jobs' pods in the container image under an OCI runtime, on the two cables, and
//! `fleet_jobs` the rendered all-pairs fleets' pods on the switch.
//! What they share is in `common`; what a kubelet makes of a pod spec is in `kubelet`.

mod common;
mod fleet;
mod fleet_jobs;
mod kubelet;
mod loopback;
mod pods;
mod rails;
