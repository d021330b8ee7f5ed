//! Lab tests on two cables (`lab/run --nics 2`: rxea0/rxea1 on one side, rxeb0/rxeb1 on
//! the other): rails, distinct NICs, pods' views of several devices, a cable's packets
//! captured, lossy and dead cables.

use super::common::*;

pub const RAILS_SERVER: &str = "10.90.1.1";
pub const CLIENT_RAILS: &str = "rxea0,rxea1";
pub const SERVER_RAILS: &str = "rxeb0,rxeb1";

/// A server on the `b` ends and a client on the `a` ends of both cables, the client
/// started through `client_wrap` (a pod's view, say) when given.
pub fn rails_pair_in(
    test: &str,
    client_extra: &[&str],
    server_extra: &[&str],
    client_wrap: Option<&[&str]>,
) -> (Out, Out) {
    let port = next_port();
    let mut sargs = vec![test, "-p", &port, "--connect-timeout", "30", "--timeout", "5"];
    sargs.extend_from_slice(server_extra);
    let server = spawn(&sargs);
    let mut cargs = vec![test, "-p", &port, "--connect-timeout", "30", "--timeout", "5"];
    cargs.extend_from_slice(client_extra);
    cargs.push(RAILS_SERVER);
    let client = match client_wrap {
        Some(wrap) => {
            let mut cmd = Command::new(wrap[0]);
            cmd.args(&wrap[1..]).arg(BIN).args(&cargs).stdout(Stdio::piped()).stderr(Stdio::piped());
            finish(cmd.spawn().expect("start the wrapped client"), Duration::from_secs(180))
        }
        None => finish(spawn(&cargs), Duration::from_secs(180)),
    };
    let server = finish(server, Duration::from_secs(60));
    (client, server)
}

pub fn rails_pair(test: &str, client_extra: &[&str]) -> (Out, Out) {
    let mut c = vec!["-d", CLIENT_RAILS];
    c.extend_from_slice(client_extra);
    rails_pair_in(test, &c, &["-d", SERVER_RAILS], None)
}

/// Takes a cable down for the length of a test, and always brings it back up (and waits
/// for both ports to be ACTIVE), whatever the test's outcome.
pub struct CableDown(pub u32);

impl CableDown {
    fn now(cable: u32) -> CableDown {
        ip_link(cable, "down");
        CableDown(cable)
    }
}

