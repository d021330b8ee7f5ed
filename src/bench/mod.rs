//! Measurements: the kernels (`latency`, `bandwidth`, `ring`) on the connected pair
//! (`crate::link`), payload patterns (`pattern`), and the client and server roles that
//! drive a run over the session (`runner`), pair checks against a platform profile included.

pub mod bandwidth;
pub mod cpus;
pub mod latency;
pub mod memory;
pub mod pattern;
pub mod rails;
pub mod ring;
pub mod runner;
pub mod soak;
