//! Property tests of every decoder that a stranger or a file feeds: control frames and the
//! handshake's messages, workload and fleet TOML, the `RDMABENCH_PAIR` / `RESULT` /
//! `SERVED` / `LEFT` lines `summarize` reads, the run documents `compare` reads, and the
//! sysfs trees `validate` and `nccl-env` read. Inputs are real documents mutated (numbers
//! at their limits, escapes, splices, truncations, deep nesting, huge runs) and bytes from
//! nowhere. Each decoder must not panic, must hold memory bounded by its input's size, and
//! must refuse with a clear error. A few thousand cases each here; a million each with
//! `RDMABENCH_DECODER_CASES=1000000` (docs/development.md).

mod files;
mod frames;
mod harness;
mod logs;
mod runs;
mod sysfs;

#[global_allocator]
static COUNTING: harness::Counting = harness::Counting;