impl Drop for CableDown {
    fn drop(&mut self) {
        ip_link(self.0, "up");
        let deadline = Instant::now() + Duration::from_secs(10);
        for end in ["a", "b"] {
            let state = format!("/sys/class/infiniband/rxe{end}{}/ports/1/state", self.0);
            while !std::fs::read_to_string(&state).unwrap_or_default().contains("ACTIVE") && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

pub fn ip_link(cable: u32, state: &str) {
    let ok = Command::new("ip").args(["link", "set", &format!("a{cable}"), state]).status().unwrap().success();
    assert!(ok, "ip link set a{cable} {state}");
}

pub fn rail_rows(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| l.starts_with(" 0 ") || l.starts_with(" 1 ") || l.starts_with(" all "))
        .map(String::from)
        .collect()
}

#[test]
fn lab_rails_00_two_cables_four_devices() {
    let out = run(&["devices", "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let devs: Value = serde_json::from_str(&out.stdout).unwrap();
    let mut names: Vec<&str> = devs.as_array().unwrap().iter().map(|d| d["name"].as_str().unwrap()).collect();
    names.sort_unstable();
    assert_eq!(names, ["rxea0", "rxea1", "rxeb0", "rxeb1"], "lab/run --nics 2 gives four devices on two cables");
    // Real multi-device checks: one GID index on all four, equal rates, distinct NICs.
    let v = run(&["validate", "--profile", "generic", "--expect-nics", "4", "--json", "-"]);
    assert_eq!(v.code, 0, "{}\n{}", v.stdout, v.stderr);
    let doc: Value = serde_json::from_str(&v.stdout).unwrap();
    let check = |id: &str| doc["checks"].as_array().unwrap().iter().find(|c| c["id"] == id).cloned().unwrap();
    assert_eq!(check("gid-index")["status"], "pass", "{}", check("gid-index"));
    assert!(check("gid-index")["seen"].as_str().unwrap().contains("index 1 on every device"));
    assert_eq!(check("rate")["status"], "pass");
    assert_eq!(doc["gid_index"], 1);
    // Distinct NICs: the four devices' system image GUIDs (from their netdevs' MACs) differ.
    let x = run(&["validate", "--profile", "vke-exclusive", "--expect-nics", "4"]);
    assert!(x.stdout.contains("PASS  exclusive-nic") && x.stdout.contains("its own physical function"), "{}", x.stdout);
}

#[test]
fn lab_rails_two_rails_at_once_and_one_after_another_with_per_rail_rows_and_checked_data() {
    // Bandwidth, every rail at once, data checked where it lands on both rails.
    let (c, s) =
        rails_pair("write-bw", &["-n", "1000", "-s", "65536", "--validate-data", "--report-gbits", "--json", "-"]);
    assert_eq!(c.code, 0, "client:\n{}\n{}\nserver:\n{}", c.stdout, c.stderr, s.stderr);
    assert_eq!(s.code, 0, "server:\n{}\n{}", s.stdout, s.stderr);
    let doc = valid_doc(&c.stdout);
    assert_eq!(doc["rail_mode"], "concurrent");
    let rails = doc["rails"].as_array().unwrap();
    assert_eq!(rails.len(), 2);
    let mut sum = 0.0;
    for (i, r) in rails.iter().enumerate() {
        assert_eq!(r["rail"], i);
        assert_eq!(
            (r["device"].as_str().unwrap(), r["peer_device"].as_str().unwrap()),
            (["rxea0", "rxea1"][i], ["rxeb0", "rxeb1"][i])
        );
        assert_eq!(r["environment"]["gid_index"], 1);
        let res = &r["results"][0];
        assert_eq!((res["iterations"].as_u64(), res["data_validated"].as_bool()), (Some(1000), Some(true)), "{r}");
        sum += res["bandwidth"]["avg_bytes_per_sec"].as_f64().unwrap();
        assert!(r.get("error").is_none(), "{r}");
    }
    let total = &doc["results"][0];
    assert_eq!(total["iterations"], 2000, "the aggregate counts both rails");
    let avg = total["bandwidth"]["avg_bytes_per_sec"].as_f64().unwrap();
    assert!(avg > 0.5 * sum && avg <= 1.01 * sum, "aggregate {avg} vs the rails' sum {sum}");
    let rows = rail_rows(&c.stderr); // the table goes to stderr with --json -
    assert_eq!(rows.len(), 3, "rows for rail 0, rail 1 and all:\n{}", c.stderr);
    assert!(c.stderr.contains(" rail 0: rxea0") && c.stderr.contains("-> rxeb1"), "{}", c.stderr);
    assert_eq!(rail_rows(&s.stdout).len(), 3, "the server prints the same rows:\n{}", s.stdout);

    // Latency, one rail after another: each rail's samples, and all of them merged.
    let (c, s) = rails_pair("write-lat", &["--rails", "sequential", "-n", "300", "--json", "-"]);
    assert_eq!((c.code, s.code), (0, 0), "{}\n{}", c.stderr, s.stderr);
    let doc = valid_doc(&c.stdout);
    assert_eq!(doc["rail_mode"], "sequential");
    for r in doc["rails"].as_array().unwrap() {
        assert_eq!(r["results"][0]["latency"]["samples"], 300, "{r}");
    }
    assert_eq!(doc["results"][0]["latency"]["samples"], 600);
    assert!(c.stderr.contains("rails ran one after another"), "{}", c.stderr);

    // Send with checked data, one rail after another, several QPs per rail.
    let (c, s) = rails_pair("send-bw", &["--rails", "sequential", "-n", "400", "-q", "2", "--validate-data"]);
    assert_eq!((c.code, s.code), (0, 0), "{}\n{}", c.stderr, s.stderr);
    assert_eq!(rail_rows(&c.stdout).len(), 3, "{}", c.stdout);
}

#[test]
fn lab_rails_a_cable_down_before_the_run_fails_naming_the_rail_with_exit_3_and_keeps_the_other() {
    let dir = tempfile::tempdir().unwrap();
    let json = json_file(&dir, "down.json");
    let (c, s) = {
        let _down = CableDown::now(1);
        rails_pair("write-bw", &["-n", "300", "--json", &json])
    };
    assert_eq!(c.code, 3, "client:\n{}\n{}", c.stdout, c.stderr);
    assert!(c.stderr.contains("rail 1 (rxea1 -> rxeb1)") && c.stderr.contains("DOWN"), "{}", c.stderr);
    assert_ne!(s.code, 0, "the server's rail 1 fails too:\n{}", s.stderr);
    assert!(s.stderr.contains("rail 1"), "{}", s.stderr);
    let doc = valid_doc(&std::fs::read_to_string(&json).unwrap());
    assert_eq!(doc["rails"][0]["results"][0]["iterations"], 300, "rail 0 measured: {doc}");
    assert!(doc["rails"][1]["error"].as_str().unwrap().contains("DOWN"), "{doc}");
    assert!(c.stdout.contains(" rail 1 (rxea1 -> rxeb1): failed"), "{}", c.stdout);
}

#[test]
fn lab_rails_a_cable_down_during_the_run_fails_naming_the_rail_with_exit_4_and_keeps_the_other() {
    let dir = tempfile::tempdir().unwrap();
    let json = json_file(&dir, "during.json");
    let port = next_port();
    let server = spawn(&["write-bw", "-p", &port, "--connect-timeout", "30", "--timeout", "5", "-d", SERVER_RAILS]);
    let client = spawn(&[
        "write-bw",
        "-p",
        &port,
        "--connect-timeout",
        "30",
        "--timeout",
        "5",
        "-d",
        CLIENT_RAILS,
        "-D",
        "6",
        "-s",
        "4096",
        "--json",
        &json,
        RAILS_SERVER,
    ]);
    std::thread::sleep(Duration::from_secs(3));
    let (c, s) = {
        let _down = CableDown::now(1);
        (finish(client, Duration::from_secs(60)), finish(server, Duration::from_secs(60)))
    };
    assert_eq!(c.code, 4, "client:\n{}\n{}", c.stdout, c.stderr);
    assert!(c.stderr.contains("rail 1 (rxea1 -> rxeb1)") && c.stderr.contains("went down"), "{}", c.stderr);
    assert_ne!(s.code, 0, "{}", s.stderr);
    let doc = valid_doc(&std::fs::read_to_string(&json).unwrap());
    let kept = &doc["rails"][0]["results"][0];
    assert!(kept["iterations"].as_u64().unwrap() > 0, "rail 0's figures are kept: {doc}");
    assert!(doc["rails"][1]["error"].as_str().unwrap().contains("went down"), "{doc}");
    assert_eq!(doc["results"][0]["iterations"], kept["iterations"], "the aggregate is what was measured");
}

#[test]
fn lab_rails_a_pod_that_sees_two_of_four_devices() {
    let pod = pod_view(&["rxea0", "rxea1"]);
    let v = run_in(&pod, &["validate", "--profile", "vke-shared-multi", "--expect-nics", "2"]);
    assert_eq!(v.code, 0, "{}\n{}", v.stdout, v.stderr);
    assert!(v.stdout.contains("2 usable (rxea0, rxea1) of 4 visible"), "sysfs shows all four: {}", v.stdout);
    assert!(v.stdout.contains("index 1 on every device"), "{}", v.stdout);
    let v = run_in(&pod, &["validate", "--profile", "vke-shared-multi", "--expect-nics", "3"]);
    assert_eq!(v.code, 1, "{}", v.stdout);
    assert!(v.stdout.contains("FAIL  usable-devices") && v.stdout.contains("exactly 3"), "{}", v.stdout);
    let exclusive = run_in(&pod, &["validate", "--profile", "vke-exclusive", "--expect-nics", "2"]);
    assert!(exclusive.stdout.contains("PASS  exclusive-nic"), "two distinct NICs: {}", exclusive.stdout);
    // A pod whose devices are not the first in sysfs registers memory on its own.
    let other = run_in(&pod_view(&["rxeb0", "rxeb1"]), &["validate", "--profile", "generic", "--expect-nics", "2"]);
    assert_eq!(other.code, 0, "{}\n{}", other.stdout, other.stderr);
    assert!(other.stdout.contains("PASS  register-memory   rxeb0"), "{}", other.stdout);
    let env = run_in(&pod, &["nccl-env"]);
    assert_eq!(env.code, 0, "{}", env.stderr);
    assert_eq!(env.stdout, "export NCCL_IB_HCA=rxea0:1,rxea1:1\nexport NCCL_IB_GID_INDEX=1\n");
    assert!(env.stderr.contains("skipped rxeb0, rxeb1"), "{}", env.stderr);
    // -d all in the pod measures exactly its two devices.
    let wrap: Vec<&str> = pod.iter().map(String::as_str).collect();
    let (c, s) =
        rails_pair_in("write-bw", &["-d", "all", "-n", "300", "--json", "-"], &["-d", SERVER_RAILS], Some(&wrap));
    assert_eq!((c.code, s.code), (0, 0), "{}\n{}", c.stderr, s.stderr);
    let doc = valid_doc(&c.stdout);
    let devices: Vec<&str> = doc["rails"].as_array().unwrap().iter().map(|r| r["device"].as_str().unwrap()).collect();
    assert_eq!(devices, ["rxea0", "rxea1"]);
}

/// The UDP source port a RoCE v2 device derives from a flow label (the kernel's
/// rdma_flow_label_to_udp_sport).
pub fn udp_sport_of_flow_label(fl: u32) -> u32 {
    ((fl & 0x3fff) ^ ((fl & 0xf_c000) >> 14)) | 0xc000
}

/// RoCE v2 packets on cable 0 during a write-lat from rxea0 to rxeb0 with `extra`:
/// (IP TOS byte, UDP source port) of each, from tcpdump.
pub fn captured_roce_packets(extra: &[&str]) -> Vec<(u32, u32)> {
    let dump = Command::new("tcpdump")
        .args(["-i", "a0", "-nn", "-v", "-l", "-c", "40", "udp", "port", "4791"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("tcpdump (lab/setup.sh installs it)");
    std::thread::sleep(Duration::from_secs(1));
    let mut client = vec!["-d", "rxea0", "-n", "200"];
    client.extend_from_slice(extra);
    let (c, s) = rails_pair_in("write-lat", &client, &["-d", "rxeb0"], None);
    assert_eq!((c.code, s.code), (0, 0), "{}\n{}", c.stderr, s.stderr);
    let out = finish(dump, Duration::from_secs(30));
    // "IP (tos 0x6a,ECT(0), ttl 64, ...)" then "    10.90.0.1.58177 > 10.90.1.1.4791: UDP, ..."
    let lines: Vec<&str> = out.stdout.lines().collect();
    let packets: Vec<(u32, u32)> = lines
        .windows(2)
        .filter_map(|w| {
            let tos = w[0].split("tos 0x").nth(1)?.split(|c: char| !c.is_ascii_hexdigit()).next()?;
            let src = w[1].trim().split(' ').next()?;
            let port = src.rsplit('.').next()?.parse().ok()?;
            Some((u32::from_str_radix(tos, 16).ok()?, port))
        })
        .collect();
    assert_eq!(packets.len(), 40, "40 packets parsed from:\n{}\n{}", out.stdout, out.stderr);
    packets
}

/// `--tclass` reaches the IP header of every RoCE v2 packet in both directions (DSCP 26,
/// ECN 2 for 106), and `--flow-label` sets the UDP source port as the kernel derives it
/// (rxe hashes the QP number without one); the header names both.
#[test]
fn lab_rails_traffic_class_and_flow_label_reach_the_wire() {
    let plain = captured_roce_packets(&[]);
    assert!(plain.iter().all(|&(tos, _)| tos == 0), "default traffic class 0: {plain:?}");
    let marked = captured_roce_packets(&["--tclass", "106", "--flow-label", "74565"]);
    assert!(marked.iter().all(|&(tos, _)| tos == 106), "DS field 0x6a on every packet: {marked:?}");
    let sport = udp_sport_of_flow_label(74565);
    assert_eq!(sport, 58177);
    assert!(marked.iter().all(|&(_, p)| p == sport), "UDP source port {sport} from the flow label: {marked:?}");
    let (c, _) =
        rails_pair_in("write-lat", &["-d", "rxea0", "-n", "10", "--tclass", "106", "-u", "10"], &["-d", "rxeb0"], None);
    for part in ["traffic class 106 (DSCP 26, ECN 2)", "ACK timeout 10 (4.2 ms)"] {
        assert!(c.stdout.contains(part), "missing {part:?}: {}", c.stdout);
    }
    let bad = run(&["write-lat", "-d", "rxea0", "--sl", "16", RAILS_SERVER]);
    assert_eq!(bad.code, 2, "{}", bad.stderr);
    assert!(bad.stderr.contains("--sl 0..=15"), "{}", bad.stderr);
}

/// A write-bw over cable 0 whose cable then loses every packet: how long after the loss
/// the client ended, and its outcome.
pub fn write_bw_until_the_cable_dies(extra: &[&str]) -> (Out, Duration) {
    let port = next_port();
    let server = spawn(&["write-bw", "-d", "rxeb0", "-p", &port, "--timeout", "30"]);
    let mut args = vec!["write-bw", "-d", "rxea0", "-p", &port, "-D", "30", "--timeout", "30"];
    args.extend_from_slice(extra);
    args.push(RAILS_SERVER);
    let mut client = spawn(&args);
    let stdout = await_output(&mut client, "#bytes", Duration::from_secs(60));
    std::thread::sleep(Duration::from_secs(1));
    tc(&["qdisc", "add", "dev", "a0", "root", "netem", "loss", "100%"]);
    let t = Instant::now();
    let mut c = finish(client, Duration::from_secs(60));
    let waited = t.elapsed();
    tc(&["qdisc", "del", "dev", "a0", "root"]);
    c.stdout = stdout.join().unwrap();
    let mut server = server;
    let _ = server.kill();
    let _ = server.wait();
    (c, waited)
}

/// RC gives up on a dead path after the ACK timeout once per try: 4.096 us x 2^u x
/// (retry + 1). -u 16 with 3 retries: 1.07 s; -u 14 with 1 retry: 134 ms. Exit 4, naming
/// the retry counter. (Shorter timeouts than 14 make rxe under TCG retransmit spuriously
/// and its responder answer "invalid request"; 7 retries it treats as forever.)
#[test]
fn lab_rails_a_dead_path_ends_the_run_after_the_retransmission_time() {
    let (slow, slow_waited) = write_bw_until_the_cable_dies(&["-u", "16", "--retry-count", "3"]);
    let (fast, fast_waited) = write_bw_until_the_cable_dies(&["-u", "14", "--retry-count", "1"]);
    eprintln!("-u 16 --retry-count 3: {slow_waited:?}; -u 14 --retry-count 1: {fast_waited:?}");
    for (c, waited) in [(&slow, slow_waited), (&fast, fast_waited)] {
        assert_eq!(c.code, 4, "{}", c.stderr);
        assert!(c.stderr.contains("retry counter exceeded"), "{}", c.stderr);
        assert!(waited < Duration::from_millis(1074) + GRACE, "took {waited:?}");
    }
    assert!(slow_waited >= Duration::from_millis(800), "-u 16 x 4 tries is about 1.07 s: {slow_waited:?}");
    assert!(fast_waited < slow_waited / 2, "-u 14 x 2 tries ends sooner: {fast_waited:?} vs {slow_waited:?}");
}

/// RC over a cable that drops 1 % of its packets still delivers every byte correctly; the
/// port counters show the retransmissions (both sides', in the JSON and with --counters in
/// the table), and a workload that allows none fails naming the counter.
#[test]
fn lab_rails_rc_over_a_lossy_cable_delivers_every_byte_and_the_counters_show_the_retransmissions() {
    tc(&["qdisc", "add", "dev", "a0", "root", "netem", "loss", "1%"]);
    let (c, s) = rails_pair_in(
        "write-bw",
        &["-d", "rxea0", "-n", "2000", "-s", "64K", "--validate-data", "--counters", "--json", "-"],
        &["-d", "rxeb0", "--counters"],
        None,
    );
    let dir = tempfile::tempdir().unwrap();
    let workload = dir.path().join("lossless.toml");
    std::fs::write(
        &workload,
        "name = \"lossless\"\n[[step]]\nname = \"write\"\ntest = \"write-bw\"\nsize = 65536\niterations = 2000\n\
         validate_data = true\n[step.max_counters]\nretransmissions = 0\n",
    )
    .unwrap();
    let port = next_port();
    let server = spawn(&["run", "--serve", "-d", "rxeb0", "-p", &port, "--connect-timeout", "30"]);
    let json = json_file(&dir, "run.json");
    let w = finish(
        spawn(&[
            "run",
            workload.to_str().unwrap(),
            "--peer",
            RAILS_SERVER,
            "-p",
            &port,
            "-d",
            "rxea0",
            "--json",
            &json,
        ]),
        Duration::from_secs(120),
    );
    let ws = finish(server, Duration::from_secs(60));
    // UD does not retransmit: the loss is counted, not hidden.
    let (ud, uds) = rails_pair_in(
        "send-bw",
        &["-d", "rxea0", "-c", "UD", "-n", "3000", "-s", "1K", "--json", "-"],
        &["-d", "rxeb0"],
        None,
    );
    tc(&["qdisc", "del", "dev", "a0", "root"]);
    assert_eq!((ud.code, uds.code), (0, 0), "{}\n{}", ud.stderr, uds.stderr);
    let delivered = valid_doc(&ud.stdout)["results"][0]["delivered"].as_u64().unwrap();
    assert!((2700..3000).contains(&delivered), "1 % of 3000 lost: {delivered} delivered");
    assert!(ud.stderr.contains(&format!("({delivered} delivered, {} lost)", 3000 - delivered)), "{}", ud.stderr);
    assert_eq!((c.code, s.code), (0, 0), "{}\n{}", c.stderr, s.stderr);
    let doc = valid_doc(&c.stdout);
    let r = &doc["results"][0];
    assert_eq!((r["iterations"].as_u64(), r["data_validated"].as_bool()), (Some(2000), Some(true)), "{doc}");
    // The client is the requester: its dropped packets are sent again; the responder saw
    // the gaps and the duplicates.
    let retried = r["counters"]["completer_retry_err"].as_u64().unwrap_or(0);
    assert!(retried > 0 && r["counters"]["sent_pkts"].as_u64().unwrap() > 2000, "{r}");
    let peer = &r["peer_counters"];
    let gaps = peer["out_of_seq_request"].as_u64().unwrap_or(0) + peer["duplicate_request"].as_u64().unwrap_or(0);
    assert!(gaps > 0 && peer["rcvd_pkts"].as_u64().unwrap() > 2000, "{r}");
    assert!(doc["environment"]["counters"].as_array().unwrap().iter().any(|n| n == "completer_retry_err"), "{doc}");
    let line = format!("completer_retry_err {retried}");
    assert!(c.stderr.contains("counters at 65536 B: this side: ") && c.stderr.contains(&line), "{}", c.stderr);
    assert!(s.stdout.contains("counters at 65536 B: this side: ") && s.stdout.contains("peer: "), "{}", s.stdout);
    eprintln!("client counters {}, server counters {peer}", r["counters"]);
    // The same loss in a workload that allows no retransmission: it fails, naming the counter.
    assert_eq!(ws.code, 0, "{}", ws.stderr);
    assert_eq!(w.code, 1, "{}\n{}", w.stdout, w.stderr);
    let verdict = w.stdout.lines().find(|l| l.contains("threshold max_counters.retransmissions")).unwrap_or("");
    assert!(verdict.contains("counter:retransmissions at 65536 B") && verdict.contains("FAIL"), "{}", w.stdout);
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(doc["steps"][0]["thresholds"][0]["pass"], false, "{doc}");
    eprintln!("{verdict}");
}

#[test]
fn lab_rails_bad_device_lists_are_refused_before_any_traffic() {
    let twice = run(&["write-bw", "-d", "rxea0,rxea0", RAILS_SERVER]);
    assert_eq!(twice.code, 2, "{}", twice.stderr);
    assert!(twice.stderr.contains("rxea0 is named twice"), "{}", twice.stderr);
    let unknown = run(&["write-bw", "-d", "rxea0,mlx5_9", RAILS_SERVER]);
    assert_eq!(unknown.code, 3, "{}", unknown.stderr);
    assert!(unknown.stderr.contains("no RDMA device named mlx5_9; this process can open: rxea0"), "{}", unknown.stderr);
    // A server with fewer rails than its client: both sides say what each has.
    let (c, s) = rails_pair_in("write-bw", &["-d", CLIENT_RAILS, "-n", "100"], &["-d", "rxeb0"], None);
    for (side, out) in [("client", &c), ("server", &s)] {
        assert_eq!(out.code, 2, "{side}: {}", out.stderr);
        assert!(
            out.stderr.contains("the client has 2 rails (rxea0, rxea1) but this server has 1 (rxeb0)"),
            "{side}: {}",
            out.stderr
        );
    }
}

/// The rendered pod script of a two-NIC VKE exclusive Job, run as its two pods, each in a
/// pod's view of its own two devices: validate counts them, every rail is measured rail to
/// rail, and `summarize` names and ranks the rails.
#[test]
fn lab_rails_a_two_nic_job_measures_both_rails_pod_to_pod() {
    let job = rendered_job(&["--platform", "vke", "--mode", "exclusive", "--nics", "2", "--workload", "smoke"]);
    let container = &job["spec"]["template"]["spec"]["containers"][0];
    let dir = tempfile::tempdir().unwrap();
    let base = next_port();
    next_port();
    let pods: Vec<Child> = [["rxeb0", "rxeb1"], ["rxea0", "rxea1"]]
        .iter()
        .enumerate()
        .map(|(i, devices)| {
            let mut cmd = pod(&pod_view(devices), container, i, &base, dir.path());
            // Also unlike a cluster: the rails run one after another. Both pods share this
            // guest's two vCPUs, and four busy-polling latency loops at once on two CPUs
            // measure the scheduler (milliseconds), not the rails (lab_rails_two_rails_* runs
            // them at once).
            cmd.env("RDMABENCH_RAILS", "sequential").env("RDMABENCH_PEER_ADDR", RAILS_SERVER);
            cmd.spawn().expect("start a pod script")
        })
        .collect();
    let outs: Vec<Out> = pods.into_iter().map(|p| finish(p, Duration::from_secs(300))).collect();
    for (i, o) in outs.iter().enumerate() {
        assert_eq!(o.code, 0, "pod {i}:\n{}\n{}", o.stdout, o.stderr);
        assert!(o.stdout.contains("2 usable") && o.stdout.contains("exactly 2 (--expect-nics)"), "{}", o.stdout);
    }
    let client = &outs[1].stdout;
    assert!(
        client.contains(" rail 0: rxea0") && client.contains(" rail 1: rxea1") && client.contains("-> rxeb1"),
        "{client}"
    );
    assert!(client.contains("threshold min_gbps: gbps on rail 1"), "every rail is judged: {client}");
    let log = dir.path().join("pods.log");
    std::fs::write(&log, format!("{}\n{}", outs[0].stdout, outs[1].stdout)).unwrap();
    let s = run(&["summarize", log.to_str().unwrap()]);
    assert_eq!(s.code, 0, "{}\n{}", s.stdout, s.stderr);
    assert!(s.stdout.contains("rails, failing and slowest first"), "{}", s.stdout);
    assert!(s.stdout.contains("1 link(s), 0 failed; 2 rail(s), 0 failed"), "{}", s.stdout);
    for (dev, peer) in [("rxea0", "rxeb0"), ("rxea1", "rxeb1")] {
        let row = s.stdout.lines().find(|l| l.contains(dev)).unwrap_or_else(|| panic!("{dev}: {}", s.stdout));
        assert!(row.contains(peer) && row.ends_with("ok"), "{row}");
    }
}

/// A workload's thresholds on two rails: each rail judged, the spread between them and
/// each rail's share of its port's rate; a spread no real pair of rails meets fails and
/// names both.
#[test]
fn lab_rails_workload_thresholds_judge_every_rail_the_spread_and_the_line_rate() {
    let dir = tempfile::tempdir().unwrap();
    let workload = dir.path().join("rails.toml");
    std::fs::write(
        &workload,
        r#"name = "rails"
[params]
spread = 95.0
[[step]]
name = "write bandwidth"
test = "write-bw"
size = 65536
iterations = 400
[step.thresholds]
min_gbps = 0.001
min_line_rate = "0.01%"
max_rail_spread = "$spread"
"#,
    )
    .unwrap();
    let run_rails = |extra: &[&str]| {
        let port = next_port();
        let server = spawn(&["run", "--serve", "-d", SERVER_RAILS, "-p", &port, "--connect-timeout", "30"]);
        let json = json_file(&dir, "run.json");
        let mut args = vec!["run", workload.to_str().unwrap(), "--peer", RAILS_SERVER, "-p", &port, "-d", CLIENT_RAILS];
        args.extend_from_slice(&["--json", &json]);
        args.extend_from_slice(extra);
        let c = finish(spawn(&args), Duration::from_secs(120));
        let s = finish(server, Duration::from_secs(60));
        assert_eq!(s.code, 0, "{}", s.stderr);
        let doc: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        (c, doc)
    };
    let (c, doc) = run_rails(&[]);
    assert_eq!(c.code, 0, "{}\n{}", c.stdout, c.stderr);
    let step = &doc["steps"][0];
    assert_eq!(step["rails"].as_array().unwrap().len(), 2, "{step}");
    let verdicts = step["thresholds"].as_array().unwrap();
    for rail in [0, 1] {
        for key in ["min_gbps", "min_line_rate"] {
            assert!(verdicts.iter().any(|v| v["key"] == key && v["rail"] == rail && v["pass"] == true), "{key} {rail}");
        }
    }
    let spread = verdicts.iter().find(|v| v["key"] == "max_rail_spread").unwrap();
    assert!(spread.get("rail").is_none() && spread["detail"].as_str().unwrap().contains("slowest rail"), "{spread}");
    let (c, _) = run_rails(&["--param", "spread=0.0001"]);
    assert_eq!(c.code, 1, "{}", c.stdout);
    assert!(
        c.stdout.contains("threshold max_rail_spread: rail_spread_pct at 65536 B") && c.stdout.contains("FAIL"),
        "{}",
        c.stdout
    );
}
