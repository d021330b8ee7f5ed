//! perftest-style tables for people. Rows are printed as each size completes, so a long
//! sweep shows progress; the header says exactly what the numbers are.

use std::collections::BTreeMap;
use std::io::Write;

use super::{Environment, IntervalResult, SizeResult};
use crate::spec::{Measure, Notify, Operation, TestSpec, Wait};
use crate::stats::ThroughputSummary;
use crate::stats::throughput::{BYTES_PER_GBIT, BYTES_PER_MB};

const RULE: &str = "---------------------------------------------------------------------------------------";

/// Whether bandwidth is shown in Gb/s (`--report_gbits`) or MB/s (2^20 bytes, as perftest).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Units {
    MegaBytes,
    GigaBits,
}

pub fn banner(out: &mut dyn Write, spec: &TestSpec, env: &Environment, role: &str) -> std::io::Result<()> {
    let op = match spec.operation {
        Operation::Write if spec.with_imm => "RDMA_Write with immediate".to_string(),
        Operation::Write => "RDMA_Write".into(),
        Operation::Read => "RDMA_Read".into(),
        Operation::Send if spec.with_imm => "Send with immediate".into(),
        Operation::Send => "Send".into(),
        Operation::Atomic => format!("Atomic {}", spec.atomic_op.label()),
        Operation::Ring => {
            let r = spec.ring.expect("a ring test has ring parameters");
            format!(
                "Ring records ({} notify, {}, {} B ring, batch {})",
                r.notify.label(),
                if r.notify == Notify::Poll && r.wait != Wait::Spin {
                    format!("consumer spins, producer {}", r.wait.label())
                } else {
                    format!("{} wait", r.wait.label())
                },
                r.capacity,
                r.batch
            )
        }
    };
    let kind = match spec.measure {
        Measure::Latency => "Latency",
        Measure::Bandwidth => "BW",
    };
    writeln!(out, "{RULE}")?;
    writeln!(out, "                    {op} {kind} Test (rdmabench {}, {role})", env.tool_version)?;
    writeln!(out, " Device         : {} port {}\t\tLink type      : {}", env.device, env.port, env.link_layer)?;
    let connection = format!("{}{}", spec.transport.label(), if spec.rdma_cm { " (rdma_cm)" } else { "" });
    writeln!(out, " Connection type: {connection}\t\t\tMtu            : {}[B]", env.mtu)?;
    let moderation = match spec.ring {
        Some(r) => format!("per --batch ({})", r.batch),
        None => spec.effective_cq_mod().to_string(),
    };
    writeln!(out, " TX depth       : {}\t\t\tCQ moderation  : {moderation}", spec.tx_depth)?;
    writeln!(
        out,
        " Max inline data: {}[B]\t\tData validation: {}",
        env.inline_size,
        if spec.validate_data { "ON" } else { "OFF" }
    )?;
    writeln!(out, " Path           : {}", spec.fabric.describe())?;
    if spec.transport == crate::spec::Transport::Rc {
        writeln!(out, " Retransmission : {}", spec.fabric.describe_retry())?;
    }
    writeln!(out, " Memory         : {}", env.memory.describe())?;
    if spec.warmup > 0 {
        writeln!(out, " Warm-up        : {} iterations before each size, not in its figures", spec.warmup)?;
    }
    if let Some(every) = spec.interval_secs {
        writeln!(out, " Intervals      : every {every} s, printed as they end (Ctrl-C ends the size early)")?;
    }
    writeln!(
        out,
        " local  GID index {} : {} ({}, {} port {} on {})",
        env.gid_index, env.gid, env.gid_type, env.device, env.port, env.host
    )?;
    writeln!(
        out,
        " remote GID index {} : {} ({} port {} on {}, {})",
        env.peer.gid_index, env.peer.gid, env.peer.device, env.peer.port, env.peer.host, env.peer.address
    )?;
    let nic = |n: &crate::verbs::NicIdentity| {
        format!(
            "system image GUID {}{}",
            n.sys_image_guid,
            n.pci.as_ref().map_or(String::new(), |p| format!(", PCI {p}"))
        )
    };
    if env.peer.same_physical_nic {
        writeln!(out, " Physical NIC   : shared with the peer ({})", nic(&env.nic))?;
    } else {
        writeln!(out, " Physical NIC   : {}; the peer's: {}", nic(&env.nic), nic(&env.peer.nic))?;
    }
    writeln!(out, "{RULE}")
}

