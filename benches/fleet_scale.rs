//! What `summarize --fleet all-pairs` costs as a fleet grows: a healthy fleet of N nodes,
//! both directions (N x (N-1) rows, each pair's bandwidth within +-2.5 % of the others'),
//! written as pods' logs and summarized, with and without the output files. Linear in the
//! rows is the aim: a thousand nodes (a million rows) in seconds, not hours.
//! Run with `cargo bench --bench fleet_scale` (optionally the sizes: `-- 64 256 1024`).

use std::io::Write;
use std::time::Instant;

use rdmabench::fleet::attribution::Thresholds;
use rdmabench::fleet::schedule::{Directions, Plan};
use rdmabench::k8s::summarize;
use rdmabench::report::pairs::PairRow;

/// A healthy fleet's logs: every planned pair's row, as its node prints it.
fn write_logs(plan: &Plan, path: &std::path::Path) -> usize {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut rows = 0;
    let mut v: u64 = 0x2545_f491_4f6c_dd1d;
    for step in plan.steps() {
        for p in &step.pairs {
            v ^= v << 13;
            v ^= v >> 7;
            v ^= v << 17;
            let noise = 1.0 + 0.05 * ((v % 1000) as f64 / 1000.0 - 0.5);
            let mut r = PairRow::blank(step.index, step.round, None, p.client, p.server);
            (r.client_node, r.server_node) = (format!("node-{}", p.client), format!("node-{}", p.server));
            (r.client_addr, r.server_addr) = (
                format!("10.0.{}.{}", p.client / 250, p.client % 250),
                format!("10.0.{}.{}", p.server / 250, p.server % 250),
            );
            (r.devices, r.peer_devices) = (vec!["mlx5_0".into()], vec!["mlx5_0".into()]);
            (r.size, r.qps, r.lat_size) = (1 << 20, 4, 2);
            let g = 390.0 * noise;
            (r.gbps, r.gbps_repeats) = (Some(g), vec![g * 0.99, g, g * 1.01]);
            (r.p50_us, r.p99_us) = (Some(2.1 * noise), Some(3.4 * noise));
            writeln!(f, "{}", r.line()).unwrap();
            rows += 1;
        }
    }
    f.flush().unwrap();
    rows
}

fn main() {
    let sizes: Vec<u32> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let sizes = if sizes.is_empty() { vec![64, 128, 256, 512, 1000] } else { sizes };
    let dir = tempfile::tempdir().unwrap();
    println!("{:>6} {:>9} {:>9} {:>12} {:>14}", "nodes", "rows", "log MB", "summarize s", "with --out s");
    for n in sizes {
        let plan = Plan { nodes: n, directions: Directions::Both, max_pairs_per_round: None };
        let log = dir.path().join(format!("fleet-{n}.log"));
        let rows = write_logs(&plan, &log);
        let mb = std::fs::metadata(&log).unwrap().len() as f64 / 1e6;
        let paths = [log.display().to_string()];
        let t = Thresholds::default();
        let time = |out: Option<&std::path::Path>| {
            let start = Instant::now();
            let mut sink = Vec::new();
            summarize::all_pairs(&paths, &plan, &t, out, false, &mut sink).expect("a healthy fleet passes");
            start.elapsed().as_secs_f64()
        };
        let plain = time(None);
        let out = dir.path().join(format!("out-{n}"));
        let with_out = time(Some(&out));
        println!("{n:>6} {rows:>9} {mb:>9.1} {plain:>12.2} {with_out:>14.2}");
    }
}
