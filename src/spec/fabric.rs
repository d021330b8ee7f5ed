//! How a test's packets travel the fabric: the RoCE v2 header fields that choose a
//! switch queue (traffic class = DSCP and ECN, service level, flow label, hop limit) and
//! RC's retransmission (local ACK timeout, retry and RNR retry counts). Both sides take
//! them from the one spec; the binding gets them as plain numbers.

use serde::{Deserialize, Serialize};

use super::options::{Field, Names, Refusal};

/// The fabric fields of a spec (numbers as the verbs take them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Fabric {
    /// `--tclass`: the GRH traffic class, on RoCE v2 the IP header's DS field (DSCP << 2 | ECN).
    pub traffic_class: u32,
    /// `--sl`: the service level (on RoCE, mapped to a priority by the device).
    pub service_level: u32,
    /// `--flow-label`: the GRH flow label (20 bits); RoCE v2 devices derive the UDP source port from it.
    pub flow_label: u32,
    /// `--hop-limit`: the GRH hop limit, the IP TTL.
    pub hop_limit: u32,
    /// `-u`: the local ACK timeout exponent: 4.096 us x 2^N before RC retransmits (0: wait forever).
    pub qp_timeout: u32,
    /// `--retry-count`: RC retransmissions before the QP fails with a retry error.
    pub retry_count: u32,
    /// `--rnr-retry`: retries when the receiver had no receive posted (7: forever).
    pub rnr_retry: u32,
}

impl Default for Fabric {
    fn default() -> Fabric {
        Fabric {
            traffic_class: 0,
            service_level: 0,
            flow_label: 0,
            hop_limit: 64,
            qp_timeout: 14,
            retry_count: 7,
            rnr_retry: 7,
        }
    }
}

/// The fabric options a user gave (`None` where nothing was).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FabricOptions {
    pub traffic_class: Option<u32>,
    pub service_level: Option<u32>,
    pub flow_label: Option<u32>,
    pub hop_limit: Option<u32>,
    pub qp_timeout: Option<u32>,
    pub retry_count: Option<u32>,
    pub rnr_retry: Option<u32>,
}

/// Each field with its option and its valid range.
const RANGES: [(Field, u32, u32); 7] = [
    (Field::TrafficClass, 0, 255),
    (Field::ServiceLevel, 0, 15),
    (Field::FlowLabel, 0, 0xF_FFFF),
    (Field::HopLimit, 1, 255),
    (Field::QpTimeout, 0, 31),
    (Field::RetryCount, 0, 7),
    (Field::RnrRetry, 0, 7),
];

impl FabricOptions {
    /// These options over the defaults.
    pub fn fabric(&self) -> Fabric {
        let d = Fabric::default();
        Fabric {
            traffic_class: self.traffic_class.unwrap_or(d.traffic_class),
            service_level: self.service_level.unwrap_or(d.service_level),
            flow_label: self.flow_label.unwrap_or(d.flow_label),
            hop_limit: self.hop_limit.unwrap_or(d.hop_limit),
            qp_timeout: self.qp_timeout.unwrap_or(d.qp_timeout),
            retry_count: self.retry_count.unwrap_or(d.retry_count),
            rnr_retry: self.rnr_retry.unwrap_or(d.rnr_retry),
        }
    }

    /// The fields given, in [`RANGES`] order.
    pub fn given(&self) -> Vec<Field> {
        let f = [
            self.traffic_class,
            self.service_level,
            self.flow_label,
            self.hop_limit,
            self.qp_timeout,
            self.retry_count,
            self.rnr_retry,
        ];
        RANGES.iter().zip(f).filter(|(_, v)| v.is_some()).map(|((field, _, _), _)| *field).collect()
    }
}

impl Fabric {
    fn values(&self) -> [u32; 7] {
        [
            self.traffic_class,
            self.service_level,
            self.flow_label,
            self.hop_limit,
            self.qp_timeout,
            self.retry_count,
            self.rnr_retry,
        ]
    }

    /// Every field within its range, or the option at fault with the range.
    pub fn check(&self, n: Names) -> Result<(), Refusal> {
        for ((field, lo, hi), v) in RANGES.iter().zip(self.values()) {
            if v < *lo || v > *hi {
                return Err(Refusal {
                    field: *field,
                    message: format!("{} {v} is out of range; use {} {lo}..={hi}", n(*field), n(*field)),
                });
            }
        }
        Ok(())
    }