/// Width of the rail column in a multi-rail table.
const RAIL_COLUMN: usize = 6;

/// The column header; with `rails`, a first column names each row's rail ("all": the
/// aggregate over them).
pub fn header(out: &mut dyn Write, spec: &TestSpec, units: Units, cpu: bool, rails: bool) -> std::io::Result<()> {
    let mut text = Vec::new();
    columns(&mut text, spec, units, cpu)?;
    let text = String::from_utf8_lossy(&text);
    let mut lines = text.lines().collect::<Vec<_>>();
    let names = lines.pop().unwrap_or_default();
    for l in lines {
        writeln!(out, "{l}")?;
    }
    if rails { writeln!(out, " {:<RAIL_COLUMN$}{names}", "rail") } else { writeln!(out, "{names}") }
}

/// One size's row of one rail (`label`: its index, or "all" for the aggregate).
pub fn rail_row(out: &mut dyn Write, label: &str, r: &SizeResult, units: Units) -> std::io::Result<()> {
    let mut text = Vec::new();
    row(&mut text, r, units)?;
    write!(out, " {label:<RAIL_COLUMN$}")?;
    out.write_all(&text)
}

/// One line per rail before a multi-rail table: the device pair, GIDs and NUMA node.
pub fn rail_legend(out: &mut dyn Write, rail: u32, env: &Environment) -> std::io::Result<()> {
    let numa = env.nic.numa_node.map_or("NUMA node unknown".to_string(), |n| format!("NUMA node {n}"));
    writeln!(
        out,
        " rail {rail}: {} port {} GID {} {} ({numa}) -> {} port {} GID {} {} on {}",
        env.device,
        env.port,
        env.gid_index,
        env.gid,
        env.peer.device,
        env.peer.port,
        env.peer.gid_index,
        env.peer.gid,
        env.peer.host
    )
}

fn columns(out: &mut dyn Write, spec: &TestSpec, units: Units, cpu: bool) -> std::io::Result<()> {
    let cpu = if cpu { format!(" {:>8}", "CPU[%]") } else { String::new() };
    match spec.measure {
        Measure::Latency => {
            let what = match spec.operation {
                Operation::Write | Operation::Send | Operation::Ring => "one-way latency = round trip / 2",
                Operation::Read | Operation::Atomic => "round-trip latency (whole round trips)",
            };
            writeln!(out, " {what} [usec]; t_max is the true maximum (no samples dropped)")?;
            writeln!(
                out,
                " {:<8} {:<12} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10} {:>9} {:>9}",
                "#bytes",
                "#iterations",
                "t_min",
                "t_p50",
                "t_p90",
                "t_p99",
                "t_p99.9",
                "t_p99.99",
                "t_max",
                "t_avg",
                "t_stdev"
            )
        }
        Measure::Bandwidth => {
            let unit = match units {
                Units::MegaBytes => "MB/sec",
                Units::GigaBits => "Gb/sec",
            };
            writeln!(
                out,
                " {:<10} {:<12} {:>18} {:>20} {:>15}{cpu}",
                "#bytes",
                "#iterations",
                format!("BW peak[{unit}]"),
                format!("BW average[{unit}]"),
                "MsgRate[Mpps]"
            )
        }
    }
}

