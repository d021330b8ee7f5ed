//! Lab tests of all-pairs fleets on the lab's switch (`lab/run --nodes 6`: node k's
//! device rxen<k> on port n<k> of bridge br0, at 10.88.0.<10+k>). Each node runs in its
//! own view: a UTS namespace named `node-k` and a mount namespace with only its device,
//! as a pod of its own would see.
//!
//! The guest's 2 vCPUs are shared by every process: pairs that measure at the same time
//! disturb each other (a ping-pong waits for a vCPU, ms instead of us), which a real
//! cluster's nodes do not. The tests that judge a verdict run one pair at a time
//! (`--max-pairs-per-round 1`); the coverage test runs whole rounds at once and judges
//! latency loosely.

use super::common::*;

/// Node k's address on the lab's switch.
pub fn node_addr(k: u32) -> String {
    format!("10.88.0.{}", 10 + k)
}

/// The lab's thresholds (see `fleet_workload`).
pub const LAB_THRESHOLDS: &[(&str, &str)] = &[
    ("latency_max_ratio", "4.0"),
    ("node_min_ratio", "0.6"),
    ("link_min_ratio", "0.6"),
    ("node_min_z", "-50.0"),
    ("link_min_z", "-3.0"),
];

/// The lab's measurement: 64 KiB on 2 QPs, 150 a bandwidth repeat, 300 ping-pongs.
pub const LAB_MEASURE: &[(&str, &str)] = &[
    ("bw_size", "65536"),
    ("bw_qps", "2"),
    ("bw_iterations", "150"),
    ("lat_size", "2"),
    ("lat_iterations", "300"),
    ("warmup", "20"),
    ("repeats", "3"),
];