    /// How long RC keeps retransmitting an unacknowledged packet before the QP fails: the
    /// ACK timeout (4.096 us x 2^`qp_timeout`) once, then once per retry. `None`: timeout
    /// 0 waits forever. Devices may round the timeout up (rxe uses at least its own).
    pub fn give_up_after_ms(&self) -> Option<f64> {
        (self.qp_timeout > 0).then(|| self.ack_timeout_ms() * f64::from(self.retry_count + 1))
    }

    /// One ACK timeout: 4.096 us x 2^`qp_timeout`.
    fn ack_timeout_ms(&self) -> f64 {
        4.096e-3 * f64::from(1u32 << self.qp_timeout)
    }

    /// The header's wording: DSCP and ECN spelled out.
    pub fn describe(&self) -> String {
        format!(
            "traffic class {} (DSCP {}, ECN {}), SL {}, flow label {}, hop limit {}",
            self.traffic_class,
            self.traffic_class >> 2,
            self.traffic_class & 3,
            self.service_level,
            self.flow_label,
            self.hop_limit
        )
    }

    /// RC's retransmission, for the header.
    pub fn describe_retry(&self) -> String {
        let after = match self.give_up_after_ms() {
            Some(ms) => format!("gives up after {ms:.0} ms"),
            None => "waits forever".into(),
        };
        format!(
            "ACK timeout {} ({}), retry {}, RNR retry {}{}: {after}",
            self.qp_timeout,
            if self.qp_timeout == 0 { "infinite".to_string() } else { format!("{:.1} ms", self.ack_timeout_ms()) },
            self.retry_count,
            self.rnr_retry,
            if self.rnr_retry == 7 { " (forever)" } else { "" }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_ones_hard_coded_before_and_ranges_are_named() {
        let d = Fabric::default();
        assert_eq!((d.traffic_class, d.hop_limit, d.qp_timeout, d.retry_count, d.rnr_retry), (0, 64, 14, 7, 7));
        assert!(d.check(Field::flag).is_ok());
        let bad = |f: Fabric, part: &str| {
            let r = f.check(Field::flag).unwrap_err();
            assert!(r.message.contains(part), "{}", r.message);
            let r = f.check(Field::key).unwrap_err();
            r.field
        };
        assert_eq!(bad(Fabric { service_level: 16, ..d }, "--sl 0..=15"), Field::ServiceLevel);
        assert_eq!(bad(Fabric { traffic_class: 256, ..d }, "--tclass 0..=255"), Field::TrafficClass);
        assert_eq!(bad(Fabric { flow_label: 1 << 20, ..d }, "--flow-label 0..=1048575"), Field::FlowLabel);
        assert_eq!(bad(Fabric { hop_limit: 0, ..d }, "--hop-limit 1..=255"), Field::HopLimit);
        assert_eq!(bad(Fabric { qp_timeout: 32, ..d }, "-u 0..=31"), Field::QpTimeout);
        assert_eq!(bad(Fabric { retry_count: 8, ..d }, "--retry-count 0..=7"), Field::RetryCount);
        let r = Fabric { rnr_retry: 9, ..d }.check(Field::key).unwrap_err();
        assert!(r.message.contains("rnr_retry 0..=7"), "{}", r.message);
    }

    #[test]
    fn the_give_up_time_is_the_timeout_once_per_try() {
        let f = Fabric { qp_timeout: 14, retry_count: 7, ..Fabric::default() };
        assert!((f.give_up_after_ms().unwrap() - 4.096e-3 * 16384.0 * 8.0).abs() < 1e-6);
        assert_eq!(Fabric { qp_timeout: 0, ..f }.give_up_after_ms(), None);
        let d = Fabric { traffic_class: 106, ..Fabric::default() }.describe();
        assert!(d.contains("traffic class 106 (DSCP 26, ECN 2)"), "{d}");
        assert!(
            f.describe_retry().contains("67.1 ms") && f.describe_retry().contains("537 ms"),
            "{}",
            f.describe_retry()
        );
    }

    #[test]
    fn options_fill_only_what_was_given() {
        let o = FabricOptions { traffic_class: Some(106), rnr_retry: Some(3), ..Default::default() };
        assert_eq!(o.fabric(), Fabric { traffic_class: 106, rnr_retry: 3, ..Fabric::default() });
        assert_eq!(o.given(), [Field::TrafficClass, Field::RnrRetry]);
    }
}