pub fn row(out: &mut dyn Write, r: &SizeResult, units: Units) -> std::io::Result<()> {
    let cpu = r.cpu_util_pct.map_or(String::new(), |c| format!(" {c:>8.1}"));
    let lost = match r.delivered {
        Some(d) if d < r.iterations => format!("   ({d} delivered, {} lost)", r.iterations - d),
        _ => String::new(),
    };
    if let Some(l) = &r.latency {
        let us = |ns: f64| ns / 1000.0;
        let s = &l.summary;
        return writeln!(
            out,
            " {:<8} {:<12} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>10.2} {:>9.2} {:>9.2}{cpu}{lost}",
            r.size,
            r.iterations,
            us(s.min_ns),
            us(s.p50_ns),
            us(s.p90_ns),
            us(s.p99_ns),
            us(s.p999_ns),
            us(s.p9999_ns),
            us(s.max_ns),
            us(s.avg_ns),
            us(s.stdev_ns)
        );
    }
    if let Some(one_way) = &r.bandwidth {
        // With -b, perftest's convention: the row is the sum of both directions.
        let both = r.reverse_bandwidth.as_ref().map(|rev| ThroughputSummary {
            peak_bytes_per_sec: one_way.peak_bytes_per_sec + rev.peak_bytes_per_sec,
            avg_bytes_per_sec: one_way.avg_bytes_per_sec + rev.avg_bytes_per_sec,
            msg_rate_mpps: one_way.msg_rate_mpps + rev.msg_rate_mpps,
            ..one_way.clone()
        });
        let mut note = if both.is_some() { "   (both directions)".to_string() } else { String::new() };
        let b = both.as_ref().unwrap_or(one_way);
        if one_way.peak_is_average || r.reverse_bandwidth.as_ref().is_some_and(|r| r.peak_is_average) {
            note += &format!(
                "   (peak = average: the run is no longer than the {}-message peak window; raise -n or -D)",
                one_way.peak_window_messages
            );
        }
        let conv = |bps: f64| match units {
            Units::MegaBytes => bps / BYTES_PER_MB,
            Units::GigaBits => bps / BYTES_PER_GBIT,
        };
        return writeln!(
            out,
            " {:<10} {:<12} {:>18.2} {:>20.2} {:>15.6}{cpu}{lost}{note}",
            r.size,
            r.iterations,
            conv(b.peak_bytes_per_sec),
            conv(b.avg_bytes_per_sec),
            b.msg_rate_mpps
        );
    }
    Ok(())
}

/// The lines under a size's row: its counter deltas (`--counters`) and CPU per message.
pub fn row_notes(out: &mut dyn Write, r: &SizeResult, counters: bool, cpu: bool) -> std::io::Result<()> {
    if counters {
        counter_line(out, r)?;
    }
    if cpu { cpu_line(out, r) } else { Ok(()) }
}

/// With `--cpu-util`: both sides' CPU time per message (per record, for ring tests).
pub fn cpu_line(out: &mut dyn Write, r: &SizeResult) -> std::io::Result<()> {
    let side = |pct: Option<f64>| {
        pct.and_then(|p| r.cpu_ns_per_message(p)).map_or("?".to_string(), |ns| format!("{:.2} us", ns / 1000.0))
    };
    let peer = r.peer_cpu_util_pct.map_or(String::new(), |p| format!(", peer {} ({p:.1} %)", side(Some(p))));
    writeln!(out, "   CPU per message at {} B: this side {}{peer}", r.size, side(r.cpu_util_pct))
}

/// With `--counters`: the port counters that moved during a size, under its row (this
/// side's, then the peer's), or that none did.
pub fn counter_line(out: &mut dyn Write, r: &SizeResult) -> std::io::Result<()> {
    let list = |c: &BTreeMap<String, u64>| {
        if c.is_empty() {
            "none moved".to_string()
        } else {
            c.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", ")
        }
    };
    let mut parts = Vec::new();
    if let Some(c) = &r.counters {
        parts.push(format!("this side: {}", list(c)));
    }
    if let Some(c) = &r.peer_counters {
        parts.push(format!("peer: {}", list(c)));
    }
    if parts.is_empty() {
        return writeln!(out, "   counters: the ports have none");
    }
    writeln!(out, "   counters at {} B: {}", r.size, parts.join("; "))
}

