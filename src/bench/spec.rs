//! What a test is: the operation, the measurement, sizes, counts and queue settings.
//! The client builds it from flags and sends it whole to the server, which needs only
//! device flags. Checks that need no device live here; checks against a device's
//! limits live in `check_against_device`, fed with the limits the verbs layer read.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Operation {
    Write,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Measure {
    Latency,
    Bandwidth,
}

/// Largest size of an `-a` sweep, as perftest: 2 B .. 8 MiB.
pub const SWEEP_MAX: u64 = 8 << 20;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TestSpec {
    pub operation: Operation,
    pub measure: Measure,
    /// One size, or every size of a sweep in order.
    pub sizes: Vec<u64>,
    /// Iterations per size (ignored when `duration_secs` is set).
    pub iterations: u64,
    /// Run each size for this long instead of a fixed count.
    pub duration_secs: Option<f64>,
    /// Send queue depth: outstanding work requests.
    pub tx_depth: u32,
    /// Request a completion every `cq_mod` work requests.
    pub cq_mod: u32,
    /// Inline threshold in bytes; `None` means the default for the test, clamped to the device.
    pub inline_size: Option<u32>,
    /// Path MTU in bytes; `None` means the smaller of the two ports' active MTUs.
    pub mtu: Option<u32>,
    /// Fill every message with a per-iteration pattern and check it where it lands.
    pub validate_data: bool,
    /// Fault injection for tests: flip one payload byte at this iteration (needs validate_data).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub corrupt_at: Option<u64>,
}

/// perftest's defaults for one test.
pub struct Defaults {
    pub size: u64,
    pub iterations: u64,
    pub tx_depth: u32,
    pub inline_size: u32,
}

impl TestSpec {
    /// perftest's test name: `write_lat`, `write_bw`.
    pub fn name(&self) -> String {
        let op = match self.operation {
            Operation::Write => "write",
        };
        let kind = match self.measure {
            Measure::Latency => "lat",
            Measure::Bandwidth => "bw",
        };
        format!("{op}_{kind}")
    }

    pub fn defaults(operation: Operation, measure: Measure) -> Defaults {
        match (operation, measure) {
            (Operation::Write, Measure::Latency) => {
                Defaults { size: 2, iterations: 1000, tx_depth: 1, inline_size: 220 }
            }
            (Operation::Write, Measure::Bandwidth) => {
                Defaults { size: 65536, iterations: 5000, tx_depth: 128, inline_size: 0 }
            }
        }
    }

    /// Every size of an `-a` sweep: powers of two from 2 B to 8 MiB.
    pub fn sweep_sizes() -> Vec<u64> {
        (1..=23).map(|p| 1u64 << p).collect()
    }

    pub fn max_size(&self) -> u64 {
        self.sizes.iter().copied().max().unwrap_or(0)
    }

    /// Completion moderation actually used: never more than the queue depth (perftest does the same).
    pub fn effective_cq_mod(&self) -> u32 {
        self.cq_mod.clamp(1, self.tx_depth.max(1))
    }

    /// Inline threshold actually requested from the device.
    pub fn requested_inline(&self) -> u32 {
        self.inline_size.unwrap_or_else(|| Self::defaults(self.operation, self.measure).inline_size)
    }

    /// Checks that need no device. Both sides run it: the server never trusts the wire.
    pub fn check(&self) -> Result<()> {
        if self.sizes.is_empty() {
            return Err(Error::Usage("no message size given; use -s BYTES or -a".into()));
        }
        if self.sizes.contains(&0) {
            return Err(Error::Usage(
                "message size 0 is not allowed; use -s with 1 or more bytes (up to the device's max message size)"
                    .into(),
            ));
        }
        if self.duration_secs.is_none() && self.iterations == 0 {
            return Err(Error::Usage("iterations must be at least 1; use -n 1 or more".into()));
        }
        if let Some(d) = self.duration_secs
            && !(d.is_finite() && d > 0.0 && d <= 86_400.0)
        {
            return Err(Error::Usage(format!("duration {d} s is out of range; use -D with 1..=86400 seconds")));
        }
        if self.tx_depth == 0 {
            return Err(Error::Usage(
                "tx depth 0 is not allowed; use -t 1 or more (up to the device's max_qp_wr)".into(),
            ));
        }
        if self.cq_mod == 0 {
            return Err(Error::Usage("CQ moderation 0 is not allowed; use -Q 1 or more".into()));
        }
        if let Some(mtu) = self.mtu
            && ![256, 512, 1024, 2048, 4096].contains(&mtu)
        {
            return Err(Error::Usage(format!(
                "MTU {mtu} is not an RDMA path MTU; use -m 256, 512, 1024, 2048 or 4096"
            )));
        }
        if self.corrupt_at.is_some() && !self.validate_data {
            return Err(Error::Usage("--inject-corruption needs --validate-data".into()));
        }
        Ok(())
    }
}

/// The limits of one device and port that a spec must fit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceLimits {
    pub device: String,
    pub max_msg_size: u64,
    pub max_qp_wr: u32,
    pub max_cqe: u32,
    /// Largest inline size the device accepts for this QP type (probed at QP creation).
    pub max_inline: u32,
    pub active_mtu: u32,
}

