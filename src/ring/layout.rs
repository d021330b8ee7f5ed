//! What a ring session agrees on (`RingConfig`, carried in the test spec) and where
//! everything lives in each side's registered buffer (`RingLayout`). Both sides compute
//! the layout from the config alone.

use super::core;
pub use crate::spec::ring::{Notify, RingLayout, RingParams, Wait};
use crate::spec::{Measure, Operation, TestSpec};

/// A ring's configuration, for the library.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingConfig {
    pub capacity: u64,
    pub notify: Notify,
    pub batch: u32,
    /// How the consumer waits for records and a blocked producer for credit.
    pub wait: Wait,
    /// Send queue depth of each side.
    pub tx_depth: u32,
    /// Receives the consumer keeps posted (`Imm`): writes in flight at most.
    pub rx_depth: u32,
}

impl Default for RingConfig {
    fn default() -> Self {
        RingConfig {
            capacity: 1 << 20,
            notify: Notify::Imm,
            batch: 16,
            wait: Wait::Adaptive,
            tx_depth: 128,
            rx_depth: 256,
        }
    }
}

impl RingConfig {
    pub fn params(&self) -> RingParams {
        RingParams { capacity: self.capacity, notify: self.notify, batch: self.batch, wait: self.wait }
    }

    /// The spec a ring session runs under (the session and the connection come from the
    /// tests' machinery).
    pub fn to_spec(&self, measure: Measure) -> TestSpec {
        let mut spec = TestSpec::new(Operation::Ring, measure);
        // A library session's records take any size up to the ring's largest.
        spec.sizes = vec![core::max_record(self.capacity)];
        spec.tx_depth = self.tx_depth;
        spec.rx_depth = self.rx_depth;
        spec.ring = Some(self.params());
        spec
    }

    pub fn from_spec(spec: &TestSpec) -> Option<RingConfig> {
        let p = spec.ring?;
        Some(RingConfig {
            capacity: p.capacity,
            notify: p.notify,
            batch: p.batch,
            wait: p.wait,
            tx_depth: spec.tx_depth,
            rx_depth: spec.rx_depth,
        })
    }

    /// Checks what needs no device.
    pub fn check(&self) -> Result<(), String> {
        crate::spec::ring::check(&self.params(), self.tx_depth, self.rx_depth, crate::spec::Field::flag)
            .map_err(|r| r.message)
    }
}