/// A soak's interval, as it ends: its span, then bandwidth (in the table's units) or
/// latency percentiles.
pub fn interval_line(out: &mut dyn Write, i: &IntervalResult, units: Units) -> std::io::Result<()> {
    let rail = i.rail.map_or(String::new(), |r| format!("rail {r} "));
    let span = format!(" {rail}interval {:>7.1}-{:<7.1} s {:>8} B", i.start_s, i.end_s, i.size);
    match (&i.latency, i.gbps) {
        (Some(l), _) => {
            let us = |ns: f64| ns / 1000.0;
            writeln!(
                out,
                "{span}  p50 {:.2} us  p99 {:.2} us  p99.9 {:.2} us  max {:.2} us  ({} samples)",
                us(l.p50_ns),
                us(l.p99_ns),
                us(l.p999_ns),
                us(l.max_ns),
                i.iterations
            )
        }
        (None, Some(gbps)) => {
            let bytes_per_sec = gbps * 1e9 / 8.0;
            let (v, unit) = match units {
                Units::MegaBytes => (bytes_per_sec / BYTES_PER_MB, "MB/s"),
                Units::GigaBits => (bytes_per_sec / BYTES_PER_GBIT, "Gb/s"),
            };
            writeln!(out, "{span}  {v:.2} {unit}  {:.6} Mpps  ({} messages)", i.mpps.unwrap_or(0.0), i.iterations)
        }
        (None, None) => writeln!(out, "{span}  nothing completed"),
    }
}

pub fn footer(out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(out, "{RULE}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::{LatencySummary, Peak, ThroughputSummary};

    #[test]
    fn bandwidth_row_converts_units_like_perftest() {
        let r = SizeResult {
            size: 65536,
            iterations: 1000,
            bytes: 65536 * 1000,
            duration_ns: 1,
            latency: None,
            bandwidth: Some(ThroughputSummary::new(
                65536,
                1000,
                1_000_000_000,
                Peak { msgs_per_sec: Some(1500.0), window_msgs: 100 },
            )),
            data_validated: false,
            ..Default::default()
        };
        let mut mb = Vec::new();
        row(&mut mb, &r, Units::MegaBytes).unwrap();
        let mb = String::from_utf8(mb).unwrap();
        assert!(mb.contains("62.50"), "65.536 MB/s in MiB units is 62.50: {mb}");
        let mut gb = Vec::new();
        row(&mut gb, &r, Units::GigaBits).unwrap();
        assert!(String::from_utf8(gb).unwrap().contains("0.52"), "65.536e6 B/s = 0.524 Gb/s");
        assert!(!mb.contains("peak = average"), "a measured peak needs no note: {mb}");
    }

    #[test]
    fn a_run_no_longer_than_the_peak_window_says_its_peak_is_the_average() {
        let peak = Peak { msgs_per_sec: None, window_msgs: 1000 };
        let r = SizeResult {
            size: 65536,
            iterations: 1000,
            bandwidth: Some(ThroughputSummary::new(65536, 1000, 1_000_000_000, peak)),
            ..Default::default()
        };
        let mut out = Vec::new();
        row(&mut out, &r, Units::MegaBytes).unwrap();
        let s = String::from_utf8(out).unwrap();
        assert!(s.contains("peak = average") && s.contains("1000-message peak window"), "{s}");
    }

    #[test]
    fn latency_row_is_in_microseconds() {
        let r = SizeResult {
            size: 2,
            iterations: 3,
            bytes: 6,
            duration_ns: 1,
            latency: Some(super::super::LatencyResult {
                kind: "one_way".into(),
                unit: "ns".into(),
                summary: LatencySummary { samples: 3, min_ns: 1500.0, max_ns: 123_450.0, ..Default::default() },
            }),
            bandwidth: None,
            data_validated: true,
            ..Default::default()
        };
        let mut out = Vec::new();
        row(&mut out, &r, Units::MegaBytes).unwrap();
        let s = String::from_utf8(out).unwrap();
        assert!(s.contains("1.50") && s.contains("123.45"), "{s}");
        let mut out = Vec::new();
        rail_row(&mut out, "all", &r, Units::MegaBytes).unwrap();
        let railed = String::from_utf8(out).unwrap();
        assert_eq!(railed, format!(" all   {s}"));
    }

    #[test]
    fn a_multi_rail_header_has_a_rail_column() {
        let spec = TestSpec::new(Operation::Write, Measure::Bandwidth);
        let mut plain = Vec::new();
        header(&mut plain, &spec, Units::MegaBytes, false, false).unwrap();
        let mut railed = Vec::new();
        header(&mut railed, &spec, Units::MegaBytes, false, true).unwrap();
        let (plain, railed) = (String::from_utf8(plain).unwrap(), String::from_utf8(railed).unwrap());
        assert!(plain.starts_with(" #bytes"), "{plain}");
        assert!(railed.starts_with(" rail   #bytes"), "{railed}");
    }
}