/// Checks a spec against one side's device limits. Explicit values above a limit are
/// errors naming the limit; the default inline size is clamped silently instead.
pub fn check_against_device(spec: &TestSpec, lim: &DeviceLimits) -> Result<()> {
    let max = spec.max_size();
    if max > lim.max_msg_size {
        return Err(Error::Usage(format!(
            "message size {max} B exceeds {}'s max message size {} B; use -s 1..={}",
            lim.device, lim.max_msg_size, lim.max_msg_size
        )));
    }
    if spec.tx_depth > lim.max_qp_wr {
        return Err(Error::Usage(format!(
            "tx depth {} exceeds {}'s max_qp_wr {}; use -t 1..={}",
            spec.tx_depth, lim.device, lim.max_qp_wr, lim.max_qp_wr
        )));
    }
    if spec.tx_depth > lim.max_cqe {
        return Err(Error::Usage(format!(
            "tx depth {} exceeds {}'s max CQ entries {}; use -t 1..={}",
            spec.tx_depth, lim.device, lim.max_cqe, lim.max_cqe
        )));
    }
    if let Some(inline) = spec.inline_size
        && inline > lim.max_inline
    {
        return Err(Error::Usage(format!(
            "inline size {inline} B exceeds {}'s max inline data {} B; use -I 0..={}",
            lim.device, lim.max_inline, lim.max_inline
        )));
    }
    if let Some(mtu) = spec.mtu
        && mtu > lim.active_mtu
    {
        return Err(Error::Usage(format!(
            "MTU {mtu} exceeds {}'s active MTU {}; use -m {} or less",
            lim.device, lim.active_mtu, lim.active_mtu
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    pub fn spec() -> TestSpec {
        TestSpec {
            operation: Operation::Write,
            measure: Measure::Bandwidth,
            sizes: vec![65536],
            iterations: 5000,
            duration_secs: None,
            tx_depth: 128,
            cq_mod: 100,
            inline_size: None,
            mtu: None,
            validate_data: false,
            corrupt_at: None,
        }
    }

    fn limits() -> DeviceLimits {
        DeviceLimits {
            device: "rxe0".into(),
            max_msg_size: 1 << 31,
            max_qp_wr: 1 << 20,
            max_cqe: 32767,
            max_inline: 416,
            active_mtu: 4096,
        }
    }

    fn usage(r: Result<()>) -> String {
        match r {
            Err(Error::Usage(m)) => m,
            other => panic!("expected a usage error, got {other:?}"),
        }
    }

    #[test]
    fn defaults_pass() {
        spec().check().unwrap();
        check_against_device(&spec(), &limits()).unwrap();
    }

    #[test]
    fn size_zero_is_refused_with_the_fix() {
        let mut s = spec();
        s.sizes = vec![0];
        let m = usage(s.check());
        assert!(m.contains("size 0") && m.contains("-s"), "{m}");
    }

    #[test]
    fn zero_depth_iterations_and_moderation_are_refused() {
        let mut s = spec();
        s.tx_depth = 0;
        assert!(usage(s.check()).contains("-t"));
        let mut s = spec();
        s.iterations = 0;
        assert!(usage(s.check()).contains("-n"));
        let mut s = spec();
        s.cq_mod = 0;
        assert!(usage(s.check()).contains("-Q"));
    }

    #[test]
    fn duration_replaces_iterations_and_must_be_sane() {
        let mut s = spec();
        s.iterations = 0;
        s.duration_secs = Some(2.0);
        s.check().unwrap();
        s.duration_secs = Some(-1.0);
        assert!(usage(s.check()).contains("-D"));
        s.duration_secs = Some(f64::NAN);
        assert!(usage(s.check()).contains("-D"));
    }

    #[test]
    fn bad_mtu_lists_valid_values() {
        let mut s = spec();
        s.mtu = Some(1500);
        let m = usage(s.check());
        assert!(m.contains("1024") && m.contains("4096"), "{m}");
    }

    #[test]
    fn device_limits_are_named_in_errors() {
        let mut s = spec();
        s.sizes = vec![1 << 32];
        let m = usage(check_against_device(&s, &limits()));
        assert!(m.contains("max message size 2147483648") && m.contains("rxe0"), "{m}");

        let mut s = spec();
        s.tx_depth = 2_000_000;
        let m = usage(check_against_device(&s, &limits()));
        assert!(m.contains("max_qp_wr 1048576") && m.contains("-t 1..=1048576"), "{m}");

        let mut s = spec();
        s.inline_size = Some(1024);
        let m = usage(check_against_device(&s, &limits()));
        assert!(m.contains("max inline data 416") && m.contains("-I 0..=416"), "{m}");

        let mut s = spec();
        s.mtu = Some(4096);
        let mut l = limits();
        l.active_mtu = 1024;
        assert!(usage(check_against_device(&s, &l)).contains("active MTU 1024"));
    }

    #[test]
    fn default_inline_is_not_an_error_even_above_the_device() {
        let mut s = spec();
        s.measure = Measure::Latency;
        let mut l = limits();
        l.max_inline = 64;
        check_against_device(&s, &l).unwrap();
        assert_eq!(s.requested_inline(), 220);
    }

    #[test]
    fn cq_moderation_is_capped_by_depth() {
        let mut s = spec();
        s.tx_depth = 16;
        assert_eq!(s.effective_cq_mod(), 16);
        s.tx_depth = 128;
        assert_eq!(s.effective_cq_mod(), 100);
    }

    #[test]
    fn sweep_is_2_bytes_to_8_mib() {
        let s = TestSpec::sweep_sizes();
        assert_eq!(s.first(), Some(&2));
        assert_eq!(s.last(), Some(&SWEEP_MAX));
        assert_eq!(s.len(), 23);
    }
}