/// A fleet workload small enough for the lab, with `measure` added to its `[measure]`
/// and `thresholds` to its `[thresholds]`. The lab's pairs vary by +-15 % between repeats
/// under emulation (real fleets agree to about 1 %), so the tests judge nodes and links by
/// looser ratios, and disturb the fleet by far more than that; a node's z-score is left
/// out (`node_min_z = -50`): five nodes that happen to agree closely put the spread near
/// its floor, and one at 0.934x was named bad at z -9.6 in a flaky-pair run.
fn fleet_workload(dir: &tempfile::TempDir, measure: &str, thresholds: &str) -> String {
    let set = |text: &str, key: &str| text.lines().any(|l| l.split('=').next().is_some_and(|k| k.trim() == key));
    let with = |defaults: &[(&str, &str)], given: &str| {
        let mut all: Vec<String> =
            defaults.iter().filter(|(k, _)| !set(given, k)).map(|(k, v)| format!("{k} = {v}")).collect();
        all.push(given.to_string());
        all.join("\n")
    };
    let path = json_file(dir, "fleet.toml");
    let text = format!(
        "name = \"lab-fleet\"\n[measure]\n{}\n[thresholds]\n{}\n",
        with(LAB_MEASURE, measure),
        with(LAB_THRESHOLDS, thresholds)
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// A rate limit in the lab must slow a node, not turn RC into a retransmission storm: RC
/// has no congestion control on rxe, and a repeat's window (2 QPs x 128 x 64 KiB in
/// flight) takes seconds through 50 Mb/s, far past the verbs default 67 ms ACK timeout.
/// So the limiter's queue holds the whole window (`limit` in packets of the 4 KiB MTU)
/// and the ACK timeout (the fleet's `qp_timeout = 20`: 4.3 s, said here so a change of
/// the default cannot break it) outlasts its queueing delay. 50 x 64 KiB a repeat: a
/// bandwidth run asks for a completion once per 100 messages, so its warm-up and run (70
/// messages on each of 2 QPs, 9.2 MB) complete once, after 1.5 s through 50 Mb/s, well
/// within --timeout. 50 Mb/s is a fifth of a healthy pair's rate here or less.
pub const SLOW_LINK_MEASURE: &str = "qp_timeout = 20\nbw_iterations = 50";
const SLOW_LINK_QUEUE: &str = "limit 8192";
const SLOW_RATE: &str = "rate 50mbit";

/// A started node whose output is read as it comes (a fleet prints more than a pipe holds).
struct Node {
    child: Child,
    stdout: std::thread::JoinHandle<String>,
    stderr: std::thread::JoinHandle<String>,
}

/// A line to watch for in a node's output, and whom to tell when it comes.
type Watch = (String, std::sync::mpsc::Sender<()>);

impl Node {
    fn watched(mut child: Child, watch: Option<Watch>) -> Node {
        let drain = |r: Box<dyn Read + Send>, watch: Option<Watch>| {
            std::thread::spawn(move || {
                use std::io::BufRead;
                let mut s = String::new();
                for line in std::io::BufReader::new(r).lines().map_while(Result::ok) {
                    if let Some((pattern, tx)) = &watch
                        && line.contains(pattern.as_str())
                    {
                        let _ = tx.send(());
                    }
                    s.push_str(&line);
                    s.push('\n');
                }
                s
            })
        };
        let stdout = drain(Box::new(child.stdout.take().unwrap()), watch.clone());
        let stderr = drain(Box::new(child.stderr.take().unwrap()), watch);
        Node { child, stdout, stderr }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits at most `limit`; kills it and fails the test beyond that.
    fn finish(mut self, limit: Duration) -> Out {
        let start = Instant::now();
        let status = loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                break st;
            }
            if start.elapsed() > limit {
                self.kill();
                panic!("a fleet node did not finish within {limit:?}: {}", self.stderr.join().unwrap());
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        use std::os::unix::process::ExitStatusExt;
        let code = status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
        Out { code, stdout: self.stdout.join().unwrap(), stderr: self.stderr.join().unwrap() }
    }
}

/// Starts nodes 0..n of a fleet, each in its own view: a UTS namespace named `node-k` and
/// a mount namespace with only rxen<k> (as a pod of its own would see), `-d all`.
fn start_fleet(n: u32, base: &str, workload: &str, extra: &[&str]) -> Vec<Node> {
    start_watched_fleet(n, base, workload, extra, None)
}

/// `start_fleet`, telling `watch.1` when node `watch.0`'s output has a line with `watch.2`.
fn start_watched_fleet(
    n: u32,
    base: &str,
    workload: &str,
    extra: &[&str],
    watch: Option<(u32, std::sync::mpsc::Sender<()>, &str)>,
) -> Vec<Node> {
    start_fleet_with(n, base, workload, extra, watch, None)
}

/// `start_watched_fleet`, with node `stuck`'s serving thread standing still once its first
/// client's measured run begins (`RDMABENCH_FAULT=stall:server-run`).
fn start_fleet_with(
    n: u32,
    base: &str,
    workload: &str,
    extra: &[&str],
    watch: Option<(u32, std::sync::mpsc::Sender<()>, &str)>,
    stuck: Option<u32>,
) -> Vec<Node> {
    let peers: Vec<String> = (0..n).map(node_addr).collect();
    let peers = peers.join(",");
    let pods = n.to_string();
    (0..n)
        .map(|k| {
            let mut view = host_named(&format!("node-{k}"));
            view.extend(pod_view(&[&format!("rxen{k}")]));
            let index = k.to_string();
            let mut args =
                vec!["fleet", "--index", &index, "--pods", &pods, "--peers", &peers, "-d", "all", "-p", base];
            // --timeout 5 unless the test gives its own.
            if !extra.contains(&"--timeout") {
                args.extend(["--timeout", "5"]);
            }
            args.extend(["--connect-timeout", "60", "--workload", workload]);
            args.extend_from_slice(extra);
            let mine = watch.as_ref().filter(|w| w.0 == k).map(|w| (w.2.to_string(), w.1.clone()));
            let mut cmd = Command::new(&view[0]);
            cmd.args(&view[1..]).arg(BIN).args(&args).stdout(Stdio::piped()).stderr(Stdio::piped());
            if stuck == Some(k) {
                cmd.env("RDMABENCH_FAULT", "stall:server-run");
            }
            Node::watched(cmd.spawn().expect("start a fleet node"), mine)
        })
        .collect()
}

/// Ports for a fleet of `n`: n nodes and the barrier.
fn fleet_ports(n: u32) -> String {
    let base = next_port();
    (0..n).for_each(|_| {
        next_port();
    });
    base
}

/// Every `RDMABENCH_PAIR` row in the nodes' outputs.
fn pair_rows(outs: &[Out]) -> Vec<Value> {
    outs.iter()
        .flat_map(|o| o.stdout.lines())
        .filter_map(|l| l.strip_prefix("RDMABENCH_PAIR "))
        .map(|j| serde_json::from_str(j).unwrap())
        .collect()
}

/// `summarize --fleet all-pairs` of the nodes' logs, with its output folder.
fn summarize_fleet(outs: &[Out], n: u32, dir: &tempfile::TempDir, workload: &str, extra: &[&str]) -> (Out, Value) {
    let log = dir.path().join("nodes.log");
    std::fs::write(&log, outs.iter().map(|o| o.stdout.as_str()).collect::<Vec<_>>().join("\n")).unwrap();
    let out_dir = dir.path().join("fleet");
    let pods = n.to_string();
    let mut args = vec![
        "summarize",
        "--fleet",
        "all-pairs",
        "--pods",
        &pods,
        "--workload",
        workload,
        "--out",
        out_dir.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    args.push(log.to_str().unwrap());
    let s = run(&args);
    let verdict: Value = serde_json::from_str(&std::fs::read_to_string(out_dir.join("verdict.json")).unwrap()).unwrap();
    (s, verdict)
}

#[test]
fn lab_fleet_00_six_nodes_on_one_switch() {
    let out = run(&["devices", "--json"]);
    let devs: Value = serde_json::from_str(&out.stdout).unwrap();
    let mut names: Vec<&str> = devs.as_array().unwrap().iter().map(|d| d["name"].as_str().unwrap()).collect();
    names.sort_unstable();
    assert_eq!(names, ["rxen0", "rxen1", "rxen2", "rxen3", "rxen4", "rxen5"]);
}

/// Five nodes (odd: one rests each round), both directions: every ordered pair exactly
/// once, no node in two pairs of a step, five rounds a direction; then six (even) with at
/// most two pairs at a time. Every output file is written and the healthy fleet passes.
///
/// Pairs here measure at the same time on the guest's 2 vCPUs. Under the verbs default
/// ACK timeout (67 ms) the busy vCPUs made RC retransmit with no packet lost, and rxe then
/// failed a bandwidth pair now and then ("remote invalid request error"; lab/test failed
/// 1 run in a few on it); under the fleet's (NCCL's) 4.3 s no pair may fail: this test
/// allows no flaky pair (`max_flaky_pairs = 0`). Two ping-pongs at once share the vCPUs and
/// measure milliseconds now and then (6.7 ms against 27 us alone, seen), so this test does
/// not judge latency (`latency_max_ratio = 1000`); the others measure one pair at a time.
#[test]
fn lab_fleet_all_pairs_are_covered_once_per_direction_and_no_node_is_in_two_pairs_at_once() {
    let dir = tempfile::tempdir().unwrap();
    // Pairs at once share the guest's two vCPUs: one pair's three bandwidth repeats measured
    // 0.21 to 0.52 Gb/s, and a healthy node came out at 0.56x the typical one. So this test,
    // which proves coverage, bars only what emulation cannot do: a node or link under 0.3x.
    // Coverage needs no long runs: 50 x 64 KiB a bandwidth repeat, 100 ping-pongs a
    // latency one.
    let workload = fleet_workload(
        &dir,
        "bw_iterations = 50\nlat_iterations = 100",
        "max_flaky_pairs = 0\nlatency_max_ratio = 1000.0\nnode_min_ratio = 0.3\nlink_min_ratio = 0.3",
    );
    for (n, extra) in [(5u32, vec!["--directions", "both"]), (6, vec!["--max-pairs-per-round", "2"])] {
        let base = fleet_ports(n);
        let t = Instant::now();
        let nodes = start_fleet(n, &base, &workload, &extra);
        let outs: Vec<Out> = nodes.into_iter().map(|c| c.finish(Duration::from_secs(600))).collect();
        eprintln!("{n} nodes {extra:?}: {:.1} s", t.elapsed().as_secs_f64());
        for (k, o) in outs.iter().enumerate() {
            assert_eq!(o.code, 0, "node {k}:\n{}\n{}", o.stdout, o.stderr);
        }
        // A retest of a suspect comes after the plan and is no planned pair.
        let rows: Vec<Value> = pair_rows(&outs).into_iter().filter(|r| r["retest"].is_null()).collect();
        let mut seen = std::collections::BTreeSet::new();
        let mut busy: std::collections::BTreeMap<u64, Vec<u64>> = Default::default();
        let failed: Vec<(u64, u64)> = rows
            .iter()
            .filter(|r| !r["error"].is_null())
            .map(|r| (r["client"].as_u64().unwrap(), r["server"].as_u64().unwrap()))
            .collect();
        for r in rows.iter().filter(|r| r["error"].is_null()) {
            assert!(r["gbps"].as_f64().unwrap() > 0.0 && r["p50_us"].as_f64().unwrap() > 0.0, "{r}");
        }
        for r in &rows {
            let (c, s) = (r["client"].as_u64().unwrap(), r["server"].as_u64().unwrap());
            assert_eq!(r["client_node"], format!("node-{c}").as_str());
            // A pair that failed before the server's welcome never heard its name.
            if r["error"].is_null() || r["server_node"] != "" {
                assert_eq!(r["server_node"], format!("node-{s}").as_str(), "{r}");
            }
            assert_eq!(r["devices"][0], format!("rxen{c}").as_str(), "each node on its own NIC: {r}");
            assert!(seen.insert((c, s)), "{c} -> {s} twice");
            let step = busy.entry(r["step"].as_u64().unwrap()).or_default();
            assert!(!step.contains(&c) && !step.contains(&s), "a node in two pairs of step {}: {r}", r["step"]);
            step.extend([c, s]);
        }
        let directed = (n * (n - 1)) as usize;
        assert_eq!(seen.len(), if n == 5 { directed } else { directed / 2 }, "{seen:?}");
        let steps = busy.len();
        assert_eq!(steps, 10, "5 rounds x 2 directions; 5 rounds x 2 steps of <= 2 pairs");
        let (s, verdict) =
            summarize_fleet(&outs, n, &dir, &workload, if n == 5 { &["--directions", "both"] } else { &[] });
        assert_eq!(s.code, 0, "{}\n{}", s.stdout, s.stderr);
        assert_eq!(verdict["verdict"], "pass", "{verdict}");
        let flaky = verdict["flaky_pairs"].as_array().unwrap();
        eprintln!("{n} nodes: {} pair(s) failed once and passed their retest: {flaky:?}", failed.len());
        assert_eq!(flaky.len(), failed.len(), "every failed pair passed its retest: {verdict}");
        let csv = std::fs::read_to_string(dir.path().join("fleet/matrix-gbps.csv")).unwrap();
        assert_eq!(
            csv.lines().next().unwrap(),
            (0..n).fold("client/server".to_string(), |a, k| format!("{a},node-{k}"))
        );
        assert_eq!(csv.lines().count(), n as usize + 1);
        for f in ["pairs.jsonl", "matrix-p50_us.csv", "matrix-p99_us.csv", "heatmap.svg", "summary.md"] {
            assert!(dir.path().join("fleet").join(f).exists(), "{f}");
        }
        roxmltree::Document::parse(&std::fs::read_to_string(dir.path().join("fleet/heatmap.svg")).unwrap()).unwrap();
    }
}

/// Runs `cmd` in the guest (tc, for the fleet's disturbances).
fn sh(cmd: &str) {
    let st = Command::new("sh").args(["-c", cmd]).status().unwrap();
    assert!(st.success(), "{cmd}");
}

/// Queueing disciplines on node ports for the length of a test: `setup` now, and the
/// ports' root qdiscs removed however the test ends.
///
/// While they are on, every veth end of the switch hands what it receives to one CPU
/// (RPS). A veth passes a packet to the CPU that sends it, and with a qdisc that is
/// whichever CPU runs the queue at the time: two CPUs' backlogs then interleave one
/// stream, rxe's go-back-N resends at each packet out of order, and a lost tail waits
/// for the fleet's 4.3 s ACK timeout. Measured in a five-node fleet with this classifier
/// on every port: every pair retransmitted (17 to 39 completer retries, 23 to 48 NAKs for
/// sequence errors), a repeat in seven measured 0.007 Gb/s against 0.2-0.3, the fleet
/// took 79 s against 27 s without qdiscs; with one receiving CPU, no retransmission at
/// all, 30 s, and the rate-limited path measured its 49 Mb/s in every repeat (lab notes).
pub struct Qdiscs(Vec<String>);

impl Qdiscs {
    fn on(ports: &[&str], setup: &str) -> Qdiscs {
        let q = Qdiscs(ports.iter().map(|p| p.to_string()).collect());
        receive_on_one_cpu(true);
        sh(&format!("modprobe sch_netem 2>/dev/null; {setup}"));
        q
    }
}

impl Drop for Qdiscs {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = Command::new("tc").args(["qdisc", "del", "dev", p, "root"]).status();
            let _ = Command::new("ip").args(["link", "set", p, "txqueuelen", "1000"]).status();
        }
        receive_on_one_cpu(false);
    }
}

/// Every veth end of the switch (n<k>, s<k>) steers what it receives to CPU 0 (`on`), or
/// to the CPU that sent it (the kernel's default).
fn receive_on_one_cpu(on: bool) {
    for end in ["n", "s"] {
        for k in 0..6 {
            let path = format!("/sys/class/net/{end}{k}/queues/rx-0/rps_cpus");
            std::fs::write(&path, if on { "1" } else { "0" }).unwrap_or_else(|e| panic!("{path}: {e}"));
        }
    }
}

/// Node k's port slowed to `SLOW_RATE` both ways, until the guard is dropped (measure
/// with `SLOW_LINK_MEASURE`).
pub fn slow_port(k: u32) -> Qdiscs {
    let (n, s) = (format!("n{k}"), format!("s{k}"));
    Qdiscs::on(
        &[&n, &s],
        &format!(
            "tc qdisc add dev {n} root netem {SLOW_RATE} {SLOW_LINK_QUEUE} && \
             tc qdisc add dev {s} root netem {SLOW_RATE} {SLOW_LINK_QUEUE}"
        ),
    )
}

/// A rate limit on node 3's port, both ways: node 3 is named bad (confirmed by a retest
/// against a known-good node), none of its links is, and node 0 exits 1.
#[test]
fn lab_fleet_a_node_with_a_slow_port_is_named_as_the_bad_node() {
    let dir = tempfile::tempdir().unwrap();
    let workload = fleet_workload(&dir, SLOW_LINK_MEASURE, "");
    let slow = slow_port(3);
    let base = fleet_ports(5);
    let nodes = start_fleet(5, &base, &workload, &["--max-pairs-per-round", "1"]);
    let outs: Vec<Out> = nodes.into_iter().map(|c| c.finish(Duration::from_secs(600))).collect();
    drop(slow);
    assert_eq!(outs[0].code, 1, "node 0 judges the fleet bad:\n{}\n{}", outs[0].stdout, outs[0].stderr);
    for (k, o) in outs.iter().enumerate().skip(1) {
        assert_eq!(o.code, 0, "node {k}:\n{}", o.stderr);
    }
    let rows = pair_rows(&outs);
    assert!(
        rows.iter().any(|r| r["retest"]["of"] == "node" && r["retest"]["node"] == 3 && r["client"] == 3),
        "node 3 was retested: {rows:?}"
    );
    let (s, verdict) = summarize_fleet(&outs, 5, &dir, &workload, &[]);
    assert_eq!(s.code, 1, "{}\n{}", s.stdout, s.stderr);
    assert_eq!(verdict["bad_nodes"], serde_json::json!(["node-3"]), "{verdict}");
    assert_eq!(verdict["bad_links"], serde_json::json!([]), "{verdict}");
    assert!(s.stdout.contains("confirmed: retest 3 ->"), "{}", s.stdout);
}

/// One degraded path (a tc filter on node 1's port, for node 4's address only): the link
/// 1-4 is named bad, neither node is.
#[test]
fn lab_fleet_one_degraded_path_is_named_as_a_bad_link_not_a_node() {
    let dir = tempfile::tempdir().unwrap();
    // Under the verbs default ACK timeout (67 ms) this test failed 8 of its 10 pairs with
    // "remote invalid request" on a day the host was busy: the retransmissions rxe makes
    // when ACKs are late (lab notes). Every port gets the same classifier (its cost under
    // emulation is the same for all), whose bands queue a whole window (a prio band's FIFO
    // holds txqueuelen packets: 10,000 here, not 1,000); only node 1's sends the path to
    // node 4 through a rate limit that queues the window too: 50 Mb/s, a sixth of what
    // healthy pairs measure here. Slower is not better: a bandwidth run asks for a
    // completion once per 100 messages (its CQ moderation), and 20 + 30 messages of 64 KiB
    // on each of 2 QPs (6.5 MB in 4 KiB packets) took 10 s through 5 Mb/s, so nothing
    // completed within --timeout and the pair failed as stalled. Through 50 Mb/s a repeat
    // takes 0.7 s. (Other pairs failed or measured 0.03x in those runs: the qdiscs
    // reordered packets, which `Qdiscs` now prevents.)
    let workload = fleet_workload(&dir, "bw_iterations = 30", "");
    let ports = ["n0", "n1", "n2", "n3", "n4"];
    let classify: Vec<String> = ports
        .iter()
        .map(|p| {
            format!(
                "ip link set {p} txqueuelen 10000 && \
                 tc qdisc add dev {p} root handle 1: prio bands 3 priomap 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1"
            )
        })
        .collect();
    let path = Qdiscs::on(
        &ports,
        &format!(
            "{} && tc qdisc add dev n1 parent 1:3 handle 30: netem {SLOW_RATE} {SLOW_LINK_QUEUE} && \
             tc filter add dev n1 parent 1: protocol ip u32 match ip dst 10.88.0.14/32 flowid 1:3",
            classify.join(" && ")
        ),
    );
    let base = fleet_ports(5);
    let nodes = start_fleet(5, &base, &workload, &["--max-pairs-per-round", "1"]);
    let outs: Vec<Out> = nodes.into_iter().map(|c| c.finish(Duration::from_secs(600))).collect();
    drop(path);
    let rows = pair_rows(&outs);
    let slow = rows.iter().find(|r| r["client"] == 1 && r["server"] == 4 && r["retest"].is_null()).unwrap();
    let fast = rows.iter().find(|r| r["client"] == 1 && r["server"] == 3 && r["retest"].is_null()).unwrap();
    eprintln!("1 -> 4: {} Gb/s, 1 -> 3: {} Gb/s", slow["gbps"], fast["gbps"]);
    let (s, verdict) = summarize_fleet(&outs, 5, &dir, &workload, &[]);
    assert_eq!(s.code, 1, "{}\n{}", s.stdout, s.stderr);
    assert_eq!(verdict["bad_links"], serde_json::json!([["node-1", "node-4"]]), "{verdict}\n{}", s.stdout);
    assert_eq!(verdict["bad_nodes"], serde_json::json!([]), "{verdict}\n{}", s.stdout);
    assert_eq!(outs[0].code, 1, "{}", outs[0].stderr);
}

/// A node killed mid-fleet: the barrier names it, its pairs are failed (in flight: within
/// the run's timeout; later ones at once), every other pair is kept, and the verdict names
/// it as the bad node.
#[test]
fn lab_fleet_a_node_that_dies_mid_fleet_is_named_and_the_others_results_are_kept() {
    let dir = tempfile::tempdir().unwrap();
    let workload = fleet_workload(&dir, "", "");
    let base = fleet_ports(5);
    let t = Instant::now();
    // One pair at a time: this test judges the verdict (pairs at once share the vCPUs).
    let mut nodes = start_fleet(5, &base, &workload, &["--max-pairs-per-round", "1"]);
    std::thread::sleep(Duration::from_secs(8));
    nodes.remove(2).kill();
    let outs: Vec<Out> = nodes.into_iter().map(|c| c.finish(Duration::from_secs(600))).collect();
    eprintln!("the fleet without node 2 ended {:.1} s after its start", t.elapsed().as_secs_f64());
    assert_eq!(outs[0].code, 1, "{}\n{}", outs[0].stdout, outs[0].stderr);
    assert!(
        outs[0].stderr.contains("fleet: node 2 left the fleet at step"),
        "the barrier names it: {}",
        outs[0].stderr
    );
    for (k, o) in outs.iter().enumerate().skip(1) {
        assert_eq!(o.code, 0, "node {k} goes on: {}", o.stderr);
    }
    let rows = pair_rows(&outs);
    let with_2 = |r: &&Value| r["client"] == 2 || r["server"] == 2;
    let others: Vec<&Value> = rows.iter().filter(|r| !with_2(r) && r["retest"].is_null()).collect();
    assert_eq!(others.len(), 6, "every pair of the four others: {rows:?}");
    assert!(others.iter().all(|r| r["error"].is_null()), "{others:?}");
    let (s, verdict) = summarize_fleet(&outs, 5, &dir, &workload, &[]);
    assert_eq!(s.code, 1, "{}", s.stdout);
    assert_eq!(verdict["bad_nodes"], serde_json::json!(["node-2"]), "{verdict}");
    assert_eq!(verdict["bad_links"], serde_json::json!([]), "{verdict}");
    assert!(s.stdout.contains("failed against") && s.stdout.contains("of its 4 partners"), "{}", s.stdout);
}

/// A pair whose port flaps during its first measurement: node 4's port goes down for
/// 6 s while node 1 measures against it (step 0 of five nodes, one pair at a time), as
/// soon as node 1's first bandwidth run has connected (a flap during the TCP connect only
/// delays it: the SYN is resent after it). The
/// pair fails, passes its retest after the plan, and is reported flaky: listed in the
/// verdict and the summary, not a bad node or link; the default `max_flaky_pairs` (0)
/// fails the fleet.
#[test]
fn lab_fleet_a_pair_that_fails_once_is_reported_flaky_not_bad() {
    let dir = tempfile::tempdir().unwrap();
    let workload = fleet_workload(&dir, "", "");
    let base = fleet_ports(5);
    let (tx, rx) = std::sync::mpsc::channel();
    // Node 1's first table header: its first run against node 4 is connected and measuring.
    let watch = (1, tx, "RDMA_Write BW Test");
    let nodes = start_watched_fleet(5, &base, &workload, &["--max-pairs-per-round", "1"], Some(watch));
    rx.recv_timeout(Duration::from_secs(120)).expect("node 1 measures against node 4 in step 0");
    // Longer than the run's --timeout (5 s): rxe's RC rode out a 2 s flap (66 resends,
    // the repeat at a fifth of its rate), so only a flap the run cannot wait out fails it.
    sh("ip link set n4 down");
    std::thread::sleep(Duration::from_secs(6));
    sh("ip link set n4 up");
    let outs: Vec<Out> = nodes.into_iter().map(|c| c.finish(Duration::from_secs(600))).collect();
    let rows = pair_rows(&outs);
    let first = rows.iter().find(|r| r["client"] == 1 && r["server"] == 4 && r["retest"].is_null()).unwrap();
    assert!(!first["error"].is_null(), "the flap failed the pair's first measurement: {first}");
    let again = rows.iter().find(|r| r["client"] == 1 && r["server"] == 4 && r["retest"]["of"] == "failed");
    assert!(again.is_some_and(|r| r["error"].is_null()), "its retest passed: {rows:?}");
    let (s, verdict) = summarize_fleet(&outs, 5, &dir, &workload, &[]);
    assert_eq!(s.code, 1, "max_flaky_pairs 0: {}", s.stdout);
    assert_eq!(verdict["flaky_pairs"], serde_json::json!([["node-1", "node-4"]]), "{verdict}");
    assert_eq!(verdict["bad_nodes"], serde_json::json!([]), "{verdict}");
    assert_eq!(verdict["bad_links"], serde_json::json!([]), "{verdict}");
    assert!(s.stdout.contains("flaky pair") && s.stdout.contains("node-1 -> node-4"), "{}", s.stdout);
    assert_eq!(outs[0].code, 1, "node 0 fails the fleet too: {}", outs[0].stderr);
    // Node 0's own summary shows the failed pair from both ends: the servers' records
    // reach it with their arrivals. A 6 s flap under RC moves retransmission counters.
    let line = outs[0].stdout.lines().find(|l| l.starts_with("| node-1 -> node-4 |"));
    let line = line.unwrap_or_else(|| panic!("node 0 lists the failed pair:\n{}", outs[0].stdout));
    assert!(!line.ends_with("| -; - |"), "some port counted the flap: {line}");
    eprintln!("node 0's failed pair: {line}");
}

/// Thresholds for fleets whose pairs measure at once on the guest's two vCPUs (see the
/// coverage test): nothing slower than emulation can make a healthy node is barred.
const AT_ONCE: &str = "latency_max_ratio = 1000.0\nnode_min_ratio = 0.3\nlink_min_ratio = 0.3";

/// Node 1's serving thread stands still once its first client's measured run begins,
/// while its process and keepalive live on. Three nodes, one direction: node 1 measures
/// against node 2 first (its client side is sound), then serves node 0 in the last round,
/// which names it alive but stuck (within 12 x --timeout: 60 s at the lab's 5 s). Node 1
/// is named bad, confirmed by a retest in the role it failed in (serving a known-good
/// node), no link is bad, and node 0 prints its verdict though its partner's server never
/// stops. (Serving once keeps the test to one wait of the bound: with four nodes both
/// ways it served three times and took 150 s.)
#[test]
fn lab_fleet_a_node_whose_server_is_stuck_is_named_and_node_0_still_gives_the_verdict() {
    let dir = tempfile::tempdir().unwrap();
    // Judged on what it is about: the stuck node, not three nodes' bandwidth noise.
    let workload = fleet_workload(&dir, "", &format!("{AT_ONCE}\nmax_flaky_pairs = 0"));
    let base = fleet_ports(3);
    let t = Instant::now();
    let nodes = start_fleet_with(3, &base, &workload, &[], None, Some(1));
    let outs: Vec<Out> = nodes.into_iter().map(|c| c.finish(Duration::from_secs(600))).collect();
    eprintln!("the fleet with a stuck server ended after {:.1} s", t.elapsed().as_secs_f64());
    assert_eq!(outs[0].code, 1, "node 0 gives the verdict: {}\n{}", outs[0].stdout, outs[0].stderr);
    assert_eq!(outs[2].code, 0, "node 2: {}", outs[2].stderr);
    assert!(outs[1].stderr.contains("stands still at server-run"), "{}", outs[1].stderr);
    let rows = pair_rows(&outs);
    let stuck = rows.iter().filter(|r| r["error"]["message"].as_str().is_some_and(|m| m.contains("alive but stuck")));
    assert!(stuck.clone().all(|r| r["server"] == 1), "{rows:?}");
    assert!(stuck.count() >= 1, "a client named node 1 alive but stuck: {rows:?}");
    let retest = rows.iter().find(|r| r["retest"]["of"] == "node" && r["retest"]["node"] == 1);
    let retest = retest.unwrap_or_else(|| panic!("node 1 was retested: {rows:?}"));
    assert_eq!(retest["server"], 1, "in the role it failed in: {retest}");
    assert!(!retest["error"].is_null(), "and failed again: {retest}");
    let (s, verdict) = summarize_fleet(&outs, 3, &dir, &workload, &[]);
    assert_eq!(s.code, 1, "{}\n{}", s.stdout, s.stderr);
    assert_eq!(verdict["bad_nodes"], serde_json::json!(["node-1"]), "{verdict}");
    assert_eq!(verdict["bad_links"], serde_json::json!([]), "{verdict}");
    assert!(outs[0].stdout.contains("node-1") && outs[0].stdout.contains("confirmed: retest"), "{}", outs[0].stdout);
}

/// Node 0, the fleet's coordinator, killed, then (a second fleet) its host silent: its port
/// on the switch drops everything, so its sockets neither close nor answer. The other
/// nodes exit 4 within seconds (a pair in flight ends at its --timeout, then the
/// coordinator's silence is --timeout), naming the coordinator and, for the silent host,
/// that its host acknowledged nothing; never after the plan's length.
#[test]
fn lab_fleet_nodes_whose_coordinator_died_or_went_silent_exit_with_the_reason_within_seconds() {
    for silent in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let workload = fleet_workload(&dir, "", AT_ONCE);
        let base = fleet_ports(3);
        let (tx, rx) = std::sync::mpsc::channel();
        let mut nodes = start_watched_fleet(3, &base, &workload, &[], Some((1, tx, "RDMABENCH_PAIR ")));
        rx.recv_timeout(Duration::from_secs(180)).expect("node 1 measured its first pair");
        let t = Instant::now();
        // Silent: node 0's RDMA port drops everything, and so does its TCP: the nodes'
        // control connections to a local address take `lo` (the lab's routing sends only
        // rxe out of the ports), both ways addressed to 10.88.0.10.
        let cut = silent.then(|| {
            Qdiscs::on(
                &["n0", "s0", "lo"],
                "tc qdisc add dev n0 root netem loss 100% && tc qdisc add dev s0 root netem loss 100% && \
                 tc qdisc add dev lo root handle 1: prio bands 3 priomap 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 && \
                 tc qdisc add dev lo parent 1:3 handle 30: netem loss 100% && \
                 tc filter add dev lo parent 1: protocol ip u32 match ip dst 10.88.0.10/32 flowid 1:3",
            )
        });
        if !silent {
            nodes[0].kill();
        }
        let mut zero = nodes.remove(0);
        let outs: Vec<Out> = nodes.into_iter().map(|c| c.finish(Duration::from_secs(120))).collect();
        let took = t.elapsed();
        zero.kill();
        drop(cut);
        let case = if silent { "node 0's host silent" } else { "node 0 killed" };
        eprintln!("{case}: the other nodes ended after {took:?}");
        for (k, o) in outs.iter().enumerate() {
            assert_eq!(o.code, 4, "{case}: node {}: {}", k + 1, o.stderr);
            assert!(o.stderr.contains("the fleet's coordinator"), "{case}: node {}: {}", k + 1, o.stderr);
        }
        // A pair in flight with node 0 ends at its --timeout (5 s), then the coordinator's
        // silence takes --timeout (5 s) more.
        assert!(took < Duration::from_secs(10) + 2 * GRACE, "{case}: {took:?}");
        if silent {
            assert!(outs.iter().any(|o| o.stderr.contains("acknowledged nothing")), "{case}: {outs:?}");
        }
    }
}

/// A node with one bad minute: RoCE from node 2's port (UDP 4791; its control channel
/// goes on) is dropped while the plan runs, so node 2 fails against every partner; the
/// drop is lifted as its retest against a known-good node begins. The retest passes:
/// node 2 is cleared, its failed pairs are flaky (listed, allowed here), no node and no
/// link is bad.
#[test]
fn lab_fleet_a_node_with_one_bad_minute_is_retested_and_cleared() {
    let dir = tempfile::tempdir().unwrap();
    let workload = fleet_workload(&dir, "", &format!("{AT_ONCE}\nmax_flaky_pairs = 4"));
    let base = fleet_ports(5);
    let bad_minute = Qdiscs::on(
        &["n2"],
        "tc qdisc add dev n2 root handle 1: prio bands 3 priomap 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 && \
         tc qdisc add dev n2 parent 1:3 handle 30: netem loss 100% && \
         tc filter add dev n2 parent 1: protocol ip u32 match ip dport 4791 0xffff flowid 1:3",
    );
    let (tx, rx) = std::sync::mpsc::channel();
    let nodes = start_watched_fleet(5, &base, &workload, &[], Some((2, tx, "a retest of node 2")));
    rx.recv_timeout(Duration::from_secs(480)).expect("node 2 is retested after the plan");
    drop(bad_minute);
    let outs: Vec<Out> = nodes.into_iter().map(|c| c.finish(Duration::from_secs(300))).collect();
    let rows = pair_rows(&outs);
    let failed: Vec<&Value> = rows.iter().filter(|r| r["retest"].is_null() && !r["error"].is_null()).collect();
    assert_eq!(failed.len(), 4, "node 2 failed against its 4 partners: {failed:?}");
    assert!(failed.iter().all(|r| r["client"] == 2 || r["server"] == 2), "{failed:?}");
    let (s, verdict) = summarize_fleet(&outs, 5, &dir, &workload, &[]);
    assert_eq!(verdict["bad_nodes"], serde_json::json!([]), "{verdict}\n{}", s.stdout);
    assert_eq!(verdict["bad_links"], serde_json::json!([]), "{verdict}");
    assert_eq!(verdict["flaky_pairs"].as_array().unwrap().len(), 4, "{verdict}");
    assert_eq!(verdict["verdict"], "pass", "{verdict}");
    assert!(s.stdout.contains("cleared: retest 2 ->"), "{}", s.stdout);
    assert_eq!(s.code, 0, "{}", s.stdout);
    assert_eq!(outs[0].code, 0, "{}", outs[0].stderr);
}
