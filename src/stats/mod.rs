//! Samples and their summaries: the clock, the latency recorder (HDR histogram plus exact
//! min/max/mean/stdev), and the throughput meter (average and windowed peak).
//! Nothing here touches verbs or the network.

pub mod clock;
pub mod cpu;
pub mod latency;
pub mod rng;
pub mod throughput;

pub use clock::Clock;
pub use latency::{LatencyRecorder, LatencySummary};
pub use throughput::{Peak, PeakMeter, ThroughputSummary};
